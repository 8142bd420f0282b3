// msGeMM on the GPU (spec section 6): look-up tables of activation sums, then table lookups
// instead of multiply-adds, for memory-bound decode (N <= 8 columns of X).
//
// Layouts (prepared by python/maleki_rs/msgemm/cuda.py):
//   xt      (N, K) float32 row-major: X transposed, in the packed column order (act-order
//           weights permute K once on the host side).
//   idx     [(K/d)/P][M] uint32, P = 32 / BITS tuples per word: bits [BITS j, BITS (j + 1)) of
//           word (q, m) are the table index of tuple P q + j of row m (idx = sum_j
//           q[m, p*d + j] * V^j, first code least significant). BITS = 4 where V^d <= 16 (int4 at
//           d = 1, int2 and ternary at d = 2: half the bytes of one index per byte), else 8.
//           Lane = row, so a warp's 32 loads of one word column are coalesced.
//   T       float32 tables, V^d entries each, 2^BITS apart (16 or 256; entries past V^d are
//           zero and never read): entry e of tuple p for column n at [(p * N + n) * 2^BITS + e].
//           The power-of-two stride lets the LUT kernel form a shared-memory address with
//           one shift and one and-or per lookup.
//   scales_t, zeros_t  (K/G, M) float32 row-major: scales and zero points transposed (lane =
//           row: coalesced); zero points optional, in value units.
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

#ifdef MSGEMM_COUNT
// The counting build (cuda.py: msgemm_cuda(..., count=True)): each thread counts the operations
// it runs, by kind, and adds them to `msgemm_counts` with one atomic per kind at its end; the
// tests compare the totals with closed forms. Rows past M are not counted.
enum {
    CNT_table_mul,
    CNT_table_add,
    CNT_sum_add,
    CNT_words,
    CNT_staged,
    CNT_lookups,
    CNT_scale_mul,
    CNT_zero_mul,
    CNT_reduce_add,
    CNT_KINDS
};
__device__ unsigned long long msgemm_counts[CNT_KINDS];
#define MSGEMM_COUNTERS_DECLARE unsigned long long cnt_[CNT_KINDS] = {};
#define MSGEMM_COUNT_ADD(kind, v) (cnt_[CNT_##kind] += static_cast<unsigned long long>(v))
#define MSGEMM_COUNTERS_FLUSH                                  \
    for (int k_ = 0; k_ < CNT_KINDS; ++k_) {                   \
        if (cnt_[k_] != 0) atomicAdd(&msgemm_counts[k_], cnt_[k_]); \
    }
#else
#define MSGEMM_COUNTERS_DECLARE
#define MSGEMM_COUNT_ADD(kind, v) ((void)0)
#define MSGEMM_COUNTERS_FLUSH
#endif

// Entry e of the table of the tuple whose inputs start at xs: sum_j v[c_j] x_j left to right
// (c_j the base-V digits of e, first least significant). The one definition of a table entry,
// as the host scalar build computes it.
__device__ __forceinline__ float msgemm_table_entry(const float* __restrict__ values, const float* __restrict__ xs,
                                                    int levels, int depth, int e) {
    int rest = e;
    float acc = 0.0f;
    for (int j = 0; j < depth; ++j) {
        const int c = rest % levels;
        rest /= levels;
        const float prod = __fmul_rn(__ldg(values + c), __ldg(xs + j));
        acc = (j == 0) ? prod : __fadd_rn(acc, prod);
    }
    return acc;
}

// One thread per table element (grid-stride loop): `slot` = V^d entries, `stride` apart.
extern "C" __global__ void msgemm_tables(const float* __restrict__ xt, const float* __restrict__ values,
                                         int levels, int depth, long long k, int n_cols, int slot, int stride,
                                         float* __restrict__ tables) {
    const long long tuples = k / depth;
    const long long total = tuples * n_cols * stride;
    MSGEMM_COUNTERS_DECLARE
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
        const int e = static_cast<int>(i % stride);
        const int n = static_cast<int>((i / stride) % n_cols);
        const long long p = i / (static_cast<long long>(stride) * n_cols);
        if (e < slot) {
            tables[i] = msgemm_table_entry(values, xt + n * k + p * depth, levels, depth, e);
            MSGEMM_COUNT_ADD(table_mul, depth);
            MSGEMM_COUNT_ADD(table_add, depth - 1);
        } else {
            tables[i] = 0.0f;
        }
    }
    MSGEMM_COUNTERS_FLUSH
}

// S[n][g] = x_0 + x_1 + ... + x_{G-1} over the group (the zero-point term), one thread each,
// summed in double and rounded once to float (as the CPU's `table::group_sum`, within about one
// float rounding of the exact sum: a float running sum drifts by up to G 2^-24 sum |x|).
extern "C" __global__ void msgemm_group_sums(const float* __restrict__ xt, long long k, int n_cols,
                                             int group_size, float* __restrict__ sums) {
    const long long groups = k / group_size;
    const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= groups * n_cols) return;
    const long long n = i / groups;
    const long long g = i % groups;
    const float* xs = xt + n * k + g * group_size;
    double s = static_cast<double>(xs[0]);
    for (int j = 1; j < group_size; ++j) s = __dadd_rn(s, static_cast<double>(xs[j]));
    sums[i] = static_cast<float>(s);  // round to nearest
    MSGEMM_COUNTERS_DECLARE
    MSGEMM_COUNT_ADD(sum_add, group_size - 1);
    MSGEMM_COUNTERS_FLUSH
}

// Grid (ceil(M / (256 RPT)), splits), 256 threads, RPT rows per thread (rows m0 + r * 256, so
// every load of a word column is coalesced), NC = N columns (every column in one pass: each
// weight word is read once whatever N), BITS bits per table index (P = 32 / BITS tuples per
// word). A split's groups are cut into batches of `pw` words (P pw tuples) of one group, the
// unit of the weight stream: each thread loads the next batch's words (RPT x pw registers)
// before it looks up the current one, so a batch of loads is in flight per thread at all times.
// The tables are staged into shared memory by chunks of `bpc` batches (bpc P pw tuples x NC
// columns x 2^BITS floats, sized by the host to fit 48 KiB), copied from `tables` (built by
// msgemm_tables) between two barriers; a chunk's batches then run without barriers.
//
// Shared-memory banks: the 32 lanes of a warp read one tuple's table of one column at their own
// indices. With 256-entry tables (BITS = 8) several lanes can hit one bank with different words
// (about 3.5-way for uniform int4 pairs); a table of at most 16 entries (BITS = 4) spans 16
// banks, so lanes never conflict (equal indices broadcast), at twice the lookups per byte.
//
// Why this shape (measured on an H200, int4 (28672, 8192) N = 1, BENCHMARKS.md): with one
// group's 64 KiB of tables staged per step and the index words loaded just before their
// lookups it took 561 us; with the words of the next batch in flight and one batch's tables
// staged per step, 107 us at d = 2 and 97 us at d = 1 (4-bit indices). A batch of 4-bit
// indices needs only 4 KiB of tables, so one chunk holds many batches (up to 6 groups of
// 128): the barriers and the wait for each staging, once per batch before, come once per chunk
// (97 -> 89 us). ncu then found the kernel issue-bound (75% of issue slots, ALU pipe the
// busiest, DRAM 30%): six instructions per lookup (shift, mask, add of the tuple's offset,
// scale to bytes, load, add). With the tables 2^BITS floats apart, the byte address is one
// shift and one and-or, and the tuple and column offsets become the load's immediate: four
// instructions per lookup, 80 us (1.59x cuBLAS fp16 on dequantized weights). The SASS then
// showed the next batch's loads at about 325 instructions per 128 lookups (a division, 64-bit
// address products and row predicates per batch); with pointers and counters that advance by
// additions, about 130: 67 us (1.80x).
// Scales and zero points are read transposed ((K/G, M): lane = row, coalesced), with the
// group's first batch. The order of the adds of each row is that of the host scalar build.
template <int NC, int RPT, int BITS>
__global__ void __launch_bounds__(MSGEMM_ROWS, 2)
    msgemm_gemv_lut(const unsigned int* __restrict__ idx, const float* __restrict__ tables,
                    const float* __restrict__ scales_t, const float* __restrict__ zeros_t,
                    const float* __restrict__ sums, long long m_rows, int groups, int qpg, int pw, int bpc,
                    int groups_per_split, float* __restrict__ partial) {
    static_assert(BITS == 4 || BITS == 8, "table indices are nibbles or bytes");
    static_assert(RPT >= 2, "a batch's tables fit 32 KiB of shared memory from 2 rows per thread on");
    constexpr int P = 32 / BITS;                  // tuples per word
    constexpr int STRIDE = 1 << BITS;  // floats per table in T
    // Words per batch, at most: RPT NC PWMAX <= 16 (next-batch words per thread, with as many
    // current ones, beside 2 RPT NC accumulators) keeps the 128 registers of two blocks per SM
    // free of spills (ptxas -v; test_cuda_compile.py).
    constexpr int PW_LIMIT = 16 / (RPT * NC);
    constexpr int PWMAX = PW_LIMIT < 1 ? 1 : (PW_LIMIT > 8 ? 8 : PW_LIMIT);
    extern __shared__ float4 tab4[];
    float* tab = reinterpret_cast<float*>(tab4);  // the chunk's tables, laid out as T
    const long long m0 = static_cast<long long>(blockIdx.x) * (MSGEMM_ROWS * RPT) + threadIdx.x;
    const int split = blockIdx.y;
    const int g0 = split * groups_per_split;
    const int g1 = min(groups, g0 + groups_per_split);
    const int ppg = qpg / pw;  // batches per group
    const int i0 = g0 * ppg;
    const int i1 = g1 * ppg;
    const int batch_floats = pw * P * NC * STRIDE;
    const bool has_zeros = zeros_t != nullptr;
    bool live[RPT];
#pragma unroll
    for (int r = 0; r < RPT; ++r) live[r] = m0 + r * MSGEMM_ROWS < m_rows;
    MSGEMM_COUNTERS_DECLARE
    // The weight stream: batch i's word q of row m0 + 256 r is at wnext + q m_rows + 256 r when
    // batch i is next. The pointers and counters advance by additions (no divisions or 64-bit
    // products per batch: ncu counted them at over a third of the kernel's instructions).
    // Word q of a batch is qoff[q] words past its first; past the batch's pw words the last
    // one is loaded again (in bounds, never looked up), so that loads need no predicate but the
    // row's (to_device keeps M below 2^28, so 7 M fits 32 bits).
    unsigned int qoff[PWMAX];
#pragma unroll
    for (int q = 0; q < PWMAX; ++q) qoff[q] = static_cast<unsigned int>(min(q, pw - 1)) * static_cast<unsigned int>(m_rows);
    const unsigned int* wnext = idx + static_cast<long long>(i0) * pw * m_rows + m0;
    const long long wstep = static_cast<long long>(pw) * m_rows;
    const float* snext = scales_t + static_cast<long long>(g0) * m_rows + m0;
    const float* znext = has_zeros ? zeros_t + static_cast<long long>(g0) * m_rows + m0 : nullptr;
    int bnext = 0;  // the next batch's index within its group
    unsigned int wn[RPT][PWMAX];  // the next batch's words
    float sn[RPT], zn[RPT];       // the next group's scale and zero point
    // Loads the next batch's words (and its group's scale and zero point if it is the group's
    // first), then moves the stream on by one batch.
#define MSGEMM_LOAD_NEXT                                                                              \
    {                                                                                                 \
        _Pragma("unroll") for (int r = 0; r < RPT; ++r) {                                             \
            _Pragma("unroll") for (int q = 0; q < PWMAX; ++q) {                                       \
                /* Weights are read once: stream them past the caches (evict-first). */               \
                wn[r][q] = live[r] ? __ldcs(wnext + qoff[q] + r * MSGEMM_ROWS) : 0u;                  \
                MSGEMM_COUNT_ADD(words, (q < pw && live[r]) ? 1 : 0);                                 \
            }                                                                                         \
        }                                                                                             \
        if (bnext == 0) {                                                                             \
            _Pragma("unroll") for (int r = 0; r < RPT; ++r) {                                         \
                sn[r] = live[r] ? __ldg(snext + r * MSGEMM_ROWS) : 0.0f;                              \
                zn[r] = (live[r] && has_zeros) ? __ldg(znext + r * MSGEMM_ROWS) : 0.0f;               \
            }                                                                                         \
            snext += m_rows;                                                                          \
            if (has_zeros) znext += m_rows;                                                           \
        }                                                                                             \
        wnext += wstep;                                                                               \
        if (++bnext == ppg) bnext = 0;                                                                \
    }
    if (i0 < i1) MSGEMM_LOAD_NEXT
    float y[RPT][NC];
    float p[RPT][NC];
    float sc[RPT], zc[RPT];
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
        sc[r] = 0.0f;
        zc[r] = 0.0f;
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            y[r][c] = 0.0f;
            p[r][c] = 0.0f;
        }
    }
    int g = g0;        // batch i's group
    int batch = 0;     // batch i's index within its group
    int in_chunk = 0;  // batch i's index within its chunk of staged tables
    for (int i = i0; i < i1; ++i) {
        unsigned int wc[RPT][PWMAX];
#pragma unroll
        for (int r = 0; r < RPT; ++r) {
#pragma unroll
            for (int q = 0; q < PWMAX; ++q) wc[r][q] = wn[r][q];
            if (batch == 0) {
                sc[r] = sn[r];
                zc[r] = zn[r];
            }
        }
        if (i + 1 < i1) MSGEMM_LOAD_NEXT
        if (in_chunk == 0) {
            // Stage the chunk's tables: batches i .. i + bpc - 1 (fewer at the split's end),
            // contiguous in `tables` from tuple P pw i on (batch i covers words pw i ...).
            const int count = min(bpc, i1 - i) * batch_floats;
            const float4* src4 = reinterpret_cast<const float4*>(tables + static_cast<long long>(P) * pw * i * NC * STRIDE);
            __syncthreads();  // the previous chunk's tables are no longer read
            for (int v = threadIdx.x; v < count / 4; v += MSGEMM_ROWS) tab4[v] = __ldg(src4 + v);
            MSGEMM_COUNT_ADD(staged, count / MSGEMM_ROWS +
                                         (static_cast<int>(threadIdx.x) < count % MSGEMM_ROWS ? 1 : 0));
            __syncthreads();
        }
        // Byte offsets into the chunk: the batch's tables start at a multiple of 4 STRIDE bytes,
        // so `(index << 2) | batch` is their sum (one and-or), and the per-tuple and per-column
        // offsets are compile-time constants the shared-memory load takes as its immediate.
        const unsigned int batch_bytes = 4u * static_cast<unsigned int>(in_chunk * batch_floats);
        const char* tabb = reinterpret_cast<const char*>(tab);
#pragma unroll
        for (int q = 0; q < PWMAX; ++q) {
            if (q < pw) {
#pragma unroll
                for (int j = 0; j < P; ++j) {
                    constexpr unsigned int EMASK = (STRIDE - 1u) << 2;
#pragma unroll
                    for (int r = 0; r < RPT; ++r) {
                        const unsigned int w = wc[r][q];
                        const unsigned int e4 = (j == 0 ? (w << 2) : (w >> (BITS * j - 2))) & EMASK;
                        const char* at = tabb + (e4 | batch_bytes) + (P * q + j) * NC * STRIDE * 4;
#pragma unroll
                        for (int c = 0; c < NC; ++c) {
                            const float t = *reinterpret_cast<const float*>(at + c * STRIDE * 4);
                            p[r][c] = __fadd_rn(p[r][c], t);
                        }
                        MSGEMM_COUNT_ADD(lookups, live[r] ? NC : 0);
                    }
                }
            }
        }
        if (batch == ppg - 1) {  // the group's last batch: y += s * (P - z * S)
#pragma unroll
            for (int r = 0; r < RPT; ++r) {
#pragma unroll
                for (int c = 0; c < NC; ++c) {
                    float u = p[r][c];
                    if (has_zeros) u = __fsub_rn(u, __fmul_rn(zc[r], sums[c * groups + g]));
                    y[r][c] = __fadd_rn(y[r][c], __fmul_rn(sc[r], u));
                    p[r][c] = 0.0f;
                }
                MSGEMM_COUNT_ADD(scale_mul, live[r] ? NC : 0);
                MSGEMM_COUNT_ADD(zero_mul, (live[r] && has_zeros) ? NC : 0);
            }
        }
        if (++batch == ppg) {
            batch = 0;
            ++g;
        }
        if (++in_chunk == bpc) in_chunk = 0;
    }
#undef MSGEMM_LOAD_NEXT
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
        const long long m = m0 + r * MSGEMM_ROWS;
        if (live[r]) {
#pragma unroll
            for (int c = 0; c < NC; ++c) partial[(static_cast<long long>(split) * NC + c) * m_rows + m] = y[r][c];
        }
    }
    MSGEMM_COUNTERS_FLUSH
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
    MSGEMM_COUNTERS_DECLARE
    MSGEMM_COUNT_ADD(reduce_add, splits);
    MSGEMM_COUNTERS_FLUSH
}

// The dense comparator: dequantize in registers and FMA, one warp per row, 4-bit codes in the
// canonical packing (M, K/2) (k even in the low nibble). Each lane holds codebook value
// v[lane % 16]; a code is decoded with one __shfl_sync from the lane of that index. Needs
// K % 8 == 0 and G % 8 == 0 (a 32-bit word of codes never straddles a group). The warp sum is a
// fixed shuffle tree: deterministic.
extern "C" __global__ void dequant_gemv_shfl(const unsigned char* __restrict__ packed, const float* __restrict__ values,
                                             const float* __restrict__ scales_t, const float* __restrict__ zeros_t,
                                             const float* __restrict__ xt, long long m_rows, long long k, int n_cols,
                                             int group_size, float* __restrict__ y) {
    const int lane = threadIdx.x & 31;
    const long long m = static_cast<long long>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    if (m >= m_rows) return;  // whole warps leave together
    const float cb = values[lane & 15];
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
        const float s = valid ? scales_t[g * m_rows + m] : 0.0f;
        const float z = (valid && zeros_t != nullptr) ? zeros_t[g * m_rows + m] : 0.0f;
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

// ------------------------------------------------------------------------------------------
// Batches on tensor cores: dequantize to float16 in registers, then mma.m16n8k16.
//
// The LUT kernel above does one lookup and add per weight and column, so from about N = 4 on
// it loses to cuBLAS on dequantized float16 weights (tensor cores). This kernel keeps the 4-bit
// weight stream (a quarter of float16's bytes) and does the multiply-adds on tensor cores. Two
// codebooks decode without tables (a word of 8 codes becomes 4 registers of float16 pairs,
// exactly):
//   FMT 0: v[c] = c + b with an integer b (int4, uint4, int3, uint3, int2, uint2, ternary):
//          the float16 with bits 0x6400 | c is 1024 + c, and 0x6400 | c << 4 is 1024 + 16 c. Per
//          word, one shift (by 8), and per register an and-or and one float16 operation: a
//          subtraction of 1024 - b, or a multiply-add by 1/16 and b - 64 (Marlin's decode).
//   FMT 1: fp4 e2m1 (c = sign, 2 exponent bits, 1 mantissa bit): the sign to bit 15 and the
//          other three bits to bits 9-11 make the float16 v[c] 2^-14 (subnormal for 0.5), and a
//          float16 doubling makes it v 2^-13, normal: the tensor cores never see a subnormal
//          weight (how they treat them is not documented). Two shifts, two logic operations
//          and a multiply per register; the scale takes the 2^13 (vscale).
// Any other codebook of at most 16 values (nf4, custom ones) goes through a table:
//   FMT 2: codebook[c] = hi | lo << 16, the float16 split of v[c] vscale (a power of two putting
//          the largest |v| in [2^13, 2^14)); the table sits in shared memory (16 words in 16
//          banks: lanes never conflict), two loads and two byte permutes per register, and a
//          third mma per step and column tile (A hi X hi + A hi X lo + A lo X hi: the A lo X lo
//          term is below float32's precision).
//
// Layouts (python/maleki_rs/msgemm/cuda.py: to_device(..., mma=True), dequant_mma_cuda):
//   wq   [ceil(M/16) row tiles][K'/64 chunks][32 lanes] uint4, K' = K rounded up to 64 (codes
//        past M or K are 0), and one chunk of padding after the last tile (the kernel loads a
//        chunk ahead). Word j of a lane holds the A fragment of the lane for k16 step
//        4 chunk + j: with g = lane / 4 and t = lane % 4, register r of the fragment (rows g,
//        g + 8, g, g + 8 and columns 2t, 2t, 2t + 8, 2t + 8 for r = 0..3, two consecutive
//        columns each) takes nibbles 4r (first column) and 16 + 4r (second).
//   xf   [K'/16 steps][N'/8 column tiles][32 lanes] uint4: the B fragments {hi b0, hi b1, lo b0,
//        lo b1} of X scaled per column by a power of two (largest |x| in [2^13, 2^14)) and split
//        into float16 hi + lo (x = hi + lo to about 22 bits); columns past N are 0. N' is N
//        rounded up to 8 NT.
//   scales_t, zeros_t  (K/G, M) as above; sums [N][K/G]: group sums of the scaled X (from
//        msgemm_mma_x; read with zero points only).
// Grid (ceil(ceil(M/16) / (4 MT)), splits, N' / (8 NT)), 128 threads: warp w of block x owns
// the MT row tiles from (4 x + w) MT, and NT column tiles. Each split is a range of whole groups
// (`groups_per_split`, chosen by the host so that a split starts on a chunk). Per group and
// output: P = sum over the group's k16 steps of A (X hi + X lo), plus A lo X hi for FMT 2, in
// float32 accumulators from zero (integer data: exact), then y = fma(s, fma(-z, S, P), y) (with
// the weights' vscale undone; fused multiply-adds: one rounding each, where the LUT kernel's
// separate roundings keep it bit-equal to the host's f32 tables); partial[split][n][M] for
// the split reduction: y (M, N) = col_inv (the column's inverse scale, a power of two) times the
// sum of the splits' partial results in split order, which the last warp to finish a warp's
// tiles computes (arrivals: a counter per warp tile and block along N, zeroed by msgemm_mma_x).
// With one split the kernel writes y directly: no partial results.
// ZP: zero points read (zeros_t, sums) or not. A template parameter, not a null test: their
// registers (a group's zero points are loaded a group ahead, as its scales) would cost every
// shape without zero points registers, and so blocks per SM (with NVRTC 13.5 the zero-point
// instantiations take 176-191 registers a thread).
#define MSGEMM_MMA_WARPS 4
// With `prefetch` on, a warp asks for the weights this many chunks beyond the next into L2.
#define MSGEMM_MMA_PREFETCH 2

#ifdef CUDASIM
__device__ __forceinline__ unsigned int msgemm_f2h(float f) { return cudasim::float_to_half_bits(f); }
__device__ __forceinline__ float msgemm_h2f(unsigned int h) { return cudasim::half_bits_to_float(h); }
__device__ __forceinline__ unsigned int msgemm_hsub2(unsigned int a, unsigned int b) { return cudasim::hsub2(a, b); }
__device__ __forceinline__ unsigned int msgemm_hmul2(unsigned int a, unsigned int b) { return cudasim::hmul2(a, b); }
__device__ __forceinline__ unsigned int msgemm_hfma2(unsigned int a, unsigned int b, unsigned int c) {
    return cudasim::hfma2(a, b, c);
}
__device__ __forceinline__ void msgemm_prefetch_l2(const void* p) { cudasim::prefetch(p); }
__device__ __forceinline__ void msgemm_mma16816(float (&d)[4], const unsigned int (&a)[4], unsigned int b0,
                                                unsigned int b1) {
    cudasim::mma16816(d, a, b0, b1);
}
#else
__device__ __forceinline__ unsigned int msgemm_f2h(float f) {  // round to nearest even
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float msgemm_h2f(unsigned int h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(static_cast<unsigned short>(h)));
    return f;
}
__device__ __forceinline__ unsigned int msgemm_hsub2(unsigned int a, unsigned int b) {
    unsigned int d;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
__device__ __forceinline__ unsigned int msgemm_hmul2(unsigned int a, unsigned int b) {
    unsigned int d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
__device__ __forceinline__ unsigned int msgemm_hfma2(unsigned int a, unsigned int b, unsigned int c) {
    unsigned int d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ void msgemm_prefetch_l2(const void* p) {  // p: global memory, as a global address
    asm volatile("prefetch.global.L2 [%0];" ::"l"(__cvta_generic_to_global(p)));
}
__device__ __forceinline__ void msgemm_mma16816(float (&d)[4], const unsigned int (&a)[4], unsigned int b0,
                                                unsigned int b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

// X's B fragments, one block per column n of the padded N' (up to 1024 threads, a multiple of
// 32): the column's scale 2^a, with a such that the largest |x| of column n of xt (N, K) is in
// [2^13, 2^14) (a within [-125, 125], so that 2^a and inv[n] = 2^-a are normal floats and
// scaling is exact; an all-zero column gets a = 14); then the column's words of xf [K'/16
// steps][N'/8 tiles][32 lanes][4] (layout above), each two float16s of hi or of lo of x 2^a (0
// past K; a column past N is all 0 and has no inv). Words 4 t + reg of a step of column n sit at lane 4 (n % 8) + t:
// 16 consecutive words, so the writes are 64-byte runs and the reads 128-byte ones. Block 0
// also zeroes msgemm_mma's n_arrivals split counters (none with one split).
extern "C" __global__ void msgemm_mma_x(const float* __restrict__ xt, long long k, int n_cols, int x_tiles,
                                        int steps, int group_size, float* __restrict__ inv,
                                        unsigned int* __restrict__ xf,
                                        float* __restrict__ sums, unsigned int* __restrict__ arrivals,
                                        int n_arrivals) {
    __shared__ float part[1024 / 32];
    if (blockIdx.x == 0) {  // msgemm_mma's split counters, for the launch that follows
        for (int i = threadIdx.x; i < n_arrivals; i += blockDim.x) arrivals[i] = 0;
    }
    const int n = blockIdx.x;
    const bool live = n < n_cols;
    float mx = 0.0f;
    if (live) {
#pragma unroll 8  // eight loads in flight a thread: few blocks at small N, so latency is the cost
        for (long long i = threadIdx.x; i < k; i += blockDim.x) mx = fmaxf(mx, fabsf(xt[n * k + i]));
    }
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = mx;
    __syncthreads();
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) mx = fmaxf(mx, part[w]);  // every thread
    int e = 0;
    frexpf(mx, &e);  // mx = f 2^e, f in [0.5, 1); e = 0 for 0
    const int a = min(125, max(-125, 14 - e));
    const float sc = ldexpf(1.0f, a);
    if (live && threadIdx.x == 0) inv[n] = ldexpf(1.0f, -a);
    const long long words = 16LL * steps;
    unsigned int* const out = xf + (static_cast<long long>(n / 8) * 32 + 4 * (n % 8)) * 4;
    for (long long i = threadIdx.x; i < words; i += blockDim.x) {
        const int reg = static_cast<int>(i & 3), t = static_cast<int>((i >> 2) & 3);
        const long long step = i >> 4;
        const long long k0 = step * 16 + 8 * (reg & 1) + 2 * t;
        unsigned int word = 0;
        for (int h = 0; h < 2; ++h) {
            const float v = (live && k0 + h < k) ? __fmul_rn(xt[n * k + k0 + h], sc) : 0.0f;
            const unsigned int hi = msgemm_f2h(v);
            const unsigned int bits = reg < 2 ? hi : msgemm_f2h(__fsub_rn(v, msgemm_h2f(hi)));  // hi, or lo = v - hi
            word |= bits << (16 * h);
        }
        out[step * x_tiles * 128 + 4 * t + reg] = word;
    }
    // With zero points (sums not null): sums[n][g], the group sums of the scaled column (exact
    // scaling: a power of two), a warp per group (any order of float32 additions; exact on
    // integer data).
    if (sums != nullptr && live) {
        const int groups = static_cast<int>(k / group_size);
        const int lane = threadIdx.x & 31;
        for (int g = threadIdx.x / 32; g < groups; g += blockDim.x / 32) {
            const float* xs = xt + n * k + static_cast<long long>(g) * group_size;
            float acc = 0.0f;
            for (int j = lane; j < group_size; j += 32) acc = __fadd_rn(acc, __fmul_rn(xs[j], sc));
            for (int off = 16; off > 0; off >>= 1) acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, off));
            if (lane == 0) sums[static_cast<long long>(n) * groups + g] = acc;
        }
    }
}

__device__ __forceinline__ unsigned int msgemm_word(const uint4& v, int j) {
    return j == 0 ? v.x : (j == 1 ? v.y : (j == 2 ? v.z : v.w));
}

// The split reduction of msgemm_mma, by the last of the splits' warps to finish a warp's tiles:
// their partial results added in split order (as msgemm_reduce_splits does for the LUT kernel:
// deterministic, whichever warp is last), times col_inv, into y; no second launch. Each warp's
// stores are released with its count; the last one fences again before reading them from L2.
// Not inlined, with its indices from blockIdx again: its registers do not add to the kernel's
// step loop (inlined, they cost the (4, 1) shape with zero points a block per SM).
template <int MT, int NT>
__device__ __noinline__ void msgemm_mma_add_splits(const float* __restrict__ partial,
                                                   const float* __restrict__ col_inv,
                                                   unsigned int* __restrict__ arrivals, float* __restrict__ y,
                                                   long long m_rows, int n_cols) {
    const int lane = threadIdx.x & 31;
    const long long warp_tile = static_cast<long long>(blockIdx.x) * MSGEMM_MMA_WARPS + threadIdx.x / 32;
    const long long tile0 = warp_tile * MT;
    const int nt0 = blockIdx.z * NT;
    // Release (PTX memory model: a fence, then the strong write, in the same thread): the warp
    // barrier orders every lane's partial stores before lane 0's fence, and that fence before
    // its count.
    __syncwarp();
    unsigned int arrived = 0;
    if (lane == 0) {
        __threadfence();
        arrived = atomicAdd(arrivals + warp_tile * gridDim.z + blockIdx.z, 1u);
    }
    arrived = __shfl_sync(0xffffffffu, arrived, 0);
    if (arrived != gridDim.y - 1) return;
    __threadfence();
    __syncwarp();
    const int rows = 16 * MT;
    for (int e = lane; e < rows * 8 * NT; e += 32) {
        const long long row = tile0 * 16 + e % rows;
        const int n = nt0 * 8 + e / rows;
        if (row >= m_rows || n >= n_cols) continue;
        float sum = 0.0f;
        for (int q = 0; q < static_cast<int>(gridDim.y); ++q) {
            sum = __fadd_rn(sum, __ldcg(partial + (static_cast<long long>(q) * n_cols + n) * m_rows + row));
        }
        y[row * n_cols + n] = __fmul_rn(sum, col_inv[n]);
    }
}

template <int MT, int NT, int FMT, bool ZP>
__global__ void __launch_bounds__(32 * MSGEMM_MMA_WARPS)
    msgemm_mma(const uint4* __restrict__ wq, const uint4* __restrict__ xf, const float* __restrict__ scales_t,
               const float* __restrict__ zeros_t, const float* __restrict__ sums,
               const unsigned int* __restrict__ codebook, unsigned int offset2, float vscale, long long m_rows,
               int chunks, int x_tiles, int n_cols, int groups, int steps_per_group, int groups_per_split,
               int prefetch, float* __restrict__ partial, const float* __restrict__ col_inv,
               unsigned int* __restrict__ arrivals, float* __restrict__ y) {
    __shared__ unsigned cb[16];  // FMT 2's table
    if (FMT == 2) {
        if (threadIdx.x < 16) cb[threadIdx.x] = codebook[threadIdx.x];
        __syncthreads();  // before any warp leaves (warp 0 never does)
    }
    const int lane = threadIdx.x & 31;
    const int gid = lane >> 2, tig = lane & 3;
    const long long row_tiles = (m_rows + 15) / 16;
    const long long tile0 = (static_cast<long long>(blockIdx.x) * MSGEMM_MMA_WARPS + threadIdx.x / 32) * MT;
    if (tile0 >= row_tiles) return;  // whole warps leave together (the mma is a warp collective)
    const int split = blockIdx.y;
    const int g_begin = split * groups_per_split;
    const int g_end = min(groups, g_begin + groups_per_split);
    const int s_begin = g_begin * steps_per_group;  // a multiple of 4: a chunk's first step
    const int s_end = g_end == groups ? 4 * chunks : g_end * steps_per_group;  // the last split takes K's padding
    const int nt0 = blockIdx.z * NT;
    const float inv_vscale = 1.0f / vscale;  // exact: a power of two
    // FMT 0: 1024 + 16 c, times 1/16 (0x2c00) and minus 64 - b, is c + b (one rounding, exact)
    const unsigned int offset16 = msgemm_hsub2(0x63806380u, offset2);  // 960 - (1024 - b) = b - 64
    // Row tiles past the last (in the warp's last MT) read the last tile again and store nothing.
    const uint4* wp[MT];
#pragma unroll
    for (int i = 0; i < MT; ++i) {
        const long long tile = min(tile0 + i, row_tiles - 1);
        wp[i] = wq + (tile * chunks + s_begin / 4) * 32 + lane;
    }
    const uint4* xp = xf + (static_cast<long long>(s_begin) * x_tiles + nt0) * 32 + lane;
    const long long x_step = static_cast<long long>(x_tiles) * 32;
    // The group's scales (and zero points, and the zero-point sums of the lane's columns) of the
    // lane's rows 16 i + 8 h from row0, loaded a group ahead of their use, from one pointer with
    // the rows at immediate offsets; only the warp that holds the last row tests rows against M.
    const long long row0 = tile0 * 16 + gid;
    const bool all_rows = (tile0 + MT) * 16 <= m_rows;  // uniform over the warp
    const int rows_left = static_cast<int>(min(m_rows - row0, 16LL * MT));
    auto load_rows = [&](float(&dst)[MT][2], const float* p) {
        if (all_rows) {
#pragma unroll
            for (int i = 0; i < MT; ++i) {
#pragma unroll
                for (int h = 0; h < 2; ++h) dst[i][h] = __ldg(p + 16 * i + 8 * h);
            }
        } else {
#pragma unroll
            for (int i = 0; i < MT; ++i) {
#pragma unroll
                for (int h = 0; h < 2; ++h) dst[i][h] = 16 * i + 8 * h < rows_left ? __ldg(p + 16 * i + 8 * h) : 0.0f;
            }
        }
    };
    const float* sp = scales_t + static_cast<long long>(g_begin) * m_rows + row0;
    const float* zp = !ZP ? nullptr : zeros_t + static_cast<long long>(g_begin) * m_rows + row0;
    float sc[MT][2], zc[MT][2], zs[NT][2];
    auto load_group = [&](int grp) {  // group grp's, into sc, zc and zs
        load_rows(sc, sp);
        if (ZP) {
            load_rows(zc, zp);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {  // columns past N are 0
                    const int n = (nt0 + nt) * 8 + 2 * tig + e;
                    zs[nt][e] = n < n_cols ? __fmul_rn(__ldg(sums + static_cast<long long>(n) * groups + grp), vscale)
                                           : 0.0f;
                }
            }
        }
    };
    load_group(g_begin);

    float acc[MT][NT][4], pg[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][nt][e] = pg[i][nt][e] = 0.0f;
        }
    }
    // Evict first: read once per block along N, and blocks along N (N > 8 NT) come one after
    // another in launch order, long after the weights would have left L2 (choosing the hint
    // per launch costs registers).
    uint4 cur[MT];
#pragma unroll
    for (int i = 0; i < MT; ++i) cur[i] = __ldcs(wp[i]);
    // X's fragments run one step ahead of the multiplies (they come from L1/L2: every warp of
    // the block and every row block of the split reads the same ones).
    uint4 xb[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) xb[nt] = __ldg(xp + nt * 32);
    int g = g_begin;
    int left = steps_per_group;  // steps of group g still to come
    for (int s = s_begin; s < s_end; s += 4) {
        // The next chunk's words are in flight while this one is multiplied. Past a split's end
        // they are the next chunk in memory, or the padding chunk after the last tile: loaded
        // and not used (a select here cost 16 register moves a chunk).
        uint4 nxt[MT];
        const bool more = s + 4 < s_end;
#pragma unroll
        for (int i = 0; i < MT; ++i) {
            wp[i] += 32;
            nxt[i] = __ldcs(wp[i]);
        }
        // And the chunk MSGEMM_MMA_PREFETCH beyond that one into L2 (no registers), so that more
        // bytes are in flight than the registers hold; not past the split's end (another block
        // reads those, long before).
        if (prefetch && s + 4 * (1 + MSGEMM_MMA_PREFETCH) < s_end) {
#pragma unroll
            for (int i = 0; i < MT; ++i) msgemm_prefetch_l2(wp[i] + 32 * MSGEMM_MMA_PREFETCH);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            uint4 xn[NT];
            const bool next = j < 3 || more;
            xp += x_step;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) xn[nt] = next ? __ldg(xp + nt * 32) : xb[nt];
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                const unsigned int w = msgemm_word(cur[i], j);
                unsigned int a[4], alo[4];
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    if (FMT == 0) {  // nibbles 0, 16 and 8, 24 at their place; 4, 20 and 12, 28 times 16
                        const unsigned int mask = r % 2 ? 0x00f000f0u : 0x000f000fu;
                        const unsigned int q = ((r < 2 ? w : w >> 8) & mask) | 0x64006400u;
                        a[r] = r % 2 ? msgemm_hfma2(q, 0x2c002c00u, offset16) : msgemm_hsub2(q, offset2);
                    } else if (FMT == 1) {  // sign bits 4r + 3 (and + 19) to 15 (31), bits 4r..4r+2 to 9..11
                        const unsigned int em = (r < 3 ? w << (9 - 4 * r) : w >> 3) & 0x0e000e00u;
                        a[r] = msgemm_hmul2(((w << (12 - 4 * r)) & 0x80008000u) | em, 0x40004000u);  // x 2.0
                    } else {
                        const unsigned int t0 = cb[(w >> (4 * r)) & 15u], t1 = cb[(w >> (16 + 4 * r)) & 15u];
                        a[r] = __byte_perm(t0, t1, 0x5410);    // hi of both
                        alo[r] = __byte_perm(t0, t1, 0x7632);  // lo of both
                    }
                }
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    msgemm_mma16816(pg[i][nt], a, xb[nt].x, xb[nt].y);
                    msgemm_mma16816(pg[i][nt], a, xb[nt].z, xb[nt].w);
                    if (FMT == 2) msgemm_mma16816(pg[i][nt], alo, xb[nt].x, xb[nt].y);
                }
            }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) xb[nt] = xn[nt];
            if (--left == 0) {  // the end of group g (uniform over the warp)
                if (g < g_end) {
#pragma unroll
                    for (int i = 0; i < MT; ++i) {
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            // The decoded values are v vscale (a power of two: exact throughout)
                            const float s_ih = FMT == 0 ? sc[i][h] : __fmul_rn(sc[i][h], inv_vscale);
#pragma unroll
                            for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                                for (int e = 0; e < 2; ++e) {
                                    float u = pg[i][nt][2 * h + e];
                                    if (ZP) u = __fmaf_rn(-zc[i][h], zs[nt][e], u);
                                    acc[i][nt][2 * h + e] = __fmaf_rn(s_ih, u, acc[i][nt][2 * h + e]);
                                }
                            }
                        }
                    }
                    if (g + 1 < g_end) {  // the next group's, in flight over its steps
                        sp += m_rows;
                        if (ZP) zp += m_rows;
                        load_group(g + 1);
                    }
                }
#pragma unroll
                for (int i = 0; i < MT; ++i) {
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                        for (int e = 0; e < 4; ++e) pg[i][nt][e] = 0.0f;
                    }
                }
                ++g;
                left = steps_per_group;
            }
        }
#pragma unroll
        for (int i = 0; i < MT; ++i) cur[i] = nxt[i];
    }
#pragma unroll
    for (int i = 0; i < MT; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const long long row = (tile0 + i) * 16 + gid + 8 * h;
            if (row >= m_rows) continue;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int n = (nt0 + nt) * 8 + 2 * tig + e;
                    if (n < n_cols) {
                        if (gridDim.y == 1) {  // one split: the result itself, times the inverse column scale
                            y[row * n_cols + n] = __fmul_rn(acc[i][nt][2 * h + e], col_inv[n]);
                        } else {
                            partial[(static_cast<long long>(split) * n_cols + n) * m_rows + row] =
                                acc[i][nt][2 * h + e];
                        }
                    }
                }
            }
        }
    }
    if (gridDim.y > 1) msgemm_mma_add_splits<MT, NT>(partial, col_inv, arrivals, y, m_rows, n_cols);
}
