//! The database side: one small contract per database, and everything the databases share.
//!
//! A backend ([`Backend`]) is only its SQL, how it runs one statement on one connection, and how
//! its driver's errors map onto [`FailureKind`]. Everything else — pools, deadlines, retrying
//! transient failures, the renewal path that waiters cannot starve, checking the table — lives
//! once, in [`SqlStore`], which the registry sees as the object-safe [`Store`].
//!
//! # The statements
//!
//! Every statement takes the same numbered parameters (listed on [`Statements`]), so a
//! replacement written by a user (`RegistryBuilder::acquire_sql` and friends) binds the same
//! way on every database:
//!
//! - **acquire** (1–4): one statement that takes the row when it is absent or expired on the
//!   database's clock, sets `FENCING_TOKEN` to `max(old + 1, database clock in µs, floor + 1)`
//!   (see below) and returns it; it returns no row — and writes nothing — when the lock is held.
//! - **renew** (1–5): moves `EXPIRED_AFTER` to database-now + TTL where the row still carries
//!   this client and token and has not expired; one affected row means renewed.
//! - **release** (1–3, 5): marks the row released (`CLIENT_ID` NULL, `EXPIRED_AFTER` in 1970)
//!   under the same condition; zero affected rows means the lease had already been lost. The row
//!   stays, so the next grant's token still counts up from it.
//!
//! # The deletion floor
//!
//! Others delete rows: Spring Integration on every unlock, operators when cleaning up. A new row
//! would then start from the database clock alone, which can be at or below the deleted row's
//! token (SQLite's clock counts milliseconds, and a grant within the tick of the previous one
//! takes `old + 1`; any clock can be set back). So each database gets a *floor* beside the lock
//! table (`sql/<database>_floor.sql`): a table `{table}_FLOOR` holding, per `REGION` and per
//! first two characters of `LOCK_KEY`, the highest token of any deleted row, kept by an
//! `AFTER DELETE` trigger `…_FLOOR` on the lock table that only raises it (a deletion cannot
//! lower it, and rows without a token — Spring's own — do not touch it). Acquire reads it (a
//! primary-key lookup in a small table; it never writes it): every grant's token exceeds every
//! earlier token of its key, whoever deleted the row in between and whatever the clock did —
//! as long as nobody rewrites `FENCING_TOKEN` or the floor by hand. Keeping a mark per key
//! prefix instead of per region means deletions of different keys rarely write the same row.
//!
//! `build()` looks for the floor. When it is missing, `create_table(true)` runs the floor file;
//! if that fails (the trigger needs privileges table creation does not, e.g. MySQL's `TRIGGER`)
//! or `create_table` is off, the registry logs a warning naming the file to run and falls back
//! to acquire statements without the floor, whose tokens rise across deletions only while the
//! clock is ahead of the deleted token.

use crate::error::{DatabaseError, Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;

/// The columns the lock table must have, in DDL order.
pub(crate) const COLUMNS: [&str; 6] = [
    "LOCK_KEY",
    "REGION",
    "CLIENT_ID",
    "CREATED_DATE",
    "EXPIRED_AFTER",
    "FENCING_TOKEN",
];

/// The three statements a registry runs, with its table name spliced in (see
/// [`LockRegistry::statements`](crate::LockRegistry::statements)): the backend's defaults, or
/// the replacements given to the builder (`acquire_sql`, `renew_sql`, `release_sql`) — start
/// from the defaults when writing a replacement.
///
/// Every statement takes the same parameters (`$1` on PostgreSQL, `?1` on SQLite; MySQL names
/// them `:lock_key`, `:region`, `:client_id`, `:ttl_micros`, `:token`), so a replacement binds
/// the same way on every database; it may leave some out:
///
/// | # | value | type |
/// |---|-------|------|
/// | 1 | `LOCK_KEY` (the key's UUID, see [`lock_key_for`](crate::lock_key_for)) | text |
/// | 2 | `REGION` | text |
/// | 3 | `CLIENT_ID` of this registry | text |
/// | 4 | time-to-live in microseconds (release: how long the key has been busy without a break, or -1 for a release that ends a turn; see [`RegistryBuilder::turn_window`](crate::RegistryBuilder::turn_window)) | integer |
/// | 5 | fencing token of the lease | integer |
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Statements {
    /// Takes the lock if it is free or expired; returns the fencing token, or no row.
    pub acquire: String,
    /// Extends a held lease; one affected row means renewed.
    pub renew: String,
    /// Frees a held lease; one affected row means released.
    pub release: String,
}

/// User replacements for some of the [`Statements`]; `None` keeps the backend's default.
#[derive(Debug, Clone, Default)]
pub(crate) struct CustomQueries {
    pub acquire: Option<String>,
    pub renew: Option<String>,
    pub release: Option<String>,
}

/// The parameters of every statement (see the module docs for their numbers).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Params<'a> {
    pub lock_key: &'a str,
    pub region: &'a str,
    pub client_id: &'a str,
    pub ttl_micros: i64,
    pub token: i64,
}

/// [`Params`] owned, so that an attempt can run on a statement thread.
#[derive(Debug, Clone)]
pub(crate) struct OwnedParams {
    lock_key: String,
    region: Arc<str>,
    client_id: Arc<str>,
    ttl_micros: i64,
    token: i64,
}

impl OwnedParams {
    fn borrowed(&self) -> Params<'_> {
        Params {
            lock_key: &self.lock_key,
            region: &self.region,
            client_id: &self.client_id,
            ttl_micros: self.ttl_micros,
            token: self.token,
        }
    }
}

/// How the shared retry loop treats a failed statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailureKind {
    /// Worth retrying on the same connection: busy, deadlock victim, serialization failure.
    Transient,
    /// The connection is unusable (reset, server gone): discard it and retry on a new one.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    Broken,
    /// Retrying cannot help: syntax, missing table, permissions.
    Fatal,
}

/// A backend's error, already classified, with a hint for the user.
#[derive(Debug)]
pub(crate) struct Failure {
    pub kind: FailureKind,
    pub hint: String,
    pub source: DatabaseError,
}

impl Failure {
    pub fn new(
        kind: FailureKind,
        hint: impl Into<String>,
        source: impl Into<DatabaseError>,
    ) -> Self {
        Failure {
            kind,
            hint: hint.into(),
            source: source.into(),
        }
    }
}

/// A connection of a backend, as its pool hands it out.
pub(crate) type Conn<B> = <<B as Backend>::Manager as r2d2::ManageConnection>::Connection;

/// What one database must provide. Implementations hold no state beyond what their connection
/// manager needs; every method runs exactly one statement (or one batch) and must not retry.
pub(crate) trait Backend: Send + Sync + 'static {
    /// Opens connections; its `has_broken` must report connections marked by `mark_broken`.
    type Manager: r2d2::ManageConnection;

    /// Human name, used in messages: `SQLite`, `PostgreSQL`, `MySQL`.
    const NAME: &'static str;
    /// Whether a statement may run on the calling thread now. True when a call cannot outlive
    /// the deadline given to [`Backend::set_deadline`] (the database is embedded, or the driver
    /// bounds every call by that deadline) and the driver can block this thread. Otherwise the
    /// statement runs on a statement thread ([`statement_threads`]) while its caller waits at
    /// most until its deadline.
    fn runs_inline() -> bool {
        false
    }
    /// Path of the shipped DDL file, named in errors.
    const DDL_FILE: &'static str;
    /// The shipped DDL (`include_str!` of `DDL_FILE`), written for table `INT_LOCK`.
    const DDL: &'static str;
    /// Path of the shipped DDL of the deletion floor, named in warnings.
    const FLOOR_DDL_FILE: &'static str;
    /// The shipped DDL of the deletion floor (`include_str!` of `FLOOR_DDL_FILE`), written for
    /// table `INT_LOCK`: table `INT_LOCK_FLOOR` and trigger `INT_LOCK_FLOOR`.
    const FLOOR_DDL: &'static str;
    /// Whether a trigger's name belongs to its table (PostgreSQL), so it never carries the
    /// table's schema; elsewhere it is a schema's object, named like the table.
    const TRIGGER_NAMES_PER_TABLE: bool = false;
    /// The column type of `CREATED_DATE` and `EXPIRED_AFTER` in `DDL`.
    const TIMESTAMP_TYPE: &'static str;
    /// The literal a released row's `EXPIRED_AFTER` holds (1970-01-01).
    const RELEASED_TIMESTAMP: &'static str;

    /// The default statements for `table`; with `floor`, acquire reads the deletion floor
    /// `{table}_FLOOR` (see [`floor_table`]).
    fn default_queries(table: &str, floor: bool) -> Statements;

    /// Runs an acquire statement: `Some(token)` when granted, `None` when held elsewhere.
    fn acquire(conn: &mut Conn<Self>, sql: &str, params: &Params) -> Result<Option<i64>, Failure>;

    /// Runs a renew or release statement and returns the number of affected rows.
    fn update(conn: &mut Conn<Self>, sql: &str, params: &Params) -> Result<u64, Failure>;

    /// Runs DDL (several statements separated by `;`).
    fn execute_batch(conn: &mut Conn<Self>, sql: &str) -> Result<(), Failure>;

    /// Upper-case column names of `table`; empty when the table does not exist.
    fn columns(conn: &mut Conn<Self>, table: &str) -> Result<Vec<String>, Failure>;

    /// What there is of the deletion floor of `table` (see [`floor_table`], [`floor_trigger`]).
    fn floor(conn: &mut Conn<Self>, table: &str) -> Result<FloorFound, Failure>;

    /// (index name, upper-case column name) for every column of every unique index of `table`.
    fn unique_key_columns(
        conn: &mut Conn<Self>,
        table: &str,
    ) -> Result<Vec<(String, String)>, Failure>;

    /// Prepares `sql` without running it and returns (parameter count, result column count).
    fn describe(conn: &mut Conn<Self>, sql: &str) -> Result<(usize, usize), Failure>;

    /// Flags `conn` so that the manager's `has_broken` discards it.
    fn mark_broken(conn: &mut Conn<Self>);

    /// Sets the deadline of the calls that follow on `conn`. A backend that runs inline
    /// returns a [`FailureKind::Broken`] failure from a call still unanswered at the deadline.
    fn set_deadline(_conn: &mut Conn<Self>, _deadline: Instant) {}

    /// Starts this database's release notifications, if it has any: a listener (its own
    /// connection and thread, outside the pools) that subscribes when `requests` delivers,
    /// reports to `handler` every row of `table.table` released in `table.region` while
    /// subscribed, ticks about once a second, and does what `handler` replies (see
    /// [`crate::wakeups`]). It ends when `handler` says [`ListenerReply::Stop`] or `requests`
    /// disconnects. Returns whether a listener was started; the default is none (waiters rely
    /// on polling).
    fn listen_for_releases(
        _manager: &Self::Manager,
        _table: &TableSettings,
        _handler: ListenerHandler,
        _requests: crossbeam_channel::Receiver<()>,
    ) -> bool {
        false
    }

    /// A statement without parameters returning the database clock (UTC) in microseconds
    /// since the Unix epoch; run through [`Backend::acquire`].
    fn clock_sql() -> &'static str;

    /// The statements of a batch renewal for `table` (see [`Backend::renew_batch`]).
    fn renew_batch_sql(table: &str) -> Vec<String>;

    /// Renews many leases of one time-to-live in one transaction with `sql` (from
    /// [`Backend::renew_batch_sql`]): parameter 1 is a JSON array of `[LOCK_KEY, token]`
    /// pairs, 2–4 as for renew; each pair's row is renewed under renew's conditions (client,
    /// token, not expired). Returns the pairs renewed.
    fn renew_batch(
        conn: &mut Conn<Self>,
        sql: &[String],
        params: &Params,
    ) -> Result<Vec<(String, i64)>, Failure>;
}

/// What [`Backend::floor`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FloorFound {
    /// The floor table exists and this user may read it: acquire can take it into account.
    pub readable: bool,
    /// The trigger that fills it is on the lock table (as far as this user can see).
    pub trigger: bool,
}

/// The deletion floor's table for lock table `table` (schema-qualified like it).
pub(crate) fn floor_table(table: &str) -> String {
    format!("{table}_FLOOR")
}

/// The name of the trigger that fills the deletion floor of `table`, without any schema.
pub(crate) fn floor_trigger(table: &str) -> String {
    let bare = table.rsplit('.').next().unwrap_or(table);
    format!("{bare}_FLOOR")
}

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

/// A grant from the database: the lease's fencing token and when its statement was sent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grant {
    pub token: i64,
    pub sent_at: Instant,
}

/// Which pool an operation draws from. Renewals have their own, so that waiters and user code
/// holding every main connection cannot make a held lease expire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    Main,
    Renewal,
}

/// The registry's view of a database: the three lease operations with deadlines.
pub(crate) trait Store: Send + Sync {
    /// One acquire attempt (retrying transient failures until `deadline`).
    fn acquire(&self, lock_key: &str, ttl: Duration, deadline: Instant) -> Result<Option<Grant>>;
    /// Renews; `Ok(Some(sent_at))` when renewed, `Ok(None)` when this client is not the holder.
    fn renew(
        &self,
        lock_key: &str,
        token: i64,
        ttl: Duration,
        deadline: Instant,
        path: Path,
    ) -> Result<Option<Instant>>;
    /// Renews many leases of one time-to-live together, on the renewal path: `leases` are
    /// (`LOCK_KEY`, fencing token) pairs. `Ok((sent_at, renewed))` with `renewed[i]` telling
    /// whether lease `i` is still this client's (`false`: not the holder, as `renew`'s `None`);
    /// `Err` when the outcome is unknown for all of them.
    fn renew_batch(
        &self,
        leases: &[(&str, i64)],
        ttl: Duration,
        deadline: Instant,
    ) -> Result<(Instant, Vec<bool>)>;
    /// Releases; `Ok(false)` when the lease had already been lost. `turn_age`: how long the key
    /// has been busy without a break, which notified waiters continue; `None` for a release
    /// that ends a turn, which wakes nobody (parameter 4: the age in µs, or -1).
    fn release(
        &self,
        lock_key: &str,
        token: i64,
        deadline: Instant,
        turn_age: Option<Duration>,
    ) -> Result<bool>;
    /// `SQLite`, `PostgreSQL`, `MySQL`.
    fn backend_name(&self) -> &'static str;
    /// The statements this store runs.
    fn statements(&self) -> &Statements;
    /// Statements sent so far.
    fn statistics(&self) -> Statistics;
    /// Starts the backend's release listener (see [`Backend::listen_for_releases`]).
    fn listen_for_releases(
        &self,
        handler: ListenerHandler,
        requests: crossbeam_channel::Receiver<()>,
    ) -> bool;
    /// Reads the database clock: (µs since the Unix epoch, when the query was sent, when the
    /// answer arrived).
    fn database_clock(&self, deadline: Instant) -> Result<(i64, Instant, Instant)>;
}

/// What one connection keeps per statement text it has run (a prepared statement, a rewrite),
/// found again by that text.
///
/// A connection only ever runs a handful of texts — the three lease statements or their
/// replacements, and the clock query — so a scan that compares lengths first and then bytes
/// beats hashing a text of several hundred bytes on every call.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) struct PerStatement<T> {
    entries: Vec<(Box<str>, T)>,
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<T> PerStatement<T> {
    pub fn new() -> Self {
        PerStatement {
            entries: Vec::new(),
        }
    }

    /// What was kept for `sql`.
    pub fn get(&self, sql: &str) -> Option<&T> {
        self.entries
            .iter()
            .find(|(text, _)| &**text == sql)
            .map(|(_, kept)| kept)
    }

    /// Keeps `value` for `sql`, which must not be kept yet; returns it.
    pub fn insert(&mut self, sql: &str, value: T) -> &T {
        debug_assert!(self.get(sql).is_none(), "kept twice: {sql}");
        self.entries.push((sql.into(), value));
        &self.entries.last().expect("just pushed").1
    }
}

/// How many lease statements a registry has sent to its database (every attempt counts,
/// including retries). Useful for metrics, and to see that local handoffs and waiting threads
/// cost no statements.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Statistics {
    /// Acquire statements (each poll of a waiter counts).
    pub acquires: u64,
    /// Acquire statements that granted the lock.
    pub grants: u64,
    /// Renew statements, background and manual.
    pub renewals: u64,
    /// Release statements.
    pub releases: u64,
}

#[derive(Default)]
struct Counters {
    acquires: AtomicU64,
    grants: AtomicU64,
    renewals: AtomicU64,
    releases: AtomicU64,
}

/// Pool settings shared by every backend.
#[derive(Debug, Clone)]
pub(crate) struct PoolSettings {
    pub pool_size: u32,
    pub connect_timeout: Duration,
    /// The registry's `operation_timeout`: the usual deadline of one statement.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub operation_timeout: Duration,
}

/// Where a registry's table lives and who it is.
#[derive(Debug, Clone)]
pub(crate) struct TableSettings {
    pub table: String,
    pub region: String,
    pub client_id: String,
    pub create_table: bool,
    pub custom: CustomQueries,
}

/// [`Store`] over any [`Backend`]: pools, deadlines and retries, written once.
pub(crate) struct SqlStore<B: Backend> {
    pool: r2d2::Pool<B::Manager>,
    renewal_pool: r2d2::Pool<B::Manager>,
    queries: Arc<Statements>,
    /// The batch renewal statements; `None` with a custom renew statement, which is then run
    /// once per lease.
    batch_renew: Option<Arc<Vec<String>>>,
    /// Set when the database refused the batch statements for good (a server without
    /// `JSON_TABLE`, say): renewals then run one statement per lease.
    batch_refused: std::sync::atomic::AtomicBool,
    region: Arc<str>,
    client_id: Arc<str>,
    counters: Arc<Counters>,
    manager: B::Manager,
    table: TableSettings,
}

impl<B: Backend> SqlStore<B> {
    /// Builds both pools from `manager`, checks (or creates) the table and checks custom SQL.
    pub fn open(manager: B::Manager, pool: &PoolSettings, table: &TableSettings) -> Result<Self>
    where
        B::Manager: Clone,
    {
        let build = |manager: B::Manager, size: u32| {
            r2d2::Pool::builder()
                .max_size(size)
                .min_idle(Some(1))
                .test_on_check_out(false)
                .connection_timeout(pool.connect_timeout)
                .error_handler(Box::new(r2d2::NopErrorHandler))
                .build(manager)
                .map_err(|e| Error::Timeout {
                    operation: "connect",
                    waited: pool.connect_timeout,
                    source: Some(Box::new(e)),
                })
        };
        let renewal_pool = build(manager.clone(), 2)?;
        let main = build(manager.clone(), pool.pool_size)?;
        let mut store = SqlStore {
            pool: main,
            renewal_pool,
            // Chosen once the table has been checked (whether acquire can read the floor).
            queries: Arc::default(),
            batch_renew: table
                .custom
                .renew
                .is_none()
                .then(|| Arc::new(B::renew_batch_sql(&table.table))),
            batch_refused: Default::default(),
            region: table.region.as_str().into(),
            client_id: table.client_id.as_str().into(),
            counters: Arc::default(),
            manager,
            table: table.clone(),
        };
        let deadline = Instant::now() + pool.connect_timeout;
        let ddl = table.create_table.then(|| ddl_for::<B>(&table.table));
        store.run(Path::Main, "check table", deadline, move |conn| {
            if let Some(ddl) = &ddl {
                B::execute_batch(conn, ddl)?;
            }
            Ok(())
        })?;
        let name = table.table.clone();
        let columns = store.run(Path::Main, "check table", deadline, move |conn| {
            B::columns(conn, &name)
        })?;
        check_columns::<B>(&table.table, &columns)?;
        let name = table.table.clone();
        let unique = store.run(Path::Main, "check table", deadline, move |conn| {
            B::unique_key_columns(conn, &name)
        })?;
        check_primary_key(&table.table, &unique)?;
        let floor = store.check_floor(table, deadline)?;
        let defaults = B::default_queries(&table.table, floor);
        store.queries = Arc::new(Statements {
            acquire: table.custom.acquire.clone().unwrap_or(defaults.acquire),
            renew: table.custom.renew.clone().unwrap_or(defaults.renew),
            release: table.custom.release.clone().unwrap_or(defaults.release),
        });
        store.check_custom(&table.custom, deadline)?;
        Ok(store)
    }

    /// Looks for the deletion floor (module docs), runs its DDL when it is missing and the
    /// registry may create tables, and returns whether acquire can read it. A floor that is
    /// missing, or that the DDL could not complete, is logged as a warning: the locks work
    /// without it.
    fn check_floor(&self, table: &TableSettings, deadline: Instant) -> Result<bool> {
        let look = |store: &Self| {
            let name = table.table.clone();
            store.run(Path::Main, "check table", deadline, move |conn| {
                B::floor(conn, &name)
            })
        };
        let mut found = look(self)?;
        let complete = FloorFound {
            readable: true,
            trigger: true,
        };
        if found != complete && table.create_table {
            let ddl = floor_ddl_for::<B>(&table.table);
            let created = self.run(
                Path::Main,
                "create the deletion floor",
                deadline,
                move |conn| B::execute_batch(conn, &ddl),
            );
            if let Err(e) = created {
                log::warn!(
                    "could not create the deletion floor of {} from {}: {e}",
                    table.table,
                    B::FLOOR_DDL_FILE
                );
            }
            found = look(self)?;
        }
        if found != complete {
            let missing = if found.readable {
                format!(
                    "trigger {} was not found on it, or this user cannot see it",
                    floor_trigger(&table.table)
                )
            } else {
                format!(
                    "table {} is missing or this user may not read it",
                    floor_table(&table.table)
                )
            };
            log::warn!(
                "lock table {table}: the deletion floor is incomplete ({missing}). Until {file} \
                 (with INT_ replaced by the prefix) has been run, or a registry has been built \
                 with create_table(true) by a user allowed to create triggers, a key whose row \
                 is deleted (Spring Integration's unlock, manual cleanup) may be granted a \
                 fencing token no greater than before the deletion.",
                table = table.table,
                file = B::FLOOR_DDL_FILE,
            );
        }
        Ok(found.readable)
    }

    fn check_custom(&self, custom: &CustomQueries, deadline: Instant) -> Result<()> {
        // Renew and release count affected (or returned) rows, so only acquire's result shape
        // is fixed: one column, the fencing token.
        let checks = [
            ("acquire", &custom.acquire, Some(1usize)),
            ("renew", &custom.renew, None),
            ("release", &custom.release, None),
        ];
        for (statement, sql, result_columns) in checks {
            let Some(sql) = sql else { continue };
            let sql = sql.clone();
            let described = self.run(
                Path::Main,
                "check custom statement",
                deadline,
                move |conn| Ok(B::describe(conn, &sql)),
            )?;
            let (params, columns) = described.map_err(|f| Error::InvalidStatement {
                statement,
                reason: f.source.to_string(),
            })?;
            if params > 5 || result_columns.is_some_and(|expected| columns != expected) {
                return Err(Error::InvalidStatement {
                    statement,
                    reason: format!(
                        "it takes {params} parameters and returns {columns} columns; use \
                         parameters 1-5 as documented{}",
                        if statement == "acquire" {
                            " and return the fencing token as the only column"
                        } else {
                            ""
                        }
                    ),
                });
            }
        }
        Ok(())
    }

    fn params(&self, lock_key: &str, ttl: Duration, token: i64) -> OwnedParams {
        OwnedParams {
            lock_key: lock_key.into(),
            region: Arc::clone(&self.region),
            client_id: Arc::clone(&self.client_id),
            ttl_micros: i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX),
            token,
        }
    }

    /// Runs `attempt` on a pooled connection until it succeeds, fails for good, or `deadline`
    /// passes. Transient failures sleep a short, doubling pause (1 ms to 100 ms, never past the
    /// deadline); broken connections are discarded.
    ///
    /// A server or connection that stops answering cannot hold the caller past `deadline`:
    /// either the backend bounds the call itself ([`Backend::runs_inline`]), or the attempt runs on
    /// a statement thread ([`statement_threads`]) while the caller waits at most until the
    /// deadline. Either way the connection is discarded. (An acquire granted after its caller
    /// gave up is left to expire.)
    fn run<T, F>(
        &self,
        path: Path,
        operation: &'static str,
        deadline: Instant,
        attempt: F,
    ) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(&mut Conn<B>) -> Result<T, Failure> + Send + Sync + 'static,
    {
        let attempt = Arc::new(attempt);
        let pool = match path {
            Path::Main => &self.pool,
            Path::Renewal => &self.renewal_pool,
        };
        let started = Instant::now();
        let mut pause = Duration::from_millis(1);
        let mut last: Option<DatabaseError> = None;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(Error::Timeout {
                    operation,
                    waited: started.elapsed(),
                    source: last,
                });
            }
            match pool.get_timeout(remaining) {
                Err(e) => last = Some(Box::new(e)),
                Ok(conn) => match attempt_once::<B, T, F>(conn, &attempt, deadline) {
                    None => {
                        last =
                            Some(format!("no answer from {} before the deadline", B::NAME).into())
                    }
                    Some(Ok(value)) => return Ok(value),
                    Some(Err(failure)) => {
                        log::debug!("{operation} on {}: {failure:?}", B::NAME);
                        match failure.kind {
                            FailureKind::Fatal => {
                                return Err(Error::Database {
                                    operation,
                                    hint: failure.hint,
                                    source: failure.source,
                                })
                            }
                            FailureKind::Broken | FailureKind::Transient => {}
                        }
                        last = Some(failure.source);
                    }
                },
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            std::thread::sleep(pause.min(remaining));
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }
}

impl<B: Backend> Store for SqlStore<B> {
    fn acquire(&self, lock_key: &str, ttl: Duration, deadline: Instant) -> Result<Option<Grant>> {
        let params = self.params(lock_key, ttl, 0);
        let (queries, counters) = (Arc::clone(&self.queries), Arc::clone(&self.counters));
        self.run(Path::Main, "acquire", deadline, move |conn| {
            let sent_at = Instant::now();
            fail_point!("backend::acquire_sent");
            counters.acquires.fetch_add(1, Ordering::Relaxed);
            let token = B::acquire(conn, &queries.acquire, &params.borrowed())?;
            if token.is_some() {
                counters.grants.fetch_add(1, Ordering::Relaxed);
            }
            Ok(token.map(|token| Grant { token, sent_at }))
        })
    }

    fn renew(
        &self,
        lock_key: &str,
        token: i64,
        ttl: Duration,
        deadline: Instant,
        path: Path,
    ) -> Result<Option<Instant>> {
        let params = self.params(lock_key, ttl, token);
        let (queries, counters) = (Arc::clone(&self.queries), Arc::clone(&self.counters));
        self.run(path, "renew", deadline, move |conn| {
            let sent_at = Instant::now();
            fail_point!("backend::renew_sent", |_| Err(injected_failure()));
            counters.renewals.fetch_add(1, Ordering::Relaxed);
            let rows = B::update(conn, &queries.renew, &params.borrowed())?;
            Ok((rows > 0).then_some(sent_at))
        })
    }

    fn renew_batch(
        &self,
        leases: &[(&str, i64)],
        ttl: Duration,
        deadline: Instant,
    ) -> Result<(Instant, Vec<bool>)> {
        let batch = match &self.batch_renew {
            Some(batch) if !self.batch_refused.load(Ordering::Relaxed) => batch,
            _ => return renew_each(self, leases, ttl, deadline),
        };
        let pairs = pairs_json(leases.iter().map(|(key, token)| (*key, *token)));
        let params = self.params(&pairs, ttl, 0);
        let (batch, counters) = (Arc::clone(batch), Arc::clone(&self.counters));
        let outcome = self.run(Path::Renewal, "renew", deadline, move |conn| {
            let sent_at = Instant::now();
            fail_point!("backend::renew_sent", |_| Err(injected_failure()));
            counters.renewals.fetch_add(1, Ordering::Relaxed);
            Ok((sent_at, B::renew_batch(conn, &batch, &params.borrowed())?))
        });
        let (sent_at, renewed) = match outcome {
            Err(Error::Database { hint, .. }) => {
                // Refused, so it did not run: renew one by one from now on.
                log::warn!(
                    "{} refused the batch renewal ({hint}); renewing one lease per statement",
                    B::NAME
                );
                self.batch_refused.store(true, Ordering::Relaxed);
                return renew_each(self, leases, ttl, deadline);
            }
            other => other?,
        };
        let renewed: std::collections::HashSet<(String, i64)> = renewed.into_iter().collect();
        let found = leases
            .iter()
            .map(|(key, token)| renewed.contains(&((*key).to_string(), *token)))
            .collect();
        Ok((sent_at, found))
    }

    fn release(
        &self,
        lock_key: &str,
        token: i64,
        deadline: Instant,
        turn_age: Option<Duration>,
    ) -> Result<bool> {
        let mut params = self.params(lock_key, turn_age.unwrap_or_default(), token);
        if turn_age.is_none() {
            params.ttl_micros = -1;
        }
        let (queries, counters) = (Arc::clone(&self.queries), Arc::clone(&self.counters));
        self.run(Path::Main, "release", deadline, move |conn| {
            counters.releases.fetch_add(1, Ordering::Relaxed);
            Ok(B::update(conn, &queries.release, &params.borrowed())? > 0)
        })
    }

    fn backend_name(&self) -> &'static str {
        B::NAME
    }

    fn statements(&self) -> &Statements {
        &self.queries
    }

    fn listen_for_releases(
        &self,
        handler: ListenerHandler,
        requests: crossbeam_channel::Receiver<()>,
    ) -> bool {
        B::listen_for_releases(&self.manager, &self.table, handler, requests)
    }

    fn database_clock(&self, deadline: Instant) -> Result<(i64, Instant, Instant)> {
        let params = self.params("", Duration::ZERO, 0);
        self.run(
            Path::Main,
            "read the database clock",
            deadline,
            move |conn| {
                let sent_at = Instant::now();
                let micros =
                    B::acquire(conn, B::clock_sql(), &params.borrowed())?.unwrap_or_default();
                Ok((micros, sent_at, Instant::now()))
            },
        )
    }

    fn statistics(&self) -> Statistics {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        Statistics {
            acquires: read(&self.counters.acquires),
            grants: read(&self.counters.grants),
            renewals: read(&self.counters.renewals),
            releases: read(&self.counters.releases),
        }
    }
}

/// `[[LOCK_KEY, token], …]`, the first parameter of a batch renewal. Keys are `LOCK_KEY`s (UUID
/// text), but are escaped anyway.
pub(crate) fn pairs_json<'a>(pairs: impl Iterator<Item = (&'a str, i64)>) -> String {
    let mut json = String::from("[");
    for (index, (key, token)) in pairs.enumerate() {
        if index > 0 {
            json.push(',');
        }
        json.push_str("[\"");
        for c in key.chars() {
            match c {
                '"' => json.push_str("\\\""),
                '\\' => json.push_str("\\\\"),
                c if (c as u32) < 0x20 => json.push_str(&format!("\\u{:04x}", c as u32)),
                c => json.push(c),
            }
        }
        json.push_str(&format!("\",{token}]"));
    }
    json.push(']');
    json
}

/// A batch renewal as one renew statement per lease (custom renew statements), on the renewal
/// path; the send instant is the first statement's, the earliest and so the safe one.
fn renew_each(
    store: &dyn Store,
    leases: &[(&str, i64)],
    ttl: Duration,
    deadline: Instant,
) -> Result<(Instant, Vec<bool>)> {
    let started = Instant::now();
    let mut renewed = Vec::with_capacity(leases.len());
    for (lock_key, token) in leases {
        let outcome = store.renew(lock_key, *token, ttl, deadline, Path::Renewal)?;
        renewed.push(outcome.is_some());
    }
    Ok((started, renewed))
}

/// What the fail point `backend::renew_sent` returns when told to `return`: a transient failure.
#[cfg(feature = "failpoints")]
pub(crate) fn injected_failure() -> Failure {
    Failure::new(
        FailureKind::Transient,
        "injected by a fail point",
        "fail point backend::renew_sent",
    )
}

/// One attempt on `conn`: on the calling thread when [`Backend::runs_inline`], else
/// on a statement thread, waiting at most until `deadline` (`None`: no answer in time). A
/// connection whose attempt failed as broken, or was abandoned, is flagged for discarding.
fn attempt_once<B, T, F>(
    mut conn: r2d2::PooledConnection<B::Manager>,
    attempt: &Arc<F>,
    deadline: Instant,
) -> Option<Result<T, Failure>>
where
    B: Backend,
    T: Send + 'static,
    F: Fn(&mut Conn<B>) -> Result<T, Failure> + Send + Sync + 'static,
{
    let finish = |conn: &mut Conn<B>, outcome: &Result<T, Failure>| {
        if matches!(outcome, Err(f) if f.kind == FailureKind::Broken) {
            B::mark_broken(conn);
        }
    };
    B::set_deadline(&mut conn, deadline);
    if B::runs_inline() {
        let outcome = attempt(&mut conn);
        finish(&mut conn, &outcome);
        return Some(outcome);
    }
    let (answer, answered) = crossbeam_channel::bounded(1);
    let attempt = Arc::clone(attempt);
    statement_threads::run(Box::new(move || {
        let outcome = attempt(&mut conn);
        finish(&mut conn, &outcome);
        if answer.send(outcome).is_err() {
            B::mark_broken(&mut conn);
        }
    }));
    answered.recv_deadline(deadline).ok()
}

/// Threads that run statements of backends that cannot bound a call by a deadline themselves
/// (MySQL), for callers with deadlines.
///
/// A thread that finished a statement counts itself idle and waits up to
/// [`statement_threads::IDLE_LIFETIME`] for the next one. A caller claims an idle thread by
/// decrementing that count and queues its statement; with none idle it starts a thread. Claiming
/// before the thread is back in `recv` is fine (the statement waits in the queue for it), so
/// back-to-back statements reuse one thread instead of starting new ones. A thread stuck on a
/// connection that stopped answering stays stuck only until that call returns; its caller has
/// long gone on.
pub(crate) mod statement_threads {
    use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::OnceLock;
    use std::time::Duration;

    /// How long an idle statement thread waits for work before exiting.
    pub const IDLE_LIFETIME: Duration = Duration::from_secs(10);

    type Job = Box<dyn FnOnce() + Send>;

    struct Threads {
        queue: (Sender<Job>, Receiver<Job>),
        idle: AtomicUsize,
    }

    fn threads() -> &'static Threads {
        static THREADS: OnceLock<Threads> = OnceLock::new();
        THREADS.get_or_init(|| Threads {
            queue: crossbeam_channel::unbounded(),
            idle: AtomicUsize::new(0),
        })
    }

    /// Takes one from the idle count if it is not zero.
    fn claim_idle(idle: &AtomicUsize) -> bool {
        idle.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Runs `job` on an idle statement thread, or on a new one. If no thread can be started
    /// the job is dropped, which its caller sees as an attempt without an answer.
    pub(crate) fn run(job: Job) {
        let threads = threads();
        if claim_idle(&threads.idle) {
            // The queue is unbounded and never closed: this cannot fail.
            let _ = threads.queue.0.send(job);
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("leasehold-statement".into())
            .spawn(move || {
                job();
                loop {
                    threads.idle.fetch_add(1, Ordering::AcqRel);
                    let job = loop {
                        match threads.queue.1.recv_timeout(IDLE_LIFETIME) {
                            Ok(job) => break job,
                            // Leave only if no caller has claimed this thread meanwhile.
                            Err(RecvTimeoutError::Timeout) if claim_idle(&threads.idle) => return,
                            Err(_) => continue,
                        }
                    };
                    job();
                }
            });
        if let Err(e) = spawned {
            log::error!("could not start a statement thread: {e}");
        }
    }
}

/// Tries one direct connection (`connect` returns the classified failure and a short detail)
/// until `timeout`, retrying every 50 ms while the failure is not fatal (refused, starting up),
/// so that a wrong password or database name is reported as what it is — a pool would only
/// time out.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn first_connection(
    database: &str,
    address: &str,
    timeout: Duration,
    mut connect: impl FnMut() -> Result<(), (Failure, String)>,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let pause = Duration::from_millis(50);
    loop {
        let Err((failure, detail)) = connect() else {
            return Ok(());
        };
        let retry = failure.kind != FailureKind::Fatal;
        if !retry || Instant::now() + pause >= deadline {
            let hint = if retry {
                format!(
                    "cannot reach {database} at {address} within {timeout:?} ({detail}): start \
                     the server or fix the URL"
                )
            } else {
                format!("{} (server {address})", failure.hint)
            };
            return Err(Error::Database {
                operation: "connect",
                hint,
                source: failure.source,
            });
        }
        std::thread::sleep(pause);
    }
}

/// The shipped DDL with `INT_LOCK` renamed to `table`.
pub(crate) fn ddl_for<B: Backend>(table: &str) -> String {
    rename::<B>(B::DDL, table)
}

/// The shipped DDL of the deletion floor with `INT_LOCK` renamed to `table`.
pub(crate) fn floor_ddl_for<B: Backend>(table: &str) -> String {
    rename::<B>(B::FLOOR_DDL, table)
}

/// `ddl` (written for `INT_LOCK`) with `INT_LOCK` renamed to `table`.
fn rename<B: Backend>(ddl: &str, table: &str) -> String {
    // A constraint name cannot carry the table's schema: `schema.X_LOCK` names its key X_LOCK_PK.
    let bare = table.rsplit('.').next().unwrap_or(table);
    let mut ddl = ddl.replace("INT_LOCK_PK", &format!("{bare}_PK"));
    if B::TRIGGER_NAMES_PER_TABLE {
        for lead in ["TRIGGER ", "TRIGGER IF EXISTS "] {
            ddl = ddl.replace(
                &format!("{lead}INT_LOCK_FLOOR"),
                &format!("{lead}{}", floor_trigger(table)),
            );
        }
    }
    ddl.replace("INT_LOCK", table)
}

/// The table must have a unique index on exactly (LOCK_KEY, REGION): the acquire statements
/// rely on it to refuse a second row for one lock.
fn check_primary_key(table: &str, unique_columns: &[(String, String)]) -> Result<()> {
    let mut indexes: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for (index, column) in unique_columns {
        indexes.entry(index).or_default().push(column);
    }
    let keyed = indexes.values_mut().any(|columns| {
        columns.sort_unstable();
        columns.as_slice() == ["LOCK_KEY", "REGION"]
    });
    if keyed {
        return Ok(());
    }
    let bare = table.rsplit('.').next().unwrap_or(table);
    Err(Error::KeyMissing {
        table: table.to_string(),
        fix: format!("CREATE UNIQUE INDEX {bare}_PK ON {table} (LOCK_KEY, REGION)"),
    })
}

/// The statement that adds `column` to an existing lock `table` (the Spring 7.0 upgrade adds
/// `EXPIRED_AFTER`; leasehold adds `FENCING_TOKEN`). Key columns cannot be added in place.
fn add_column_sql<B: Backend>(table: &str, column: &str) -> String {
    let definition = match column {
        "EXPIRED_AFTER" | "CREATED_DATE" => format!(
            "{} NOT NULL DEFAULT {}",
            B::TIMESTAMP_TYPE,
            B::RELEASED_TIMESTAMP
        ),
        "FENCING_TOKEN" => "BIGINT NOT NULL DEFAULT 0".to_string(),
        "CLIENT_ID" => "CHAR(36)".to_string(),
        key => {
            return format!(
                "DROP TABLE {table}, then run {}: column {key} is part of the key",
                B::DDL_FILE
            )
        }
    };
    format!("ALTER TABLE {table} ADD COLUMN {column} {definition}")
}

fn check_columns<B: Backend>(table: &str, columns: &[String]) -> Result<()> {
    if columns.is_empty() {
        return Err(Error::TableMissing {
            table: table.to_string(),
            ddl_file: B::DDL_FILE,
        });
    }
    for column in COLUMNS {
        if !columns.iter().any(|c| c.eq_ignore_ascii_case(column)) {
            return Err(Error::ColumnMissing {
                table: table.to_string(),
                column,
                fix: add_column_sql::<B>(table, column),
            });
        }
    }
    Ok(())
}

#[cfg(all(test, any(feature = "postgres", feature = "mysql")))]
mod tests {
    use super::PerStatement;

    /// `ddl` without its comment lines.
    fn statements(ddl: &str) -> String {
        ddl.lines().filter(|line| !line.starts_with("--")).collect()
    }

    /// A PostgreSQL trigger's name cannot carry a schema; a MySQL trigger must be named in its
    /// table's schema; everything else follows the table.
    #[test]
    fn the_floor_ddl_names_its_objects_after_the_table() {
        #[cfg(feature = "postgres")]
        {
            let ddl = super::floor_ddl_for::<super::postgres::Postgres>("s.APP_LOCK");
            for expected in [
                "CREATE TABLE IF NOT EXISTS s.APP_LOCK_FLOOR (",
                "DROP TRIGGER IF EXISTS APP_LOCK_FLOOR ON s.APP_LOCK;",
                "CREATE OR REPLACE FUNCTION s.APP_LOCK_FLOOR()",
                "INSERT INTO s.APP_LOCK_FLOOR AS kept",
                "CREATE TRIGGER APP_LOCK_FLOOR AFTER DELETE ON s.APP_LOCK",
                "EXECUTE FUNCTION s.APP_LOCK_FLOOR();",
            ] {
                assert!(ddl.contains(expected), "{expected} not in {ddl}");
            }
            assert!(!statements(&ddl).contains("INT_"), "{ddl}");
        }
        #[cfg(feature = "mysql")]
        {
            let ddl = super::floor_ddl_for::<super::mysql::Mysql>("s.APP_LOCK");
            for expected in [
                "CREATE TABLE IF NOT EXISTS s.APP_LOCK_FLOOR (",
                "DROP TRIGGER IF EXISTS s.APP_LOCK_FLOOR;",
                "CREATE TRIGGER s.APP_LOCK_FLOOR AFTER DELETE ON s.APP_LOCK",
            ] {
                assert!(ddl.contains(expected), "{expected} not in {ddl}");
            }
            assert!(!statements(&ddl).contains("INT_"), "{ddl}");
        }
    }

    #[test]
    fn per_statement_finds_each_text_and_only_it() {
        let mut kept = PerStatement::new();
        assert!(kept.get("SELECT 1").is_none());
        assert_eq!(*kept.insert("SELECT 1", 1), 1);
        // Same length, different bytes; a prefix; a longer text.
        assert_eq!(*kept.insert("SELECT 2", 2), 2);
        assert_eq!(*kept.insert("SELECT 1 + 1", 3), 3);
        assert_eq!(kept.get("SELECT 1"), Some(&1));
        assert_eq!(kept.get("SELECT 2"), Some(&2));
        assert_eq!(kept.get("SELECT 1 + 1"), Some(&3));
        assert!(kept.get("SELECT ").is_none());
        assert!(kept.get("select 1").is_none());
    }
}
