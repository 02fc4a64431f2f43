//! PostgreSQL release notifications: a release wakes waiters of other registries at once,
//! the listener survives losing its connection, and the feature can be turned off.
//!
//! Waiters here poll only every 30 s, so a waiter that gets the lock within a few seconds of
//! the release was woken by the notification, not by its timer.

#![cfg(feature = "postgres")]

mod common;

use common::{Db, Fixture};
use leasehold::LockRegistry;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

const SLOW_POLL: Duration = Duration::from_secs(30);
const WOKEN_WITHIN: Duration = Duration::from_secs(10);

fn fixture(test: &str) -> Option<Fixture> {
    Fixture::new(Db::Postgres, test)
}

/// Starts a thread in `waiter` that locks `key` and reports when it got it.
fn wait_for(waiter: LockRegistry, key: &'static str) -> (Arc<AtomicBool>, thread::JoinHandle<()>) {
    let granted = Arc::new(AtomicBool::new(false));
    let flag = granted.clone();
    let handle = thread::spawn(move || {
        let lock = waiter.obtain(key).unwrap();
        let guard = lock.try_lock_for(SLOW_POLL * 2).unwrap().expect("granted");
        flag.store(true, Ordering::SeqCst);
        guard.unlock().unwrap();
    });
    (granted, handle)
}

/// Waits until `flag` is set or `within` passes; returns whether it was set.
fn set_within(flag: &AtomicBool, within: Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if flag.load(Ordering::SeqCst) {
            return true;
        }
        thread::sleep(Duration::from_millis(5));
    }
    flag.load(Ordering::SeqCst)
}

/// Waits until the waiter's first attempt has been sent, and a little longer for its answer
/// (the lock is held) to arrive.
fn until_polled_once(waiter: &LockRegistry) {
    while waiter.statistics().acquires == 0 {
        thread::sleep(Duration::from_millis(5));
    }
    thread::sleep(Duration::from_millis(300));
}

/// `holder` takes "job", a thread of `waiter` waits for it and polls once, `holder` releases:
/// whether the waiter got the lock within `within`. Joins the waiter either way.
fn release_reaches_waiter(holder: &LockRegistry, waiter: &LockRegistry, within: Duration) -> bool {
    let guard = holder.obtain("job").unwrap().lock().unwrap();
    let (granted, handle) = wait_for(waiter.clone(), "job");
    until_polled_once(waiter);
    guard.unlock().unwrap();
    let in_time = set_within(&granted, within);
    handle.join().unwrap();
    assert!(
        granted.load(Ordering::SeqCst),
        "the waiter got the lock in the end"
    );
    in_time
}

#[test]
fn a_release_wakes_a_waiter_of_another_registry_before_its_next_poll() {
    let Some(f) = fixture("notify_wakes") else {
        return;
    };
    let holder = f.registry();
    let waiter = f.builder().idle_between_tries(SLOW_POLL).build().unwrap();
    assert!(
        release_reaches_waiter(&holder, &waiter, WOKEN_WITHIN),
        "the waiter slept until its next poll"
    );
    assert_eq!(
        waiter.statistics().acquires,
        2,
        "one failed try, one woken try"
    );
}

#[test]
fn the_listener_comes_back_after_its_connection_is_killed() {
    let Some(f) = fixture("notify_reconnects") else {
        return;
    };
    let holder = f.registry();
    let waiter = f.builder().idle_between_tries(SLOW_POLL).build().unwrap();
    let mut admin = postgres::Client::connect(&common::postgres_url(), postgres::NoTls).unwrap();
    let killed = admin
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = $1",
            &[&format!("LISTEN \"{}\"", f.table().to_ascii_lowercase())],
        )
        .unwrap()
        .len();
    assert!(
        killed >= 2,
        "both registries' listeners were found ({killed})"
    );
    // Give the listener time to notice and reconnect (it checks at least every second).
    thread::sleep(Duration::from_secs(3));
    assert!(
        release_reaches_waiter(&holder, &waiter, WOKEN_WITHIN),
        "no wake-up after the listener was killed"
    );
}

#[test]
fn without_notifications_a_waiter_wakes_only_at_its_next_poll() {
    let Some(f) = fixture("notify_off") else {
        return;
    };
    let holder = f.registry();
    let waiter = f
        .builder()
        .notifications(false)
        .idle_between_tries(Duration::from_secs(3))
        .build()
        .unwrap();
    assert!(
        !release_reaches_waiter(&holder, &waiter, Duration::from_millis(500)),
        "woken without notifications"
    );
    assert_eq!(waiter.statistics().acquires, 2);
}
