//! Fenced writes: a holder's writes to the database of its lock table commit only while its
//! lease holds.
//!
//! A lease cannot stop a holder that pauses past its deadline (a long GC, `SIGSTOP`, a VM
//! migration) from acting when it runs again. When the data it protects lives in the same
//! database as the lock table, the holder can close that gap inside its own transaction:
//! [`LockGuard::fence`] (and the same method on [`Permit`](crate::Permit),
//! [`ReadGuard`](crate::ReadGuard), [`WriteGuard`](crate::WriteGuard), [`AnyGuard`] and
//! [`Leadership`]) runs one statement in the caller's open transaction that
//! finds the lock row still naming this holder — `LOCK_KEY`, `REGION`, `CLIENT_ID` and the
//! grant's `FENCING_TOKEN` — and not expired on the database clock, moves its expiry to at
//! least the database's now + the lease's time-to-live (see [The lease while
//! fenced](#the-lease-while-fenced)), and keeps that row locked until the transaction ends:
//!
//! | database | the check | what keeps the row |
//! |----------|-----------|--------------------|
//! | PostgreSQL | `UPDATE … SET EXPIRED_AFTER = GREATEST(…) … RETURNING` | the update's row lock |
//! | MySQL/MariaDB | `UPDATE … SET EXPIRED_AFTER = GREATEST(…)`, then `SELECT … LOCK IN SHARE MODE` | the update's row lock |
//! | SQLite | `UPDATE … SET EXPIRED_AFTER = max(…) … RETURNING` | the database's write lock (one writer at a time) |
//!
//! ```
//! # fn main() -> leasehold::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let path = dir.path().join("app.db");
//! use leasehold::{rusqlite, LockRegistry};
//! let registry = LockRegistry::sqlite(&path).create_table(true).build()?;
//! let mut conn = rusqlite::Connection::open(&path).unwrap();
//! conn.execute_batch("CREATE TABLE ledger (id INTEGER PRIMARY KEY, total INTEGER);
//!                     INSERT INTO ledger VALUES (1, 0)").unwrap();
//!
//! let guard = registry.obtain("ledger")?.lock()?;
//! let tx = conn.transaction().unwrap();
//! let tx = guard.fence(tx)?; // Err(LeaseLost): rolled back, nothing of it commits
//! let total: i64 = tx.query_row("SELECT total FROM ledger WHERE id = 1", [], |r| r.get(0)).unwrap();
//! tx.execute("UPDATE ledger SET total = ?1 WHERE id = 1", [total + 1]).unwrap();
//! tx.commit()?;              // the only way to commit; dropping it rolls back
//! guard.unlock()?;
//! # Ok(()) }
//! ```
//!
//! # What a committed fenced write guarantees
//!
//! A transaction that passes the check and commits **committed while the lock was this
//! holder's**: at the check the row named this grant, and until the transaction ends nobody
//! else can be granted the row — every statement that would give it to someone else waits:
//! leasehold's acquire of another instance, a Spring Integration `JdbcLockRegistry`'s takeover
//! `UPDATE` or `DELETE` on the same table, an operator's `force_release`. So fenced
//! transactions of different holders never overlap, and none commits after a later holder's
//! grant. A holder that paused past its lease and runs again finds the row taken and gets
//! [`Error::LeaseLost`]; its transaction is rolled back and nothing of it commits. A fence on
//! a lease already known to be lost fails at once, without a statement. A refusal found by
//! the statement marks the lease lost, as a renewal that finds another holder does. Writes a
//! holder makes without a fence have none of this.
//!
//! Fence right after beginning the transaction, before its first read: its reads then see
//! every fenced write of earlier holders (their commits precede this grant), and a snapshot
//! (`REPEATABLE READ`) cannot predate them. On SQLite the fence also makes the transaction the
//! file's writer from its start (whatever its `BEGIN`); a deferred transaction that reads
//! first cannot write once any other connection wrote the file since its read — a renewal or
//! an acquire of any key counts — and fails with "database is locked".
//!
//! # Top-level transactions
//!
//! A fence covers one whole top-level transaction, from its check to its commit, and
//! [`Fenced::commit`] is the only way to commit it. Anything less would not be a commit; the
//! fence refuses it with a typed error and rolls it back, or does not compile it:
//!
//! - **Savepoints.** A savepoint's commit only releases it; its writes commit later with the
//!   transaction around it, after the guard may have been let go and handed to the next
//!   holder. rusqlite's `Savepoint` is not a [`FenceableTransaction`] (it does not compile).
//!   The postgres crate gives a savepoint (`Transaction::transaction`,
//!   `Transaction::savepoint`) the type of a transaction; the fence's statement exports the
//!   transaction's snapshot, which PostgreSQL refuses inside a savepoint, and the fence returns
//!   [`Error::InvalidSetting`]. That also refuses a transaction still inside a savepoint: the
//!   postgres crate rolls a savepoint back without releasing it, so fence right after `BEGIN`,
//!   before any savepoint. A `mysql::Transaction` and a `rusqlite::Transaction` are always
//!   top-level: MySQL has no nested transactions, and SQLite's `BEGIN` fails inside another.
//!   Savepoints *inside* a fenced transaction are fine ([`Fenced`] makes them).
//! - **A transaction swapped out.** [`Fenced`] dereferences to the driver's transaction for
//!   shared access only. A `&mut` of it could replace it (`std::mem::replace`) and take the
//!   fenced transaction out of the wrapper, past the guard's borrow; the statements that take
//!   `&mut` are on [`Fenced`] itself instead: the postgres crate's statement methods, mysql's
//!   `Queryable`, rusqlite's savepoints (rusqlite's statements take `&self`).
//! - **A transaction a statement ended.** SQL run in the transaction can still end it:
//!   `COMMIT`, `ROLLBACK`, or on MySQL a statement that commits implicitly (DDL).
//!   [`Fenced::commit`] commits only the transaction the fence checked, still open — on
//!   PostgreSQL the one with the fenced transaction's id, on MySQL and SQLite the one holding
//!   the savepoint `leasehold_fence` the fence set (the end of a transaction removes its
//!   savepoints, as does a `ROLLBACK TO` or `RELEASE` of one set before the fence) — and
//!   otherwise returns [`Error::InvalidSetting`] and rolls back what is open. Statements run
//!   after such an end are outside the fence: on MySQL, where autocommit is off while a
//!   transaction is fenced, they wait in a new transaction that this rollback discards; on
//!   PostgreSQL and SQLite each commits by itself as it runs. End a fenced transaction only
//!   with [`Fenced::commit`] or [`Fenced::rollback`].
//!
//! # Idle fenced transactions
//!
//! A holder that stops inside a fenced transaction (`SIGSTOP`, a VM pause, a thread that
//! blocks) keeps the row locked: its lease runs out (its renewal skips the locked row, and the
//! fence's own extension lasts one time-to-live), yet no other instance can take the key while
//! the transaction is open. On the servers the fence
//! therefore bounds the transaction's idle time — between two of its statements — to the
//! lease's time-to-live, rounded up to whole seconds, or to the session's own bound when that
//! is tighter; the server ends a session idle longer, which rolls its transaction back and
//! frees the row. So a frozen fenced holder blocks its key about one time-to-live, as any
//! frozen holder does; when it runs again, its next statement or its commit fails with
//! [`Error::Database`] and nothing of the transaction commits. A live holder that leaves its
//! fenced transaction idle that long loses it the same way: keep a fenced transaction working
//! until its commit.
//!
//! | database | the bound |
//! |----------|-----------|
//! | PostgreSQL | `SET LOCAL idle_in_transaction_session_timeout`, which ends with the transaction |
//! | MariaDB 10.3 and later | the session's `idle_transaction_timeout`, `idle_write_transaction_timeout` and `idle_readonly_transaction_timeout`, restored when the transaction ends |
//! | MySQL (and MariaDB before 10.3) | the session's `wait_timeout`, restored when the transaction ends: MySQL has no bound of its own for idle transactions, and `wait_timeout` ends a session idle that long, in a transaction or not |
//!
//! SQLite has no server to end a transaction: a process stopped inside a fenced transaction
//! keeps the file's write lock until it runs again or exits (the operating system then
//! releases its locks). Meanwhile every statement that writes the file — acquires, releases,
//! and renewals of every key and registry on it — waits in its busy handler and fails after
//! its `operation_timeout` with [`Error::Timeout`], and the leases of other processes run out.
//! There is no bound: SQLite has one writer.
//!
//! # What it costs
//!
//! One statement (an update of one row, found by its primary key) and that row's lock, held
//! until the transaction ends; on SQLite the write lock that any write transaction takes
//! anyway. Fenced transactions of one lease run one at a time: the fence's statement waits
//! for an open fenced transaction of the same lease on another thread, as any writer of the
//! row does; a thread that fences a second transaction of its lease while its first is open
//! would wait for itself, and is refused with [`Error::InvalidSetting`]. Besides:
//!
//! - PostgreSQL: the fence's statement also exports the transaction's snapshot (a small file
//!   on the server until the transaction ends, which also keeps that snapshot's rows from
//!   vacuum until then), and the commit reads the transaction's id first (one more round
//!   trip).
//! - MySQL: the fence is one round trip (the session's settings, the check and the
//!   savepoint); the commit releases the savepoint, commits and restores the settings in one
//!   round trip, and the driver's own commit, which then finds nothing to commit, is another.
//! - SQLite: a savepoint at the fence and its release at the commit, in process.
//!
//! # The lease while fenced
//!
//! The background renewal cannot renew a row that a transaction holds locked (it skips it, or
//! on SQLite waits for the file), so the fence renews the lease itself: its statement moves
//! the row's expiry to at least the database's now + the lease's time-to-live, inside the
//! transaction (never earlier than it was). While the transaction is open, nobody else can be
//! granted the row, and the holder's deadline is at least the instant the fence's statement
//! was sent + that time-to-live − the drift allowance, and no later than the server ends the
//! transaction if it sits idle (see [Idle fenced transactions](#idle-fenced-transactions); a
//! session's bound tighter than the time-to-live bounds this too). A commit keeps both: the
//! row's new expiry, and the deadline, from which the background renewal goes on. A rollback
//! (`Fenced::rollback`, a drop, a refused or failed commit) leaves the row as it was, and the
//! deadline as the database's last renewal put it: a lease whose deadline passed meanwhile is
//! lost at once.
//!
//! The bound: **a fenced transaction that ends within one time-to-live (less the drift
//! allowance) of its fence never costs its own lease, wherever in the lease it begins** —
//! for locks, permits and leadership. A read or write guard's fence leaves its lease as it is
//! (see [Reader/writer locks and semaphores](#readerwriter-locks-and-semaphores)): keep those
//! fenced transactions inside the guard's [`remaining`](crate::ReadGuard::remaining) time. A
//! longer one has its lease reported lost at that instant (`is_held()` false, the loss
//! channel, `on_lease_lost`) while it still runs, and `unlock` then returns `Err(LeaseLost)`;
//! its commit is still safe: nobody could take the row before it ended.
//!
//! The server may end the transaction without the holder's knowing: an operator's
//! `pg_terminate_backend` or `KILL`, a deadlock that MySQL resolves by rolling the transaction
//! back, a server restart. The row then has its expiry from before the fence again, and
//! another instance may take it once that passes, while the holder still counts on the fence
//! until it learns of the end — its next statement in the transaction fails, and ending the
//! [`Fenced`] gives the deadline back — or until its background renewal, which keeps trying the
//! row every quarter renewal period, renews it or finds it taken. Fenced writes stay safe
//! throughout: the ended transaction commits nothing.
//!
//! # Other instances and other leases
//!
//! - **Other instances** wanting the key find it held while the lease runs, as always. Once
//!   it has expired, their acquire waits for the transaction on the row, as does a Spring
//!   Integration instance's takeover on the same table; an acquire statement that waits longer
//!   than its registry's `operation_timeout` ends that attempt.
//! - **SQLite** has one writer per file: while a fenced transaction runs, every statement that
//!   writes the file waits — acquires, renewals and releases of every key and registry on it.
//!   SQLite queues no writers: each tries again (in its busy handler, then after pauses that
//!   double from 1 ms to 100 ms) until its attempt ends. A renewal attempt ends after half the
//!   renewal period, at most half the lease's slack (time-to-live less renewal period), and
//!   the next begins a quarter period later; a lease is lost only when no attempt gets in
//!   before its deadline. **So fenced transactions cost another lease on the file nothing
//!   while, within that lease's slack, the file is free of writers at least once for a quarter
//!   of its renewal period (and at least 100 ms):** one fenced transaction at a time costs
//!   nothing while it is shorter than the slack less a quarter period (about 5.7 s of a 10 s
//!   lease renewed every third of it, the default); fenced transactions that follow each other
//!   closer than that (of any process on the file) can keep renewals out until leases are
//!   lost. A wait without a deadline (`lock()`) that meets a busy file for its whole
//!   `operation_timeout` polls again, as for a held key; a single try (`try_lock`) and the
//!   first attempt of a bounded wait return [`Error::Timeout`].
//!
//! # Only data in the same database
//!
//! The check protects what the same transaction writes, in the database that holds the lock
//! table (the registry's SQLite file, PostgreSQL database, MySQL server). Writes to anything
//! else — another database, a file, a service — are not covered; use fencing tokens there.
//! A transaction of another database type than the registry's is refused with
//! [`Error::InvalidSetting`]; one on another database of the same type fails the check (the
//! table or the row is missing there).
//!
//! # Threads of one registry (local handoff)
//!
//! A [`Fenced`] transaction borrows its guard, so the guard cannot be unlocked, dropped or
//! handed to another thread while the transaction is open: a local handoff happens only after
//! it committed or rolled back. The next local holder keeps the grant and its token, so its
//! fence checks the same row, and its fenced transactions begin after the previous holder's
//! ended. Between threads of one registry, fenced commits follow the order of the holds; a
//! transaction that the previous holder did *not* fence is not ordered by anything.
//!
//! # Reader/writer locks and semaphores
//!
//! Each guard's fence checks its own row: a permit its slot, a read guard its read slot, a
//! write guard the write row (parameter `FENCING_TOKEN` is that row's token, not the write
//! guard's [`fencing_token`](crate::WriteGuard::fencing_token)). So fenced transactions of two
//! writers never overlap, nor those of two holders of one permit slot. Readers and writers
//! judge each other's rows on the database clock and do not wait for fenced transactions: a
//! writer does not wait for a reader's fenced transaction once that reader's slot has expired,
//! nor a reader for a writer's once the write row has (each sees the other's transaction
//! whole, by the database's own isolation). So a read or write guard's fence does not renew
//! its lease: the other side would not see the new expiry before the commit, and could enter
//! on the old one while the guard still counted itself held. Its lease runs out on the
//! deadline the last renewal gave it, as any lease whose row is locked does.
//!
//! # Lock sets
//!
//! [`LockSetGuard::fence`](crate::LockSetGuard::fence) checks every key of the set in one
//! statement, whose condition names each row (its `LOCK_KEY`, `REGION`, `CLIENT_ID` and
//! token), renews each by the shortest of the keys' time-to-lives and locks them all; the
//! fence holds only when the statement finds every row, and otherwise names a key it did not
//! find. Each key's lease then counts on the fence as a single guard's does.
//!
//! # Other drivers
//!
//! [`LockGuard::fence_sql`] returns the check as SQL text and its parameters for drivers
//! leasehold does not wrap (sqlx, diesel, …): run it inside the transaction, and roll back
//! unless it returns a row (see [`FenceSql`]). It checks and locks the row and does not
//! extend it: leasehold does not see that transaction end, so its lease is not renewed while
//! the transaction holds the row. Keep such a transaction inside the lease's
//! [`remaining`](LockGuard::remaining) time.
//!
//! # Fail point (feature `failpoints`, tests only)
//!
//! `fence::before_check`: a fence whose lease passed this process's own check, about to send
//! its statement (where a holder paused now finds the row taken when it resumes).

use crate::error::{DatabaseError, Error, LossReason, Result};
use crate::lease::Lease;
use crate::{AnyGuard, Leadership, LockGuard};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

/// The check of a lease as SQL text and parameters, for a driver that leasehold does not wrap.
///
/// `sql` returns one row (the token) while the lease holds and no row otherwise; run it in your
/// open transaction and **roll back unless it returns a row** — the lease is lost, and another
/// holder may be writing. It binds four parameters, in this order and each once:
/// `LOCK_KEY` (text), `REGION` (text), `CLIENT_ID` (text), `FENCING_TOKEN` (64-bit integer).
/// Placeholders are the database's own: `$1`–`$4` on PostgreSQL, `?` on MySQL, `?1`–`?4` on
/// SQLite.
///
/// What [`LockGuard::fence`] adds is yours to do with another driver: run the check in a
/// top-level transaction, not a savepoint (sqlx's `begin()` on a transaction makes one, whose
/// commit only releases it), commit it only while it is still that transaction, and bound its
/// idle time (on PostgreSQL `SET LOCAL idle_in_transaction_session_timeout` to the lease's
/// time-to-live) so that a holder stopped inside it frees the key (see the [module
/// docs](crate::fence#top-level-transactions)). This statement does not renew the lease, as
/// the fence's own does (leasehold does not see the transaction end): while the transaction
/// holds the row, the background renewal skips it, so keep the transaction inside the
/// lease's [`remaining`](LockGuard::remaining) time.
///
/// With sqlx on PostgreSQL, for instance:
///
/// ```text
/// let fence = guard.fence_sql()?;
/// let mut tx = pool.begin().await?;
/// let held = sqlx::query(&fence.sql)
///     .bind(&fence.params.lock_key)
///     .bind(&fence.params.region)
///     .bind(&fence.params.client_id)
///     .bind(fence.params.fencing_token)
///     .fetch_optional(&mut *tx)
///     .await?;
/// if held.is_none() {
///     tx.rollback().await?;        // the lease is gone
///     return Err(…);
/// }
/// // … the writes …
/// tx.commit().await?;
/// ```
///
/// The same with any driver, here rusqlite's own API on SQLite:
///
/// ```
/// # fn main() -> leasehold::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let path = dir.path().join("app.db");
/// use leasehold::rusqlite::{self, OptionalExtension};
/// let registry = leasehold::LockRegistry::sqlite(&path).create_table(true).build()?;
/// let guard = registry.obtain("report")?.lock()?;
/// let fence = guard.fence_sql()?;
///
/// let mut conn = rusqlite::Connection::open(&path).unwrap();
/// let tx = conn.transaction().unwrap();
/// let p = &fence.params;
/// let held: Option<i64> = tx
///     .query_row(&fence.sql, rusqlite::params![p.lock_key, p.region, p.client_id, p.fencing_token],
///                |row| row.get(0))
///     .optional()
///     .unwrap();
/// assert_eq!(held, Some(guard.fencing_token() as i64));
/// // … the writes …
/// tx.commit().unwrap();
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FenceSql {
    /// The statement, with this registry's table in it.
    pub sql: String,
    /// Its four parameters.
    pub params: FenceParams,
}

/// The parameters of [`FenceSql::sql`], in the order they bind.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FenceParams {
    /// 1: the row's `LOCK_KEY`.
    pub lock_key: String,
    /// 2: the registry's `REGION`.
    pub region: String,
    /// 3: the registry's `CLIENT_ID`.
    pub client_id: String,
    /// 4: the row's `FENCING_TOKEN` for this grant (for a write guard the write row's, not
    /// [`WriteGuard::fencing_token`](crate::WriteGuard::fencing_token)).
    pub fencing_token: i64,
}

/// A transaction of a database driver that [`LockGuard::fence`] can check the lease in:
/// `rusqlite::Transaction` (feature `sqlite`), `postgres::Transaction` (feature `postgres`),
/// `mysql::Transaction` (feature `mysql`), of the driver versions leasehold re-exports
/// (`leasehold::rusqlite`, `leasehold::postgres`, `leasehold::mysql`).
pub trait FenceableTransaction: sealed::Driver {}

impl<T: sealed::Driver> FenceableTransaction for T {}

pub(crate) mod sealed {
    use std::time::Duration;

    /// What a fence checks, for a driver: the statement, the lock table, and how long the
    /// transaction may sit idle.
    pub struct Check {
        /// The check as given to other drivers (of the first row).
        pub fence: super::FenceSql,
        /// Every row the fence checks, in one statement: one, or a lock set's.
        pub rows: Vec<super::FenceParams>,
        /// The lock table.
        pub table: String,
        /// The longest the fenced transaction may sit idle between two statements.
        pub idle: Duration,
        /// The lease's time-to-live: the fence's statement keeps the row until at least the
        /// database's now + this (zero: as it is).
        pub ttl: Duration,
    }

    /// What a fence's statement found: the rows held by their leases, and extended.
    pub struct Held {
        /// The `LOCK_KEY`s of the rows found (all of [`Check::rows`] when every lease holds).
        pub found: Vec<String>,
        /// The shortest the server lets the transaction sit idle before it ends it (the bound
        /// the fence set, or the session's tighter one); `None` where nothing ends it.
        pub idle: Option<Duration>,
    }

    /// What the fence needs of a driver's transaction; not nameable outside the crate.
    pub trait Driver: Sized {
        /// The backend name of the registries it fits (`Backend::NAME`).
        const BACKEND: &'static str;
        /// What a fence keeps of the transaction: how to tell it at the commit, and the session
        /// settings to restore at its end. The default: nothing yet.
        type Mark: Default;
        /// Makes dropping the transaction roll it back (rusqlite's can commit on drop).
        fn rollback_on_drop(&mut self) {}
        /// Bounds the transaction's idle time, runs the check of every row in one statement —
        /// which also moves each row's expiry to at least the database's now + `check.ttl` —
        /// and marks the transaction (in `mark`, also when it fails later); `Some` with the rows
        /// found when the statement ran. A transaction the fence cannot cover is refused with
        /// `Error::InvalidSetting`.
        fn check(&mut self, check: &Check, mark: &mut Self::Mark) -> crate::Result<Option<Held>>;
        /// Commits, if this is still the transaction `mark` names; otherwise rolls back and
        /// refuses with `Error::InvalidSetting`. Restores the session either way.
        fn commit(self, mark: Self::Mark) -> crate::Result<()>;
        /// Rolls back and restores the session.
        fn rollback(self, mark: Self::Mark) -> crate::Result<()>;
    }
}

/// A transaction in which the lease was checked and its row is locked until the end.
///
/// The work goes through it: it dereferences to the driver's transaction (shared access:
/// rusqlite's statements, the mysql transaction's counters), and has the statements that take
/// `&mut` itself — the postgres crate's statement methods, mysql's `Queryable`, savepoints
/// inside it. [`commit`](Self::commit) is the only way to commit it, and dropping it rolls
/// back (see [Top-level transactions](crate::fence#top-level-transactions)).
///
/// It borrows the guard: the lock stays held until the transaction has ended, so this does
/// not compile:
///
/// ```compile_fail
/// # fn main() -> leasehold::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let path = dir.path().join("app.db");
/// # let registry = leasehold::LockRegistry::sqlite(&path).create_table(true).build()?;
/// # let mut conn = leasehold::rusqlite::Connection::open(&path).unwrap();
/// let guard = registry.obtain("ledger")?.lock()?;
/// let tx = guard.fence(conn.transaction().unwrap())?;
/// guard.unlock()?; // error: `guard` is borrowed by the open fenced transaction
/// tx.commit()?;
/// # Ok(()) }
/// ```
///
/// Nor does taking the fenced transaction out, which would leave the guard free while the
/// transaction and its lock go on:
///
/// ```compile_fail
/// # fn main() -> leasehold::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let path = dir.path().join("app.db");
/// # let registry = leasehold::LockRegistry::sqlite(&path).create_table(true).build()?;
/// # let mut conn = leasehold::rusqlite::Connection::open(&path).unwrap();
/// # let mut other = leasehold::rusqlite::Connection::open(&path).unwrap();
/// let guard = registry.obtain("ledger")?.lock()?;
/// let mut tx = guard.fence(conn.transaction().unwrap())?;
/// let taken = std::mem::replace(&mut *tx, other.transaction().unwrap()); // error: no `&mut`
/// # drop((tx, taken));
/// # Ok(()) }
/// ```
///
/// A savepoint is not a transaction the fence takes (see [Top-level
/// transactions](crate::fence#top-level-transactions)); rusqlite's does not compile:
///
/// ```compile_fail
/// # fn main() -> leasehold::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let path = dir.path().join("app.db");
/// # let registry = leasehold::LockRegistry::sqlite(&path).create_table(true).build()?;
/// # let mut conn = leasehold::rusqlite::Connection::open(&path).unwrap();
/// let guard = registry.obtain("ledger")?.lock()?;
/// let mut outer = conn.transaction().unwrap();
/// let tx = guard.fence(outer.savepoint().unwrap())?; // error: not a FenceableTransaction
/// # drop(tx);
/// # Ok(()) }
/// ```
#[must_use = "dropping a fenced transaction rolls it back"]
pub struct Fenced<'g, T: FenceableTransaction> {
    /// The transaction and its mark, until it ends.
    open: Option<(T, T::Mark)>,
    /// The leases and the number each gave this transaction, told when it ends (see
    /// [`Lease::fence_opened`]).
    leases: Vec<(Arc<Lease>, u64)>,
    _guard: PhantomData<&'g ()>,
}

impl<T: FenceableTransaction> Fenced<'_, T> {
    /// Commits the transaction: its writes took effect while no other holder of the lock could
    /// commit a fenced transaction (see the module docs).
    ///
    /// `Err(InvalidSetting)`, with what was open rolled back, when the transaction is no longer
    /// the one the fence checked: a statement inside it ended it (see
    /// [Top-level transactions](crate::fence#top-level-transactions)). `Err(Database)` for a
    /// driver error, among them a server that ended the transaction because it sat idle longer
    /// than its bound (see [Idle fenced transactions](crate::fence#idle-fenced-transactions));
    /// whether a commit whose answer was lost took effect is the database's to say, as for any
    /// commit.
    pub fn commit(mut self) -> Result<()> {
        let (tx, mark) = self.open.take().expect("a fenced transaction ends once");
        let committed = tx.commit(mark);
        self.ended(committed.is_ok());
        committed
    }

    /// Rolls the transaction back.
    pub fn rollback(mut self) -> Result<()> {
        let (tx, mark) = self.open.take().expect("a fenced transaction ends once");
        let rolled_back = tx.rollback(mark);
        self.ended(false);
        rolled_back
    }

    /// Tells the lease that the transaction ended, `committed` or not.
    fn ended(&mut self, committed: bool) {
        for (lease, id) in self.leases.drain(..) {
            lease.fence_ended(id, committed);
        }
    }

    /// The open transaction, for the methods of each driver that take `&mut`.
    fn tx(&mut self) -> &mut T {
        &mut self.open.as_mut().expect("open until commit or rollback").0
    }
}

/// Shared access to the driver's transaction. There is no `DerefMut`: a `&mut` of the
/// transaction could replace it (`std::mem::replace`) and take the fenced one out of the
/// wrapper, past the guard's borrow. The statements that need `&mut` are on `Fenced` itself
/// (PostgreSQL: the driver's statement methods; MySQL: `Queryable`).
impl<T: FenceableTransaction> std::ops::Deref for Fenced<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.open.as_ref().expect("open until commit or rollback").0
    }
}

impl<T: FenceableTransaction> Drop for Fenced<'_, T> {
    fn drop(&mut self) {
        if let Some((tx, mark)) = self.open.take() {
            if let Err(e) = tx.rollback(mark) {
                log::warn!("rolling back a dropped fenced transaction: {e}");
            }
        }
        self.ended(false);
    }
}

impl<T: FenceableTransaction> std::fmt::Debug for Fenced<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fenced")
            .field("backend", &T::BACKEND)
            .field("open", &self.open.is_some())
            .finish()
    }
}

/// `Error::Database` for a driver error of a fenced transaction.
fn driver_error(operation: &'static str, source: impl Into<DatabaseError>) -> Error {
    Error::Database {
        operation,
        hint: "the database refused the fenced transaction, or ended it (it sat idle longer \
               than the lease's time-to-live, or the connection broke); nothing of it commits. \
               Check that it runs on the registry's database, is fenced before its first \
               statement and keeps working until its commit, then run it again"
            .into(),
        source: source.into(),
    }
}

/// The refusal of a transaction that ended since, or before, the fence.
fn ended() -> Error {
    Error::setting(
        "fence",
        "the fenced transaction ended before `Fenced::commit`: a statement inside it committed \
         or rolled it back (`COMMIT`, `ROLLBACK`, or on MySQL a statement that commits \
         implicitly, such as DDL). What was open is rolled back and nothing more commits \
         through the fence; end a fenced transaction only with `Fenced::commit` or \
         `Fenced::rollback`, and begin it again to retry",
    )
}

/// The longest a fenced transaction may sit idle on a server: the lease's time-to-live,
/// rounded up to whole seconds (MySQL's unit).
fn idle_bound(ttl: Duration) -> Duration {
    let seconds = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    Duration::from_secs(seconds.max(1))
}

/// The condition of a fence's statement on `rows` rows: for each, its four columns
/// (`LOCK_KEY`, `REGION`, `CLIENT_ID`, `FENCING_TOKEN`) equal to `value(row, column)`, and the
/// rows joined by `OR`.
fn any_row(rows: usize, value: impl Fn(usize, usize) -> String) -> String {
    const COLUMNS: [&str; 4] = ["LOCK_KEY", "REGION", "CLIENT_ID", "FENCING_TOKEN"];
    let rows: Vec<String> = (0..rows)
        .map(|row| {
            let columns: Vec<String> = COLUMNS
                .iter()
                .enumerate()
                .map(|(column, name)| format!("{name} = {}", value(row, column)))
                .collect();
            format!("({})", columns.join(" AND "))
        })
        .collect();
    rows.join(" OR ")
}

/// The check's statement for `backend`'s `table`.
fn statement(backend: &str, table: &str) -> String {
    match backend {
        #[cfg(feature = "sqlite")]
        "SQLite" => sqlite::statement(table),
        #[cfg(feature = "postgres")]
        "PostgreSQL" => postgres::statement(table),
        #[cfg(feature = "mysql")]
        "MySQL" => mysql::statement(table),
        other => unreachable!("a registry on {other}, which is not compiled in"),
    }
}

/// Whether a fence of `lock_key`'s row renews its lease (see [The lease while
/// fenced](crate::fence#the-lease-while-fenced)): every row but a reader/writer lock's. A
/// takeover of any row must write it, and waits for the fenced transaction; but readers and
/// writers also judge each other's rows by reading them, without waiting for their locks (a
/// writer lists the read slots, a reader reads the write row — see [`crate::rwlock`]), so an
/// expiry that a fenced transaction moves on would come too late for the other side: it
/// would have entered on the expiry it read. Those rows' keys are the 32 hexadecimal digits
/// of the lock's UUID followed by `@`.
fn renews(lock_key: &str) -> bool {
    !lock_key.split_at_checked(32).is_some_and(|(stem, part)| {
        stem.bytes().all(|b| b.is_ascii_hexdigit()) && part.starts_with('@')
    })
}

/// The check of `lease`, or why there is none: the lease is lost (known here, without a
/// statement), or its registry is gone.
fn fence_sql(lease: &Lease) -> Result<(sealed::Check, &'static str)> {
    if let Some(reason) = lease.check() {
        return Err(lost(lease, reason));
    }
    let store = lease.store().ok_or_else(|| Error::LeaseLost {
        key: lease.key.to_string(),
        reason: LossReason::Expired(Some("its registry was dropped".into())),
    })?;
    let table = store.table_settings();
    let backend = store.backend_name();
    let fence = FenceSql {
        sql: statement(backend, &table.table),
        params: FenceParams {
            lock_key: lease.lock_key.to_string(),
            region: table.region.clone(),
            client_id: table.client_id.clone(),
            fencing_token: lease.token,
        },
    };
    // The rows of a reader/writer lock are judged by reading them (see `renews`): their
    // fence leaves the row's expiry, and the lease, as they are.
    let ttl = if renews(&lease.lock_key) {
        lease.ttl()
    } else {
        Duration::ZERO
    };
    let check = sealed::Check {
        rows: vec![fence.params.clone()],
        fence,
        table: table.table.clone(),
        idle: idle_bound(ttl),
        ttl,
    };
    Ok((check, backend))
}

fn lost(lease: &Lease, reason: LossReason) -> Error {
    Error::LeaseLost {
        key: lease.key.to_string(),
        reason,
    }
}

/// Checks `lease` in `tx`: the transaction, fenced, or an error with `tx` rolled back.
fn fence<'g, T: FenceableTransaction>(lease: &Arc<Lease>, tx: T) -> Result<Fenced<'g, T>> {
    fence_all(std::slice::from_ref(lease), tx)
}

/// Checks every one of `leases` (one registry's) in `tx`, in one statement: the transaction,
/// fenced, or an error with `tx` rolled back. Each row is extended by the shortest of their
/// time-to-lives, which each lease then counts on.
fn fence_all<'g, T: FenceableTransaction>(leases: &[Arc<Lease>], tx: T) -> Result<Fenced<'g, T>> {
    // From here on, every way out rolls `tx` back (the wrapper's drop) unless it is returned.
    let mut tx = tx;
    tx.rollback_on_drop();
    let mut fenced = Fenced {
        open: Some((tx, T::Mark::default())),
        leases: Vec::new(),
        _guard: PhantomData,
    };
    let mut checks = leases
        .iter()
        .map(|lease| fence_sql(lease))
        .collect::<Result<Vec<_>>>()?;
    let (mut check, backend) = checks.remove(0);
    for (other, _) in checks {
        check.ttl = check.ttl.min(other.ttl);
        check.idle = check.idle.min(other.idle);
        check.rows.extend(other.rows);
    }
    if backend != T::BACKEND {
        return Err(Error::setting(
            "fence",
            format!(
                "the lock is kept in {backend} and the transaction is on {}: pass a \
                 transaction on the registry's database",
                T::BACKEND
            ),
        ));
    }
    if leases.iter().any(|lease| lease.fenced_here()) {
        return Err(Error::setting(
            "fence",
            "this thread has a fenced transaction of this lease open, which holds the lock row \
             until it ends: a second one would wait for it, that is for this thread, forever. \
             Do the work in the open fenced transaction, or fence after it ends",
        ));
    }
    fail_point!("fence::before_check");
    let (tx, mark) = fenced.open.as_mut().expect("open");
    let sent_at = Instant::now();
    let held = tx.check(&check, mark)?;
    let missing = leases.iter().find(|lease| {
        !held.as_ref().is_some_and(|held| {
            held.found
                .iter()
                .any(|key| key.trim_end() == &*lease.lock_key)
        })
    });
    if let Some(lease) = missing {
        return Err(lost(lease, lease.found_not_owner()));
    }
    let idle = held.and_then(|held| held.idle);
    for lease in leases {
        let id = lease.fence_opened(sent_at, check.ttl, idle);
        fenced.leases.push((Arc::clone(lease), id));
    }
    Ok(fenced)
}

impl<H: crate::Holding> LockGuard<H> {
    /// Checks in `tx`, an open transaction on the registry's database, that this guard's lease
    /// still holds, and keeps its row locked against any takeover until `tx` ends (see the
    /// [`fence`](crate::fence) module docs). Returns the transaction wrapped so that only
    /// [`Fenced::commit`] commits it.
    ///
    /// The transaction must be a top-level one, fenced before its first statement; the server
    /// ends it if it sits idle longer than the lease's time-to-live (see [Top-level
    /// transactions](crate::fence#top-level-transactions) and [Idle fenced
    /// transactions](crate::fence#idle-fenced-transactions)).
    ///
    /// `Err(LeaseLost)` when the lease is lost, at once if this process knows it already;
    /// `Err(InvalidSetting)` for a transaction on another type of database, a savepoint, a
    /// transaction that had ended, or a second fenced transaction of this lease that the
    /// calling thread opens while its first is open; `Err(Database)` for a driver error. On
    /// every error `tx` is rolled back.
    pub fn fence<T: FenceableTransaction>(&self, tx: T) -> Result<Fenced<'_, T>> {
        fence(self.lease(), tx)
    }

    /// The same check as [`fence`](Self::fence), as SQL text and parameters for another driver
    /// (see [`FenceSql`]). `Err(LeaseLost)` when the lease is known to be lost.
    pub fn fence_sql(&self) -> Result<FenceSql> {
        fence_sql(self.lease()).map(|(check, _)| check.fence)
    }
}

impl<H: crate::Holding> crate::LockSetGuard<H> {
    /// [`LockGuard::fence`] for every key of the set at once: one statement in `tx` checks
    /// that each key's lease still holds, renews each (by the shortest of their time-to-lives)
    /// and keeps every row locked against any takeover until `tx` ends. `Err(LeaseLost)` names
    /// a key whose lease is lost; other errors as for [`LockGuard::fence`]. On every error `tx`
    /// is rolled back.
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let path = dir.path().join("app.db");
    /// # let registry = leasehold::LockRegistry::sqlite(&path).create_table(true).build()?;
    /// # let mut conn = leasehold::rusqlite::Connection::open(&path).unwrap();
    /// # conn.execute_batch("CREATE TABLE cursors (bank TEXT PRIMARY KEY, at INTEGER)").unwrap();
    /// let banks = registry.lock_set(["bank-a", "bank-b"])?.lock()?;
    /// let tx = banks.fence(conn.transaction().unwrap())?; // both rows, one statement
    /// tx.execute("INSERT INTO cursors VALUES ('bank-a', 1), ('bank-b', 1)", []).unwrap();
    /// tx.commit()?;
    /// banks.unlock()?;
    /// # Ok(()) }
    /// ```
    pub fn fence<T: FenceableTransaction>(&self, tx: T) -> Result<Fenced<'_, T>> {
        let leases: Vec<Arc<Lease>> = self
            .guards()
            .iter()
            .map(|guard| Arc::clone(guard.lease()))
            .collect();
        fence_all(&leases, tx)
    }
}

impl AnyGuard {
    /// [`LockGuard::fence`] for the guard inside: checks its own row (see the module docs).
    pub fn fence<T: FenceableTransaction>(&self, tx: T) -> Result<Fenced<'_, T>> {
        match self {
            AnyGuard::Lock(guard) => guard.fence(tx),
            AnyGuard::Permit(guard) => guard.fence(tx),
            AnyGuard::Read(guard) => guard.fence(tx),
            AnyGuard::Write(guard) => guard.fence(tx),
        }
    }

    /// [`LockGuard::fence_sql`] for the guard inside.
    pub fn fence_sql(&self) -> Result<FenceSql> {
        match self {
            AnyGuard::Lock(guard) => guard.fence_sql(),
            AnyGuard::Permit(guard) => guard.fence_sql(),
            AnyGuard::Read(guard) => guard.fence_sql(),
            AnyGuard::Write(guard) => guard.fence_sql(),
        }
    }
}

impl Leadership {
    /// [`LockGuard::fence`] for the leader: checks in `tx` that this term still holds and keeps
    /// the group's row locked until `tx` ends, so no other instance becomes leader meanwhile.
    /// `Err(LeaseLost)` at once when this instance is no longer leader (see
    /// [`is_leader`](Self::is_leader)).
    pub fn fence<T: FenceableTransaction>(&self, tx: T) -> Result<Fenced<'_, T>> {
        let lease = self.leading()?;
        fence(&lease, tx)
    }

    /// [`LockGuard::fence_sql`] for the leader.
    pub fn fence_sql(&self) -> Result<FenceSql> {
        let lease = self.leading()?;
        fence_sql(&lease).map(|(check, _)| check.fence)
    }

    /// The term's lease, while this instance leads.
    fn leading(&self) -> Result<Arc<Lease>> {
        let lease = self.lease();
        if !self.is_leader() {
            return Err(lost(
                &lease,
                lease.loss().unwrap_or_else(|| {
                    LossReason::Expired(Some(
                        "the leader stepped down: no renewal succeeded in time".into(),
                    ))
                }),
            ));
        }
        Ok(lease)
    }
}

#[cfg(test)]
mod tests {
    use super::{idle_bound, renews, statement};
    use std::time::Duration;

    #[test]
    fn a_fence_renews_every_lease_but_a_reader_writer_locks() {
        let stem = "0123456789abcdef0123456789ABCDEF";
        assert!(renews(&crate::lock_key_for("ledger")));
        assert!(renews(&format!("{stem}#03")));
        assert!(!renews(&format!("{stem}@r07")));
        assert!(!renews(&format!("{stem}@w00")));
        assert!(renews("short"));
    }

    #[test]
    fn the_idle_bound_is_the_time_to_live_rounded_up_to_whole_seconds() {
        let ms = Duration::from_millis;
        assert_eq!(idle_bound(ms(10)), ms(1000));
        assert_eq!(idle_bound(ms(500)), ms(1000));
        assert_eq!(idle_bound(ms(2000)), ms(2000));
        assert_eq!(idle_bound(ms(2001)), ms(3000));
        assert_eq!(
            idle_bound(Duration::from_secs(7 * 86_400)),
            ms(7 * 86_400_000)
        );
    }

    #[test]
    fn every_statement_binds_four_parameters_and_locks_the_row() {
        #[cfg(feature = "sqlite")]
        {
            let sql = statement("SQLite", "APP_LOCK");
            assert!(sql.contains("UPDATE APP_LOCK") && sql.contains("?4") && !sql.contains("?5"));
        }
        #[cfg(feature = "postgres")]
        {
            let sql = statement("PostgreSQL", "APP_LOCK");
            assert!(sql.ends_with("FOR SHARE") && sql.contains("$4") && !sql.contains("$5"));
        }
        #[cfg(feature = "mysql")]
        {
            let sql = statement("MySQL", "APP_LOCK");
            assert!(sql.ends_with("LOCK IN SHARE MODE") && sql.matches('?').count() == 4);
        }
    }
}
