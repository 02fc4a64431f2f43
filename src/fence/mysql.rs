//! The fence on MySQL and MariaDB: `SELECT … LOCK IN SHARE MODE` (both servers' spelling),
//! a locking read of the latest row whose shared lock makes any `UPDATE` or `DELETE` of the
//! row (a takeover) wait for the transaction.

use super::{sealed::Driver, FenceSql};
use crate::backend::mysql::NOW;
use crate::error::DatabaseError;
use mysql::prelude::Queryable;

/// The check on `table` (four positional `?`): returns the token while the lease holds.
pub(super) fn statement(table: &str) -> String {
    format!(
        "SELECT FENCING_TOKEN FROM {table} WHERE LOCK_KEY = ? AND REGION = ? \
         AND CLIENT_ID = ? AND FENCING_TOKEN = ? AND EXPIRED_AFTER >= {NOW} LOCK IN SHARE MODE"
    )
}

impl Driver for mysql::Transaction<'_> {
    const BACKEND: &'static str = "MySQL";

    fn check(&mut self, fence: &FenceSql) -> Result<bool, DatabaseError> {
        let p = &fence.params;
        let row: Option<i64> = self.exec_first(
            fence.sql.as_str(),
            (
                p.lock_key.as_str(),
                p.region.as_str(),
                p.client_id.as_str(),
                p.fencing_token,
            ),
        )?;
        Ok(row.is_some())
    }

    fn commit(self) -> Result<(), DatabaseError> {
        Ok(mysql::Transaction::commit(self)?)
    }

    fn rollback(self) -> Result<(), DatabaseError> {
        Ok(mysql::Transaction::rollback(self)?)
    }
}
