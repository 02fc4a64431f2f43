//! What a backend's release listener (PostgreSQL's `LISTEN`, SQLite's release board) and its
//! registry tell each other; see [`Backend::listen_for_releases`](super::Backend::listen_for_releases).

/// What a release listener reports to its registry.
#[derive(Clone, Copy)]
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
pub(crate) enum ListenerEvent<'a> {
    /// The row of this `LOCK_KEY` was released in the registry's region.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Released { lock_key: &'a str },
    /// Some rows may have been released (a listener that knows only hashes of the keys, such
    /// as SQLite's release board): `released` says, for a `LOCK_KEY`, whether it may have been.
    #[cfg_attr(not(all(feature = "sqlite", target_os = "linux")), allow(dead_code))]
    ReleasedAmong { released: &'a dyn Fn(&str) -> bool },
    /// The listener asks which keys the registry waits for: `each` is called with the
    /// `LOCK_KEY` of every one (listeners that watch keys one by one: MySQL's).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    Watched { each: &'a dyn Fn(&str) },
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

/// Starts a registry's listener thread running `run`; `false` (after a warning naming
/// `backend`: its waiters poll) when the thread cannot be started.
#[cfg_attr(
    not(any(feature = "mysql", all(feature = "sqlite", target_os = "linux"))),
    allow(dead_code)
)]
pub(crate) fn spawn_listener(backend: &str, run: impl FnOnce() + Send + 'static) -> bool {
    match std::thread::Builder::new()
        .name("leasehold-listen".into())
        .spawn(run)
    {
        Ok(_) => true,
        Err(e) => {
            log::warn!("{backend} release wake-ups are off (waiters poll): {e}");
            false
        }
    }
}

/// The registry's handler of listener events.
pub(crate) type ListenerHandler =
    std::sync::Arc<dyn Fn(ListenerEvent<'_>) -> ListenerReply + Send + Sync>;
