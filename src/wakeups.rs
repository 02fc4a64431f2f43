//! Release wake-ups: which keys have a waiting poller in this registry (a lock's poller, or a
//! leader election's standby agent), and whether the backend's release listener is subscribed
//! to the database's release notifications.
//!
//! PostgreSQL's listener `LISTEN`s on a connection of its own (see `backend::postgres`);
//! SQLite's waits on a release board shared by the processes of the host (see
//! `backend::sqlite::board`), for semaphores, reader/writer locks and elections only: a lock's
//! poller sleeps on the board itself and does not register here (see `Watch` in `lock.rs`);
//! MySQL's starts a watcher per waited-for key, each blocked in `GET_LOCK` on its own
//! connection (see `backend::mysql::wakeups`; it learns the keys through
//! [`ListenerEvent::Watched`], and a newly waited-for key sends a request while subscribed). A
//! subscription is not free: while a connection `LISTEN`s, every release in the database wakes
//! that connection's server process and the listener thread, on every instance that listens
//! (on SQLite, every listening thread; on MySQL, a watcher holds a connection). So a registry
//! listens only while one of its threads waits for a lock held elsewhere:
//!
//! ```text
//!            a poller is about to sleep                 listener: LISTEN done
//!   Off ───────────────────────────────► Requested ───────────────────────────► On
//!    ▲                                                                            │
//!    └──────── listener tick: no poller now, and none slept since the last tick ──┘
//!                                  (listener: UNLISTEN)
//! ```
//!
//! - A poller registers its key before each attempt of a waiting call and unregisters when the
//!   call ends; a notification that arrives while its attempt is in flight is not lost (the
//!   attempt may already have found the lock held), it cuts the next sleep short. Several
//!   pollers may watch one key (a lock's poller and an election's agent); each is woken.
//! - Entering `On` nudges every registered poller once: a release that committed before the
//!   subscription took effect is then seen by a fresh attempt. The same happens after the
//!   listener had to reconnect.
//! - Ticks come about once a second from the listener while it is subscribed, so a registry that
//!   stops waiting keeps listening for one to two seconds, which spares back-to-back waits the
//!   subscription round trip.
//!
//! Polling every `idle_between_tries` stays the safety net for everything notifications miss:
//! expiry takeovers, Spring's `DELETE`s, and a listener that is down.

use crate::backend::{ListenerEvent, ListenerReply};
use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

/// Something a release notification wakes: it should try the database again now.
pub(crate) trait Nudge: Send + Sync {
    fn nudge(&self);
}

/// The registry's side of release notifications.
pub(crate) struct Wakeups {
    /// Whether a listener runs; without one, pollers neither register nor request anything.
    enabled: AtomicBool,
    /// Whether the listener serves keys one by one (MySQL's): it must hear of each new one.
    watches_keys: AtomicBool,
    /// Asks the listener to subscribe.
    demand: Sender<()>,
    state: Mutex<State>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Subscription {
    Off,
    Requested,
    On,
}

struct State {
    /// The pollers of each key, by `LOCK_KEY`. A key whose last poller left keeps its (empty)
    /// entry, so that a key locked again and again costs no allocation and one lookup per
    /// registration; empty entries are dropped once they outnumber the others (and 64). Hashed
    /// with foldhash (seeded per process): SipHash cost a lock() and its unlock() about 400
    /// instructions here. foldhash does not resist keys chosen to collide, which these cannot
    /// be: a `LOCK_KEY` is an MD5-derived UUID of the caller's key (see
    /// [`lock_key_for`](crate::lock_key_for)), and only this process's own waiters are in it.
    pollers: HashMap<Arc<str>, Vec<Weak<dyn Nudge>>, foldhash::fast::RandomState>,
    /// How many entries of `pollers` are empty.
    empty: usize,
    subscription: Subscription,
    /// Whether a poller went to sleep since the listener's last tick. (Registering alone does
    /// not count: every waiting call registers before its first attempt, and a registry whose
    /// locks are all free would otherwise never let go of its subscription.)
    slept_since_tick: bool,
}

impl Wakeups {
    /// Disabled wake-ups, and the receiving end of their subscription requests, for the
    /// listener (see [`Wakeups::enable`]).
    pub fn new() -> (Wakeups, Receiver<()>) {
        let (demand, requests) = crossbeam_channel::unbounded();
        let wakeups = Wakeups {
            enabled: AtomicBool::new(false),
            watches_keys: AtomicBool::new(false),
            demand,
            state: Mutex::new(State {
                pollers: HashMap::default(),
                empty: 0,
                subscription: Subscription::Off,
                slept_since_tick: false,
            }),
        };
        (wakeups, requests)
    }

    /// Called once a listener runs. `watches_keys`: the listener serves only the keys waited
    /// for and must hear of each new one, also while subscribed (see
    /// `Backend::LISTENER_WATCHES_KEYS`).
    pub fn enable(&self, watches_keys: bool) {
        self.watches_keys.store(watches_keys, Ordering::Release);
        self.enabled.store(true, Ordering::Release);
    }

    /// Whether a listener runs: the registry hears of releases elsewhere.
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Acquire)
    }

    /// `poller` is about to ask the database for `lock_key` and will wait if the lock is held;
    /// returns whether it is registered (then it must call [`Wakeups::unregister`] when it
    /// stops waiting). Registering again changes nothing.
    pub fn register(&self, lock_key: &Arc<str>, poller: Weak<dyn Nudge>) -> bool {
        if !self.is_enabled() {
            return false;
        }
        let mut state = self.state.lock();
        let state = &mut *state;
        let pollers = match state.pollers.entry(Arc::clone(lock_key)) {
            Entry::Occupied(entry) => {
                let pollers = entry.into_mut();
                if pollers.is_empty() {
                    state.empty -= 1;
                }
                pollers
            }
            Entry::Vacant(entry) => entry.insert(Vec::new()),
        };
        let new_key = pollers.is_empty();
        if !pollers.iter().any(|known| known.ptr_eq(&poller)) {
            pollers.push(poller);
        }
        if new_key
            && state.subscription == Subscription::On
            && self.watches_keys.load(Ordering::Acquire)
        {
            // The listener holds the receiver until the registry is gone.
            let _ = self.demand.send(());
        }
        true
    }

    /// `poller` stopped waiting for `lock_key`.
    pub fn unregister(&self, lock_key: &str, poller: &Weak<dyn Nudge>) {
        let mut state = self.state.lock();
        let state = &mut *state;
        if let Some(pollers) = state.pollers.get_mut(lock_key) {
            let had_any = !pollers.is_empty();
            pollers.retain(|known| !known.ptr_eq(poller));
            if had_any && pollers.is_empty() {
                state.empty += 1;
                if state.empty > 64 && state.empty > state.pollers.len() - state.empty {
                    state.pollers.retain(|_, pollers| !pollers.is_empty());
                    state.empty = 0;
                }
            }
        }
    }

    /// A registered poller found the lock held and is about to sleep: subscribe if nobody has
    /// asked yet.
    pub fn before_sleep(&self) {
        if !self.is_enabled() {
            return;
        }
        let mut state = self.state.lock();
        state.slept_since_tick = true;
        if state.subscription == Subscription::Off {
            state.subscription = Subscription::Requested;
            // The listener holds the receiver until the registry is gone.
            let _ = self.demand.send(());
        }
    }

    /// What the listener reports; the registry answers what it should do next.
    pub fn handle(&self, event: ListenerEvent<'_>) -> ListenerReply {
        let woken: Vec<Arc<dyn Nudge>> = {
            let mut state = self.state.lock();
            match event {
                ListenerEvent::Released { lock_key, .. } => state
                    .pollers
                    .get(lock_key)
                    .into_iter()
                    .flatten()
                    .filter_map(Weak::upgrade)
                    .collect(),
                ListenerEvent::ReleasedAmong { released } => state
                    .pollers
                    .iter()
                    .filter(|(_, pollers)| !pollers.is_empty())
                    .filter(|(lock_key, _)| released(lock_key))
                    .flat_map(|(_, pollers)| pollers.iter().filter_map(Weak::upgrade))
                    .collect(),
                ListenerEvent::Watched { each } => {
                    for (lock_key, pollers) in &state.pollers {
                        if pollers.iter().any(|poller| poller.strong_count() > 0) {
                            each(lock_key);
                        }
                    }
                    return ListenerReply::Keep;
                }
                ListenerEvent::Subscribed => {
                    state.subscription = Subscription::On;
                    state
                        .pollers
                        .values()
                        .flatten()
                        .filter_map(Weak::upgrade)
                        .collect()
                }
                ListenerEvent::Tick => {
                    let idle = state.pollers.len() == state.empty && !state.slept_since_tick;
                    state.slept_since_tick = false;
                    if idle && state.subscription == Subscription::On {
                        state.subscription = Subscription::Off;
                        return ListenerReply::Unsubscribe;
                    }
                    Vec::new()
                }
            }
        };
        for poller in woken {
            poller.nudge();
        }
        ListenerReply::Keep
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[derive(Default)]
    struct Counter(AtomicUsize);

    impl Nudge for Counter {
        fn nudge(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    impl Counter {
        fn count(&self) -> usize {
            self.0.load(Ordering::SeqCst)
        }
    }

    fn poller() -> (Arc<Counter>, Weak<dyn Nudge>) {
        let counter = Arc::new(Counter::default());
        let as_dyn: Arc<dyn Nudge> = counter.clone();
        (counter, Arc::downgrade(&as_dyn))
    }

    fn enabled() -> (Wakeups, Receiver<()>) {
        let (wakeups, requests) = Wakeups::new();
        wakeups.enable(false);
        (wakeups, requests)
    }

    #[test]
    fn without_a_listener_nothing_registers_or_asks() {
        let (wakeups, requests) = Wakeups::new();
        let (_, weak) = poller();
        assert!(!wakeups.register(&Arc::from("k"), weak));
        wakeups.before_sleep();
        assert!(requests.try_recv().is_err());
    }

    #[test]
    fn the_first_sleeper_asks_once_and_subscribing_nudges_every_poller() {
        let (wakeups, requests) = enabled();
        let (a, weak_a) = poller();
        let (b, weak_b) = poller();
        assert!(wakeups.register(&Arc::from("a"), weak_a.clone()));
        assert!(wakeups.register(&Arc::from("a"), weak_a), "twice is once");
        assert!(wakeups.register(&Arc::from("b"), weak_b));
        wakeups.before_sleep();
        wakeups.before_sleep();
        assert_eq!(
            requests.try_iter().count(),
            1,
            "one request while one is pending"
        );
        assert_eq!(
            wakeups.handle(ListenerEvent::Subscribed),
            ListenerReply::Keep
        );
        assert_eq!((a.count(), b.count()), (1, 1));
        wakeups.handle(ListenerEvent::Released { lock_key: "a" });
        assert_eq!(
            (a.count(), b.count()),
            (2, 1),
            "a release wakes its key's pollers only"
        );
        wakeups.before_sleep();
        assert!(requests.try_recv().is_err(), "no request while subscribed");
    }

    #[test]
    fn a_tick_unsubscribes_only_without_pollers_and_without_sleepers_since_the_last() {
        let (wakeups, requests) = enabled();
        let (_a, weak) = poller();
        let key: Arc<str> = Arc::from("a");
        let wait_once = || {
            wakeups.register(&key, weak.clone());
            wakeups.before_sleep();
            wakeups.handle(ListenerEvent::Subscribed);
        };
        wait_once();
        assert_eq!(
            wakeups.handle(ListenerEvent::Tick),
            ListenerReply::Keep,
            "a poller waits"
        );
        assert_eq!(
            wakeups.handle(ListenerEvent::Tick),
            ListenerReply::Keep,
            "it still does"
        );
        wakeups.unregister(&key, &weak);
        assert_eq!(
            wakeups.handle(ListenerEvent::Tick),
            ListenerReply::Unsubscribe
        );
        assert_eq!(requests.try_iter().count(), 1);

        wait_once();
        assert_eq!(
            requests.try_iter().count(),
            1,
            "the next sleeper asks again"
        );
        wakeups.unregister(&key, &weak);
        assert_eq!(
            wakeups.handle(ListenerEvent::Tick),
            ListenerReply::Keep,
            "it slept since the last tick"
        );
        // A call that registers and ends without sleeping does not keep the subscription.
        wakeups.register(&key, weak.clone());
        wakeups.unregister(&key, &weak);
        assert_eq!(
            wakeups.handle(ListenerEvent::Tick),
            ListenerReply::Unsubscribe
        );
    }

    /// Keys whose last poller left keep their entries for the next wait, until they outnumber
    /// the others: then they go, and a key waited for again is woken as before.
    #[test]
    fn left_keys_are_kept_for_the_next_wait_then_pruned() {
        let (wakeups, _requests) = enabled();
        let (a, weak) = poller();
        let (_held, held_weak) = poller();
        let held: Arc<str> = Arc::from("held");
        wakeups.register(&held, held_weak);
        let keys: Vec<Arc<str>> = (0..200).map(|i| Arc::from(format!("k{i}"))).collect();
        for key in &keys[..60] {
            wakeups.register(key, weak.clone());
            wakeups.unregister(key, &weak);
        }
        assert_eq!(wakeups.state.lock().pollers.len(), 61, "left keys kept");
        assert_eq!(wakeups.state.lock().empty, 60);
        for key in &keys[60..] {
            wakeups.register(key, weak.clone());
            wakeups.unregister(key, &weak);
        }
        let (entries, empty) = {
            let state = wakeups.state.lock();
            (state.pollers.len(), state.empty)
        };
        assert!(
            entries <= 66 && entries - empty == 1,
            "{entries} entries, {empty} empty"
        );
        // A kept key waited for again counts as waited for, and is woken.
        wakeups.register(&keys[199], weak.clone());
        wakeups.register(&keys[199], weak.clone());
        assert_eq!(wakeups.state.lock().empty, empty.saturating_sub(1));
        wakeups.handle(ListenerEvent::Released {
            lock_key: &keys[199],
        });
        assert_eq!(a.count(), 1);
        wakeups.unregister(&keys[199], &weak);
    }
}
