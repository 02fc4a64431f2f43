//! The fence on SQLite: a write of the lock row that changes nothing, so the check also takes
//! the database's write lock (whatever `BEGIN` the transaction started with), which keeps
//! every other writer — any takeover of the row — out until the transaction ends.

use super::{sealed::Driver, FenceSql};
use crate::backend::sqlite::NOW;
use crate::error::DatabaseError;

/// The check on `table` (parameters `?1`–`?4`): returns the token while the lease holds.
pub(super) fn statement(table: &str) -> String {
    format!(
        "UPDATE {table} SET FENCING_TOKEN = FENCING_TOKEN WHERE LOCK_KEY = ?1 AND REGION = ?2 \
         AND CLIENT_ID = ?3 AND FENCING_TOKEN = ?4 AND EXPIRED_AFTER >= {NOW} \
         RETURNING FENCING_TOKEN"
    )
}

impl Driver for rusqlite::Transaction<'_> {
    const BACKEND: &'static str = "SQLite";

    fn rollback_on_drop(&mut self) {
        self.set_drop_behavior(rusqlite::DropBehavior::Rollback);
    }

    fn check(&mut self, fence: &FenceSql) -> Result<bool, DatabaseError> {
        let p = &fence.params;
        let mut statement = self.prepare(&fence.sql)?;
        let mut rows = statement.query(rusqlite::params![
            p.lock_key,
            p.region,
            p.client_id,
            p.fencing_token
        ])?;
        let found = rows.next()?.is_some();
        // Run the statement to its end (SQLite's RETURNING has written by the first row).
        while rows.next()?.is_some() {}
        Ok(found)
    }

    fn commit(self) -> Result<(), DatabaseError> {
        Ok(rusqlite::Transaction::commit(self)?)
    }

    fn rollback(self) -> Result<(), DatabaseError> {
        Ok(rusqlite::Transaction::rollback(self)?)
    }
}
