"""The CPU simulator of CUDA kernels (``cudasim.h``) that runs the device oracles without a GPU:
its shuffles, barriers and shared memory against closed forms, and the errors it must raise
on kernels that are wrong (so the oracles run on it can fail)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from . import cudasim

pytestmark = pytest.mark.skipif(cudasim.compiler() is None, reason="cudasim needs a C++ compiler")

SRC = r"""
// out[t] = the value of lane f(lane) of the thread's warp, per shuffle kind (width 32 and 8).
extern "C" __global__ void shuffles(const float* __restrict__ in, float* __restrict__ out) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    const float v = in[t];
    out[8 * t + 0] = __shfl_sync(0xffffffffu, v, 5);
    out[8 * t + 1] = __shfl_down_sync(0xffffffffu, v, 3);
    out[8 * t + 2] = __shfl_up_sync(0xffffffffu, v, 2);
    out[8 * t + 3] = __shfl_xor_sync(0xffffffffu, v, 9);
    out[8 * t + 4] = __shfl_sync(0xffffffffu, v, 3, 8);
    out[8 * t + 5] = __shfl_down_sync(0xffffffffu, v, 3, 8);
    out[8 * t + 6] = __shfl_up_sync(0xffffffffu, v, 2, 8);
    out[8 * t + 7] = __shfl_xor_sync(0xffffffffu, v, 5, 8);
}

// Reverses each block's slice through dynamic shared memory (BARRIER: with the barrier).
template <bool BARRIER>
__global__ void reverse(const float* __restrict__ in, float* __restrict__ out) {
    extern __shared__ float buf[];
    const int t = threadIdx.x, base = blockIdx.x * blockDim.x;
    buf[t] = in[base + t];
    if (BARRIER) __syncthreads();
    out[base + t] = buf[blockDim.x - 1 - t];
}

// Reverses each warp's values through shared memory (SYNC: with __syncwarp between).
template <bool SYNC>
__global__ void warp_reverse(const float* __restrict__ in, float* __restrict__ out) {
    __shared__ float buf[64];
    const int t = threadIdx.x;
    buf[t] = in[t];
    if (SYNC) __syncwarp();
    out[t] = buf[(t & ~31) + 31 - (t & 31)];
}

// Even threads wait at a block barrier while odd ones wait at a shuffle: a deadlock. (A
// barrier that returned threads skip is not one: they count as arrived, as on a device.)
extern "C" __global__ void divergent_barrier(float* out) {
    float v = 1.0f;
    if (threadIdx.x % 2 == 0) __syncthreads();
    else v = __shfl_sync(0xffffffffu, v, 1);
    out[threadIdx.x] = v;
}

// Lanes 16..31 return before lane 0 reads lane 20.
extern "C" __global__ void shuffle_from_a_returned_lane(float* out) {
    if (threadIdx.x >= 16) return;
    out[threadIdx.x] = __shfl_sync(0xffffffffu, 1.0f, 20);
}

// Static shared memory that only block 0 writes: other blocks must not see its values.
extern "C" __global__ void static_shared(float* out) {
    __shared__ float s[32];
    if (blockIdx.x == 0) s[threadIdx.x] = 7.0f;
    __syncthreads();
    out[blockIdx.x * 32 + threadIdx.x] = s[threadIdx.x];
}

// Writes one float past the dynamic shared memory it is given (n floats).
extern "C" __global__ void smem_overrun(int n) {
    extern __shared__ float buf[];
    if (threadIdx.x == 0) buf[n] = 1.0f;
}

// Thread 0 of the last block reads in[n] (one past an array of n floats when n is its size),
// after a block barrier (so on a fiber of its own), and writes it to out.
extern "C" __global__ void read_at(const float* __restrict__ in, int n, float* __restrict__ out) {
    __syncthreads();
    if (blockIdx.x == gridDim.x - 1 && threadIdx.x == 0) out[0] = in[n];
}

// Thread 3 writes out[n].
extern "C" __global__ void write_at(float* out, int n) {
    if (threadIdx.x == 3) out[n] = 1.0f;
}

extern "C" __global__ void partial_mask(float* out) {
    out[threadIdx.x] = __shfl_sync(0x0000ffffu, 1.0f, 0);
}

// A block-wide sum in a fixed shuffle tree (as cuda/include/maleki/reduce.cuh does).
extern "C" __global__ void block_sum(const double* __restrict__ in, double* __restrict__ out) {
    __shared__ double warp_sums[32];
    double v = in[blockIdx.x * blockDim.x + threadIdx.x];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < blockDim.x / 32 ? warp_sums[threadIdx.x] : 0.0;
        for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
        if (threadIdx.x == 0) out[blockIdx.x] = v;
    }
}

// One mma.m16n8k16 (cudasim::mma16816): each lane builds its fragments from A (16 x 16) and B
// (16 x 8, [k][n]) as float16 bits, by the PTX ISA's formulas, and writes its part of D = A B + C
// (16 x 8 floats, in place in c); hsub[lane] = the float16 pairs ha[lane] - hb[lane], and
// hfma[lane] = ha[lane] hb[lane] + hc[lane].
extern "C" __global__ void mma_tile(const unsigned short* __restrict__ a, const unsigned short* __restrict__ b,
                                    float* __restrict__ c, const unsigned int* __restrict__ ha,
                                    const unsigned int* __restrict__ hb, unsigned int* __restrict__ hsub,
                                    const unsigned int* __restrict__ hc, unsigned int* __restrict__ hfma) {
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    unsigned int af[4];
    for (int r = 0; r < 4; ++r) {
        const int row = g + 8 * (r % 2), col = 2 * t + 8 * (r / 2);
        af[r] = a[row * 16 + col] | (static_cast<unsigned int>(a[row * 16 + col + 1]) << 16);
    }
    unsigned int bf[2];
    for (int r = 0; r < 2; ++r) {
        const int k = 2 * t + 8 * r;
        bf[r] = b[k * 8 + g] | (static_cast<unsigned int>(b[(k + 1) * 8 + g]) << 16);
    }
    float d[4];
    for (int i = 0; i < 4; ++i) d[i] = c[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2];
    cudasim::mma16816(d, af, bf[0], bf[1]);
    for (int i = 0; i < 4; ++i) c[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = d[i];
    hsub[lane] = cudasim::hsub2(ha[lane], hb[lane]);
    hfma[lane] = cudasim::hfma2(ha[lane], hb[lane], hc[lane]);
}
"""
NAMES = ("shuffles", "reverse<true>", "reverse<false>", "warp_reverse<true>", "warp_reverse<false>", "divergent_barrier", "shuffle_from_a_returned_lane",
         "block_sum", "static_shared", "smem_overrun", "partial_mask", "read_at", "write_at",
         "mma_tile")


@pytest.fixture(scope="module")
def mod():
    return cudasim.module_from_source(SRC, NAMES, stem="cudasim_selftest")


def test_shuffles_follow_the_cuda_definitions(mod):
    threads, blocks = 64, 2
    x = np.arange(threads * blocks, dtype=np.float32) * 1.5 + 1
    out = np.full((threads * blocks, 8), np.nan, np.float32)
    mod.get_function("shuffles")((blocks,), (threads,), (x, out))
    t = np.arange(threads * blocks)
    lane, warp0 = t % 32, t - t % 32

    def pick(src_lane, width):
        seg = lane - lane % width
        # Lanes outside the segment keep their own value (down, up, xor past the width).
        ok = (src_lane >= seg) & (src_lane < seg + width)
        return np.where(ok, x[warp0 + np.clip(src_lane, 0, 31)], x[t])

    want = np.stack([
        x[warp0 + 5], pick(lane + 3, 32), pick(lane - 2, 32), x[warp0 + (lane ^ 9)],
        x[warp0 + (lane - lane % 8) + 3], pick(lane + 3, 8), pick(lane - 2, 8), pick(lane ^ 5, 8),
    ], axis=1)
    np.testing.assert_array_equal(out, want)


def test_shared_memory_needs_its_barrier(mod):
    threads, blocks = 128, 3
    x = np.arange(threads * blocks, dtype=np.float32)
    want = x.reshape(blocks, threads)[:, ::-1].ravel()
    out = np.zeros_like(x)
    mod.get_function("reverse<true>")((blocks,), (threads,), (x, out), shared_mem=4 * threads)
    np.testing.assert_array_equal(out, want)
    # Without the barrier, a thread reads slots that later threads have not written yet: the
    # simulator's fill (NaN), as uninitialised shared memory would on a device.
    out[:] = 0
    mod.get_function("reverse<false>")((blocks,), (threads,), (x, out), shared_mem=4 * threads)
    assert np.isnan(out).any() and not np.array_equal(out, want)


def test_warp_exchange_needs_its_syncwarp(mod):
    x = np.arange(64, dtype=np.float32)
    out = np.zeros_like(x)
    mod.get_function("warp_reverse<true>")((1,), (64,), (x, out))
    np.testing.assert_array_equal(out, x.reshape(2, 32)[:, ::-1].ravel())
    out[:] = 0
    mod.get_function("warp_reverse<false>")((1,), (64,), (x, out))
    assert np.isnan(out).any()


def test_block_sum_is_exact_on_integers(mod):
    threads, blocks = 256, 5
    x = np.random.default_rng(0).integers(-1000, 1000, threads * blocks).astype(np.float64)
    out = np.zeros(blocks)
    mod.get_function("block_sum")((blocks,), (threads,), (x, out))
    np.testing.assert_array_equal(out, x.reshape(blocks, threads).sum(axis=1))


def test_shared_memory_starts_unwritten_in_every_block(mod):
    out = np.zeros(3 * 32, np.float32)
    mod.get_function("static_shared")((3,), (32,), (out,))
    assert np.all(out[:32] == 7) and np.isnan(out[32:]).all()


def test_launches_from_two_threads_run_one_at_a_time(mod):
    threads, blocks = 256, 40
    x = np.random.default_rng(1).integers(-1000, 1000, threads * blocks).astype(np.float64)
    outs = [np.zeros(blocks) for _ in range(4)]

    def run(o):
        mod.get_function("block_sum")((blocks,), (threads,), (x, o))

    ts = [threading.Thread(target=run, args=(o,)) for o in outs]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for o in outs:
        np.testing.assert_array_equal(o, x.reshape(blocks, threads).sum(axis=1))


def test_tensor_core_mma_and_float16_arithmetic_follow_their_definitions(mod):
    """The model of mma.m16n8k16 (float16 A, B; float32 C, D) against numpy's float64 product of
    the same float16 values, rounded once; sub.rn.f16x2 against numpy's float16 subtraction, and
    fma.rn.f16x2 against the float64 a b + c rounded once to float16."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((16, 16)).astype(np.float16)
    b = (rng.standard_normal((16, 8)) * 100).astype(np.float16)
    c = rng.standard_normal((16, 8)).astype(np.float32)
    want = (a.astype(np.float64) @ b.astype(np.float64) + c).astype(np.float32)
    ha = rng.standard_normal(64).astype(np.float16)
    hb = (rng.standard_normal(64) * 1e3).astype(np.float16)
    hc = (rng.standard_normal(64) * 1e2).astype(np.float16)
    hsub, hfma = np.zeros(32, np.uint32), np.zeros(32, np.uint32)
    mod.get_function("mma_tile")((1,), (32,), (a.view(np.uint16), b.view(np.uint16), c, ha.view(np.uint32),
                                               hb.view(np.uint32), hsub, hc.view(np.uint32), hfma))
    np.testing.assert_array_equal(c, want)
    np.testing.assert_array_equal(hsub.view(np.float16), ha - hb)
    fma = ha.astype(np.float64) * hb.astype(np.float64) + hc.astype(np.float64)
    np.testing.assert_array_equal(hfma.view(np.float16), fma.astype(np.float16))
    assert not np.array_equal(fma.astype(np.float16), (ha * hb + hc))  # one rounding, not two: the test can tell


def test_wrong_kernels_stop_with_an_error(mod):
    with pytest.raises(RuntimeError, match="past the 64 bytes"):
        mod.get_function("smem_overrun")((2,), (32,), (np.int32(16),), shared_mem=64)
    mod.get_function("smem_overrun")((2,), (32,), (np.int32(15),), shared_mem=64)  # the last float: fine
    with pytest.raises(RuntimeError, match="at most 49152 without opt-in"):
        mod.get_function("smem_overrun")((1,), (32,), (np.int32(0),), shared_mem=48 * 1024 + 4)
    with pytest.raises(RuntimeError, match="part of a warp"):
        mod.get_function("partial_mask")((1,), (32,), (np.zeros(32, np.float32),))
    out = np.zeros(64, np.float32)
    with pytest.raises(RuntimeError, match="never all be met"):
        mod.get_function("divergent_barrier")((1,), (64,), (out,))
    with pytest.raises(RuntimeError, match="has returned"):
        mod.get_function("shuffle_from_a_returned_lane")((1,), (32,), (out,))


def test_global_accesses_past_an_array_stop_with_an_error(mod):
    """Reads and writes past an argument's end (by up to a page; at most 15 bytes past it go
    unseen, for 16-byte alignment) stop the launch and name the argument; the process lives on
    and the next launch runs."""
    x = np.arange(64, dtype=np.float32)
    out = np.zeros(4, np.float32)
    read_at, write_at = mod.get_function("read_at"), mod.get_function("write_at")
    read_at((3,), (64,), (x, np.int32(63), out))
    assert out[0] == 63.0  # the last element: fine, and the result comes back
    with pytest.raises(RuntimeError, match=r"past the end of argument 0 \(block 2,0,0, thread 0,0,0\)"):
        read_at((3,), (64,), (x, np.int32(64 + 1000), out))  # 4000 bytes past the end
    with pytest.raises(RuntimeError, match="past the end of argument 0"):
        read_at((3,), (64,), (x[:60], np.int32(64), out))  # a view: guarded too
    with pytest.raises(RuntimeError, match="past the end of argument 0"):
        read_at((1,), (32,), (np.zeros(0, np.float32), np.int32(0), out))
    with pytest.raises(RuntimeError, match=r"past the end of argument 0 \(block 0,0,0, thread 3,0,0\)"):
        write_at((1,), (32,), (out, np.int32(4)))
    write_at((1,), (32,), (out, np.int32(3)))
    np.testing.assert_array_equal(out, [63.0, 0.0, 0.0, 1.0])
    np.testing.assert_array_equal(x, np.arange(64, dtype=np.float32))


def test_arguments_are_checked_against_the_kernel(mod):
    x = np.zeros(64, np.float32)
    with pytest.raises(TypeError, match="takes 2 arguments"):
        mod.get_function("shuffles")((1,), (32,), (x,))
    with pytest.raises(TypeError, match="numpy array or scalar"):
        mod.get_function("shuffles")((1,), (32,), (x, 3))
    with pytest.raises(TypeError, match="4 bytes, the kernel's parameter 8"):
        mod.get_function("shuffles")((1,), (32,), (x, np.float32(0)))
    with pytest.raises(RuntimeError, match="launch configuration"):
        mod.get_function("shuffles")((1,), (2048,), (x, x))


def test_the_build_cache_keys_on_included_headers(tmp_path, monkeypatch):
    """An edited header gives a new build (a cached one would test the old code)."""
    root = tmp_path / "cuda"
    (root / "include" / "maleki").mkdir(parents=True)
    header = root / "include" / "maleki" / "twice.cuh"
    src = '#include "maleki/twice.cuh"\nextern "C" __global__ void k(float* o) { o[threadIdx.x] = f(1.0f); }\n'
    monkeypatch.setattr(cudasim, "cuda_root", lambda: root)
    monkeypatch.setenv("MALEKI_RS_CUDASIM_CACHE", str(tmp_path / "cache"))
    out = np.zeros(32, np.float32)
    for factor in (2, 3):
        header.write_text(f"__device__ float f(float x) {{ return {factor} * x; }}\n")
        cudasim.module_from_source(src, ("k",), stem="cache_test").get_function("k")((1,), (32,), (out,))
        assert np.all(out == factor)
