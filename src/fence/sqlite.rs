//! The fence on SQLite: a write of the lock row, so the check also takes the database's write
//! lock (whatever `BEGIN` the transaction started with), which keeps every other writer — any
//! takeover of the row — out until the transaction ends. The fence's own statement also moves
//! the row's expiry to at least now + the lease's time-to-live (parameter `?1`, µs); the
//! statement given to other drivers changes nothing.
//!
//! A `rusqlite::Transaction` is always a top-level transaction (its `BEGIN` fails inside
//! another); a savepoint is a `rusqlite::Savepoint`, which the fence does not take. The fence
//! marks the transaction with a savepoint of its own ([`MARK`]), which any end of the
//! transaction removes: the commit releases it first and refuses when it is gone.
//!
//! SQLite has no server to end an idle transaction: the idle bound does not apply here, and
//! the transaction holds the row until its process ends it (or exits).

use super::sealed::{Check, Driver, Held};
use super::{driver_error, ended, Fenced};
use crate::backend::sqlite::NOW;

/// The savepoint that marks a fenced transaction.
const MARK: &str = "leasehold_fence";

/// The conditions on the row (parameters `?1`–`?4`): this grant, not expired.
const CONDITIONS: &str = "LOCK_KEY = ?1 AND REGION = ?2 AND CLIENT_ID = ?3 AND FENCING_TOKEN = ?4";

/// The check on `table` (parameters `?1`–`?4`): returns the token while the lease holds.
pub(super) fn statement(table: &str) -> String {
    format!(
        "UPDATE {table} SET FENCING_TOKEN = FENCING_TOKEN WHERE {CONDITIONS} \
         AND EXPIRED_AFTER >= {NOW} RETURNING FENCING_TOKEN"
    )
}

/// The fence's own statement for `rows` rows: the check of each (parameters `?2`–`?5` for
/// the first, `?6`–`?9` for the second, …), which also keeps each row until at least now +
/// `?1` µs (it never shortens it), and returns the `LOCK_KEY` of each row found.
fn fence_statement(table: &str, rows: usize) -> String {
    let rows = super::any_row(rows, |row, column| format!("?{}", 2 + 4 * row + column));
    format!(
        "UPDATE {table} SET EXPIRED_AFTER = max(EXPIRED_AFTER, \
         strftime('%Y-%m-%d %H:%M:%f', julianday('now') + ?1 / 86400000000.0)) \
         WHERE ({rows}) AND EXPIRED_AFTER >= {NOW} RETURNING LOCK_KEY"
    )
}

impl Driver for rusqlite::Transaction<'_> {
    const BACKEND: &'static str = "SQLite";
    /// Whether the fence set its savepoint.
    type Mark = bool;

    fn rollback_on_drop(&mut self) {
        self.set_drop_behavior(rusqlite::DropBehavior::Rollback);
    }

    fn check(&mut self, check: &Check, mark: &mut bool) -> crate::Result<Option<Held>> {
        let ttl_micros = i64::try_from(check.ttl.as_micros()).unwrap_or(i64::MAX);
        let found = (|| {
            let mut statement = self.prepare(&fence_statement(&check.table, check.rows.len()))?;
            let mut params: Vec<&dyn rusqlite::ToSql> = vec![&ttl_micros];
            for p in &check.rows {
                params.extend([
                    &p.lock_key as &dyn rusqlite::ToSql,
                    &p.region,
                    &p.client_id,
                    &p.fencing_token,
                ]);
            }
            let mut rows = statement.query(params.as_slice())?;
            let mut found = Vec::new();
            // Every row (SQLite's RETURNING has written them all by the first).
            while let Some(row) = rows.next()? {
                found.push(row.get(0)?);
            }
            Ok::<_, rusqlite::Error>(found)
        })()
        .map_err(|e| driver_error("fence", e))?;
        if found.len() < check.rows.len() {
            return Ok(Some(Held { found, idle: None }));
        }
        // A transaction that a statement ended before the fence: the check ran on its own.
        if self.is_autocommit() {
            return Err(ended());
        }
        self.execute_batch(&format!("SAVEPOINT {MARK}"))
            .map_err(|e| driver_error("fence", e))?;
        *mark = true;
        // No server ends the transaction: it holds the row until it ends.
        Ok(Some(Held { found, idle: None }))
    }

    fn commit(self, mark: bool) -> crate::Result<()> {
        if mark {
            let released = if self.is_autocommit() {
                Err(ended())
            } else {
                self.execute_batch(&format!("RELEASE {MARK}")).map_err(|e| {
                    // The transaction was ended, and begun again.
                    if e.to_string().contains("no such savepoint") {
                        ended()
                    } else {
                        driver_error("fenced commit", e)
                    }
                })
            };
            if let Err(e) = released {
                if let Err(rollback) = rusqlite::Transaction::rollback(self) {
                    log::debug!("rolling back a refused fenced transaction: {rollback}");
                }
                return Err(e);
            }
        }
        rusqlite::Transaction::commit(self).map_err(|e| driver_error("fenced commit", e))
    }

    fn rollback(self, _mark: bool) -> crate::Result<()> {
        rusqlite::Transaction::rollback(self).map_err(|e| driver_error("fenced rollback", e))
    }
}

/// Savepoints inside the fenced transaction (rusqlite's other methods take `&self`, through
/// `Deref`).
impl Fenced<'_, rusqlite::Transaction<'_>> {
    /// A savepoint inside the fenced transaction, as
    /// [`Transaction::savepoint`](rusqlite::Transaction::savepoint): its commit releases the
    /// savepoint, and its writes commit with the fenced transaction.
    pub fn savepoint(&mut self) -> rusqlite::Result<rusqlite::Savepoint<'_>> {
        self.tx().savepoint()
    }

    /// A named savepoint inside the fenced transaction, as
    /// [`Transaction::savepoint_with_name`](rusqlite::Transaction::savepoint_with_name).
    pub fn savepoint_with_name<T: Into<String>>(
        &mut self,
        name: T,
    ) -> rusqlite::Result<rusqlite::Savepoint<'_>> {
        self.tx().savepoint_with_name(name)
    }
}
