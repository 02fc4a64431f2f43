//! The fence on MySQL and MariaDB: an `UPDATE` of the row's expiry (to at least now + the
//! lease's time-to-live), whose row lock makes any other `UPDATE` or `DELETE` of the row (a
//! takeover) wait for the transaction, then `SELECT … LOCK IN SHARE MODE` (both servers'
//! spelling), a locking read of the latest row, which tells whether it is this grant's (the
//! update's count of rows depends on the client's flags). The statement given to other drivers
//! is that read alone, whose shared lock keeps takeovers out without changing the row. Its
//! parameters go into the fence's text as hexadecimal literals, so that the whole fence is one
//! round trip.
//!
//! A `mysql::Transaction` is always a top-level transaction: it begins with `START
//! TRANSACTION`, and MySQL has no nested transactions. Before its check the fence changes the
//! session, and its end restores it:
//!
//! - the idle bound: `wait_timeout` (MySQL ends a session idle that long, in a transaction or
//!   not) and, on MariaDB 10.3 and later, `idle_transaction_timeout` with its write and
//!   read-only variants (which take precedence over `wait_timeout` in a transaction), each
//!   lowered to the bound unless the session's is tighter;
//! - `autocommit` off, so that statements after a premature end of the transaction (a
//!   `COMMIT`, or DDL's implicit commit) open a new transaction instead of committing one by
//!   one, and the refused commit rolls them back;
//! - a savepoint ([`MARK`]) that marks the transaction: any end of it removes the savepoint,
//!   and the commit releases it first and refuses when it is gone.
//!
//! `Fenced` implements `Queryable`; it never hands out the `&mut mysql::Transaction` that could
//! replace the fenced one.

use super::sealed::{Check, Driver, Held};
use super::{driver_error, ended, Fenced};
use crate::backend::mysql::NOW;
use mysql::prelude::{AsStatement, Queryable};
use mysql::{Binary, Params, QueryResult, Row, Statement, Text};

/// The savepoint that marks a fenced transaction.
const MARK: &str = "leasehold_fence";

/// MySQL's error for a savepoint that does not exist (`ER_SP_DOES_NOT_EXIST`).
const NO_SUCH_SAVEPOINT: u16 = 1305;

/// The check on `table` (four positional `?`): returns the token while the lease holds.
pub(super) fn statement(table: &str) -> String {
    format!(
        "SELECT FENCING_TOKEN FROM {table} WHERE LOCK_KEY = ? AND REGION = ? \
         AND CLIENT_ID = ? AND FENCING_TOKEN = ? AND EXPIRED_AFTER >= {NOW} LOCK IN SHARE MODE"
    )
}

/// MariaDB's idle bounds in a transaction: for any transaction, then those that take
/// precedence when set (not 0) — for one that wrote, for one that did not.
const MARIADB_IDLE: [&str; 3] = [
    "idle_transaction_timeout",
    "idle_write_transaction_timeout",
    "idle_readonly_transaction_timeout",
];

/// The session settings a fence changes, as they were.
#[derive(Debug, Default)]
pub struct Session {
    autocommit: i64,
    wait_timeout: i64,
    /// [`MARIADB_IDLE`]'s values, on MariaDB 10.3 and later.
    mariadb_idle: Option<[i64; 3]>,
}

impl Session {
    /// The shortest idle time the server allows a transaction once the fence lowered every
    /// bound to `bound`: that, or a tighter one of the session's (0 is off).
    fn idle_bound(&self, bound: std::time::Duration) -> std::time::Duration {
        let session = std::iter::once(self.wait_timeout)
            .chain(self.mariadb_idle.iter().flatten().copied())
            .filter(|seconds| *seconds > 0)
            .map(|seconds| std::time::Duration::from_secs(seconds as u64));
        session.fold(bound, std::time::Duration::min)
    }

    /// `SET SESSION` of these values.
    fn restore(&self) -> String {
        let mut sql = format!(
            "SET SESSION autocommit = {}, wait_timeout = {}",
            self.autocommit, self.wait_timeout
        );
        for (name, value) in MARIADB_IDLE.iter().zip(self.mariadb_idle.iter().flatten()) {
            sql.push_str(&format!(", {name} = {value}"));
        }
        sql
    }
}

/// Reads the session's settings, bounds its idle time to `seconds` and turns autocommit off.
/// MariaDB runs the text in `/*M!100300 … */` (version 10.3 and later), MySQL skips it as a
/// comment.
///
/// `wait_timeout` and the write and read-only bounds are lowered to `seconds` (those at 0 stay
/// off, so that MariaDB falls back to the next); `idle_transaction_timeout` is set to `seconds`
/// unless it is on and tighter.
fn bound_statement(seconds: u64) -> String {
    let [any, write, read_only] = MARIADB_IDLE;
    let lowered = |name: &str| format!("{name} = LEAST(@@SESSION.{name}, {seconds})");
    format!(
        "SELECT @@SESSION.autocommit + 0, @@SESSION.wait_timeout \
         /*M!100300 , @@SESSION.{any}, @@SESSION.{write}, @@SESSION.{read_only} */; \
         SET SESSION autocommit = 0, {wait} /*M!100300 , \
         {any} = IF(@@SESSION.{any} BETWEEN 1 AND {seconds}, @@SESSION.{any}, {seconds}), \
         {write_bound}, {read_only_bound} */",
        wait = lowered("wait_timeout"),
        write_bound = lowered(write),
        read_only_bound = lowered(read_only),
    )
}

/// `text` as a string literal that needs no escaping whatever the session's SQL mode: its
/// bytes in hexadecimal, read as UTF-8 (and compared in the column's collation, which a
/// literal always yields to, so the primary key's index serves the statement).
fn literal(text: &str) -> String {
    let hex: String = text.bytes().map(|byte| format!("{byte:02X}")).collect();
    format!("_utf8mb4 X'{hex}'")
}

/// The whole fence in one round trip: [`bound_statement`]; the check, as an `UPDATE` that
/// keeps the row until at least now + the lease's time-to-live (it never shortens it) and
/// locks it against every other writer, then a locking read that returns the token when the
/// row is this grant's; and the mark, set after the `UPDATE` so that rolling back to it keeps
/// the row's new expiry.
fn fence_statement(check: &Check) -> String {
    let rows = super::any_row(check.rows.len(), |row, column| {
        let p = &check.rows[row];
        match column {
            0 => literal(&p.lock_key),
            1 => literal(&p.region),
            2 => literal(&p.client_id),
            _ => p.fencing_token.to_string(),
        }
    });
    let conditions = format!("({rows}) AND EXPIRED_AFTER >= {NOW}");
    format!(
        "{bound}; UPDATE {table} SET EXPIRED_AFTER = GREATEST(EXPIRED_AFTER, \
         {NOW} + INTERVAL {ttl} MICROSECOND) WHERE {conditions}; \
         SELECT LOCK_KEY FROM {table} WHERE {conditions} LOCK IN SHARE MODE; \
         SAVEPOINT {MARK}",
        bound = bound_statement(check.idle.as_secs()),
        table = check.table,
        ttl = check.ttl.as_micros(),
    )
}

/// What [`batch`] ran.
struct Batch {
    /// The rows of each result, in order, up to the statement that failed.
    rows: Vec<Vec<Row>>,
    /// How many statements completed before the one that failed, and its error.
    failed: Option<(usize, mysql::Error)>,
}

/// Runs the statements of `sql` in one round trip (the server stops at the first that fails).
fn batch(tx: &mut mysql::Transaction<'_>, sql: &str) -> Batch {
    let mut ran = Batch {
        rows: Vec::new(),
        failed: None,
    };
    let mut result = match tx.query_iter(sql) {
        Ok(result) => result,
        Err(e) => {
            ran.failed = Some((0, e));
            return ran;
        }
    };
    let mut index = 0;
    while let Some(set) = result.iter() {
        let mut rows = Vec::new();
        for row in set {
            match row {
                Ok(row) => rows.push(row),
                Err(e) => {
                    ran.rows.push(rows);
                    ran.failed = Some((index, e));
                    return ran;
                }
            }
        }
        ran.rows.push(rows);
        index += 1;
    }
    ran
}

/// The session as read by [`bound_statement`].
fn session(row: Option<Row>) -> Option<Session> {
    let row = row?;
    let value = |at: usize| row.get_opt::<i64, _>(at).and_then(Result::ok);
    let mariadb_idle = match row.len() {
        5 => Some([value(2)?, value(3)?, value(4)?]),
        _ => None,
    };
    Some(Session {
        autocommit: value(0)?,
        wait_timeout: value(1)?,
        mariadb_idle,
    })
}

/// Ends the transaction with `end` (`COMMIT` or `ROLLBACK`) and restores the session, in one
/// round trip; `Err` when `end` failed.
fn end_and_restore(
    tx: &mut mysql::Transaction<'_>,
    end: &str,
    session: Option<&Session>,
) -> Result<(), mysql::Error> {
    let Some(session) = session else {
        return tx.query_drop(end);
    };
    match batch(tx, &format!("{end}; {}", session.restore())).failed {
        None => Ok(()),
        Some((0, e)) => Err(e),
        Some((_, e)) => {
            log::warn!("restoring the session settings after a fenced transaction: {e}");
            Ok(())
        }
    }
}

impl Driver for mysql::Transaction<'_> {
    const BACKEND: &'static str = "MySQL";
    /// The session as it was, once the fence changed it.
    type Mark = Option<Session>;

    fn check(&mut self, check: &Check, mark: &mut Option<Session>) -> crate::Result<Option<Held>> {
        let mut ran = batch(self, &fence_statement(check));
        // Once read, the settings are restored at the end, whatever failed after.
        *mark = session(ran.rows.first_mut().and_then(|rows| rows.drain(..).next()));
        if let Some((_, e)) = ran.failed {
            return Err(driver_error("fence", e));
        }
        let Some(session) = mark.as_ref() else {
            return Err(driver_error(
                "fence",
                "the server did not return its session settings",
            ));
        };
        // The results: the settings, `SET`, `UPDATE`, the locking read, `SAVEPOINT`.
        let found = ran
            .rows
            .get(3)
            .into_iter()
            .flatten()
            .filter_map(|row| row.get_opt::<String, _>(0).and_then(Result::ok))
            .collect();
        Ok(Some(Held {
            found,
            idle: Some(session.idle_bound(check.idle)),
        }))
    }

    /// Releases the mark, commits and restores the session in one round trip; a missing mark
    /// means that a statement ended the fenced transaction.
    fn commit(mut self, mark: Option<Session>) -> crate::Result<()> {
        let Some(session) = mark else {
            return mysql::Transaction::commit(self).map_err(|e| driver_error("fenced commit", e));
        };
        let sql = format!("RELEASE SAVEPOINT {MARK}; COMMIT; {}", session.restore());
        let refusal = match batch(&mut self, &sql).failed {
            None => None,
            Some((2, e)) => {
                log::warn!("restoring the session settings after a fenced transaction: {e}");
                None
            }
            Some((0, mysql::Error::MySqlError(e))) if e.code == NO_SUCH_SAVEPOINT => Some(ended()),
            Some((_, e)) => Some(driver_error("fenced commit", e)),
        };
        if let Some(refusal) = refusal {
            if let Err(e) = end_and_restore(&mut self, "ROLLBACK", Some(&session)) {
                log::debug!("rolling back a refused fenced transaction: {e}");
            }
            let _ = mysql::Transaction::rollback(self);
            return Err(refusal);
        }
        // Committed: the driver's own commit finds no transaction left.
        mysql::Transaction::commit(self).map_err(|e| driver_error("fenced commit", e))
    }

    fn rollback(mut self, mark: Option<Session>) -> crate::Result<()> {
        end_and_restore(&mut self, "ROLLBACK", mark.as_ref())
            .map_err(|e| driver_error("fenced rollback", e))?;
        mysql::Transaction::rollback(self).map_err(|e| driver_error("fenced rollback", e))
    }
}

/// The statements of [`mysql::Transaction`], in the fenced transaction.
impl Queryable for Fenced<'_, mysql::Transaction<'_>> {
    fn query_iter<Q: AsRef<str>>(
        &mut self,
        query: Q,
    ) -> mysql::Result<QueryResult<'_, '_, '_, Text>> {
        self.tx().query_iter(query)
    }

    fn prep<Q: AsRef<str>>(&mut self, query: Q) -> mysql::Result<Statement> {
        self.tx().prep(query)
    }

    fn close(&mut self, stmt: Statement) -> mysql::Result<()> {
        self.tx().close(stmt)
    }

    fn exec_iter<S, P>(
        &mut self,
        stmt: S,
        params: P,
    ) -> mysql::Result<QueryResult<'_, '_, '_, Binary>>
    where
        S: AsStatement,
        P: Into<Params>,
    {
        self.tx().exec_iter(stmt, params)
    }

    fn exec_batch<S, P, I>(&mut self, stmt: S, params: I) -> mysql::Result<()>
    where
        Self: Sized,
        S: AsStatement,
        P: Into<Params>,
        I: IntoIterator<Item = P>,
    {
        self.tx().exec_batch(stmt, params)
    }
}
