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
//! statement (one waiting for a row lock runs once it gets the row): as with any timeout, an
//! acquire granted after its caller gave up is left to expire, and a renewal's outcome counts
//! as unknown from its send time.
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

#[cfg(test)]
mod batch_plan;
mod conn;
mod errors;
mod hosts;
mod tls;
pub(crate) mod wakeups;
mod watchdog;
use crate::backend::{
    AdminStatements, Backend, BatchRows, Conn, Failure, FailureKind, FloorFound, HolderRow,
    ListedRow, Params, Session, Statements,
};
use conn::MysqlManager;
use conn::{
    exec_once, plan, row_locked, set_socket_timeouts, MysqlConn, RowLockWaits, Waits, DROP_TIMEOUT,
};
use errors::classify;
use hosts::{check_connect, host_opts, host_urls};
use mysql::prelude::Queryable;
use mysql::Value;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tls::split_mysql;

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

/// The MySQL / MariaDB backend.
pub(crate) struct Mysql;

/// One acquire statement (or a statement run the way an acquire is, see
/// [`Backend::read_number`]): `Some(token)` when granted.
fn acquire_once(
    conn: &mut MysqlConn,
    sql: &str,
    params: &Params,
    waits: Waits,
) -> Result<Option<i64>, Failure> {
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
            let id = match (id, affected) {
                // No row written: refused before the row (another client ahead in line), so
                // this statement set no insert id and the session's is an earlier one's.
                (_, 0) => return Ok(None),
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
    Ok(Some(token))
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
    const QUEUE_DDL_FILE: &'static str = "sql/mysql_queue.sql";
    const QUEUE_DDL: &'static str = include_str!("../../../sql/mysql_queue.sql");

    /// `SINCE` is assigned before `EXPIRED_AFTER`, whose old value it reads.
    fn queue_statements(table: &str) -> crate::backend::QueueStatements {
        let queue = crate::backend::queue_table(table);
        crate::backend::QueueStatements {
            take_place: format!(
                "INSERT INTO {queue} (LOCK_KEY, REGION, CLIENT_ID, SINCE, EXPIRED_AFTER) \
                 VALUES (:lock_key, :region, :client_id, {NOW}, {NOW_PLUS_TTL}) \
                 ON DUPLICATE KEY UPDATE SINCE = IF(EXPIRED_AFTER < {NOW}, {NOW}, SINCE), \
                 EXPIRED_AFTER = {NOW_PLUS_TTL}"
            ),
            leave: format!(
                "DELETE FROM {queue} WHERE LOCK_KEY = :lock_key AND REGION = :region \
                 AND CLIENT_ID = :client_id"
            ),
        }
    }

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

    fn default_queries(table: &str, floor: bool, named: bool, queue: bool) -> Statements {
        // With the line: the row is written only when no other client holds an earlier live
        // place (a client without one comes after every live place). An `INSERT … SELECT`
        // reads its source with locks, so a place row that a statement holds locked that
        // instant (a place taken, refreshed or left) would turn the acquire of a free key into
        // a refusal: the look at the line skips such rows (`SKIP LOCKED`). A place skipped so
        // counts as absent for that one statement, which can put this client ahead of it
        // once; the lock row itself decides who holds the key.
        let in_turn = match queue {
            true => format!(
                " WHERE NOT EXISTS (SELECT 1 FROM {queue} AS w WHERE w.LOCK_KEY = :lock_key \
                 AND w.REGION = :region AND w.CLIENT_ID <> :client_id \
                 AND w.EXPIRED_AFTER >= {NOW} AND (w.SINCE, w.CLIENT_ID) < \
                 (COALESCE((SELECT m.SINCE FROM {queue} AS m WHERE m.LOCK_KEY = :lock_key \
                 AND m.REGION = :region AND m.CLIENT_ID = :client_id \
                 AND m.EXPIRED_AFTER >= {NOW} FOR UPDATE SKIP LOCKED), {NOW}), :client_id) \
                 FOR UPDATE SKIP LOCKED)",
                queue = crate::backend::queue_table(table)
            ),
            false => String::new(),
        };
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
        let values = format!(
            ":lock_key, :region, :client_id, {NOW}, {NOW_PLUS_TTL}, \
             LAST_INSERT_ID({first_token}){name_value}"
        );
        let row = match queue {
            true => format!("SELECT {values} FROM DUAL{in_turn}"),
            false => format!("VALUES ({values})"),
        };
        Statements {
            acquire: format!(
                "INSERT INTO {table} (LOCK_KEY, REGION, CLIENT_ID, CREATED_DATE, EXPIRED_AFTER, \
                 FENCING_TOKEN{name_column}) {row} \
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
    fn acquire(conn: &mut Conn<Self>, sql: &str, params: &Params) -> Result<Option<i64>, Failure> {
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
        acquire_once(conn, sql, params, Waits::AsConfigured)
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

    fn session(conn: &mut Conn<Self>) -> Option<Session> {
        Some(Session {
            id: i64::from(conn.conn.connection_id()),
            server: conn.server.clone()?,
        })
    }

    /// On the same server instance (its name, and its start within two seconds, as two
    /// readings of its uptime may differ by one): `KILL CONNECTION` (allowed on one's own
    /// sessions without privileges; error 1094: no such session), then whether the
    /// processlist still shows it: a killed session stays listed until the statement it runs
    /// has ended.
    fn end_session(conn: &mut Conn<Self>, session: &Session) -> Result<bool, Failure> {
        let same_server = conn.server.as_ref().is_some_and(|(name, started)| {
            *name == session.server.0 && (started - session.server.1).abs() <= 2
        });
        if !same_server {
            return Ok(true);
        }
        conn.arm()?;
        match conn
            .conn
            .query_drop(format!("KILL CONNECTION {}", session.id))
        {
            Err(mysql::Error::MySqlError(e)) if e.code == 1094 => return Ok(true),
            other => other.map_err(classify)?,
        }
        let sql = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = :token";
        let params = Params {
            token: session.id,
            ..Params::EMPTY
        };
        Ok(Self::read_number(conn, sql, &params)?.unwrap_or(0) == 0)
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
        _pool: &crate::backend::pools::Pool<Self::Manager>,
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
    ///    consistent read, which waits for no lock;
    /// 3. MariaDB runs instead of 1, as long as no row of the batch is locked, a statement
    ///    that costs its server less per lease: one single-table `UPDATE` of the pairs' rows
    ///    (`WHERE (LOCK_KEY, REGION, FENCING_TOKEN) IN (…)`, each pair a range of the primary
    ///    key; `FORCE INDEX`, since for a batch that is a large share of the table the planner
    ///    would rather scan, and lock, every row), under `SET STATEMENT
    ///    innodb_lock_wait_timeout=0` so that it waits for no row lock. Its pairs are written
    ///    into its text (see [`update_by_pairs`]); this is its start. The `UPDATE` of 1 joins
    ///    the pairs to the table, which MariaDB runs as a multi-table update: it reads each row
    ///    twice and writes each through a temporary table. A locked row fails the whole
    ///    statement at once (error 1205, nothing of it remains in autocommit), and 1 runs,
    ///    skipping that row. MySQL has no per-statement lock wait, and runs 1 alone.
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
            format!(
                "{}UPDATE {table} FORCE INDEX (PRIMARY) SET EXPIRED_AFTER = {NOW} + INTERVAL ",
                RowLockWaits::MARIADB_PREFIX
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
        let by_pairs = match conn.mariadb {
            true => update_by_pairs(&sql[3], params),
            false => None,
        };
        let renewed = match by_pairs {
            Some(update) => {
                conn.arm()?;
                match conn.conn.query_drop(update).map_err(classify) {
                    Ok(()) => Some(conn.conn.affected_rows()),
                    Err(failure) if row_locked(&failure) => None,
                    Err(failure) => return Err(failure),
                }
            }
            None => None,
        };
        let renewed = match renewed {
            Some(renewed) => renewed,
            None => conn.run(&sql[1], params, |c, update, values| {
                c.exec_drop(update, values).map(|()| c.affected_rows())
            })?,
        };
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

/// MariaDB's single-table renewal of a batch (statement 3 of [`Mysql::renew_batch_sql`],
/// whose start is `start`), with every value written into its text: the pairs differ from one
/// batch to the next, and a prepared statement per count of pairs would fill the server's
/// `max_prepared_stmt_count`. One pair is compared column by column: MariaDB reads a list of
/// one row value as a condition on no index and scans the whole table. `None` when a value
/// is not printable ASCII without quotes and backslashes (`LOCK_KEY`s are UUIDs; a region or
/// client id of other characters renews through statement 1).
fn update_by_pairs(start: &str, params: &Params) -> Option<String> {
    fn literal(text: &str) -> Option<String> {
        text.bytes()
            .all(|b| (b' '..=b'~').contains(&b) && b != b'\'' && b != b'\\')
            .then(|| format!("'{text}'"))
    }
    let region = literal(params.region)?;
    let client_id = literal(params.client_id)?;
    let pairs = parse_pairs(params.lock_key);
    let mut sql = format!("{start}{} MICROSECOND WHERE ", params.ttl_micros);
    match pairs.as_slice() {
        [] => return None,
        [(lock_key, token)] => sql.push_str(&format!(
            "LOCK_KEY = {} AND REGION = {region} AND FENCING_TOKEN = {token}",
            literal(lock_key)?
        )),
        _ => {
            sql.push_str("(LOCK_KEY, REGION, FENCING_TOKEN) IN (");
            for (index, (lock_key, token)) in pairs.iter().enumerate() {
                if index > 0 {
                    sql.push(',');
                }
                sql.push_str(&format!("({}, {region}, {token})", literal(lock_key)?));
            }
            sql.push(')');
        }
    }
    sql.push_str(&format!(
        " AND CLIENT_ID = {client_id} AND EXPIRED_AFTER >= {NOW}"
    ));
    Some(sql)
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
    use super::hosts::host_urls;
    use super::parse_pairs;

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
