//! The waiting line `{table}_QUEUE` (`sql/<database>_queue.sql`): the instances waiting for a
//! lock, each with a *place* — when it started waiting (`SINCE`) and when the place lapses
//! (`EXPIRED_AFTER`), on the database clock.
//!
//! - An instance takes a place when an acquire of a lock it goes on waiting for was refused,
//!   and refreshes it while it waits ([`QueueStatements::take_place`]: a lapsed place starts
//!   again at the back); it leaves the line when granted, or when it stops waiting
//!   ([`QueueStatements::leave`]). A place that is not refreshed — its instance crashed or
//!   froze — lapses after its time-to-live and counts no more.
//! - The acquire statement grants a free row only when no other instance holds an earlier
//!   live place for it (`SINCE`, then `CLIENT_ID`, break ties). An
//!   instance without a place, a newcomer, comes after every live place. Instances that do not
//!   know the line (Spring Integration) take a free row whenever they try.
//! - `build()` with `create_table(true)` runs the DDL; without the table (not created, or not
//!   readable), or with a replacement acquire statement, waiting instances have no order and
//!   nothing is written to the line.
//!
//! Both statements bind the lease statements' parameters: 1 the lock key, 2 the region, 3 the
//! client id, 4 the place's time-to-live in µs (`take_place`).

use super::schema::rename;
use super::{Backend, Path, SqlStore};
use crate::error::Result;
use std::time::{Duration, Instant};

/// The statements of the waiting line.
#[derive(Debug, Clone)]
pub(crate) struct QueueStatements {
    /// Parameters 1–4. Takes this client's place for the lock, or refreshes it: a live place
    /// keeps its `SINCE`, a lapsed one starts again now; either lives for parameter 4 µs.
    pub take_place: String,
    /// Parameters 1–3. Removes this client's place for the lock, if any.
    pub leave: String,
}

/// The waiting line of lock table `table` (schema-qualified like it).
pub(crate) fn queue_table(table: &str) -> String {
    format!("{table}_QUEUE")
}

/// The shipped DDL of the waiting line with `INT_LOCK` renamed to `table`.
pub(crate) fn queue_ddl_for<B: Backend>(table: &str) -> String {
    rename::<B>(B::QUEUE_DDL, table)
}

impl<B: Backend> SqlStore<B> {
    /// At `build()`: runs the line's DDL with `create_table(true)` (a failure is logged: locks
    /// work without it), then tells whether the line is there to use.
    pub(super) fn open_queue(&self, deadline: Instant) -> Result<bool> {
        let table = queue_table(&self.table.table);
        // A read-only registry never waits for a lock.
        if self.table.read_only {
            return Ok(false);
        }
        if self.table.create_table {
            let ddl = queue_ddl_for::<B>(&self.table.table);
            let created = self.run(
                Path::Main,
                "create the waiting line",
                deadline,
                move |conn| B::execute_batch(conn, &ddl),
            );
            if let Err(e) = created {
                log::warn!(
                    "could not create the waiting line {table} from {}: {e}; instances waiting \
                     for a lock have no order among them",
                    B::QUEUE_DDL_FILE
                );
            }
        }
        let name = table.clone();
        let columns = self.run(
            Path::Main,
            "check the waiting line",
            deadline,
            move |conn| B::columns(conn, &name),
        )?;
        if columns.is_empty() {
            log::info!(
                "no waiting line {table} (run {}): instances waiting for a lock have no order \
                 among them",
                B::QUEUE_DDL_FILE
            );
            return Ok(false);
        }
        if !B::TABLE_PRIVILEGES {
            return Ok(true);
        }
        // Every user of the lock table takes and leaves places: a place for a key no lock
        // has (its LOCK_KEY is no lock key's) shows that this one may.
        let probe = "~leasehold-line-probe";
        let statements = B::queue_statements(&self.table.table);
        let (params, sql) = (self.params(probe, Duration::from_secs(1), 0), statements);
        let used = self.run(
            Path::Main,
            "check the waiting line",
            deadline,
            move |conn| {
                B::update(conn, &sql.take_place, &params.borrowed())?;
                B::update(conn, &sql.leave, &params.borrowed()).map(drop)
            },
        );
        if let Err(e) = used {
            log::warn!(
                "this user may not use the waiting line {table} ({e}): grant it SELECT, INSERT, \
                 UPDATE and DELETE there; until then, instances waiting for a lock have no \
                 order among them"
            );
            return Ok(false);
        }
        Ok(true)
    }

    /// Takes or refreshes this client's place for `lock_key`, for `ttl`.
    pub(super) fn take_place_of(
        &self,
        lock_key: &str,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<()> {
        let Some(queue) = &self.queue else {
            return Ok(());
        };
        let sql = queue.take_place.clone();
        let params = self.params(lock_key, ttl, 0);
        self.run(Path::Main, "take a place in line", deadline, move |conn| {
            B::update(conn, &sql, &params.borrowed()).map(drop)
        })
    }

    /// Leaves the line of `lock_key`.
    pub(super) fn leave_of(&self, lock_key: &str, deadline: Instant) -> Result<()> {
        let Some(queue) = &self.queue else {
            return Ok(());
        };
        let sql = queue.leave.clone();
        let params = self.params(lock_key, Duration::ZERO, 0);
        self.run(Path::Main, "leave the line", deadline, move |conn| {
            B::update(conn, &sql, &params.borrowed()).map(drop)
        })
    }
}
