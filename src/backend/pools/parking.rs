//! Tests of the parked connection on SQLite's main pool: who takes it, when it goes back to
//! r2d2, and when it closes.

use super::*;
use crate::backend::sqlite::{Sqlite, SqliteManager};
use crate::backend::{Backend, Conn};

fn sqlite_pool(dir: &tempfile::TempDir, size: u32, idle_timeout: Duration) -> Pool<SqliteManager> {
    let settings = PoolSettings {
        pool_size: size,
        renewal_pool_size: 1,
        idle_timeout,
        connect_timeout: Duration::from_secs(10),
        operation_timeout: Duration::from_secs(10),
        prepared_statements: None,
        listener_url: None,
    };
    let manager = SqliteManager::new(dir.path().join("parking.db"));
    let discard = <Sqlite as Backend>::mark_broken as fn(&mut Conn<Sqlite>);
    build_pool(manager, size, &settings, Some(discard))
}

#[test]
fn a_connection_given_back_is_parked_and_closed_once_idle() {
    let dir = tempfile::tempdir().unwrap();
    let idle = Duration::from_millis(200);
    let pool = sqlite_pool(&dir, 2, idle);
    let conn = pool.get_timeout(Duration::from_secs(10)).unwrap();
    pool.give_back(conn);
    // Parked: still checked out of r2d2, not idle there.
    let state = pool.state();
    assert_eq!((state.connections, state.idle_connections), (1, 0));
    let again = pool.get_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(
        pool.state().connections,
        1,
        "the parked connection was not reused"
    );
    pool.give_back(again);
    // Closed between the timeout and 1.5 times it (the idle check runs on r2d2's timer
    // threads, which a loaded machine may delay).
    let give_up = Instant::now() + Duration::from_secs(10);
    while pool.state().connections > 0 && Instant::now() < give_up {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        pool.state().connections,
        0,
        "the parked connection stayed open"
    );
    assert!(
        pool.try_get().is_none(),
        "a closed connection is still parked"
    );
    // The next caller opens a new one.
    let conn = pool.get_timeout(Duration::from_secs(10)).unwrap();
    pool.give_back(conn);
    assert_eq!(pool.state().connections, 1);
}

#[test]
fn a_caller_waiting_in_r2d2_is_given_the_connection_instead_of_the_slot() {
    let dir = tempfile::tempdir().unwrap();
    let pool = sqlite_pool(&dir, 1, Duration::from_secs(60));
    let held = pool.get_timeout(Duration::from_secs(10)).unwrap();
    let waiter = {
        let pool = pool.clone();
        std::thread::spawn(move || {
            let conn = pool.get_timeout(Duration::from_secs(20));
            let got = conn.is_ok();
            drop(conn);
            got
        })
    };
    while pool.waiting.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(Duration::from_millis(5));
    }
    // Someone waits in r2d2: the connection goes to r2d2, which hands it to the waiter,
    // instead of into the slot.
    pool.give_back(held);
    assert!(pool.parked.as_ref().unwrap().lock().conn.is_none());
    assert!(waiter.join().unwrap(), "the waiter timed out");
}

#[test]
fn discarding_idle_connections_finds_the_parked_one() {
    let dir = tempfile::tempdir().unwrap();
    let pool = sqlite_pool(&dir, 2, Duration::from_secs(60));
    let conn = pool.get_timeout(Duration::from_secs(10)).unwrap();
    pool.give_back(conn);
    let mut parked = pool.try_get().expect("the parked connection");
    Sqlite::mark_broken(&mut parked);
    drop(parked);
    assert_eq!(
        pool.state().connections,
        0,
        "a discarded connection stayed open"
    );
}

static CLOSING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A discard that takes its time (a slow close), and says when it began.
fn slow_discard(conn: &mut Conn<Sqlite>) {
    Sqlite::mark_broken(conn);
    CLOSING.store(true, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(300));
}

/// The idle check gives the parked connection back to r2d2 under the slot's lock: a
/// caller that comes meanwhile to a pool of one finds r2d2 with room once it gets in, and
/// opens a connection. When the check let go of the lock first, the caller found the slot
/// empty and r2d2 full, and slept until its deadline: r2d2 announces no place freed by a
/// broken connection.
#[test]
fn a_caller_during_the_idle_close_of_the_only_connection_gets_a_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let idle = Duration::from_secs(60);
    let pool = sqlite_pool(&dir, 1, idle);
    let conn = pool.get_timeout(Duration::from_secs(10)).unwrap();
    pool.give_back(conn);
    let slot = Arc::clone(pool.parked.as_ref().unwrap());
    // The first look sees the connection used since the last one; the second closes it.
    close_if_idle(&slot, idle, idle, slow_discard);
    let closer = std::thread::spawn(move || close_if_idle(&slot, idle, idle, slow_discard));
    while !CLOSING.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let got = pool.get_timeout(Duration::from_secs(10));
    closer.join().unwrap();
    assert!(
        got.is_ok(),
        "a caller during the idle close waited until its deadline: {:?}",
        got.err()
    );
}
