//! MySQL/MariaDB: the prepared statements a registry's connections keep (see `Plan` in
//! `src/backend/mysql/mod.rs`). Each connection prepares a statement once and calls it by its
//! handle; the driver's own statement cache (`stmt_cache_size` in the URL) may close that
//! handle, and a URL may turn the cache off.
//!
//! The tests read the server's global `Prepared_stmt_count`, so they run one at a time (this
//! binary holds nothing else).

#![cfg(feature = "mysql")]

mod common;

use common::{Db, Fixture};
use leasehold::LockRegistry;
use mysql::prelude::Queryable;
use parking_lot::Mutex;

/// One test at a time: both count the server's open prepared statements.
static SERIAL: Mutex<()> = Mutex::new(());

/// The test database's URL with `option` added to its query string.
fn url_with(option: &str) -> String {
    let url = common::mysql_url();
    let joint = if url.contains('?') { '&' } else { '?' };
    format!("{url}{joint}{option}")
}

/// The prepared statements open on the server now, over all sessions.
fn open_statements() -> i64 {
    let mut conn = mysql::Conn::new(mysql::Opts::from_url(&common::mysql_url()).unwrap()).unwrap();
    let row: Option<(String, i64)> = conn
        .query_first("SHOW GLOBAL STATUS LIKE 'Prepared_stmt_count'")
        .unwrap();
    row.expect("Prepared_stmt_count").1
}

/// A registry on `f`'s table through `url`.
fn registry(f: &Fixture, url: &str) -> LockRegistry {
    LockRegistry::mysql(url)
        .prefix(f.prefix.clone())
        .connect_timeout(std::time::Duration::from_secs(15))
        .build()
        .expect("registry")
}

/// `stmt_cache_size=0` turns the driver's cache off, and with it the closing of the statements
/// it prepares: every call prepared the statement anew and left it open on the server until
/// the connection closed. 400 uncontended locks left 800 statements open (a server allows
/// 16,382 by default, `max_prepared_stmt_count`, for all its clients together). Each pooled
/// connection prepares each statement once, and the registry's own connections outside the
/// pools (named locks for wake-ups, which a hold longer than a few milliseconds uses) keep a
/// statement cache whatever the URL says.
#[test]
fn a_url_without_a_statement_cache_leaves_no_statement_per_call_open() {
    let _serial = SERIAL.lock();
    let Some(f) = Fixture::new(Db::Mysql, "no_stmt_cache") else {
        return;
    };
    let registry = registry(&f, &url_with("stmt_cache_size=0"));
    let lock = registry.obtain("uncached").unwrap();
    lock.lock().unwrap().unlock().unwrap();
    let before = open_statements();
    for _ in 0..400 {
        lock.lock().unwrap().unlock().unwrap();
    }
    // Holds that last past the named-lock delay (what every hold does on a busy host): the
    // registry's named-lock connection takes and lets go of the key's name each time.
    for _ in 0..200 {
        let guard = lock.lock().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(6));
        guard.unlock().unwrap();
    }
    let after = open_statements();
    // Other sessions' statements come and go meanwhile (this binary runs nothing else); the
    // leak was two per cycle.
    assert!(
        after - before < 100,
        "{} statements opened by 600 cycles and left open",
        after - before
    );
    drop(lock);
    drop(registry);
}

/// With a driver cache of one statement, every statement a connection prepares closes the one
/// before it: the handles a connection keeps are closed under it all the time. Each is refused
/// before it runs and prepared again; no lock, try-lock, renewal or release fails, and every
/// grant holds its row.
#[test]
fn statements_the_drivers_cache_closed_are_prepared_again() {
    let _serial = SERIAL.lock();
    let Some(f) = Fixture::new(Db::Mysql, "tiny_stmt_cache") else {
        return;
    };
    let url = url_with("stmt_cache_size=1");
    let (a, b) = (registry(&f, &url), registry(&f, &url));
    let before = open_statements();
    for round in 0..30 {
        let key = format!("key-{}", round % 3);
        let guard = a.obtain(&key).unwrap().lock().unwrap();
        assert!(
            b.obtain(&key).unwrap().try_lock().unwrap().is_none(),
            "round {round}: another registry was refused the held key"
        );
        guard.renew().unwrap();
        guard.unlock().unwrap();
        let guard = b
            .obtain(&key)
            .unwrap()
            .try_lock()
            .unwrap()
            .unwrap_or_else(|| panic!("round {round}: the released key was free"));
        guard.unlock().unwrap();
    }
    let after = open_statements();
    assert!(
        after - before < 100,
        "{} statements left open by 30 rounds",
        after - before
    );
}
