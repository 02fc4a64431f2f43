//! Threads that run statements of backends that cannot bound a call by a deadline themselves,
//! for callers with deadlines: PostgreSQL called from inside an asynchronous runtime (whose
//! connection cannot start its own there), MySQL outside Unix (no socket to carry the deadline).
//! Elsewhere both run statements inline ([`super::Backend::runs_inline`]).
//!
//! A thread that finished a statement counts itself idle and waits up to
//! [`IDLE_LIFETIME`] for the next one. A caller claims an idle thread by
//! decrementing that count and queues its statement; with none idle it starts a thread. Claiming
//! before the thread is back in `recv` is fine (the statement waits in the queue for it), so
//! back-to-back statements reuse one thread instead of starting new ones. A job returns its
//! reply (which hands the caller its answer) instead of sending it, and the thread counts
//! itself idle *before* replying: a caller whose next statement follows at once then finds it
//! idle instead of starting another. A thread stuck on a connection that stopped answering
//! stays stuck only until that call returns; its caller has long gone on.

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// How long an idle statement thread waits for work before exiting.
pub const IDLE_LIFETIME: Duration = Duration::from_secs(10);

/// A statement to run; what it returns is run after the thread counts itself idle.
pub(crate) type Job = Box<dyn FnOnce() -> Reply + Send>;
/// Hands a caller the answer of its statement.
pub(crate) type Reply = Box<dyn FnOnce() + Send>;

struct Threads {
    queue: (Sender<Job>, Receiver<Job>),
    idle: AtomicUsize,
}

fn threads() -> &'static Threads {
    static THREADS: OnceLock<Threads> = OnceLock::new();
    THREADS.get_or_init(|| Threads {
        queue: crossbeam_channel::unbounded(),
        idle: AtomicUsize::new(0),
    })
}

/// Takes one from the idle count if it is not zero.
fn claim_idle(idle: &AtomicUsize) -> bool {
    idle.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
        .is_ok()
}

/// Runs `job` on an idle statement thread, or on a new one. If no thread can be started
/// the job is dropped, which its caller sees as an attempt without an answer.
pub(crate) fn run(job: Job) {
    let threads = threads();
    if claim_idle(&threads.idle) {
        // The queue is unbounded and never closed: this cannot fail.
        let _ = threads.queue.0.send(job);
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("leasehold-statement".into())
        .spawn(move || {
            let mut job = job;
            loop {
                let reply = job();
                threads.idle.fetch_add(1, Ordering::AcqRel);
                reply();
                job = loop {
                    match threads.queue.1.recv_timeout(IDLE_LIFETIME) {
                        Ok(job) => break job,
                        // Leave only if no caller has claimed this thread meanwhile.
                        Err(RecvTimeoutError::Timeout) if claim_idle(&threads.idle) => return,
                        Err(_) => continue,
                    }
                };
            }
        });
    if let Err(e) = spawned {
        log::error!("could not start a statement thread: {e}");
    }
}
