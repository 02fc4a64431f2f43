//! SQLite-only checks that need a raw connection beside the registry: table upgrades, "a try
//! that finds the lock held writes nothing", and busy-file retries bounded by the deadline.

#![cfg(feature = "sqlite")]

use leasehold::{Error, LockRegistry};
use rusqlite::Connection;
use std::time::{Duration, Instant};

fn raw(path: &std::path::Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn
}

#[test]
fn a_pre_7_0_spring_table_gets_the_alter_table_to_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spring.db");
    let conn = raw(&path);
    conn.execute_batch(
        "CREATE TABLE INT_LOCK (LOCK_KEY CHAR(36) NOT NULL, REGION VARCHAR(100) NOT NULL, \
         CLIENT_ID CHAR(36), CREATED_DATE TIMESTAMP NOT NULL, \
         CONSTRAINT INT_LOCK_PK PRIMARY KEY (LOCK_KEY, REGION))",
    )
    .unwrap();
    for expected in ["EXPIRED_AFTER", "FENCING_TOKEN"] {
        match LockRegistry::sqlite(&path).build() {
            Err(Error::ColumnMissing { column, fix, .. }) => {
                assert_eq!(column, expected);
                assert!(fix.starts_with("ALTER TABLE INT_LOCK ADD"), "{fix}");
                conn.execute_batch(&fix).unwrap();
            }
            other => panic!("expected {expected} missing, got {other:?}"),
        }
    }
    let registry = LockRegistry::sqlite(&path).build().unwrap();
    let guard = registry.obtain("upgraded").unwrap().lock().unwrap();
    assert!(guard.fencing_token() > 0);
}

#[test]
fn a_try_that_finds_the_lock_held_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let holder = LockRegistry::sqlite(&path)
        .create_table(true)
        .build()
        .unwrap();
    let held = holder.obtain("busy").unwrap().lock().unwrap();
    let observer = raw(&path);
    let version = || -> i64 {
        observer
            .query_row("PRAGMA data_version", [], |row| row.get(0))
            .unwrap()
    };
    let before = version();
    let waiter = LockRegistry::sqlite(&path).build().unwrap();
    let lock = waiter.obtain("busy").unwrap();
    for _ in 0..20 {
        assert!(lock.try_lock().unwrap().is_none());
    }
    assert_eq!(waiter.statistics().acquires, 20);
    assert_eq!(version(), before, "a failed try committed a write");
    // The observer does see writes: a successful acquire changes the version.
    held.unlock().unwrap();
    let after_release = version();
    let _guard = lock.try_lock().unwrap().expect("free now");
    assert_ne!(version(), after_release);
}

#[test]
fn a_busy_file_is_retried_until_the_deadline_and_no_longer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let registry = LockRegistry::sqlite(&path)
        .create_table(true)
        .build()
        .unwrap();
    let lock = registry.obtain("blocked").unwrap();
    let writer = raw(&path);
    writer.execute_batch("BEGIN IMMEDIATE").unwrap();
    let asked = Instant::now();
    let outcome = lock.try_lock_for(Duration::from_millis(300));
    let waited = asked.elapsed();
    match outcome {
        Err(Error::Timeout { operation, .. }) => assert_eq!(operation, "acquire"),
        other => panic!("expected a timeout while the file is write-locked, got {other:?}"),
    }
    assert!(
        waited < Duration::from_secs(5),
        "ignored its deadline: {waited:?}"
    );
    assert!(registry.statistics().acquires > 1, "busy was not retried");
    writer.execute_batch("COMMIT").unwrap();
    assert!(lock.try_lock().unwrap().is_some());
}

#[test]
fn the_shipped_ddl_is_what_create_table_makes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    LockRegistry::sqlite(&path)
        .create_table(true)
        .build()
        .unwrap();
    let conn = raw(&path);
    let made: String = conn
        .query_row(
            "SELECT sql FROM sqlite_master WHERE name = 'INT_LOCK'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    let shipped = include_str!("../sql/sqlite.sql");
    let normalize = |sql: &str| {
        sql.lines()
            .filter(|line| !line.trim_start().starts_with("--"))
            .collect::<String>()
            .replace("IF NOT EXISTS ", "")
            .split_whitespace()
            .collect::<String>()
            .trim_end_matches(';')
            .to_string()
    };
    assert_eq!(normalize(&made), normalize(shipped));
}
