//! Inspecting and administering the lock table from a registry: who holds a key, listing the
//! table's rows, freeing a key whatever holds it, and deleting old rows. These are operator
//! tools (the `leasehold` command's `status`, `list`, `release --force` and `cleanup` run
//! them); a program that only takes locks never needs them.

use crate::backend::{ListedRow, STATE_EXPIRED, STATE_HELD};
use crate::core::Database;
use crate::error::{Error, Result};
use crate::{LockRegistry, RegistryBuilder};
use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The most rows [`Listing::page`] returns at once.
pub const MAX_PAGE_ROWS: usize = 10_000;

/// Rows per query when iterating with [`Listing::rows`].
const ITERATION_PAGE_ROWS: usize = 500;

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
    /// How long the lease has left on the database clock, as the statement that read the row
    /// saw it (`EXPIRED_AFTER` minus the database's now, in one statement: no clock skew and no
    /// second round trip in it).
    pub expires_in: Duration,
}

/// What a row of the lock table says, judged on the database clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockState {
    /// A client holds the lease: `CLIENT_ID` is set and `EXPIRED_AFTER` has not passed.
    Held,
    /// The lease ran out without a release: its holder crashed or lost its connection; the
    /// next acquire takes the row.
    Expired,
    /// Released (`CLIENT_ID` is NULL). Leasehold keeps the row so that fencing tokens keep
    /// counting up from it; `cleanup` deletes old ones.
    Released,
}

impl LockState {
    /// `held`, `expired` or `released`.
    pub fn as_str(self) -> &'static str {
        match self {
            LockState::Held => "held",
            LockState::Expired => "expired",
            LockState::Released => "released",
        }
    }
}

impl std::fmt::Display for LockState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One row of the lock table, as [`Listing`] returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockRow {
    /// The row's `LOCK_KEY`: the hash of the lock's name ([`lock_key_for`](crate::lock_key_for)).
    pub lock_key: String,
    /// The lock's name, when it was among the names given to [`Listing::resolving`].
    pub name: Option<String>,
    /// Held, expired or released, on the database clock at the time of the query.
    pub state: LockState,
    /// The holder's (or, for an expired lease, the last holder's) `CLIENT_ID`; `None` once
    /// released.
    pub client_id: Option<String>,
    /// When the last grant happened (`CREATED_DATE`), on the database clock.
    pub acquired: SystemTime,
    /// When the lease runs out (`EXPIRED_AFTER`), on the database clock; the Unix epoch for a
    /// released row.
    pub expires_at: SystemTime,
    /// The last grant's fencing token (0 for a row written by Spring Integration itself).
    pub fencing_token: u64,
}

impl LockRow {
    /// The name when known, else the lock key: what to show a person.
    pub fn label(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.lock_key)
    }

    /// What part of a semaphore or reader/writer lock the row is, read from its key:
    /// `permit 2`, `read 17` or `write`; `None` for a lock's row.
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let registry = leasehold::LockRegistry::sqlite(dir.path().join("l.db")).create_table(true).build()?;
    /// let permit = registry.semaphore("exports", 1)?.acquire()?;
    /// let rows = registry.listing().page(None, 10)?;
    /// assert_eq!(rows[0].part().as_deref(), Some("permit 0"));
    /// # drop(permit);
    /// # Ok(()) }
    /// ```
    pub fn part(&self) -> Option<String> {
        let (stem, part) = self.lock_key.split_at_checked(32)?;
        if !stem.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let number = |digits: &str| digits.parse::<u32>().ok();
        match (part.get(..2)?, part.get(2..)?) {
            ("@w", _) => Some("write".into()),
            ("@v", claim) => number(claim).map(|claim| format!("write claim {claim}")),
            ("@r", slot) => number(slot).map(|slot| format!("read {slot}")),
            (_, _) if part.starts_with('#') => {
                number(&part[1..]).map(|slot| format!("permit {slot}"))
            }
            _ => None,
        }
    }
}

/// The rows of a registry's table and region, in `LOCK_KEY` order (see
/// [`LockRegistry::listing`]).
///
/// A row's key is a hash of the lock's name (`LOCK_KEY`, as Spring Integration keys it). Where
/// the table has the optional `LOCK_NAME` column (tables made by `create_table(true)` or
/// `leasehold init` have it; `create_table(true)` adds it to older ones), leasehold's grant
/// stores the name there, in the same statement, and every row leasehold wrote shows its name.
/// Spring Integration's statements name their columns and leave it NULL, so its rows — and
/// every row of a table without the column — show a name only when it is given to
/// [`resolving`](Self::resolving); the others show their lock key.
#[derive(Debug, Clone)]
pub struct Listing<'r> {
    registry: &'r LockRegistry,
    names: HashMap<String, String>,
}

impl<'r> Listing<'r> {
    /// Resolves the lock keys of `names` back to the names in the rows this listing returns.
    /// Fails with [`Error::InvalidKey`] for a name no lock can have (empty, or too long).
    pub fn resolving<I, S>(mut self, names: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        for name in names {
            let name = name.as_ref();
            crate::key::validate_key(name)?;
            self.names
                .insert(crate::key::lock_key_for(name), name.to_string());
        }
        Ok(self)
    }

    /// Up to `limit` rows (1..=[`MAX_PAGE_ROWS`]) whose lock key sorts after `after` (byte
    /// order), in that order: `None` for the first page, then the last row's
    /// [`lock_key`](LockRow::lock_key) for the next. A page shorter than `limit` is the last.
    pub fn page(&self, after: Option<&str>, limit: usize) -> Result<Vec<LockRow>> {
        if limit == 0 || limit > MAX_PAGE_ROWS {
            return Err(Error::setting(
                "limit",
                format!(
                    "{limit} rows is outside 1..={MAX_PAGE_ROWS}: ask for a page of that size, \
                     or iterate over every row with Listing::rows"
                ),
            ));
        }
        let rows = self.registry.core.store.list(
            after.unwrap_or(""),
            limit as i64,
            self.registry.admin_deadline(),
        )?;
        Ok(rows.into_iter().map(|row| self.row(row)).collect())
    }

    /// Every row, fetched a page at a time as the iterator goes (each page is one query, so a
    /// row changed meanwhile shows as it was when its page was read).
    pub fn rows(&self) -> Rows<'_, 'r> {
        Rows {
            listing: self,
            page: Vec::new().into_iter(),
            after: None,
            done: false,
        }
    }

    fn row(&self, row: ListedRow) -> LockRow {
        let state = match row.state {
            STATE_HELD => LockState::Held,
            STATE_EXPIRED => LockState::Expired,
            _ => LockState::Released,
        };
        LockRow {
            name: self.names.get(&row.lock_key).cloned().or(row.name),
            lock_key: row.lock_key,
            state,
            client_id: row.client_id,
            acquired: system_time(row.acquired_micros),
            expires_at: system_time(row.expires_micros),
            fencing_token: row.token.max(0) as u64,
        }
    }
}

/// The iterator of [`Listing::rows`]: each item a row, or the error that ended the listing.
#[derive(Debug)]
pub struct Rows<'l, 'r> {
    listing: &'l Listing<'r>,
    page: std::vec::IntoIter<LockRow>,
    after: Option<String>,
    done: bool,
}

impl Iterator for Rows<'_, '_> {
    type Item = Result<LockRow>;

    fn next(&mut self) -> Option<Result<LockRow>> {
        if let Some(row) = self.page.next() {
            return Some(Ok(row));
        }
        if self.done {
            return None;
        }
        match self
            .listing
            .page(self.after.as_deref(), ITERATION_PAGE_ROWS)
        {
            Ok(page) => {
                self.done = page.len() < ITERATION_PAGE_ROWS;
                self.after = page.last().map(|row| row.lock_key.clone());
                self.page = page.into_iter();
                self.page.next().map(Ok)
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
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
        Listing {
            registry: self,
            names: HashMap::new(),
        }
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

impl RegistryBuilder {
    /// The DDL that `create_table(true)` runs for this builder's database and prefix: the lock
    /// table, then its deletion floor (see the crate docs, "Fencing tokens"), as one script for
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
    /// # Ok(()) }
    /// ```
    pub fn table_ddl(&self) -> Result<String> {
        fn both<B: crate::backend::Backend>(table: &str) -> String {
            let table_ddl = crate::backend::ddl_for::<B>(table);
            let floor_ddl = crate::backend::floor_ddl_for::<B>(table);
            let semaphore_ddl = crate::backend::semaphore_ddl_for::<B>(table);
            format!(
                "{}\n\n{}\n\n{}\n",
                table_ddl.trim_end(),
                floor_ddl.trim_end(),
                semaphore_ddl.trim_end()
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
