//! The fence on PostgreSQL: `SELECT … FOR SHARE`, whose share lock makes any `UPDATE` or
//! `DELETE` of the row (a takeover) wait for the transaction.

use super::{sealed::Driver, FenceSql};
use crate::error::DatabaseError;
use postgres::types::Type;

/// The check on `table` (parameters `$1`–`$4`): returns the token while the lease holds.
///
/// The clock is the statement's start on the database (`statement_timestamp()`, UTC): the
/// lease statements read `now()` in transactions of one statement, where the two are the
/// same instant; in the caller's longer transaction `now()` would be its beginning. The casts
/// give the parameters the columns' types whatever a driver declares (sqlx sends `TEXT`), so
/// that the primary key's index finds the row.
pub(super) fn statement(table: &str) -> String {
    format!(
        "SELECT FENCING_TOKEN FROM {table} WHERE LOCK_KEY = CAST($1 AS BPCHAR) \
         AND REGION = CAST($2 AS VARCHAR) AND CLIENT_ID = CAST($3 AS BPCHAR) \
         AND FENCING_TOKEN = CAST($4 AS BIGINT) \
         AND EXPIRED_AFTER >= (statement_timestamp() AT TIME ZONE 'UTC') FOR SHARE"
    )
}

impl Driver for postgres::Transaction<'_> {
    const BACKEND: &'static str = "PostgreSQL";

    /// One round trip: an unnamed statement with the columns' types (so the primary key's
    /// index serves it), which also works behind a transaction pooler.
    fn check(&mut self, fence: &FenceSql) -> Result<bool, DatabaseError> {
        let p = &fence.params;
        let row = self.query_typed_opt(
            fence.sql.as_str(),
            &[
                (&p.lock_key, Type::BPCHAR),
                (&p.region, Type::VARCHAR),
                (&p.client_id, Type::BPCHAR),
                (&p.fencing_token, Type::INT8),
            ],
        )?;
        Ok(row.is_some())
    }

    fn commit(self) -> Result<(), DatabaseError> {
        Ok(postgres::Transaction::commit(self)?)
    }

    fn rollback(self) -> Result<(), DatabaseError> {
        Ok(postgres::Transaction::rollback(self)?)
    }
}
