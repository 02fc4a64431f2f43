//! MySQL and MariaDB: their SQL, their connections and their error mapping, nothing else.
//!
//! # Parameters
//!
//! MySQL only has positional `?` placeholders, so statements name the documented parameters
//! (see [`Statements`]) instead of numbering them:
//!
//! | # | name |
//! |---|------|
//! | 1 | `:lock_key` |
//! | 2 | `:region` |
//! | 3 | `:client_id` |
//! | 4 | `:ttl_micros` |
//! | 5 | `:token` |
//!
//! A name may appear any number of times. Each connection turns a statement into `?` form once
//! and remembers which parameter each `?` takes. A statement written with plain `?` instead
//! binds parameters 1, 2, 3, … in order (a prefix, as on the other databases). Any other name
//! is rejected when the statement is checked.
//!
//! # Time
//!
//! Every timestamp is `UTC_TIMESTAMP(6)` in a `DATETIME(6)` column: the database's clock in UTC
//! whatever the session time zone, fixed for the whole statement. The fencing-token floor is
//! the same instant as microseconds since the epoch, `TIMESTAMPDIFF` from 1970 (pure
//! arithmetic on UTC values; `UNIX_TIMESTAMP` would go through the session time zone).
//!
//! # The statements
//!
//! - **acquire** is one statement, one round trip:
//!   `INSERT … VALUES (…, LAST_INSERT_ID(GREATEST(clock µs, floor + 1))) ON DUPLICATE KEY
//!   UPDATE` with every column set to `IF(EXPIRED_AFTER < now, new value, old value)`, where
//!   floor is the deletion floor's mark for the key (0 if none; see [`super`]).
//!   `EXPIRED_AFTER` is assigned last, because MySQL evaluates the assignments left to right
//!   and later ones see earlier results. The token travels back in the OK packet's insert id:
//!   `LAST_INSERT_ID(expr)` makes the server report `expr`, so the insert reports its token, a
//!   takeover reports `LAST_INSERT_ID(GREATEST(FENCING_TOKEN + 1, clock µs, floor + 1))`, and a
//!   held lock evaluates
//!   `FENCING_TOKEN + LAST_INSERT_ID(0)` — the token unchanged, the reported id 0. A non-zero id
//!   therefore means granted (tokens are never 0; for id 0 see "Triggers" below). When the
//!   lock is held the row is set to its own values, which InnoDB skips: no redo, no sync. Two
//!   acquirers of one key serialize on the row (or on the duplicate key); the second sees the
//!   first's new `EXPIRED_AFTER` and changes nothing. A deadlock victim (1213) is retried.
//!   An acquire does not wait for a row lock, though (see [`RowLockWaits`]): one that finds
//!   the row locked looks again twice within a few milliseconds on MariaDB and is then
//!   refused as held. Reading the floor is a primary-key lookup that, as every read inside an
//!   `INSERT` under `REPEATABLE READ`, share-locks the floor's row (or the gap where it would
//!   be) until the statement ends: acquires do not block each other, a deletion of a key with
//!   the same first two characters blocks them (until its commit: a deletion that lasts is
//!   treated as a locked row) and they it, and the rare deadlock of an acquire with such a
//!   deletion is retried. It also means an acquire always sees the deletions committed before
//!   it.
//!   A replacement acquire statement may return the token this way too (it then counts as
//!   returning one column when it is checked: its text must contain `LAST_INSERT_ID(`), or as
//!   a one-column row.
//! - **renew** moves `EXPIRED_AFTER` to now + `:ttl_micros` µs where key, region, client and
//!   token match and the lease has not expired.
//! - **release** sets `CLIENT_ID = NULL, EXPIRED_AFTER = 1970` under the same condition. It is
//!   durable like every commit: `innodb_flush_log_at_trx_commit` is global, there is no
//!   per-session way to skip the sync.
//!
//! Connections set `CLIENT_FOUND_ROWS`, so an `UPDATE` reports the rows it matched rather than
//! the rows it changed: a renew that happens to write the same `EXPIRED_AFTER` twice still
//! counts as renewed. For acquire this means one affected row both for an insert and for a
//! held lock (found, set to its own values), and two for an update (a re-grant or takeover).
//!
//! # Triggers
//!
//! An `INSERT` or `UPDATE` trigger on the lock table hides the insert id: on MariaDB 10.11 any
//! such trigger (an audit trail inserting into an `AUTO_INCREMENT` table, or one that only
//! sets a variable) makes the OK packet report 0 whatever `LAST_INSERT_ID(expr)` set, so every
//! grant would look refused while its row was written. Nothing else in the OK packet tells an
//! insert from a held lock (one affected row each; the `Duplicates` of an `INSERT … SELECT`
//! count changed rows only). The session's `LAST_INSERT_ID()` keeps the statement's value (a
//! trigger's changes to it end with the trigger, as MySQL documents), so acquire reads it back
//! with `SELECT LAST_INSERT_ID()`, one more round trip, when the id may be hidden:
//! - a non-zero id is the token: one round trip, triggers or not;
//! - id 0 with two affected rows: the row was updated, which only a grant does; the token is
//!   read back, and the registry marks its table as one that hides ids;
//! - id 0 with one affected row: held, or inserted under a trigger. On a marked table the
//!   session is asked (0 there means held); otherwise it is held.
//!
//! `build()` marks the table when `information_schema.TRIGGERS` lists an `INSERT` or `UPDATE`
//! trigger on it, and while the table is unmarked an acquire that reports id 0 looks again
//! when the last look is 5 s old (one query of `information_schema`, 0.2–0.7 ms here, at most
//! every 5 s).
//! Costs measured here (MariaDB 10.11, local): a refused try 43–100 µs, with the read-back
//! 95–200 µs; a table without such triggers keeps one round trip per try, and one with them
//! pays the second only when the OK packet says nothing. Not covered: a trigger this user
//! cannot see (`information_schema` lists only tables it has the `TRIGGER` privilege on), and
//! the first 5 s of one created while the registry runs. Until the registry's first re-grant
//! or takeover comes back without an id, an insert under such a trigger is reported refused and
//! its row stays taken until its lease expires.
//!
//! Pooling: connections live in the crate's shared r2d2 pools (main and renewal), through a
//! small connection manager of this module, rather than in the `mysql` crate's own pool or
//! `r2d2_mysql`. One pool implementation for all backends keeps deadlines, retries and the
//! renewal pool in one place; `r2d2_mysql` would also pull in C zlib, and the driver's own pool
//! pings on checkout and resets sessions on return (two extra round trips per statement).
//!
//! Prepared statements: each connection prepares a statement the first time it runs it and
//! then calls it by its handle (`Plan`), without the driver's `prep` on every call. The
//! driver's own per-connection cache (`stmt_cache_size` in the URL, 32 by default; a registry
//! uses a handful) may close a handle when more statements pass through it; the server refuses
//! a closed handle before running anything, and the statement is prepared again
//! (`MysqlConn::run`). `stmt_cache_size=0` is safe too: each statement is prepared once per
//! connection and closed with it. The one-off statements of `build()` and of the trigger
//! checks are closed right after their call (`exec_once`), and the registry's connections
//! outside the pools (named locks, [`wakeups`]) keep a statement cache of their own whatever
//! the URL says: the driver's `exec` of a text with the cache off prepares a statement on
//! every call and never closes it.
//!
//! Connections are checked once when the registry is built, so a wrong password or database
//! name is reported as such instead of as a pool timeout.
//!
//! Several servers (a Galera cluster, a primary and its replicas):
//! `mysql://user@db1:3306,db2:3306,db3:3306/locks?…` lists hosts separated by commas, each with
//! its port (the user, database and options are shared). Every connection — the one checked at
//! build and each pooled one — tries them in order and keeps the first that accepts writes:
//! with several hosts a new connection also asks `@@global.read_only` and, on Galera,
//! `wsrep_ready`, and passes over a read-only server or a node outside the primary component.
//! A statement that such a node refuses (1047, "WSREP has not yet prepared node for
//! application use") or that a read-only server refuses (1290) drops its connection; one that
//! Galera aborts on a certification conflict comes back as a deadlock (1213) and is retried.
//!
//! Deadlines: statements run inline, on their caller's thread (no statement thread, no thread
//! hop), and the connection's socket carries the caller's deadline. The driver has no per-call
//! timeout, but `mysql::Conn` exposes its socket's descriptor: when the attempt begins
//! ([`MysqlConn::arm`]; before each call to the driver if the watchdog below is not running)
//! the socket's `SO_RCVTIMEO` and `SO_SNDTIMEO` are set to the time left before the deadline
//! (or to the URL's or the pool's socket timeout, if shorter). A read or write still waiting at the deadline then fails with
//! `EAGAIN`, which [`classify`] takes for a broken connection: the connection is discarded
//! (the driver may be in the middle of a packet, so it never goes back to the pool), replaced
//! at once for callers waiting for one, and the pool's idle connections go with it, as after
//! any broken connection. Its drop still writes (closing its statements, `COM_QUIT`), with
//! 1 ms timeouts (`mark_broken`). Under TLS the descriptor is the TCP socket that the TLS
//! stream reads and writes; the driver's switch to the server's Unix socket for a local server
//! (`prefer_socket`) gives a Unix socket, which takes the same options. Once the deadline has
//! passed, nothing more is sent. A server that did not answer in time may still run the
//! statement (one waiting for a row lock runs once it gets the row): as before, an acquire
//! granted after its caller gave up is left to expire, and a renewal's outcome counts as
//! unknown from its send time.
//!
//! What the socket alone does not bound: a result that trickles in. Each read waits at most
//! for what was left when its call began, so a server that kept sending a few bytes within
//! every timeout could hold a call long after its deadline. The deadline watchdog
//! ([`watchdog`]: one thread per process, which only ever calls `shutdown(2)`) shuts the
//! socket of an attempt still running at its deadline down, which ends the read at once; the
//! connection is then discarded on its way back to the pool (`tests/mysql_inline.rs`, a proxy
//! that trickles the server's answers a byte every 1.5 s).
//!
//! Outside Unix the descriptor is not reachable and statements run on statement threads
//! ([`crate::backend::statement_threads`]), whose callers stop waiting at their deadline.
//!
//! Sockets also carry read and write timeouts from the start (unless the URL sets its own):
//! the connect timeout for the connection checked at build, the longer of it and
//! `operation_timeout` for pooled connections. They end a connection attempt that was accepted
//! but is never answered, and bound every call as a ceiling. The registry's named-lock
//! connection for wake-ups ([`wakeups`]) is outside the pools, on its own thread, and keeps
//! its own timeouts.

mod tls;
pub(crate) mod wakeups;
mod watchdog;
use crate::backend::pools::Finding;
use crate::backend::{
    AdminStatements, Backend, BatchRows, Conn, Failure, FailureKind, FloorFound, HolderRow,
    ListedRow, Params, PerStatement, Statements,
};
use crate::error::Error;
use mysql::consts::CapabilityFlags;
use mysql::prelude::Queryable;
use mysql::{Opts, OptsBuilder, SslOpts, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tls::{split_mysql, tls_problem, with_tls, MysqlTls};

/// Database "now": UTC, microseconds, fixed for the statement.
pub(crate) const NOW: &str = "UTC_TIMESTAMP(6)";
/// Database "now" plus parameter 4 (µs).
const NOW_PLUS_TTL: &str = "UTC_TIMESTAMP(6) + INTERVAL :ttl_micros MICROSECOND";
/// Database clock in microseconds since the Unix epoch: the floor of a new fencing token.
const CLOCK_MICROS: &str = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";
/// How `EXPIRED_AFTER` marks a released row.
const RELEASED: &str = "'1970-01-01 00:00:00'";
/// Parameter names, in the documented order.
const NAMES: [&str; 6] = [
    "lock_key",
    "region",
    "client_id",
    "ttl_micros",
    "token",
    "lock_name",
];

/// Opens MySQL connections from one set of options.
#[derive(Clone)]
pub(crate) struct MysqlManager {
    /// One per host, tried in order.
    opts: Vec<Opts>,
    /// `ssl-mode=PREFERRED`: a server that does not offer TLS is connected to without it.
    prefer_tls: bool,
    /// The registry's named-lock thread (see [`wakeups`]), started at its first
    /// grant.
    named_locks: std::sync::Arc<std::sync::OnceLock<wakeups::NamedLocks>>,
    /// Shared by the registry's connections.
    ids: Arc<InsertIds>,
    /// Whether the server is MariaDB (rather than MySQL), once the first pooled connection
    /// has asked (see [`RowLockWaits`]).
    mariadb: Arc<std::sync::OnceLock<bool>>,
}

impl MysqlManager {
    /// A connection outside the pools for release wake-ups: reads wait at most 5 s more than
    /// the longest `GET_LOCK` it runs. With several hosts, to the first that accepts writes,
    /// as for pooled connections. It keeps the driver's statement cache (at least
    /// [`SIDE_STMT_CACHE`] statements) whatever the URL's `stmt_cache_size`: its statements
    /// go through the driver's `exec`, which with the cache off prepares a statement on every
    /// call and never closes it.
    pub(super) fn open_side_connection(&self) -> Result<mysql::Conn, mysql::Error> {
        let hosts: Vec<Opts> = self
            .opts
            .iter()
            .map(|opts| {
                let cache = opts.get_stmt_cache_size().max(SIDE_STMT_CACHE);
                OptsBuilder::from_opts(opts.clone())
                    .read_timeout(Some(Duration::from_secs(6)))
                    .write_timeout(Some(Duration::from_secs(6)))
                    .stmt_cache_size(cache)
                    .into()
            })
            .collect();
        open_writable(&hosts, self.prefer_tls)
    }

    /// A copy for wake-up threads: the same server and options, without this manager's
    /// named-lock thread (which would otherwise keep itself alive through its own copy).
    pub(super) fn detached(&self) -> MysqlManager {
        MysqlManager {
            opts: self.opts.clone(),
            prefer_tls: self.prefer_tls,
            named_locks: Default::default(),
            ids: Arc::clone(&self.ids),
            mariadb: Arc::clone(&self.mariadb),
        }
    }
}

/// The driver's statement cache of connections outside the pools (see
/// [`MysqlManager::open_side_connection`]): more than the few statements they run.
const SIDE_STMT_CACHE: usize = 8;

/// Runs the one-off statement `sql` (not a lease statement: the table checks of `build()`, a
/// look at the triggers) with `params` through `call`, and closes it on the server. The
/// driver's `exec` with a text prepares it and leaves the closing to its statement cache,
/// which a URL may turn off (`stmt_cache_size=0`): the statement would then stay open on the
/// server until the connection closes.
fn exec_once<T>(
    conn: &mut mysql::Conn,
    sql: &str,
    params: impl Into<mysql::Params>,
    call: impl FnOnce(&mut mysql::Conn, &mysql::Statement, mysql::Params) -> mysql::Result<T>,
) -> Result<T, Failure> {
    let statement = conn.prep(sql).map_err(classify)?;
    let outcome = call(conn, &statement, params.into()).map_err(classify);
    // Closing writes one packet and waits for no answer; with the driver's cache on, it also
    // takes the statement out of the cache.
    let closed = conn.close(statement).map_err(classify);
    let value = outcome?;
    closed?;
    Ok(value)
}

/// A statement in `?` form and the parameter (index into [`NAMES`]) each `?` takes; `None` for
/// a statement written with plain `?`, which takes parameters 1, 2, 3, … in order.
///
/// `statement` is the statement the connection prepared for it, kept so that a call does not
/// go through the driver's `prep` again: that parses the text for named parameters and hashes
/// it for the driver's cache on every call (about 37,000 instructions for the acquire
/// statement, the largest part of what the registry added to an uncontended `lock()` +
/// `unlock()`). The driver's cache may still close it when more than `stmt_cache_size`
/// statements pass through it; the server then refuses it before it runs
/// ([`UNKNOWN_STATEMENT`]) and [`MysqlConn::run`] prepares it again. With `stmt_cache_size=0`
/// the driver caches and closes nothing, and this is the only copy: prepared once per
/// connection instead of once per call (each of which stayed open on the server until the
/// connection closed).
struct Plan {
    query: String,
    order: Option<Vec<usize>>,
    statement: Option<mysql::Statement>,
}

/// "Unknown prepared statement handler": a statement that was closed (by the driver's cache,
/// see [`Plan`]); the server checks the handle before anything runs.
const UNKNOWN_STATEMENT: u16 = 1243;

/// "Lock wait timeout exceeded": a statement gave up waiting for a row another session holds
/// locked (the whole statement is rolled back; in autocommit, nothing of it remains).
const LOCK_WAIT_TIMEOUT: u16 = 1205;

/// How long a statement may wait for a row lock (see [`RowLockWaits`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Waits {
    /// As the session says: the server's `innodb_lock_wait_timeout` on MariaDB, 1 s on MySQL.
    AsConfigured,
    /// Not at all on MariaDB; on MySQL as configured (1 s, MySQL's least).
    Never,
}

/// Row locks and waiting. Other sessions (a `mysql` client's `SELECT … FOR UPDATE`, a
/// migration, a long transaction) can hold a lock row locked for as long as they like.
///
/// - No statement of a registry holds a row lock past its own end: every statement runs in
///   autocommit, alone (the batch renewal too, see [`Mysql::renew_batch_sql`]), so a holder
///   frozen between two statements (stopped, paused in a debugger, a VM pause) holds no row.
/// - The batch renewal never waits for a row: it skips rows another session holds locked
///   (`FOR UPDATE SKIP LOCKED`) and reports them as busy; a lone lease renews through it too.
/// - An acquire waits for no row on MariaDB (`SET STATEMENT innodb_lock_wait_timeout=0 FOR`
///   before it) and at most 1 s on MySQL (the session's `innodb_lock_wait_timeout`, whose
///   least value is 1 s; MySQL has no per-statement form). A row still locked makes the acquire
///   come back refused, as for a held lock — on MariaDB after two more looks within a few
///   milliseconds, since statements of leasehold itself hold a row for microseconds — and a
///   semaphore's poller goes on to the next permit.
/// - Other statements (a manual renewal, a release, administration) wait as the session says
///   (the server's setting on MariaDB, 1 s on MySQL) and are retried until their deadline.
struct RowLockWaits;

impl RowLockWaits {
    /// Run once on each pooled MySQL connection.
    const MYSQL_SESSION: &'static str = "SET SESSION innodb_lock_wait_timeout = 1";
    /// Put before an acquire statement on MariaDB.
    const MARIADB_PREFIX: &'static str = "SET STATEMENT innodb_lock_wait_timeout=0 FOR ";
    /// The pauses before the acquire of a locked row looks again; then it is refused.
    const ACQUIRE_RETRIES: [Duration; 2] = [Duration::from_millis(1), Duration::from_millis(4)];
}

/// Whether `failure` is a statement that gave up waiting for a row lock.
fn row_locked(failure: &Failure) -> bool {
    matches!(
        failure.source.downcast_ref::<mysql::Error>(),
        Some(mysql::Error::MySqlError(e)) if e.code == LOCK_WAIT_TIMEOUT
    )
}

/// A connection, the plans of the statements it ran, the flag `mark_broken` sets, and the
/// deadline its statements must keep (see the module docs, "Deadlines").
pub(crate) struct MysqlConn {
    conn: mysql::Conn,
    plans: PerStatement<Plan>,
    broken: bool,
    /// Shared by the registry's connections.
    ids: Arc<InsertIds>,
    /// The current attempt's deadline (`set_deadline`); `None` until the first.
    deadline: Option<Instant>,
    /// The socket's read and write timeouts from the URL or the pool's settings: a
    /// statement's reads and writes wait no longer than these either.
    configured: (Option<Duration>, Option<Duration>),
    /// The watchdog's watch of the current attempt's deadline (see [`watchdog`]).
    watch: Option<watchdog::Watch>,
    /// The deadline the socket's timeouts were last set for: while watched, the later calls of
    /// an attempt leave them as they are.
    armed: Option<Instant>,
    /// The server is MariaDB: acquire statements run with `SET STATEMENT
    /// innodb_lock_wait_timeout=0 FOR` (see [`RowLockWaits`]).
    mariadb: bool,
}

impl MysqlConn {
    /// Ends the current attempt's watch; a watch that fired (its socket was shut down in the
    /// middle of whatever it was doing) marks the connection broken.
    fn end_watch(&mut self) {
        if self.watch.take().is_some_and(watchdog::Watch::end) {
            self.broken = true;
        }
    }
}

impl Drop for MysqlConn {
    fn drop(&mut self) {
        // Before the socket closes, so the watchdog never shuts a reused descriptor down.
        self.end_watch();
    }
}

/// What a registry knows of its lock table's triggers (see the module docs, "Triggers").
#[derive(Default)]
struct InsertIds {
    /// The table has triggers that hide an acquire's insert id: an acquire that reports none
    /// asks the session.
    hidden: AtomicBool,
    /// The table, once `build()` looked at its triggers.
    table: std::sync::OnceLock<String>,
    /// When its triggers were last looked at.
    checked: parking_lot::Mutex<Option<std::time::Instant>>,
}

impl InsertIds {
    /// How often an acquire that reports no id looks at the triggers again, while none were
    /// found.
    const RECHECK: Duration = Duration::from_secs(5);

    /// Whether an acquire that reported no id must ask the session: the table has id-hiding
    /// triggers, as known or as found now when the last look is older than [`Self::RECHECK`].
    fn hidden(&self, conn: &mut MysqlConn) -> bool {
        if self.hidden.load(Ordering::Relaxed) {
            return true;
        }
        let Some(table) = self.table.get() else {
            return false;
        };
        {
            let mut checked = self.checked.lock();
            if checked.is_some_and(|at| at.elapsed() < Self::RECHECK) {
                return false;
            }
            *checked = Some(std::time::Instant::now());
        }
        // A look that fails changes nothing: the acquire's own answer stands (but a look
        // that broke the connection gets it discarded).
        let looked = conn.arm().and_then(|()| self.look(&mut conn.conn, table));
        if matches!(&looked, Err(f) if f.kind == FailureKind::Broken) {
            conn.broken = true;
        }
        looked.is_ok_and(|(_, hiders)| hiders > 0)
    }

    /// Counts the triggers of `table`: those named as the deletion floor's, and those that
    /// fire on `INSERT` or `UPDATE` (which hide insert ids; marks the table when there are).
    /// `information_schema` lists only tables this user has the `TRIGGER` privilege on.
    fn look(&self, conn: &mut mysql::Conn, table: &str) -> Result<(i64, i64), Failure> {
        let (schema, name) = match table.split_once('.') {
            Some((schema, name)) => (Value::from(schema), name),
            None => (Value::NULL, table),
        };
        let counts: (i64, i64) = exec_once(
            conn,
            "SELECT CAST(COALESCE(SUM(UPPER(TRIGGER_NAME) = UPPER(?)), 0) AS SIGNED), \
             CAST(COALESCE(SUM(EVENT_MANIPULATION <> 'DELETE'), 0) AS SIGNED) \
             FROM information_schema.TRIGGERS \
             WHERE EVENT_OBJECT_SCHEMA = COALESCE(?, DATABASE()) AND EVENT_OBJECT_TABLE = ?",
            (crate::backend::floor_trigger(table), schema, name),
            |c, statement, params| c.exec_first(statement, params),
        )?
        .unwrap_or((0, 0));
        if counts.1 > 0 {
            self.hidden.store(true, Ordering::Relaxed);
        }
        Ok(counts)
    }
}

impl MysqlConn {
    /// Bounds the socket's reads and writes by the time left before the deadline, just before
    /// a call to the driver: once per attempt while the deadline watchdog watches it (which
    /// ends any call still running at the deadline), else before each call (a call that
    /// follows one answered late waits only for what is left). A read still unanswered then
    /// fails (`EAGAIN`), which
    /// [`classify`] takes for a broken connection: it is discarded, never used again in an
    /// unknown state. Once the deadline has passed, nothing is sent (a transient failure: the
    /// retry loop then reports the timeout).
    fn arm(&mut self) -> Result<(), Failure> {
        let Some(deadline) = self.deadline else {
            return Ok(());
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Failure::new(
                FailureKind::Transient,
                "the deadline passed before the statement was sent",
                "deadline passed",
            ));
        }
        // Watched, and armed when the attempt began (`set_deadline`): the socket's timeouts
        // are no shorter than needed, and the watchdog ends the call at the deadline.
        if self.watch.is_some() && self.armed == Some(deadline) {
            return Ok(());
        }
        let (read, write) = self.configured;
        let within = |configured: Option<Duration>| configured.map_or(left, |c| c.min(left));
        self.armed = Some(deadline);
        set_socket_timeouts(&self.conn, within(read), within(write)).map_err(|e| {
            Failure::new(
                FailureKind::Broken,
                format!("could not set the MySQL socket's timeouts: {e}"),
                e,
            )
        })
    }

    /// The statement prepared for `sql` on this connection (prepared now if it has none, see
    /// [`Plan`]) with its values, the socket armed for the call that follows
    /// ([`MysqlConn::arm`]).
    fn bind(
        &mut self,
        sql: &str,
        params: &Params,
        waits: Waits,
    ) -> Result<(mysql::Statement, Vec<Value>), Failure> {
        self.arm()?;
        if self.plans.get(sql).is_none() {
            let mut plan = plan(sql)?;
            if waits == Waits::Never && self.mariadb {
                plan.query.insert_str(0, RowLockWaits::MARIADB_PREFIX);
            }
            self.plans.insert(sql, plan);
        }
        let MysqlConn { plans, conn, .. } = self;
        let plan = plans.get_mut(sql).expect("kept above");
        let statement = match &plan.statement {
            Some(statement) => statement.clone(),
            None => {
                let statement = conn.prep(&plan.query).map_err(classify)?;
                plan.statement = Some(statement.clone());
                statement
            }
        };
        let values = match &plan.order {
            Some(order) => order.iter().map(|&index| value(params, index)).collect(),
            None => (0..usize::from(statement.num_params()).min(NAMES.len()))
                .map(|index| value(params, index))
                .collect(),
        };
        Ok((statement, values))
    }

    /// Runs the statement of `sql` with `params` through `call`. One that the driver's cache
    /// closed since it was kept ([`Plan`]) is refused before it runs; it is prepared again and
    /// called once more.
    fn run<T>(
        &mut self,
        sql: &str,
        params: &Params,
        call: impl FnMut(&mut mysql::Conn, &mysql::Statement, Vec<Value>) -> mysql::Result<T>,
    ) -> Result<T, Failure> {
        self.run_with(sql, params, Waits::AsConfigured, call)
    }

    /// [`MysqlConn::run`], with `waits` saying how long the statement may wait for a row lock.
    fn run_with<T>(
        &mut self,
        sql: &str,
        params: &Params,
        waits: Waits,
        mut call: impl FnMut(&mut mysql::Conn, &mysql::Statement, Vec<Value>) -> mysql::Result<T>,
    ) -> Result<T, Failure> {
        let (statement, values) = self.bind(sql, params, waits)?;
        match call(&mut self.conn, &statement, values) {
            Err(mysql::Error::MySqlError(e)) if e.code == UNKNOWN_STATEMENT => {
                if let Some(plan) = self.plans.get_mut(sql) {
                    plan.statement = None;
                }
                let (statement, values) = self.bind(sql, params, waits)?;
                call(&mut self.conn, &statement, values).map_err(classify)
            }
            other => other.map_err(classify),
        }
    }
}

/// Parameter `index` (0-based) of `params`.
fn value(params: &Params, index: usize) -> Value {
    match index {
        0 => Value::from(params.lock_key),
        1 => Value::from(params.region),
        2 => Value::from(params.client_id),
        3 => Value::Int(params.ttl_micros),
        4 => Value::Int(params.token),
        _ => Value::from(params.name),
    }
}

/// Rewrites named parameters to `?` and records which parameter each one takes. Quoted
/// strings, quoted identifiers and comments are copied as they are.
fn plan(sql: &str) -> Result<Plan, Failure> {
    let rejected = |reason: String| {
        Failure::new(
            FailureKind::Fatal,
            format!("the statement's parameters are not usable: {reason}"),
            reason,
        )
    };
    let bytes = sql.as_bytes();
    let mut query = String::with_capacity(sql.len());
    let mut order = Vec::new();
    let mut positional = false;
    let mut copied = 0;
    let mut i = 0;
    // Index just past the end of the quoted run, comment or name starting at `i`.
    let skip_to = |from: usize, end: &[u8]| {
        bytes[from..]
            .windows(end.len())
            .position(|w| w == end)
            .map_or(bytes.len(), |at| from + at + end.len())
    };
    while i < bytes.len() {
        match bytes[i] {
            quote @ (b'\'' | b'"') => {
                i += 1;
                while i < bytes.len() && bytes[i] != quote {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'`' => i = skip_to(i + 1, b"`"),
            b'#' => i = skip_to(i, b"\n"),
            b'-' if bytes.get(i + 1) == Some(&b'-')
                && bytes.get(i + 2).is_none_or(|c| c.is_ascii_whitespace()) =>
            {
                i = skip_to(i, b"\n")
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => i = skip_to(i + 2, b"*/"),
            b'?' => {
                positional = true;
                i += 1;
            }
            b':' if bytes
                .get(i + 1)
                .is_some_and(|c| c.is_ascii_lowercase() || *c == b'_') =>
            {
                let start = i + 1;
                let end = bytes[start..]
                    .iter()
                    .position(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_'))
                    .map_or(bytes.len(), |len| start + len);
                let name = &sql[start..end];
                let index = NAMES
                    .iter()
                    .position(|known| *known == name)
                    .ok_or_else(|| {
                        rejected(format!(
                            "unknown parameter :{name}; use :lock_key, :region, :client_id, \
                         :ttl_micros and :token"
                        ))
                    })?;
                order.push(index);
                query.push_str(&sql[copied..i]);
                query.push('?');
                copied = end;
                i = end;
            }
            _ => i += 1,
        }
    }
    query.push_str(&sql[copied..]);
    if order.is_empty() {
        return Ok(Plan {
            query,
            order: None,
            statement: None,
        });
    }
    if positional {
        return Err(rejected(
            "it mixes named parameters and `?`; use one style".to_string(),
        ));
    }
    Ok(Plan {
        query,
        order: Some(order),
        statement: None,
    })
}

impl r2d2::ManageConnection for MysqlManager {
    type Connection = MysqlConn;
    type Error = mysql::Error;

    fn connect(&self) -> Result<MysqlConn, mysql::Error> {
        let opts = &self.opts[0];
        let mut conn = open_writable(&self.opts, self.prefer_tls)?;
        let mariadb = match self.mariadb.get() {
            Some(mariadb) => *mariadb,
            None => {
                let version: Option<String> = conn.query_first("SELECT VERSION()")?;
                let mariadb = version.is_some_and(|v| v.contains("MariaDB"));
                *self.mariadb.get_or_init(|| mariadb)
            }
        };
        if !mariadb {
            conn.query_drop(RowLockWaits::MYSQL_SESSION)?;
        }
        Ok(MysqlConn {
            conn,
            mariadb,
            plans: PerStatement::new(),
            broken: false,
            ids: Arc::clone(&self.ids),
            deadline: None,
            configured: (
                opts.get_read_timeout().copied(),
                opts.get_write_timeout().copied(),
            ),
            watch: None,
            armed: None,
        })
    }

    fn is_valid(&self, conn: &mut MysqlConn) -> Result<(), mysql::Error> {
        conn.conn.ping()
    }

    fn has_broken(&self, conn: &mut MysqlConn) -> bool {
        // On its way back to the pool: its attempt is over.
        conn.end_watch();
        conn.broken
    }
}

/// The MySQL / MariaDB backend.
pub(crate) struct Mysql;

/// One acquire statement (or a statement run the way an acquire is, see
/// [`Backend::read_number`]): `Some((token, inserted))` when granted.
fn acquire_once(
    conn: &mut MysqlConn,
    sql: &str,
    params: &Params,
    waits: Waits,
) -> Result<Option<(i64, bool)>, Failure> {
    /// What the acquire statement answered: a row (a statement that returns the token),
    /// or the affected rows and the insert id (the default, which sets it).
    enum Answer {
        Row(Option<mysql::Row>),
        Written { affected: u64, id: u64 },
    }
    let answer = conn.run_with(sql, params, waits, |c, statement, values| {
        if statement.num_columns() > 0 {
            c.exec_first(statement, values).map(Answer::Row)
        } else {
            c.exec_drop(statement, values).map(|()| Answer::Written {
                affected: c.affected_rows(),
                id: c.last_insert_id(),
            })
        }
    })?;
    // Whether the grant inserted the row (there was none): one affected row for an insert,
    // two for the update of an expired row (a replacement that returns the token: unknown).
    let mut inserted = false;
    let token = match answer {
        Answer::Row(row) => match row.and_then(|row| row.get_opt::<i64, usize>(0)) {
            None => return Ok(None),
            Some(token) => token.map_err(|e| {
                Failure::new(
                    FailureKind::Fatal,
                    "the acquire statement must return the fencing token as a BIGINT",
                    e.to_string(),
                )
            })?,
        },
        Answer::Written { affected, id } => {
            inserted = affected == 1;
            let id = match (id, affected) {
                // Two rows: the row was updated, which only a grant does (a held lock is
                // set to its own values: one row with CLIENT_FOUND_ROWS). A trigger hid
                // the id.
                (0, 2..) => {
                    conn.ids.hidden.store(true, Ordering::Relaxed);
                    session_insert_id(conn)?
                }
                // One row: held, or inserted with the id hidden by a trigger.
                (0, _) if Arc::clone(&conn.ids).hidden(conn) => session_insert_id(conn)?,
                (id, _) => id,
            };
            match id {
                0 => return Ok(None),
                id => i64::try_from(id).map_err(|e| {
                    Failure::new(
                        FailureKind::Fatal,
                        "the acquire statement reported a token beyond BIGINT",
                        e,
                    )
                })?,
            }
        }
    };
    Ok(Some((token, inserted)))
}

/// The session's `LAST_INSERT_ID()`: what the last statement set with `LAST_INSERT_ID(expr)`,
/// whatever its triggers did (a trigger's changes end with it).
fn session_insert_id(conn: &mut MysqlConn) -> Result<u64, Failure> {
    conn.arm()?;
    let id: Option<u64> = conn
        .conn
        .query_first("SELECT LAST_INSERT_ID()")
        .map_err(classify)?;
    Ok(id.unwrap_or(0))
}

impl Backend for Mysql {
    type Manager = MysqlManager;

    const NAME: &'static str = "MySQL";
    /// Inline where the socket can carry the deadline (see the module docs, "Deadlines").
    fn runs_inline() -> bool {
        cfg!(unix)
    }
    const DDL_FILE: &'static str = "sql/mysql.sql";
    const DDL: &'static str = include_str!("../../../sql/mysql.sql");
    const FLOOR_DDL_FILE: &'static str = "sql/mysql_floor.sql";
    const FLOOR_DDL: &'static str = include_str!("../../../sql/mysql_floor.sql");
    const SEMAPHORE_DDL_FILE: &'static str = "sql/mysql_semaphore.sql";
    const SEMAPHORE_DDL: &'static str = include_str!("../../../sql/mysql_semaphore.sql");

    fn semaphore_statements(table: &str) -> crate::backend::SemaphoreStatements {
        let table = crate::backend::semaphore_table(table);
        crate::backend::SemaphoreStatements {
            record: format!(
                "INSERT IGNORE INTO {table} (SEM_KEY, REGION, PERMITS) VALUES (:lock_key, :region, :token)"
            ),
            permits: format!("SELECT PERMITS FROM {table} WHERE SEM_KEY = :lock_key AND REGION = :region"),
        }
    }

    const TIMESTAMP_TYPE: &'static str = "DATETIME(6)";
    /// utf8mb4 whatever the table's own character set: any name fits.
    const NAME_TYPE: &'static str = "VARCHAR(1024) CHARACTER SET utf8mb4";
    const RELEASED_TIMESTAMP: &'static str = RELEASED;

    fn default_queries(table: &str, floor: bool, named: bool) -> Statements {
        // Expired, and not reserved for pollers by a release that ended a turn (its
        // CREATED_DATE is in the future; a held row's never exceeds its EXPIRED_AFTER).
        let expired = format!("(EXPIRED_AFTER < {NOW} AND CREATED_DATE <= {NOW})");
        // The lower bounds of a token besides old + 1: the clock, and above the floor; a new
        // row's token is the greatest of them.
        let (bounds, first_token) = if floor {
            let bounds = format!(
                "{CLOCK_MICROS}, IFNULL((SELECT FENCING_TOKEN FROM {floor_table} \
                 WHERE REGION = :region AND KEY_PREFIX = LEFT(:lock_key, 2)), 0) + 1",
                floor_table = crate::backend::floor_table(table)
            );
            let first_token = format!("GREATEST({bounds})");
            (bounds, first_token)
        } else {
            (CLOCK_MICROS.to_string(), CLOCK_MICROS.to_string())
        };
        // The name is set before EXPIRED_AFTER: MySQL assigns left to right, and `expired`
        // reads EXPIRED_AFTER.
        let (name_column, name_value, name_update) = match named {
            true => (
                ", LOCK_NAME",
                ", NULLIF(:lock_name, '')",
                format!(" LOCK_NAME = IF({expired}, NULLIF(:lock_name, ''), LOCK_NAME),"),
            ),
            false => ("", "", String::new()),
        };
        Statements {
            acquire: format!(
                "INSERT INTO {table} (LOCK_KEY, REGION, CLIENT_ID, CREATED_DATE, EXPIRED_AFTER, \
                 FENCING_TOKEN{name_column}) VALUES (:lock_key, :region, :client_id, {NOW}, \
                 {NOW_PLUS_TTL}, LAST_INSERT_ID({first_token}){name_value}) \
                 ON DUPLICATE KEY UPDATE \
                 FENCING_TOKEN = IF({expired}, \
                 LAST_INSERT_ID(GREATEST(FENCING_TOKEN + 1, {bounds})), \
                 FENCING_TOKEN + LAST_INSERT_ID(0)), \
                 CLIENT_ID = IF({expired}, :client_id, CLIENT_ID),{name_update} \
                 CREATED_DATE = IF({expired}, {NOW}, CREATED_DATE), \
                 EXPIRED_AFTER = IF({expired}, {NOW_PLUS_TTL}, EXPIRED_AFTER)"
            ),
            renew: format!(
                "UPDATE {table} SET EXPIRED_AFTER = {NOW_PLUS_TTL} WHERE LOCK_KEY = :lock_key \
                 AND REGION = :region AND CLIENT_ID = :client_id AND FENCING_TOKEN = :token \
                 AND EXPIRED_AFTER >= {NOW}"
            ),
            release: format!(
                "UPDATE {table} SET CLIENT_ID = NULL, EXPIRED_AFTER = {RELEASED}, \
                 CREATED_DATE = {NOW} + INTERVAL :ttl_micros MICROSECOND \
                 WHERE LOCK_KEY = :lock_key AND REGION = :region AND CLIENT_ID = :client_id \
                 AND FENCING_TOKEN = :token AND EXPIRED_AFTER >= {NOW}"
            ),
        }
    }

    fn admin_statements(table: &str, named: bool) -> AdminStatements {
        let name = if named { "LOCK_NAME" } else { "NULL" };
        let micros =
            |column: &str| format!("TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', {column})");
        let keep_until = "CREATED_DATE + INTERVAL :ttl_micros MICROSECOND";
        let cutoff = format!("{NOW} - INTERVAL :ttl_micros MICROSECOND");
        AdminStatements {
            holder: format!(
                "SELECT CLIENT_ID, {created}, {expires}, FENCING_TOKEN, {CLOCK_MICROS} FROM {table} \
                 WHERE LOCK_KEY = :lock_key AND REGION = :region AND CLIENT_ID IS NOT NULL \
                 AND EXPIRED_AFTER >= {NOW}",
                created = micros("CREATED_DATE"),
                expires = micros("EXPIRED_AFTER"),
            ),
            // Byte order (BINARY), whatever the table's collation.
            list: format!(
                "SELECT LOCK_KEY, CLIENT_ID, {created}, {expires}, FENCING_TOKEN, {state}, {name} \
                 FROM {table} WHERE REGION = :region AND BINARY LOCK_KEY > BINARY :lock_key \
                 ORDER BY BINARY LOCK_KEY LIMIT :token",
                created = micros("CREATED_DATE"),
                expires = micros("EXPIRED_AFTER"),
                state = crate::backend::state_sql(NOW),
            ),
            force_release: format!(
                "UPDATE {table} SET CLIENT_ID = NULL, EXPIRED_AFTER = {RELEASED} \
                 WHERE LOCK_KEY = :lock_key AND REGION = :region AND CLIENT_ID IS NOT NULL \
                 AND EXPIRED_AFTER >= {NOW}"
            ),
            delete_released_and_expired: format!(
                "DELETE FROM {table} WHERE REGION = :region AND EXPIRED_AFTER < {cutoff} \
                 AND CREATED_DATE < {cutoff}"
            ),
            // Neither assignment reads a column the other writes (MySQL assigns in order).
            release_keeping: format!(
                "UPDATE {table} SET \
                 CLIENT_ID = CASE WHEN {keep_until} > {NOW} THEN CLIENT_ID END, \
                 FENCING_TOKEN = FENCING_TOKEN + 1, \
                 EXPIRED_AFTER = CASE WHEN {keep_until} > {NOW} THEN {keep_until} \
                 ELSE {RELEASED} END \
                 WHERE LOCK_KEY = :lock_key AND REGION = :region AND CLIENT_ID = :client_id \
                 AND FENCING_TOKEN = :token AND EXPIRED_AFTER >= {NOW}"
            ),
        }
    }

    fn holder(
        conn: &mut Conn<Self>,
        sql: &str,
        params: &Params,
    ) -> Result<Option<HolderRow>, Failure> {
        let row: Option<(String, i64, i64, i64, i64)> =
            conn.run(sql, params, |c, statement, values| {
                c.exec_first(statement, values)
            })?;
        Ok(row.map(
            |(client_id, acquired_micros, expires_micros, token, now_micros)| HolderRow {
                client_id,
                acquired_micros,
                expires_micros,
                token,
                now_micros,
            },
        ))
    }

    fn rows(conn: &mut Conn<Self>, sql: &str, params: &Params) -> Result<Vec<ListedRow>, Failure> {
        type Row = (String, Option<String>, i64, i64, i64, i64, Option<String>);
        let rows: Vec<Row> = conn.run(sql, params, |c, statement, values| {
            c.exec(statement, values)
        })?;
        Ok(rows
            .into_iter()
            .map(
                |(lock_key, client_id, acquired_micros, expires_micros, token, state, name)| {
                    ListedRow {
                        lock_key,
                        client_id,
                        acquired_micros,
                        expires_micros,
                        token,
                        state,
                        name,
                    }
                },
            )
            .collect())
    }

    /// Waits for no row lock (at most 1 s on MySQL): a row another session holds locked is
    /// refused as held, on MariaDB after two more looks a few milliseconds apart (see
    /// [`RowLockWaits`]).
    fn acquire(
        conn: &mut Conn<Self>,
        sql: &str,
        params: &Params,
    ) -> Result<Option<(i64, bool)>, Failure> {
        // Looks again only where the statement did not wait (MariaDB): on MySQL each look
        // waits 1 s.
        let retries: &[Duration] = match conn.mariadb {
            true => &RowLockWaits::ACQUIRE_RETRIES,
            false => &[],
        };
        let mut pauses = retries.iter();
        loop {
            match acquire_once(conn, sql, params, Waits::Never) {
                Err(failure) if row_locked(&failure) => match pauses.next() {
                    Some(pause) => std::thread::sleep(*pause),
                    None => return Ok(None),
                },
                other => return other,
            }
        }
    }

    fn read_number(
        conn: &mut Conn<Self>,
        sql: &str,
        params: &Params,
    ) -> Result<Option<i64>, Failure> {
        Ok(acquire_once(conn, sql, params, Waits::AsConfigured)?.map(|(number, _)| number))
    }

    fn update(conn: &mut Conn<Self>, sql: &str, params: &Params) -> Result<u64, Failure> {
        conn.run(sql, params, |c, statement, values| {
            c.exec_drop(statement, values).map(|()| c.affected_rows())
        })
    }

    fn execute_batch(conn: &mut Conn<Self>, sql: &str) -> Result<(), Failure> {
        let run = |conn: &mut Conn<Self>| -> Result<(), mysql::Error> {
            let mut result = conn.conn.query_iter(sql)?;
            while let Some(set) = result.iter() {
                for row in set {
                    row?;
                }
            }
            Ok(())
        };
        run(conn).map_err(|error| {
            // Two registries creating the floor's trigger at once: the loser finds it made
            // (1359) between its DROP and its CREATE; running the batch again replaces it.
            let created_meanwhile = matches!(&error, mysql::Error::MySqlError(e) if e.code == 1359);
            let mut failure = classify(error);
            if created_meanwhile {
                failure.kind = FailureKind::Transient;
            }
            failure
        })
    }

    fn columns(conn: &mut Conn<Self>, table: &str) -> Result<Vec<String>, Failure> {
        let (schema, name) = match table.split_once('.') {
            Some((schema, name)) => (Value::from(schema), name),
            None => (Value::NULL, table),
        };
        exec_once(
            &mut conn.conn,
            "SELECT UPPER(COLUMN_NAME) FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ? \
             ORDER BY ORDINAL_POSITION",
            (schema, name),
            |c, statement, params| c.exec(statement, params),
        )
    }

    fn floor(conn: &mut Conn<Self>, table: &str) -> Result<FloorFound, Failure> {
        // Also the triggers that hide an acquire's insert id (module docs, "Triggers").
        let ids = Arc::clone(&conn.ids);
        let (floor_triggers, _) = ids.look(&mut conn.conn, table)?;
        *ids.checked.lock() = Some(std::time::Instant::now());
        let _ = ids.table.set(table.to_string());
        // Readable: what acquire reads, without rows; no such table (1146) or column (1054),
        // or no SELECT privilege (1142, 1143) means not.
        let probe = format!(
            "SELECT FENCING_TOKEN FROM {} WHERE 1 = 0",
            crate::backend::floor_table(table)
        );
        let readable = match conn.conn.query_drop(probe) {
            Ok(()) => true,
            Err(mysql::Error::MySqlError(e)) if matches!(e.code, 1054 | 1142 | 1143 | 1146) => {
                false
            }
            Err(e) => return Err(classify(e)),
        };
        Ok(FloorFound {
            readable,
            trigger: floor_triggers > 0,
        })
    }

    fn unique_key_columns(
        conn: &mut Conn<Self>,
        table: &str,
    ) -> Result<Vec<(String, String)>, Failure> {
        let (schema, name) = match table.split_once('.') {
            Some((schema, name)) => (Value::from(schema), name),
            None => (Value::NULL, table),
        };
        exec_once(
            &mut conn.conn,
            "SELECT INDEX_NAME, UPPER(COLUMN_NAME) FROM information_schema.STATISTICS \
             WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ? \
             AND NON_UNIQUE = 0",
            (schema, name),
            |c, statement, params| c.exec(statement, params),
        )
    }

    fn describe(conn: &mut Conn<Self>, sql: &str) -> Result<(usize, usize), Failure> {
        let plan = plan(sql)?;
        let statement = conn.conn.prep(&plan.query).map_err(classify)?;
        // Only described: closed at once (see `exec_once`).
        conn.conn.close(statement.clone()).map_err(classify)?;
        let params = match &plan.order {
            Some(order) => order.iter().max().map_or(0, |highest| highest + 1),
            None => usize::from(statement.num_params()),
        };
        let mut columns = usize::from(statement.num_columns());
        // A statement without a result set may hand its token back through the OK packet.
        if columns == 0 && sql.to_ascii_uppercase().contains("LAST_INSERT_ID(") {
            columns = 1;
        }
        Ok((params, columns))
    }

    fn mark_broken(conn: &mut Conn<Self>) {
        conn.broken = true;
        // Dropping it writes (statements closed, `COM_QUIT`); on a server that stopped
        // reading, those must not wait out a timeout on the caller's thread.
        let _ = set_socket_timeouts(&conn.conn, DROP_TIMEOUT, DROP_TIMEOUT);
    }

    /// Arms the socket for the attempt's first call (the DDL and table checks of `build()`
    /// included); the lease statements re-arm before each call ([`MysqlConn::arm`]). A
    /// deadline already passed is reported by that call's own arming, or by the retry loop.
    fn set_deadline(conn: &mut Conn<Self>, deadline: Instant) {
        conn.deadline = Some(deadline);
        conn.end_watch();
        #[cfg(unix)]
        {
            use std::os::unix::io::AsRawFd;
            conn.watch = watchdog::Watch::start(conn.conn.as_raw_fd(), deadline);
        }
        let _ = conn.arm();
    }

    const LISTENER_WATCHES_KEYS: bool = true;
    const LISTENER_WATCHED_KEYS_MAX: usize = wakeups::MAX_WATCHED_KEYS;

    fn granted(
        manager: &MysqlManager,
        table: &crate::backend::TableSettings,
        lock_key: &str,
        idle_timeout: Duration,
    ) {
        if !table.notifications {
            return;
        }
        let named_locks = manager
            .named_locks
            .get_or_init(|| wakeups::NamedLocks::start(manager.detached(), idle_timeout));
        named_locks.take(wakeups::lock_name(&table.table, &table.region, lock_key));
    }

    fn release_done(
        manager: &MysqlManager,
        table: &crate::backend::TableSettings,
        lock_key: &str,
        _released: Option<bool>,
        wakes: bool,
    ) {
        if let Some(named_locks) = manager.named_locks.get() {
            let delay = match wakes {
                true => Duration::ZERO,
                false => wakeups::QUIET_HOLD,
            };
            let name = wakeups::lock_name(&table.table, &table.region, lock_key);
            named_locks.drop_after(name, delay);
        }
    }

    fn listen_for_releases(
        manager: &MysqlManager,
        table: &crate::backend::TableSettings,
        _idle_timeout: Duration,
        handler: crate::backend::ListenerHandler,
        requests: crossbeam_channel::Receiver<()>,
    ) -> bool {
        wakeups::listen(
            manager.detached(),
            table.table.clone(),
            table.region.clone(),
            handler,
            requests,
        )
    }

    fn clock_sql() -> &'static str {
        "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))"
    }

    /// Statements that each run alone, in autocommit, and never wait for a row lock (see
    /// [`RowLockWaits`]):
    ///
    /// 0. `SET @leasehold_until = now + ttl`: the least expiry a renewal of this batch writes
    ///    (sent only for more than one pair, see 2);
    /// 1. one `UPDATE` that renews the pairs' rows still this client's, except those another
    ///    session holds locked: a derived table locks the qualifying rows with `FOR UPDATE SKIP
    ///    LOCKED` (its `LIMIT` keeps MySQL from merging it into the `UPDATE`, which it refuses
    ///    for a table read in its own `UPDATE`), and the `UPDATE` writes exactly those rows.
    ///    Both read the table through its primary key (`FORCE INDEX`): a scan would lock, and
    ///    wait for, rows of other keys. Its locks end with it;
    /// 2. only when 1 renewed fewer rows than there are pairs: which pairs are still this
    ///    client's, and whether each expires at or after `@leasehold_until` (renewed), by a
    ///    consistent read, which waits for no lock.
    ///
    /// `JSON_TABLE` drives primary-key lookups (MariaDB 10.6+, MySQL 8.0+).
    fn renew_batch_sql(table: &str) -> Vec<String> {
        let pairs = "JSON_TABLE(:lock_key, '$[*]' COLUMNS (k CHAR(36) PATH '$[0]', \
                     t BIGINT PATH '$[1]')) AS j STRAIGHT_JOIN";
        let on = "ON l.LOCK_KEY = j.k AND l.REGION = :region AND l.FENCING_TOKEN = j.t";
        let mine = format!("WHERE l.CLIENT_ID = :client_id AND l.EXPIRED_AFTER >= {NOW}");
        vec![
            format!("SET @leasehold_until = {NOW_PLUS_TTL}"),
            format!(
                "UPDATE (SELECT l.LOCK_KEY AS k FROM {pairs} {table} AS l FORCE INDEX (PRIMARY) \
                 {on} {mine} LIMIT 18446744073709551615 FOR UPDATE SKIP LOCKED) AS m \
                 STRAIGHT_JOIN {table} AS l FORCE INDEX (PRIMARY) \
                 ON l.LOCK_KEY = m.k AND l.REGION = :region \
                 SET l.EXPIRED_AFTER = {NOW_PLUS_TTL}"
            ),
            format!(
                "SELECT l.LOCK_KEY, l.FENCING_TOKEN, \
                 CAST(IFNULL(l.EXPIRED_AFTER >= @leasehold_until, 0) AS SIGNED) \
                 FROM {pairs} {table} AS l {on} {mine}"
            ),
        ]
    }

    fn renew_batch(
        conn: &mut Conn<Self>,
        sql: &[String],
        params: &Params,
        pairs: usize,
    ) -> Result<BatchRows, Failure> {
        if pairs > 1 {
            conn.run(&sql[0], params, |c, until, values| {
                c.exec_drop(until, values)
            })?;
        }
        let renewed = conn.run(&sql[1], params, |c, update, values| {
            c.exec_drop(update, values).map(|()| c.affected_rows())
        })?;
        fail_point!("mysql::renew_batch_between_statements");
        if usize::try_from(renewed).is_ok_and(|renewed| renewed >= pairs) {
            return Ok(BatchRows {
                renewed: parse_pairs(params.lock_key),
                busy: Vec::new(),
            });
        }
        let mine: Vec<(String, i64, i64)> =
            conn.run(&sql[2], params, |c, mine, values| c.exec(mine, values))?;
        let mut rows = BatchRows::default();
        for (lock_key, token, until) in mine {
            // One pair: the `UPDATE` said whether it renewed it.
            if pairs > 1 && until != 0 {
                rows.renewed.push((lock_key, token));
            } else {
                rows.busy.push((lock_key, token));
            }
        }
        Ok(rows)
    }
}

/// The pairs of a batch renewal's first parameter, as [`crate::backend::pairs_json`] writes
/// them.
fn parse_pairs(json: &str) -> Vec<(String, i64)> {
    let mut pairs = Vec::new();
    let mut chars = json.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut key = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some('u') => {
                        let hex: String = chars.by_ref().take(4).collect();
                        if let Some(c) = u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32)
                        {
                            key.push(c);
                        }
                    }
                    Some(c) => key.push(c),
                    None => break,
                },
                c => key.push(c),
            }
        }
        // `,token]`
        let mut token = String::new();
        for c in chars.by_ref() {
            match c {
                ',' => continue,
                ']' => break,
                c => token.push(c),
            }
        }
        pairs.push((key, token.trim().parse().unwrap_or_default()));
    }
    pairs
}

fn classify(error: mysql::Error) -> Failure {
    use mysql::DriverError as D;
    let (kind, hint) = match &error {
        mysql::Error::MySqlError(e) => {
            let message = &e.message;
            match e.code {
                1213 => (
                    FailureKind::Transient,
                    format!("the statement was chosen as a deadlock victim: {message}"),
                ),
                1205 => (
                    FailureKind::Transient,
                    format!("the lock row stayed locked by another transaction: {message}"),
                ),
                1040 | 1203 => (
                    FailureKind::Transient,
                    format!("the server refuses more connections: {message}"),
                ),
                1053 | 1927 | 2006 | 2013 | 4031 => (
                    FailureKind::Broken,
                    format!("the MySQL connection failed: {message}"),
                ),
                1047 => (
                    FailureKind::Broken,
                    format!(
                        "the Galera node does not serve statements (it is outside the primary \
                         component, or still joining): list the other nodes in the URL \
                         ({message})"
                    ),
                ),
                1290 | 1792 => (
                    FailureKind::Broken,
                    format!(
                        "the server is read-only (a replica, or failover in progress): point \
                         the URL at the primary ({message})"
                    ),
                ),
                1146 => (
                    FailureKind::Fatal,
                    format!(
                        "{message}: create the table with sql/mysql.sql or \
                         RegistryBuilder::create_table(true)"
                    ),
                ),
                1054 => (
                    FailureKind::Fatal,
                    format!(
                        "{message}: the lock table lacks a column; compare it with sql/mysql.sql"
                    ),
                ),
                1045 | 1698 => (
                    FailureKind::Fatal,
                    format!(
                        "{message}: check the user and password in the URL (an account that \
                         requires TLS, REQUIRE SSL, is refused the same way without it: see \
                         ssl-mode)"
                    ),
                ),
                1049 => (
                    FailureKind::Fatal,
                    format!("{message}: create it or fix the URL"),
                ),
                1046 => (
                    FailureKind::Fatal,
                    format!(
                        "{message}: name the database in the URL (mysql://host/database) or in \
                         the prefix (database.INT_)"
                    ),
                ),
                1044 | 1142 | 1143 => (
                    FailureKind::Fatal,
                    format!(
                        "{message}: grant this user SELECT, INSERT and UPDATE on the lock table"
                    ),
                ),
                code => (
                    FailureKind::Fatal,
                    format!("MySQL refused the statement ({code}): {message}"),
                ),
            }
        }
        mysql::Error::IoError(_) | mysql::Error::CodecError(_) if timed_out(&error) => {
            (
                FailureKind::Broken,
                format!(
                    "no answer from MySQL before the deadline (the socket's timeout ran out; the connection is discarded): {error}"
                ),
            )
        }
        mysql::Error::IoError(_)
        | mysql::Error::CodecError(_)
        | mysql::Error::DriverError(
            D::ConnectTimeout
            | D::CouldNotConnect(_)
            | D::PacketOutOfSync
            | D::UnexpectedPacket
            | D::Timeout,
        ) => (
            FailureKind::Broken,
            format!("the connection to MySQL failed: {error}"),
        ),
        other => (FailureKind::Fatal, format!("MySQL client error: {other}")),
    };
    Failure::new(kind, hint, error)
}

/// Whether `error` is a socket timeout (`EAGAIN` from `SO_RCVTIMEO`/`SO_SNDTIMEO`: see
/// [`MysqlConn::arm`]), as the driver reports it: an I/O error, or one wrapped by its codec.
fn timed_out(error: &mysql::Error) -> bool {
    let io = match error {
        mysql::Error::IoError(e) => Some(e),
        mysql::Error::CodecError(e) => {
            std::error::Error::source(e).and_then(|e| e.downcast_ref::<std::io::Error>())
        }
        _ => None,
    };
    io.is_some_and(|e| {
        matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        )
    })
}

/// How long the writes of a connection being discarded may wait (see `mark_broken`).
const DROP_TIMEOUT: Duration = Duration::from_millis(1);

/// Sets the read and write timeouts (`SO_RCVTIMEO`, `SO_SNDTIMEO`) of `conn`'s socket: the TCP
/// socket under TLS too (the driver's TLS stream reads and writes it), or the Unix socket.
#[cfg(unix)]
#[allow(unsafe_code)]
fn set_socket_timeouts(conn: &mysql::Conn, read: Duration, write: Duration) -> std::io::Result<()> {
    use std::os::unix::io::{AsRawFd, FromRawFd};
    // SAFETY: the descriptor is `conn`'s open socket, which `conn` (borrowed for this call)
    // keeps open; `ManuallyDrop` keeps the wrapper from closing it. The wrapper only sets two
    // socket-level options, which a Unix socket has as a TCP socket does.
    let socket =
        std::mem::ManuallyDrop::new(unsafe { std::net::TcpStream::from_raw_fd(conn.as_raw_fd()) });
    socket.set_read_timeout(Some(read))?;
    socket.set_write_timeout(Some(write))
}

/// Without a socket to reach, statements run on statement threads (`runs_inline` is false).
#[cfg(not(unix))]
fn set_socket_timeouts(
    _conn: &mysql::Conn,
    _read: Duration,
    _write: Duration,
) -> std::io::Result<()> {
    Ok(())
}

/// Where `opts` connects, for messages.
fn address(opts: &Opts) -> String {
    match opts.get_socket() {
        Some(socket) => socket.to_string(),
        None => format!("{}:{}", opts.get_ip_or_hostname(), opts.get_tcp_port()),
    }
}

/// Opens a connection; with `prefer_tls`, a server that does not offer TLS is connected to
/// without it.
fn open_conn(opts: &Opts, prefer_tls: bool) -> Result<mysql::Conn, mysql::Error> {
    match mysql::Conn::new(opts.clone()) {
        Err(mysql::Error::DriverError(mysql::DriverError::TlsNotSupported)) if prefer_tls => {
            mysql::Conn::new(OptsBuilder::from_opts(opts.clone()).ssl_opts(None::<SslOpts>))
        }
        other => other,
    }
}

/// Opens a connection to the first of `hosts` that answers and, when there are several,
/// accepts writes ([`writable`]); else the error of the last host that answered (a refusal
/// says more than a refused connection), or of the last host.
fn open_writable(hosts: &[Opts], prefer_tls: bool) -> Result<mysql::Conn, mysql::Error> {
    let mut failed: Option<mysql::Error> = None;
    for opts in hosts {
        let error = match open_conn(opts, prefer_tls) {
            Ok(conn) if hosts.len() == 1 => return Ok(conn),
            Ok(mut conn) => match writable(&mut conn, opts) {
                Ok(()) => return Ok(conn),
                Err(e) => e,
            },
            Err(e) => e,
        };
        if !failed.as_ref().is_some_and(answered) || answered(&error) {
            failed = Some(error);
        }
    }
    Err(failed.expect("a URL names at least one host"))
}

/// Whether `error` came from a server (as opposed to no connection at all).
fn answered(error: &mysql::Error) -> bool {
    matches!(error, mysql::Error::MySqlError(_))
}

/// Whether the server behind `conn` accepts writes: not `read_only` (a replica), and, on
/// Galera, a node of the primary component (`wsrep_ready`). The refusal is a 1290 error, which
/// [`classify`] takes for a broken connection.
fn writable(conn: &mut mysql::Conn, opts: &Opts) -> Result<(), mysql::Error> {
    use mysql::prelude::Queryable;
    let read_only: Option<i64> = conn.query_first("SELECT @@global.read_only")?;
    let ready: Option<(String, String)> = conn.query_first("SHOW STATUS LIKE 'wsrep_ready'")?;
    let why = if read_only.unwrap_or(0) != 0 {
        "is read-only"
    } else if ready.is_some_and(|(_, value)| !value.eq_ignore_ascii_case("ON")) {
        "is a Galera node that is not ready (wsrep_ready is OFF)"
    } else {
        return Ok(());
    };
    Err(mysql::Error::MySqlError(mysql::MySqlError {
        state: "HY000".to_string(),
        code: 1290,
        message: format!("the server at {} {why}", address(opts)),
    }))
}

/// One URL per host of a URL that lists several (`mysql://u@a:1,b:2/db?…`): the same user,
/// database and options with each host; the URL itself when it names one.
fn host_urls(url: &str) -> Vec<String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return vec![url.to_string()];
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, hosts) = match authority.rfind('@') {
        Some(at) => authority.split_at(at + 1),
        None => ("", authority),
    };
    if !hosts.contains(',') {
        return vec![url.to_string()];
    }
    hosts
        .split(',')
        .map(|host| format!("{scheme}://{user}{}{tail}", host.trim()))
        .collect()
}

/// One direct connection, retried while the server is unreachable, so that a wrong password or
/// database comes back as what it is rather than as a pool timeout. A failure caused by TLS is
/// reported as [`Error::Tls`] at once, and so are the permanent ones: a host name that does not
/// resolve, and a server that is not MySQL (found by [`crate::backend::pools::look_at`] when an
/// attempt reached a server that sent no MySQL greeting).
fn check_connect(
    hosts: &[Opts],
    prefer_tls: bool,
    settings: &MysqlTls,
    timeout: Duration,
) -> crate::Result<()> {
    let server = hosts.iter().map(address).collect::<Vec<_>>().join(", ");
    crate::backend::first_connection(Mysql::NAME, &server, timeout, |limit, deadline| {
        let mut failed: Option<(Failure, String)> = None;
        let from_server = |(failure, _): &(Failure, String)| {
            failure
                .source
                .downcast_ref::<mysql::Error>()
                .is_some_and(answered)
        };
        for opts in hosts {
            match check_host(hosts.len() > 1, opts, prefer_tls, settings, limit, deadline) {
                Ok(()) => return Ok(()),
                // A permanent failure (TLS, an unknown host, not MySQL) is reported at once.
                Err(failure) if failure.0.kind == FailureKind::Fatal => return Err(failure),
                // Else the last server's refusal, or the last host's failure.
                Err(failure) => {
                    if !failed.as_ref().is_some_and(from_server) || from_server(&failure) {
                        failed = Some(failure);
                    }
                }
            }
        }
        Err(failed.expect("a URL names at least one host"))
    })
    .map_err(|e| crate::backend::tls::surface(e, &server))
}

/// One attempt of [`check_connect`] on one host (checked for writes when `several`), with
/// socket timeouts of at most `limit`: the classified failure and a short detail.
fn check_host(
    several: bool,
    opts: &Opts,
    prefer_tls: bool,
    settings: &MysqlTls,
    limit: Duration,
    deadline: std::time::Instant,
) -> Result<(), (Failure, String)> {
    let server = address(opts);
    {
        // This attempt's socket timeouts: the shorter of the configured ones and `limit`.
        let within =
            |configured: Option<Duration>| Some(configured.map_or(limit, |c| c.min(limit)));
        let attempt: Opts = OptsBuilder::from_opts(opts.clone())
            .tcp_connect_timeout(within(opts.get_tcp_connect_timeout()))
            .read_timeout(within(opts.get_read_timeout().copied()))
            .write_timeout(within(opts.get_write_timeout().copied()))
            .into();
        let opened = match open_conn(&attempt, prefer_tls) {
            Ok(mut conn) if several => writable(&mut conn, opts),
            Ok(_) => Ok(()),
            Err(error) => Err(error),
        };
        opened.map_err(|error| {
            if let Some((problem, hint)) = tls_problem(&error, opts, settings) {
                let failure = crate::backend::tls::TlsFailure::new(problem, hint.clone(), error);
                return (
                    Failure::new(FailureKind::Fatal, hint.clone(), failure),
                    hint,
                );
            }
            // Reached a server (not refused, not unresolved) that sent no MySQL packet, or
            // not one the driver understood.
            let odd = matches!(
                &error,
                mysql::Error::IoError(_)
                    | mysql::Error::CodecError(_)
                    | mysql::Error::DriverError(
                        mysql::DriverError::PacketOutOfSync
                            | mysql::DriverError::UnexpectedPacket
                            | mysql::DriverError::Timeout
                    )
            );
            let mut failure = classify(error);
            let mut detail = failure.source.to_string();
            if opts.get_socket().is_none() {
                let (host, port) = (opts.get_ip_or_hostname(), opts.get_tcp_port());
                let unknown = (failure.kind != FailureKind::Fatal)
                    .then(|| crate::backend::pools::unknown_host(&host, port))
                    .flatten();
                let finding = match unknown {
                    Some(hint) => Finding::Permanent(hint),
                    None if odd => {
                        crate::backend::pools::look_at(&host, port, &server, Mysql::NAME, deadline)
                    }
                    None => Finding::Nothing,
                };
                match finding {
                    Finding::Permanent(hint) => {
                        failure = Failure::new(FailureKind::Fatal, hint, failure.source);
                    }
                    Finding::Speechless(note) => detail = format!("{detail}; {note}"),
                    Finding::Nothing => {}
                }
            }
            (failure, detail)
        })
    }
}

/// The options for one host's URL: for the connection checked at build, for pooled ones, and
/// whether `ssl-mode=PREFERRED` (see [`open`]).
fn host_opts(
    url: &str,
    settings: &MysqlTls,
    pool: &crate::backend::PoolSettings,
) -> crate::Result<(Opts, Opts, bool)> {
    let opts = Opts::from_url(url).map_err(|e| Error::Database {
        operation: "connect",
        hint: "the MySQL URL does not parse: use mysql://user:password@host:port/database"
            .to_string(),
        source: Box::new(e),
    })?;
    let (opts, prefer_tls) = with_tls(opts, settings)?;
    let connect_timeout = opts
        .get_tcp_connect_timeout()
        .unwrap_or(pool.connect_timeout);
    let capabilities = opts.get_additional_capabilities() | CapabilityFlags::CLIENT_FOUND_ROWS;
    let opts = OptsBuilder::from_opts(opts)
        .additional_capabilities(capabilities)
        .tcp_connect_timeout(Some(connect_timeout));
    // The driver has no per-call timeout: socket timeouts are what stop a server that accepts
    // connections but never answers from holding a connection attempt forever; statements
    // set them to their caller's deadline (`MysqlConn::arm`), within these. The
    // first connection is bounded by the connect timeout (each of its attempts by what is left
    // of it, the first by 2 s at most: see `first_connection`), pooled ones by the longer of it
    // and the operation timeout. Timeouts given in the URL win, within those bounds for the
    // first connection.
    let with_socket_timeout = |limit: Duration| -> Opts {
        let opts: Opts = opts.clone().into();
        let read = opts.get_read_timeout().copied().unwrap_or(limit);
        let write = opts.get_write_timeout().copied().unwrap_or(limit);
        OptsBuilder::from_opts(opts)
            .read_timeout(Some(read))
            .write_timeout(Some(write))
            .into()
    };
    Ok((
        with_socket_timeout(connect_timeout),
        with_socket_timeout(connect_timeout.max(pool.operation_timeout)),
        prefer_tls,
    ))
}

/// Opens a store on the MySQL or MariaDB database at `url` (one host, or several: see the
/// module docs).
pub(crate) fn open(
    url: &str,
    pool: &crate::backend::PoolSettings,
    table: &crate::backend::TableSettings,
) -> crate::Result<Arc<dyn crate::backend::Store>> {
    let (url, settings) = split_mysql(url)?;
    let mut checked = Vec::new();
    let mut pooled = Vec::new();
    let mut prefer_tls = false;
    for url in host_urls(&url) {
        let (check, keep, prefer) = host_opts(&url, &settings, pool)?;
        checked.push(check);
        pooled.push(keep);
        prefer_tls = prefer;
    }
    check_connect(&checked, prefer_tls, &settings, pool.connect_timeout)?;
    let opts = pooled;
    let manager = MysqlManager {
        opts,
        prefer_tls,
        named_locks: Default::default(),
        ids: Default::default(),
        mariadb: Default::default(),
    };
    let store = crate::backend::SqlStore::<Mysql>::open(manager, pool, table)?;
    Ok(Arc::new(store))
}

#[cfg(test)]
mod tests {
    use super::{host_urls, parse_pairs};

    #[test]
    fn batch_pairs_read_back_as_written() {
        let pairs = [
            ("3f2c5e1a-0000-4000-8000-000000000001", 17),
            ("odd \"key\\ \u{1}", -3),
            ("abcdef#001", i64::MAX),
        ];
        let json = crate::backend::pairs_json(pairs.iter().map(|(k, t)| (*k, *t)));
        let read: Vec<(String, i64)> = parse_pairs(&json);
        let expected: Vec<(String, i64)> = pairs.iter().map(|(k, t)| (k.to_string(), *t)).collect();
        assert_eq!(read, expected);
        assert!(parse_pairs("[]").is_empty());
    }

    #[test]
    fn a_host_list_becomes_one_url_per_host() {
        assert_eq!(
            host_urls("mysql://u:p@a:3306,b:3307,[::1]:3308/locks?ssl-mode=DISABLED"),
            [
                "mysql://u:p@a:3306/locks?ssl-mode=DISABLED",
                "mysql://u:p@b:3307/locks?ssl-mode=DISABLED",
                "mysql://u:p@[::1]:3308/locks?ssl-mode=DISABLED",
            ]
        );
        assert_eq!(host_urls("mysql://a,b"), ["mysql://a", "mysql://b"]);
        let one = "mysql://root@127.0.0.1:3306/test?x=a,b";
        assert_eq!(host_urls(one), [one]);
    }
}
