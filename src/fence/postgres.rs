//! The fence on PostgreSQL: an `UPDATE` of the row's expiry (to at least now + the lease's
//! time-to-live), whose row lock makes any other `UPDATE` or `DELETE` of the row (a takeover)
//! wait for the transaction. The statement given to other drivers is `SELECT … FOR SHARE`,
//! whose share lock does the same without changing the row.
//!
//! The postgres crate gives a savepoint the type of a transaction (`Transaction::transaction`,
//! `Transaction::savepoint`), and does not say which is which. The server does: it exports no
//! snapshot from a savepoint, so the fence's statement exports one (`pg_export_snapshot()`, a
//! small file on the server until the transaction ends) and a savepoint fails it. The same
//! statement reads the transaction's id, which the commit compares with the open one, and bounds
//! the transaction's idle time (`idle_in_transaction_session_timeout`, `SET LOCAL`: it ends with
//! the transaction).
//!
//! `Fenced` has the driver's statement methods, which take `&mut`; it never hands out the
//! `&mut postgres::Transaction` that could replace the fenced one.

use super::sealed::{Check, Driver, Held};
use super::{driver_error, ended, Fenced};
use postgres::error::SqlState;
use postgres::types::{BorrowToSql, ToSql, Type};
use postgres::{
    CopyInWriter, CopyOutReader, Error, Portal, Row, RowIter, SimpleQueryMessage, Statement,
    ToStatement,
};

/// The conditions on the row (parameters `$1`–`$4`): this grant, not expired.
///
/// The clock is the statement's start on the database (`statement_timestamp()`, UTC): the
/// lease statements read `now()` in transactions of one statement, where the two are the
/// same instant; in the caller's longer transaction `now()` would be its beginning. The casts
/// give the parameters the columns' types whatever a driver declares (sqlx sends `TEXT`), so
/// that the primary key's index finds the row.
const CONDITIONS: &str = "LOCK_KEY = CAST($1 AS BPCHAR) AND REGION = CAST($2 AS VARCHAR) \
     AND CLIENT_ID = CAST($3 AS BPCHAR) AND FENCING_TOKEN = CAST($4 AS BIGINT) \
     AND EXPIRED_AFTER >= (statement_timestamp() AT TIME ZONE 'UTC')";

/// The session's idle bound, in the setting's own text.
const IDLE: &str = "current_setting('idle_in_transaction_session_timeout')";

/// The check on `table` (parameters `$1`–`$4`): returns the token while the lease holds.
pub(super) fn statement(table: &str) -> String {
    format!("SELECT FENCING_TOKEN FROM {table} WHERE {CONDITIONS} FOR SHARE")
}

/// The fence's own statement for `rows` rows: the check of each (parameters `$3`–`$6` for the
/// first, `$7`–`$10` for the second, …), which also keeps each row until at least now + `$2`
/// µs (it never shortens it) and locks it against every other writer; per row found, its
/// `LOCK_KEY`, the transaction's id, a snapshot export (which fails in a savepoint); and the
/// idle bound `$1` in milliseconds, unless the session's is tighter, and that bound as it is
/// then (the same whether `set_config` ran before it or not).
fn fence_statement(table: &str, rows: usize) -> String {
    let tighter = format!("{IDLE}::interval BETWEEN INTERVAL '1 ms' AND $1 * INTERVAL '1 ms'");
    // The columns' own types, so that the primary key's index finds the rows.
    let types = ["BPCHAR", "VARCHAR", "BPCHAR", "BIGINT"];
    let rows = super::any_row(rows, |row, column| {
        format!("CAST(${} AS {})", 3 + 4 * row + column, types[column])
    });
    format!(
        "UPDATE {table} SET EXPIRED_AFTER = GREATEST(EXPIRED_AFTER, \
         (statement_timestamp() AT TIME ZONE 'UTC') + $2 * INTERVAL '1 microsecond') \
         WHERE ({rows}) AND EXPIRED_AFTER >= (statement_timestamp() AT TIME ZONE 'UTC') \
         RETURNING LOCK_KEY, txid_current(), pg_export_snapshot(), \
         set_config('idle_in_transaction_session_timeout', \
         CASE WHEN {tighter} THEN {IDLE} ELSE CAST($1 AS TEXT) END, true), \
         CAST(CASE WHEN {tighter} THEN EXTRACT(EPOCH FROM {IDLE}::interval) * 1000 \
         ELSE $1 END AS BIGINT)"
    )
}

/// The refusal of a savepoint (a nested transaction).
fn nested() -> crate::Error {
    crate::Error::setting(
        "fence",
        "the transaction is a savepoint (a nested transaction) or runs inside one: its commit \
         would only release the savepoint, and its writes would commit later with the outer \
         transaction, after the lock was let go. Fence a top-level transaction (postgres: \
         `Client::transaction`) right after it begins, before any savepoint (the postgres \
         crate rolls a savepoint back without releasing it, so the transaction stays inside \
         it)",
    )
}

/// Whether `e` is PostgreSQL's refusal to export a snapshot from a savepoint.
fn in_savepoint(e: &Error) -> bool {
    e.code() == Some(&SqlState::ACTIVE_SQL_TRANSACTION)
        && e.as_db_error()
            .is_some_and(|db| db.message().contains("subtransaction"))
}

impl Driver for postgres::Transaction<'_> {
    const BACKEND: &'static str = "PostgreSQL";
    /// The transaction's id (`txid_current()`).
    type Mark = Option<i64>;

    /// One round trip: an unnamed statement with the columns' types (so the primary key's
    /// index serves it), which also works behind a transaction pooler.
    fn check(&mut self, check: &Check, mark: &mut Option<i64>) -> crate::Result<Option<Held>> {
        let idle_ms = i64::try_from(check.idle.as_millis()).unwrap_or(i64::MAX);
        let ttl_micros = i64::try_from(check.ttl.as_micros()).unwrap_or(i64::MAX);
        let mut params: Vec<(&(dyn ToSql + Sync), Type)> =
            vec![(&idle_ms, Type::INT8), (&ttl_micros, Type::INT8)];
        for p in &check.rows {
            params.extend([
                (&p.lock_key as &(dyn ToSql + Sync), Type::BPCHAR),
                (&p.region, Type::VARCHAR),
                (&p.client_id, Type::BPCHAR),
                (&p.fencing_token, Type::INT8),
            ]);
        }
        let rows = self
            .query_typed(&fence_statement(&check.table, check.rows.len()), &params)
            .map_err(|e| {
                if in_savepoint(&e) {
                    nested()
                } else {
                    driver_error("fence", e)
                }
            })?;
        let Some(first) = rows.first() else {
            return Ok(Some(Held {
                found: Vec::new(),
                idle: None,
            }));
        };
        *mark = Some(first.try_get(1).map_err(|e| driver_error("fence", e))?);
        let idle: i64 = first.try_get(4).map_err(|e| driver_error("fence", e))?;
        let found = rows
            .iter()
            .map(|row| row.try_get::<_, String>(0))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| driver_error("fence", e))?;
        Ok(Some(Held {
            found,
            idle: Some(std::time::Duration::from_millis(idle.max(0) as u64)),
        }))
    }

    /// Commits after one look at the open transaction's id: another id, or none, means that
    /// a statement ended the fenced transaction.
    fn commit(mut self, mark: Option<i64>) -> crate::Result<()> {
        let open = self
            .query_typed_one("SELECT txid_current_if_assigned()", &[])
            .and_then(|row| row.try_get::<_, Option<i64>>(0));
        let refusal = match open {
            Ok(id) if id.is_some() && id == mark => None,
            Ok(_) => Some(ended()),
            Err(e) => Some(driver_error("fenced commit", e)),
        };
        if let Some(refusal) = refusal {
            if let Err(e) = postgres::Transaction::rollback(self) {
                log::debug!("rolling back a refused fenced transaction: {e}");
            }
            return Err(refusal);
        }
        postgres::Transaction::commit(self).map_err(|e| driver_error("fenced commit", e))
    }

    fn rollback(self, _mark: Option<i64>) -> crate::Result<()> {
        postgres::Transaction::rollback(self).map_err(|e| driver_error("fenced rollback", e))
    }
}

/// The statements of [`postgres::Transaction`], in the fenced transaction.
impl Fenced<'_, postgres::Transaction<'_>> {
    /// Like [`Transaction::prepare`](postgres::Transaction::prepare).
    pub fn prepare(&mut self, query: &str) -> Result<Statement, Error> {
        self.tx().prepare(query)
    }

    /// Like [`Transaction::prepare_typed`](postgres::Transaction::prepare_typed).
    pub fn prepare_typed(&mut self, query: &str, types: &[Type]) -> Result<Statement, Error> {
        self.tx().prepare_typed(query, types)
    }

    /// Like [`Transaction::execute`](postgres::Transaction::execute).
    pub fn execute<T>(&mut self, query: &T, params: &[&(dyn ToSql + Sync)]) -> Result<u64, Error>
    where
        T: ?Sized + ToStatement,
    {
        self.tx().execute(query, params)
    }

    /// Like [`Transaction::execute_typed`](postgres::Transaction::execute_typed).
    pub fn execute_typed(
        &mut self,
        query: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<u64, Error> {
        self.tx().execute_typed(query, params)
    }

    /// Like [`Transaction::query`](postgres::Transaction::query).
    pub fn query<T>(&mut self, query: &T, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>, Error>
    where
        T: ?Sized + ToStatement,
    {
        self.tx().query(query, params)
    }

    /// Like [`Transaction::query_one`](postgres::Transaction::query_one).
    pub fn query_one<T>(&mut self, query: &T, params: &[&(dyn ToSql + Sync)]) -> Result<Row, Error>
    where
        T: ?Sized + ToStatement,
    {
        self.tx().query_one(query, params)
    }

    /// Like [`Transaction::query_opt`](postgres::Transaction::query_opt).
    pub fn query_opt<T>(
        &mut self,
        query: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, Error>
    where
        T: ?Sized + ToStatement,
    {
        self.tx().query_opt(query, params)
    }

    /// Like [`Transaction::query_raw`](postgres::Transaction::query_raw).
    pub fn query_raw<T, P, I>(&mut self, query: &T, params: I) -> Result<RowIter<'_>, Error>
    where
        T: ?Sized + ToStatement,
        P: BorrowToSql,
        I: IntoIterator<Item = P>,
        I::IntoIter: ExactSizeIterator,
    {
        self.tx().query_raw(query, params)
    }

    /// Like [`Transaction::query_typed`](postgres::Transaction::query_typed).
    pub fn query_typed(
        &mut self,
        query: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, Error> {
        self.tx().query_typed(query, params)
    }

    /// Like [`Transaction::query_typed_one`](postgres::Transaction::query_typed_one).
    pub fn query_typed_one(
        &mut self,
        query: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Row, Error> {
        self.tx().query_typed_one(query, params)
    }

    /// Like [`Transaction::query_typed_opt`](postgres::Transaction::query_typed_opt).
    pub fn query_typed_opt(
        &mut self,
        query: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Option<Row>, Error> {
        self.tx().query_typed_opt(query, params)
    }

    /// Like [`Transaction::query_typed_raw`](postgres::Transaction::query_typed_raw).
    pub fn query_typed_raw<P, I>(&mut self, query: &str, params: I) -> Result<RowIter<'_>, Error>
    where
        P: BorrowToSql,
        I: IntoIterator<Item = (P, Type)>,
    {
        self.tx().query_typed_raw(query, params)
    }

    /// Like [`Transaction::bind`](postgres::Transaction::bind).
    pub fn bind<T>(&mut self, query: &T, params: &[&(dyn ToSql + Sync)]) -> Result<Portal, Error>
    where
        T: ?Sized + ToStatement,
    {
        self.tx().bind(query, params)
    }

    /// Like [`Transaction::query_portal`](postgres::Transaction::query_portal).
    pub fn query_portal(&mut self, portal: &Portal, max_rows: i32) -> Result<Vec<Row>, Error> {
        self.tx().query_portal(portal, max_rows)
    }

    /// Like [`Transaction::query_portal_raw`](postgres::Transaction::query_portal_raw).
    pub fn query_portal_raw(
        &mut self,
        portal: &Portal,
        max_rows: i32,
    ) -> Result<RowIter<'_>, Error> {
        self.tx().query_portal_raw(portal, max_rows)
    }

    /// Like [`Transaction::copy_in`](postgres::Transaction::copy_in).
    pub fn copy_in<T>(&mut self, query: &T) -> Result<CopyInWriter<'_>, Error>
    where
        T: ?Sized + ToStatement,
    {
        self.tx().copy_in(query)
    }

    /// Like [`Transaction::copy_out`](postgres::Transaction::copy_out).
    pub fn copy_out<T>(&mut self, query: &T) -> Result<CopyOutReader<'_>, Error>
    where
        T: ?Sized + ToStatement,
    {
        self.tx().copy_out(query)
    }

    /// Like [`Transaction::simple_query`](postgres::Transaction::simple_query).
    pub fn simple_query(&mut self, query: &str) -> Result<Vec<SimpleQueryMessage>, Error> {
        self.tx().simple_query(query)
    }

    /// Like [`Transaction::batch_execute`](postgres::Transaction::batch_execute).
    pub fn batch_execute(&mut self, query: &str) -> Result<(), Error> {
        self.tx().batch_execute(query)
    }

    /// A savepoint inside the fenced transaction, as
    /// [`Transaction::transaction`](postgres::Transaction::transaction): its commit releases
    /// the savepoint, and its writes commit with the fenced transaction. It cannot be fenced
    /// itself.
    pub fn transaction(&mut self) -> Result<postgres::Transaction<'_>, Error> {
        self.tx().transaction()
    }

    /// A named savepoint inside the fenced transaction, as
    /// [`Transaction::savepoint`](postgres::Transaction::savepoint).
    pub fn savepoint<I>(&mut self, name: I) -> Result<postgres::Transaction<'_>, Error>
    where
        I: Into<String>,
    {
        self.tx().savepoint(name)
    }
}
