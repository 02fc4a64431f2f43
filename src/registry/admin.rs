//! The registry's operator tools (the machinery is in `crate::admin`): who holds a key,
//! listing the table, freeing a key whatever holds it, deleting old rows, and the DDL.

use super::{LockRegistry, RegistryBuilder};
use crate::admin::{deadline, system_time, Holder, Listing, LockRow, LockState};
use crate::core::Database;
use crate::error::Result;
use std::time::Duration;

impl LockRegistry {
    /// Who holds `key` in this registry's table and region right now, judged on the database
    /// clock; `None` when it is free (no row, a released row, or an expired lease). Any
    /// holder counts — another instance, this registry, or a Spring Integration client.
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let registry = leasehold::LockRegistry::sqlite(dir.path().join("l.db")).create_table(true).build()?;
    /// assert!(registry.holder("nightly-export")?.is_none());
    /// let guard = registry.obtain("nightly-export")?.lock()?;
    /// let holder = registry.holder("nightly-export")?.expect("held");
    /// assert_eq!(holder.client_id, registry.client_id());
    /// assert_eq!(holder.fencing_token, guard.fencing_token());
    /// assert!(holder.expires_at > holder.acquired);
    /// guard.unlock()?;
    /// assert!(registry.holder("nightly-export")?.is_none());
    /// # Ok(()) }
    /// ```
    pub fn holder(&self, key: &str) -> Result<Option<Holder>> {
        crate::key::validate_key(key)?;
        let lock_key = crate::key::lock_key_for(key);
        let row = self.core.store.holder(&lock_key, deadline(&self.core))?;
        Ok(row.map(|row| Holder {
            client_id: row.client_id,
            acquired: system_time(row.acquired_micros),
            expires_at: system_time(row.expires_micros),
            fencing_token: row.token.max(0) as u64,
            expires_in: Duration::from_micros(
                row.expires_micros.saturating_sub(row.now_micros).max(0) as u64,
            ),
        }))
    }

    /// The rows of this registry's table and region — held, expired and released — for
    /// operators (Spring Integration's `getAllLocks`, with the states). Rows leasehold wrote
    /// carry their names where the table has the `LOCK_NAME` column; other rows (Spring's, or
    /// a table without the column) show a name only when it is given to
    /// [`Listing::resolving`], and their lock key otherwise (see [`Listing`]).
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let registry = leasehold::LockRegistry::sqlite(dir.path().join("l.db")).create_table(true).build()?;
    /// use leasehold::LockState;
    /// let held = registry.obtain("nightly-export")?.lock()?;
    /// registry.obtain("hourly-sync")?.lock()?.unlock()?;
    /// registry.obtain("weekly")?.lock()?.unlock()?;
    ///
    /// let listing = registry.listing();
    /// let mut rows = listing.rows().collect::<leasehold::Result<Vec<_>>>()?;
    /// rows.sort_by(|a, b| a.label().cmp(b.label()));
    /// let shown: Vec<(&str, LockState)> = rows.iter().map(|r| (r.label(), r.state)).collect();
    /// assert_eq!(shown, [
    ///     ("hourly-sync", LockState::Released),
    ///     ("nightly-export", LockState::Held),
    ///     ("weekly", LockState::Released),
    /// ]);
    /// assert_eq!(rows[1].fencing_token, held.fencing_token());
    ///
    /// // The same rows a page at a time, after the last lock key of the page before.
    /// let first = listing.page(None, 2)?;
    /// let rest = listing.page(Some(&first[1].lock_key), 2)?;
    /// assert_eq!((first.len(), rest.len()), (2, 1));
    /// # Ok(()) }
    /// ```
    pub fn listing(&self) -> Listing<'_> {
        Listing::new(&self.core)
    }

    /// The rows this registry holds now, as the database records them: held on the database
    /// clock and carrying this registry's [`client_id`](LockRegistry::client_id) — "what does
    /// this node hold". Rows of keys this registry has handles for carry their names. One
    /// listing of the region's rows (a page of up to 500 rows per query).
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let path = dir.path().join("l.db");
    /// let node = leasehold::LockRegistry::sqlite(&path).create_table(true).build()?;
    /// let other = leasehold::LockRegistry::sqlite(&path).build()?;
    /// let mine = node.obtain("nightly-export")?.lock()?;
    /// let theirs = other.obtain("hourly-sync")?.lock()?;
    /// let held = node.held_by_this_registry()?;
    /// assert_eq!(held.len(), 1);
    /// assert_eq!(held[0].name.as_deref(), Some("nightly-export"));
    /// assert_eq!(held[0].fencing_token, mine.fencing_token());
    /// # drop((mine, theirs));
    /// # Ok(()) }
    /// ```
    pub fn held_by_this_registry(&self) -> Result<Vec<LockRow>> {
        let names = self.cache.lock().names();
        let listing = self.listing().resolving(names)?;
        let mut held = Vec::new();
        for row in listing.rows() {
            let row = row?;
            if row.state == LockState::Held && row.client_id.as_deref() == Some(self.client_id()) {
                held.push(row);
            }
        }
        Ok(held)
    }

    /// Frees `key` whatever holds it, as a release by the holder would (the row stays, marked
    /// free, with its fencing token, so later grants still get larger tokens). Returns whether
    /// a holder was removed (`false`: the key was free already).
    ///
    /// For an operator clearing a stuck lock. The holder is not told at once: its next renewal
    /// (within a third of its time-to-live) finds the row gone and reports the loss — its
    /// [`loss_channel`](crate::LockGuard::loss_channel) and `on_lease_lost` fire and
    /// [`unlock`](crate::LockGuard::unlock) returns [`Error::LeaseLost`](crate::Error::LeaseLost).
    /// Until then it may still act, which is what fencing tokens are for.
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let path = dir.path().join("l.db");
    /// let worker = leasehold::LockRegistry::sqlite(&path).create_table(true).build()?;
    /// let operator = leasehold::LockRegistry::sqlite(&path).build()?;
    /// let guard = worker.obtain("stuck-job")?.lock()?;
    /// assert!(operator.force_release("stuck-job")?);
    /// assert!(operator.holder("stuck-job")?.is_none());
    /// assert!(matches!(guard.renew(), Err(leasehold::Error::LeaseLost { .. })));
    /// # Ok(()) }
    /// ```
    pub fn force_release(&self, key: &str) -> Result<bool> {
        crate::key::validate_key(key)?;
        let lock_key = crate::key::lock_key_for(key);
        self.core
            .store
            .force_release(&lock_key, deadline(&self.core))
    }

    /// Deletes the rows of this registry's region that are released or expired for longer than
    /// `older_than` on the database clock, and returns how many went (Spring Integration's
    /// `deleteExpired`). Released rows record no release time, so a released row counts from
    /// its last grant: it goes when it was last granted more than `older_than` ago. Held rows
    /// are never deleted.
    ///
    /// Leasehold keeps released rows (one small row per key ever locked) so that the next
    /// grant's fencing token counts up from the row; run this now and then where keys are
    /// many and short-lived. Tokens keep increasing across a deletion through the deletion
    /// floor (see the crate docs, "Fencing tokens"), which `create_table(true)` installs; a
    /// table without it logged a warning at `build()`, and a token after the deletion is then
    /// only as high as the database clock.
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let registry = leasehold::LockRegistry::sqlite(dir.path().join("l.db")).create_table(true).build()?;
    /// use std::time::Duration;
    /// let lock = registry.obtain("hourly-sync")?;
    /// let first = lock.lock()?;
    /// let token = first.fencing_token();
    /// first.unlock()?;
    /// std::thread::sleep(Duration::from_millis(5));
    /// assert_eq!(registry.delete_released_and_expired(Duration::ZERO)?, 1);
    /// assert!(lock.lock()?.fencing_token() > token);
    /// # Ok(()) }
    /// ```
    pub fn delete_released_and_expired(&self, older_than: Duration) -> Result<u64> {
        self.core
            .store
            .delete_released_and_expired(older_than, deadline(&self.core))
    }
}

impl RegistryBuilder {
    /// The DDL that `create_table(true)` runs for this builder's database and prefix: the lock
    /// table, its deletion floor (see the crate docs, "Fencing tokens"), the semaphore table
    /// and the waiting line (instances waiting for a lock, oldest first), as one script for
    /// the database's own client (`sqlite3`, `psql`, `mysql`). For databases where the user
    /// that takes locks may not create tables: a DBA runs it once. Nothing is connected to.
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// let ddl = leasehold::LockRegistry::sqlite("/var/lib/jobs/locks.db")
    ///     .prefix("JOBS_")
    ///     .table_ddl()?;
    /// assert!(ddl.contains("CREATE TABLE IF NOT EXISTS JOBS_LOCK ("));
    /// assert!(ddl.contains("CREATE TRIGGER IF NOT EXISTS JOBS_LOCK_FLOOR"));
    /// assert!(ddl.contains("CREATE TABLE IF NOT EXISTS JOBS_LOCK_QUEUE ("));
    /// # Ok(()) }
    /// ```
    pub fn table_ddl(&self) -> Result<String> {
        fn both<B: crate::backend::Backend>(table: &str) -> String {
            let table_ddl = crate::backend::ddl_for::<B>(table);
            let floor_ddl = crate::backend::floor_ddl_for::<B>(table);
            let semaphore_ddl = crate::backend::semaphore_ddl_for::<B>(table);
            let queue_ddl = crate::backend::queue_ddl_for::<B>(table);
            format!(
                "{}\n\n{}\n\n{}\n\n{}\n",
                table_ddl.trim_end(),
                floor_ddl.trim_end(),
                semaphore_ddl.trim_end(),
                queue_ddl.trim_end()
            )
        }
        let table = crate::core::validate_prefix(&self.prefix)? + "LOCK";
        Ok(match &self.database {
            #[cfg(feature = "sqlite")]
            Database::Sqlite(_) => both::<crate::backend::sqlite::Sqlite>(&table),
            #[cfg(feature = "postgres")]
            Database::Postgres(_) => both::<crate::backend::postgres::Postgres>(&table),
            #[cfg(feature = "mysql")]
            Database::Mysql(_) => both::<crate::backend::mysql::Mysql>(&table),
            // No database compiled in: lib.rs's compile_error! names the features to enable.
            #[cfg(not(any(feature = "sqlite", feature = "postgres", feature = "mysql")))]
            _ => unreachable!(),
        })
    }
}
