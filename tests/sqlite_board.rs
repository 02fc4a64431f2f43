//! SQLite's release board (`<database>-leasehold`, see the `sqlite_board` module docs): what
//! others do to the file cannot crash a process, and one database reached by several paths
//! shares one board.
//!
//! Waiters here poll only every 30 s, so a waiter that gets the lock within a few seconds of
//! the release was woken through the board, not by its timer.

#![cfg(all(feature = "sqlite", target_os = "linux"))]

mod common;

use common::{Db, Fixture};
use leasehold::LockRegistry;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const SLOW_POLL: Duration = Duration::from_secs(30);
const WOKEN_WITHIN: Duration = Duration::from_secs(10);
/// The board's size: a sequence word, a padding word, 4,096 slots of two words.
const BOARD_SIZE: u64 = (2 + 2 * 4096) * 4;

fn board_of(database: &Path) -> std::path::PathBuf {
    let mut name = database.as_os_str().to_owned();
    name.push("-leasehold");
    name.into()
}

/// Waits until `done()` or `within` passes; returns whether it became true.
fn within(within: Duration, done: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        thread::sleep(Duration::from_millis(5));
    }
    done()
}

/// `holder` takes `key` and a thread of `waiter` waits for it; once the waiter has tried and
/// become present on the board, runs `meanwhile` and releases. Returns whether the waiter got the lock
/// within [`WOKEN_WITHIN`] of the release, and the waiter's attempts (joins it either way).
/// (A fresh key each time: handoffs of one key add up to a turn, which a registry may end by
/// staying away from the key.)
fn handoff(
    holder: &LockRegistry,
    waiter: &LockRegistry,
    key: &str,
    meanwhile: impl FnOnce(),
) -> (bool, u64) {
    let guard = holder.obtain(key).unwrap().lock().unwrap();
    let before = waiter.statistics().acquires;
    let granted = Arc::new(AtomicBool::new(false));
    let handle = {
        let (waiter, granted, key) = (waiter.clone(), granted.clone(), key.to_string());
        thread::spawn(move || {
            let lock = waiter.obtain(&key).unwrap();
            let guard = lock.try_lock_for(SLOW_POLL * 2).unwrap().expect("granted");
            granted.store(true, Ordering::SeqCst);
            guard.unlock().unwrap();
        })
    };
    // The failed try, then time for the waiter to become present and try once more.
    assert!(
        within(WOKEN_WITHIN, || waiter.statistics().acquires > before),
        "the waiter tried"
    );
    thread::sleep(Duration::from_millis(300));
    meanwhile();
    guard.unlock().unwrap();
    let woken = within(WOKEN_WITHIN, || granted.load(Ordering::SeqCst));
    handle.join().unwrap();
    (woken, waiter.statistics().acquires - before)
}

fn set_len(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

/// Set in the child process that runs the body of the truncation test.
const CHILD: &str = "LEASEHOLD_BOARD_CHILD";

/// Runs the test `test` of this binary alone in a child process (with [`CHILD`] set), so that
/// a crash fails the test with the signal's number and fail points touch no other test.
fn in_child(test: &str) {
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--test-threads", "1", "--nocapture"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && said.contains("1 passed"),
        "the child process {}: {said}{}",
        match output.status.signal() {
            Some(signal) => format!("was killed by signal {signal} (SIGBUS is 7)"),
            None => format!("exited with {}", output.status),
        },
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The board's release sequence (word 0): moves with every announced release.
fn sequence(board: &Path) -> u32 {
    let bytes = std::fs::read(board).unwrap();
    u32::from_ne_bytes(bytes[0..4].try_into().unwrap())
}

/// Truncating or shrinking the board while registries wait on it and release through it
/// crashes no process (a mapping read or written past the file's end would raise SIGBUS), and
/// releases wake waiters again. The body runs in a child process, so that a crash fails this
/// test with the signal's number instead of killing the test binary.
#[test]
fn shrinking_the_board_crashes_nothing_and_wake_ups_come_back() {
    if std::env::var_os(CHILD).is_some() {
        return truncation_body();
    }
    in_child("shrinking_the_board_crashes_nothing_and_wake_ups_come_back");
}

fn truncation_body() {
    let f = Fixture::new(Db::Sqlite, "board_truncated").unwrap();
    let holder = f.registry();
    let waiter = f.builder().idle_between_tries(SLOW_POLL).build().unwrap();
    let board = board_of(&f.sqlite_path());
    // Announce once, so that the board exists with counts in it.
    let (woken, _) = handoff(&holder, &waiter, "first", || {});
    assert!(woken, "the waiter was woken before any truncation");
    assert_eq!(std::fs::metadata(&board).unwrap().len(), BOARD_SIZE);
    // Emptied, cut in the middle of the slots, cut by a few bytes: the release that follows
    // still wakes the waiter (the releasing process grows the file back).
    for len in [0, 100, 20_000, BOARD_SIZE - 2] {
        let key = format!("cut-to-{len}");
        let (woken, tries) = handoff(&holder, &waiter, &key, || set_len(&board, len));
        assert!(woken, "after cutting the board to {len} bytes: not woken");
        assert!(tries <= 4, "{tries} tries after cutting to {len} bytes");
        assert_eq!(std::fs::metadata(&board).unwrap().len(), BOARD_SIZE);
    }
    // Cut while only a waiter sleeps on it: the release grows it back and wakes the waiter.
    let guard = holder.obtain("listener").unwrap().lock().unwrap();
    let granted = Arc::new(AtomicBool::new(false));
    let handle = {
        let (waiter, granted) = (waiter.clone(), granted.clone());
        thread::spawn(move || {
            let lock = waiter.obtain("listener").unwrap();
            let guard = lock.try_lock_for(SLOW_POLL * 2).unwrap().expect("granted");
            granted.store(true, Ordering::SeqCst);
            guard.unlock().unwrap();
        })
    };
    thread::sleep(Duration::from_millis(300));
    set_len(&board, 0);
    guard.unlock().unwrap();
    assert!(
        within(WOKEN_WITHIN, || granted.load(Ordering::SeqCst)),
        "not woken after the board was emptied under the sleeping waiter"
    );
    handle.join().unwrap();
    assert_eq!(std::fs::metadata(&board).unwrap().len(), BOARD_SIZE);
    // And the locks still exclude and hand over.
    let guard = holder.obtain("other").unwrap().lock().unwrap();
    assert!(waiter
        .obtain("other")
        .unwrap()
        .try_lock()
        .unwrap()
        .is_none());
    guard.unlock().unwrap();
    assert!(waiter
        .obtain("other")
        .unwrap()
        .try_lock()
        .unwrap()
        .is_some());
}

/// Deleting the board while processes use it (a temporary-directory cleaner) does not split
/// them: those that had mapped the old file and those that open the database later and make a
/// new one still wake each other, as each follows the file the path names (at a release, before
/// a waiting thread's attempt, and every second while a listener listens).
#[test]
fn after_the_board_is_deleted_old_and_new_registries_wake_each_other() {
    let f = Fixture::new(Db::Sqlite, "board_deleted").unwrap();
    let board = board_of(&f.sqlite_path());
    let slow = || f.builder().idle_between_tries(SLOW_POLL).build().unwrap();
    let (old_holder, old_waiter) = (f.registry(), slow());
    let (woken, _) = handoff(&old_holder, &old_waiter, "before", || {});
    assert!(woken, "woken before the deletion");
    std::fs::remove_file(&board).unwrap();
    let new_waiter = slow();
    let (woken, tries) = handoff(&old_holder, &new_waiter, "old to new", || {});
    assert!(
        woken,
        "a release through the deleted file reached a new registry"
    );
    // A failed try, one once present, one woken (two when the release came before the
    // waiter was present).
    assert!(tries <= 3, "{tries} tries");
    let (woken, _) = handoff(&new_waiter, &old_waiter, "new to old", || {});
    assert!(
        woken,
        "a release through the new file reached an old registry"
    );
    assert!(board.exists());
}

/// Registries that open one database through a symbolic link or a path with `..` share its
/// board (one beside the file the path resolves to), so releases wake each other's waiters.
#[test]
fn registries_reaching_one_database_by_other_paths_share_its_board() {
    let f = Fixture::new(Db::Sqlite, "board_paths").unwrap();
    let database = f.sqlite_path();
    let links = tempfile::tempdir().unwrap();
    let link = links.path().join("link.db");
    std::os::unix::fs::symlink(&database, &link).unwrap();
    let dotted = database.parent().unwrap().join("sub/../locks.db");
    std::fs::create_dir(database.parent().unwrap().join("sub")).unwrap();
    let on = |path: &Path| {
        LockRegistry::sqlite(path)
            .prefix(f.prefix.clone())
            .idle_between_tries(SLOW_POLL)
            .build()
            .unwrap()
    };
    let (direct, through_link, through_dots) = (f.registry(), on(&link), on(&dotted));
    for (holder, waiter, what) in [
        (&direct, &through_link, "the waiter through a symbolic link"),
        (
            &through_link,
            &through_dots,
            "the holder through a link, the waiter through ..",
        ),
    ] {
        let (woken, tries) = handoff(holder, waiter, what, || {});
        assert!(woken, "{what}: slept until its next poll");
        // A failed try, one once present, one woken (two when the release came before the
        // waiter was present).
        assert!(tries <= 3, "{what}: {tries} tries");
    }
    assert!(
        !board_of(&link).exists(),
        "one board, beside the file itself"
    );
}

/// A release announces on the board only while someone is present on it (an
/// open-file-description lock that a thread waiting in `lock()` holds during its call, and a
/// listener while it is subscribed); otherwise it costs one `fcntl`.
#[test]
fn a_release_announces_on_the_board_only_while_someone_listens() {
    let f = Fixture::new(Db::Sqlite, "board_listeners").unwrap();
    let board = board_of(&f.sqlite_path());
    let (holder, waiter) = (
        f.registry(),
        f.builder().idle_between_tries(SLOW_POLL).build().unwrap(),
    );
    for _ in 0..3 {
        holder
            .obtain("alone")
            .unwrap()
            .lock()
            .unwrap()
            .unlock()
            .unwrap();
    }
    assert_eq!(sequence(&board), 0, "nobody listened: nothing announced");
    let (woken, _) = handoff(&holder, &waiter, "watched", || {});
    assert!(woken, "the waiter was present and woken");
    assert!(sequence(&board) >= 1, "the release was announced");
    // The waiter's presence ends with its `lock()` call; releases then go quiet.
    let quiet = within(WOKEN_WITHIN, || {
        let before = sequence(&board);
        holder
            .obtain("alone")
            .unwrap()
            .lock()
            .unwrap()
            .unlock()
            .unwrap();
        sequence(&board) == before
    });
    assert!(quiet, "releases still announced after the waiter left");
}

/// A thread waiting in `lock()` is woken by the release in the other process itself, not by
/// its registry's listener thread: with that thread held where it comes back from its wait,
/// the waiter still gets the lock at once. Runs in a child process: fail points are
/// process-wide.
#[cfg(feature = "failpoints")]
#[test]
fn a_release_wakes_a_waiting_lock_without_the_listener_thread() {
    if std::env::var_os(CHILD).is_none() {
        return in_child("a_release_wakes_a_waiting_lock_without_the_listener_thread");
    }
    let f = Fixture::new(Db::Sqlite, "board_own_wait").unwrap();
    let holder = f.registry();
    let waiter = f.builder().idle_between_tries(SLOW_POLL).build().unwrap();
    fail::cfg("sqlite_board::listener_woken", "pause").unwrap();
    let guard = holder.obtain("own").unwrap().lock().unwrap();
    let granted = Arc::new(AtomicBool::new(false));
    let handle = {
        let (waiter, granted) = (waiter.clone(), granted.clone());
        thread::spawn(move || {
            let lock = waiter.obtain("own").unwrap();
            let guard = lock.try_lock_for(SLOW_POLL * 2).unwrap().expect("granted");
            granted.store(true, Ordering::SeqCst);
            guard.unlock().unwrap();
        })
    };
    // Both refused attempts — the first, and the one once it is present — before the release:
    // only a wake-up can explain a grant before the next poll, however busy the machine.
    assert!(
        within(WOKEN_WITHIN, || waiter.statistics().acquires >= 2),
        "the waiter tried twice"
    );
    guard.unlock().unwrap();
    let woken = within(WOKEN_WITHIN, || granted.load(Ordering::SeqCst));
    fail::remove("sqlite_board::listener_woken");
    handle.join().unwrap();
    assert!(woken, "the waiter slept until its next poll");
    assert_eq!(
        waiter.statistics().acquires,
        3,
        "two refused attempts, one woken"
    );
}

/// The race of presence (see "Presence" in the board's module docs): a release that commits
/// and tests for presence just before a waiting thread becomes present announces nothing, and
/// the waiter must still get the lock at once — it tries once more after it became present,
/// and that attempt sees the committed release. A fail point holds the waiter just before it
/// takes its presence while the holder releases. Runs in a child process: fail points are
/// process-wide.
#[cfg(feature = "failpoints")]
#[test]
fn a_release_just_before_a_waiter_becomes_present_still_reaches_it() {
    if std::env::var_os(CHILD).is_none() {
        return in_child("a_release_just_before_a_waiter_becomes_present_still_reaches_it");
    }
    let f = Fixture::new(Db::Sqlite, "board_presence_race").unwrap();
    let board = board_of(&f.sqlite_path());
    let holder = f.registry();
    let waiter = f.builder().idle_between_tries(SLOW_POLL).build().unwrap();
    let (entered_tx, entered) = crossbeam_channel::unbounded::<()>();
    let (open, open_rx) = crossbeam_channel::unbounded::<()>();
    let hits = std::sync::atomic::AtomicUsize::new(0);
    fail::cfg_callback("sqlite_board::waiter_before_presence", move || {
        if hits.fetch_add(1, Ordering::SeqCst) == 0 {
            let _ = entered_tx.send(());
            let _ = open_rx.recv_timeout(SLOW_POLL);
        }
    })
    .unwrap();
    let guard = holder.obtain("raced").unwrap().lock().unwrap();
    let granted = Arc::new(AtomicBool::new(false));
    let handle = {
        let (waiter, granted) = (waiter.clone(), granted.clone());
        thread::spawn(move || {
            let lock = waiter.obtain("raced").unwrap();
            let guard = lock.try_lock_for(SLOW_POLL * 2).unwrap().expect("granted");
            granted.store(true, Ordering::SeqCst);
            guard.unlock().unwrap();
        })
    };
    entered
        .recv_timeout(WOKEN_WITHIN)
        .expect("the waiter was refused and set out to become present");
    let before = sequence(&board);
    guard.unlock().unwrap();
    assert_eq!(
        sequence(&board),
        before,
        "the release found nobody present and announced nothing"
    );
    assert!(
        !granted.load(Ordering::SeqCst),
        "the waiter is held before its presence"
    );
    open.send(()).unwrap();
    assert!(
        within(WOKEN_WITHIN, || granted.load(Ordering::SeqCst)),
        "the waiter did not try again once present"
    );
    handle.join().unwrap();
    assert_eq!(
        waiter.statistics().acquires,
        2,
        "one refused attempt, one once present"
    );
    fail::remove("sqlite_board::waiter_before_presence");
}
