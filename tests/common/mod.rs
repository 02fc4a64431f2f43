//! Test fixtures shared by the suites: one real database per backend, one table per test.
//!
//! SQLite tests get a fresh file in a temporary directory. Server tests get their own table
//! prefix on the server named by `LEASEHOLD_POSTGRES_URL` / `LEASEHOLD_MYSQL_URL` (defaults:
//! the local test servers), so tests run in parallel without colliding. A server that does not
//! answer makes the test fail under `CI=true` and skip with a printed reason otherwise.

#![allow(dead_code)]

pub mod cpu_hogs;
pub mod gates;
pub mod mariadb;
pub mod raw;
pub mod row_lock;
pub mod warnings;

use leasehold::{LockRegistry, RegistryBuilder};
use std::sync::atomic::{AtomicU32, Ordering};

#[cfg(all(feature = "postgres", unix))]
pub mod pgbouncer;

/// The databases the suites run against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Db {
    Sqlite,
    Postgres,
    Mysql,
}

pub const POSTGRES_DEFAULT: &str = "postgres://postgres@127.0.0.1:5432/test";
pub const MYSQL_DEFAULT: &str = "mysql://root@127.0.0.1:3306/test";

pub fn postgres_url() -> String {
    std::env::var("LEASEHOLD_POSTGRES_URL").unwrap_or_else(|_| POSTGRES_DEFAULT.into())
}

pub fn mysql_url() -> String {
    std::env::var("LEASEHOLD_MYSQL_URL").unwrap_or_else(|_| MYSQL_DEFAULT.into())
}

/// One test's database: registries built from it share one table.
pub struct Fixture {
    pub db: Db,
    pub prefix: String,
    dir: tempfile::TempDir,
    /// Where its PostgreSQL registries connect instead of [`postgres_url`], if elsewhere.
    pub route: Option<Route>,
}

/// A way to the PostgreSQL server other than [`postgres_url`] (`tests/pgbouncer.rs` sends the
/// conformance suite through PgBouncer): the registries' URL, the release listener's, and
/// what keeps the way open while a fixture uses it.
#[derive(Clone)]
pub struct Route {
    pub url: String,
    pub listener_url: String,
    pub keep: std::sync::Arc<dyn std::any::Any + Send + Sync>,
}

thread_local! {
    /// The [`Route`] of the next fixture this thread makes, which takes it (none: direct).
    pub static ROUTE: std::cell::RefCell<Option<Route>> = const { std::cell::RefCell::new(None) };
}

static NEXT: AtomicU32 = AtomicU32::new(0);

impl Fixture {
    /// A fresh table for `test` on `db`, or `None` (after printing why) when the server is not
    /// reachable outside CI. Panics under `CI=true` when it is not.
    pub fn new(db: Db, test: &str) -> Option<Fixture> {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tag: String = test
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(20)
            .collect();
        let prefix = format!("t{}_{}_{n}_", std::process::id(), tag);
        let fixture = Fixture {
            db,
            prefix,
            dir: tempfile::tempdir().expect("temporary directory"),
            route: ROUTE.with(|route| route.borrow_mut().take()),
        };
        match fixture.builder().create_table(true).build() {
            Ok(_) => Some(fixture),
            Err(e) => {
                if db == Db::Sqlite {
                    panic!("{db:?} is required for {test} but failed: {e}");
                }
                skip_or_fail(&format!("{test} on {db:?}: no server ({e})"));
                None
            }
        }
    }

    /// A builder on this fixture's table with test-friendly timings.
    pub fn builder(&self) -> RegistryBuilder {
        let builder = match self.db {
            #[cfg(feature = "sqlite")]
            Db::Sqlite => LockRegistry::sqlite(self.dir.path().join("locks.db")),
            #[cfg(feature = "postgres")]
            Db::Postgres => match &self.route {
                Some(route) => LockRegistry::postgres(route.url.clone())
                    .listener_url(route.listener_url.clone()),
                None => LockRegistry::postgres(postgres_url()),
            },
            #[cfg(feature = "mysql")]
            Db::Mysql => LockRegistry::mysql(mysql_url()),
            #[allow(unreachable_patterns)]
            other => panic!("{other:?} support is not compiled in"),
        };
        builder
            .prefix(self.prefix.clone())
            .idle_between_tries(std::time::Duration::from_millis(20))
            // Generous: on a busy machine the first connection and the table check can take
            // seconds. A server that is down refuses at once; tests of a server that does not
            // answer set their own.
            .connect_timeout(std::time::Duration::from_secs(15))
    }

    /// A registry on this fixture's table (another "instance").
    pub fn registry(&self) -> LockRegistry {
        self.builder().build().expect("registry on the test table")
    }

    /// The SQLite file of this fixture.
    pub fn sqlite_path(&self) -> std::path::PathBuf {
        self.dir.path().join("locks.db")
    }

    pub fn table(&self) -> String {
        format!("{}LOCK", self.prefix)
    }
}

/// Whether the suite runs under `CI=true`, where a missing server or setup fails a test.
pub fn on_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The suite's one way to skip: a test that finds a server or setup missing calls it and then
/// returns. Under `CI=true` it fails the test instead; otherwise it prints why (see [`skipped`]).
pub fn skip_or_fail(why: &str) {
    assert!(!on_ci(), "required under CI=true: {why}");
    skipped(&format!("{why}; set CI=true to fail instead"));
}

/// Says that a test skipped, where `cargo test` shows it even for a test that passes: straight
/// to the process's stderr, which the test harness does not capture (it captures `eprintln!`).
pub fn skipped(why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED {why}");
}

impl Drop for Fixture {
    /// Drops the test's tables (and the deletion floor's trigger function) from the server, so
    /// that test runs leave nothing behind; SQLite's go with the temporary directory.
    fn drop(&mut self) {
        self.drop_tables(&self.prefix);
    }
}

impl Fixture {
    /// Drops table `{prefix}LOCK` and its deletion floor from the server (for a test that made
    /// tables of another prefix); SQLite's go with the temporary directory.
    pub fn drop_tables(&self, prefix: &str) {
        #[cfg(any(feature = "postgres", feature = "mysql"))]
        let table = format!("{prefix}LOCK");
        #[cfg(not(any(feature = "postgres", feature = "mysql")))]
        let _ = prefix;
        match self.db {
            #[cfg(feature = "postgres")]
            Db::Postgres => {
                if let Ok(mut client) = postgres::Client::connect(&postgres_url(), postgres::NoTls)
                {
                    let _ = client.batch_execute(&format!(
                        "DROP TABLE IF EXISTS {table} CASCADE; \
                         DROP TABLE IF EXISTS {table}_FLOOR CASCADE; \
                         DROP TABLE IF EXISTS {table}_SEM CASCADE; \
                         DROP FUNCTION IF EXISTS {table}_FLOOR() CASCADE"
                    ));
                }
            }
            #[cfg(feature = "mysql")]
            Db::Mysql => {
                use mysql::prelude::Queryable;
                if let Ok(mut conn) = mysql::Conn::new(mysql::Opts::from_url(&mysql_url()).unwrap())
                {
                    let _ = conn.query_drop(format!(
                        "DROP TABLE IF EXISTS {table}, {table}_FLOOR, {table}_SEM"
                    ));
                }
            }
            _ => {}
        }
    }
}

/// Generates one `#[test]` per suite function for a backend.
#[macro_export]
macro_rules! suite_for {
    ($db:expr; $($test:ident),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                if let Some(fixture) = $crate::common::Fixture::new($db, stringify!($test)) {
                    $crate::suite::$test(&fixture);
                }
            }
        )*
    };
}
