//! The registry: the facade that validates a configuration, builds the shared [`Core`] on a
//! backend, and hands out the primitives (locks here; semaphores, reader/writer locks and
//! administration in their own modules).

mod admin;
mod primitives;

use crate::backend::{
    CustomQueries, ListenerHandler, ListenerReply, PoolSettings, Statements, Store, TableSettings,
};
use crate::cache::HandleCache;
use crate::core::{
    check_pool_size, check_timeout, validate_client_id, validate_prefix, validate_region, Core,
    Database, Settings,
};
pub use crate::core::{
    client_id_for_host, default_client_id, CustomSql, Tuning, MAX_IDLE_BETWEEN_TRIES, MAX_LINGER,
    MAX_POOL_SIZE, MAX_PREFIX_CHARS, MAX_REGION_CHARS, MAX_TIMEOUT, MAX_TIME_TO_LIVE,
    MIN_TIME_TO_LIVE,
};
use crate::error::{Error, Result};
use crate::lease::{callback_thread, KeeperSettings, LeaseLost, LostCallback, Renewer};
use crate::lock::{Lingerer, Lock, LockInner, LockSet};
use crate::meter::Meter;
use crate::wakeups::Wakeups;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

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
    /// Ends the lingers of this registry's locks (see "Linger" in the `lock` module docs).
    lingerer: Arc<Lingerer>,
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
    /// synchronous standby's promotion, not across an asynchronous one's — is in `DESIGN.md`
    /// (*Failover*), checked by `tests/ha.rs`.
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
    /// leases is checked by `tests/ha.rs` (see `DESIGN.md`, *Failover*).
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
        let inner = self.cache.lock().get_or_insert(key, || {
            LockInner::new(key, Arc::clone(&self.core), &self.lingerer).tracked()
        });
        Ok(Lock::new(inner))
    }

    /// The keys `keys` held together, all or none (see [`LockSet`]): taken in their byte
    /// order whatever order they come in (a key given twice counts once), so that threads and
    /// instances that want overlapping sets never deadlock. `Err(InvalidSetting)` for no key
    /// or an invalid one.
    pub fn lock_set<K: AsRef<str>>(&self, keys: impl IntoIterator<Item = K>) -> Result<LockSet> {
        let locks = keys
            .into_iter()
            .map(|key| self.obtain(key.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        LockSet::new(locks)
    }

    /// Closes the registry, from any thread: every call of this registry's threads that waits
    /// for a lock, a permit or a side of a reader/writer lock (`lock()`, `try_lock_for`,
    /// `acquire()`, `read()`, `write()`, …) returns [`Error::Closed`] at once, and so does every
    /// later one. Locks, permits and reader/writer holds already held stay held — a holder is
    /// never cut off in the middle of its work — and are released as their guards go (their
    /// renewal goes on until then); dropping the registry and its handles afterwards ends its
    /// threads. A service that shuts down calls it, then lets its threads unwind.
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let path = dir.path().join("locks.db");
    /// use leasehold::{Error, LockRegistry};
    /// let holder = LockRegistry::sqlite(&path).create_table(true).build()?;
    /// let held = holder.obtain("job")?.lock()?;
    ///
    /// let registry = std::sync::Arc::new(LockRegistry::sqlite(&path).build()?);
    /// let waiter = {
    ///     let registry = std::sync::Arc::clone(&registry);
    ///     std::thread::spawn(move || registry.obtain("job")?.lock().map(drop))
    /// };
    /// # std::thread::sleep(std::time::Duration::from_millis(50));
    /// registry.close();                              // the waiting lock() returns at once
    /// assert!(matches!(waiter.join().unwrap(), Err(Error::Closed)));
    /// held.unlock()?;
    /// # Ok(()) }
    /// ```
    pub fn close(&self) {
        self.core.close();
    }

    /// Remembers `waitable` so that [`close`](Self::close) wakes it (the leader election's
    /// agent).
    pub(crate) fn track(&self, waitable: std::sync::Weak<dyn crate::wakeups::Nudge>) {
        self.core.track(waitable);
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

impl Drop for LockRegistry {
    /// Waits (up to `operation_timeout`) until every acquire whose outcome was unknown has
    /// been resolved: a process that ends right after dropping its registry leaves no row
    /// held by nobody.
    fn drop(&mut self) {
        self.core.finish_resolutions();
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
    client_id: Option<String>,
    region: String,
    pub(crate) prefix: String,
    renewal: bool,
    renew_every: Option<Duration>,
    operation_timeout: Duration,
    connect_timeout: Duration,
    pool_size: u32,
    create_table: bool,
    read_only: bool,
    notifications: bool,
    prepared_statements: Option<bool>,
    listener_url: Option<String>,
    custom: CustomSql,
    on_lost: Option<LostCallback>,
    tuning: Tuning,
}

impl RegistryBuilder {
    fn new(database: Database) -> Self {
        RegistryBuilder {
            database,
            time_to_live: Duration::from_secs(10),
            idle_between_tries: Duration::from_millis(100),
            client_id: None,
            region: "DEFAULT".into(),
            prefix: "INT_".into(),
            renewal: true,
            renew_every: None,
            operation_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            pool_size: 8,
            create_table: false,
            read_only: false,
            notifications: true,
            prepared_statements: None,
            listener_url: None,
            custom: CustomSql::default(),
            on_lost: None,
            tuning: Tuning::default(),
        }
    }

    /// How long a lease lasts without renewal. Defaults to 10 s. A crashed holder blocks its
    /// key at most this long; the renewal thread renews well before it runs out. Must be within
    /// [`MIN_TIME_TO_LIVE`]..=[`MAX_TIME_TO_LIVE`].
    pub fn time_to_live(mut self, ttl: Duration) -> Self {
        self.time_to_live = ttl;
        self
    }

    /// The longest a waiter goes without a database attempt while another instance holds the
    /// lock. Defaults to 100 ms (Spring Integration's `idleBetweenTries`). Each sleep is a
    /// random time between half of this and this, so that a waiter does not keep the phase of
    /// another instance's polls of the same interval and lose every release to it. A release
    /// by another thread of this registry wakes waiters at once; a release by another instance
    /// is seen at the next attempt unless a release wake-up (see
    /// [`notifications`](Self::notifications)) tells sooner. It also sets the fair turns
    /// between instances: a release that ends a turn reserves the row for twice this and the
    /// registry stays away for three times this (see [`Tuning`]). Must be within
    /// 1 ms..=[`MAX_IDLE_BETWEEN_TRIES`].
    pub fn idle_between_tries(mut self, idle: Duration) -> Self {
        self.idle_between_tries = idle;
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
    /// [`Tuning::idle_connection_timeout`], so this bounds a burst, not
    /// what the process keeps open. Background renewals use a separate pool
    /// ([`Tuning::renewal_pool_size`]), so a full main pool never makes a held lease expire.
    /// Must be within 1..=[`MAX_POOL_SIZE`].
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size;
        self
    }

    /// Create what is missing of the shipped DDL ([`table_ddl`](Self::table_ddl)): the lock
    /// table, its deletion floor (a table and a trigger), the semaphore table and the waiting
    /// line; nothing that exists is changed. Defaults to `false`: the table is checked and a
    /// missing table or column is reported with the file or statement to run, and without the
    /// floor or the line the registry works without them (and says so in its log).
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
    ///   [`Tuning::idle_connection_timeout`] without a waiter. Releases
    ///   notify whatever this setting says.
    /// - **SQLite** (Linux): a 32 KiB file beside the database, `<database>-leasehold`, mapped
    ///   by every process that uses the database (the *release board*; its directory must be
    ///   writable, as for SQLite's own `-wal` file). A thread waiting in `lock()` sleeps on
    ///   its key's slot of the board, which a release in another process wakes directly; a
    ///   listener thread per registry waits on the board only while one of its semaphores,
    ///   reader/writer locks or elections waits. Elsewhere, or when the file cannot be opened
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

    /// Replaces some of the lease statements; a `None` field keeps the default. Each is
    /// checked against the table by `build()`, and [`LockRegistry::statements`] shows the
    /// defaults to start from:
    ///
    /// - `acquire` gets parameters 1–4 and 6 (see [`Statements`]) and must return one row with
    ///   the fencing token when granted, none otherwise (a second column is allowed and
    ///   ignored);
    /// - `renew` gets parameters 1–5; one affected row means renewed;
    /// - `release` gets parameters 1–5; one affected row means released. Parameter 4 is the
    ///   reservation of a release that ends a turn in µs (zero otherwise; see [`Tuning`]).
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let path = dir.path().join("locks.db");
    /// use leasehold::{CustomSql, LockRegistry};
    /// let defaults = LockRegistry::sqlite(&path).create_table(true).build()?.statements().clone();
    /// let registry = LockRegistry::sqlite(&path)
    ///     .custom_sql(CustomSql { renew: Some(defaults.renew), ..CustomSql::default() })
    ///     .build()?;
    /// # drop(registry);
    /// # Ok(()) }
    /// ```
    pub fn custom_sql(mut self, sql: CustomSql) -> Self {
        self.custom = sql;
        self
    }

    /// Called once for every lease of this registry that is lost. Defaults to none (losses
    /// are logged at `warn`). Only grants count: a reader/writer lock's writer that loses its
    /// claim while it still waits for readers (its process paused past the time-to-live) was
    /// granted nothing, claims again, and no callback runs.
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

    /// The tuning of the mechanisms behind the locks (handoffs, lingers, turns, pools). Defaults
    /// to [`Tuning::default`]; each field's default and range are in [`Tuning`]'s table.
    pub fn tuning(mut self, tuning: Tuning) -> Self {
        self.tuning = tuning;
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
        check_pool_size("pool_size", self.pool_size)?;
        check_timeout("connect_timeout", self.connect_timeout)?;
        if self
            .listener_url
            .as_ref()
            .is_some_and(|url| url.trim().is_empty())
        {
            return Err(Error::setting(
                "listener_url",
                "is empty: give the server's own address, or leave it unset to listen through \
                 the registry's URL",
            ));
        }
        let tuning = self.tuning;
        let pool = PoolSettings {
            pool_size: self.pool_size,
            renewal_pool_size: tuning.renewal_pool_size,
            idle_timeout: tuning.idle_connection_timeout,
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
            custom: CustomQueries {
                acquire: self.custom.acquire,
                renew: self.custom.renew,
                release: self.custom.release,
            },
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
        let renewer = Renewer::new(Arc::downgrade(&store), tuning.renewal_pool_size as usize);
        let on_lost = match self.on_lost {
            Some(callback) => Some(callback_thread(callback).map_err(|e| {
                Error::setting(
                    "on_lease_lost",
                    format!("could not start the thread that runs the callback: {e}"),
                )
            })?),
            None => None,
        };
        let meter = Arc::new(Meter::new(&table, &self.region, tuning.metrics_key_labels));
        let core = Arc::new(Core {
            meter,
            renewer,
            store,
            settings,
            on_lost,
            client_id,
            region: self.region,
            table,
            wakeups,
            closed: Default::default(),
            waitables: Default::default(),
            resolutions: Default::default(),
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
                core.wakeups
                    .enable(core.store.listener_watches_keys().is_some());
            }
        }
        Ok(LockRegistry {
            core,
            cache: Arc::new(Mutex::new(HandleCache::new(tuning.cache_capacity))),
            lingerer: Arc::default(),
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
            return Err(Error::setting(
                "renew_every",
                "must be longer than zero; use renewal(false) for no background renewal",
            ));
        }
        self.tuning.validate()?;
        let settings = Settings {
            time_to_live: self.time_to_live,
            linger: self.tuning.linger,
            idle_between_tries: self.idle_between_tries,
            turn_limit: self.tuning.turn_limit,
            local_handoff: self.tuning.local_handoff,
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
