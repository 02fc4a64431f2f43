//! The connection manager and the pooled connection: how a statement is planned, prepared,
//! bound and run, how long it may wait for a row lock, and the socket timeouts that carry a
//! caller's deadline.

use super::errors::classify;
use super::hosts::open_writable;
#[cfg(doc)]
use super::Mysql;
use super::{wakeups, watchdog, NAMES};
#[cfg(doc)]
use crate::backend::Backend;
use crate::backend::{Failure, FailureKind, Params, PerStatement};
use mysql::prelude::Queryable;
use mysql::{Opts, OptsBuilder, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Opens MySQL connections from one set of options.
#[derive(Clone)]
pub(crate) struct MysqlManager {
    /// One per host, tried in order.
    pub(super) opts: Vec<Opts>,
    /// `ssl-mode=PREFERRED`: a server that does not offer TLS is connected to without it.
    pub(super) prefer_tls: bool,
    /// The registry's named-lock thread (see [`wakeups`]), started at its first
    /// grant.
    pub(super) named_locks: std::sync::Arc<std::sync::OnceLock<wakeups::NamedLocks>>,
    /// Shared by the registry's connections.
    pub(super) ids: Arc<InsertIds>,
    /// Whether the server is MariaDB (rather than MySQL), once the first pooled connection
    /// has asked (see [`RowLockWaits`]).
    pub(super) mariadb: Arc<std::sync::OnceLock<bool>>,
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
pub(super) fn exec_once<T>(
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
pub(super) struct Plan {
    pub(super) query: String,
    pub(super) order: Option<Vec<usize>>,
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
pub(super) enum Waits {
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
pub(super) struct RowLockWaits;

impl RowLockWaits {
    /// Run once on each pooled MySQL connection.
    const MYSQL_SESSION: &'static str = "SET SESSION innodb_lock_wait_timeout = 1";
    /// Put before an acquire statement on MariaDB.
    pub(super) const MARIADB_PREFIX: &'static str = "SET STATEMENT innodb_lock_wait_timeout=0 FOR ";
    /// The pauses before the acquire of a locked row looks again; then it is refused.
    pub(super) const ACQUIRE_RETRIES: [Duration; 2] =
        [Duration::from_millis(1), Duration::from_millis(4)];
}

/// Whether `failure` is a statement that gave up waiting for a row lock.
pub(super) fn row_locked(failure: &Failure) -> bool {
    matches!(
        failure.source.downcast_ref::<mysql::Error>(),
        Some(mysql::Error::MySqlError(e)) if e.code == LOCK_WAIT_TIMEOUT
    )
}

/// A connection, the plans of the statements it ran, the flag `mark_broken` sets, and the
/// deadline its statements must keep (see the module docs, "Deadlines").
pub(crate) struct MysqlConn {
    pub(super) conn: mysql::Conn,
    /// The server instance this connection talks to (see [`server_of`]).
    pub(super) server: Option<(String, i64)>,
    plans: PerStatement<Plan>,
    pub(super) broken: bool,
    /// Shared by the registry's connections.
    pub(super) ids: Arc<InsertIds>,
    /// The current attempt's deadline (`set_deadline`); `None` until the first.
    pub(super) deadline: Option<Instant>,
    /// The socket's read and write timeouts from the URL or the pool's settings: a
    /// statement's reads and writes wait no longer than these either.
    configured: (Option<Duration>, Option<Duration>),
    /// The watchdog's watch of the current attempt's deadline (see [`watchdog`]).
    pub(super) watch: Option<watchdog::Watch>,
    /// The deadline the socket's timeouts were last set for: while watched, the later calls of
    /// an attempt leave them as they are.
    armed: Option<Instant>,
    /// The server is MariaDB: acquire statements run with `SET STATEMENT
    /// innodb_lock_wait_timeout=0 FOR` (see [`RowLockWaits`]).
    pub(super) mariadb: bool,
}

impl MysqlConn {
    /// Ends the current attempt's watch; a watch that fired (its socket was shut down in the
    /// middle of whatever it was doing) marks the connection broken.
    pub(super) fn end_watch(&mut self) {
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
pub(super) struct InsertIds {
    /// The table has triggers that hide an acquire's insert id: an acquire that reports none
    /// asks the session.
    pub(super) hidden: AtomicBool,
    /// The table, once `build()` looked at its triggers.
    pub(super) table: std::sync::OnceLock<String>,
    /// When its triggers were last looked at.
    pub(super) checked: parking_lot::Mutex<Option<std::time::Instant>>,
}

impl InsertIds {
    /// How often an acquire that reports no id looks at the triggers again, while none were
    /// found.
    const RECHECK: Duration = Duration::from_secs(5);

    /// Whether an acquire that reported no id must ask the session: the table has id-hiding
    /// triggers, as known or as found now when the last look is older than [`Self::RECHECK`].
    pub(super) fn hidden(&self, conn: &mut MysqlConn) -> bool {
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
    pub(super) fn look(&self, conn: &mut mysql::Conn, table: &str) -> Result<(i64, i64), Failure> {
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
    pub(super) fn arm(&mut self) -> Result<(), Failure> {
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
    pub(super) fn run<T>(
        &mut self,
        sql: &str,
        params: &Params,
        call: impl FnMut(&mut mysql::Conn, &mysql::Statement, Vec<Value>) -> mysql::Result<T>,
    ) -> Result<T, Failure> {
        self.run_with(sql, params, Waits::AsConfigured, call)
    }

    /// [`MysqlConn::run`], with `waits` saying how long the statement may wait for a row lock.
    pub(super) fn run_with<T>(
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
pub(super) fn plan(sql: &str) -> Result<Plan, Failure> {
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
        let server = server_of(&mut conn);
        Ok(MysqlConn {
            conn,
            server,
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

/// The server `conn` talks to — `host:port` as the server names itself, and when it started
/// (seconds since the Unix epoch, from its uptime) — so that a session id is looked for only
/// on the server instance that gave it (see [`super::Mysql`]'s `end_session`); `None` when
/// the server does not say.
pub(super) fn server_of(conn: &mut mysql::Conn) -> Option<(String, i64)> {
    let (name, now): (String, i64) = conn
        .query_first("SELECT CONCAT(@@hostname, ':', @@port), UNIX_TIMESTAMP()")
        .ok()??;
    let (_, uptime): (String, i64) = conn
        .query_first("SHOW GLOBAL STATUS LIKE 'Uptime'")
        .ok()??;
    Some((name, now - uptime))
}

/// How long the writes of a connection being discarded may wait (see `mark_broken`).
pub(super) const DROP_TIMEOUT: Duration = Duration::from_millis(1);

/// Sets the read and write timeouts (`SO_RCVTIMEO`, `SO_SNDTIMEO`) of `conn`'s socket: the TCP
/// socket under TLS too (the driver's TLS stream reads and writes it), or the Unix socket.
#[cfg(unix)]
#[allow(unsafe_code)]
pub(super) fn set_socket_timeouts(
    conn: &mysql::Conn,
    read: Duration,
    write: Duration,
) -> std::io::Result<()> {
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
pub(super) fn set_socket_timeouts(
    _conn: &mysql::Conn,
    _read: Duration,
    _write: Duration,
) -> std::io::Result<()> {
    Ok(())
}
