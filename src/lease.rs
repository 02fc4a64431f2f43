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
//! # Threads
//!
//! **The lease clock** (one thread per process, [`clock`]) keeps a list of live leases and
//! wakes at the earliest moment one of them needs attention: its first renewal is due, or its
//! deadline has passed. A lease whose deadline passes is marked lost right there — even when
//! its keeper is stuck in a database call that does not return (a frozen connection), so a
//! loss is never reported later than the moment another instance could take the lock.
//!
//! **A keeper thread** per lease does the renewing. The clock hands a lease to a keeper when
//! its first renewal falls due, so a lease released before that (most short critical sections)
//! never wakes another thread: starting or waking a thread costs more than an SQLite acquire.
//! From then on the keeper is the lease's own: it sleeps on a crossbeam channel until the next
//! renewal (a third of the time-to-live after the last one was sent, unless configured
//! otherwise), renews through the registry's renewal pool, and stops as soon as the channel's
//! sender is dropped (release), the lease is lost, or the registry is gone (it holds only a
//! `Weak` to the store between renewals). Keepers whose lease ended park for a while and are
//! reused ([`keepers`]). With renewal turned off no keeper is used; the clock reports the loss
//! at the deadline.

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
        clock::watch(&lease, keepers::Job::new(store, keeper, stop_rx));
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

    /// When the next renewal is due under `settings` (never after the deadline).
    fn next_renewal(&self, settings: KeeperSettings) -> Instant {
        let times = self.times.lock();
        let every = settings.renew_every.unwrap_or(times.ttl / 3);
        (times.last_sent + every).min(times.deadline)
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

/// The keeper thread's body (renewal on); see the module docs.
fn keep(lease: Arc<Lease>, store: Weak<dyn Store>, settings: KeeperSettings, stop: Receiver<()>) {
    loop {
        match stop.recv_deadline(lease.next_renewal(settings)) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        if lease.is_finished_or_lost() {
            return;
        }
        let deadline = lease.deadline();
        if Instant::now() >= deadline {
            lease.mark_lost(LossReason::Expired(None));
            return;
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

/// Keeper threads, reused: a keeper whose lease ended parks for up to
/// [`keepers::IDLE_LIFETIME`] waiting for the next lease instead of exiting. Each lease being
/// renewed has a thread of its own; an idle keeper holds no reference to any registry.
pub(crate) mod keepers {
    use super::{keep, KeeperSettings, Lease};
    use crate::backend::Store;
    use crossbeam_channel::{Receiver, Sender};
    use std::sync::{Arc, OnceLock, Weak};
    use std::time::Duration;

    /// How long a keeper thread without a lease waits for one before exiting.
    pub const IDLE_LIFETIME: Duration = Duration::from_secs(10);

    /// What a keeper needs to look after one lease; held by the clock until renewal is due.
    pub(crate) struct Job {
        store: Weak<dyn Store>,
        pub settings: KeeperSettings,
        stop: Receiver<()>,
    }

    impl Job {
        pub fn new(store: Weak<dyn Store>, settings: KeeperSettings, stop: Receiver<()>) -> Job {
            Job {
                store,
                settings,
                stop,
            }
        }
    }

    type Work = (Arc<Lease>, Job);

    /// A rendezvous channel: a send succeeds only when an idle keeper is waiting in `recv`.
    fn channel() -> &'static (Sender<Work>, Receiver<Work>) {
        static JOBS: OnceLock<(Sender<Work>, Receiver<Work>)> = OnceLock::new();
        JOBS.get_or_init(|| crossbeam_channel::bounded(0))
    }

    /// Runs `job` on an idle keeper thread, or on a new one.
    pub(crate) fn start(lease: Arc<Lease>, job: Job) {
        let work = match channel().0.try_send((lease, job)) {
            Ok(()) => return,
            Err(refused) => refused.into_inner(),
        };
        let key = Arc::clone(&work.0.key);
        let spawned = std::thread::Builder::new()
            .name("leasehold-keeper".into())
            .spawn(move || {
                let mut work = Some(work);
                while let Some((lease, job)) = work.take() {
                    keep(lease, job.store, job.settings, job.stop);
                    work = channel().1.recv_timeout(IDLE_LIFETIME).ok();
                }
            });
        if let Err(e) = spawned {
            log::error!("could not start the keeper thread of {key:?}: {e}");
        }
    }
}

/// The lease clock: one process-wide thread that starts keepers when renewal falls due and
/// reports leases whose deadline passed (see the module docs).
///
/// It holds `Weak` references only. It sleeps until the earliest moment a lease needs it, and
/// at most [`clock::IDLE_TICK`] at a time, so registering a lease only wakes it when that lease
/// needs it sooner — rare, since a new lease's first renewal is a third of a time-to-live away.
/// Ended leases are dropped from its list on each scan, and by `watch` when the list doubles.
pub(crate) mod clock {
    use super::keepers::{self, Job};
    use super::Lease;
    use crate::error::LossReason;
    use parking_lot::{Condvar, Mutex};
    use std::sync::{Arc, OnceLock};
    use std::time::{Duration, Instant};

    /// The longest the clock sleeps without looking at its list.
    pub const IDLE_TICK: Duration = Duration::from_secs(1);

    /// One watched lease; `job` is `Some` until its keeper has been started.
    struct Entry {
        lease: std::sync::Weak<Lease>,
        job: Option<Job>,
    }

    impl Entry {
        /// When the clock must look at this lease next.
        fn due(&self, lease: &Lease) -> Instant {
            match &self.job {
                Some(job) if job.settings.renew => lease.next_renewal(job.settings),
                _ => lease.deadline(),
            }
        }
    }

    struct Watched {
        entries: Vec<Entry>,
        next_wake: Option<Instant>,
        running: bool,
        prune_at: usize,
    }

    fn state() -> &'static (Mutex<Watched>, Condvar) {
        static STATE: OnceLock<(Mutex<Watched>, Condvar)> = OnceLock::new();
        STATE.get_or_init(|| {
            let watched = Watched {
                entries: Vec::new(),
                next_wake: None,
                running: false,
                prune_at: 64,
            };
            (Mutex::new(watched), Condvar::new())
        })
    }

    /// Watches `lease`; its keeper `job` starts when the first renewal is due.
    pub(crate) fn watch(lease: &Arc<Lease>, job: Job) {
        let (watched, wake) = state();
        let entry = Entry {
            lease: Arc::downgrade(lease),
            job: Some(job),
        };
        let due = entry.due(lease);
        let mut list = watched.lock();
        if list.entries.len() >= list.prune_at {
            list.entries.retain(|entry| {
                entry
                    .lease
                    .upgrade()
                    .is_some_and(|lease| !lease.is_finished_or_lost())
            });
            list.prune_at = (2 * list.entries.len()).max(64);
        }
        list.entries.push(entry);
        if !list.running {
            list.running = true;
            let started = std::thread::Builder::new()
                .name("leasehold-clock".into())
                .spawn(run);
            if let Err(e) = started {
                list.running = false;
                log::error!("could not start the lease clock thread: {e}");
            }
        } else if list.next_wake.is_none_or(|next| due < next) {
            wake.notify_one();
        }
    }

    fn run() {
        let (watched, wake) = state();
        let mut list = watched.lock();
        loop {
            let now = Instant::now();
            let mut next_wake = now + IDLE_TICK;
            let mut expired = Vec::new();
            let mut keepers_due = Vec::new();
            list.entries.retain_mut(|entry| {
                let Some(lease) = entry.lease.upgrade() else {
                    return false;
                };
                if lease.is_finished_or_lost() {
                    return false;
                }
                if lease.deadline() <= now {
                    expired.push(lease);
                    return false;
                }
                if entry.due(&lease) <= now {
                    if let Some(job) = entry.job.take() {
                        keepers_due.push((lease.clone(), job));
                    }
                }
                next_wake = next_wake.min(entry.due(&lease));
                true
            });
            list.next_wake = Some(next_wake);
            if !expired.is_empty() || !keepers_due.is_empty() {
                drop(list);
                for lease in expired {
                    lease.mark_lost(LossReason::Expired(None));
                }
                for (lease, job) in keepers_due {
                    keepers::start(lease, job);
                }
                list = watched.lock();
                continue;
            }
            wake.wait_until(&mut list, next_wake);
        }
    }
}
