//! The fence on PostgreSQL: `SELECT … FOR SHARE`, whose share lock makes any `UPDATE` or
//! `DELETE` of the row (a takeover) wait for the transaction.

use super::{sealed::Driver, FenceSql};
use crate::error::DatabaseError;

/// The check on `table` (parameters `$1`–`$4`): returns the token while the lease holds.
///
/// The clock is the statement's start on the database (`statement_timestamp()`, UTC): the
/// lease statements read `now()` in transactions of one statement, where the two are the
/// same instant; in the caller's longer transaction `now()` would be its beginning.
pub(super) fn statement(table: &str) -> String {
    format!(
        "SELECT FENCING_TOKEN FROM {table} WHERE LOCK_KEY = $1 AND REGION = $2 \
         AND CLIENT_ID = $3 AND FENCING_TOKEN = $4 \
         AND EXPIRED_AFTER >= (statement_timestamp() AT TIME ZONE 'UTC') FOR SHARE"
    )
}

impl Driver for postgres::Transaction<'_> {
    const BACKEND: &'static str = "PostgreSQL";

    fn check(&mut self, fence: &FenceSql) -> Result<bool, DatabaseError> {
        let p = &fence.params;
        let row = self.query_opt(
            fence.sql.as_str(),
            &[&p.lock_key, &p.region, &p.client_id, &p.fencing_token],
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
