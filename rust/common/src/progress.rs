//! Progress reporting and cancellation for long-running cores.
//!
//! A core never prints and never talks to Python. It receives a `&dyn Progress`, reports
//! `update(done, total)` at natural checkpoints (a scan, a search node batch, an epoch) and
//! stops with [`crate::Error::Cancelled`] when `update` returns `ControlFlow::Break` or
//! [`Progress::cancelled`] is true.
//!
//! The bindings run the core on the library pool and watch a [`Monitor`] from the calling
//! thread (see [`crate::pool::run_monitored`]): the calling thread is the one that can call
//! Python callbacks and see Ctrl-C, so the workers never need the interpreter.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The sink a core reports its progress to. Implementations must be cheap: cores may call
/// `update` from several threads, thousands of times per second.
pub trait Progress: Sync {
    /// `done` of `total` work units are finished. `Break` asks the core to stop.
    fn update(&self, done: u64, total: u64) -> ControlFlow<()>;

    /// True once a stop has been requested (for loops that cannot count their work).
    fn cancelled(&self) -> bool;

    /// `Err(Cancelled)` once a stop has been requested: `progress.check()?` in loops.
    fn check(&self) -> crate::Result<()> {
        if self.cancelled() {
            Err(crate::Error::Cancelled)
        } else {
            Ok(())
        }
    }
}

/// Reports nowhere and never cancels.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProgress;

impl Progress for NoProgress {
    #[inline]
    fn update(&self, _done: u64, _total: u64) -> ControlFlow<()> {
        ControlFlow::Continue(())
    }
    #[inline]
    fn cancelled(&self) -> bool {
        false
    }
}

/// A stop flag with no progress counts: cancellation only (e.g. a time limit checker).
#[derive(Debug, Default)]
pub struct CancelFlag(AtomicBool);

impl CancelFlag {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl Progress for CancelFlag {
    fn update(&self, _done: u64, _total: u64) -> ControlFlow<()> {
        if self.cancelled() {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }
    fn cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Progress shared between the workers (which `update` it) and a watcher thread (which reads
/// [`Monitor::snapshot`] and may [`Monitor::request_stop`]). Lock-free.
#[derive(Debug, Default)]
pub struct Monitor {
    done: AtomicU64,
    total: AtomicU64,
    stop: AtomicBool,
}

impl Monitor {
    pub fn new() -> Self {
        Self::default()
    }
    /// The last reported `(done, total)`.
    pub fn snapshot(&self) -> (u64, u64) {
        (
            self.done.load(Ordering::Relaxed),
            self.total.load(Ordering::Relaxed),
        )
    }
    /// Asks the core to stop at its next checkpoint.
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Progress for Monitor {
    fn update(&self, done: u64, total: u64) -> ControlFlow<()> {
        if self.total.swap(total, Ordering::Relaxed) == total {
            // Parallel workers may report out of order: keep the largest count seen.
            self.done.fetch_max(done, Ordering::Relaxed);
        } else {
            // A new total is a new stage of the job (a search's repetends, then its
            // completion): its count starts afresh (a stage of 40 000 steps showed 114 542).
            self.done.store(done, Ordering::Relaxed);
        }
        if self.cancelled() {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }
    fn cancelled(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// Counts finished units from many threads and forwards the running total to a `Progress`.
///
/// ```
/// use maleki_common::progress::{Counter, NoProgress};
/// let c = Counter::new(&NoProgress, 10);
/// assert!(c.tick(3).is_continue());
/// assert_eq!(c.done(), 3);
/// ```
pub struct Counter<'a> {
    sink: &'a dyn Progress,
    done: AtomicU64,
    total: u64,
}

impl<'a> Counter<'a> {
    pub fn new(sink: &'a dyn Progress, total: u64) -> Self {
        let _ = sink.update(0, total);
        Counter {
            sink,
            done: AtomicU64::new(0),
            total,
        }
    }
    /// Adds `n` finished units; `Break` when the sink asks to stop.
    pub fn tick(&self, n: u64) -> ControlFlow<()> {
        let done = self.done.fetch_add(n, Ordering::Relaxed) + n;
        self.sink.update(done, self.total)
    }
    pub fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }
    pub fn cancelled(&self) -> bool {
        self.sink.cancelled()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monitor_reports_and_stops() {
        let m = Monitor::new();
        assert!(m.update(3, 10).is_continue());
        assert!(m.update(2, 10).is_continue());
        assert_eq!(m.snapshot(), (3, 10));
        // A new total starts a new stage: its count, not the largest of the old one.
        assert!(m.update(1, 4).is_continue());
        assert_eq!(m.snapshot(), (1, 4));
        m.request_stop();
        assert!(m.update(4, 10).is_break());
        assert_eq!(m.check(), Err(crate::Error::Cancelled));
    }

    #[test]
    fn counter_sums_ticks_across_threads() {
        let m = Monitor::new();
        let c = Counter::new(&m, 400);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..100 {
                        let _ = c.tick(1);
                    }
                });
            }
        });
        assert_eq!(c.done(), 400);
        assert_eq!(m.snapshot(), (400, 400));
    }
}
