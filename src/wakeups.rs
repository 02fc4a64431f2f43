//! Release wake-ups: which keys have a waiting poller in this registry, and whether the
//! backend's release listener is subscribed to the database's release notifications.
//!
//! Only PostgreSQL has a listener (see `backend::postgres`). A subscription is not free: while
//! a connection `LISTEN`s, every release in the database wakes that connection's server process
//! and the listener thread, on every instance that listens. So a registry listens only while one
//! of its threads waits for a lock held elsewhere:
//!
//! ```text
//!            a poller is about to sleep                 listener: LISTEN done
//!   Off ───────────────────────────────► Requested ───────────────────────────► On
//!    ▲                                                                            │
//!    └───────────── listener tick: no poller now, and none since the last tick ──┘
//!                                  (listener: UNLISTEN)
//! ```
//!
//! - A poller registers its key before each attempt of a waiting call and unregisters when the
//!   call ends; a notification that arrives while its attempt is in flight is not lost (the
//!   attempt may already have found the lock held), it cuts the next sleep short.
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
use crate::lock::LockInner;
use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

/// The registry's side of release notifications.
pub(crate) struct Wakeups {
    /// Whether a listener runs; without one, pollers neither register nor request anything.
    enabled: AtomicBool,
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
    /// The poller of each key that has one, by `LOCK_KEY`.
    pollers: HashMap<Arc<str>, Weak<LockInner>>,
    subscription: Subscription,
    /// Whether a poller registered since the listener's last tick.
    waited_since_tick: bool,
}

impl Wakeups {
    /// Disabled wake-ups, and the receiving end of their subscription requests, for the
    /// listener (see [`Wakeups::enable`]).
    pub fn new() -> (Wakeups, Receiver<()>) {
        let (demand, requests) = crossbeam_channel::unbounded();
        let wakeups = Wakeups {
            enabled: AtomicBool::new(false),
            demand,
            state: Mutex::new(State {
                pollers: HashMap::new(),
                subscription: Subscription::Off,
                waited_since_tick: false,
            }),
        };
        (wakeups, requests)
    }

    /// Called once a listener runs.
    pub fn enable(&self) {
        self.enabled.store(true, Ordering::Release);
    }

    fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Acquire)
    }

    /// `poller` is about to ask the database for `lock_key` in a call that will wait; returns
    /// whether it registered (then it must call [`Wakeups::unregister`] when the call ends).
    pub fn register(&self, lock_key: &Arc<str>, poller: &Arc<LockInner>) -> bool {
        if !self.is_enabled() {
            return false;
        }
        let mut state = self.state.lock();
        state.waited_since_tick = true;
        state
            .pollers
            .insert(Arc::clone(lock_key), Arc::downgrade(poller));
        true
    }

    /// The waiting call on `lock_key` ended.
    pub fn unregister(&self, lock_key: &str) {
        self.state.lock().pollers.remove(lock_key);
    }

    /// A registered poller found the lock held and is about to sleep: subscribe if nobody has
    /// asked yet.
    pub fn before_sleep(&self) {
        if !self.is_enabled() {
            return;
        }
        let mut state = self.state.lock();
        if state.subscription == Subscription::Off {
            state.subscription = Subscription::Requested;
            // The listener holds the receiver until the registry is gone.
            let _ = self.demand.send(());
        }
    }

    /// What the listener reports; the registry answers what it should do next.
    pub fn handle(&self, event: ListenerEvent<'_>) -> ListenerReply {
        let woken: Vec<Arc<LockInner>> = {
            let mut state = self.state.lock();
            match event {
                ListenerEvent::Released(lock_key) => state
                    .pollers
                    .get(lock_key)
                    .and_then(Weak::upgrade)
                    .into_iter()
                    .collect(),
                ListenerEvent::Subscribed => {
                    state.subscription = Subscription::On;
                    state.pollers.values().filter_map(Weak::upgrade).collect()
                }
                ListenerEvent::Tick => {
                    let idle = state.pollers.is_empty() && !state.waited_since_tick;
                    state.waited_since_tick = false;
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
