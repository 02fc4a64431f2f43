//! The end of lingers: one thread per registry that releases the keys whose linger ran out
//! unused (see "Linger" in the parent module's docs).

use super::{LingerDue, LockInner};
use parking_lot::{Condvar, Mutex};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// A queue of lingering keys by the end of their linger, at most one entry per key, and one
/// thread — started when a key lingers, gone after [`Lingerer::IDLE_TICK`] without one — that
/// sleeps until the earliest end. A key whose linger ran out unused is released on a
/// short-lived thread of its own (`leasehold-linger-end`), so that a release statement that
/// waits (a row another session holds locked, a server that stops answering; bounded by
/// `operation_timeout`) delays only its own key. Keys are held by `Weak`: a key whose last
/// handle goes releases a lingering lease in its `Drop`.
#[derive(Default)]
pub(crate) struct Lingerer {
    queue: Mutex<Queue>,
    wake: Condvar,
}

#[derive(Default)]
struct Queue {
    due: BinaryHeap<Reverse<Due>>,
    /// The thread is running.
    running: bool,
    /// Until when the thread sleeps (`None`: waiting for work): an entry due later than this
    /// needs no wake-up.
    sleeps_until: Option<Instant>,
    added: u64,
}

struct Due {
    at: Instant,
    order: u64,
    lock: Weak<LockInner>,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}

impl Eq for Due {}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Due {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.order).cmp(&(other.at, other.order))
    }
}

impl Lingerer {
    /// How long the thread waits without a lingering key before it ends.
    const IDLE_TICK: Duration = Duration::from_secs(1);

    /// `lock`'s entry is due at `at`. Called with the key's state locked (the thread never
    /// locks a key's state while it holds the queue).
    pub(super) fn add(self: &Arc<Self>, at: Instant, lock: Weak<LockInner>) {
        let mut queue = self.queue.lock();
        queue.added += 1;
        let order = queue.added;
        queue.due.push(Reverse(Due { at, order, lock }));
        if queue.running {
            if queue.sleeps_until.is_none_or(|until| at < until) {
                self.wake.notify_one();
            }
            return;
        }
        let this = Arc::clone(self);
        let started = std::thread::Builder::new()
            .name("leasehold-linger".into())
            .spawn(move || this.run());
        match started {
            Ok(_) => queue.running = true,
            // Left queued: the next linger tries to start the thread again, and a thread that
            // comes for the key releases an overdue linger itself.
            Err(e) => log::error!("could not start the thread that ends lingers: {e}"),
        }
    }

    /// Ends `lock`'s linger on a thread of its own; inline only if none can be started.
    fn end_on_its_own_thread(lock: Arc<LockInner>) {
        let end = |lock: Arc<LockInner>| {
            if panic::catch_unwind(AssertUnwindSafe(|| lock.end_linger_if_over())).is_err() {
                log::error!("ending the linger of {:?} panicked", lock.key);
            }
        };
        let spare = Arc::clone(&lock);
        let started = std::thread::Builder::new()
            .name("leasehold-linger-end".into())
            .spawn(move || end(lock));
        if let Err(e) = started {
            log::warn!("could not start a thread to end a linger ({e}); ending it here");
            end(spare);
        }
    }

    fn run(self: Arc<Self>) {
        let mut queue = self.queue.lock();
        loop {
            let now = Instant::now();
            match queue.due.peek().map(|due| due.0.at) {
                None => {
                    queue.sleeps_until = None;
                    let idle = self.wake.wait_for(&mut queue, Self::IDLE_TICK);
                    if idle.timed_out() && queue.due.is_empty() {
                        queue.running = false;
                        return;
                    }
                }
                Some(at) if at > now => {
                    queue.sleeps_until = Some(at);
                    self.wake.wait_until(&mut queue, at);
                }
                Some(_) => {
                    let due = queue.due.pop().expect("peeked").0;
                    queue.sleeps_until = Some(now);
                    drop(queue);
                    let later = due.lock.upgrade().and_then(|lock| match lock.linger_due() {
                        LingerDue::Later(at) => Some((at, Arc::downgrade(&lock))),
                        LingerDue::Over => {
                            Self::end_on_its_own_thread(lock);
                            None
                        }
                        LingerDue::Gone => None,
                    });
                    queue = self.queue.lock();
                    if let Some((at, lock)) = later {
                        queue.added += 1;
                        let order = queue.added;
                        queue.due.push(Reverse(Due { at, order, lock }));
                    }
                }
            }
        }
    }
}
