//! PostgreSQL: its SQL, its connections and its error mapping, nothing else.
//!
//! # Time
//!
//! Every timestamp is `now() AT TIME ZONE 'UTC'`: the database's clock, as a `TIMESTAMP`
//! without time zone holding UTC wall-clock time — what Spring Integration writes, so both can
//! compare each other's rows. `now()` is fixed for the whole statement, so one statement reads
//! the clock once. The fencing-token floor is the same instant in microseconds since the epoch.
//!
//! # The statements
//!
//! Parameters are `$1`–`$5` as numbered in [`Statements`], prepared with declared
//! types — `CHAR`, `VARCHAR`, `CHAR`, `BIGINT`, `BIGINT`, the types of Spring's columns — so
//! that `LOCK_KEY = $1` compares `CHAR` to `CHAR` and uses the primary key (a `TEXT` parameter
//! would turn it into a text comparison and a sequential scan), and so that a statement may
//! leave parameters out (the holder query has no `$3`; the clock query has none).
//!
//! A statement goes *named* or *unnamed*. Named, each connection prepares it once, on first
//! use, and keeps it (the driver has no cache of its own): the server parses and plans it
//! once per connection. Unnamed (`query_typed`: parse, bind, describe, execute and sync in
//! one message, one round trip), the server parses and plans it on every call and keeps
//! nothing — what a transaction-mode pooler (PgBouncer `pool_mode = transaction` without
//! `max_prepared_statements`, and its kind) needs: it hands each statement to whichever
//! server connection is free, where a named statement prepared earlier is missing (`26000`)
//! or is another client's (`42P05`, or worse, another statement of the same name). The
//! difference is measured by `benches/databases.rs` (`lock_unlock` vs
//! `lock_unlock_prepared`).
//!
//! `prepared_statements(…)` forces either. Unset, each connection decides when it opens
//! ([`pooler`]): named when its cancel key names the server process that serves it
//! (`pg_backend_pid()`, one round trip), which is so straight to the server and never through
//! a pooler, whose keys are its own; unnamed otherwise. A connection that chose named
//! statements and still sees one fail with `26000` or `42P05` sends that statement again
//! unnamed (it did not run), and the registry's connections send every statement unnamed
//! from then on (a warning says so once). Catalog queries run unnamed either way, and
//! checking a replacement statement prepares it inside a transaction, which a pooler keeps on
//! one server connection, and closes it before the commit.
//!
//! - **acquire** is one statement, one round trip:
//!   `WITH expired AS (UPDATE … WHERE key AND EXPIRED_AFTER < now AND EXISTS (SELECT … FOR NO
//!   KEY UPDATE SKIP LOCKED) RETURNING FENCING_TOKEN),
//!   absent AS (INSERT … SELECT … WHERE NOT EXISTS (SELECT 1 FROM expired)
//!   ON CONFLICT (LOCK_KEY, REGION) DO NOTHING RETURNING FENCING_TOKEN)
//!   SELECT FENCING_TOKEN FROM expired UNION ALL SELECT FENCING_TOKEN FROM absent`.
//!   When the lock is held the `UPDATE` matches nothing and the `INSERT` finds the conflicting
//!   key before writing anything: no transaction id, no WAL, no disk sync — a failed try is a
//!   read. (A single `INSERT … ON CONFLICT DO UPDATE … WHERE expired` would lock the row, take a
//!   transaction id and sync WAL even when its `WHERE` fails.) The `EXISTS` locks a free or
//!   expired row before the `UPDATE` does, and skips one that another session holds locked (an
//!   operator's `SELECT … FOR UPDATE`, a migration, the fenced transaction of a lease that ran
//!   out, another acquirer's statement): the `UPDATE` then matches nothing, the `INSERT` finds
//!   the key (`DO NOTHING` waits for no row lock) and the try is refused, as for a held lock,
//!   instead of waiting for that session with one of the registry's connections; the waiter
//!   tries again at its next poll or release wake-up. Under concurrency: of two acquirers of an
//!   expired row, the one whose `EXISTS` locks it takes it and the other is refused (its
//!   `EXISTS` skips the locked row, or, once the first has committed, re-checks `EXPIRED_AFTER`
//!   against the new version and finds it live); two acquirers of an absent key race in the
//!   `INSERT`, where the loser waits for the winner's statement and then does nothing. Neither
//!   sees a duplicate-key error. The new token is
//!   `GREATEST(FENCING_TOKEN + 1, clock µs, floor + 1)`, or `GREATEST(clock µs, floor + 1)` for
//!   a new row, where floor is the deletion floor's mark for the key (0 if none; see
//!   [`super`]), read in the statement's snapshot — which is why the `INSERT` also requires
//!   that snapshot to have no row: a row deleted while the statement ran (its deletion not yet
//!   in the snapshot's floor) makes the try report "held", and the next try sees both. The
//!   floor is a primary-key lookup; a try that finds the lock held does not read it.
//! - **renew** moves `EXPIRED_AFTER` to now + `$4` µs where key, region, client and token match
//!   and the lease has not expired; durable (default `synchronous_commit`).
//! - **release** sets `CLIENT_ID = NULL, EXPIRED_AFTER = 1970, CREATED_DATE = now + $4 µs`
//!   under the same condition (`$4` is zero, or the reservation of a release that ends a turn:
//!   see "Bounded turn" in `lock.rs`), in a statement that also runs
//!   `set_config('synchronous_commit', 'off', true)`: the commit does not wait for the disk, in
//!   the same single round trip. Losing a release in a server crash only leaves the lease to
//!   expire; and since WAL is written in order, the next durable grant of the key makes the
//!   release durable too. For each released row of a release without reservation it also
//!   calls `pg_notify(<table>, '<LOCK_KEY> 0 <REGION>')` (sent at commit, only if a row was
//!   released; a release that ends a turn wakes nobody, so that notified waiters do not beat
//!   instances that only poll; the commit is not waiting for the disk, so the database-wide
//!   lock PostgreSQL takes to order notifications is held only briefly). Its result is one row
//!   per released row, which the driver reports as the affected-row count.
//!
//! # Release notifications
//!
//! With `notifications(true)` (the default) a registry has a listener thread, which opens one
//! more connection, outside the pools, when a thread of the registry waits. The connection
//! `LISTEN`s on `"<table>"` (the table name in
//! lower case, as PostgreSQL folds it: at most 63 characters, so it always fits a channel name)
//! only while a thread of the registry waits for a lock held elsewhere: every release in the
//! database wakes every listening connection (a server process and a client thread), so an idle
//! subscription would tax every release of every instance, waiters or not. The
//! state machine (request on the first sleeping poller, `UNLISTEN` a tick after the last one,
//! a re-poll whenever the subscription takes effect) lives in [`crate::wakeups`]. While
//! subscribed the thread hands every release in its region to the registry, which wakes that
//! key's sleeping poller. Releases by Spring (`DELETE`) and leases that simply expire send
//! nothing; polling every `idle_between_tries` still covers them. A lost connection is reopened
//! and subscribed again (every waiter then tries once more, for releases missed meanwhile).
//! Unsubscribed for `idle_connection_timeout`, the listener closes its connection; the next
//! subscription opens a new one.
//!
//! The listener never takes one of a server's last free connection slots, however many
//! registries start at once: it decides *before* it connects ([`listener::admit`]). On a
//! connection of the registry's main pool (through the pooler, when the registry goes through
//! one), in one round trip, it begins a transaction, tries the transaction-scoped advisory
//! lock `pg_try_advisory_xact_lock(`[`listener::ADMISSION_LOCK`]`)` and reads
//! `max_connections`, the reserved slots (`superuser_reserved_connections`,
//! `reserved_connections`) and the client connections open. With the lock, and room for one
//! more connection while a tenth of the slots ordinary users may take (at least 5, the
//! *spare*) stay free, it opens its connection while the transaction holds the lock and
//! commits once the connection is open, so the next decision counts it. Without the lock
//! (another listener is deciding) it tries again a tick later; without room it logs one
//! warning with the arithmetic and decides again no sooner than 30 s later. The lock is
//! tried, never waited for, so that no decision holds a pooler's server connection while it
//! waits. Every connection the listener opens — the first, each reconnection, each one after
//! a wait for room — goes through this decision; the probe's notification goes through the
//! pool too, and `build()` checks `listener_url` only through the same decision. The bound:
//! the listeners of the registries of one database, started together or not, never bring the
//! server's free slots for ordinary users below the spare, so they never make the server
//! refuse a connection for want of slots, theirs or anyone's, as long as clients outside the
//! decision open no more than the spare meanwhile. Advisory locks are per database: listeners
//! of registries on *k* databases of one server may decide at the same moment, and then take
//! at most *k* − 1 slots of the spare. An open listener also reads the slots with every
//! liveness check (every 30 s) and gives its connection back when fewer than the spare are
//! free beside it. Wake-ups only make waiters try sooner, while pooled connections, which
//! renew leases, need a slot whenever one opens.
//!
//! The listener connects to `listener_url` when the registry has one, else to the registry's
//! URL. `LISTEN` needs a session that stays on one server connection: through a
//! transaction-mode pooler it succeeds, but the server connection goes back to the pool and
//! its notifications are dropped. So the first time it subscribes, the listener probes
//! (`listener`'s `Listener::probe`): it listens on a channel of its own, sends a notification there from a
//! connection of the registry's main pool and waits one call's bound for it. Heard, the
//! probe is not made again. Not heard on a connection that works, the listener logs one
//! warning naming `listener_url`, closes its connection and ends: the registry's waiters poll
//! from then on. A probe that fails (no pooled connection could send it, say) decides
//! nothing, and the next connection probes again. A heard probe also shows that the listener's
//! server is the pool's, whose slots the decision counted.
//!
//! No listener call waits without a bound:
//!
//! - **connect** (TCP and the whole startup handshake) is bounded by the connect timeout (the
//!   registry's `connect_timeout` unless the URL sets one; per host of a multi-host string),
//!   exactly like a pooled connection's.
//!   The listener connects when a thread of the registry first waits for a lock held
//!   elsewhere, not in `build()`; a server that does not answer costs the waiters nothing
//!   (they poll meanwhile), and the thread tries again every tick while they wait.
//! - **the decision** to connect: waiting for a pooled connection, and each statement on it,
//!   is bounded by the same connect timeout.
//! - **`LISTEN`**, **`UNLISTEN`** and the liveness check (the free-slot query every 30 s
//!   while subscribed) are each bounded by the same connect timeout.
//! - **waiting for notifications** lasts one tick (a second) at a time.
//!
//! A call that fails or runs out of time drops the connection; the next subscription opens a
//! new one. After every bounded call the thread (named `leasehold-listen`) checks whether its
//! registry is gone (the registry's end of the request channel is dropped, or the handler says
//! stop), so a listener stuck on a silent server or network outlives its registry by one
//! bounded call at most. Fail points (feature `failpoints`, tests only):
//! `postgres::listener_before_connect` (every decision to connect),
//! `postgres::listener_before_listen`, `postgres::listener_before_unlisten`,
//! `postgres::listener_slots_taken` (phantom connections added to every count of slots).
//!
//! # Connections and deadlines
//!
//! Pooled connections use the asynchronous `tokio-postgres` client, each on a current-thread
//! runtime of its own, blocked on by the calling thread — what the `postgres` crate does — with
//! one difference: every call is bounded by the caller's deadline. A server or network that
//! stops answering costs the caller its deadline and the connection (it is discarded), and no
//! thread hop sits between a caller and its socket. A caller on a thread of an asynchronous
//! runtime (where a second runtime cannot be started, and where blocking is a mistake anyway:
//! use `spawn_blocking`) still works: its statements go to statement threads, its connection
//! attempts to a short-lived thread, and connection runtimes shut down without blocking when
//! dropped. The release listener's connection is opened the same way, but the listener reads
//! its socket itself, since notifications arrive between calls; its calls have deadlines too
//! (see above).
//!
//! `columns` resolves the table name with `to_regclass`, exactly as the statements do
//! (`search_path`, an optional `schema.` and case folding of unquoted names).
//!
//! Connections are TCP or Unix-socket connections, encrypted as the URL's `sslmode` says (feature
//! `postgres-tls`; see [`tls`]): every connection, the listener's included, goes through
//! [`connect_on`] with the registry's one TLS connector. They are checked once when
//! the registry is built, so a wrong password or database name is reported as such instead of
//! as a pool timeout.

#[cfg(test)]
mod batch_plan;
#[macro_use]
mod conn;
mod errors;
mod hosts;
mod listener;
mod pooler;
mod tls;
use crate::backend::pools::Pool;
use crate::backend::{
    AdminStatements, Backend, BatchRows, Conn, Failure, FailureKind, FloorFound, HolderRow,
    ListedRow, ListenerEvent, ListenerHandler, ListenerReply, Params, Session, Statements,
    TableSettings,
};
use crate::error::TOO_MANY_CLIENTS;
use conn::{
    block_on, connection_runtime, no_answer, on_async_thread, ConnRuntime, PgConn, PgConnError,
    PgConnection, PgManager,
};
use errors::{classify, sql_state};
use hosts::{address, check_connect, connect_limit, connect_on, parse_url};
use std::cell::Cell;
use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tls::Tls;
use tokio::runtime::Runtime;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{AsyncMessage, Client, Config, Notification};

/// Database "now": UTC wall-clock time without a time zone, fixed for the statement.
const NOW: &str = "(now() AT TIME ZONE 'UTC')";
/// Database "now" plus parameter 4 (µs).
const NOW_PLUS_TTL: &str = "(now() AT TIME ZONE 'UTC') + $4 * INTERVAL '1 microsecond'";
/// Database clock in microseconds since the Unix epoch: the floor of a new fencing token.
const CLOCK_MICROS: &str = "CAST(extract(epoch FROM now()) * 1000000 AS BIGINT)";
/// When the server instance started, in µs since the Unix epoch: with a process id, names one
/// session of one server instance (a restart or a failover starts another).
pub(super) const SERVER_STARTED: &str =
    "CAST(extract(epoch FROM pg_postmaster_start_time()) * 1000000 AS BIGINT)";
/// How `EXPIRED_AFTER` marks a released row.
const RELEASED: &str = "TIMESTAMP '1970-01-01 00:00:00'";
/// Parameter types declared with every prepare: those of the columns they are compared with.
const PARAM_TYPES: [Type; 6] = [
    Type::BPCHAR,
    Type::VARCHAR,
    Type::BPCHAR,
    Type::INT8,
    Type::INT8,
    Type::TEXT,
];
/// The deadline of calls made before any was set (checks run by r2d2 itself), and the connect
/// limit when the configuration has none.
const DEFAULT_CALL_LIMIT: Duration = Duration::from_secs(5);

/// The PostgreSQL backend.
pub(crate) struct Postgres;

impl Backend for Postgres {
    type Manager = PgManager;

    const NAME: &'static str = "PostgreSQL";
    /// Inline unless the calling thread is inside an asynchronous runtime, where starting the
    /// connection's own runtime would panic: such a caller (which should not block there
    /// anyway) gets its statements run on a statement thread.
    fn runs_inline() -> bool {
        !on_async_thread()
    }
    const DDL_FILE: &'static str = "sql/postgres.sql";
    const DDL: &'static str = include_str!("../../../sql/postgres.sql");
    const FLOOR_DDL_FILE: &'static str = "sql/postgres_floor.sql";
    const FLOOR_DDL: &'static str = include_str!("../../../sql/postgres_floor.sql");
    const SEMAPHORE_DDL_FILE: &'static str = "sql/postgres_semaphore.sql";
    const SEMAPHORE_DDL: &'static str = include_str!("../../../sql/postgres_semaphore.sql");
    const QUEUE_DDL_FILE: &'static str = "sql/postgres_queue.sql";
    const QUEUE_DDL: &'static str = include_str!("../../../sql/postgres_queue.sql");
    const ACQUIRE_LEAVES_LINE: bool = true;

    /// Places are written without waiting for the disk (`synchronous_commit` off for the
    /// statement, as a release is): a place lost in a crash only lapses.
    fn queue_statements(table: &str) -> crate::backend::QueueStatements {
        let queue = crate::backend::queue_table(table);
        crate::backend::QueueStatements {
            take_place: format!(
                "WITH no_sync AS (SELECT set_config('synchronous_commit', 'off', true)) \
                 INSERT INTO {queue} AS q (LOCK_KEY, REGION, CLIENT_ID, SINCE, EXPIRED_AFTER) \
                 SELECT $1, $2, $3, {NOW}, {NOW_PLUS_TTL} FROM no_sync \
                 ON CONFLICT (LOCK_KEY, REGION, CLIENT_ID) DO UPDATE SET \
                 SINCE = CASE WHEN q.EXPIRED_AFTER < {NOW} THEN excluded.SINCE ELSE q.SINCE END, \
                 EXPIRED_AFTER = excluded.EXPIRED_AFTER"
            ),
            leave: format!(
                "DELETE FROM {queue} USING (SELECT set_config('synchronous_commit', 'off', true)) \
                 AS no_sync WHERE LOCK_KEY = $1 AND REGION = $2 AND CLIENT_ID = $3"
            ),
        }
    }

    fn semaphore_statements(table: &str) -> crate::backend::SemaphoreStatements {
        let table = crate::backend::semaphore_table(table);
        crate::backend::SemaphoreStatements {
            record: format!(
                "INSERT INTO {table} (SEM_KEY, REGION, PERMITS) VALUES ($1, $2, $5) ON CONFLICT (SEM_KEY, REGION) DO NOTHING"
            ),
            permits: format!("SELECT CAST(PERMITS AS BIGINT) FROM {table} WHERE SEM_KEY = $1 AND REGION = $2"),
        }
    }

    const TRIGGER_NAMES_PER_TABLE: bool = true;
    const TIMESTAMP_TYPE: &'static str = "TIMESTAMP";
    const NAME_TYPE: &'static str = "VARCHAR(1024)";
    const RELEASED_TIMESTAMP: &'static str = RELEASED;

    fn default_queries(table: &str, floor: bool, named: bool, queue: bool) -> Statements {
        // With the line: no other client holds an earlier live place (a client without one
        // comes after every live place), and a grant removes the client's own place.
        let (in_turn, leave) = match queue {
            true => {
                let queue = crate::backend::queue_table(table);
                (
                    format!(
                        " AND NOT EXISTS (SELECT 1 FROM {queue} AS w WHERE w.LOCK_KEY = $1 \
                         AND w.REGION = $2 AND w.CLIENT_ID <> $3 AND w.EXPIRED_AFTER >= {NOW} \
                         AND (w.SINCE, w.CLIENT_ID) < (COALESCE((SELECT m.SINCE FROM {queue} AS m \
                         WHERE m.LOCK_KEY = $1 AND m.REGION = $2 AND m.CLIENT_ID = $3 \
                         AND m.EXPIRED_AFTER >= {NOW}), {NOW}), $3))"
                    ),
                    format!(
                        ", left_line AS (DELETE FROM {queue} WHERE LOCK_KEY = $1 AND REGION = $2 \
                         AND CLIENT_ID = $3 AND EXISTS (SELECT 1 FROM expired UNION ALL \
                         SELECT 1 FROM absent))"
                    ),
                )
            }
            false => (String::new(), String::new()),
        };
        let (name_set, name_column, name_value) = match named {
            true => (
                " LOCK_NAME = NULLIF($6, ''),",
                ", LOCK_NAME",
                ", NULLIF($6, '')",
            ),
            false => ("", "", ""),
        };
        // With the deletion floor: tokens also exceed it, and a row only inserts where the
        // statement's snapshot has no row. (Otherwise the row was deleted while the statement
        // ran, by a deletion the snapshot's floor does not show: report "held", the next try
        // sees both.)
        let (bounds, absent_in_snapshot) = if floor {
            (
                format!(
                    "{CLOCK_MICROS}, COALESCE((SELECT FENCING_TOKEN FROM {floor_table} \
                     WHERE REGION = $2 AND KEY_PREFIX = substr($1, 1, 2)), 0) + 1",
                    floor_table = crate::backend::floor_table(table)
                ),
                format!(
                    " AND NOT EXISTS (SELECT 1 FROM {table} WHERE LOCK_KEY = $1 AND REGION = $2)"
                ),
            )
        } else {
            (CLOCK_MICROS.to_string(), String::new())
        };
        Statements {
            acquire: format!(
                "WITH expired AS (UPDATE {table} SET CLIENT_ID = $3,{name_set} \
                 CREATED_DATE = {NOW}, EXPIRED_AFTER = {NOW_PLUS_TTL}, \
                 FENCING_TOKEN = GREATEST(FENCING_TOKEN + 1, {bounds}) \
                 WHERE LOCK_KEY = $1 AND REGION = $2 AND EXPIRED_AFTER < {NOW} \
                 AND CREATED_DATE <= {NOW}{in_turn} AND EXISTS (SELECT 1 FROM {table} \
                 WHERE LOCK_KEY = $1 AND REGION = $2 AND EXPIRED_AFTER < {NOW} \
                 AND CREATED_DATE <= {NOW} FOR NO KEY UPDATE SKIP LOCKED) \
                 RETURNING FENCING_TOKEN), \
                 absent AS (INSERT INTO {table} (LOCK_KEY, REGION, CLIENT_ID, CREATED_DATE, \
                 EXPIRED_AFTER, FENCING_TOKEN{name_column}) \
                 SELECT $1, $2, $3, {NOW}, {NOW_PLUS_TTL}, GREATEST({bounds}){name_value} \
                 WHERE NOT EXISTS (SELECT 1 FROM expired){absent_in_snapshot}{in_turn} \
                 ON CONFLICT (LOCK_KEY, REGION) DO NOTHING RETURNING FENCING_TOKEN){leave} \
                 SELECT FENCING_TOKEN FROM expired \
                 UNION ALL SELECT FENCING_TOKEN FROM absent"
            ),
            renew: format!(
                "UPDATE {table} SET EXPIRED_AFTER = {NOW_PLUS_TTL} WHERE LOCK_KEY = $1 \
                 AND REGION = $2 AND CLIENT_ID = $3 AND FENCING_TOKEN = $5 \
                 AND EXPIRED_AFTER >= {NOW}"
            ),
            release: format!(
                "WITH no_sync AS (SELECT set_config('synchronous_commit', 'off', true)), \
                 released AS (UPDATE {table} SET CLIENT_ID = NULL, EXPIRED_AFTER = {RELEASED}, \
                 CREATED_DATE = {NOW} + $4 * INTERVAL '1 microsecond' \
                 WHERE LOCK_KEY = $1 AND REGION = $2 AND CLIENT_ID = $3 AND FENCING_TOKEN = $5 \
                 AND EXPIRED_AFTER >= {NOW} RETURNING 1) \
                 SELECT (SELECT pg_notify('{channel}', $1 || ' 0 ' || $2) WHERE $4 = 0) \
                 FROM released, no_sync",
                channel = channel(table)
            ),
        }
    }

    fn admin_statements(table: &str, named: bool) -> AdminStatements {
        let name = if named {
            "CAST(LOCK_NAME AS TEXT)"
        } else {
            "CAST(NULL AS TEXT)"
        };
        let micros =
            |column: &str| format!("CAST(round(extract(epoch FROM {column}) * 1000000) AS BIGINT)");
        let keep_until = "CREATED_DATE + $4 * INTERVAL '1 microsecond'";
        let cutoff = format!("({NOW} - $4 * INTERVAL '1 microsecond')");
        AdminStatements {
            holder: format!(
                "SELECT CAST(CLIENT_ID AS TEXT), {created}, {expires}, FENCING_TOKEN, {CLOCK_MICROS} FROM {table} \
                 WHERE LOCK_KEY = $1 AND REGION = $2 AND CLIENT_ID IS NOT NULL \
                 AND EXPIRED_AFTER >= {NOW}",
                created = micros("CREATED_DATE"),
                expires = micros("EXPIRED_AFTER"),
            ),
            // Byte order (COLLATE "C"), whatever the database's collation.
            list: format!(
                "SELECT CAST(LOCK_KEY AS TEXT), CAST(CLIENT_ID AS TEXT), {created}, {expires}, \
                 FENCING_TOKEN, {state}, {name} FROM {table} \
                 WHERE REGION = $2 AND CAST(LOCK_KEY AS TEXT) COLLATE \"C\" > $1 \
                 ORDER BY CAST(LOCK_KEY AS TEXT) COLLATE \"C\" LIMIT $5",
                created = micros("CREATED_DATE"),
                expires = micros("EXPIRED_AFTER"),
                state = crate::backend::state_sql(NOW),
            ),
            // Notifies as release does, so waiters elsewhere poll at once.
            force_release: format!(
                "WITH released AS (UPDATE {table} SET CLIENT_ID = NULL, EXPIRED_AFTER = {RELEASED} \
                 WHERE LOCK_KEY = $1 AND REGION = $2 AND CLIENT_ID IS NOT NULL \
                 AND EXPIRED_AFTER >= {NOW} RETURNING 1) \
                 SELECT pg_notify('{channel}', $1 || ' 0 ' || $2) FROM released",
                channel = channel(table)
            ),
            delete_released_and_expired: format!(
                "DELETE FROM {table} WHERE REGION = $2 AND EXPIRED_AFTER < {cutoff} \
                 AND CREATED_DATE < {cutoff}"
            ),
            release_keeping: format!(
                "UPDATE {table} SET \
                 CLIENT_ID = CASE WHEN {keep_until} > {NOW} THEN CLIENT_ID END, \
                 FENCING_TOKEN = FENCING_TOKEN + 1, \
                 EXPIRED_AFTER = CASE WHEN {keep_until} > {NOW} THEN {keep_until} \
                 ELSE {RELEASED} END \
                 WHERE LOCK_KEY = $1 AND REGION = $2 AND CLIENT_ID = $3 AND FENCING_TOKEN = $5 \
                 AND EXPIRED_AFTER >= {NOW}"
            ),
        }
    }

    fn holder(
        conn: &mut Conn<Self>,
        sql: &str,
        params: &Params,
    ) -> Result<Option<HolderRow>, Failure> {
        let Some(row) = conn.rows(sql, params)?.into_iter().next() else {
            return Ok(None);
        };
        Ok(Some(HolderRow {
            // CHAR(36) pads with spaces; client ids have none.
            client_id: row
                .try_get::<_, String>(0)
                .map_err(classify)?
                .trim_end()
                .to_string(),
            acquired_micros: row.try_get(1).map_err(classify)?,
            expires_micros: row.try_get(2).map_err(classify)?,
            token: row.try_get(3).map_err(classify)?,
            now_micros: row.try_get(4).map_err(classify)?,
        }))
    }

    fn rows(conn: &mut Conn<Self>, sql: &str, params: &Params) -> Result<Vec<ListedRow>, Failure> {
        let rows = conn.rows(sql, params)?;
        let read = |row: &tokio_postgres::Row| -> Result<ListedRow, tokio_postgres::Error> {
            Ok(ListedRow {
                lock_key: row.try_get::<_, String>(0)?.trim_end().to_string(),
                // CHAR(36) pads with spaces; client ids have none.
                client_id: row
                    .try_get::<_, Option<String>>(1)?
                    .map(|id| id.trim_end().to_string()),
                acquired_micros: row.try_get(2)?,
                expires_micros: row.try_get(3)?,
                token: row.try_get(4)?,
                state: row.try_get::<_, i32>(5)?.into(),
                name: row.try_get(6)?,
            })
        };
        rows.iter().map(|row| read(row).map_err(classify)).collect()
    }

    fn acquire(conn: &mut Conn<Self>, sql: &str, params: &Params) -> Result<Option<i64>, Failure> {
        match conn.rows(sql, params)?.first() {
            Some(row) => Ok(Some(row.try_get::<_, i64>(0).map_err(classify)?)),
            None => Ok(None),
        }
    }

    fn update(conn: &mut Conn<Self>, sql: &str, params: &Params) -> Result<u64, Failure> {
        conn.affected(sql, params)
    }

    fn execute_batch(conn: &mut Conn<Self>, sql: &str) -> Result<(), Failure> {
        // DDL that finds its objects made says so in a NOTICE ("already exists, skipping"),
        // which the driver would log at every start: keep the server's notices to warnings.
        let sql = format!("SET client_min_messages TO WARNING; {sql}; RESET client_min_messages");
        call!(conn, |client| client.batch_execute(&sql)).map_err(|mut failure| {
            // Two processes creating the table at once: the loser trips over the catalog's
            // unique indexes; running the batch again finds the table and does nothing.
            if matches!(sql_state(&failure), Some("23505" | "42P07")) {
                failure.kind = FailureKind::Transient;
            }
            failure
        })
    }

    fn columns(conn: &mut Conn<Self>, table: &str) -> Result<Vec<String>, Failure> {
        let sql = "SELECT upper(attname::text) FROM pg_catalog.pg_attribute \
                   WHERE attrelid = to_regclass($1::text) AND attnum > 0 AND NOT attisdropped \
                   ORDER BY attnum";
        let rows = call!(conn, |client| client
            .query_typed(sql, &[(&table, Type::TEXT)]))?;
        rows.iter()
            .map(|row| row.try_get::<_, String>(0).map_err(classify))
            .collect()
    }

    fn floor(conn: &mut Conn<Self>, table: &str) -> Result<FloorFound, Failure> {
        // Resolved like the statements resolve the table; unquoted names fold to lower case. A
        // disabled trigger counts as missing.
        let sql = "SELECT COALESCE(has_table_privilege(to_regclass($1::text), 'SELECT'), false), \
                   EXISTS (SELECT 1 FROM pg_catalog.pg_trigger \
                   WHERE tgrelid = to_regclass($2::text) AND tgname = lower($3::text) \
                   AND tgenabled <> 'D')";
        let (floor, trigger) = (
            crate::backend::floor_table(table),
            crate::backend::floor_trigger(table),
        );
        let params: [(&(dyn ToSql + Sync), Type); 3] = [
            (&floor, Type::TEXT),
            (&table, Type::TEXT),
            (&trigger, Type::TEXT),
        ];
        let row = call!(conn, |client| client.query_typed_one(sql, &params))?;
        Ok(FloorFound {
            readable: row.try_get(0).map_err(classify)?,
            trigger: row.try_get(1).map_err(classify)?,
        })
    }

    fn unique_key_columns(
        conn: &mut Conn<Self>,
        table: &str,
    ) -> Result<Vec<(String, String)>, Failure> {
        let sql = "SELECT i.indexrelid::regclass::text, upper(a.attname::text) \
                   FROM pg_catalog.pg_index i JOIN pg_catalog.pg_attribute a \
                   ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
                   WHERE i.indrelid = to_regclass($1::text) AND i.indisunique";
        let rows = call!(conn, |client| client
            .query_typed(sql, &[(&table, Type::TEXT)]))?;
        rows.iter()
            .map(|row| {
                Ok((
                    row.try_get(0).map_err(classify)?,
                    row.try_get(1).map_err(classify)?,
                ))
            })
            .collect()
    }

    fn describe(conn: &mut Conn<Self>, sql: &str) -> Result<(usize, usize), Failure> {
        // Prepared, described and closed inside one transaction, which a transaction-mode
        // pooler keeps on one server connection: nothing named outlives it there. (A failed
        // prepare aborts the transaction, and COMMIT then rolls it back.)
        call!(conn, |client| async move {
            client.batch_execute("BEGIN").await?;
            let described = client
                .prepare_typed(sql, &PARAM_TYPES)
                .await
                .map(|statement| (statement.params().len(), statement.columns().len()));
            client.batch_execute("COMMIT").await?;
            described
        })
    }

    fn mark_broken(conn: &mut Conn<Self>) {
        conn.broken = true;
    }

    /// The server process, known only on a connection straight to the server: behind a
    /// pooler the process changes with every transaction.
    fn session(conn: &mut Conn<Self>) -> Option<Session> {
        conn.server_process.map(|(pid, started)| Session {
            id: i64::from(pid),
            server: (String::new(), started),
        })
    }

    /// On the same server instance (the postmaster's start, to the microsecond), asks the
    /// server to terminate the process (only one of this user's sessions, so a process id
    /// reused by another user's session is never touched) and counts it while it is still
    /// listed; `pg_terminate_backend` runs only on the row the subquery kept.
    fn end_session(conn: &mut Conn<Self>, session: &Session) -> Result<bool, Failure> {
        let sql = format!(
            "SELECT count(pg_terminate_backend(pid)) FROM (SELECT pid FROM pg_stat_activity \
             WHERE pid = $5 AND usename = current_user AND {SERVER_STARTED} = $4 OFFSET 0) AS s"
        );
        let sql = sql.as_str();
        let params = Params {
            token: session.id,
            ttl_micros: session.server.1,
            ..Params::EMPTY
        };
        Ok(Self::read_number(conn, sql, &params)?.unwrap_or(0) == 0)
    }

    fn set_deadline(conn: &mut Conn<Self>, deadline: Instant) {
        conn.deadline = deadline;
    }

    fn clock_sql() -> &'static str {
        "SELECT CAST(extract(epoch FROM clock_timestamp()) * 1000000 AS BIGINT)"
    }

    /// No step of the statement joins the batch's pairs with the table or with each other, so
    /// it costs time linear in the batch whatever row counts the planner guesses (it cannot
    /// estimate those of a function's result or of a CTE, and a join it plans as a nested loop
    /// over two such lists is quadratic):
    ///
    /// - `j` unpacks the pairs;
    /// - `locked` looks each pair's row up by primary key (a `LIMIT 1` subquery per pair, which
    ///   is never flattened into a join), keeps it if it is still this client's lease, and
    ///   takes its row lock if that can be done at once (`SKIP LOCKED` passes over a row
    ///   another session holds, rather than wait for it); it returns the rows' addresses
    ///   (`ctid`), which cannot change while the lock is held;
    /// - `renewed` updates the rows at those addresses (a TID scan, or one pass over a table
    ///   small enough to scan);
    /// - the last branch, `mine`, looks each pair's row up again as the statement's snapshot
    ///   shows it, waiting for nothing — only when some pair was not renewed (a filter
    ///   evaluated once, before the branch runs).
    ///
    /// The result: `TRUE` rows for the renewed pairs, and, unless every pair was renewed,
    /// `FALSE` rows for every pair still this client's; those not also renewed were skipped
    /// (see `renew_batch`). A row changed by
    /// another committed statement after the snapshot was taken (this registry renewing the
    /// same lease on another connection) is locked in its new version, which the update does
    /// not see: it counts as skipped, and is retried like a locked row.
    fn renew_batch_sql(table: &str) -> Vec<String> {
        let this_lease = format!(
            "l.LOCK_KEY = j.k AND l.REGION = $2 AND l.CLIENT_ID = $3 AND l.FENCING_TOKEN = j.t \
             AND l.EXPIRED_AFTER >= {NOW}"
        );
        vec![format!(
            "WITH j AS (SELECT CAST(e ->> 0 AS CHAR(36)) AS k, CAST(e ->> 1 AS BIGINT) AS t \
             FROM jsonb_array_elements(CAST(CAST($1 AS TEXT) AS JSONB)) AS e), \
             locked AS (SELECT m.id FROM j CROSS JOIN LATERAL (SELECT l.ctid AS id \
             FROM {table} AS l WHERE {this_lease} LIMIT 1 FOR UPDATE OF l SKIP LOCKED) AS m), \
             renewed AS (UPDATE {table} AS l SET EXPIRED_AFTER = {NOW_PLUS_TTL} \
             WHERE l.ctid = ANY(ARRAY(SELECT id FROM locked)) AND l.REGION = $2 \
             AND l.CLIENT_ID = $3 RETURNING l.LOCK_KEY AS k, l.FENCING_TOKEN AS t) \
             SELECT CAST(k AS TEXT), t, TRUE FROM renewed \
             UNION ALL SELECT CAST(mine.k AS TEXT), mine.t, FALSE FROM j CROSS JOIN LATERAL \
             (SELECT l.LOCK_KEY AS k, l.FENCING_TOKEN AS t FROM {table} AS l \
             WHERE {this_lease} LIMIT 1) AS mine \
             WHERE (SELECT count(*) FROM renewed) < (SELECT count(*) FROM j)"
        )]
    }

    fn renew_batch(
        conn: &mut Conn<Self>,
        sql: &[String],
        params: &Params,
        _pairs: usize,
    ) -> Result<BatchRows, Failure> {
        let rows = conn.rows(&sql[0], params)?;
        let mut found = BatchRows::default();
        let mut mine = Vec::new();
        for row in &rows {
            let pair = (
                row.try_get(0).map_err(classify)?,
                row.try_get(1).map_err(classify)?,
            );
            if row.try_get(2).map_err(classify)? {
                found.renewed.push(pair);
            } else {
                mine.push(pair);
            }
        }
        // Still this client's but not renewed: another session held the row locked.
        let renewed: std::collections::HashSet<&(String, i64)> = found.renewed.iter().collect();
        let busy: Vec<_> = mine
            .into_iter()
            .filter(|pair| !renewed.contains(pair))
            .collect();
        found.busy = busy;
        Ok(found)
    }

    #[cfg_attr(not(feature = "postgres-tls"), allow(clippy::clone_on_copy))]
    fn listen_for_releases(
        manager: &PgManager,
        pool: &Pool<PgManager>,
        table: &TableSettings,
        idle_timeout: Duration,
        handler: ListenerHandler,
        requests: crossbeam_channel::Receiver<()>,
    ) -> bool {
        listener::start(manager, pool, table, idle_timeout, handler, requests)
    }
}

/// The notification channel of `table`: its name as PostgreSQL folds it (validated
/// identifiers only, so it is safe in a literal; at most 63 characters).
pub(super) fn channel(table: &str) -> String {
    table.to_ascii_lowercase()
}

/// Opens a store on the PostgreSQL database at `url` (a URL or a `key=value` string).
#[cfg_attr(not(feature = "postgres-tls"), allow(clippy::clone_on_copy))]
pub(crate) fn open(
    url: &str,
    pool: &crate::backend::PoolSettings,
    table: &crate::backend::TableSettings,
) -> crate::Result<Arc<dyn crate::backend::Store>> {
    let (config, tls, settings) = parse_url(url, pool, "the PostgreSQL URL")?;
    check_connect(&config, &tls, &settings, pool.connect_timeout)?;
    // Without notifications there is no listener to connect.
    let listener = match pool.listener_url.as_ref().filter(|_| table.notifications) {
        Some(url) => Some(parse_url(url, pool, "the listener URL")?),
        None => None,
    };
    let manager = PgManager {
        config,
        tls,
        prepared: pool.prepared_statements,
        pooler_found: Arc::new(AtomicBool::new(false)),
        listener: listener
            .as_ref()
            .map(|(config, tls, _)| (config.clone(), tls.clone())),
    };
    let store = crate::backend::SqlStore::<Postgres>::open(manager, pool, table)?;
    if let Some((config, tls, settings)) = &listener {
        // Wake-ups only make waiters try sooner: a fleet with more processes than the server
        // has slots for listeners still works, polling, and each listener connects when a
        // slot is free. Every other fault of the URL fails the build. (On a thread of an
        // asynchronous runtime a pooled connection cannot block on its own.)
        conn::outside_async(|| {
            listener::check_at_build(
                &store.pool,
                &address(config),
                pool.connect_timeout,
                |left| check_connect(config, tls, settings, left),
            )
        })?;
    }
    Ok(Arc::new(store))
}
