//! One database grant — a lease — and the thread that keeps it alive.
//!
//! # Lease state machine
//!
//! | state | entered when | `is_held()` | left when |
//! |-------|--------------|-------------|-----------|
//! | **held** | the acquire statement returned a token | `true` | released, lost |
//! | **released** | the last local holder let go and no local thread waits | `false` | — |
//! | **lost** | a renewal found another holder (or none); or the deadline passed | `false` | — |
//!
//! The *deadline* is the holder's own estimate of when the database will consider the lease
//! expired: the instant the last successful acquire or renew statement was **sent**, plus the
//! time-to-live, on the monotonic clock. The database computes expiry from when it *ran* the
//! statement, which is later, so the holder always gives up first. Crossing the deadline is a
//! loss even when no thread noticed yet: `is_held()` compares against it directly.
//!
//! # The keeper thread
//!
//! Every grant gets one thread of its own for as long as it is held (see [`keepers`] for how
//! those threads are reused between grants). It sleeps on a crossbeam channel until the next renewal is due
//! (a third of the time-to-live after the last renewal was sent, unless configured otherwise),
//! renews through the registry's renewal pool, and exits as soon as the channel's sender is
//! dropped (release), the lease is lost, or the registry is gone (it holds only a `Weak` to the
//! store between renewals). With renewal turned off it still wakes at the deadline to report
//! the loss.
//!
//! A keeper can be stuck inside a database call that does not return (a frozen connection).
//! So that the loss is still reported on time, one process-wide *watchdog* thread also
//! wakes at the earliest deadline of all live leases and marks a lease lost when its deadline
//! has passed — never later than the moment another instance could take the lock.

use crate::backend::{Grant, Path, Store};
use crate::error::LossReason;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// What a registry's loss callback and a guard's loss channel receive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseLost {
    /// The user's key.
    pub key: String,
    /// The fencing token of the lost lease.
    pub fencing_token: u64,
    /// Why it was lost.
    pub reason: LossReason,
}

/// Called once per lost lease, on the keeper thread (or the thread that noticed the loss).
pub type LostCallback = Arc<dyn Fn(&LeaseLost) + Send + Sync>;

/// How the keeper thread behaves; copied from the registry settings.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeeperSettings {
    /// `false`: never renew, only report the loss at the deadline.
    pub renew: bool,
    /// Renew this long after the last renewal was sent; `None` = a third of the time-to-live.
    pub renew_every: Option<Duration>,
}

#[derive(Debug)]
struct Times {
    ttl: Duration,
    last_sent: Instant,
    deadline: Instant,
}

/// One grant from the database. Shared by every local holder it is handed to.
pub(crate) struct Lease {
    pub key: Arc<str>,
    pub lock_key: Arc<str>,
    pub token: i64,
    times: Mutex<Times>,
    lost: Mutex<Option<LossReason>>,
    listeners: Mutex<Vec<Sender<LeaseLost>>>,
    stop: Mutex<Option<Sender<()>>>,
    finished: AtomicBool,
    on_lost: Option<LostCallback>,
}

impl Lease {
    /// The lease of `grant`, with its keeper thread started.
    pub fn start(
        key: Arc<str>,
        lock_key: Arc<str>,
        grant: Grant,
        ttl: Duration,
        store: Weak<dyn Store>,
        keeper: KeeperSettings,
        on_lost: Option<LostCallback>,
    ) -> Arc<Lease> {
        let Grant { token, sent_at } = grant;
        let (stop_tx, stop_rx) = crossbeam_channel::bounded(0);
        let lease = Arc::new(Lease {
            key,
            lock_key,
            token,
            times: Mutex::new(Times {
                ttl,
                last_sent: sent_at,
                deadline: sent_at + ttl,
            }),
            lost: Mutex::new(None),
            listeners: Mutex::new(Vec::new()),
            stop: Mutex::new(Some(stop_tx)),
            finished: AtomicBool::new(false),
            on_lost,
        });
        keepers::start(Arc::clone(&lease), store, keeper, stop_rx);
        watchdog::watch(&lease);
        lease
    }

    /// Held: not lost, and the deadline is still ahead.
    pub fn is_held(&self) -> bool {
        self.loss().is_none()
    }

    /// Why the lease is no longer held, or `None` while it is.
    pub fn loss(&self) -> Option<LossReason> {
        if let Some(reason) = self.lost.lock().clone() {
            return Some(reason);
        }
        (Instant::now() >= self.deadline()).then_some(LossReason::Expired(None))
    }

    /// Released normally or already reported lost: nothing left to watch.
    fn is_finished_or_lost(&self) -> bool {
        self.finished.load(Ordering::Acquire) || self.lost.lock().is_some()
    }

    pub fn deadline(&self) -> Instant {
        self.times.lock().deadline
    }

    pub fn ttl(&self) -> Duration {
        self.times.lock().ttl
    }

    /// Records a successful renewal sent at `sent_at` with `ttl`.
    pub fn renewed(&self, sent_at: Instant, ttl: Duration) {
        let mut times = self.times.lock();
        if sent_at >= times.last_sent {
            times.last_sent = sent_at;
            times.ttl = ttl;
            times.deadline = sent_at + ttl;
        }
    }

    /// Marks the lease lost (once, and not after [`Lease::finish`]) and tells the listeners and
    /// the callback.
    pub fn mark_lost(&self, reason: LossReason) {
        {
            let mut lost = self.lost.lock();
            if lost.is_some() || self.finished.load(Ordering::Acquire) {
                return;
            }
            *lost = Some(reason.clone());
        }
        self.stop_keeper();
        let event = self.event(reason);
        log::warn!(
            "lease on {:?} (token {}) lost: {}",
            event.key,
            event.fencing_token,
            event.reason
        );
        for listener in self.listeners.lock().drain(..) {
            let _ = listener.try_send(event.clone());
        }
        if let Some(callback) = &self.on_lost {
            callback(&event);
        }
    }

    /// A channel that receives one [`LeaseLost`] if the lease is lost (at once if it already is).
    /// It is disconnected without a message when the lease is released normally.
    pub fn loss_channel(&self) -> Receiver<LeaseLost> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        match self.loss() {
            Some(reason) => {
                let _ = tx.try_send(self.event(reason));
            }
            None => self.listeners.lock().push(tx),
        }
        rx
    }

    /// Stops the keeper thread and drops the loss listeners (their channels disconnect).
    pub fn finish(&self) {
        self.finished.store(true, Ordering::Release);
        self.stop_keeper();
        self.listeners.lock().clear();
    }

    fn stop_keeper(&self) {
        self.stop.lock().take();
    }

    fn event(&self, reason: LossReason) -> LeaseLost {
        LeaseLost {
            key: self.key.to_string(),
            fencing_token: self.token as u64,
            reason,
        }
    }
}

/// The keeper thread's body; see the module docs.
fn keep(lease: Arc<Lease>, store: Weak<dyn Store>, settings: KeeperSettings, stop: Receiver<()>) {
    loop {
        let wake_at = {
            let times = lease.times.lock();
            if settings.renew {
                let every = settings.renew_every.unwrap_or(times.ttl / 3);
                (times.last_sent + every).min(times.deadline)
            } else {
                times.deadline
            }
        };
        match stop.recv_deadline(wake_at) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        if lease.lost.lock().is_some() {
            return;
        }
        let deadline = lease.deadline();
        if Instant::now() >= deadline || !settings.renew {
            if Instant::now() >= deadline {
                lease.mark_lost(LossReason::Expired(None));
                return;
            }
            continue;
        }
        let Some(store) = store.upgrade() else { return };
        let ttl = lease.ttl();
        let outcome = store.renew(&lease.lock_key, lease.token, ttl, deadline, Path::Renewal);
        drop(store);
        match outcome {
            Ok(Some(sent_at)) => lease.renewed(sent_at, ttl),
            Ok(None) => {
                lease.mark_lost(LossReason::NotOwner);
                return;
            }
            Err(e) => {
                lease.mark_lost(LossReason::Expired(Some(e.to_string())));
                return;
            }
        }
    }
}

/// Keeper threads, reused: starting a thread costs more than an SQLite acquire, so a keeper
/// whose lease ended parks for up to [`keepers::IDLE_LIFETIME`] waiting for the next lease
/// instead of exiting. Each held lease still has a thread of its own; an idle keeper holds no
/// reference to any registry.
pub(crate) mod keepers {
    use super::{keep, KeeperSettings, Lease};
    use crate::backend::Store;
    use crossbeam_channel::{Receiver, Sender};
    use std::sync::{Arc, OnceLock, Weak};
    use std::time::Duration;

    /// How long a keeper thread without a lease waits for one before exiting.
    pub const IDLE_LIFETIME: Duration = Duration::from_secs(10);

    struct Job {
        lease: Arc<Lease>,
        store: Weak<dyn Store>,
        settings: KeeperSettings,
        stop: Receiver<()>,
    }

    /// A rendezvous channel: a send succeeds only when an idle keeper is waiting in `recv`.
    fn channel() -> &'static (Sender<Job>, Receiver<Job>) {
        static JOBS: OnceLock<(Sender<Job>, Receiver<Job>)> = OnceLock::new();
        JOBS.get_or_init(|| crossbeam_channel::bounded(0))
    }

    /// Runs the keeper of `lease` on an idle keeper thread, or on a new one.
    pub(crate) fn start(
        lease: Arc<Lease>,
        store: Weak<dyn Store>,
        settings: KeeperSettings,
        stop: Receiver<()>,
    ) {
        let job = Job {
            lease,
            store,
            settings,
            stop,
        };
        let job = match channel().0.try_send(job) {
            Ok(()) => return,
            Err(refused) => refused.into_inner(),
        };
        let key = Arc::clone(&job.lease.key);
        let spawned = std::thread::Builder::new()
            .name("leasehold-keeper".into())
            .spawn(move || {
                let mut job = Some(job);
                while let Some(Job {
                    lease,
                    store,
                    settings,
                    stop,
                }) = job.take()
                {
                    keep(lease, store, settings, stop);
                    job = channel().1.recv_timeout(IDLE_LIFETIME).ok();
                }
            });
        if let Err(e) = spawned {
            log::error!("could not start the keeper thread of {key:?}: {e}");
        }
    }
}

/// The process-wide watchdog: reports leases whose deadline passed while their keeper was stuck.
///
/// It keeps `Weak` references only, scans its list when the earliest deadline it knows of
/// arrives, and sleeps without a deadline when no lease is live. Registering a lease wakes it
/// only when the new deadline is earlier than its next wake-up, which is rare: a new lease's
/// deadline is a whole time-to-live away.
pub(crate) mod watchdog {
    use super::Lease;
    use crate::error::LossReason;
    use parking_lot::{Condvar, Mutex};
    use std::sync::{Arc, OnceLock, Weak};
    use std::time::Instant;

    #[derive(Default)]
    struct Watched {
        leases: Vec<Weak<Lease>>,
        next_wake: Option<Instant>,
        running: bool,
        /// List length at which `watch` drops ended leases (amortised O(1) per lease).
        prune_at: usize,
    }

    fn state() -> &'static (Mutex<Watched>, Condvar) {
        static STATE: OnceLock<(Mutex<Watched>, Condvar)> = OnceLock::new();
        STATE.get_or_init(Default::default)
    }

    /// Adds `lease` to the watch list, starting the watchdog thread on first use.
    pub(crate) fn watch(lease: &Arc<Lease>) {
        let (watched, wake) = state();
        let deadline = lease.deadline();
        let mut list = watched.lock();
        if list.leases.len() >= list.prune_at {
            list.leases
                .retain(|weak| weak.upgrade().is_some_and(|l| !l.is_finished_or_lost()));
            list.prune_at = (2 * list.leases.len()).max(64);
        }
        list.leases.push(Arc::downgrade(lease));
        if !list.running {
            list.running = true;
            let started = std::thread::Builder::new()
                .name("leasehold-watchdog".into())
                .spawn(run);
            if let Err(e) = started {
                list.running = false;
                log::error!("could not start the lease watchdog thread: {e}");
            }
        } else if list.next_wake.is_none_or(|next| deadline < next) {
            wake.notify_one();
        }
    }

    fn run() {
        let (watched, wake) = state();
        let mut list = watched.lock();
        loop {
            let now = Instant::now();
            let mut next_wake: Option<Instant> = None;
            let mut expired = Vec::new();
            list.leases.retain(|weak| {
                let Some(lease) = weak.upgrade() else {
                    return false;
                };
                if lease.is_finished_or_lost() {
                    return false;
                }
                let deadline = lease.deadline();
                if deadline <= now {
                    expired.push(lease);
                    return false;
                }
                next_wake = Some(next_wake.map_or(deadline, |next| next.min(deadline)));
                true
            });
            list.next_wake = next_wake;
            if !expired.is_empty() {
                drop(list);
                for lease in expired {
                    lease.mark_lost(LossReason::Expired(None));
                }
                list = watched.lock();
                continue;
            }
            match next_wake {
                Some(at) => {
                    wake.wait_until(&mut list, at);
                }
                None => wake.wait(&mut list),
            }
        }
    }
}
