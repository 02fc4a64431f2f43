//! SQLite-only checks that need a raw connection beside the registry: table upgrades, "a try
//! that finds the lock held writes nothing", and busy-file retries bounded by the deadline; and
//! checks of the local queue that need no server (a lock taken in a thread-local destructor).

#![cfg(feature = "sqlite")]

use leasehold::{Error, LockRegistry};
use rusqlite::Connection;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A temporary directory (kept alive by the caller) and a lock table file in it, created
/// through a first registry, which is returned too.
fn fresh_table() -> (tempfile::TempDir, PathBuf, LockRegistry) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let registry = LockRegistry::sqlite(&path)
        .create_table(true)
        .build()
        .unwrap();
    (dir, path, registry)
}

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
    let (_dir, path, holder) = fresh_table();
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
    let (_dir, path, registry) = fresh_table();
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
    let (_dir, path, _created) = fresh_table();
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

#[test]
fn a_keeper_stuck_in_a_renewal_still_reports_the_loss_at_the_deadline() {
    let (_dir, path, _created) = fresh_table();
    // A renew statement that takes seconds, like one sent on a frozen connection.
    let slow_renew = "WITH RECURSIVE spin(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM spin \
                      WHERE n < 20000000) UPDATE INT_LOCK SET EXPIRED_AFTER = EXPIRED_AFTER \
                      WHERE (SELECT max(n) FROM spin) > 0 AND LOCK_KEY = ?1 AND REGION = ?2 \
                      AND CLIENT_ID = ?3 AND FENCING_TOKEN = ?5 AND ?4 > 0";
    let registry = LockRegistry::sqlite(&path)
        .custom_sql(leasehold::CustomSql {
            renew: Some(slow_renew.into()),
            ..Default::default()
        })
        .time_to_live(Duration::from_millis(300))
        .renew_every(Duration::from_millis(50))
        .build()
        .unwrap();
    let guard = registry.obtain("frozen").unwrap().lock().unwrap();
    let losses = guard.loss_channel();
    let asked = Instant::now();
    let lost = losses
        .recv_timeout(Duration::from_secs(30))
        .expect("loss reported");
    let reported_after = asked.elapsed();
    assert_eq!(
        registry.statistics().renewals,
        1,
        "the renewal is still running"
    );
    assert!(!guard.is_held());
    assert_eq!(
        lost.reason,
        leasehold::LossReason::Expired(None),
        "reported by the watchdog"
    );
    assert!(reported_after < Duration::from_secs(30));
    std::mem::forget(guard); // the file stays write-locked until the slow renewal ends
}

#[test]
fn a_table_without_its_primary_key_is_refused_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nokey.db");
    let conn = raw(&path);
    conn.execute_batch(
        "CREATE TABLE INT_LOCK (LOCK_KEY CHAR(36) NOT NULL, REGION VARCHAR(100) NOT NULL, \
         CLIENT_ID CHAR(36), CREATED_DATE TIMESTAMP NOT NULL, EXPIRED_AFTER TIMESTAMP NOT NULL, \
         FENCING_TOKEN BIGINT NOT NULL DEFAULT 0)",
    )
    .unwrap();
    match LockRegistry::sqlite(&path).build() {
        Err(Error::KeyMissing { table, fix }) => {
            assert_eq!(table, "INT_LOCK");
            assert_eq!(
                fix,
                "CREATE UNIQUE INDEX INT_LOCK_PK ON INT_LOCK (LOCK_KEY, REGION)"
            );
            conn.execute_batch(&fix).unwrap();
        }
        other => panic!("expected KeyMissing, got {other:?}"),
    }
    let registry = LockRegistry::sqlite(&path).build().unwrap();
    assert!(registry.obtain("k").unwrap().try_lock().unwrap().is_some());
}

#[test]
fn a_path_that_cannot_hold_a_database_fails_at_once_naming_the_cause_and_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let not_a_database = dir.path().join("notes.txt");
    std::fs::write(
        &not_a_database,
        "these are not the pages of a database, ".repeat(200),
    )
    .unwrap();
    let cases = [
        (
            "a missing directory",
            dir.path().join("missing").join("locks.db"),
            "unable to open",
        ),
        ("a directory", dir.path().to_path_buf(), "unable to open"),
        (
            "a file that is not a database",
            not_a_database,
            "not a database",
        ),
    ];
    for (what, path, cause) in cases {
        let asked = Instant::now();
        let built = LockRegistry::sqlite(&path)
            .create_table(true)
            .connect_timeout(Duration::from_secs(30))
            .build();
        let waited = asked.elapsed();
        let message = match built {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{what}: built a registry on {}", path.display()),
        };
        assert!(
            message.contains(&path.display().to_string()) && message.contains(cause),
            "{what}: {message}"
        );
        // Permanent: no retrying until the 30 s connect timeout.
        assert!(
            waited < Duration::from_secs(10),
            "{what}: failed after {waited:?}"
        );
    }
}

/// With one main connection for four threads, a thread that waits in the pool while another
/// holds the connection gets it when it comes back: a connection is parked only while no
/// caller waits in r2d2's checkout, which would otherwise sleep until its deadline while the
/// others took turns on the parked connection.
#[test]
fn callers_waiting_for_the_only_connection_are_given_it() {
    let (_dir, path, _first) = fresh_table();
    let registry = LockRegistry::sqlite(&path)
        .pool_size(1)
        .operation_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let threads: Vec<_> = (0..4)
        .map(|thread| {
            let lock = registry
                .obtain(&format!("one-connection-{thread}"))
                .unwrap();
            std::thread::spawn(move || {
                for cycle in 0..150 {
                    let guard = lock
                        .lock()
                        .unwrap_or_else(|e| panic!("thread {thread}, cycle {cycle}: {e}"));
                    guard
                        .unlock()
                        .unwrap_or_else(|e| panic!("thread {thread}, cycle {cycle}: {e}"));
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
}

#[test]
fn in_memory_and_temporary_databases_are_refused_naming_why() {
    let names = [
        ":memory:",
        "",
        "file::memory:",
        "file::memory:?cache=shared",
        "file:locks?mode=memory&cache=shared",
    ];
    for name in names {
        match LockRegistry::sqlite(name).create_table(true).build() {
            Err(Error::InvalidSetting { setting, reason }) => {
                assert_eq!(setting, "sqlite", "{name:?}");
                assert!(
                    reason.contains("private to one connection"),
                    "{name:?}: {reason}"
                );
            }
            Err(other) => panic!("{name:?}: the wrong error: {other}"),
            Ok(_) => panic!("{name:?}: a registry on a private database was built"),
        }
    }
    // Nothing was created beside the working directory's files for them.
    assert!(!std::path::Path::new(":memory:-leasehold").exists());
    // A `file:` URI naming a real file is a file like any other.
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file:{}", dir.path().join("locks.db").display());
    let registry = LockRegistry::sqlite(&uri)
        .create_table(true)
        .build()
        .unwrap();
    let guard = registry.obtain("uri").unwrap().lock().unwrap();
    guard.unlock().unwrap();
}

/// A lock taken and let go in a thread-local's destructor, after the registry's own
/// thread-locals of that thread are gone (they were set up after it, so they go first).
#[test]
fn a_lock_taken_in_a_thread_local_destructor_is_granted_and_released() {
    use std::cell::RefCell;
    use std::sync::mpsc;
    struct LockOnDrop(leasehold::Lock, mpsc::Sender<leasehold::Result<u64>>);
    impl Drop for LockOnDrop {
        fn drop(&mut self) {
            let taken = self.0.lock().and_then(|guard| {
                let token = guard.fencing_token();
                guard.unlock().map(|()| token)
            });
            let _ = self.1.send(taken);
        }
    }
    thread_local! {
        static LATE: RefCell<Option<LockOnDrop>> = const { RefCell::new(None) };
    }
    let (_dir, _path, registry) = fresh_table();
    let lock = registry.obtain("thread-local").unwrap();
    let (sender, taken) = mpsc::channel();
    let first = {
        let lock = lock.clone();
        std::thread::spawn(move || {
            LATE.with(|late| *late.borrow_mut() = Some(LockOnDrop(lock.clone(), sender)));
            let guard = lock.lock().unwrap();
            let token = guard.fencing_token();
            guard.unlock().unwrap();
            token
        })
        .join()
        .unwrap()
    };
    let late = taken.recv().expect("the destructor ran").unwrap();
    assert!(late > first, "a grant of its own: {late} after {first}");
    assert!(lock.try_lock().unwrap().is_some(), "released");
}
