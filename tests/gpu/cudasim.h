// cudasim.h: runs this project's CUDA kernels on the CPU, for tests on machines without a GPU.
//
// A kernel file is compiled as C++ with this header included first (tests/gpu/cudasim.py does
// it, and gives the kernels to Python through a fake CuPy). What it models:
//   - blocks run one after another; the threads of a block are cooperative fibers (ucontext),
//     switched only at barriers, so a run is deterministic;
//   - __syncthreads() waits for every thread of the block that has not returned (returned
//     threads count as arrived, as on GPUs since Volta);
//   - warp shuffles (__shfl*_sync) wait for the live threads of their warp and exchange values;
//     a shuffle that reads a lane that did not take part (it returned first), and barriers that
//     can never all be met (threads of a block waiting at different kinds of barrier), stop the
//     launch with an error;
//   - shared memory, dynamic (at most 48 KiB: no opt-in to more is modelled) and static, is
//     filled with 0xff bytes (NaN floats) before each block, so a read of a slot the block
//     never wrote shows up; a write past the dynamic size stops the launch with an error;
//   - float arithmetic is IEEE binary32/64 without contraction (-ffp-contract=off): the
//     __f*_rn intrinsics, fmaf and fma give the same bits as on a GPU. NVRTC contracts a plain
//     a * b + c into an FMA by default, so kernels spell out their roundings (as ours do).
//   - global memory past the end of an argument array: cudasim.py places each array's end
//     against a page that cannot be read or written (at most 15 bytes short of it, to keep
//     16-byte alignment), and a fault there stops the launch with an error naming the argument.
//   - float16 (as bits, two to a 32-bit word) and the tensor-core instruction mma.m16n8k16
//     with float32 accumulators: cudasim::hsub2, hmul2 and mma16816 below stand in for the
//     kernels' inline PTX (they test CUDASIM); the mma is a warp collective, like a shuffle.
// What it does not model: the memory model (no races between blocks can happen here), warp
// divergence timing, shuffles over part of a warp (a mask other than 0xffffffff is refused),
// global accesses before an array's start (wrong results or a crash), speed. One launch runs
// at a time in a process (cudasim.py holds a lock).
//
// A thread that never waits costs a function call: a fiber runs the threads of its block one
// after another until one of them waits, so a kernel without barriers runs each block in one
// fiber.
#pragma once

// Kernel sources test this to swap inline PTX for the models at the end of this header.
#define CUDASIM 1

#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <csetjmp>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <deque>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
// One copy per kernel instantiation; blocks run one at a time, so that is one per block.
// (cudasim.py also rewrites each `__shared__` declaration to be refilled per block.)
#define __shared__ static

struct uint3 {
    unsigned int x = 0, y = 0, z = 0;
};
struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned int x, y;
};
struct alignas(16) uint4 {
    unsigned int x, y, z, w;
};

inline uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;
constexpr int warpSize = 32;

template <class T>
inline T __ldg(const T* p) {
    return *p;
}
template <class T>
inline T __ldcs(const T* p) {
    return *p;
}
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }  // one rounding
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }

#define CUDASIM_MINMAX(T)                             \
    inline T min(T a, T b) { return b < a ? b : a; } \
    inline T max(T a, T b) { return a < b ? b : a; }
CUDASIM_MINMAX(int)
CUDASIM_MINMAX(unsigned int)
CUDASIM_MINMAX(long long)
CUDASIM_MINMAX(unsigned long long)
CUDASIM_MINMAX(float)
CUDASIM_MINMAX(double)
#undef CUDASIM_MINMAX

// One host thread runs every block: atomics are plain read-modify-writes.
template <class T>
inline T atomicAdd(T* p, T v) {
    T old = *p;
    *p = old + v;
    return old;
}
// and every write is seen at once: a fence has nothing to order, and an L2 load is a load.
inline void __threadfence() {}
template <class T>
inline T __ldcg(const T* p) {
    return *p;
}

namespace cudasim {

enum State { Pending, Ready, AtBlockBarrier, AtWarpBarrier, Done };

struct Fiber {
    ucontext_t ctx;
    void* stack = nullptr;
    int thread = -1;  // the thread it runs now
};

constexpr std::size_t kStack = 512 * 1024;  // CUDA's per-thread stack limit
constexpr std::size_t kGuard = 4096;         // a PROT_NONE page below each stack
constexpr std::size_t kMaxDynamicSmem = 48 * 1024;
constexpr std::size_t kCanary = 16 * 1024;  // checked past the dynamic size after each block
constexpr int kSlot = 16;  // bytes per lane of the shuffle exchange (up to double2)

struct Block {
    int nthreads = 0;
    int next_pending = 0;
    std::vector<State> state;
    std::vector<int> fiber_of;  // fiber index of each started thread
    // A deque: fibers never move once made. (A saved ucontext_t points into itself, at its
    // floating-point state; a vector that reallocated would leave those pointers dangling.)
    std::deque<Fiber> fibers;
    std::vector<int> idle;  // fibers free for a new thread
    std::vector<int> ready;  // released threads, resumed in this order
    std::size_t ready_next = 0;
    std::vector<unsigned char> exchange;  // [parity][thread][kSlot]
    std::vector<long long> shuffles;      // per thread: shuffles it has published a value to
    ucontext_t scheduler;
    int current = -1;  // running fiber
    std::string error;
    void (*body)(void*) = nullptr;
    void* body_arg = nullptr;
};

inline Block* g_block = nullptr;
inline std::vector<unsigned char> g_dynamic_smem;
inline unsigned long long g_block_serial = 0;  // one per block run, for static shared memory

inline void* dynamic_smem() {
    // 16-byte aligned, as CUDA's dynamic shared memory is.
    auto p = reinterpret_cast<std::uintptr_t>(g_dynamic_smem.data());
    return reinterpret_cast<void*>((p + 15) & ~static_cast<std::uintptr_t>(15));
}

// Static __shared__ variables (cudasim.py rewrites `__shared__ T x[n];` into a static and a
// call of this): the first thread of each block to reach the declaration fills it with 0xff.
struct SharedVar {
    unsigned long long serial = 0;
};
inline void shared_poison(SharedVar& v, void* p, std::size_t n) {
    if (v.serial != g_block_serial) {
        v.serial = g_block_serial;
        std::memset(p, 0xff, n);
    }
}

inline void set_thread_index(int t) {
    threadIdx.x = t % blockDim.x;
    threadIdx.y = (t / blockDim.x) % blockDim.y;
    threadIdx.z = t / (blockDim.x * blockDim.y);
}

inline int linear_thread() {
    return static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}

// The fiber's loop: runs pending threads until one waits (it then resumes here) or none is left.
inline void fiber_main(int f) {
    Block& b = *g_block;
    while (b.next_pending < b.nthreads && b.error.empty()) {
        const int t = b.next_pending++;
        b.fibers[f].thread = t;
        b.fiber_of[t] = f;
        b.state[t] = Ready;
        set_thread_index(t);
        b.body(b.body_arg);
        b.state[t] = Done;
    }
    b.fibers[f].thread = -1;
    b.idle.push_back(f);
    // Returning switches to uc_link: the scheduler.
}

inline void fiber_entry(unsigned int hi, unsigned int lo) {
    const std::uintptr_t v = (static_cast<std::uintptr_t>(hi) << 32) | lo;
    fiber_main(static_cast<int>(v));
}

inline void start_fiber(Block& b, int f) {
    Fiber& fb = b.fibers[f];
    getcontext(&fb.ctx);
    fb.ctx.uc_stack.ss_sp = static_cast<char*>(fb.stack) + kGuard;
    fb.ctx.uc_stack.ss_size = kStack;
    fb.ctx.uc_link = &b.scheduler;
    const std::uintptr_t v = static_cast<std::uintptr_t>(f);
    makecontext(&fb.ctx, reinterpret_cast<void (*)()>(fiber_entry), 2, static_cast<unsigned int>(v >> 32),
                static_cast<unsigned int>(v & 0xffffffffu));
}

inline int new_fiber(Block& b) {
    if (!b.idle.empty()) {
        const int f = b.idle.back();
        b.idle.pop_back();
        return f;
    }
    Fiber fb;
    fb.stack = mmap(nullptr, kGuard + kStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                    -1, 0);
    if (fb.stack == MAP_FAILED) {
        b.error = "cudasim: out of memory for fiber stacks";
        return -1;
    }
    mprotect(fb.stack, kGuard, PROT_NONE);  // an overflow faults instead of corrupting memory
    b.fibers.push_back(fb);
    return static_cast<int>(b.fibers.size()) - 1;
}

// Called by a thread: wait at a barrier of kind `s` (the scheduler resumes it when released).
inline void wait(State s) {
    Block& b = *g_block;
    const int t = linear_thread();
    b.state[t] = s;
    Fiber& fb = b.fibers[b.fiber_of[t]];
    // A stopped launch never resumes its waiting threads (the scheduler abandons the fibers).
    swapcontext(&fb.ctx, &b.scheduler);
    set_thread_index(t);
}

inline void fail(const std::string& msg) {
    Block& b = *g_block;
    if (b.error.empty()) b.error = msg;
    const int t = linear_thread();
    b.state[t] = AtBlockBarrier;  // parked; the scheduler sees the error and stops
    swapcontext(&b.fibers[b.fiber_of[t]].ctx, &b.scheduler);
}

// Runs one block to completion; returns false with b.error set on a failure.
inline bool run_block(Block& b) {
    for (;;) {
        if (!b.error.empty()) return false;
        // 1. A released thread goes on.
        if (b.ready_next < b.ready.size()) {
            const int ready = b.ready[b.ready_next++];
            const int f = b.fiber_of[ready];
            b.current = f;
            set_thread_index(ready);
            swapcontext(&b.scheduler, &b.fibers[f].ctx);
            continue;
        }
        // 2. Threads not started yet start, on a new or idle fiber.
        if (b.next_pending < b.nthreads) {
            const int f = new_fiber(b);
            if (f < 0) return false;
            start_fiber(b, f);
            b.current = f;
            swapcontext(&b.scheduler, &b.fibers[f].ctx);
            continue;
        }
        // 3. Everyone has returned or waits: release what can go on.
        b.ready.clear();
        b.ready_next = 0;
        bool all_done = true, released = false;
        for (int t = 0; t < b.nthreads; ++t) all_done = all_done && b.state[t] == Done;
        if (all_done) return true;
        const int warps = (b.nthreads + warpSize - 1) / warpSize;
        for (int w = 0; w < warps; ++w) {
            const int t0 = w * warpSize, t1 = std::min(b.nthreads, t0 + warpSize);
            bool any = false, all = true;
            for (int t = t0; t < t1; ++t) {
                if (b.state[t] == Done) continue;
                any = true;
                all = all && b.state[t] == AtWarpBarrier;
            }
            if (any && all) {
                for (int t = t0; t < t1; ++t) {
                    if (b.state[t] == AtWarpBarrier) {
                        b.state[t] = Ready;
                        b.ready.push_back(t);
                    }
                }
                released = true;
            }
        }
        if (released) continue;
        bool block_all = true;
        for (int t = 0; t < b.nthreads; ++t) {
            block_all = block_all && (b.state[t] == Done || b.state[t] == AtBlockBarrier);
        }
        if (block_all) {
            for (int t = 0; t < b.nthreads; ++t) {
                if (b.state[t] == AtBlockBarrier) {
                    b.state[t] = Ready;
                    b.ready.push_back(t);
                }
            }
            continue;
        }
        b.error = "cudasim: threads of a block wait at barriers that can never all be met (a "
                  "__syncthreads or warp shuffle reached by only some of the threads it waits for)";
        return false;
    }
}

// The exchange slot of lane `lane` of the calling thread's warp, in the half `parity`.
inline unsigned char* slot(int parity, int thread) {
    Block& b = *g_block;
    return &b.exchange[(static_cast<std::size_t>(parity) * b.nthreads + thread) * kSlot];
}

// A warp shuffle: publishes `v`, waits for the warp, reads lane `src` of the same half. Two
// halves alternate, so one wait per shuffle is enough: a lane cannot write a half again before
// every lane has passed the next shuffle's wait, that is, has read this one.
template <class T>
inline T shuffle(T v, int src_lane_in_warp, bool keep_own) {
    static_assert(sizeof(T) <= kSlot && std::is_trivially_copyable_v<T>, "cudasim: shuffle of a large type");
    Block& b = *g_block;
    const int t = linear_thread();
    const long long n = ++b.shuffles[t];
    const int p = static_cast<int>(n & 1);
    std::memcpy(slot(p, t), &v, sizeof(T));
    wait(AtWarpBarrier);
    if (keep_own) return v;
    const int src = t - t % warpSize + src_lane_in_warp;
    // The source took part in this shuffle when it has published at least as many values (it
    // may be one shuffle ahead, writing the other half, but no further: that needs this lane).
    if (src >= b.nthreads || b.shuffles[src] < n) {
        fail("cudasim: a warp shuffle read lane " + std::to_string(src_lane_in_warp) + " of warp " +
             std::to_string(t / warpSize) + ", which has returned or does not exist");
    }
    T out;
    std::memcpy(&out, slot(p, src), sizeof(T));
    return out;
}

struct KernelBase {
    virtual ~KernelBase() = default;
    virtual int params() const = 0;
    virtual std::size_t param_size(int i) const = 0;
    virtual void call(void** args) = 0;
};

template <class... A>
struct Kernel final : KernelBase {
    void (*f)(A...);
    explicit Kernel(void (*fn)(A...)) : f(fn) {}
    int params() const override { return static_cast<int>(sizeof...(A)); }
    std::size_t param_size(int i) const override {
        const std::size_t sizes[] = {sizeof(std::decay_t<A>)..., 0};
        return sizes[i];
    }
    void call(void** args) override { call_with(args, std::index_sequence_for<A...>{}); }
    template <std::size_t... I>
    void call_with(void** args, std::index_sequence<I...>) {
        f(*static_cast<std::decay_t<A>*>(args[I])...);
    }
};

template <class... A>
KernelBase* make(void (*f)(A...)) {
    return new Kernel<A...>(f);
}

struct Call {
    KernelBase* kernel;
    void** args;
};

inline void run_thread(void* p) {
    auto* c = static_cast<Call*>(p);
    c->kernel->call(c->args);
}

// Runs a launch; returns 0, or 1 with the message in err.
inline int launch(KernelBase* k, const unsigned int grid[3], const unsigned int block[3], std::size_t smem,
                  void** args, char* err, std::size_t errlen) {
    gridDim = {grid[0], grid[1], grid[2]};
    blockDim = {block[0], block[1], block[2]};
    const long long nthreads = static_cast<long long>(block[0]) * block[1] * block[2];
    if (nthreads < 1 || nthreads > 1024 || block[0] > 1024 || block[1] > 1024 || block[2] > 64 || grid[0] < 1 ||
        grid[1] < 1 || grid[2] < 1 || grid[0] > 2147483647u || grid[1] > 65535 || grid[2] > 65535) {
        std::snprintf(err, errlen, "cudasim: invalid launch configuration");
        return 1;
    }
    if (smem > kMaxDynamicSmem) {
        std::snprintf(err, errlen, "cudasim: %zu bytes of dynamic shared memory (at most %zu without opt-in)", smem,
                      kMaxDynamicSmem);
        return 1;
    }
    g_dynamic_smem.assign(16 + smem + kCanary, 0xff);
    Call call{k, args};
    // On the heap: a fault in the kernel jumps out of this frame (guarded_launch), which then
    // frees the block through g_block.
    Block& b = *new Block;
    b.nthreads = static_cast<int>(nthreads);
    b.body = run_thread;
    b.body_arg = &call;
    b.exchange.assign(2 * static_cast<std::size_t>(nthreads) * kSlot, 0);
    g_block = &b;
    int rc = 0;
    // Blocks run one after another, in an order that changes from launch to launch (i step + the
    // launch's number, mod the block count, with a step prime to it): a kernel that assumes an
    // order of blocks (which split finishes last, say) fails here as it may on a device.
    static unsigned long long launches = 0;
    const unsigned long long total = static_cast<unsigned long long>(grid[0]) * grid[1] * grid[2];
    const unsigned long long start = launches++;
    unsigned long long step = 1;
    for (unsigned long long p : {7919ULL, 7927ULL, 7933ULL}) {
        if (std::gcd(p, total) == 1) {
            step = p;
            break;
        }
    }
    for (unsigned long long i = 0; i < total && rc == 0; ++i) {
        const unsigned long long lin = (i * step + start) % total;
        const auto x = static_cast<unsigned int>(lin % grid[0]);
        const auto y = static_cast<unsigned int>(lin / grid[0] % grid[1]);
        const auto z = static_cast<unsigned int>(lin / (static_cast<unsigned long long>(grid[0]) * grid[1]));
        blockIdx = {x, y, z};
        ++g_block_serial;
        std::memset(g_dynamic_smem.data(), 0xff, g_dynamic_smem.size());
        b.next_pending = 0;
        b.state.assign(b.nthreads, Pending);
        b.fiber_of.assign(b.nthreads, -1);
        b.shuffles.assign(b.nthreads, 0);
        b.idle.clear();
        b.ready.clear();
        b.ready_next = 0;
        for (int f = 0; f < static_cast<int>(b.fibers.size()); ++f) {
            b.fibers[f].thread = -1;
            b.idle.push_back(f);
        }
        if (!run_block(b)) {
            std::snprintf(err, errlen, "%s (block %u,%u,%u)", b.error.c_str(), x, y, z);
            rc = 1;
        } else {
            const unsigned char* past = static_cast<unsigned char*>(dynamic_smem()) + smem;
            for (std::size_t c = 0; c < kCanary && rc == 0; ++c) {
                if (past[c] != 0xff) {
                    std::snprintf(err, errlen,
                                  "cudasim: a write %zu bytes past the %zu bytes of dynamic shared memory "
                                  "(block %u,%u,%u)",
                                  c, smem, x, y, z);
                    rc = 1;
                }
            }
        }
    }
    for (Fiber& fb : b.fibers) munmap(fb.stack, kGuard + kStack);
    g_block = nullptr;
    delete &b;
    return rc;
}

// Guard pages after the argument arrays (cudasim.py): a fault on one ends the launch.
constexpr std::size_t kGuardPage = 4096;
inline sigjmp_buf g_fault_env;
inline const unsigned long long* g_guards = nullptr;  // first byte of each array's guard page
inline std::size_t g_nguards = 0;
inline volatile std::uintptr_t g_fault_addr = 0;
inline volatile long g_fault_guard = -1;

inline void on_fault(int sig, siginfo_t* si, void*) {
    const auto a = reinterpret_cast<std::uintptr_t>(si->si_addr);
    for (std::size_t i = 0; i < g_nguards; ++i) {
        if (a >= g_guards[i] && a < g_guards[i] + kGuardPage) {
            g_fault_addr = a;
            g_fault_guard = static_cast<long>(i);
            siglongjmp(g_fault_env, 1);
        }
    }
    signal(sig, SIG_DFL);  // not ours: the access repeats and ends the process, as it would anyway
}

// launch() with SIGSEGV/SIGBUS caught on the guard pages `guards` (one per entry of
// `guard_args`, the argument it ends).
inline int guarded_launch(KernelBase* k, const unsigned int grid[3], const unsigned int block[3], std::size_t smem,
                          void** args, const unsigned long long* guards, const int* guard_args, std::size_t nguards,
                          char* err, std::size_t errlen) {
    static char altstack[1 << 16];  // the handler may run on a fiber's stack near its guard
    stack_t ss{}, old_ss{};
    ss.ss_sp = altstack;
    ss.ss_size = sizeof altstack;
    sigaltstack(&ss, &old_ss);
    struct sigaction sa{}, old_segv{}, old_bus{};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old_segv);
    sigaction(SIGBUS, &sa, &old_bus);
    g_guards = guards;
    g_nguards = nguards;
    int rc;
    if (sigsetjmp(g_fault_env, 1) == 0) {
        rc = launch(k, grid, block, smem, args, err, errlen);
    } else {
        const long i = g_fault_guard;
        if (Block* b = g_block) {
            for (Fiber& fb : b->fibers) munmap(fb.stack, kGuard + kStack);
            g_block = nullptr;
            delete b;
        }
        std::snprintf(err, errlen,
                      "cudasim: an access past the end of argument %d (block %u,%u,%u, thread %u,%u,%u)",
                      guard_args[i], blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y,
                      threadIdx.z);
        rc = 1;
    }
    g_guards = nullptr;
    g_nguards = 0;
    sigaction(SIGSEGV, &old_segv, nullptr);
    sigaction(SIGBUS, &old_bus, nullptr);
    sigaltstack(&old_ss, nullptr);
    return rc;
}

}  // namespace cudasim

inline void __syncthreads() { cudasim::wait(cudasim::AtBlockBarrier); }

namespace cudasim {
inline void full_mask(unsigned int mask) {
    if (mask != 0xffffffffu) fail("cudasim: a shuffle over part of a warp (mask != 0xffffffff) is not modelled");
}
}  // namespace cudasim

// __syncwarp: the warp's lanes wait for each other (memory is shared at once here anyway).
inline void __syncwarp(unsigned int mask = 0xffffffffu) {
    cudasim::full_mask(mask);
    cudasim::wait(cudasim::AtWarpBarrier);
}
template <class T>
inline T __shfl_sync(unsigned int mask, T v, int src, int width = warpSize) {
    cudasim::full_mask(mask);
    const int lane = cudasim::linear_thread() % warpSize;
    const int base = lane - lane % width;
    return cudasim::shuffle(v, base + ((src % width) + width) % width, false);
}
template <class T>
inline T __shfl_down_sync(unsigned int mask, T v, unsigned int delta, int width = warpSize) {
    cudasim::full_mask(mask);
    const int lane = cudasim::linear_thread() % warpSize;
    const int src = lane + static_cast<int>(delta);
    const bool own = src >= lane - lane % width + width;  // past the segment: the caller's value
    return cudasim::shuffle(v, own ? lane : src, own);
}
template <class T>
inline T __shfl_up_sync(unsigned int mask, T v, unsigned int delta, int width = warpSize) {
    cudasim::full_mask(mask);
    const int lane = cudasim::linear_thread() % warpSize;
    const int src = lane - static_cast<int>(delta);
    const bool own = src < lane - lane % width;
    return cudasim::shuffle(v, own ? lane : src, own);
}
template <class T>
inline T __shfl_xor_sync(unsigned int mask, T v, int lane_mask, int width = warpSize) {
    cudasim::full_mask(mask);
    const int lane = cudasim::linear_thread() % warpSize;
    const int src = lane ^ lane_mask;
    const bool own = src >= lane - lane % width + width;
    return cudasim::shuffle(v, own ? lane : src, own);
}

// prmt.b32 in its default mode: byte i of the result is byte (s >> 4i) & 7 of y:x (x the low
// four bytes).
inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s) {
    const unsigned long long v = (static_cast<unsigned long long>(y) << 32) | x;
    unsigned int out = 0;
    for (int i = 0; i < 4; ++i) out |= static_cast<unsigned int>((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return out;
}

// Float16 and the tensor-core instruction mma.m16n8k16 (the kernels reach them through inline
// PTX on a GPU; with CUDASIM defined, through these models). Half values travel as their bits,
// two to a 32-bit word (element 0 in the low half, as in PTX's .f16x2).
namespace cudasim {
inline float half_bits_to_float(unsigned int h) {
    _Float16 v;
    const auto b = static_cast<std::uint16_t>(h);
    std::memcpy(&v, &b, 2);
    return static_cast<float>(v);
}
inline unsigned int float_to_half_bits(float f) {  // round to nearest even, as cvt.rn.f16.f32
    const auto v = static_cast<_Float16>(f);
    std::uint16_t b;
    std::memcpy(&b, &v, 2);
    return b;
}
// An .rn.f16x2 operation: op on both halves, each result rounded once to float16 (a float16 sum,
// difference or product is exact in float32, so rounding the float32 result gives its bits).
template <class Op>
inline unsigned int f16x2(unsigned int a, unsigned int b, Op op) {
    const unsigned int lo = float_to_half_bits(op(half_bits_to_float(a & 0xffffu), half_bits_to_float(b & 0xffffu)));
    const unsigned int hi = float_to_half_bits(op(half_bits_to_float(a >> 16), half_bits_to_float(b >> 16)));
    return lo | (hi << 16);
}
inline unsigned int hsub2(unsigned int a, unsigned int b) {  // sub.rn.f16x2
    return f16x2(a, b, [](float u, float v) { return u - v; });
}
inline unsigned int hmul2(unsigned int a, unsigned int b) {  // mul.rn.f16x2
    return f16x2(a, b, [](float u, float v) { return u * v; });
}
// prefetch.global.L2: no effect but a read of the byte, so that a prefetch outside the arrays
// faults here as a load would (PTX leaves the behaviour open; the kernels never rely on it).
inline void prefetch(const void* p) {
    (void)*static_cast<const volatile unsigned char*>(p);
}
// fma.rn.f16x2, d = a b + c rounded once: the product of two float16s is exact in double, and so
// is its sum with a float16 unless their exponents lie more than 53 bits apart (never in the
// kernels' uses, which are exact); the double goes to float16 in one rounding.
inline unsigned int hfma2(unsigned int a, unsigned int b, unsigned int c) {
    unsigned int out = 0;
    for (int h = 0; h < 2; ++h) {
        const auto part = [h](unsigned int v) {
            return static_cast<double>(half_bits_to_float((v >> (16 * h)) & 0xffffu));
        };
        const auto r = static_cast<_Float16>(part(a) * part(b) + part(c));
        std::uint16_t bits;
        std::memcpy(&bits, &r, 2);
        out |= static_cast<unsigned int>(bits) << (16 * h);
    }
    return out;
}
// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32, D = A B + C in place (PTX ISA, "Matrix
// Fragments for mma.m16n8k16 with floating point type"); lane = 4 groupID + threadID_in_group:
//   a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1], a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9]
//   b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]
//   d[0], d[1] = D[g][2t, 2t+1], d[2], d[3] = D[g+8][2t, 2t+1]
// A warp collective (every lane of the warp must take part, as on a GPU). The 16 products of
// each output (exact in double) are added to C in double and rounded once to float32: the
// hardware's own order and rounding of this sum are not specified; they agree with this
// wherever the sum is exact in float32, as on integer data.
inline void mma16816(float (&d)[4], const unsigned int (&a)[4], unsigned int b0, unsigned int b1) {
    const int lane = linear_thread() % warpSize;
    const int g = lane >> 2, t = lane & 3;
    const uint4 mine{a[0], a[1], a[2], a[3]};
    double arow[2][16], bcol[2][16];
    for (int q = 0; q < 4; ++q) {  // the four lanes holding rows g and g + 8
        const uint4 v = __shfl_sync(0xffffffffu, mine, 4 * g + q);
        for (int e = 0; e < 2; ++e) {
            arow[0][2 * q + e] = half_bits_to_float(v.x >> (16 * e));
            arow[1][2 * q + e] = half_bits_to_float(v.y >> (16 * e));
            arow[0][2 * q + 8 + e] = half_bits_to_float(v.z >> (16 * e));
            arow[1][2 * q + 8 + e] = half_bits_to_float(v.w >> (16 * e));
        }
    }
    const uint2 bmine{b0, b1};
    for (int c = 0; c < 2; ++c) {  // columns 2t and 2t + 1, each held by four lanes
        for (int q = 0; q < 4; ++q) {
            const uint2 v = __shfl_sync(0xffffffffu, bmine, 4 * (2 * t + c) + q);
            for (int e = 0; e < 2; ++e) {
                bcol[c][2 * q + e] = half_bits_to_float(v.x >> (16 * e));
                bcol[c][2 * q + 8 + e] = half_bits_to_float(v.y >> (16 * e));
            }
        }
    }
    for (int i = 0; i < 4; ++i) {
        double s = d[i];
        for (int k = 0; k < 16; ++k) s += arow[i >> 1][k] * bcol[i & 1][k];
        d[i] = static_cast<float>(s);
    }
}
}  // namespace cudasim
