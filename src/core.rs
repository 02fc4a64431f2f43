//! What every primitive of a registry shares: the validated settings, the store, the renewal
//! and wake-up machinery (`Core`), and the checks that turn a user's settings into them.
//!
//! The layers, each using only those below it: `backend` (the database side) and `lease`
//! (leases and their renewal) at the bottom; this module; `lock` (one key's local queue and
//! handoff); the primitives on it (`semaphore`, `rwlock`, `leader`); and `registry`, the facade
//! that builds a `Core` and hands out the primitives.

use crate::backend::Store;
use crate::error::{Error, Result};
use crate::lease::{KeeperSettings, LossSink, Renewer};
use crate::meter::Meter;
use crate::wakeups::Wakeups;
use std::sync::Arc;
use std::time::Duration;

/// The shortest time-to-live accepted: a lease shorter than this cannot be renewed reliably.
pub const MIN_TIME_TO_LIVE: Duration = Duration::from_millis(10);
/// The longest time-to-live accepted: a crashed holder blocks its key this long.
pub const MAX_TIME_TO_LIVE: Duration = Duration::from_secs(7 * 24 * 3600);
/// The longest `idle_between_tries` accepted.
pub const MAX_IDLE_BETWEEN_TRIES: Duration = Duration::from_secs(3600);
/// The longest `operation_timeout` and `connect_timeout` accepted: a day. Deadlines are
/// instants computed from them, so an absurd value must be refused, not overflow.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// The longest region accepted, in characters (the column is `VARCHAR(100)`).
pub const MAX_REGION_CHARS: usize = 100;
/// The longest table prefix accepted: the longest name made from it, `{prefix}LOCK_FLOOR` (the
/// deletion floor beside the table `{prefix}LOCK`), then fits PostgreSQL's 63 characters.
pub const MAX_PREFIX_CHARS: usize = 53;

/// The longest [`Tuning::linger`] accepted.
pub const MAX_LINGER: Duration = Duration::from_secs(1);
/// The most connections a pool may have.
pub const MAX_POOL_SIZE: u32 = 10_000;

/// Tuning of the mechanisms behind a registry's locks, set with
/// [`RegistryBuilder::tuning`](crate::RegistryBuilder::tuning). The defaults suit most uses;
/// the `lock` module docs state what each mechanism guarantees.
///
/// | field | default | range | what it does |
/// |-------|---------|-------|--------------|
/// | `turn_limit` | `Some(500 ms)` | `None`, or up to [`MAX_TIME_TO_LIVE`] | the longest a registry's threads may pass one database grant among themselves (handoffs and lingers): each turn lasts a random time between ½ and 1 × this, so that turn ends fall at no fixed phase of other instances' polls; past it, a release with local threads still wanting the key reserves the row for 2 × `idle_between_tries` for instances that ignore reservations (Spring Integration's), then the waiting line gives it to the instance that has waited longest (without the line's table, the registry's threads stay away for 3 × `idle_between_tries` instead), so other instances get the key. `None`: no limit (other instances can starve under continuous local contention, and the key never rests) |
/// | `linger` | 5 ms | 0 ..= [`MAX_LINGER`] | how long a released lease that several threads of the registry use, and nobody queues on, stays held for the next of them (no statement, same fencing token); other instances wait up to this much longer. Zero: off. Plain locks only |
/// | `local_handoff` | `true` | – | whether a release passes the lock straight to a waiting thread of the registry, keeping the grant and its fencing token; `false` gives every holder a grant and a token of its own (a release and an acquire per handoff) |
/// | `renewal_pool_size` | 2 | 1 ..= [`MAX_POOL_SIZE`] | connections of the pool that only background renewals use (one batch statement at a time; the second lets a retry go out while a timed-out attempt still holds the first) |
/// | `idle_connection_timeout` | 60 s | 1 ms ..= [`MAX_TIMEOUT`] | how long a pooled connection may stay unused before it is closed (pools check every 30 s; SQLite's parked connection within 1.5 × it); PostgreSQL's release listener closes its connection after this long without a waiter |
/// | `cache_capacity` | 100 000 | 1 ..= `usize::MAX` | how many lock handles the registry caches (least recently used first out); handles in use are never evicted, so the cache grows past this while they are in use |
/// | `metrics_key_labels` | `false` | – | whether per-key metrics (feature `metrics`) carry a `key` label with the lock's name |
///
/// ```
/// # fn main() -> leasehold::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// use leasehold::Tuning;
/// use std::time::Duration;
/// let registry = leasehold::LockRegistry::sqlite(dir.path().join("locks.db"))
///     .create_table(true)
///     .tuning(Tuning {
///         local_handoff: false, // a fencing token per holder
///         turn_limit: Some(Duration::from_millis(500)),
///         ..Tuning::default()
///     })
///     .build()?;
/// # drop(registry);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// See the table above.
    pub turn_limit: Option<Duration>,
    /// See the table above.
    pub linger: Duration,
    /// See the table above.
    pub local_handoff: bool,
    /// See the table above.
    pub renewal_pool_size: u32,
    /// See the table above.
    pub idle_connection_timeout: Duration,
    /// See the table above.
    pub cache_capacity: usize,
    /// See the table above.
    pub metrics_key_labels: bool,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            turn_limit: Some(Duration::from_millis(500)),
            linger: Duration::from_millis(5),
            local_handoff: true,
            renewal_pool_size: 2,
            idle_connection_timeout: Duration::from_secs(60),
            cache_capacity: 100_000,
            metrics_key_labels: false,
        }
    }
}

impl Tuning {
    /// Checks every field against its range.
    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(limit) = self.turn_limit.filter(|limit| *limit > MAX_TIME_TO_LIVE) {
            return Err(Error::setting(
                "turn_limit",
                format!(
                    "{limit:?} is longer than {MAX_TIME_TO_LIVE:?}; use None for no limit, or \
                     a second or so"
                ),
            ));
        }
        if self.linger > MAX_LINGER {
            return Err(Error::setting(
                "linger",
                format!(
                    "{:?} is longer than {MAX_LINGER:?}: other instances wait this much longer \
                     for a key this registry keeps; use a few milliseconds, or zero for none",
                    self.linger
                ),
            ));
        }
        check_pool_size("renewal_pool_size", self.renewal_pool_size)?;
        if self.cache_capacity == 0 {
            return Err(Error::setting(
                "cache_capacity",
                "must be at least 1: the cache holds every lock handle in use",
            ));
        }
        if self.idle_connection_timeout < Duration::from_millis(1)
            || self.idle_connection_timeout > MAX_TIMEOUT
        {
            return Err(Error::setting(
                "idle_connection_timeout",
                format!(
                    "{:?} is outside 1ms..={MAX_TIMEOUT:?}: idle connections close after it, so \
                     pick seconds to minutes",
                    self.idle_connection_timeout
                ),
            ));
        }
        Ok(())
    }
}

/// Replacements for the lease statements, set with
/// [`RegistryBuilder::custom_sql`](crate::RegistryBuilder::custom_sql); `None` keeps the
/// backend's default (see [`Statements`](crate::Statements)).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CustomSql {
    /// The acquire statement.
    pub acquire: Option<String>,
    /// The renew statement.
    pub renew: Option<String>,
    /// The release statement.
    pub release: Option<String>,
}

/// Settings every lock of a registry reads; validated by the builder.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub time_to_live: Duration,
    pub idle_between_tries: Duration,
    /// See [`Tuning::turn_limit`].
    pub turn_limit: Option<Duration>,
    /// `false`: every holder takes the lock from the database (a token of its own).
    pub local_handoff: bool,
    /// See [`Tuning::linger`]; zero: released at once.
    pub linger: Duration,
    pub operation_timeout: Duration,
    pub keeper: KeeperSettings,
}

impl Settings {
    /// How long a registry's threads stay away from a key after its turn ended when there is
    /// no waiting line: 3 × `idle_between_tries` (see "Bounded turn" in the `lock` module
    /// docs).
    pub fn turn_gap(&self) -> Duration {
        self.idle_between_tries * 3
    }

    /// How long a place in the waiting line lives unless refreshed: 5 × `idle_between_tries`,
    /// at least a second (a waiting poller refreshes it every quarter of that; see "Waiting
    /// in line" in the `lock` module docs).
    pub fn place_ttl(&self) -> Duration {
        (self.idle_between_tries * 5).max(Duration::from_secs(1))
    }

    /// How long the release that ends a turn reserves the row for instances that ignore
    /// reservations: 2 × `idle_between_tries`.
    pub fn reservation(&self) -> Duration {
        self.idle_between_tries * 2
    }

    pub fn check_ttl(&self, setting: &'static str, ttl: Duration) -> Result<()> {
        if ttl < MIN_TIME_TO_LIVE || ttl > MAX_TIME_TO_LIVE {
            return Err(Error::setting(
                setting,
                format!(
                    "{ttl:?} is outside {MIN_TIME_TO_LIVE:?}..={MAX_TIME_TO_LIVE:?}; pick a lease \
                     a little longer than the longest pause you expect between renewals"
                ),
            ));
        }
        if let Some(every) = self.keeper.renew_every.filter(|_| self.keeper.renew) {
            if every > ttl / 2 {
                return Err(Error::setting(
                    setting,
                    format!(
                        "{ttl:?} is less than twice renew_every ({every:?}): a renewal that \
                         fails would leave no time for another before the lease ends; use a \
                         time-to-live of at least {:?}, or renew more often",
                        every * 2
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// What every lock of one registry shares: the store, the settings, the loss callback.
pub(crate) struct Core {
    pub store: Arc<dyn Store>,
    pub settings: Settings,
    /// The registry's loss callback, on its own thread (see [`callback_thread`](crate::lease::callback_thread)).
    pub on_lost: Option<LossSink>,
    pub client_id: String,
    pub region: String,
    pub table: String,
    /// Release notifications: which pollers to wake, and when to listen.
    pub wakeups: Wakeups,
    /// Background renewals of this registry's leases.
    pub renewer: Arc<Renewer>,
    /// What the registry measures (see [`crate::meter`]).
    pub meter: Arc<Meter>,
    /// Set by `LockRegistry::close`: waits end with [`Error::Closed`], nothing new is granted.
    pub closed: std::sync::atomic::AtomicBool,
    /// Every local state that threads may wait on (locks, their rows, semaphores, reader/writer
    /// locks), so that closing wakes them all.
    pub waitables: parking_lot::Mutex<Vec<std::sync::Weak<dyn crate::wakeups::Nudge>>>,
    /// Acquires with an unknown outcome being resolved (see the `lock` module, "Unknown
    /// outcomes"): closing and dropping the registry wait for them.
    pub resolutions: std::sync::Arc<Resolutions>,
}

/// A count of resolutions in flight, and a way to wait until there are none.
#[derive(Default)]
pub(crate) struct Resolutions {
    running: parking_lot::Mutex<usize>,
    done: parking_lot::Condvar,
}

/// One resolution in flight: counted until dropped.
pub(crate) struct Resolution(std::sync::Arc<Resolutions>);

impl Drop for Resolution {
    fn drop(&mut self) {
        let mut running = self.0.running.lock();
        *running -= 1;
        if *running == 0 {
            self.0.done.notify_all();
        }
    }
}

impl Resolutions {
    /// Counts a resolution in until the returned value is dropped.
    pub(crate) fn begin(self: &std::sync::Arc<Self>) -> Resolution {
        *self.running.lock() += 1;
        Resolution(std::sync::Arc::clone(self))
    }

    /// Waits until no resolution runs, or until `until`: `true` when none runs.
    pub(crate) fn wait_until(&self, until: std::time::Instant) -> bool {
        let mut running = self.running.lock();
        while *running > 0 {
            if self.done.wait_until(&mut running, until).timed_out() {
                return *running == 0;
            }
        }
        true
    }
}

impl Core {
    /// [`Error::Closed`] once the registry has been closed.
    pub(crate) fn check_open(&self) -> Result<()> {
        if self.is_closed() {
            return Err(Error::Closed);
        }
        Ok(())
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Remembers `waitable` so that closing the registry wakes its waiting threads.
    pub(crate) fn track(&self, waitable: std::sync::Weak<dyn crate::wakeups::Nudge>) {
        let mut all = self.waitables.lock();
        if all.len() >= 64 && all.len().is_power_of_two() {
            all.retain(|known| known.strong_count() > 0);
        }
        all.push(waitable);
    }

    /// Closes the registry: every wait of its threads ends with [`Error::Closed`], at once.
    /// Closing also gives back what the registry may hold without a holder: it waits (up to
    /// `operation_timeout`) for the resolutions of acquires whose outcome is unknown, and
    /// keys that linger are released at once.
    pub(crate) fn close(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        let all: Vec<_> = self.waitables.lock().clone();
        for waitable in all.iter().filter_map(std::sync::Weak::upgrade) {
            waitable.nudge();
        }
        self.finish_resolutions();
    }

    /// Waits up to `operation_timeout` for the resolutions in flight.
    pub(crate) fn finish_resolutions(&self) {
        let until = std::time::Instant::now() + self.settings.operation_timeout;
        if !self.resolutions.wait_until(until) {
            log::warn!(
                "acquires whose outcome is unknown are still being resolved after {:?}",
                self.settings.operation_timeout
            );
        }
    }
}

/// Where the lock table lives.
pub(crate) enum Database {
    #[cfg(feature = "sqlite")]
    Sqlite(std::path::PathBuf),
    #[cfg(feature = "postgres")]
    Postgres(String),
    #[cfg(feature = "mysql")]
    Mysql(String),
}

/// A pool size must be within 1..=[`MAX_POOL_SIZE`].
pub(crate) fn check_pool_size(setting: &'static str, size: u32) -> Result<()> {
    if size == 0 || size > MAX_POOL_SIZE {
        return Err(Error::setting(
            setting,
            format!(
                "{size} is outside 1..={MAX_POOL_SIZE}: statements need a connection, and a \
                 pool bounds a burst, so a few to a few dozen is typical"
            ),
        ));
    }
    Ok(())
}

/// A timeout must be above zero and at most [`MAX_TIMEOUT`].
pub(crate) fn check_timeout(setting: &'static str, timeout: Duration) -> Result<()> {
    if timeout.is_zero() || timeout > MAX_TIMEOUT {
        return Err(Error::setting(
            setting,
            format!(
                "{timeout:?} is outside (0s, {MAX_TIMEOUT:?}]: it bounds how long a call waits \
                 for the database, so pick seconds to minutes"
            ),
        ));
    }
    Ok(())
}

/// Checks a table prefix and returns it: it is spliced into SQL.
pub(crate) fn validate_prefix(prefix: &str) -> Result<String> {
    let identifier = |part: &str| {
        part.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let (schema, name) = match prefix.split_once('.') {
        Some((schema, name)) => (Some(schema), name),
        None => (None, prefix),
    };
    let valid = prefix.len() <= MAX_PREFIX_CHARS
        && schema.is_none_or(identifier)
        && (name.is_empty() || identifier(name));
    if !valid {
        return Err(Error::setting(
            "prefix",
            format!(
                "{prefix:?} is not a plain SQL identifier: use letters, digits and _ (not \
                 starting with a digit), optionally preceded by `schema.`, at most \
                 {MAX_PREFIX_CHARS} characters"
            ),
        ));
    }
    Ok(prefix.to_string())
}

pub(crate) fn validate_region(region: &str) -> Result<()> {
    let chars = region.chars().count();
    if chars == 0 || chars > MAX_REGION_CHARS {
        return Err(Error::setting(
            "region",
            format!("{chars} characters; use 1 to {MAX_REGION_CHARS} (the column is VARCHAR(100))"),
        ));
    }
    Ok(())
}

/// A `CLIENT_ID` that names this process: `HOST/PID/RANDOM` — the host name (up to 18
/// characters, printable ASCII other than `/`), the process id and 8 random hexadecimal digits
/// (a new value on every call, so registries of one process differ, and a reused pid does not
/// repeat an id) — at most 36 characters, the width of Spring Integration's `CLIENT_ID` column.
/// The default of every registry and of the `leasehold` command; `leasehold list --holder` and
/// [`LockRegistry::held_by_this_registry`](crate::LockRegistry::held_by_this_registry) find a node's locks by it.
///
/// The host name comes from `/proc/sys/kernel/hostname` (Linux), else the `HOSTNAME` or
/// `COMPUTERNAME` environment variable, else `host`.
pub fn default_client_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_default();
    client_id_for_host(&host)
}

/// [`default_client_id`] for a host name the caller found itself (the `leasehold` command asks
/// `gethostname`): `HOST/PID/RANDOM`, the host cut to 18 printable characters other than `/`.
pub fn client_id_for_host(host: &str) -> String {
    let mut host: String = host
        .trim()
        .chars()
        .filter(|c| c.is_ascii_graphic() && *c != '/')
        .take(18)
        .collect();
    if host.is_empty() {
        host = "host".into();
    }
    let random = uuid::Uuid::new_v4().simple().to_string();
    let id = format!("{host}/{}/{}", std::process::id(), &random[..8]);
    id.chars().take(36).collect()
}

pub(crate) fn validate_client_id(id: String) -> Result<String> {
    if id.is_empty() || id.len() > 36 || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::setting(
            "client_id",
            format!("{id:?}: use 1 to 36 printable ASCII characters, e.g. a UUID"),
        ));
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_that_could_inject_sql_are_rejected() {
        for bad in [
            "INT_; DROP TABLE x",
            "1INT_",
            "INT-",
            "a.b.c",
            "\"INT_\"",
            "INT_ ",
        ] {
            assert!(validate_prefix(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["INT_", "", "app_", "myschema.INT_", "_x9"] {
            assert!(validate_prefix(good).is_ok(), "{good:?} rejected");
        }
    }

    #[test]
    fn regions_and_client_ids_are_bounded() {
        assert!(validate_region("").is_err());
        assert!(validate_region(&"r".repeat(101)).is_err());
        assert!(validate_region(&"é".repeat(100)).is_ok());
        assert!(validate_client_id(String::new()).is_err());
        assert!(validate_client_id("x".repeat(37)).is_err());
        assert!(validate_client_id("node 1".into()).is_err());
        assert!(validate_client_id("node-1".into()).is_ok());
        let (first, second) = (default_client_id(), default_client_id());
        assert_ne!(first, second, "each registry gets its own");
        assert_eq!(validate_client_id(first.clone()).ok(), Some(first.clone()));
        let parts: Vec<&str> = first.split('/').collect();
        assert_eq!(parts.len(), 3, "{first}");
        assert_eq!(parts[1], std::process::id().to_string());
        assert_eq!(parts[2].len(), 8);
    }
}
