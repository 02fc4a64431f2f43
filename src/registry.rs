//! The registry: configuration, the handle cache, and the way into a backend.

use crate::backend::{
    CustomQueries, ListenerHandler, ListenerReply, PoolSettings, Statements, Store, TableSettings,
};
use crate::cache::HandleCache;
use crate::error::{Error, Result};
use crate::lease::{callback_thread, KeeperSettings, LeaseLost, LossSink, LostCallback, Renewer};
use crate::lock::{Lingerer, Lock, LockInner};
use crate::meter::Meter;
use crate::wakeups::Wakeups;
use parking_lot::Mutex;
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
/// The default [`RegistryBuilder::linger`].
const DEFAULT_LINGER: Duration = Duration::from_millis(5);
/// The longest [`RegistryBuilder::linger`] accepted.
const MAX_LINGER: Duration = Duration::from_secs(1);
/// The longest region accepted, in characters (the column is `VARCHAR(100)`).
pub const MAX_REGION_CHARS: usize = 100;
/// The longest table prefix accepted: the longest name made from it, `{prefix}LOCK_FLOOR` (the
/// deletion floor beside the table `{prefix}LOCK`), then fits PostgreSQL's 63 characters.
pub const MAX_PREFIX_CHARS: usize = 53;

/// Settings every lock of a registry reads; validated by the builder.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub time_to_live: Duration,
    pub idle_between_tries: Duration,
    pub local_handoff_limit: Option<Duration>,
    /// `false`: every holder takes the lock from the database (a token of its own).
    pub local_handoff: bool,
    /// How long a released lease nobody here queues on is kept for a thread of this registry
    /// that may come for it (see "Linger" in the `lock` module docs); zero: released at once.
    pub linger: Duration,
    /// How long a registry that ended a long turn leaves the key to other instances.
    pub turn_window: Option<Duration>,
    pub operation_timeout: Duration,
    pub keeper: KeeperSettings,
}

impl Settings {
    /// A release followed by a grant within this gap (with no refusal between) continues the
    /// registry's turn: pollers of other instances cannot be expected to have noticed the gap.
    pub fn turn_gap(&self) -> Duration {
        self.turn_window
            .unwrap_or_default()
            .max(self.idle_between_tries * 2)
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
    /// The registry's loss callback, on its own thread (see [`callback_thread`]).
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
    /// Ends the lingers of this registry's locks (see "Linger" in the `lock` module docs).
    pub lingerer: Arc<Lingerer>,
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

/// A set of named distributed locks kept in one table of one database.
///
/// Create one per process (or per component) with a builder from [`LockRegistry::sqlite`],
/// `LockRegistry::postgres` or `LockRegistry::mysql`, share it (it is cheap to clone), and
/// [`obtain`](Self::obtain) locks by name. Dropping the last clone stops the renewal of
/// leases no guard uses; guards still alive keep what they need.
#[derive(Clone)]
pub struct LockRegistry {
    pub(crate) core: Arc<Core>,
    pub(crate) cache: Arc<Mutex<HandleCache>>,
    /// The semaphores in use (see [`crate::semaphore`]).
    pub(crate) semaphores: Arc<Mutex<crate::semaphore::SemaphoreCache>>,
    /// The reader/writer locks in use (see [`crate::rwlock`]).
    pub(crate) rw_locks: Arc<Mutex<crate::rwlock::RwLockCache>>,
}

impl LockRegistry {
    /// A builder for a registry on an SQLite file (created if missing).
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let registry = leasehold::LockRegistry::sqlite(dir.path().join("locks.db"))
    ///     .create_table(true)
    ///     .build()?;
    /// let lock = registry.obtain("nightly-report")?;
    /// let guard = lock.lock()?;
    /// assert!(guard.is_held());
    /// guard.unlock()?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    pub fn sqlite(path: impl AsRef<std::path::Path>) -> RegistryBuilder {
        RegistryBuilder::new(Database::Sqlite(path.as_ref().to_path_buf()))
    }

    /// A builder for a registry on PostgreSQL, e.g.
    /// `postgres://postgres@127.0.0.1:5432/test` (key=value strings work too). With the
    /// `postgres-tls` feature the URL's `sslmode`, `sslrootcert`, `sslcert` and `sslkey` are
    /// honoured as libpq reads them (default `prefer`).
    ///
    /// # A primary and its standbys
    ///
    /// Name every server that may become the primary, and ask for a writable one, in either
    /// form libpq reads:
    ///
    /// ```text
    /// postgres://app@db1:5432,db2:5432/locks?target_session_attrs=read-write&connect_timeout=2
    /// host=db1,db2 port=5432,5432 user=app dbname=locks target_session_attrs=read-write connect_timeout=2
    /// ```
    ///
    /// Every connection leasehold opens — both pools' and the release listener's, at `build()`
    /// and whenever one is replaced — tries the hosts in order, each within the string's
    /// `connect_timeout` (else the registry's [`connect_timeout`](RegistryBuilder::connect_timeout)),
    /// and keeps the first that accepts writes: after a failover, new connections find the
    /// promoted standby with no restart and no configuration change. A connection to a server
    /// that went away, hangs or turned read-only fails its statement (a hung one at the
    /// statement's deadline) and is replaced, with the other idle connections of its pool, by
    /// the next statement's attempt; a background renewal gives an attempt at most half a
    /// renewal period, so that several fit before the lease's deadline. Without
    /// `target_session_attrs=read-write` a connection may land on a standby and every statement
    /// there fails until it is replaced. `load_balance_hosts=random` is honoured too (the hosts
    /// are then tried in a random order within one `connect_timeout`), though a lock table
    /// wants the one primary, in order.
    ///
    /// What a failover does to held leases, waiters and fencing tokens — kept across a
    /// synchronous standby's promotion, not across an asynchronous one's — is in the README's
    /// *High availability* section, measured by `tests/ha.rs`.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn postgres(url: impl Into<String>) -> RegistryBuilder {
        RegistryBuilder::new(Database::Postgres(url.into()))
    }

    /// A builder for a registry on MySQL or MariaDB, e.g. `mysql://root@127.0.0.1:3306/test`.
    /// With the `mysql-tls` feature the URL's `ssl-mode`, `ssl-ca`, `ssl-cert`/`ssl-key` and
    /// `require_ssl` are honoured (default `PREFERRED`).
    ///
    /// # Several servers: Galera, or a primary and its replicas
    ///
    /// List the hosts, each with its port, separated by commas; the user, database and options
    /// are shared:
    ///
    /// ```text
    /// mysql://app@db1:3306,db2:3306,db3:3306/locks
    /// ```
    ///
    /// Every connection leasehold opens (at `build()` and whenever a pooled one is replaced)
    /// tries the hosts in order and keeps the first that accepts writes: it asks each server
    /// for `@@global.read_only` and, on Galera, `wsrep_ready`, so a replica or a node outside
    /// the primary component is passed over. A connection whose server went away, or turned
    /// read-only, or whose Galera node left the primary component (error 1047) is dropped with
    /// the other idle ones of its pool, and the statement is retried on a new connection within
    /// its deadline. On Galera, a statement aborted by a certification conflict (two nodes
    /// granting one key at once) comes back as a deadlock (1213) and is retried like one; with
    /// every registry listing the nodes in the same order they all write through the first
    /// node, and conflicts only come with a failover. What a Galera node's failure does to
    /// leases is in the README's *High availability* section, measured by `tests/ha.rs`.
    #[cfg(feature = "mysql")]
    #[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
    pub fn mysql(url: impl Into<String>) -> RegistryBuilder {
        RegistryBuilder::new(Database::Mysql(url.into()))
    }

    /// The lock for `key`, shared with every other user of that key in this registry.
    ///
    /// `key` is any UTF-8 string of 1 to [`MAX_KEY_BYTES`](crate::MAX_KEY_BYTES) bytes.
    pub fn obtain(&self, key: &str) -> Result<Lock> {
        crate::key::validate_key(key)?;
        let inner = self
            .cache
            .lock()
            .get_or_insert(key, || LockInner::new(key, Arc::clone(&self.core)));
        Ok(Lock::new(inner))
    }

    /// This registry's `CLIENT_ID`.
    pub fn client_id(&self) -> &str {
        &self.core.client_id
    }

    /// This registry's `REGION`.
    pub fn region(&self) -> &str {
        &self.core.region
    }

    /// The lock table's name (prefix + `LOCK`).
    pub fn table(&self) -> &str {
        &self.core.table
    }

    /// `SQLite`, `PostgreSQL` or `MySQL`.
    pub fn backend_name(&self) -> &'static str {
        self.core.store.backend_name()
    }

    /// The SQL this registry runs, with its table name spliced in: the backend's defaults or
    /// the builder's replacements. A starting point for custom statements.
    pub fn statements(&self) -> &Statements {
        self.core.store.statements()
    }

    /// How many lease statements this registry has sent so far.
    pub fn statistics(&self) -> crate::Statistics {
        let mut stats = self.core.store.statistics();
        self.core.meter.add_to(&mut stats);
        stats
    }

    /// The database's clock (UTC), read now, and how long the round trip took. Expiry is always
    /// judged on this clock; compare it with yours to see the skew.
    pub fn database_time(&self) -> Result<(std::time::SystemTime, Duration)> {
        let deadline = std::time::Instant::now() + self.core.settings.operation_timeout;
        let (micros, sent_at, received_at) = self.core.store.database_clock(deadline)?;
        let at = if micros >= 0 {
            std::time::UNIX_EPOCH + Duration::from_micros(micros as u64)
        } else {
            std::time::UNIX_EPOCH - Duration::from_micros(micros.unsigned_abs())
        };
        Ok((at, received_at.duration_since(sent_at)))
    }

    /// How many lock handles the cache holds now.
    pub fn cached_locks(&self) -> usize {
        self.cache.lock().len()
    }
}

impl std::fmt::Debug for LockRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockRegistry")
            .field("backend", &self.backend_name())
            .field("table", &self.core.table)
            .field("region", &self.core.region)
            .field("client_id", &self.core.client_id)
            .finish()
    }
}

/// Configures and builds a [`LockRegistry`]. Every setter names its default.
///
/// ```
/// # fn main() -> leasehold::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// use std::time::Duration;
/// let registry = leasehold::LockRegistry::sqlite(dir.path().join("locks.db"))
///     .prefix("BILLING_")                               // table BILLING_LOCK
///     .region("eu-west")                                // locks of other regions never conflict
///     .time_to_live(Duration::from_secs(30))            // a crashed holder blocks 30 s at most
///     .idle_between_tries(Duration::from_millis(250))   // how often a waiter polls
///     .on_lease_lost(|lost| eprintln!("lost {}: {}", lost.key, lost.reason))
///     .create_table(true)
///     .build()?;
/// assert_eq!(registry.table(), "BILLING_LOCK");
/// # Ok(()) }
/// ```
#[must_use = "a builder does nothing until build() is called"]
pub struct RegistryBuilder {
    pub(crate) database: Database,
    time_to_live: Duration,
    idle_between_tries: Duration,
    cache_capacity: usize,
    client_id: Option<String>,
    region: String,
    pub(crate) prefix: String,
    renewal: bool,
    renew_every: Option<Duration>,
    local_handoff_limit: Option<Duration>,
    local_handoff: bool,
    linger: Duration,
    turn_window: Option<Option<Duration>>,
    operation_timeout: Duration,
    connect_timeout: Duration,
    pool_size: u32,
    renewal_pool_size: u32,
    idle_connection_timeout: Duration,
    create_table: bool,
    read_only: bool,
    notifications: bool,
    prepared_statements: Option<bool>,
    listener_url: Option<String>,
    custom: CustomQueries,
    on_lost: Option<LostCallback>,
    metrics_key_labels: bool,
}

impl RegistryBuilder {
    fn new(database: Database) -> Self {
        RegistryBuilder {
            database,
            time_to_live: Duration::from_secs(10),
            idle_between_tries: Duration::from_millis(100),
            cache_capacity: 100_000,
            client_id: None,
            region: "DEFAULT".into(),
            prefix: "INT_".into(),
            renewal: true,
            renew_every: None,
            local_handoff_limit: Some(Duration::from_secs(1)),
            local_handoff: true,
            linger: DEFAULT_LINGER,
            turn_window: None,
            operation_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            pool_size: 8,
            renewal_pool_size: 2,
            idle_connection_timeout: Duration::from_secs(60),
            create_table: false,
            read_only: false,
            notifications: true,
            prepared_statements: None,
            listener_url: None,
            custom: CustomQueries::default(),
            on_lost: None,
            metrics_key_labels: false,
        }
    }

    /// How long a lease lasts without renewal. Defaults to 10 s. A crashed holder blocks its
    /// key at most this long; the renewal thread renews well before it runs out. Must be within
    /// [`MIN_TIME_TO_LIVE`]..=[`MAX_TIME_TO_LIVE`].
    pub fn time_to_live(mut self, ttl: Duration) -> Self {
        self.time_to_live = ttl;
        self
    }

    /// How long a waiter sleeps between database attempts while another instance holds the
    /// lock. Defaults to 100 ms. Each sleep is this ± 25 % at random, so that a waiter does
    /// not keep the phase of another instance's polls of the same interval (Spring's, say) and
    /// lose every release to it. A release by another thread of this registry wakes waiters at
    /// once; a release by another instance is seen at the next attempt (about half this on
    /// average) unless wake-ups tell sooner. While instances that only poll (Spring
    /// Integration's) take turns with a key (see [`local_handoff_limit`](Self::local_handoff_limit)),
    /// a waiter polls every quarter of this (at least 1 ms), unless its wake-ups see their
    /// releases (MySQL's, when `notifications` are on, while the registry waits for at most
    /// 16 keys at once: beyond that some keys have no watcher, and every waiter polls as
    /// without one): such an instance announces nothing and takes the key again a few
    /// milliseconds after its unlock. Must be within
    /// 1 ms..=[`MAX_IDLE_BETWEEN_TRIES`].
    pub fn idle_between_tries(mut self, idle: Duration) -> Self {
        self.idle_between_tries = idle;
        self
    }

    /// How many lock handles the registry caches. Defaults to 100 000. Handles in use are never
    /// evicted (the cache grows past this while they are in use). Must be at least 1.
    pub fn cache_capacity(mut self, capacity: usize) -> Self {
        self.cache_capacity = capacity;
        self
    }

    /// This registry's `CLIENT_ID`: 1 to 36 printable ASCII characters. Defaults to
    /// [`default_client_id`]: `HOST/PID/RANDOM`, so that the table tells operators which host
    /// and process hold a lock, with a fresh random part per registry. Two registries must never
    /// share one: the table tells holders apart by it.
    pub fn client_id(mut self, client_id: impl Into<String>) -> Self {
        self.client_id = Some(client_id.into());
        self
    }

    /// The `REGION` (1 to 100 characters) the locks live in: locks of different regions never
    /// conflict. Defaults to `DEFAULT`, as Spring's.
    pub fn region(mut self, region: impl Into<String>) -> Self {
        self.region = region.into();
        self
    }

    /// The table name prefix; the table is `{prefix}LOCK`. Defaults to `INT_` (Spring's). It is
    /// spliced into SQL, so it must be letters, digits and `_`, not starting with a digit,
    /// optionally `schema.` first; at most [`MAX_PREFIX_CHARS`] characters.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Whether the registry's renewal thread renews every lease in the background. Defaults to `true`. With
    /// `false` a lease lasts its time-to-live unless renewed by hand
    /// ([`LockGuard::renew`](crate::LockGuard::renew)); loss is still reported at the deadline.
    pub fn renewal(mut self, enabled: bool) -> Self {
        self.renewal = enabled;
        self
    }

    /// How long after a successful renewal (or the grant) the next one is sent. Defaults to a
    /// third of each lease's time-to-live, which leaves two more attempts before it runs out.
    /// Must be at most half of every time-to-live used (so one failed renewal leaves time for
    /// another).
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// How long a run of local handoffs may keep a database grant before the holder releases
    /// it to the database and local waiters hold off for one `idle_between_tries`, giving
    /// other instances a turn. Defaults to `Some(1 s)`; `None` hands off locally without limit
    /// (fastest, but other instances can starve under continuous local contention). Every
    /// thread that queued before the turn's grant still gets one hold of it: a turn outlasts
    /// the limit by at most one hold per such thread.
    ///
    /// While instances that only poll take turns with a key, this registry's turns with it
    /// last one `idle_between_tries` (at most the limit): for 10 s after one of its
    /// grants had to insert the key's row although this registry had released it before, or
    /// although an attempt of the same wait had found the row held. Leasehold keeps released
    /// rows; Spring Integration's `JdbcLockRegistry` deletes its row on unlock, so a missing
    /// row shows that such an instance held the key meanwhile. A turn begun by a grant that
    /// inserted the row without either sign (a new key, a row deleted while nobody here
    /// looked) is as short, that turn only: a registry alone with a new key whose threads
    /// contend for it steps aside once, for `turn_window`, `idle_between_tries` in. A turn of
    /// one poll interval ends just before the next poll of a polling instance that just had
    /// the key, so that another polling instance usually gets the next one (README,
    /// *Guarantees*, "Fairness"). On
    /// PostgreSQL and MySQL with the default statements (a replacement `acquire_sql`, and
    /// SQLite, never shorten turns); a manual `DELETE` of released rows shortens them for 10 s.
    pub fn local_handoff_limit(mut self, limit: Option<Duration>) -> Self {
        self.local_handoff_limit = limit;
        self
    }

    /// Whether a release passes the lock straight to a waiting thread of this registry, keeping
    /// the database grant (and its fencing token). Defaults to `true`: the handoff costs no
    /// statement, and the local holders of one grant are ordered by this registry's mutex.
    ///
    /// With `false` every holder takes the lock from the database and gets a **fencing token of
    /// its own**, so a resource that refuses tokens below the largest it has seen also refuses a
    /// late write of the previous *local* holder (with `true` both carry the same token). The
    /// cost: each handoff between threads is a release and an acquire (two commits instead of
    /// none), and another instance may take the lock in between.
    pub fn local_handoff(mut self, enabled: bool) -> Self {
        self.local_handoff = enabled;
        self
    }

    /// How long a lease released while no thread of this registry queues on it is kept, so that
    /// a thread of this registry that comes for the key within that while takes it without a
    /// statement (the same grant and fencing token, like a local handoff). Defaults to 5 ms (on PostgreSQL and MariaDB, a few
    /// round trips: shorter lingers ran out before the next local thread came under the load
    /// of `benches/contention.rs`); `Duration::ZERO` turns it off (every such release runs its statement before `unlock()`
    /// returns); at most 1 s.
    ///
    /// It applies only to a key this registry has shown it comes back to: one whose last
    /// database grant was asked for within `linger` of this registry's own release of it, by
    /// another of its threads, with no attempt refused in between (a hot key: several threads
    /// of this registry share it; not one thread locking it in a loop, whose row stays free
    /// between its holds, nor a key passed back and forth with another instance). A linger that runs out unused releases the key (on a thread of the registry)
    /// and makes it cold again, so a key locked now and then is released at once as without
    /// it. While a key lingers it is still held on the database (its lease is renewed as
    /// usual), so another instance waits for it up to `linger` longer, and a thread of this
    /// registry re-taking it continues the current turn: it counts against
    /// `local_handoff_limit`, and a turn kept going by lingers ends with the turn window (as one
    /// with local waiters does), so other instances, pollers too, get the key within the
    /// bound of [`turn_window`](Self::turn_window). No linger with `local_handoff(false)`,
    /// for `unlock_keeping_for`, or for semaphores and reader/writer locks.
    ///
    /// What it changes for `unlock()`: a lingering release runs after `unlock()` returned, so
    /// its outcome cannot be returned: a failed release is logged (`warn`) and the row runs out
    /// after its time-to-live, as after a failed `unlock()`; a loss found then goes to the loss
    /// callback and the meter. `unlock()` still returns `Err(LeaseLost)` for a lease lost
    /// before it. Dropping the registry (its last handle and every `Lock` of the key) releases
    /// a lingering key at once; a process that exits without dropping them leaves it to its
    /// time-to-live if it exits within `linger` of the unlock.
    pub fn linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    /// How long a registry whose turn with a key ended (it held the key for
    /// `local_handoff_limit`, through local handoffs or by taking it again at once after each
    /// release) stays away from that key, so that other instances get it — including those that
    /// only poll, like Spring Integration's `JdbcLockRegistry` (every 100 ms by default). The
    /// release that ends a turn does not wake other instances' waiters (no `NOTIFY`, no release
    /// board slot; MySQL keeps the key's named lock a quarter second longer): everyone polls,
    /// on equal footing — and for the first half of the window the released row is *reserved*
    /// for instances that only poll: leasehold's grant statement leaves it alone (the release
    /// set its `CREATED_DATE` to the end of the reservation), Spring's takes it. The registry
    /// that ended its turn stays away for the whole window, so other leasehold instances have
    /// its second half. Defaults to `Some(2 × idle_between_tries)`, which is longer than one poll
    /// period plus a round trip when other instances poll at the same interval; raise it to
    /// twice the longest poll period in the fleet. `None` ends a turn with a plain release
    /// (notified waiters wake, and this registry competes again at once): the fastest, but
    /// instances that only poll can starve under continuous contention.
    ///
    /// The cost: under continuous contention the key is free for up to this long once per
    /// `local_handoff_limit`, until a poller takes it. Handoffs between instances that keep
    /// the key busy without a break count as one turn too (PostgreSQL's notification and
    /// SQLite's release board carry the turn's age; every release also stores it in the row,
    /// as the epoch + the age in `EXPIRED_AFTER`, where MySQL's woken watcher reads it), so about
    /// one such handoff per `local_handoff_limit` waits for a poll. Uncontended locks and a single long hold never end a turn and pay nothing.
    pub fn turn_window(mut self, window: Option<Duration>) -> Self {
        self.turn_window = Some(window);
        self
    }

    /// How long an operation without a caller deadline (`lock()`'s attempts, `try_lock()`,
    /// release, manual renew) keeps retrying transient database failures before it returns
    /// [`Error::Timeout`]. Defaults to 5 s; at most [`MAX_TIMEOUT`].
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// How long `build()` waits for the first connection. Defaults to 5 s; at most
    /// [`MAX_TIMEOUT`].
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The most connections in the main pool, used by acquires, releases and manual renewals.
    /// Defaults to 8. Connections open when needed and close after
    /// [`idle_connection_timeout`](Self::idle_connection_timeout), so this bounds a burst, not
    /// what the process keeps open. Background renewals use a separate pool
    /// ([`renewal_pool_size`](Self::renewal_pool_size)), so a full main pool never makes a held
    /// lease expire. Must be at least 1.
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size;
        self
    }

    /// The most connections in the renewal pool, used only by background renewals. Defaults to
    /// 2. A registry renews its leases one batch statement at a time, so one connection is busy
    /// at most; the second lets the next attempt go out at once while an attempt that got no
    /// answer in time still holds the first (a connection given up at a deadline is discarded
    /// and replaced, which takes a moment). Raise it if renewals log that they did not
    /// complete in time while the server is healthy. Must be at least 1.
    pub fn renewal_pool_size(mut self, size: u32) -> Self {
        self.renewal_pool_size = size;
        self
    }

    /// How long a pooled connection may stay unused before it is closed. Defaults to 60 s.
    /// Pools open connections only when a statement needs one, so a process holding one lock
    /// keeps one renewal connection open (renewals reuse it every third of the time-to-live),
    /// plus the main connection until it has been idle this long. The pools check every 30 s,
    /// so a connection closes up to 30 s after the timeout. PostgreSQL's release listener
    /// closes its connection when no thread has waited for this long. On SQLite a connection
    /// is an open file and its page cache; the main connection used last stays parked for the
    /// next statement and is looked at every half timeout (at most 15 s), so it closes within
    /// 1.5 × the timeout (30 s after it for long ones). Must be within 1 ms..=[`MAX_TIMEOUT`].
    pub fn idle_connection_timeout(mut self, timeout: Duration) -> Self {
        self.idle_connection_timeout = timeout;
        self
    }

    /// Create the table (and nothing else) if it does not exist, from the shipped DDL. Defaults
    /// to `false`: the table is checked and a missing table or column is reported with the
    /// file or statement to run.
    pub fn create_table(mut self, create: bool) -> Self {
        self.create_table = create;
        self
    }

    /// SQLite: open the database file read-only. Defaults to `false`. For inspection by a user
    /// who may only read the file ([`holder`](LockRegistry::holder),
    /// [`listing`](LockRegistry::listing), the semaphore and reader/writer status): a missing
    /// file is not created, the journal mode is not set, and no release board is opened;
    /// taking or releasing a lock fails. The database's directory must still be writable for
    /// SQLite to create its `-wal` and `-shm` files, unless another process has the database
    /// open. Cannot be combined with [`create_table(true)`](Self::create_table). Ignored by
    /// the other databases.
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Whether waiters are woken when another instance releases a lock, instead of only at
    /// their next poll. Defaults to `true`. Polling every `idle_between_tries` stays on as the
    /// safety net, and a wake-up never grants anything: the waiter tries the row at once, and
    /// the row decides. Leader election standbys are woken the same way. What it costs:
    ///
    /// - **PostgreSQL** (`LISTEN`/`NOTIFY`): one extra connection per registry, outside the
    ///   pools, opened when a thread of this registry waits for a lock held elsewhere,
    ///   subscribed only while one does, closed after
    ///   [`idle_connection_timeout`](Self::idle_connection_timeout) without a waiter. Releases
    ///   notify whatever this setting says.
    /// - **SQLite** (Linux): a 32 KiB file beside the database, `<database>-leasehold`, mapped
    ///   by every process that uses the database (the *release board*; its directory must be
    ///   writable, as for SQLite's own `-wal` file), and a listener thread per registry that
    ///   waits on it only while a thread waits. Elsewhere, or when the file cannot be opened
    ///   (a warning says so), waiters poll.
    /// - **MySQL / MariaDB** (named locks, `GET_LOCK`): while this registry holds locks, one
    ///   extra connection holding a named lock per held key; while its threads wait, one
    ///   connection per waited-for key (at most 16; beyond, waiters poll), each blocked in
    ///   `GET_LOCK`. Off, this registry neither takes named locks nor watches them.
    pub fn notifications(mut self, enabled: bool) -> Self {
        self.notifications = enabled;
        self
    }

    /// PostgreSQL: whether pooled connections prepare each statement once, as a named
    /// statement, and reuse it (which saves the server parsing and planning it on every call),
    /// or send every statement unnamed (parsed and planned on each call, in the same single
    /// round trip), which works through a transaction-mode pooler (PgBouncer
    /// `pool_mode = transaction`, RDS Proxy, Supavisor, pgcat) that hands each statement to
    /// whichever server connection is free, where a named statement is missing or is another
    /// client's.
    ///
    /// Unset (the default), each connection decides when it opens: named statements when it
    /// goes straight to the server — the cancel key the server gave it names the server
    /// process that serves it (`pg_backend_pid()`), which a pooler's keys never do — and
    /// unnamed ones otherwise, one round trip per new connection. Should a named statement
    /// still fail as it does behind a transaction-mode pooler (`26000`, `42P05`), the
    /// registry sends every statement unnamed from then on (the failed one again) and logs
    /// a warning once. `false` forces unnamed statements (a session-mode pooler gets them
    /// too, unless forced `true`); `true` forces named ones, for connections straight to the
    /// server or through a session-mode pooler only: through a transaction-mode pooler
    /// statements fail (`26000`, `42P05`, named in the error) or, worse, a statement name
    /// another client prepared on that server connection runs that client's statement with
    /// this one's parameters. Ignored by the other databases.
    pub fn prepared_statements(mut self, enabled: bool) -> Self {
        self.prepared_statements = Some(enabled);
        self
    }

    /// PostgreSQL: where the release listener connects, when the registry's URL goes through a
    /// transaction-mode pooler. `LISTEN` needs a session of its own: through such a pooler it
    /// succeeds, but the server connection goes back to the pool and its notifications are
    /// dropped. Give the server's own address here (or a session-mode pool's); it is checked
    /// by `build()` like the registry's URL (unless `notifications(false)`) — except that a
    /// server without a free slot (`too many clients`) only logs a warning: waiters poll until
    /// the listener gets a slot, so a fleet larger than the server's slots still runs — and costs one
    /// connection per registry while a thread of it waits (see
    /// [`notifications`](Self::notifications)). Without it, the
    /// listener uses the registry's URL and checks once that its own `LISTEN` hears a
    /// notification sent from another connection; if it does not, it says so in the log and
    /// waiters only poll. Ignored by the other databases.
    pub fn listener_url(mut self, url: impl Into<String>) -> Self {
        self.listener_url = Some(url.into());
        self
    }

    /// Replaces the acquire statement. It gets parameters 1–4 and 6 (see [`Statements`]) and must
    /// return one row with the fencing token when granted, none otherwise; a second, boolean
    /// column may say whether the grant inserted the row (there was none), as PostgreSQL's
    /// default does (it shortens turns while polling instances take part; see
    /// [`local_handoff_limit`](Self::local_handoff_limit)). Checked against the table by
    /// `build()`; [`LockRegistry::statements`] shows the default to start from.
    pub fn acquire_sql(mut self, sql: impl Into<String>) -> Self {
        self.custom.acquire = Some(sql.into());
        self
    }

    /// Replaces the renew statement (parameters 1–5; one affected row means renewed).
    pub fn renew_sql(mut self, sql: impl Into<String>) -> Self {
        self.custom.renew = Some(sql.into());
        self
    }

    /// Replaces the release statement (parameters 1–5; one affected row means released).
    pub fn release_sql(mut self, sql: impl Into<String>) -> Self {
        self.custom.release = Some(sql.into());
        self
    }

    /// Called once for every lease of this registry that is lost. Defaults to none (losses
    /// are logged at `warn`).
    ///
    /// It runs on a thread of this registry's own, one loss after another, never on a thread
    /// that renews or watches leases: a slow callback (a webhook, a log flush) cannot delay the
    /// renewal or the loss report of any lease, of this registry or another. By the time it
    /// runs, the lease is already marked lost (`is_held()` is false) and its loss channels have
    /// fired; a holder that must stop at once should watch its guard's
    /// [`loss_channel`](crate::LockGuard::loss_channel), not wait for the callback. Keep it
    /// quick anyway: a callback that blocks delays the later callbacks of this registry. A
    /// panic in it is caught and logged.
    pub fn on_lease_lost(mut self, callback: impl Fn(&LeaseLost) + Send + Sync + 'static) -> Self {
        self.on_lost = Some(Arc::new(callback));
        self
    }

    /// Whether the per-key metrics (grants, contended tries, losses, wait and hold times) carry
    /// a `key` label with the lock's name (feature `metrics`; see the README's "Metrics").
    /// Off by default: a series per lock name can be more than a metrics backend wants.
    /// Without the `metrics` feature this changes nothing.
    pub fn metrics_key_labels(mut self, enabled: bool) -> Self {
        self.metrics_key_labels = enabled;
        self
    }

    /// Validates the settings, connects, checks (or creates) the table.
    pub fn build(self) -> Result<LockRegistry> {
        let settings = self.settings()?;
        let table = validate_prefix(&self.prefix)? + "LOCK";
        #[cfg(feature = "mysql")]
        if matches!(self.database, Database::Mysql(_)) && table.rsplit('.').next() == Some("LOCK") {
            return Err(Error::setting(
                "prefix",
                "an empty prefix names the table LOCK, a reserved word in MySQL and MariaDB: use \
                 a prefix such as INT_ (the default)",
            ));
        }
        validate_region(&self.region)?;
        let client_id = match self.client_id {
            Some(id) => validate_client_id(id)?,
            None => default_client_id(),
        };
        if self.cache_capacity == 0 {
            return Err(Error::setting("cache_capacity", "must be at least 1"));
        }
        if self.pool_size == 0 {
            return Err(Error::setting("pool_size", "must be at least 1"));
        }
        if self.renewal_pool_size == 0 {
            return Err(Error::setting(
                "renewal_pool_size",
                "must be at least 1: background renewals need a connection",
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
        check_timeout("connect_timeout", self.connect_timeout)?;
        let pool = PoolSettings {
            pool_size: self.pool_size,
            renewal_pool_size: self.renewal_pool_size,
            idle_timeout: self.idle_connection_timeout,
            connect_timeout: self.connect_timeout,
            operation_timeout: self.operation_timeout,
            prepared_statements: self.prepared_statements,
            listener_url: self.listener_url,
        };
        let table_settings = TableSettings {
            table: table.clone(),
            region: self.region.clone(),
            client_id: client_id.clone(),
            create_table: self.create_table,
            read_only: self.read_only,
            custom: self.custom,
            notifications: self.notifications,
        };
        let store: Arc<dyn Store> = match self.database {
            #[cfg(feature = "sqlite")]
            Database::Sqlite(path) => crate::backend::sqlite::open(path, &pool, &table_settings)?,
            #[cfg(feature = "postgres")]
            Database::Postgres(url) => {
                crate::backend::postgres::open(&url, &pool, &table_settings)?
            }
            #[cfg(feature = "mysql")]
            Database::Mysql(url) => crate::backend::mysql::open(&url, &pool, &table_settings)?,
        };
        let (wakeups, subscription_requests) = Wakeups::new();
        let renewer = Renewer::new(Arc::downgrade(&store), self.renewal_pool_size as usize);
        let on_lost = match self.on_lost {
            Some(callback) => Some(callback_thread(callback).map_err(|e| {
                Error::setting(
                    "on_lease_lost",
                    format!("could not start the thread that runs the callback: {e}"),
                )
            })?),
            None => None,
        };
        let meter = Arc::new(Meter::new(&table, &self.region, self.metrics_key_labels));
        let core = Arc::new(Core {
            lingerer: Arc::default(),
            meter,
            renewer,
            store,
            settings,
            on_lost,
            client_id,
            region: self.region,
            table,
            wakeups,
        });
        if self.notifications {
            let weak = Arc::downgrade(&core);
            let handler: ListenerHandler = Arc::new(move |event| {
                weak.upgrade()
                    .map_or(ListenerReply::Stop, |core| core.wakeups.handle(event))
            });
            if core
                .store
                .listen_for_releases(handler, subscription_requests)
            {
                core.wakeups.enable(core.store.listener_watches_keys());
            }
        }
        Ok(LockRegistry {
            core,
            cache: Arc::new(Mutex::new(HandleCache::new(self.cache_capacity))),
            semaphores: Arc::default(),
            rw_locks: Arc::default(),
        })
    }

    fn settings(&self) -> Result<Settings> {
        if self.idle_between_tries < Duration::from_millis(1)
            || self.idle_between_tries > MAX_IDLE_BETWEEN_TRIES
        {
            return Err(Error::setting(
                "idle_between_tries",
                format!(
                    "{:?} is outside 1ms..={MAX_IDLE_BETWEEN_TRIES:?}; zero would spin on the \
                     database",
                    self.idle_between_tries
                ),
            ));
        }
        check_timeout("operation_timeout", self.operation_timeout)?;
        if self.renew_every.is_some_and(|every| every.is_zero()) {
            return Err(Error::setting("renew_every", "must be longer than zero"));
        }
        if let Some(limit) = self
            .local_handoff_limit
            .filter(|limit| *limit > MAX_TIME_TO_LIVE)
        {
            return Err(Error::setting(
                "local_handoff_limit",
                format!("{limit:?} is longer than {MAX_TIME_TO_LIVE:?}; use None for no limit"),
            ));
        }
        if self.linger > MAX_LINGER {
            return Err(Error::setting(
                "linger",
                format!(
                    "{:?} is longer than {MAX_LINGER:?}: other instances wait this much longer \
                     for a key this registry keeps; a few milliseconds at most is the point",
                    self.linger
                ),
            ));
        }
        let settings = Settings {
            time_to_live: self.time_to_live,
            linger: self.linger,
            idle_between_tries: self.idle_between_tries,
            local_handoff_limit: self.local_handoff_limit,
            local_handoff: self.local_handoff,
            turn_window: self
                .turn_window
                .unwrap_or(Some(self.idle_between_tries * 2)),
            operation_timeout: self.operation_timeout,
            keeper: KeeperSettings {
                renew: self.renewal,
                renew_every: self.renew_every,
            },
        };
        settings.check_ttl("time_to_live", self.time_to_live)?;
        Ok(settings)
    }
}

/// A timeout must be above zero and at most [`MAX_TIMEOUT`].
fn check_timeout(setting: &'static str, timeout: Duration) -> Result<()> {
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

fn validate_region(region: &str) -> Result<()> {
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
/// [`LockRegistry::held_by_this_registry`] find a node's locks by it.
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

fn validate_client_id(id: String) -> Result<String> {
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
