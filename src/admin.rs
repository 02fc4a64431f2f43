//! Inspecting and administering the lock table from a registry: who holds a key, freeing a
//! key whatever holds it, and deleting old rows. These are operator tools (the `leasehold`
//! command's `status`, `release --force` and `cleanup` run them); a program that only takes
//! locks never needs them.

use crate::error::Result;
use crate::registry::LockRegistry;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Who holds a key, as the database records it (see [`LockRegistry::holder`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The holder's `CLIENT_ID` (a registry's [`client_id`](LockRegistry::client_id), or a
    /// Spring Integration client's).
    pub client_id: String,
    /// When the holder was granted the lock (`CREATED_DATE`), on the database clock.
    pub acquired: SystemTime,
    /// When the lease runs out unless renewed (`EXPIRED_AFTER`), on the database clock.
    /// Compare it with [`LockRegistry::database_time`], not with this host's clock.
    pub expires_at: SystemTime,
    /// The grant's fencing token (0 for a row written by Spring Integration itself).
    pub fencing_token: u64,
}

/// µs since the Unix epoch as an instant of the system clock.
fn system_time(micros: i64) -> SystemTime {
    if micros >= 0 {
        UNIX_EPOCH + Duration::from_micros(micros as u64)
    } else {
        UNIX_EPOCH - Duration::from_micros(micros.unsigned_abs())
    }
}

impl LockRegistry {
    fn admin_deadline(&self) -> Instant {
        Instant::now() + self.core.settings.operation_timeout
    }

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
        let row = self.core.store.holder(&lock_key, self.admin_deadline())?;
        Ok(row.map(|row| Holder {
            client_id: row.client_id,
            acquired: system_time(row.acquired_micros),
            expires_at: system_time(row.expires_micros),
            fencing_token: row.token.max(0) as u64,
        }))
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
            .force_release(&lock_key, self.admin_deadline())
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
            .delete_released_and_expired(older_than, self.admin_deadline())
    }
}
