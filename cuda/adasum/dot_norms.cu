// Fused dot product and squared norms of two vectors, per tensor, in one pass (adasum K1/K2).
//
// For segments t with element ranges [offsets[t], offsets[t+1]) of `a` and `b`, computes
// out[t] = (a.b, |a|^2, |b|^2) accumulated in float64. The work is cut into chunks that never
// cross a segment (the host builds the chunk table); one block per chunk writes its three
// partial sums; `dotnorm_finalize` then adds the partials of each segment in chunk order.
// No atomics anywhere, so the result is bitwise identical from run to run.

#include "maleki/reduce.cuh"

template <typename T>
__global__ void dotnorm_chunks(const T* __restrict__ a, const T* __restrict__ b,
                               const long long* __restrict__ chunk_begin,
                               const long long* __restrict__ chunk_end,
                               double* __restrict__ partials) {
    __shared__ double scratch[3 * 32];
    const long long begin = chunk_begin[blockIdx.x];
    const long long end = chunk_end[blockIdx.x];
    double d = 0.0, na = 0.0, nb = 0.0;
    for (long long i = begin + threadIdx.x; i < end; i += blockDim.x) {
        const double x = static_cast<double>(a[i]);
        const double y = static_cast<double>(b[i]);
        d = fma(x, y, d);
        na = fma(x, x, na);
        nb = fma(y, y, nb);
    }
    maleki::block_sum3(d, na, nb, scratch);
    if (threadIdx.x == 0) {
        partials[3 * blockIdx.x + 0] = d;
        partials[3 * blockIdx.x + 1] = na;
        partials[3 * blockIdx.x + 2] = nb;
    }
}

template __global__ void dotnorm_chunks<float>(const float*, const float*, const long long*,
                                               const long long*, double*);
template __global__ void dotnorm_chunks<double>(const double*, const double*, const long long*,
                                                const long long*, double*);

// One thread per segment: out[t] = sum over chunks first_chunk[t] .. first_chunk[t+1]-1.
extern "C" __global__ void dotnorm_finalize(const double* __restrict__ partials,
                                            const long long* __restrict__ first_chunk,
                                            long long nseg, double* __restrict__ out) {
    const long long t = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= nseg) return;
    double d = 0.0, na = 0.0, nb = 0.0;
    for (long long c = first_chunk[t]; c < first_chunk[t + 1]; ++c) {
        d += partials[3 * c + 0];
        na += partials[3 * c + 1];
        nb += partials[3 * c + 2];
    }
    out[3 * t + 0] = d;
    out[3 * t + 1] = na;
    out[3 * t + 2] = nb;
}
