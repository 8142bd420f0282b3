//! The library-owned rayon thread pool.
//!
//! maleki_rs never configures rayon's global pool, which other extensions in the same
//! process (polars, tokenizers, ...) share. Its size comes from [`set_num_threads`], else the
//! environment variable `MALEKI_RS_NUM_THREADS`, else the number of available cores.
//! Cores themselves just use rayon's parallel iterators; callers run them inside
//! [`install`] (or [`run_monitored`]) so those iterators land on this pool.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rayon::{ThreadPool, ThreadPoolBuilder};

use crate::progress::Monitor;
use crate::{Error, Result};

/// Environment variable read when no explicit thread count was set.
pub const ENV_NUM_THREADS: &str = "MALEKI_RS_NUM_THREADS";

static REQUESTED: AtomicUsize = AtomicUsize::new(0); // 0: not set explicitly
/// Bumped in a forked child: pools built under an older generation have no threads there.
static FORK_GENERATION: AtomicU64 = AtomicU64::new(0);
/// The default pool, with the fork generation it was built in.
static POOL: Mutex<Option<(u64, Arc<ThreadPool>)>> = Mutex::new(None);
/// Pools of an explicit size (per-call `threads=` arguments), keyed by size.
type SizedPools = HashMap<usize, Arc<ThreadPool>>;
/// The sized pools, with the fork generation they were built in.
static SIZED: Mutex<Option<(u64, SizedPools)>> = Mutex::new(None);

/// Sets the number of worker threads (>= 1). The pool is rebuilt at its next use; calls
/// already running keep their old pool.
pub fn set_num_threads(n: usize) -> Result<()> {
    if n == 0 {
        return Err(Error::invalid(
            "n",
            "the number of threads must be at least 1, got 0",
        ));
    }
    if n > 4096 {
        return Err(Error::invalid(
            "n",
            format!("at most 4096 threads, got {n}"),
        ));
    }
    REQUESTED.store(n, Ordering::SeqCst);
    let mut guard = POOL.lock().unwrap_or_else(|e| e.into_inner());
    if guard
        .as_ref()
        .is_some_and(|(_, p)| p.current_num_threads() != n)
    {
        *guard = None;
    }
    Ok(())
}

/// The number of threads the pool has (or will have when first used).
pub fn num_threads() -> usize {
    match REQUESTED.load(Ordering::SeqCst) {
        0 => threads_from_env().unwrap_or_else(available_cores),
        n => n,
    }
}

fn available_cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

fn threads_from_env() -> Option<usize> {
    let v = std::env::var(ENV_NUM_THREADS).ok()?;
    v.trim()
        .parse::<usize>()
        .ok()
        .filter(|&n| (1..=4096).contains(&n))
}

fn build(n: usize, name: &'static str) -> Result<Arc<ThreadPool>> {
    ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(move |i| format!("{name}-{i}"))
        .build()
        .map(Arc::new)
        .map_err(|e| Error::Numerical(format!("could not start {n} worker threads: {e}")))
}

/// Drops a pool whose threads may not exist (built before a fork) without touching them.
fn leak_if_stale<T>(slot: &mut Option<(u64, T)>, generation: u64) {
    if slot.as_ref().is_some_and(|(g, _)| *g != generation) {
        // The workers of the parent do not exist in a forked child: dropping the pool would
        // signal threads that are gone, so leak it.
        if let Some(old) = slot.take() {
            std::mem::forget(old);
        }
    }
}

/// The pool, built on first use with [`num_threads`] workers (on a thread inside
/// [`with_pool`], that call's pool).
pub fn pool() -> Arc<ThreadPool> {
    if let Some(p) = STAND_IN.with(|s| s.borrow().clone()) {
        return p;
    }
    let generation = FORK_GENERATION.load(Ordering::SeqCst);
    let mut guard = POOL.lock().unwrap_or_else(|e| e.into_inner());
    leak_if_stale(&mut guard, generation);
    if let Some((_, p)) = guard.as_ref() {
        return Arc::clone(p);
    }
    let p = build(num_threads(), "maleki-rs")
        .expect("building the maleki_rs thread pool failed (out of threads?)");
    *guard = Some((generation, Arc::clone(&p)));
    p
}

/// A pool of exactly `threads` workers, for calls that take an explicit `threads=` argument;
/// kept for the next call of that size (the last few sizes), owned by the library like [`pool`].
pub fn sized_pool(threads: usize) -> Result<Arc<ThreadPool>> {
    if threads == 0 || threads > 4096 {
        return Err(Error::invalid(
            "threads",
            format!("must be in 1..=4096, got {threads}"),
        ));
    }
    let generation = FORK_GENERATION.load(Ordering::SeqCst);
    let mut guard = SIZED.lock().unwrap_or_else(|e| e.into_inner());
    leak_if_stale(&mut guard, generation);
    let (_, map) = guard.get_or_insert_with(|| (generation, HashMap::new()));
    if let Some(p) = map.get(&threads) {
        return Ok(Arc::clone(p));
    }
    if map.len() >= SIZED_KEPT {
        // Keep a few sizes only: a pool's threads live as long as it is kept (a call still
        // running on a dropped pool holds its own reference).
        if let Some(&old) = map.keys().next() {
            map.remove(&old);
        }
    }
    let p = build(threads, "maleki-rs")?;
    map.insert(threads, Arc::clone(&p));
    Ok(p)
}

/// How many explicitly sized pools are kept between calls.
const SIZED_KEPT: usize = 4;

/// Marks every pool as unusable; to be called in the child after `fork()`. Async-signal
/// safe: it only bumps an atomic counter.
pub fn mark_forked() {
    FORK_GENERATION.fetch_add(1, Ordering::SeqCst);
}

thread_local! {
    /// The pool that stands in for the library pool on this thread ([`with_pool`]).
    static STAND_IN: RefCell<Option<Arc<ThreadPool>>> = const { RefCell::new(None) };
}

/// Runs `f` on the calling thread with `p` standing in for the library pool: [`pool`] and
/// [`install`] called from this thread (not from `p`'s workers, which use their own pool
/// anyway) use `p` until `f` returns or unwinds.
///
/// For a call with its own thread count (`threads=`) into a core that hands work to the pool
/// itself, such as msgemm's: a GEMV there runs on its caller (and, on 2 threads, the helper
/// thread of [`join_here`]) when the pool has 1 or 2 threads, which [`ThreadPool::install`]
/// would rule out by moving the whole call onto a worker (each wake-up of a sleeping worker
/// costs tens of microseconds on a VM).
pub fn with_pool<R>(p: Arc<ThreadPool>, f: impl FnOnce() -> R) -> R {
    /// Puts the previous stand-in back, also when `f` unwinds.
    struct Restore(Option<Arc<ThreadPool>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            STAND_IN.with(|s| *s.borrow_mut() = previous);
        }
    }
    let _restore = Restore(STAND_IN.with(|s| s.borrow_mut().replace(p)));
    f()
}

/// Runs `f` on the library pool; rayon iterators inside use that pool.
pub fn install<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    pool().install(f)
}

/// Whether the calling thread is a worker of some rayon pool (then rayon iterators and joins
/// stay on that pool; off every pool they would start rayon's global one).
pub fn on_a_pool() -> bool {
    rayon::current_thread_index().is_some()
}

/// Runs `a` on the calling thread while `b` runs on the helper thread, or on the calling
/// thread after `a` when the helper has not started it by then; returns both results.
///
/// For short jobs (a GEMV: about 100 us) called from outside the pool. [`install`] puts the
/// caller to sleep and a worker runs the job (then [`rayon::join`] wakes a second one), and on a
/// VM each wake-up of a sleeping thread costs tens of microseconds. Here the caller works
/// instead, and waits for `b` by spinning (up to [`SPIN_WAIT`], yielding after
/// [`SPIN_PURE`], then parking until the helper unparks it), so the helper finishing `b` sets a
/// flag rather than waking it. Measured on 2 vCPUs, two 50 us halves: 51 us (median) back to
/// back and ~100 us after 200 us idle, against 57-62 us and ~180 us with `install` + `join`.
///
/// `b` is offered to the helper thread ([`Helper`], one per process, not a rayon worker), not
/// handed over: whichever thread claims it first runs it. When the helper is busy or slow to
/// wake (another process on the other core, the helper descheduled), the caller runs `b`
/// itself after `a` instead of waiting for it, so the call never takes much longer than `a`
/// and `b` back to back. (With 64 offers already waiting for the helper, the caller runs
/// both without offering.)
///
/// To be called off every pool (`!on_a_pool()`; on a pool, rayon's `join` splits the work).
/// Neither closure may use rayon (on the calling thread, or the helper, its iterators would
/// start rayon's global pool). A panic of either propagates once no thread
/// runs `b` any more (a panic of `a` before the helper claimed `b`: `b` does not run).
pub fn join_here<RA, RB, A, B>(a: A, b: B) -> (RA, RB)
where
    A: FnOnce() -> RA,
    B: FnOnce() -> RB + Send,
    RB: Send,
{
    debug_assert!(!on_a_pool(), "join_here is for callers off the pools");
    let helper = match helper() {
        Some(h) if h.queued.load(Ordering::Relaxed) < MAX_OFFERS_QUEUED => h,
        // No helper (the system would not start a thread), or it has not even started the
        // last offers (it is busy with a long `b`): do not queue more, run both here.
        _ => {
            let ra = a();
            let rb = b();
            return (ra, rb);
        }
    };
    // `b` and its result (or panic) live on this stack frame; the helper reaches them
    // through a type-erased pointer, only after winning the claim, and this frame does not
    // end before it has finished with them (`Offer::settle`).
    type Outcome<RB> = Option<std::thread::Result<RB>>;
    let mut slot: (Option<B>, Outcome<RB>) = (Some(b), None);
    /// Runs the `b` in `slot` and stores its outcome; `p` is `&mut slot`.
    unsafe fn run<B: FnOnce() -> RB, RB>(p: *mut ()) {
        // SAFETY: the caller of `run` won the claim, so it alone touches the slot now.
        let slot = unsafe { &mut *(p as *mut (Option<B>, Option<std::thread::Result<RB>>)) };
        let b = slot.0.take().expect("claimed once");
        slot.1 = Some(std::panic::catch_unwind(std::panic::AssertUnwindSafe(b)));
    }
    let offer = Arc::new(Offer {
        claim: AtomicU8::new(OPEN),
        done: AtomicBool::new(false),
        caller: std::thread::current(),
        slot: &mut slot as *mut _ as *mut (),
        run: run::<B, RB>,
    });
    helper.post(Arc::clone(&offer));
    let ra = {
        // Settles the offer if `a` panics: `b` then never runs, or has ended.
        let guard = Settle(&offer);
        let ra = a();
        std::mem::forget(guard);
        ra
    };
    if offer.settle() {
        // Nobody had claimed `b`: run it here.
        // SAFETY: the claim was won by this thread.
        unsafe { (offer.run)(offer.slot) };
    }
    match slot.1.take().expect("b ran") {
        Ok(rb) => (ra, rb),
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// The helper thread, with the fork generation it was started in.
static HELPER: Mutex<Option<(u64, Arc<Helper>)>> = Mutex::new(None);

/// Environment variable: how long the helper thread waits for the next [`join_here`] offer,
/// spinning, before it sleeps (microseconds, `0..=100000`).
pub const ENV_SPIN_US: &str = "MALEKI_RS_SPIN_US";

/// The default of [`ENV_SPIN_US`].
pub const HELPER_SPIN_US: u64 = 1000;

/// The thread that runs the `b` halves of [`join_here`], started at the first call.
///
/// Why not the pool's workers: a rayon worker that finds no work yields a few dozen times and
/// then sleeps, some 30-50 us after its last job; on a VM waking it costs tens of
/// microseconds, and its vCPU, halted meanwhile, comes back slowly. A caller with work between
/// its calls (Python code between two layers' GEMVs) found the worker asleep: int4 4096 x 4096
/// GEMV from Python on 2 vCPUs (Zen 4), median with 0 / 30 / 100 / 300 us of the caller's work
/// between calls 74 / 93 / 127 / 177 us, where ONNX Runtime, whose threads spin, took 107 /
/// 127 / 148 / 173 us. So this thread waits for the next offer [`HELPER_SPIN_US`] (or
/// [`ENV_SPIN_US`]) before it parks: spinning, and after [`SPIN_PURE`] yielding its core at
/// each look at the clock, to any other thread that wants it. The rayon workers used to do
/// this job, two of them yielding on 2 vCPUs: a numpy 256^3 matmul (two OpenBLAS threads) right
/// after each GEMV took 262-268 us (median) then, 192-196 us now, 179-182 us with no spin.
struct Helper {
    queue: Mutex<std::collections::VecDeque<Arc<Offer>>>,
    /// `queue.len()`, read without the lock: by the spinning thread, and by [`join_here`],
    /// which offers no more past [`MAX_OFFERS_QUEUED`]. (Offers not yet taken, whether their
    /// callers have claimed them meanwhile or not; per helper, so that a forked child does
    /// not count its parent's.)
    queued: AtomicUsize,
    /// Set by the thread before it parks (then it checks `queued` once more); an offer posted
    /// meanwhile unparks it.
    parked: AtomicBool,
    /// Set by the thread itself when it starts, before it can ever set `parked`.
    thread: std::sync::OnceLock<std::thread::Thread>,
}

impl Helper {
    fn post(&self, offer: Arc<Offer>) {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(offer);
        // SeqCst here and in `run`: either the thread sees this offer before it parks, or
        // this sees `parked` and unparks it (a pending unpark makes the next `park` return).
        self.queued.fetch_add(1, Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst) {
            // Always set by then: the thread sets it before it ever sets `parked`.
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
    }

    fn pop(&self) -> Option<Arc<Offer>> {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let o = q.pop_front();
        if o.is_some() {
            self.queued.fetch_sub(1, Ordering::SeqCst);
        }
        o
    }

    /// The thread's loop: takes offers, spinning up to `spin` between them, then parking.
    fn run(me: Arc<Helper>, spin: Duration) {
        let _ = me.thread.set(std::thread::current());
        let mut idle_since = Instant::now();
        let mut spins = 0u32;
        loop {
            if me.queued.load(Ordering::SeqCst) > 0 {
                if let Some(offer) = me.pop() {
                    offer.take_for_helper();
                    idle_since = Instant::now();
                    continue;
                }
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(64) {
                std::hint::spin_loop();
                continue;
            }
            let idle = idle_since.elapsed();
            if idle < spin {
                if idle > SPIN_PURE {
                    // Let a thread that wants this core run (another pool's, the caller's).
                    std::thread::yield_now();
                }
                continue;
            }
            me.parked.store(true, Ordering::SeqCst);
            if me.queued.load(Ordering::SeqCst) == 0 {
                std::thread::park();
            }
            me.parked.store(false, Ordering::SeqCst);
            idle_since = Instant::now();
        }
    }
}

/// The helper thread of this process (after a fork, a new one: the parent's does not exist
/// in the child), or None when the system would not start it.
fn helper() -> Option<Arc<Helper>> {
    let generation = FORK_GENERATION.load(Ordering::SeqCst);
    let mut guard = HELPER.lock().unwrap_or_else(|e| e.into_inner());
    leak_if_stale(&mut guard, generation);
    if let Some((_, h)) = guard.as_ref() {
        return Some(Arc::clone(h));
    }
    let spin = std::env::var(ENV_SPIN_US)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&us| us <= 100_000)
        .unwrap_or(HELPER_SPIN_US);
    let h = Arc::new(Helper {
        queue: Mutex::new(std::collections::VecDeque::new()),
        queued: AtomicUsize::new(0),
        parked: AtomicBool::new(false),
        thread: std::sync::OnceLock::new(),
    });
    let theirs = Arc::clone(&h);
    std::thread::Builder::new()
        .name("maleki-rs-helper".into())
        .spawn(move || Helper::run(theirs, Duration::from_micros(spin)))
        .ok()?;
    *guard = Some((generation, Arc::clone(&h)));
    Some(h)
}

/// Past this many, [`join_here`] queues no more: each holds a small allocation until the
/// helper gets to it, which a helper busy with a long `b` (another Python thread's call) may not
/// do for a long time while calls keep coming.
const MAX_OFFERS_QUEUED: usize = 64;

const OPEN: u8 = 0;
const WORKER: u8 = 1;
const CALLER: u8 = 2;

/// The offer of [`join_here`]'s `b` to the helper thread.
struct Offer {
    /// `OPEN`, then `WORKER` or `CALLER`: who runs `b`.
    claim: AtomicU8,
    /// Set by the helper when `b` has run (its outcome is in the slot).
    done: AtomicBool,
    caller: std::thread::Thread,
    slot: *mut (),
    run: unsafe fn(*mut ()),
}

// SAFETY: `slot` is dereferenced only by the thread that wins `claim`, and the caller's frame
// that it points into outlives the helper's use of it (`Offer::settle`).
unsafe impl Send for Offer {}
unsafe impl Sync for Offer {}

impl Offer {
    /// Runs `b` on this (the helper's) thread if the caller has not claimed it.
    fn take_for_helper(&self) {
        if self
            .claim
            .compare_exchange(OPEN, WORKER, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            // SAFETY: the claim was won; the caller waits for `done` before its frame ends.
            unsafe { (self.run)(self.slot) };
            self.done.store(true, Ordering::Release);
            self.caller.unpark();
        }
    }

    /// Claims `b` for the caller (true: it must run it now), or waits until the helper, which
    /// claimed it, has run it: spinning, then yielding, then parking.
    fn settle(&self) -> bool {
        if self
            .claim
            .compare_exchange(OPEN, CALLER, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return true;
        }
        let start = Instant::now();
        let mut spins = 0u32;
        while !self.done.load(Ordering::Acquire) {
            // The clock is read every 64 spins (a `clock_gettime` per spin was ~2% of a
            // 256 x 4096 GEMV's samples, on a core that may share its pipeline with the helper).
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(64) {
                std::hint::spin_loop();
                continue;
            }
            let waited = start.elapsed();
            if waited > SPIN_WAIT {
                std::thread::park_timeout(Duration::from_millis(1));
            } else if waited > SPIN_PURE {
                // Let a thread that shares this core (the helper, if the OS put it here) run.
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        false
    }
}

/// Settles an [`Offer`] when dropped (an unwinding `a`): the helper must be done with the
/// caller's frame before it goes.
struct Settle<'a>(&'a Offer);

impl Drop for Settle<'_> {
    fn drop(&mut self) {
        self.0.settle();
    }
}

/// How long [`join_here`] spins for the helper's half before sleeping.
pub const SPIN_WAIT: Duration = Duration::from_millis(2);
/// How long of that it spins without yielding its core.
pub const SPIN_PURE: Duration = Duration::from_micros(50);

/// Runs `job` on the library pool while the calling thread watches it.
///
/// Every `interval` (and once at the end) the calling thread calls `poll(done, total)` with
/// the counts the job reported to its [`Monitor`]. When `poll` returns `Break` (the user's
/// callback raised, or Ctrl-C arrived) the monitor is told to stop and the job is expected to
/// return `Err(Cancelled)` at its next checkpoint. The calling thread is never a pool worker,
/// so it is free to take the Python interpreter in `poll`.
pub fn run_monitored<T: Send>(
    job: impl FnOnce(&Monitor) -> T + Send,
    mut poll: impl FnMut(u64, u64) -> ControlFlow<()>,
    interval: Duration,
) -> T {
    let monitor = Monitor::new();
    let slot: Mutex<Option<T>> = Mutex::new(None);
    let finished = Condvar::new();
    let p = pool();
    p.in_place_scope(|s| {
        s.spawn(|_| {
            let out = job(&monitor);
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(out);
            finished.notify_all();
        });
        let mut stopped = false;
        let mut guard = slot.lock().unwrap_or_else(|e| e.into_inner());
        while guard.is_none() {
            let (g, _) = finished
                .wait_timeout(guard, interval)
                .unwrap_or_else(|e| e.into_inner());
            guard = g;
            if guard.is_none() && !stopped {
                drop(guard);
                let (d, t) = monitor.snapshot();
                if poll(d, t).is_break() {
                    monitor.request_stop();
                    stopped = true;
                }
                guard = slot.lock().unwrap_or_else(|e| e.into_inner());
            }
        }
    });
    let (d, t) = monitor.snapshot();
    let _ = poll(d, t);
    slot.into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .expect("the monitored job always stores its result")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::Progress;
    use rayon::prelude::*;

    /// Held by the tests that rely on the process-wide helper thread or library pool staying
    /// as they are (tests run in parallel: the fork test replaces both, one test keeps the
    /// helper busy).
    static SHARED_STATE: Mutex<()> = Mutex::new(());

    #[test]
    fn with_pool_stands_in_on_this_thread_only() {
        let _one = SHARED_STATE.lock().unwrap_or_else(|e| e.into_inner());
        let p = sized_pool(3).unwrap();
        let q = sized_pool(5).unwrap();
        let library = pool();
        with_pool(Arc::clone(&p), || {
            assert!(Arc::ptr_eq(&pool(), &p));
            assert_eq!(install(rayon::current_num_threads), 3);
            // Nested: the inner pool, then the outer one again.
            with_pool(Arc::clone(&q), || assert!(Arc::ptr_eq(&pool(), &q)));
            assert!(Arc::ptr_eq(&pool(), &p));
            // Another thread keeps the library pool.
            let other = std::thread::spawn(pool).join().unwrap();
            assert!(Arc::ptr_eq(&other, &library));
        });
        assert!(Arc::ptr_eq(&pool(), &library));
        // Put back when `f` unwinds too.
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            with_pool(Arc::clone(&q), || panic!("boom"))
        }));
        assert!(unwound.is_err());
        assert!(Arc::ptr_eq(&pool(), &library));
    }

    #[test]
    fn join_here_runs_a_here_and_b_on_the_helper() {
        let _one = SHARED_STATE.lock().unwrap_or_else(|e| e.into_inner());
        let me = std::thread::current().id();
        // `a` long enough for the helper to claim `b`.
        let (a, b) = join_here(
            || {
                std::thread::sleep(Duration::from_millis(50));
                (std::thread::current().id(), on_a_pool())
            },
            || {
                let name = std::thread::current().name().unwrap_or("").to_string();
                (name, on_a_pool())
            },
        );
        assert_eq!(a, (me, false));
        assert_eq!((b.0.as_str(), b.1), ("maleki-rs-helper", false));
        // Again after the helper has parked (its spin is at most 100 ms): unparked by the
        // offer, it still takes `b`.
        std::thread::sleep(Duration::from_millis(150));
        let (_, b) = join_here(
            || std::thread::sleep(Duration::from_millis(50)),
            || std::thread::current().name().unwrap_or("").to_string(),
        );
        assert_eq!(b, "maleki-rs-helper");
        // A slow `b` (past the spin, so the caller parks) is still waited for.
        let started = AtomicBool::new(false);
        let (_, slow) = join_here(
            || {
                while !started.load(Ordering::SeqCst) {
                    std::hint::spin_loop();
                }
            },
            || {
                started.store(true, Ordering::SeqCst);
                std::thread::sleep(SPIN_WAIT * 3);
                7
            },
        );
        assert_eq!(slow, 7);
    }

    #[test]
    fn join_here_runs_b_on_the_caller_when_the_helper_is_busy() {
        let _one = SHARED_STATE.lock().unwrap_or_else(|e| e.into_inner());
        // The helper blocked in another caller's `b`: this caller claims its `b` after `a`
        // and runs it.
        let release = Arc::new(AtomicBool::new(false));
        let started = Arc::new(AtomicBool::new(false));
        let blocker = {
            let (release, started) = (Arc::clone(&release), Arc::clone(&started));
            std::thread::spawn(move || {
                join_here(
                    || {
                        while !started.load(Ordering::SeqCst) {
                            std::thread::sleep(Duration::from_micros(50));
                        }
                    },
                    || {
                        started.store(true, Ordering::SeqCst);
                        while !release.load(Ordering::SeqCst) {
                            std::thread::sleep(Duration::from_micros(200));
                        }
                    },
                )
            })
        };
        while !started.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_micros(100));
        }
        let me = std::thread::current().id();
        let t = Instant::now();
        let (a, b) = join_here(|| 1, || (std::thread::current().id(), 2));
        let took = t.elapsed();
        // Many more calls while the helper stays busy: the queue of offers stays bounded.
        for i in 0..200u32 {
            assert_eq!(join_here(|| i, || i + 1), (i, i + 1));
        }
        let queued = helper().unwrap().queued.load(Ordering::SeqCst);
        release.store(true, Ordering::SeqCst);
        blocker.join().unwrap();
        assert_eq!((a, b), (1, (me, 2)));
        assert!(took < Duration::from_secs(1), "{took:?}");
        assert!(queued <= MAX_OFFERS_QUEUED + 8, "{queued} offers queued");
        // The offers claimed by their callers meanwhile are dropped by the helper unrun, and
        // it takes new ones again.
        let (_, b) = join_here(
            || std::thread::sleep(Duration::from_millis(50)),
            || std::thread::current().name().unwrap_or("").to_string(),
        );
        assert_eq!(b, "maleki-rs-helper");
    }

    #[test]
    fn join_here_propagates_panics_once_b_is_settled() {
        // The first `a` waits for the helper to start `b`.
        let _one = SHARED_STATE.lock().unwrap_or_else(|e| e.into_inner());
        // `a` panics while the helper runs `b`: the panic leaves after `b` has ended.
        let (started, finished) = (AtomicBool::new(false), AtomicBool::new(false));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            join_here(
                || {
                    while !started.load(Ordering::SeqCst) {
                        std::hint::spin_loop();
                    }
                    panic!("in a")
                },
                || {
                    started.store(true, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(5));
                    finished.store(true, Ordering::SeqCst);
                },
            )
        }));
        assert!(r.is_err());
        assert!(
            finished.load(Ordering::SeqCst),
            "b ran to its end before the panic left"
        );
        // A panic of `b` propagates, wherever `b` ran.
        let r = std::panic::catch_unwind(|| join_here(|| 1, || -> u8 { panic!("in b") }));
        assert!(r.is_err());
        let r = std::panic::catch_unwind(|| {
            join_here(
                || std::thread::sleep(Duration::from_millis(20)),
                || -> u8 { panic!("in b") },
            )
        });
        assert!(r.is_err());
        // An immediate panic of `a`: `b` runs or not, and the frame is left safely.
        let r = std::panic::catch_unwind(|| join_here(|| -> u8 { panic!("in a") }, || 2));
        assert!(r.is_err());
    }

    #[test]
    fn install_runs_on_the_library_pool() {
        let names: Vec<String> = install(|| {
            (0..64)
                .into_par_iter()
                .map(|_| std::thread::current().name().unwrap_or("").to_string())
                .collect()
        });
        assert!(
            names.iter().all(|n| n.starts_with("maleki-rs-")),
            "{names:?}"
        );
    }

    #[test]
    fn zero_threads_is_rejected() {
        assert!(set_num_threads(0).is_err());
        assert!(sized_pool(0).is_err());
    }

    #[test]
    fn sized_pools_are_cached_and_rebuilt_after_a_fork() {
        // `mark_forked` replaces the library pool and the helper thread: not while another
        // test relies on them.
        let _one = SHARED_STATE.lock().unwrap_or_else(|e| e.into_inner());
        let a = sized_pool(3).unwrap();
        assert_eq!(a.current_num_threads(), 3);
        assert!(Arc::ptr_eq(&a, &sized_pool(3).unwrap()));
        mark_forked();
        let b = sized_pool(3).unwrap();
        assert!(!Arc::ptr_eq(&a, &b));
        assert_eq!(install(rayon::current_num_threads), num_threads());
    }

    #[test]
    fn monitored_job_reports_and_can_be_stopped() {
        let mut seen = Vec::new();
        let out = run_monitored(
            |m| {
                for i in 0..1_000_000u64 {
                    if m.update(i, 1_000_000).is_break() {
                        return Err(i);
                    }
                    std::thread::sleep(Duration::from_micros(10));
                }
                Ok(())
            },
            |d, t| {
                seen.push((d, t));
                if seen.len() >= 3 {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            },
            Duration::from_millis(5),
        );
        assert!(out.is_err(), "the job should have been stopped");
        assert!(seen.len() >= 3);
    }

    #[test]
    fn monitored_job_returns_its_value() {
        let out = run_monitored(
            |_| (0..100u64).into_par_iter().sum::<u64>(),
            |_, _| ControlFlow::Continue(()),
            Duration::from_millis(50),
        );
        assert_eq!(out, 4950);
    }
}
