//! The registry's semaphores and reader/writer locks (the machinery is in `crate::semaphore`
//! and `crate::rwlock`).

use super::LockRegistry;
use crate::error::Result;
#[allow(unused_imports)] // doc links
use crate::{Error, MAX_PERMITS, MAX_READERS};
use crate::{RwLock, RwLockStatus, Semaphore, SemaphoreStatus};

impl LockRegistry {
    /// The counting semaphore `name` with `permits` permits: at most that many holders at once
    /// across every instance using the table and region. Shared with every other user of that
    /// name in this registry.
    ///
    /// The first use of a name in a registry reads (and, the very first time, records) its
    /// number of permits in the semaphore table; an instance that asks for another number gets
    /// [`Error::PermitsMismatch`]. `name` is any key [`obtain`](Self::obtain) accepts; a
    /// semaphore and a lock of the same name are unrelated. `permits` is 1 to [`MAX_PERMITS`].
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let path = dir.path().join("l.db");
    /// let host_a = leasehold::LockRegistry::sqlite(&path).create_table(true).build()?;
    /// let host_b = leasehold::LockRegistry::sqlite(&path).build()?;
    /// let exports = host_a.semaphore("partner-api", 2)?;
    /// let first = exports.acquire()?;
    /// let second = host_b.semaphore("partner-api", 2)?.try_acquire()?.expect("one left");
    /// assert!(exports.try_acquire()?.is_none(), "both permits are taken");
    /// assert_ne!(first.slot(), second.slot());
    /// second.unlock()?;
    /// assert!(exports.try_acquire()?.is_some());
    /// // Disagreeing about the number is an error, not a third permit.
    /// assert!(matches!(
    ///     host_b.semaphore("partner-api", 3),
    ///     Err(leasehold::Error::PermitsMismatch { recorded: 2, .. })
    /// ));
    /// # Ok(()) }
    /// ```
    pub fn semaphore(&self, name: &str, permits: u32) -> Result<Semaphore> {
        crate::semaphore::obtain(&self.core, &self.semaphores, name, permits)
    }

    /// The holders of semaphore `name`'s permits and its recorded number of permits, as the
    /// database records them now; for operators (`leasehold status` shows it). Records
    /// nothing and creates nothing: a table without the semaphore table reads as "no number
    /// recorded". Three statements: whether the semaphore table exists, its row, and one
    /// listing of the permits' rows (they sort together).
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let registry = leasehold::LockRegistry::sqlite(dir.path().join("l.db")).create_table(true).build()?;
    /// let unknown = registry.semaphore_status("exports")?;
    /// assert!(!unknown.exists());
    /// let exports = registry.semaphore("exports", 3)?;
    /// let permit = exports.acquire()?;
    /// let status = registry.semaphore_status("exports")?;
    /// assert_eq!(status.permits, Some(3));
    /// let held = status.held();
    /// assert_eq!(held.len(), 1);
    /// assert_eq!(held[0].client_id.as_deref(), Some(registry.client_id()));
    /// assert_eq!(held[0].fencing_token, permit.fencing_token());
    /// assert_eq!(held[0].part(), Some(format!("permit {}", permit.slot())));
    /// permit.unlock()?;
    /// assert!(registry.semaphore_status("exports")?.held().is_empty());
    /// # Ok(()) }
    /// ```
    pub fn semaphore_status(&self, name: &str) -> Result<SemaphoreStatus> {
        crate::semaphore::status(&self.core, name)
    }

    /// The reader/writer lock `name`: any number of readers (up to [`MAX_READERS`]) or one
    /// writer at a time, across every instance using the table and region. Shared with every
    /// other user of that name in this registry; a lock, a semaphore and a reader/writer lock
    /// of one name are unrelated.
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let path = dir.path().join("l.db");
    /// use std::time::Duration;
    /// let host_a = leasehold::LockRegistry::sqlite(&path).create_table(true).build()?;
    /// let host_b = leasehold::LockRegistry::sqlite(&path).build()?;
    /// let cache = host_a.rw_lock("cache")?;
    /// let reading = cache.read()?;
    /// let also_reading = host_b.rw_lock("cache")?.try_read_for(Duration::from_secs(1))?;
    /// assert!(also_reading.is_some(), "readers share");
    /// assert!(host_b.rw_lock("cache")?.try_write()?.is_none(), "a writer waits for them");
    /// drop((reading, also_reading));
    /// let writing = host_b.rw_lock("cache")?.write()?;
    /// assert!(cache.try_read()?.is_none(), "and keeps readers out");
    /// writing.unlock()?;
    /// # Ok(()) }
    /// ```
    pub fn rw_lock(&self, name: &str) -> Result<RwLock> {
        crate::rwlock::obtain(&self.core, &self.rw_locks, name)
    }

    /// The readers and the writer of reader/writer lock `name`, as the database records them
    /// now; for operators (`leasehold status` shows it). One listing statement (the lock's
    /// rows sort together); it writes nothing.
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let registry = leasehold::LockRegistry::sqlite(dir.path().join("l.db")).create_table(true).build()?;
    /// let cache = registry.rw_lock("cache")?;
    /// let reading = cache.read()?;
    /// let status = registry.rw_lock_status("cache")?;
    /// assert_eq!(status.held_readers().len(), 1);
    /// assert!(status.held_writer().is_none());
    /// drop(reading);
    /// let writing = cache.write()?;
    /// let status = registry.rw_lock_status("cache")?;
    /// assert!(status.held_readers().is_empty());
    /// assert_eq!(status.held_writer().unwrap().client_id.as_deref(), Some(registry.client_id()));
    /// # drop(writing);
    /// # Ok(()) }
    /// ```
    pub fn rw_lock_status(&self, name: &str) -> Result<RwLockStatus> {
        crate::rwlock::status(&self.core, name)
    }
}
