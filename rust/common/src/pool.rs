//! The library-owned rayon thread pool.
//!
//! maleki_rs never configures rayon's global pool, which other extensions in the same
//! process (polars, tokenizers, ...) share. Its size comes from [`set_num_threads`], else the
//! environment variable `MALEKI_RS_NUM_THREADS`, else the number of available cores.
//! Cores themselves just use rayon's parallel iterators; callers run them inside
//! [`install`] (or [`run_monitored`]) so those iterators land on this pool.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use rayon::{ThreadPool, ThreadPoolBuilder};

use crate::progress::Monitor;
use crate::{Error, Result};

/// Environment variable read when no explicit thread count was set.
pub const ENV_NUM_THREADS: &str = "MALEKI_RS_NUM_THREADS";

static REQUESTED: AtomicUsize = AtomicUsize::new(0); // 0: not set explicitly
static POOL: Mutex<Option<Arc<ThreadPool>>> = Mutex::new(None);
static FORKED: AtomicBool = AtomicBool::new(false);

/// Sets the number of worker threads (>= 1). The pool is rebuilt at its next use; calls
/// already running keep their old pool.
pub fn set_num_threads(n: usize) -> Result<()> {
    if n == 0 {
        return Err(Error::invalid("n", "the number of threads must be at least 1, got 0"));
    }
    if n > 4096 {
        return Err(Error::invalid("n", format!("at most 4096 threads, got {n}")));
    }
    REQUESTED.store(n, Ordering::SeqCst);
    let mut guard = POOL.lock().unwrap_or_else(|e| e.into_inner());
    if guard.as_ref().is_some_and(|p| p.current_num_threads() != n) {
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
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

fn threads_from_env() -> Option<usize> {
    let v = std::env::var(ENV_NUM_THREADS).ok()?;
    v.trim().parse::<usize>().ok().filter(|&n| (1..=4096).contains(&n))
}

/// The pool, built on first use with [`num_threads`] workers.
pub fn pool() -> Arc<ThreadPool> {
    let mut guard = POOL.lock().unwrap_or_else(|e| e.into_inner());
    if FORKED.swap(false, Ordering::SeqCst) {
        // The workers of the parent do not exist in a forked child: leak the old pool
        // (dropping it would signal threads that are gone) and build a new one.
        if let Some(old) = guard.take() {
            std::mem::forget(old);
        }
    }
    if let Some(p) = guard.as_ref() {
        return Arc::clone(p);
    }
    let n = num_threads();
    let p = Arc::new(
        ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("maleki-rs-{i}"))
            .build()
            .expect("building a rayon thread pool failed (out of threads?)"),
    );
    *guard = Some(Arc::clone(&p));
    p
}

/// Marks the pool as unusable; to be called in the child after `fork()`. Async-signal
/// safe: it only stores an atomic flag.
pub fn mark_forked() {
    FORKED.store(true, Ordering::SeqCst);
}

/// Runs `f` on the library pool; rayon iterators inside use that pool.
pub fn install<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    pool().install(f)
}

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

    #[test]
    fn install_runs_on_the_library_pool() {
        let names: Vec<String> = install(|| {
            (0..64)
                .into_par_iter()
                .map(|_| std::thread::current().name().unwrap_or("").to_string())
                .collect()
        });
        assert!(names.iter().all(|n| n.starts_with("maleki-rs-")), "{names:?}");
    }

    #[test]
    fn zero_threads_is_rejected() {
        assert!(set_num_threads(0).is_err());
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
        let out = run_monitored(|_| (0..100u64).into_par_iter().sum::<u64>(), |_, _| ControlFlow::Continue(()), Duration::from_millis(50));
        assert_eq!(out, 4950);
    }
}
