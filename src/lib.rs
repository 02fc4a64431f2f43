//! Distributed locks and leases kept in a SQL database, for synchronous Rust.
//!
//! A [`LockRegistry`] hands out named [`Lock`]s; locking one returns a [`LockGuard`] that holds
//! a *lease* — a row in the lock table — which a background thread keeps renewing until the
//! guard goes. Other instances (processes, machines) using the same table and key wait until
//! it is released or expires. Threads of one registry queue in-process and pass the lock among
//! themselves without touching the database.
//!
//! ```
//! use leasehold::LockRegistry;
//! use std::time::Duration;
//!
//! # fn main() -> leasehold::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let path = dir.path().join("locks.db");
//! let registry = LockRegistry::sqlite(&path)        // or ::postgres(url), ::mysql(url)
//!     .time_to_live(Duration::from_secs(30))
//!     .create_table(true)
//!     .build()?;
//!
//! let lock = registry.obtain("invoice-run")?;
//! match lock.try_lock_for(Duration::from_secs(2))? {
//!     Some(guard) => {
//!         // Only this thread of all instances gets here. Hand the token (a `u64`, see
//!         // below) to the resource you write to, so it can refuse a stale holder's late
//!         // writes.
//!         let token = guard.fencing_token();
//!         # let _ = token;
//!         guard.unlock()?;                             // Err(LeaseLost) if it had expired
//!     }
//!     None => println!("another instance is on it"),
//! }
//! # Ok(()) }
//! ```
//!
//! Outcomes of contention are values, not errors: `try_lock*` return `Ok(None)` when the lock
//! is held elsewhere and `Err` only when the input is bad or the database fails.
//!
//! The lock table must exist before a registry is built.
//! [`create_table(true)`](RegistryBuilder::create_table) creates what is missing: the lock
//! table, its deletion floor (a table and a trigger, on PostgreSQL with its function, that keep
//! the highest fencing token of deleted rows so that tokens keep rising) and the semaphore
//! table. Without it a missing table is [`Error::TableMissing`]; [`RegistryBuilder::table_ddl`]
//! and `leasehold init --print` give all of that DDL, for a DBA to run.
//!
//! # Which backend
//!
//! | feature | use it when | notes |
//! |---------|-------------|-------|
//! | `sqlite` (default) | the instances run on one host (processes of a batch job, cron runs) | embedded, no server; WAL mode; releases wake waiters of other processes at once (through a small shared file beside the database, Linux) |
//! | `postgres` | instances on several hosts share a PostgreSQL server | releases wake waiters at once (`LISTEN`/`NOTIFY`) |
//! | `mysql` | they share MySQL 8.0+ or MariaDB 10.6+ | releases wake waiters at once (named locks, `GET_LOCK`) |
//!
//! ```toml
//! [dependencies]
//! leasehold = "0.1"                                     # SQLite
//! leasehold = { version = "0.1", default-features = false, features = ["postgres"] }
//! leasehold = { version = "0.1", features = ["postgres", "mysql"] }   # all three
//! ```
//!
//! Enable at least one: a build without any says so. `postgres-tls` and `mysql-tls` add TLS
//! (rustls, no OpenSSL; `sslmode`/`ssl-mode` and certificate paths in the URL). The
//! constructors are [`LockRegistry::sqlite`], `LockRegistry::postgres` and `LockRegistry::mysql`;
//! everything after `build()` is the same on every database. Every setting of
//! [`RegistryBuilder`] names its default.
//!
//! # Locking, waiting, closures
//!
//! - [`Lock::lock`] waits until granted; [`Lock::try_lock`] tries once;
//!   [`Lock::try_lock_for`] waits at most that long. `*_with_ttl` variants take a lease of
//!   another length than the registry's `time_to_live`.
//! - [`Lock::with_lock`] runs a closure under the lock and unlocks after it, reporting a lease
//!   lost meanwhile as [`Error::LeaseLost`].
//! - A guard dropped without [`LockGuard::unlock`] releases too (and logs a failure).
//! - Locks are reentrant per thread, as Java's and Spring's are, so a guard belongs to the
//!   thread that took the lock: it is not `Send`, and moving it into `thread::spawn` fails with
//!   "`*const ()` cannot be sent between threads safely". Lock on the thread that does the
//!   work, or hold the lock on one thread and pass the work (see [`LockGuard`]).
//! - Threads of one registry queue in-process and pass the lock among themselves without a
//!   statement (a local handoff), keeping the grant and its fencing token.
//!
//! ```
//! # fn main() -> leasehold::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let registry = leasehold::LockRegistry::sqlite(dir.path().join("locks.db")).create_table(true).build()?;
//! let lock = registry.obtain("rebuild-index")?;
//! let rows = lock.with_lock(|guard| {
//!     // Long work can watch for a loss and stop at once:
//!     // `select!` over `guard.loss_channel()` and your own channels.
//!     assert!(guard.is_held());
//!     42
//! })?;
//! # assert_eq!(rows, 42);
//! # Ok(()) }
//! ```
//!
//! # When a holder crashes
//!
//! Its lease is no longer renewed and expires on the database's clock after the time-to-live
//! (10 s by default): then, and not before, another instance gets the lock. A holder that is
//! only *paused* (a long GC, `SIGSTOP`, a VM migration) learns when it runs again:
//! [`LockGuard::is_held`] is `false`, the loss channel and the registry's `on_lease_lost` fire,
//! and [`LockGuard::unlock`] returns [`Error::LeaseLost`]. What it did while paused cannot be
//! undone; what it does *after* waking can be refused by the resource, with the fencing token.
//!
//! # Fencing the resource you protect
//!
//! Every grant carries a [`fencing token`](LockGuard::fencing_token) larger than all earlier
//! grants of the key: a `u64`, the grant's time on the database's clock in microseconds since
//! the Unix epoch (16 digits), or the key's previous token + 1 when that is larger. It fits a
//! signed 64-bit column (`BIGINT`), not a 32-bit one (`INT`, `int4`); JavaScript numbers are
//! exact only up to 2⁵³ (about 9 × 10¹⁵), so pass it to JavaScript as a string. Write it with
//! the data, and have the resource refuse a write whose token is older than the last one it
//! accepted — in SQL, one conditional statement:
//!
//! ```sql
//! UPDATE invoices SET status = $1, fencing_token = $2
//!  WHERE id = $3 AND fencing_token <= $2    -- 0 rows: a newer holder wrote since; stop
//! ```
//!
//! A holder that paused past its lease and wakes up after another instance took over carries a
//! smaller token than the new holder's writes, so its late write changes nothing.
//!
//! # What it does not promise
//!
//! A lease cannot stop a holder that pauses past its deadline from acting when it runs again.
//! Data in the lock table's database is protected by fenced writes (below); any other resource
//! only by checking fencing tokens. After a failover to an asynchronous replica, recent grants
//! (and tokens) may be lost: keep the lock table on synchronously replicated storage.
//!
//! # Fenced writes
//!
//! When the data lives in the same database as the lock table, `guard.fence(tx)` checks the
//! lease inside your own transaction (`rusqlite`, `postgres` or `mysql`, re-exported here) and
//! holds the lock row until it ends: the transaction commits only while the lease holds, and no
//! takeover can happen before it ends. See the [`fence`] module.
//!
//! # From async code
//!
//! The calls block. In a tokio service run each locked section — lock, work, unlock — inside
//! `spawn_blocking`: a guard is not `Send` and stays on that thread, and async work under the
//! lock runs there through `Handle::block_on` (`examples/async_service.rs`).
//!
//! # Leader election
//!
//! [`LeaderElection`] keeps one leader among the instances of a group, on the same table: the
//! leader renews its lease, standbys wait (woken by a resignation at once), a leader that
//! cannot renew steps down before its lease can have run out, and every term carries a larger
//! term number (its fencing token).
//!
//! ```
//! # fn main() -> leasehold::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let path = dir.path().join("locks.db");
//! use leasehold::{LeaderElection, LockRegistry};
//! use std::time::Duration;
//!
//! let election = LeaderElection::builder(LockRegistry::sqlite(&path).create_table(true), "nightly-batch")
//!     .time_to_live(Duration::from_secs(10))
//!     .build()?;
//! let leadership = election.acquire()?;        // waits while another instance leads
//! println!("leader for term {}", leadership.term());
//! // ... lead; stop at once if `leadership.loss_channel()` fires ...
//! leadership.resign()?;                         // a standby takes over without waiting
//! # Ok(()) }
//! ```
//!
//! [`LeaderElection::run`] wraps it in a loop with callbacks for elected and lost.
//!
//! # Semaphores
//!
//! [`LockRegistry::semaphore`] gives a [`Semaphore`] of N permits: at most N holders at once
//! across every instance, each [`Permit`] a lease of its own (renewed, fenced, lost and
//! reported alone, like a [`LockGuard`]). Each permit is a row of the lock table that Spring
//! Integration never sees, and the number of permits is recorded per name, so instances that
//! disagree about it get [`Error::PermitsMismatch`].
//!
//! # Reader/writer locks
//!
//! [`LockRegistry::rw_lock`] gives an [`RwLock`]: many readers ([`ReadGuard`], up to
//! [`MAX_READERS`]) or one writer ([`WriteGuard`]) at a time across every instance, each hold a
//! lease of its own. A waiting writer keeps new readers of every instance out, and a write
//! guard's token exceeds every earlier read and write grant of the lock.
//!
//! # The command line
//!
//! The `leasehold` binary (feature `cli`: `cargo install leasehold --locked --features cli,postgres`)
//! runs a command under a lock, as `flock(1)` does on one host, for cron jobs and scripts on
//! several: `leasehold run --database postgres://… --key nightly-report --no-wait -- ./report.sh`.
//! It renews the lease while the command runs, stops the command if the lease is lost, and
//! has `init`, `status`, `list`, `release` and `cleanup` for operators. See the README.
//!
//! # Logging
//!
//! What no call returns is logged through the [`log`](https://docs.rs/log) facade, as
//! warnings or errors with targets `leasehold::…`: each lease lost (also reported to its
//! holder, see above), a background renewal that failed and will be retried, a release on drop
//! that failed, an incomplete deletion floor at `build()`, a clock offset that a leader
//! election corrects, a loss callback that panicked. Install any logger (`env_logger`,
//! `simple_logger`, …) to see them; without one they are dropped. leasehold prints nothing
//! itself.
//!
//! # Compatibility with Spring Integration
//!
//! The table is Spring Integration's `INT_LOCK` with one added column (`FENCING_TOKEN`, with a
//! default so Spring's own inserts still work); `LOCK_KEY` is computed as Spring does
//! ([`lock_key_for`]), and timestamps are UTC. A leasehold registry and a Spring
//! `JdbcLockRegistry` on one table and region exclude each other. Differences: leasehold marks
//! rows free instead of deleting them, and two registries must not share a `CLIENT_ID`.
//!
//! # Design
//!
//! How it is built — layers, threads, the SQL each operation runs, the bound each mechanism
//! gives, and the tests behind each guarantee — is in `DESIGN.md` in the repository.

// The only unsafe code is SQLite's release board (`backend/sqlite/board.rs`: a shared file
// mapping, the futex and the presence lock on it) and MySQL's sockets (`set_socket_timeouts`
// in `backend/mysql/conn.rs` and `shut_down` in `backend/mysql/watchdog.rs`: a borrowed
// descriptor), and SQLite's access(2) check of a file it cannot open (`writable` in
// `backend/sqlite/mod.rs`), each allowing it for itself.
#![deny(unsafe_code)]
#![warn(missing_docs)]
// docs.rs (`--cfg docsrs`) marks what each feature adds.
#![cfg_attr(docsrs, feature(doc_cfg))]
// Without a database the crate has nothing to do: say which features to enable, and only that
// (the rest of the crate, written for at least one backend, would only add noise).
#![cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(unused, unreachable_code)
)]
#[cfg(not(any(feature = "sqlite", feature = "postgres", feature = "mysql")))]
compile_error!(
    "leasehold needs at least one database: enable the feature `sqlite` (the default), \
     `postgres` or `mysql` (e.g. `leasehold = { version = \"0.1\", default-features = false, \
     features = [\"postgres\"] }`, or `cargo build --no-default-features --features postgres`)"
);

/// A named fail point: with the test-only `failpoints` feature, tests configure it through the
/// `fail` crate (pause, panic, sleep) to force a race deterministically; without the feature it
/// compiles to nothing. Names are `module::place`, listed where each is used.
macro_rules! fail_point {
    ($name:literal) => {
        #[cfg(feature = "failpoints")]
        fail::fail_point!($name);
    };
    ($name:literal, $on_return:expr) => {
        #[cfg(feature = "failpoints")]
        fail::fail_point!($name, $on_return);
    };
}

/// The methods a semaphore's permit and a reader/writer lock's guards share with a
/// [`LockGuard`], delegated to its `guard: Option<LockGuard>` field (`None` only once
/// released); `$owner` is the field whose `name` the guard reports.
macro_rules! lease_guard_methods {
    ($owner:ident) => {
        fn lease_guard(&self) -> &crate::LockGuard<H> {
            self.guard
                .as_ref()
                .expect("a guard holds its lease until it goes")
        }

        /// The name it was taken with.
        pub fn name(&self) -> &str {
            &self.$owner.name
        }

        /// `true` while the lease is held: not reported lost and not past its deadline.
        pub fn is_held(&self) -> bool {
            self.lease_guard().is_held()
        }

        /// How long the lease is certainly still held if no renewal succeeds from now on.
        pub fn remaining(&self) -> std::time::Duration {
            self.lease_guard().remaining()
        }

        /// A channel that receives one [`LeaseLost`](crate::LeaseLost) if the lease is lost
        /// (at once if it already is); it disconnects without a message when the hold ends
        /// normally.
        pub fn loss_channel(&self) -> crossbeam_channel::Receiver<crate::LeaseLost> {
            self.lease_guard().loss_channel()
        }

        /// Checks in `tx` that this hold's lease still holds and keeps its row locked until
        /// `tx` ends (see [`LockGuard::fence`](crate::LockGuard::fence) and the
        /// [`fence`](crate::fence) module docs).
        pub fn fence<T: crate::FenceableTransaction>(
            &self,
            tx: T,
        ) -> crate::Result<crate::Fenced<'_, T>> {
            self.lease_guard().fence(tx)
        }

        /// The check of [`fence`](Self::fence) as SQL text and parameters for another driver
        /// (see [`FenceSql`](crate::FenceSql)).
        pub fn fence_sql(&self) -> crate::Result<crate::FenceSql> {
            self.lease_guard().fence_sql()
        }

        /// Renews the lease now with its current time-to-live.
        pub fn renew(&self) -> crate::Result<()> {
            self.lease_guard().renew()
        }

        /// Renews the lease now with a new time-to-live, which later renewals keep (see
        /// [`LockGuard::renew_with_ttl`](crate::LockGuard::renew_with_ttl)).
        pub fn renew_with_ttl(&self, ttl: std::time::Duration) -> crate::Result<()> {
            self.lease_guard().renew_with_ttl(ttl)
        }
    };
}

/// The acquire methods of a semaphore or a reader/writer lock side, on `self.inner`, whose
/// `$inner_fn(Wait, ttl)` does the work (`Wait` being the module's own: `No`, `Until`,
/// `Forever`) and returns a guard for this thread, given to the handle's kind `H` (its
/// `holding`): waiting, one attempt, bounded waits, each with a per-call time-to-live.
macro_rules! acquire_methods {
    ($what:literal, $guard:ident, $inner_fn:ident,
     $wait:ident, $wait_ttl:ident, $try:ident, $try_ttl:ident,
     $try_for:ident, $try_for_ttl:ident, $try_until:ident, $try_until_ttl:ident) => {
        #[doc = concat!("Blocks until ", $what, " is granted, with the registry's default time-to-live.")]
        pub fn $wait(&self) -> crate::Result<$guard<H>> {
            self.$wait_ttl(self.inner.core.settings.time_to_live)
        }

        #[doc = concat!("[`", stringify!($wait), "`](Self::", stringify!($wait), ") with a time-to-live for this lease only.")]
        pub fn $wait_ttl(&self, ttl: std::time::Duration) -> crate::Result<$guard<H>> {
            let guard = self.inner.$inner_fn(Wait::Forever, ttl)?;
            Ok(guard.expect("an unbounded wait ends only with a grant or an error").holding())
        }

        #[doc = concat!("One attempt at ", $what, ": `Ok(None)` when it is not free now (or another thread of this registry is taking it right now).")]
        pub fn $try(&self) -> crate::Result<Option<$guard<H>>> {
            self.$try_ttl(self.inner.core.settings.time_to_live)
        }

        #[doc = concat!("[`", stringify!($try), "`](Self::", stringify!($try), ") with a time-to-live for this lease only.")]
        pub fn $try_ttl(&self, ttl: std::time::Duration) -> crate::Result<Option<$guard<H>>> {
            Ok(self.inner.$inner_fn(Wait::No, ttl)?.map(|guard| guard.holding()))
        }

        #[doc = concat!("Waits at most `timeout` for ", $what, "; `Ok(None)` if it was not granted in that time.")]
        pub fn $try_for(&self, timeout: std::time::Duration) -> crate::Result<Option<$guard<H>>> {
            self.$try_for_ttl(timeout, self.inner.core.settings.time_to_live)
        }

        #[doc = concat!("[`", stringify!($try_for), "`](Self::", stringify!($try_for), ") with a time-to-live for this lease only.")]
        pub fn $try_for_ttl(&self, timeout: std::time::Duration, ttl: std::time::Duration) -> crate::Result<Option<$guard<H>>> {
            match std::time::Instant::now().checked_add(timeout) {
                Some(deadline) => self.$try_until_ttl(deadline, ttl),
                None => self.$wait_ttl(ttl).map(Some),
            }
        }

        #[doc = concat!("Waits until `deadline` for ", $what, "; a deadline in the past makes one attempt.")]
        pub fn $try_until(&self, deadline: std::time::Instant) -> crate::Result<Option<$guard<H>>> {
            self.$try_until_ttl(deadline, self.inner.core.settings.time_to_live)
        }

        #[doc = concat!("[`", stringify!($try_until), "`](Self::", stringify!($try_until), ") with a time-to-live for this lease only.")]
        pub fn $try_until_ttl(&self, deadline: std::time::Instant, ttl: std::time::Duration) -> crate::Result<Option<$guard<H>>> {
            let wait = match deadline <= std::time::Instant::now() {
                true => Wait::No,
                false => Wait::Until(deadline),
            };
            Ok(self.inner.$inner_fn(wait, ttl)?.map(|guard| guard.holding()))
        }
    };
}

mod admin;
mod any_guard;
mod backend;
mod cache;
mod core;
mod error;
pub mod fence;
mod key;
mod leader;
mod lease;
mod lock;
mod meter;
mod registry;
mod rwlock;
mod semaphore;
mod wakeups;

pub use admin::{Holder, Listing, LockRow, LockState, Rows, MAX_PAGE_ROWS};
pub use any_guard::AnyGuard;
#[cfg(feature = "sqlite")]
pub use backend::sqlite::{pause_sqlite_statements, SqlitePause};
pub use backend::{Statements, Statistics};
pub use error::{DatabaseError, Error, LossReason, Result, TlsProblem};
pub use fence::{FenceParams, FenceSql, FenceableTransaction, Fenced};
pub use key::{lock_key_for, MAX_KEY_BYTES};
pub use leader::{
    ClientClock, ClockOffset, LeaderElection, LeaderElectionBuilder, Leadership,
    LeadershipLossReason, LeadershipLost, LeadershipLostCallback,
};
pub use lease::{LeaseLost, LostCallback};
pub use lock::{AnyThread, Holding, Lock, LockGuard, LockSet, LockSetGuard, ThisThread};
pub use rwlock::{ReadGuard, RwLock, RwLockStatus, WriteGuard, MAX_READERS};
pub use semaphore::{Permit, Semaphore, SemaphoreStatus, MAX_PERMITS};

/// The README's Rust snippets, compiled by `cargo test --doc` so that they cannot rot. They use
/// SQLite and PostgreSQL, so they run with both features on (`cargo test --all-features`).
#[cfg(all(doctest, feature = "sqlite", feature = "postgres"))]
#[doc = include_str!("../README.md")]
struct ReadmeSnippets;

/// The driver whose `rusqlite::Transaction` [`LockGuard::fence`] checks a lease in, at the
/// version leasehold uses.
#[cfg(feature = "sqlite")]
pub use rusqlite;

/// The driver whose `postgres::Transaction` [`LockGuard::fence`] checks a lease in, at the
/// version leasehold uses.
#[cfg(feature = "postgres")]
pub use postgres;

/// The driver whose `mysql::Transaction` [`LockGuard::fence`] checks a lease in, at the
/// version leasehold uses.
#[cfg(feature = "mysql")]
pub use mysql;

/// The channel crate behind [`LockGuard::loss_channel`], re-exported so that `select!` over a
/// loss and your own channels needs no dependency of yours:
/// `leasehold::crossbeam_channel::select! { recv(guard.loss_channel()) -> lost => …, … }`.
pub use crossbeam_channel;
pub use registry::{
    client_id_for_host, default_client_id, CustomSql, LockRegistry, RegistryBuilder, Tuning,
    MAX_IDLE_BETWEEN_TRIES, MAX_LINGER, MAX_POOL_SIZE, MAX_PREFIX_CHARS, MAX_REGION_CHARS,
    MAX_TIMEOUT, MAX_TIME_TO_LIVE, MIN_TIME_TO_LIVE,
};
