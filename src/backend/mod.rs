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
//! replacement written by a user (`RegistryBuilder::custom_sql`) binds the same
//! way on every database:
//!
//! - **acquire** (1–4, 6): one statement that takes the row when it is absent or expired on the
//!   database's clock, sets `FENCING_TOKEN` to `max(old + 1, database clock in µs, floor + 1)`
//!   (see below) and `LOCK_NAME` to the lock's name (parameter 6) where the table has that
//!   column, and returns the token; it returns no row — and writes nothing — when the lock is
//!   held.
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
//!
//! # Files
//!
//! The shared machinery, then one folder per database, each holding that database's SQL (its
//! [`Backend`] impl), its connections and error mapping, and its wake-ups:
//!
//! | file | job |
//! |------|-----|
//! | `mod.rs` | the [`Backend`] contract |
//! | `statements.rs` | the statements, their parameters, checking replacements |
//! | `failure.rs` | failure classes ([`FailureKind`]) |
//! | `store.rs` | [`Store`] and [`SqlStore`]: the lease operations |
//! | `admin.rs` | the administration statements: holder, listing, forced release, cleanup, keep-for release |
//! | `retry.rs` | the retry loop: deadlines, pauses, discarding broken connections |
//! | `pools/mod.rs`, `pools/probe.rs` | connection pools; the first connection and the look at what answers at a server's address |
//! | `statement_threads.rs` | threads that run statements for callers with deadlines where the driver cannot bound a call (MySQL off Unix; PostgreSQL inside an async runtime) |
//! | `schema.rs` | the DDL and the table, name-column and floor checks of `build()` |
//! | `semaphores.rs` | the semaphore table: creating it, recording and reading a semaphore's permits |
//! | `queue.rs` | the waiting line: creating it, taking and leaving a place |
//! | `statistics.rs` | statement counters ([`Statistics`]) |
//! | `listener.rs` | what a release listener and its registry tell each other |
//! | `tls.rs` | what TLS shares between databases: modes, handshake errors and their hints, certificate files |
//! | `sqlite/mod.rs`, `sqlite/board.rs` | SQLite; its release board (wake-ups between processes of one host) |
//! | `postgres/mod.rs`, `postgres/conn.rs`, `postgres/errors.rs`, `postgres/hosts.rs`, `postgres/listener.rs`, `postgres/tls.rs` | PostgreSQL: its SQL; its connections and their deadlines; its error mapping; host lists and connect checks; its `LISTEN` thread and connection; its TLS settings (`sslmode`, …) and rustls configuration |
//! | `mysql/mod.rs`, `mysql/conn.rs`, `mysql/errors.rs`, `mysql/hosts.rs`, `mysql/wakeups/`, `mysql/tls.rs` | MySQL/MariaDB: its SQL; its connections, statement plans and socket timeouts; its error mapping; host lists and connect checks; its wake-ups through named locks; its TLS settings (`ssl-mode`, …) and driver options |
//!
//! A database's files import the shared ones (`crate::backend::…`), never the other way round,
//! and never another database's.

use std::time::{Duration, Instant};

#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) mod tls;

mod admin;
mod failure;
mod listener;
mod pools;
mod queue;
mod retry;
mod schema;
mod semaphores;
mod statement_threads;
mod statements;
mod statistics;
mod store;

pub(crate) use admin::{
    state_sql, AdminStatements, HolderRow, ListedRow, STATE_EXPIRED, STATE_HELD,
};
#[cfg(feature = "failpoints")]
pub(crate) use failure::injected_failure;
pub(crate) use failure::{Failure, FailureKind};
pub(crate) use listener::{ListenerEvent, ListenerHandler, ListenerReply};
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use pools::first_connection;
pub(crate) use pools::PoolSettings;
pub(crate) use queue::{queue_ddl_for, queue_table, QueueStatements};
pub(crate) use retry::jittered;
pub(crate) use schema::{
    ddl_for, floor_ddl_for, floor_table, floor_trigger, FloorFound, TableSettings,
};
pub(crate) use semaphores::{semaphore_ddl_for, semaphore_table, SemaphoreStatements};
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use statements::PerStatement;
pub use statements::Statements;
pub(crate) use statements::{pairs_json, CustomQueries, OwnedParams, Params};
pub use statistics::Statistics;
pub(crate) use store::{Acquired, Batched, Grant, Path, SqlStore, Store};

/// A connection of a backend, as its pool hands it out.
pub(crate) type Conn<B> = <<B as Backend>::Manager as r2d2::ManageConnection>::Connection;

/// One waiting thread's own sleep until its key is released elsewhere (see
/// [`Backend::release_wait`]).
pub(crate) trait ReleaseWait: Send {
    /// Called before each attempt: a release after this ends the next [`ReleaseWait::sleep`]
    /// at once.
    fn arm(&mut self);
    /// Sleeps until a release since [`ReleaseWait::arm`], or until `until`, or spuriously:
    /// `Some(true)` when the key was released since, `Some(false)` when not; `None` when this
    /// way of waiting fails (the caller then waits as without it).
    fn sleep(&self, until: Instant) -> Option<bool>;
}

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
    /// Path of the shipped DDL of the semaphore table (see [`semaphores`]), named in errors.
    const SEMAPHORE_DDL_FILE: &'static str;
    /// The shipped DDL of the semaphore table (`include_str!` of `SEMAPHORE_DDL_FILE`), written
    /// for table `INT_LOCK`: table `INT_LOCK_SEM`.
    const SEMAPHORE_DDL: &'static str;
    /// Path of the shipped DDL of the waiting line (see [`queue`]), named in messages.
    const QUEUE_DDL_FILE: &'static str;
    /// The shipped DDL of the waiting line (`include_str!` of `QUEUE_DDL_FILE`), written for
    /// table `INT_LOCK`: table `INT_LOCK_QUEUE`.
    const QUEUE_DDL: &'static str;
    /// Whether the database grants privileges per table, so that a user of the lock table may
    /// still lack them on the waiting line (see [`queue`]); SQLite's users have the file.
    const TABLE_PRIVILEGES: bool = true;
    /// Whether the acquire statement of [`Backend::default_queries`] with `queue` also removes
    /// the client's place in line when it grants; otherwise the registry leaves the line with
    /// a statement of its own after the grant.
    const ACQUIRE_LEAVES_LINE: bool = false;
    /// Whether a trigger's name belongs to its table (PostgreSQL), so it never carries the
    /// table's schema; elsewhere it is a schema's object, named like the table.
    const TRIGGER_NAMES_PER_TABLE: bool = false;
    /// The column type of the optional `LOCK_NAME` (room for [`crate::MAX_KEY_BYTES`]).
    const NAME_TYPE: &'static str;
    /// The column type of `CREATED_DATE` and `EXPIRED_AFTER` in `DDL`.
    const TIMESTAMP_TYPE: &'static str;
    /// The literal a released row's `EXPIRED_AFTER` holds (1970-01-01).
    const RELEASED_TIMESTAMP: &'static str;

    /// The default statements for `table`; with `floor`, acquire reads the deletion floor
    /// `{table}_FLOOR` (see [`floor_table`]); with `named`, acquire stores parameter 6 in
    /// `LOCK_NAME` (whenever it writes the row); with `queue`, acquire grants only when no
    /// other client holds an earlier live place in the waiting line `{table}_QUEUE` (see
    /// [`queue`]).
    fn default_queries(table: &str, floor: bool, named: bool, queue: bool) -> Statements;

    /// The statements of the waiting line `{table}_QUEUE` (see [`queue`]).
    fn queue_statements(table: &str) -> QueueStatements;

    /// The administration statements for `table` (see [`AdminStatements`]); with `named`,
    /// the listing reads `LOCK_NAME`.
    fn admin_statements(table: &str, named: bool) -> AdminStatements;

    /// The statements of the semaphore table `{table}_SEM` (see [`SemaphoreStatements`]).
    fn semaphore_statements(table: &str) -> SemaphoreStatements;

    /// Runs [`AdminStatements::holder`]: the held row, if any.
    fn holder(
        conn: &mut Conn<Self>,
        sql: &str,
        params: &Params,
    ) -> Result<Option<HolderRow>, Failure>;

    /// Runs [`AdminStatements::list`]: the rows of one page.
    fn rows(conn: &mut Conn<Self>, sql: &str, params: &Params) -> Result<Vec<ListedRow>, Failure>;

    /// Runs an acquire statement: `Some(token)` when granted, `None` when held elsewhere.
    fn acquire(conn: &mut Conn<Self>, sql: &str, params: &Params) -> Result<Option<i64>, Failure>;

    /// Runs a statement that returns one BIGINT (the permits recorded, the clock), the way an
    /// acquire is run.
    fn read_number(
        conn: &mut Conn<Self>,
        sql: &str,
        params: &Params,
    ) -> Result<Option<i64>, Failure> {
        Self::acquire(conn, sql, params)
    }

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

    /// The server session `conn` talks to, where the backend can tell it and end it from
    /// another connection ([`Backend::end_session`]); `None` elsewhere (an embedded database,
    /// whose statements end before their call returns; a pooler in between).
    fn session(_conn: &mut Conn<Self>) -> Option<Session> {
        None
    }

    /// Ends server session `session` (another connection's, given up with a statement in
    /// flight) from `conn`: `Ok(true)` once the session is gone — nothing it was sent can run
    /// any more — or when `conn` talks to another server instance (a failover, a restart: the
    /// session's server is not there to end it on), and `Ok(false)` while it still runs (ask
    /// again).
    fn end_session(_conn: &mut Conn<Self>, _session: &Session) -> Result<bool, Failure> {
        Ok(true)
    }

    /// Sets the deadline of the calls that follow on `conn`. A backend that runs inline
    /// returns a [`FailureKind::Broken`] failure from a call still unanswered at the deadline.
    fn set_deadline(_conn: &mut Conn<Self>, _deadline: Instant) {}

    /// Starts this database's release notifications, if it has any: a listener (its own
    /// connection and thread, outside the pools) that subscribes when `requests` delivers,
    /// reports to `handler` every row of `table.table` released in `table.region` while
    /// subscribed, ticks about once a second, and does what `handler` replies (see
    /// [`crate::wakeups`]). It ends when `handler` says [`ListenerReply::Stop`] or `requests`
    /// disconnects. Unsubscribed for `idle_timeout`, it closes its connection (the next
    /// subscription opens one). `pool` is the store's main pool, for the listener's own
    /// statements (PostgreSQL's decides there whether to connect). Returns whether a listener
    /// was started; the default is none (waiters rely on polling).
    fn listen_for_releases(
        _manager: &Self::Manager,
        _pool: &pools::Pool<Self::Manager>,
        _table: &TableSettings,
        _idle_timeout: Duration,
        _handler: ListenerHandler,
        _requests: crossbeam_channel::Receiver<()>,
    ) -> bool {
        false
    }

    /// Whether a lock's waiting thread sleeps on its own until its key is released
    /// ([`Backend::release_wait`]) instead of hearing of releases through the listener.
    const WAITERS_WAIT_THEMSELVES: bool = false;

    /// A waiting thread's own sleep until `lock_key` is released elsewhere (see
    /// [`Backend::WAITERS_WAIT_THEMSELVES`]); `None` when it cannot have one (it polls).
    fn release_wait(
        _manager: &Self::Manager,
        _table: &TableSettings,
        _lock_key: &str,
    ) -> Option<Box<dyn ReleaseWait>> {
        None
    }

    /// Ends every [`Backend::release_wait`] sleep of `lock_key` now (a registry closing), as
    /// a release would.
    fn interrupt_release_waits(_manager: &Self::Manager, _table: &TableSettings, _lock_key: &str) {}

    /// Whether the listener serves only the keys its registry waits for (it learns them
    /// through [`ListenerEvent::Watched`], and each newly waited-for key sends a request).
    const LISTENER_WATCHES_KEYS: bool = false;

    /// How many waited-for keys such a listener serves at most: beyond that, some keys have no
    /// watcher and their waiters only poll.
    const LISTENER_WATCHED_KEYS_MAX: usize = usize::MAX;

    /// Wake-up work after a grant of `lock_key` (MySQL takes the key's named lock). Must not
    /// block; `idle_timeout` is the registry's `idle_connection_timeout`.
    fn granted(
        _manager: &Self::Manager,
        _table: &TableSettings,
        _lock_key: &str,
        _idle_timeout: Duration,
    ) {
    }

    /// Wake-up work after a release statement of `lock_key`, for a database whose release
    /// statement cannot wake other instances itself (PostgreSQL's does, with `pg_notify`):
    /// `released` is `Some(true)` when it released the row, `Some(false)` when the lease had
    /// been lost, `None` when the outcome is unknown; `wakes`: whether the release wakes
    /// waiters (a release that ends a turn, or keeps the row, does not). Must not block.
    fn release_done(
        _manager: &Self::Manager,
        _table: &TableSettings,
        _lock_key: &str,
        _released: Option<bool>,
        _wakes: bool,
    ) {
    }

    /// A statement without parameters returning the database clock (UTC) in microseconds
    /// since the Unix epoch; run through [`Backend::acquire`].
    fn clock_sql() -> &'static str;

    /// The statements of a batch renewal for `table` (see [`Backend::renew_batch`]).
    fn renew_batch_sql(table: &str) -> Vec<String>;

    /// Renews many leases of one time-to-live with `sql` (from [`Backend::renew_batch_sql`]):
    /// parameter 1 is a JSON array of `pairs` `[LOCK_KEY, token]` pairs, 2–4 as for renew;
    /// each pair's row is renewed under renew's conditions (client, token, not expired). A row
    /// another session holds locked must be skipped, never waited for, and returned in
    /// [`BatchRows::busy`] when it still matches those conditions. No row lock it takes may
    /// outlast a round trip: a holder stopped between two of its statements (SIGSTOP, a VM
    /// pause) must leave no row locked, so each statement that locks rows runs alone in
    /// autocommit, or the whole transaction goes in one round trip.
    fn renew_batch(
        conn: &mut Conn<Self>,
        sql: &[String],
        params: &Params,
        pairs: usize,
    ) -> Result<BatchRows, Failure>;

    /// Whether another session can hold one row of the table locked (a transaction that
    /// updated it, `SELECT … FOR UPDATE`), so that a statement could wait on it. Then even a
    /// single background renewal runs through [`Backend::renew_batch`], which skips such rows:
    /// a renewal that waited would hold a renewal worker, and with it the leases queued behind.
    const ROW_LOCKS: bool = true;

    /// Whether the main pool keeps the connection last given back parked for the next caller,
    /// outside r2d2's checkout (see `pools`, "The parked connection"): SQLite's, whose
    /// connections are local files that no server closes behind the pool's back.
    const PARKS_CONNECTION: bool = false;
}

/// A server session that ran a statement given up without an answer: its id on its server,
/// and that server instance (its name where the backend has one, and when it started), so that
/// it is looked for only there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Session {
    pub id: i64,
    pub server: (String, i64),
}

/// What a batch renewal found: the pairs renewed, and the pairs still this client's whose rows
/// another session held locked (skipped).
#[derive(Debug, Default)]
pub(crate) struct BatchRows {
    pub renewed: Vec<(String, i64)>,
    pub busy: Vec<(String, i64)>,
}
