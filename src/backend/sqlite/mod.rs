//! SQLite: the embedded default. Its SQL and its error mapping, nothing else.
//!
//! Connections open the file in WAL mode with `synchronous = NORMAL`: a commit survives a crash
//! of any process, and only a power loss can take back the last commits — which also takes down
//! every holder on this machine, the only place an SQLite lock can be shared. A busy handler
//! ([`busy_wait`]) absorbs short writer collisions inside SQLite for about 5 ms, trying again
//! after 25 µs, then after pauses doubling up to 1 ms; longer ones come back as `SQLITE_BUSY`,
//! which the shared retry loop retries until the caller's deadline. (SQLite's own busy timeout
//! sleeps 1 ms before its first retry, then 2, 5, 10 ms: a waiter's try that meets the
//! holder's release statement for a few microseconds would make that handoff a millisecond or
//! more slower.)
//!
//! `'now'` is fixed for the duration of one statement, so every timestamp a statement writes or
//! compares comes from one reading of the clock — with millisecond resolution, so a grant within
//! the millisecond of the previous one takes `old + 1`, ahead of the clock. That is why a new
//! row's token also exceeds the deletion floor (see [`super`]): acquire is
//! `INSERT … VALUES (…, max(clock µs, floor + 1)) ON CONFLICT DO UPDATE SET FENCING_TOKEN =
//! max(old + 1, excluded.FENCING_TOKEN) … WHERE expired RETURNING FENCING_TOKEN`. Writers take
//! the file's one write lock, so an acquire always sees the deletions committed before it.

#[cfg(target_os = "linux")]
pub(crate) mod board;
use crate::backend::{
    AdminStatements, Backend, BatchRows, Conn, Failure, FailureKind, FloorFound, HolderRow,
    ListedRow, Params, Statements,
};
use rusqlite::{ffi::ErrorCode, types::ToSql, Connection};
use std::path::PathBuf;
use std::time::Duration;

/// Database "now" as stored: UTC text with milliseconds.
pub(crate) const NOW: &str = "strftime('%Y-%m-%d %H:%M:%f', 'now')";
/// Database "now" plus parameter 4 (µs).
const NOW_PLUS_TTL: &str = "strftime('%Y-%m-%d %H:%M:%f', julianday('now') + ?4 / 86400000000.0)";
/// Database clock in microseconds since the Unix epoch: the floor of a new fencing token.
const CLOCK_MICROS: &str = "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)";

/// Every SQLite statement of this process runs under a read hold of this lock, taken for
/// writing by [`pause_sqlite_statements`].
static STATEMENTS: parking_lot::RwLock<()> = parking_lot::const_rwlock(());

/// Holds back every SQLite statement of this process while it lives (see
/// [`pause_sqlite_statements`]).
#[must_use = "statements run again as soon as the pause is dropped"]
pub struct SqlitePause {
    _writing: parking_lot::RwLockWriteGuard<'static, ()>,
}

impl std::fmt::Debug for SqlitePause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SqlitePause")
    }
}

/// Waits until no SQLite statement of this process is running, and keeps new ones from
/// starting until the returned [`SqlitePause`] is dropped.
///
/// A statement that writes holds the database file's write lock while it runs: a process
/// stopped inside one (SIGTSTP, a debugger) stops every lock of every process on that file
/// until it is continued, and its own and their leases run out meanwhile. A process that stops
/// itself on purpose takes this pause first and drops it once continued; the statements held
/// back then run, in the threads that started them. Only SQLite statements wait (the other
/// databases keep no lock across a stopped client's statements in this way).
///
/// ```
/// # fn main() -> leasehold::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let registry = leasehold::LockRegistry::sqlite(dir.path().join("l.db")).create_table(true).build()?;
/// let pause = leasehold::pause_sqlite_statements();
/// // … stop this process here (kill(getpid(), SIGTSTP)), safe from a frozen write lock …
/// drop(pause);
/// registry.obtain("job")?.lock()?.unlock()?;
/// # Ok(()) }
/// ```
pub fn pause_sqlite_statements() -> SqlitePause {
    SqlitePause {
        _writing: STATEMENTS.write(),
    }
}

/// A read hold of [`STATEMENTS`] for one statement.
fn running() -> parking_lot::RwLockReadGuard<'static, ()> {
    STATEMENTS.read()
}

/// Opens SQLite connections on one file.
#[derive(Debug, Clone)]
pub(crate) struct SqliteManager {
    path: PathBuf,
    /// Open the file read-only (`RegistryBuilder::read_only`): nothing is written, not even
    /// the journal mode, and a missing file is not created.
    read_only: bool,
    /// The file's release board (see [`board`]), opened on first use; `None`
    /// when it could not be (waiters then poll).
    #[cfg(target_os = "linux")]
    board: std::sync::Arc<std::sync::OnceLock<Option<std::sync::Arc<board::Board>>>>,
}

impl SqliteManager {
    pub fn new(path: PathBuf) -> Self {
        SqliteManager {
            path,
            read_only: false,
            #[cfg(target_os = "linux")]
            board: Default::default(),
        }
    }

    /// This manager, opening its connections read-only when `read_only`.
    fn reading_only(self, read_only: bool) -> Self {
        SqliteManager { read_only, ..self }
    }

    /// The release board of this file, opening it the first time.
    #[cfg(target_os = "linux")]
    fn board(&self) -> Option<&std::sync::Arc<board::Board>> {
        if self.read_only {
            // It is written by every user of the database; a read-only registry only reads.
            return None;
        }
        self.board
            .get_or_init(|| match board::Board::open(&self.path) {
                Ok(board) => Some(std::sync::Arc::new(board)),
                Err(e) => {
                    log::warn!(
                        "SQLite release wake-ups are off for {} (waiters poll every \
                         idle_between_tries): cannot open {}: {e}",
                        self.path.display(),
                        board::board_path(&self.path).display()
                    );
                    None
                }
            })
            .as_ref()
    }
}

/// A connection plus the flag `mark_broken` sets. The connection is boxed: r2d2 moves its
/// connections by value at every checkout and return (several times each), and a
/// `rusqlite::Connection` is a few hundred bytes, copied with `memcpy` at each move.
pub(crate) struct SqliteConn {
    conn: Box<Connection>,
    broken: bool,
}

impl r2d2::ManageConnection for SqliteManager {
    type Connection = SqliteConn;
    type Error = rusqlite::Error;

    fn connect(&self) -> Result<SqliteConn, rusqlite::Error> {
        use rusqlite::OpenFlags;
        let _running = running();
        let mut conn = if self.read_only {
            Connection::open_with_flags(
                &self.path,
                OpenFlags::SQLITE_OPEN_READ_ONLY
                    | OpenFlags::SQLITE_OPEN_URI
                    | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )?
        } else {
            Connection::open(&self.path)?
        };
        conn.busy_handler(Some(busy_wait))?;
        let mode: String = conn.query_row("PRAGMA journal_mode", [], |row| row.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") && !self.read_only {
            conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))?;
        }
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        Ok(SqliteConn {
            conn: Box::new(conn),
            broken: false,
        })
    }

    fn is_valid(&self, conn: &mut SqliteConn) -> Result<(), rusqlite::Error> {
        let _running = running();
        conn.conn.execute_batch("")
    }

    fn has_broken(&self, conn: &mut SqliteConn) -> bool {
        conn.broken
    }
}

/// How long SQLite itself waits for another connection's write lock before it reports
/// `SQLITE_BUSY` (about; the last pause may overrun it by up to [`BUSY_LONGEST_PAUSE`]).
pub(crate) const BUSY_WAIT: Duration = Duration::from_millis(5);
/// The first pause of [`busy_wait`]; each next one doubles, up to [`BUSY_LONGEST_PAUSE`].
const BUSY_FIRST_PAUSE: Duration = Duration::from_micros(25);
const BUSY_LONGEST_PAUSE: Duration = Duration::from_millis(1);

/// The pauses of [`busy_wait`] before its try number `tries` (0 for the first): (the pause
/// before it, all pauses before it together).
fn busy_pauses(tries: u32) -> (Duration, Duration) {
    let (mut pause, mut slept) = (BUSY_FIRST_PAUSE, Duration::ZERO);
    for _ in 0..tries {
        slept += pause;
        pause = (pause * 2).min(BUSY_LONGEST_PAUSE);
    }
    (pause, slept)
}

/// SQLite's busy handler on every connection: called when another connection holds the
/// database's write lock, with the number of times it was called for this statement so far.
/// Sleeps and asks SQLite to try again (`true`) until [`BUSY_WAIT`] has been slept.
pub(crate) fn busy_wait(tries: i32) -> bool {
    let (pause, slept) = busy_pauses(u32::try_from(tries).unwrap_or(0));
    if slept >= BUSY_WAIT {
        return false;
    }
    std::thread::sleep(pause);
    true
}

/// The SQLite backend.
pub(crate) struct Sqlite;

impl Backend for Sqlite {
    type Manager = SqliteManager;

    const NAME: &'static str = "SQLite";
    fn runs_inline() -> bool {
        true
    }
    const DDL_FILE: &'static str = "sql/sqlite.sql";
    const DDL: &'static str = include_str!("../../../sql/sqlite.sql");
    const FLOOR_DDL_FILE: &'static str = "sql/sqlite_floor.sql";
    const FLOOR_DDL: &'static str = include_str!("../../../sql/sqlite_floor.sql");
    const SEMAPHORE_DDL_FILE: &'static str = "sql/sqlite_semaphore.sql";
    const SEMAPHORE_DDL: &'static str = include_str!("../../../sql/sqlite_semaphore.sql");
    const QUEUE_DDL_FILE: &'static str = "sql/sqlite_queue.sql";
    const TABLE_PRIVILEGES: bool = false;
    const QUEUE_DDL: &'static str = include_str!("../../../sql/sqlite_queue.sql");

    fn queue_statements(table: &str) -> crate::backend::QueueStatements {
        let queue = crate::backend::queue_table(table);
        crate::backend::QueueStatements {
            take_place: format!(
                "INSERT INTO {queue} (LOCK_KEY, REGION, CLIENT_ID, SINCE, EXPIRED_AFTER) \
                 VALUES (?1, ?2, ?3, {NOW}, {NOW_PLUS_TTL}) \
                 ON CONFLICT (LOCK_KEY, REGION, CLIENT_ID) DO UPDATE SET \
                 SINCE = CASE WHEN {queue}.EXPIRED_AFTER < excluded.SINCE THEN excluded.SINCE \
                 ELSE {queue}.SINCE END, EXPIRED_AFTER = excluded.EXPIRED_AFTER"
            ),
            leave: format!(
                "DELETE FROM {queue} WHERE LOCK_KEY = ?1 AND REGION = ?2 AND CLIENT_ID = ?3"
            ),
        }
    }

    fn semaphore_statements(table: &str) -> crate::backend::SemaphoreStatements {
        let table = crate::backend::semaphore_table(table);
        crate::backend::SemaphoreStatements {
            record: format!(
                "INSERT INTO {table} (SEM_KEY, REGION, PERMITS) VALUES (?1, ?2, ?5) ON CONFLICT (SEM_KEY, REGION) DO NOTHING"
            ),
            permits: format!("SELECT PERMITS FROM {table} WHERE SEM_KEY = ?1 AND REGION = ?2"),
        }
    }

    const TIMESTAMP_TYPE: &'static str = "TIMESTAMP";
    const NAME_TYPE: &'static str = "TEXT";
    const RELEASED_TIMESTAMP: &'static str = "'1970-01-01 00:00:00.000'";

    fn default_queries(table: &str, floor: bool, named: bool, queue: bool) -> Statements {
        // With the line: the row is written only when no other client holds an earlier live
        // place (a client without one comes after every live place).
        let row = |values: String| {
            match queue {
            true => format!(
                "SELECT {values} WHERE NOT EXISTS (SELECT 1 FROM {queue} AS w \
                 WHERE w.LOCK_KEY = ?1 AND w.REGION = ?2 AND w.CLIENT_ID <> ?3 \
                 AND w.EXPIRED_AFTER >= {NOW} AND (w.SINCE, w.CLIENT_ID) < \
                 (coalesce((SELECT m.SINCE FROM {queue} AS m WHERE m.LOCK_KEY = ?1 \
                 AND m.REGION = ?2 AND m.CLIENT_ID = ?3 AND m.EXPIRED_AFTER >= {NOW}), {NOW}), ?3))",
                queue = crate::backend::queue_table(table)
            ),
            false => format!("VALUES ({values})"),
        }
        };
        let (name_column, name_value, name_update) = match named {
            true => (
                ", LOCK_NAME",
                ", NULLIF(?6, '')",
                " LOCK_NAME = excluded.LOCK_NAME,",
            ),
            false => ("", "", ""),
        };
        // A new row's token: the clock, and above the floor (the conflict branch adds old + 1).
        let first_token = if floor {
            format!(
                "max({CLOCK_MICROS}, coalesce((SELECT FENCING_TOKEN FROM {floor_table} \
                 WHERE REGION = ?2 AND KEY_PREFIX = substr(?1, 1, 2)), 0) + 1)",
                floor_table = crate::backend::floor_table(table)
            )
        } else {
            CLOCK_MICROS.to_string()
        };
        Statements {
            acquire: format!(
                "INSERT INTO {table} (LOCK_KEY, REGION, CLIENT_ID, CREATED_DATE, EXPIRED_AFTER, \
                 FENCING_TOKEN{name_column}) {} \
                 ON CONFLICT (LOCK_KEY, REGION) DO UPDATE SET CLIENT_ID = excluded.CLIENT_ID,\
                 {name_update} CREATED_DATE = excluded.CREATED_DATE, EXPIRED_AFTER = excluded.EXPIRED_AFTER, \
                 FENCING_TOKEN = max({table}.FENCING_TOKEN + 1, excluded.FENCING_TOKEN) \
                 WHERE {table}.EXPIRED_AFTER < excluded.CREATED_DATE \
                 AND {table}.CREATED_DATE <= excluded.CREATED_DATE \
                 RETURNING FENCING_TOKEN",
                row(format!("?1, ?2, ?3, {NOW}, {NOW_PLUS_TTL}, {first_token}{name_value}"))
            ),
            renew: format!(
                "UPDATE {table} SET EXPIRED_AFTER = {NOW_PLUS_TTL} WHERE LOCK_KEY = ?1 \
                 AND REGION = ?2 AND CLIENT_ID = ?3 AND FENCING_TOKEN = ?5 \
                 AND EXPIRED_AFTER >= {NOW}"
            ),
            release: format!(
                "UPDATE {table} SET CLIENT_ID = NULL, \
                 EXPIRED_AFTER = '1970-01-01 00:00:00.000', \
                 CREATED_DATE = strftime('%Y-%m-%d %H:%M:%f', julianday('now') + ?4 / 86400000000.0) \
                 WHERE LOCK_KEY = ?1 AND REGION = ?2 AND CLIENT_ID = ?3 AND FENCING_TOKEN = ?5 \
                 AND EXPIRED_AFTER >= {NOW}"
            ),
        }
    }

    fn admin_statements(table: &str, named: bool) -> AdminStatements {
        let name = if named { "LOCK_NAME" } else { "NULL" };
        // Stored text with milliseconds, as µs since the Unix epoch.
        let micros = |column: &str| {
            format!("CAST(round((julianday({column}) - 2440587.5) * 86400000.0) AS INTEGER) * 1000")
        };
        let cutoff = "strftime('%Y-%m-%d %H:%M:%f', julianday('now') - ?4 / 86400000000.0)";
        let keep_until =
            "strftime('%Y-%m-%d %H:%M:%f', julianday(CREATED_DATE) + ?4 / 86400000000.0)";
        AdminStatements {
            holder: format!(
                "SELECT CLIENT_ID, {created}, {expires}, FENCING_TOKEN, {CLOCK_MICROS} FROM {table} \
                 WHERE LOCK_KEY = ?1 AND REGION = ?2 AND CLIENT_ID IS NOT NULL \
                 AND EXPIRED_AFTER >= {NOW}",
                created = micros("CREATED_DATE"),
                expires = micros("EXPIRED_AFTER"),
            ),
            list: format!(
                "SELECT LOCK_KEY, CLIENT_ID, {created}, {expires}, FENCING_TOKEN, {state}, {name} \
                 FROM {table} WHERE REGION = ?2 AND LOCK_KEY > ?1 ORDER BY LOCK_KEY LIMIT ?5",
                created = micros("CREATED_DATE"),
                expires = micros("EXPIRED_AFTER"),
                state = crate::backend::state_sql(NOW),
            ),
            force_release: format!(
                "UPDATE {table} SET CLIENT_ID = NULL, EXPIRED_AFTER = '1970-01-01 00:00:00.000' \
                 WHERE LOCK_KEY = ?1 AND REGION = ?2 AND CLIENT_ID IS NOT NULL \
                 AND EXPIRED_AFTER >= {NOW}"
            ),
            delete_released_and_expired: format!(
                "DELETE FROM {table} WHERE REGION = ?2 AND EXPIRED_AFTER < {cutoff} \
                 AND CREATED_DATE < {cutoff}"
            ),
            release_keeping: format!(
                "UPDATE {table} SET \
                 CLIENT_ID = CASE WHEN {keep_until} > {NOW} THEN CLIENT_ID END, \
                 FENCING_TOKEN = FENCING_TOKEN + 1, \
                 EXPIRED_AFTER = CASE WHEN {keep_until} > {NOW} THEN {keep_until} \
                 ELSE '1970-01-01 00:00:00.000' END \
                 WHERE LOCK_KEY = ?1 AND REGION = ?2 AND CLIENT_ID = ?3 AND FENCING_TOKEN = ?5 \
                 AND EXPIRED_AFTER >= {NOW}"
            ),
        }
    }

    fn holder(
        conn: &mut Conn<Self>,
        sql: &str,
        params: &Params,
    ) -> Result<Option<HolderRow>, Failure> {
        let _running = running();
        let mut statement = conn.conn.prepare_cached(sql).map_err(classify)?;
        bind(&mut statement, params).map_err(classify)?;
        let mut rows = statement.raw_query();
        let Some(row) = rows.next().map_err(classify)? else {
            return Ok(None);
        };
        let read = || -> rusqlite::Result<HolderRow> {
            Ok(HolderRow {
                client_id: row.get(0)?,
                acquired_micros: row.get(1)?,
                expires_micros: row.get(2)?,
                token: row.get(3)?,
                now_micros: row.get(4)?,
            })
        };
        read().map(Some).map_err(classify)
    }

    fn rows(conn: &mut Conn<Self>, sql: &str, params: &Params) -> Result<Vec<ListedRow>, Failure> {
        let _running = running();
        let mut statement = conn.conn.prepare_cached(sql).map_err(classify)?;
        bind(&mut statement, params).map_err(classify)?;
        let mut rows = statement.raw_query();
        let mut listed = Vec::new();
        while let Some(row) = rows.next().map_err(classify)? {
            listed.push(ListedRow {
                lock_key: row.get(0).map_err(classify)?,
                client_id: row.get(1).map_err(classify)?,
                acquired_micros: row.get(2).map_err(classify)?,
                expires_micros: row.get(3).map_err(classify)?,
                token: row.get(4).map_err(classify)?,
                state: row.get(5).map_err(classify)?,
                name: row.get(6).map_err(classify)?,
            });
        }
        Ok(listed)
    }

    fn acquire(conn: &mut Conn<Self>, sql: &str, params: &Params) -> Result<Option<i64>, Failure> {
        let _running = running();
        let mut statement = conn.conn.prepare_cached(sql).map_err(classify)?;
        bind(&mut statement, params).map_err(classify)?;
        let mut rows = statement.raw_query();
        let token = match rows.next().map_err(classify)? {
            Some(row) => Some(row.get::<_, i64>(0).map_err(classify)?),
            None => None,
        };
        // The statement has written and holds the file's write lock until it is reset.
        fail_point!("sqlite::acquire_inside_statement");
        Ok(token)
    }

    fn update(conn: &mut Conn<Self>, sql: &str, params: &Params) -> Result<u64, Failure> {
        let _running = running();
        let mut statement = conn.conn.prepare_cached(sql).map_err(classify)?;
        bind(&mut statement, params).map_err(classify)?;
        Ok(statement.raw_execute().map_err(classify)? as u64)
    }

    fn execute_batch(conn: &mut Conn<Self>, sql: &str) -> Result<(), Failure> {
        let _running = running();
        conn.conn.execute_batch(sql).map_err(classify)
    }

    fn columns(conn: &mut Conn<Self>, table: &str) -> Result<Vec<String>, Failure> {
        let _running = running();
        let mut statement = conn
            .conn
            .prepare_cached("SELECT upper(name) FROM pragma_table_info(?1)")
            .map_err(classify)?;
        let names = statement
            .query_map([table], |row| row.get::<_, String>(0))
            .map_err(classify)?;
        names.collect::<Result<_, _>>().map_err(classify)
    }

    fn floor(conn: &mut Conn<Self>, table: &str) -> Result<FloorFound, Failure> {
        let _running = running();
        let (tables, triggers) = conn
            .conn
            .query_row(
                "SELECT (SELECT count(*) FROM sqlite_master WHERE type = 'table' \
                 AND name = ?1 COLLATE NOCASE), (SELECT count(*) FROM sqlite_master \
                 WHERE type = 'trigger' AND name = ?2 COLLATE NOCASE \
                 AND tbl_name = ?3 COLLATE NOCASE)",
                [
                    crate::backend::floor_table(table),
                    crate::backend::floor_trigger(table),
                    table.to_string(),
                ],
                |row| Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?)),
            )
            .map_err(classify)?;
        Ok(FloorFound {
            readable: tables > 0,
            trigger: triggers > 0,
        })
    }

    fn unique_key_columns(
        conn: &mut Conn<Self>,
        table: &str,
    ) -> Result<Vec<(String, String)>, Failure> {
        let _running = running();
        let mut statement = conn
            .conn
            .prepare_cached(
                "SELECT il.name, upper(ii.name) FROM pragma_index_list(?1) AS il, \
                 pragma_index_info(il.name) AS ii WHERE il.\"unique\" = 1",
            )
            .map_err(classify)?;
        let rows = statement
            .query_map([table], |row| Ok((row.get(0)?, row.get(1)?)))
            .map_err(classify)?;
        rows.collect::<Result<_, _>>().map_err(classify)
    }

    fn describe(conn: &mut Conn<Self>, sql: &str) -> Result<(usize, usize), Failure> {
        let _running = running();
        let statement = conn.conn.prepare(sql).map_err(classify)?;
        Ok((statement.parameter_count(), statement.column_count()))
    }

    fn mark_broken(conn: &mut Conn<Self>) {
        conn.broken = true;
    }

    #[cfg(target_os = "linux")]
    fn listen_for_releases(
        manager: &SqliteManager,
        _pool: &crate::backend::pools::Pool<Self::Manager>,
        table: &crate::backend::TableSettings,
        _idle_timeout: Duration,
        handler: crate::backend::ListenerHandler,
        requests: crossbeam_channel::Receiver<()>,
    ) -> bool {
        let Some(board) = manager.board() else {
            return false;
        };
        board::listen(
            std::sync::Arc::clone(board),
            table.table.clone(),
            table.region.clone(),
            handler,
            requests,
        )
    }

    #[cfg(target_os = "linux")]
    const WAITERS_WAIT_THEMSELVES: bool = true;

    #[cfg(target_os = "linux")]
    fn release_wait(
        manager: &SqliteManager,
        table: &crate::backend::TableSettings,
        lock_key: &str,
    ) -> Option<Box<dyn crate::backend::ReleaseWait>> {
        let board = manager.board()?;
        let slot = board::slot_of(&table.table, &table.region, lock_key);
        Some(Box::new(board::SlotWait::new(board, slot)))
    }

    #[cfg(target_os = "linux")]
    fn interrupt_release_waits(
        manager: &SqliteManager,
        table: &crate::backend::TableSettings,
        lock_key: &str,
    ) {
        Self::release_done(manager, table, lock_key, Some(true), true);
    }

    #[cfg(target_os = "linux")]
    fn release_done(
        manager: &SqliteManager,
        table: &crate::backend::TableSettings,
        lock_key: &str,
        released: Option<bool>,
        wakes: bool,
    ) {
        if released != Some(true) || !wakes {
            return;
        }
        if let Some(board) = manager.board() {
            let slot = || board::slot_of(&table.table, &table.region, lock_key);
            board.release(slot);
        }
    }

    fn clock_sql() -> &'static str {
        "SELECT CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)"
    }

    fn renew_batch_sql(table: &str) -> Vec<String> {
        vec![format!(
            "UPDATE {table} AS l SET EXPIRED_AFTER = {NOW_PLUS_TTL} \
             FROM (SELECT value ->> 0 AS k, value ->> 1 AS t FROM json_each(?1)) AS j \
             WHERE l.LOCK_KEY = j.k AND l.REGION = ?2 AND l.CLIENT_ID = ?3 \
             AND l.FENCING_TOKEN = j.t AND l.EXPIRED_AFTER >= {NOW} \
             RETURNING LOCK_KEY, FENCING_TOKEN"
        )]
    }

    fn renew_batch(
        conn: &mut Conn<Self>,
        sql: &[String],
        params: &Params,
        _pairs: usize,
    ) -> Result<BatchRows, Failure> {
        let _running = running();
        let mut statement = conn.conn.prepare_cached(&sql[0]).map_err(classify)?;
        bind(&mut statement, params).map_err(classify)?;
        let mut rows = statement.raw_query();
        let mut renewed = Vec::new();
        while let Some(row) = rows.next().map_err(classify)? {
            renewed.push((row.get(0).map_err(classify)?, row.get(1).map_err(classify)?));
        }
        // SQLite locks the whole database, never one row: nothing is ever skipped.
        Ok(BatchRows {
            renewed,
            busy: Vec::new(),
        })
    }

    const ROW_LOCKS: bool = false;

    const PARKS_CONNECTION: bool = true;
}

/// Binds parameters 1 to the statement's highest parameter number, so a statement may use any
/// prefix of the documented parameters.
fn bind(statement: &mut rusqlite::CachedStatement<'_>, params: &Params) -> rusqlite::Result<()> {
    let values: [&dyn ToSql; 6] = [
        &params.lock_key,
        &params.region,
        &params.client_id,
        &params.ttl_micros,
        &params.token,
        &params.name,
    ];
    for (index, value) in values.iter().enumerate().take(statement.parameter_count()) {
        statement.raw_bind_parameter(index + 1, value)?;
    }
    Ok(())
}

fn classify(error: rusqlite::Error) -> Failure {
    let (kind, hint) = match &error {
        rusqlite::Error::SqliteFailure(e, message) => match e.code {
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => (
                FailureKind::Transient,
                "the SQLite file is busy: another connection holds its write lock".to_string(),
            ),
            ErrorCode::CannotOpen | ErrorCode::PermissionDenied | ErrorCode::ReadOnly => (
                FailureKind::Fatal,
                "SQLite cannot open or write the database file: check that its directory exists, \
                 that the path is a file, and its permissions"
                    .to_string(),
            ),
            ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt => (
                FailureKind::Fatal,
                "the file is not a healthy SQLite database: point the registry at another path"
                    .to_string(),
            ),
            _ => (
                FailureKind::Fatal,
                match message {
                    Some(m) if m.contains("no such table") => format!(
                        "{m}: create the table with sql/sqlite.sql or RegistryBuilder::create_table(true)"
                    ),
                    Some(m) => format!("SQLite refused the statement: {m}"),
                    None => "SQLite refused the statement".to_string(),
                },
            ),
        },
        other => (FailureKind::Fatal, format!("SQLite error: {other}")),
    };
    Failure::new(kind, hint, error)
}

/// Opens a store on the SQLite file at `path`.
pub(crate) fn open(
    path: PathBuf,
    pool: &crate::backend::PoolSettings,
    table: &crate::backend::TableSettings,
) -> crate::Result<std::sync::Arc<dyn crate::backend::Store>> {
    refuse_private_database(&path)?;
    if table.read_only && table.create_table {
        return Err(crate::Error::setting(
            "read_only",
            "a read-only registry cannot create the table: drop create_table(true), or build a \
             registry that may write",
        ));
    }
    let manager = SqliteManager::new(path).reading_only(table.read_only);
    first_open(&manager, pool.connect_timeout)?;
    let store = crate::backend::SqlStore::<Sqlite>::open(manager, pool, table)?;
    Ok(std::sync::Arc::new(store))
}

/// Refuses the names SQLite gives a database private to one connection: `:memory:` and the
/// empty name (a temporary file), and `file:` URIs of in-memory databases. Every pooled
/// connection (and every other registry) would get a database of its own, and locks would
/// exclude nothing.
fn refuse_private_database(path: &std::path::Path) -> crate::Result<()> {
    let name = path.to_string_lossy();
    let in_memory_uri =
        name.starts_with("file:") && (name.contains(":memory:") || name.contains("mode=memory"));
    if name.is_empty() || name == ":memory:" || in_memory_uri {
        return Err(crate::Error::setting(
            "sqlite",
            format!(
                "{name:?} is a database private to one connection (in memory or temporary): \
                 every connection of the pool, and every other registry, would get its own and \
                 the locks would exclude nothing; give the path of a file that every process \
                 that shares the locks opens"
            ),
        ));
    }
    Ok(())
}

/// Opens the file once before the pools do, so that a path that cannot hold a database (its
/// directory is missing, it is a directory, it is some other file, it may not be written) fails
/// at once with the cause and the path in the message; a pool would wait `connect_timeout` and
/// say only that it timed out. A busy file is retried until `timeout`.
fn first_open(manager: &SqliteManager, timeout: Duration) -> crate::Result<()> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let failure = match r2d2::ManageConnection::connect(manager) {
            // SQLite opens a file this user may not write read-only without a word: say so
            // now rather than at the first lock.
            Ok(conn) if !manager.read_only && conn.conn.is_readonly("main").unwrap_or(false) => {
                classify(rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_READONLY),
                    Some("SQLite could open the database file for reading only".to_string()),
                ))
            }
            Ok(_) => return Ok(()),
            Err(error) => classify(error),
        };
        if failure.kind == FailureKind::Fatal || std::time::Instant::now() >= deadline {
            let hint = unopenable(&manager.path, manager.read_only).unwrap_or(failure.hint);
            return Err(crate::Error::Database {
                operation: "open the SQLite database",
                hint: format!("{hint} ({}): {}", manager.path.display(), failure.source),
                source: failure.source,
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `path` with `suffix` appended: the files SQLite and leasehold keep beside a database.
fn beside(path: &std::path::Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Whether this process may write `path` (access(2), which judges by the real user).
#[cfg(unix)]
#[allow(unsafe_code)]
fn writable(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access(2) only reads the NUL-terminated path.
    unsafe { libc::access(c_path.as_ptr(), libc::W_OK) == 0 }
}

/// Elsewhere the permissions are not looked at.
#[cfg(not(unix))]
fn writable(_path: &std::path::Path) -> bool {
    true
}

/// Whether this process may read `path` (access(2), which judges by the real user).
#[cfg(unix)]
#[allow(unsafe_code)]
fn readable(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access(2) only reads the NUL-terminated path.
    unsafe { libc::access(c_path.as_ptr(), libc::R_OK) == 0 }
}

/// Elsewhere the permissions are not looked at.
#[cfg(not(unix))]
fn readable(_path: &std::path::Path) -> bool {
    true
}

/// Why the file at `path` cannot be opened, when the file system tells: a missing file (for a
/// read-only open, which never creates it), a directory in which SQLite cannot create the
/// files of WAL mode, or a file this user may not write. `None` when none of these holds.
fn unopenable(path: &std::path::Path, read_only: bool) -> Option<String> {
    if !path.exists() {
        return read_only.then(|| {
            "there is no SQLite database at this path (a read-only open does not create one)"
                .to_string()
        });
    }
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let (wal, shm) = (beside(path, "-wal"), beside(path, "-shm"));
    let beside_exist = wal.exists() && shm.exists();
    if !writable(&dir) && !beside_exist {
        let (board, who) = if read_only {
            (
                ", for readers too".to_string(),
                "let this user write that directory, or read while they are there (while a \
                 process has the database open)",
            )
        } else {
            (
                format!(
                    ", and leasehold its release board {} for wake-ups",
                    beside(path, "-leasehold").display()
                ),
                "let the users of the locks write that directory (a directory of its own for \
                 the database is simplest)",
            )
        };
        return Some(format!(
            "this user may not create files in the directory {dir}, and the database is in WAL \
             mode, for which SQLite creates {wal} and {shm} beside it{board}: {who}",
            dir = dir.display(),
            wal = wal.display(),
            shm = shm.display(),
        ));
    }
    // A reader opens the three files, for reading only when it may not write them.
    if let Some(unreadable) = [path, wal.as_path(), shm.as_path()]
        .into_iter()
        .find(|file| read_only && file.exists() && !readable(file))
    {
        return Some(format!(
            "this user may not read {}: reading a database in WAL mode needs read permission \
             on the file and on the -wal and -shm files beside it",
            unreadable.display()
        ));
    }
    if !read_only && !writable(path) {
        return Some(
            "this user may not write the database file: taking, renewing and releasing locks \
             write it (a read-only registry, or `leasehold status` and `list`, only read it)"
                .to_string(),
        );
    }
    if shm.exists() && !writable(&shm) && !read_only {
        return Some(format!(
            "this user may not write {}, which another user created: every user of the locks \
             must be able to write the files beside the database",
            shm.display()
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A statement started during a pause runs only once the pause ends; a pause waits for the
    /// statement in flight.
    #[test]
    fn a_pause_holds_statements_back_until_it_ends() {
        let dir = tempfile::tempdir().unwrap();
        let manager = SqliteManager::new(dir.path().join("pause.db"));
        let mut conn = r2d2::ManageConnection::connect(&manager).unwrap();
        let pause = pause_sqlite_statements();
        let (done, finished) = std::sync::mpsc::channel();
        let statement = std::thread::spawn(move || {
            Sqlite::execute_batch(&mut conn, "CREATE TABLE t (x INT)").unwrap();
            done.send(()).unwrap();
        });
        // While paused it cannot finish (however long this waits).
        assert!(finished.recv_timeout(Duration::from_millis(200)).is_err());
        drop(pause);
        finished
            .recv_timeout(Duration::from_secs(30))
            .expect("the statement ran after the pause");
        statement.join().unwrap();
    }

    #[test]
    fn the_busy_handler_retries_within_microseconds_and_gives_up_after_the_busy_wait() {
        // SQLite's busy timeout sleeps 1 ms before its first retry; this one 25 µs.
        assert_eq!(busy_pauses(0), (BUSY_FIRST_PAUSE, Duration::ZERO));
        assert!(busy_pauses(0).0 < Duration::from_micros(100));
        let (second, slept) = busy_pauses(1);
        assert_eq!((second, slept), (BUSY_FIRST_PAUSE * 2, BUSY_FIRST_PAUSE));
        // Pauses grow to the longest and stay there; the handler asks SQLite to retry until
        // about BUSY_WAIT has been slept, then gives up (SQLITE_BUSY, retried by the retry loop).
        let last = (0..100)
            .find(|tries| busy_pauses(*tries).1 >= BUSY_WAIT)
            .expect("it gives up");
        assert!(busy_pauses(last - 1).0 <= BUSY_LONGEST_PAUSE);
        let (_, slept) = busy_pauses(last);
        assert!(slept >= BUSY_WAIT && slept < BUSY_WAIT + BUSY_LONGEST_PAUSE);
        assert!(!busy_wait(last as i32));
    }
}
