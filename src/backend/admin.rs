//! The administration statements — who holds a key, listing the rows, freeing a key whatever
//! holds it, deleting old rows — and the release that keeps the row held for a while (`unlock_keeping_for`).
//!
//! Each backend writes them in its SQL ([`Backend::admin_statements`]); they bind the same
//! numbered parameters as the lease statements (see [`Statements`](super::Statements)), with
//! parameter 4 carrying a duration in microseconds where one is needed. They run on the main
//! pool with the same deadline and retries as the lease statements, and are not replaceable.

use super::{Backend, Path, SqlStore};
use crate::error::Result;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The administration statements of one table.
#[derive(Debug, Clone)]
pub(crate) struct AdminStatements {
    /// Parameters 1–2. One row — `CLIENT_ID`, `CREATED_DATE` and `EXPIRED_AFTER` in µs since
    /// the Unix epoch (UTC), `FENCING_TOKEN`, the database clock in µs — when the row is held on the database clock
    /// (`CLIENT_ID` set, not expired); no row otherwise.
    pub holder: String,
    /// Parameters 1, 2 and 5. The region's rows whose `LOCK_KEY` sorts after parameter 1
    /// (byte order), in that order, at most parameter 5 of them: `LOCK_KEY`, `CLIENT_ID`
    /// (NULL when released), `CREATED_DATE` and `EXPIRED_AFTER` in µs since the Unix epoch,
    /// `FENCING_TOKEN`, the state on the database clock (see [`ListedRow::state`]), and
    /// `LOCK_NAME` (NULL where the table has no such column).
    pub list: String,
    /// Parameters 1–2. Frees a held row whatever its holder, as release does (`CLIENT_ID`
    /// NULL, `EXPIRED_AFTER` in 1970, the token kept); one affected row means a holder was
    /// removed. On PostgreSQL it also notifies, as release does.
    pub force_release: String,
    /// Parameters 2 and 4. Deletes the region's rows whose `EXPIRED_AFTER` and `CREATED_DATE`
    /// are both more than parameter 4 µs before the database clock: expired rows that long
    /// ago, and released rows last granted that long ago (a release records no time).
    pub delete_released_and_expired: String,
    /// Parameters 1–5, as release. Keeps the row held by this client until `CREATED_DATE` +
    /// parameter 4 µs when that is later than the database clock, releases it as release
    /// does otherwise; zero affected rows means the lease had already been lost. Either way
    /// it raises `FENCING_TOKEN` by one, so that a renewal of the lease still in flight, or one
    /// that timed out and runs late, no longer matches the row (renewals match client *and*
    /// token) and cannot cut the kept time short; the next grant's token exceeds it as usual.
    pub release_keeping: String,
}

/// A held row, as [`AdminStatements::holder`] returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HolderRow {
    pub client_id: String,
    pub acquired_micros: i64,
    pub expires_micros: i64,
    pub token: i64,
    /// The database clock when the statement ran, in µs since the Unix epoch.
    pub now_micros: i64,
}

/// A row as [`AdminStatements::list`] returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ListedRow {
    pub lock_key: String,
    pub client_id: Option<String>,
    pub acquired_micros: i64,
    pub expires_micros: i64,
    pub token: i64,
    /// [`STATE_RELEASED`], [`STATE_HELD`] or [`STATE_EXPIRED`].
    pub state: i64,
    /// `LOCK_NAME`: the name leasehold's grant stored; `None` for Spring's rows, and on a
    /// table without the column.
    pub name: Option<String>,
}

/// `CLIENT_ID` is NULL: released (or never taken by leasehold).
pub(crate) const STATE_RELEASED: i64 = 0;
/// `CLIENT_ID` set and `EXPIRED_AFTER` not before the database clock.
pub(crate) const STATE_HELD: i64 = 1;
/// `CLIENT_ID` set and `EXPIRED_AFTER` before the database clock.
pub(crate) const STATE_EXPIRED: i64 = 2;

/// The state column of [`AdminStatements::list`], the same on every database given its
/// clock expression.
pub(crate) fn state_sql(now: &str) -> String {
    format!(
        "CASE WHEN CLIENT_ID IS NULL THEN {STATE_RELEASED} WHEN EXPIRED_AFTER >= {now} \
         THEN {STATE_HELD} ELSE {STATE_EXPIRED} END"
    )
}

impl<B: Backend> SqlStore<B> {
    fn admin(&self) -> Arc<AdminStatements> {
        Arc::new(B::admin_statements(&self.table.table, self.named))
    }

    pub(super) fn admin_holder(
        &self,
        lock_key: &str,
        deadline: Instant,
    ) -> Result<Option<HolderRow>> {
        let params = self.params(lock_key, Duration::ZERO, 0);
        let admin = self.admin();
        self.run(Path::Main, "read the holder", deadline, move |conn| {
            B::holder(conn, &admin.holder, &params.borrowed())
        })
    }

    pub(super) fn admin_list(
        &self,
        after: &str,
        limit: i64,
        deadline: Instant,
    ) -> Result<Vec<ListedRow>> {
        // Parameter 5 ("fencing token") carries the page size.
        let params = self.params(after, Duration::ZERO, limit);
        let admin = self.admin();
        self.run(Path::Main, "list the rows", deadline, move |conn| {
            B::rows(conn, &admin.list, &params.borrowed())
        })
    }

    pub(super) fn admin_force_release(&self, lock_key: &str, deadline: Instant) -> Result<bool> {
        let params = self.params(lock_key, Duration::ZERO, 0);
        let admin = self.admin();
        let released = self.run(Path::Main, "force the release", deadline, move |conn| {
            Ok(B::update(conn, &admin.force_release, &params.borrowed())? > 0)
        })?;
        if released {
            B::release_done(&self.manager, &self.table, lock_key, Some(true), true);
        }
        Ok(released)
    }

    pub(super) fn admin_delete(&self, older_than: Duration, deadline: Instant) -> Result<u64> {
        // Parameter 4 ("time-to-live") carries the age.
        let params = self.params("", older_than, 0);
        let admin = self.admin();
        self.run(
            Path::Main,
            "delete released and expired rows",
            deadline,
            move |conn| B::update(conn, &admin.delete_released_and_expired, &params.borrowed()),
        )
    }

    pub(super) fn admin_release_keeping(
        &self,
        lock_key: &str,
        token: i64,
        keep: Duration,
        deadline: Instant,
    ) -> Result<bool> {
        let params = self.params(lock_key, keep, token);
        let (admin, counters) = (self.admin(), Arc::clone(&self.counters));
        let released = self.run(Path::Main, "release", deadline, move |conn| {
            counters.releases.fetch_add(1, Ordering::Relaxed);
            Ok(B::update(conn, &admin.release_keeping, &params.borrowed())? > 0)
        });
        // The row stays held until the keep runs out, so nobody is to be woken now; but the
        // lease ends here, so MySQL lets its named lock go.
        let outcome = released.as_ref().ok().copied();
        B::release_done(&self.manager, &self.table, lock_key, outcome, false);
        released
    }
}
