// msGeMM on the GPU (spec section 6): look-up tables of activation sums, then table lookups
// instead of multiply-adds, for memory-bound decode (N <= 8 columns of X).
//
// Layouts (prepared by python/maleki_rs/msgemm/cuda.py):
//   xt      (N, K) float32 row-major: X transposed, in the packed column order (act-order
//           weights permute K once on the host side).
//   idx4    [(K/d)/4][M] uint32: byte j of word (q, m) is the table index of tuple 4q + j of
//           row m (idx = sum_j q[m, p*d + j] * V^j, first code least significant). Lane = row,
//           so a warp's 32 loads of one tuple quad are coalesced.
//   T       [(p * N + n) * slot + e] float32: table e of tuple p for column n, slot = V^d.
//   scales, zeros  (M, K/G) float32 row-major (zeros optional, in value units).
//
// Arithmetic: every table entry is the left-to-right float32 sum of the products
// v[c_j] * x_j (__fmul_rn / __fadd_rn: no FMA contraction), exactly the host scalar build;
// per group P = ((0 + T_0) + T_1) + ...; u = P - z * S; y += s * u (separately rounded), as
// in rust/msgemm/KERNELS.md. The K dimension is split over blockIdx.y (a contiguous range of
// groups per split); partial results go to [split][n][M] and `msgemm_reduce_splits` adds them
// in split order: deterministic, no atomics. On integer data with power-of-two scales every
// partial sum is an exact integer, so the result equals the float64 reference bit for bit.

#define MSGEMM_MAX_N 8
#define MSGEMM_ROWS 256
#define MSGEMM_RPT 4  // rows per thread of msgemm_gemv_lut (cuda.py: _RPT)

// One thread per table entry (grid-stride loop).
extern "C" __global__ void msgemm_tables(const float* __restrict__ xt, const float* __restrict__ values,
                                         int levels, int depth, long long k, int n_cols, int slot,
                                         float* __restrict__ tables) {
    const long long tuples = k / depth;
    const long long total = tuples * n_cols * slot;
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
        const int e = static_cast<int>(i % slot);
        const long long pn = i / slot;
        const int n = static_cast<int>(pn % n_cols);
        const long long p = pn / n_cols;
        const float* xs = xt + n * k + p * depth;
        int rest = e;
        float acc = 0.0f;
        for (int j = 0; j < depth; ++j) {
            const int c = rest % levels;
            rest /= levels;
            const float prod = __fmul_rn(__ldg(values + c), __ldg(xs + j));
            acc = (j == 0) ? prod : __fadd_rn(acc, prod);
        }
        tables[i] = acc;
    }
}

// S[n][g] = ((x_0 + x_1) + ...) + x_{G-1} over the group (the zero-point term), one thread each.
extern "C" __global__ void msgemm_group_sums(const float* __restrict__ xt, long long k, int n_cols,
                                             int group_size, float* __restrict__ sums) {
    const long long groups = k / group_size;
    const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= groups * n_cols) return;
    const long long n = i / groups;
    const long long g = i % groups;
    const float* xs = xt + n * k + g * group_size;
    float s = xs[0];
    for (int j = 1; j < group_size; ++j) s = __fadd_rn(s, xs[j]);
    sums[i] = s;
}

// Grid (ceil(M / 1024), splits); 256 threads, MSGEMM_RPT = 4 rows per thread (rows
// m0 + r * 256, so every load of a tuple quad is coalesced). For each chunk of `nc` columns and
// each group of its split, the group's tables (tpg tuples x nc columns x slot floats) are
// staged in shared memory, then each thread adds one entry per tuple, column and row. Four rows
// per thread make each staged table serve 1024 rows: the staging traffic (L2 -> shared) per
// weight byte is a quarter of one row per thread's, and four independent index loads are in
// flight per tuple quad. The order of the adds of each row is the same for any RPT.
extern "C" __global__ void __launch_bounds__(MSGEMM_ROWS)
    msgemm_gemv_lut(const unsigned int* __restrict__ idx4, const float* __restrict__ tables,
                    const float* __restrict__ scales, const float* __restrict__ zeros,
                    const float* __restrict__ sums, long long m_rows, int n_cols, int groups, int tpg,
                    int slot, int groups_per_split, int nc, float* __restrict__ partial) {
    extern __shared__ float tab[];  // [t][c][slot]
    const long long m0 = static_cast<long long>(blockIdx.x) * (MSGEMM_ROWS * MSGEMM_RPT) + threadIdx.x;
    const int split = blockIdx.y;
    const int g0 = split * groups_per_split;
    const int g1 = min(groups, g0 + groups_per_split);
    const bool has_zeros = zeros != nullptr;
    for (int c0 = 0; c0 < n_cols; c0 += nc) {
        const int ncc = min(nc, n_cols - c0);
        float y[MSGEMM_RPT][MSGEMM_MAX_N];
#pragma unroll
        for (int r = 0; r < MSGEMM_RPT; ++r) {
#pragma unroll
            for (int c = 0; c < MSGEMM_MAX_N; ++c) y[r][c] = 0.0f;
        }
        for (int g = g0; g < g1; ++g) {
            __syncthreads();  // the previous group's tables are no longer read
            const int total = tpg * ncc * slot;
            for (int i = threadIdx.x; i < total; i += blockDim.x) {
                const int e = i % slot;
                const int tc = i / slot;
                const int c = tc % ncc;
                const int t = tc / ncc;
                tab[i] = __ldg(tables + ((static_cast<long long>(g) * tpg + t) * n_cols + c0 + c) * slot + e);
            }
            __syncthreads();
            float p[MSGEMM_RPT][MSGEMM_MAX_N];
#pragma unroll
            for (int r = 0; r < MSGEMM_RPT; ++r) {
#pragma unroll
                for (int c = 0; c < MSGEMM_MAX_N; ++c) p[r][c] = 0.0f;
            }
            const unsigned int* ip = idx4 + (static_cast<long long>(g) * (tpg / 4)) * m_rows + m0;
            for (int q = 0; q < tpg / 4; ++q) {
#pragma unroll
                for (int r = 0; r < MSGEMM_RPT; ++r) {
                    if (m0 + r * MSGEMM_ROWS < m_rows) {
                        // Weights are read once: stream them past the caches (evict-first).
                        const unsigned int w = __ldcs(ip + static_cast<long long>(q) * m_rows + r * MSGEMM_ROWS);
#pragma unroll
                        for (int j = 0; j < 4; ++j) {
                            const int e = (w >> (8 * j)) & 0xff;
                            const float* row = tab + (4 * q + j) * ncc * slot + e;
#pragma unroll
                            for (int c = 0; c < MSGEMM_MAX_N; ++c) {
                                if (c < ncc) p[r][c] = __fadd_rn(p[r][c], row[c * slot]);
                            }
                        }
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < MSGEMM_RPT; ++r) {
                const long long m = m0 + r * MSGEMM_ROWS;
                if (m < m_rows) {
                    const float s = scales[m * groups + g];
                    const float z = has_zeros ? zeros[m * groups + g] : 0.0f;
#pragma unroll
                    for (int c = 0; c < MSGEMM_MAX_N; ++c) {
                        if (c < ncc) {
                            float u = p[r][c];
                            if (has_zeros) u = __fsub_rn(u, __fmul_rn(z, sums[(c0 + c) * groups + g]));
                            y[r][c] = __fadd_rn(y[r][c], __fmul_rn(s, u));
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < MSGEMM_RPT; ++r) {
            const long long m = m0 + r * MSGEMM_ROWS;
            if (m < m_rows) {
#pragma unroll
                for (int c = 0; c < MSGEMM_MAX_N; ++c) {
                    if (c < ncc) partial[(static_cast<long long>(split) * n_cols + c0 + c) * m_rows + m] = y[r][c];
                }
            }
        }
    }
}

// y (M, N) row-major = sum over splits, in split order, of partial[split][n][m].
extern "C" __global__ void msgemm_reduce_splits(const float* __restrict__ partial, long long m_rows, int n_cols,
                                                int splits, float* __restrict__ y) {
    const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= m_rows * n_cols) return;
    const long long m = i / n_cols;
    const long long n = i % n_cols;
    float acc = 0.0f;
    for (int s = 0; s < splits; ++s) acc = __fadd_rn(acc, partial[(static_cast<long long>(s) * n_cols + n) * m_rows + m]);
    y[i] = acc;
}

// The dense comparator: dequantize in registers and FMA, one warp per row, 4-bit codes in the
// canonical packing (M, K/2) (k even in the low nibble). Each lane holds codebook value
// v[lane % 16]; a code is decoded with one __shfl_sync from the lane of that index. Needs
// K % 8 == 0 and G % 8 == 0 (a 32-bit word of codes never straddles a group). The warp sum is a
// fixed shuffle tree: deterministic.
extern "C" __global__ void dequant_gemv_shfl(const unsigned char* __restrict__ packed, const float* __restrict__ values,
                                             const float* __restrict__ scales, const float* __restrict__ zeros,
                                             const float* __restrict__ xt, long long m_rows, long long k, int n_cols,
                                             int group_size, float* __restrict__ y) {
    const int lane = threadIdx.x & 31;
    const long long m = static_cast<long long>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    if (m >= m_rows) return;  // whole warps leave together
    const float cb = values[lane & 15];
    const long long groups = k / group_size;
    const long long words = k / 8;
    const unsigned int* row = reinterpret_cast<const unsigned int*>(packed + m * (k / 2));
    float acc[MSGEMM_MAX_N];
#pragma unroll
    for (int c = 0; c < MSGEMM_MAX_N; ++c) acc[c] = 0.0f;
    for (long long base = 0; base < words; base += 32) {
        const long long w = base + lane;
        const bool valid = w < words;
        const unsigned int bits = valid ? __ldcs(row + w) : 0u;
        const long long k0 = 8 * w;
        const long long g = valid ? k0 / group_size : 0;
        const float s = valid ? scales[m * groups + g] : 0.0f;
        const float z = (valid && zeros != nullptr) ? zeros[m * groups + g] : 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int c = (bits >> (4 * j)) & 15;
            const float v = __shfl_sync(0xffffffffu, cb, c);  // every lane takes part
            if (valid) {
                const float wv = s * (v - z);
#pragma unroll
                for (int n = 0; n < MSGEMM_MAX_N; ++n) {
                    if (n < n_cols) acc[n] = fmaf(wv, __ldg(xt + n * k + k0 + j), acc[n]);
                }
            }
        }
    }
#pragma unroll
    for (int n = 0; n < MSGEMM_MAX_N; ++n) {
        float a = acc[n];
        for (int off = 16; off > 0; off >>= 1) a += __shfl_down_sync(0xffffffffu, a, off);
        if (lane == 0 && n < n_cols) y[m * n_cols + n] = a;
    }
}
