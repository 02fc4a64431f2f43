//! Inspecting and administering the lock table from a registry: who holds a key, listing the
//! table's rows, freeing a key whatever holds it, and deleting old rows. These are operator
//! tools (the `leasehold` command's `status`, `list`, `release --force` and `cleanup` run
//! them); a program that only takes locks never needs them.

use crate::backend::{ListedRow, STATE_EXPIRED, STATE_HELD};
use crate::core::Core;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The most rows [`Listing::page`] returns at once.
pub const MAX_PAGE_ROWS: usize = 10_000;

/// Rows per query when iterating with [`Listing::rows`].
const ITERATION_PAGE_ROWS: usize = 500;

/// Who holds a key, as the database records it (see [`LockRegistry::holder`](crate::LockRegistry::holder)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The holder's `CLIENT_ID` (a registry's [`client_id`](crate::LockRegistry::client_id), or a
    /// Spring Integration client's).
    pub client_id: String,
    /// When the holder was granted the lock (`CREATED_DATE`), on the database clock.
    pub acquired: SystemTime,
    /// When the lease runs out unless renewed (`EXPIRED_AFTER`), on the database clock.
    /// Compare it with [`LockRegistry::database_time`](crate::LockRegistry::database_time), not with this host's clock.
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
/// [`LockRegistry::listing`](crate::LockRegistry::listing)).
///
/// A row's key is a hash of the lock's name (`LOCK_KEY`, as Spring Integration keys it). Where
/// the table has the optional `LOCK_NAME` column (tables made by `create_table(true)` or
/// `leasehold init` have it; `create_table(true)` adds it to older ones), leasehold's grant
/// stores the name there, in the same statement, and every row leasehold wrote shows its name.
/// Spring Integration's statements name their columns and leave it NULL, so its rows — and
/// every row of a table without the column — show a name only when it is given to
/// [`resolving`](Self::resolving); the others show their lock key.
#[derive(Clone)]
pub struct Listing<'r> {
    core: &'r Core,
    names: HashMap<String, String>,
}

impl<'r> Listing<'r> {
    /// A listing of the table and region of `core`, showing lock keys until names resolve them.
    pub(crate) fn new(core: &'r Core) -> Self {
        Listing {
            core,
            names: HashMap::new(),
        }
    }

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
        let rows = self
            .core
            .store
            .list(after.unwrap_or(""), limit as i64, deadline(self.core))?;
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

impl std::fmt::Debug for Listing<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listing")
            .field("table", &self.core.table)
            .field("region", &self.core.region)
            .field("names", &self.names)
            .finish()
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
pub(crate) fn system_time(micros: i64) -> SystemTime {
    if micros >= 0 {
        UNIX_EPOCH + Duration::from_micros(micros as u64)
    } else {
        UNIX_EPOCH - Duration::from_micros(micros.unsigned_abs())
    }
}

/// The deadline of an administrative statement: `operation_timeout` from now.
pub(crate) fn deadline(core: &Core) -> Instant {
    Instant::now() + core.settings.operation_timeout
}
