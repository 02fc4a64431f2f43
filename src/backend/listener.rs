//! What a backend's release listener (only PostgreSQL has one) and its registry tell each
//! other; see [`Backend::listen_for_releases`](super::Backend::listen_for_releases).

use std::time::Duration;

/// What a release listener reports to its registry (only PostgreSQL has a listener).
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) enum ListenerEvent<'a> {
    /// The row of this `LOCK_KEY` was released in the registry's region, after the key had
    /// been busy for `turn_age` without a break.
    Released {
        lock_key: &'a str,
        turn_age: Duration,
    },
    /// The subscription took effect (first time, or again after a reconnect).
    Subscribed,
    /// About a second passed while subscribed.
    Tick,
}

/// What the registry wants its listener to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListenerReply {
    Keep,
    /// Stop listening until the next request.
    Unsubscribe,
    /// The registry is gone: close the connection and end the thread.
    Stop,
}

/// The registry's handler of listener events.
pub(crate) type ListenerHandler =
    std::sync::Arc<dyn Fn(ListenerEvent<'_>) -> ListenerReply + Send + Sync>;
