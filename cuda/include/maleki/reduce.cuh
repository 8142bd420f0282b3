// Deterministic warp and block reductions (fixed shuffle/shared-memory order, no atomics).
#pragma once

namespace maleki {

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_down_sync(0xffffffffu, v, offset);
    }
    return v;
}

// Sums three values over a block of up to 1024 threads (blockDim.x a multiple of 32).
// The result is valid in thread 0 only. `scratch` holds at least 3 * 32 doubles.
__device__ __forceinline__ void block_sum3(double& x, double& y, double& z, double* scratch) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    x = warp_sum(x);
    y = warp_sum(y);
    z = warp_sum(z);
    if (lane == 0) {
        scratch[3 * warp + 0] = x;
        scratch[3 * warp + 1] = y;
        scratch[3 * warp + 2] = z;
    }
    __syncthreads();
    if (warp == 0) {
        x = lane < nwarps ? scratch[3 * lane + 0] : 0.0;
        y = lane < nwarps ? scratch[3 * lane + 1] : 0.0;
        z = lane < nwarps ? scratch[3 * lane + 2] : 0.0;
        x = warp_sum(x);
        y = warp_sum(y);
        z = warp_sum(z);
    }
}

}  // namespace maleki
