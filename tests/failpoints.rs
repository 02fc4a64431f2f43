//! Races forced with fail points (feature `failpoints`, part of `--all-features`): each test
//! pins one interleaving in which a guarantee could break, instead of hoping a loop hits the
//! window. The fail point names are listed in `src/lease/mod.rs`.
//!
//! Fail points are process-wide, so every test holds a [`fail::FailScenario`], which runs the
//! tests of this binary one at a time and clears every fail point when it ends. Waits are
//! bounded generously; the only timing a test relies on is a time-to-live running out. A lease
//! that must *survive* has a time-to-live of seconds, so that a machine too busy to run the
//! renewal thread for a second or two does not fail the test; waits for renewals end as soon as
//! they are seen.

#![cfg(all(feature = "failpoints", feature = "sqlite"))]

mod common;

use common::gates::{on_reaching, wait_until, Gate, GENEROUS};
use common::{Db, Fixture};
use crossbeam_channel::Receiver;
use leasehold::{LeaderElection, LeaseLost, LockGuard, LockRegistry, LossReason};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Waits until `registry` has renewed twice more (a lease renewed on its own schedule) or a
/// loss arrives on `losses`, and returns the loss.
fn renewed_twice_or_lost(
    registry: &LockRegistry,
    losses: &Receiver<LeaseLost>,
) -> Option<LeaseLost> {
    let before = registry.statistics().renewals;
    let until = Instant::now() + GENEROUS;
    while registry.statistics().renewals < before + 2 {
        assert!(Instant::now() < until, "timed out waiting for two renewals");
        if let Ok(lost) = losses.recv_timeout(Duration::from_millis(20)) {
            return Some(lost);
        }
    }
    losses.try_recv().ok()
}

/// The holder may believe it holds only while no other instance can take the lock.
fn assert_exclusive(guard: &LockGuard, other: &LockRegistry) {
    let taken = other.obtain(guard.key()).unwrap().try_lock().unwrap();
    assert!(
        !(guard.is_held() && taken.is_some()),
        "two holders: this one counts {:?} more, and another instance was granted the lock",
        guard.remaining()
    );
}

fn sqlite(test: &str) -> Fixture {
    Fixture::new(Db::Sqlite, test).expect("SQLite is embedded")
}

/// The keeper renews with the old time-to-live while the holder renews with a longer
/// one; the keeper's statement runs last. The holder must not count on the longer one.
#[test]
fn renewals_with_different_ttls_are_serialised_and_the_holder_never_outlives_the_row() {
    let scenario = fail::FailScenario::setup();
    let f = sqlite("serialised_renewals");
    // 3 s: the lease must last from the keeper's first renewal (after 1 s) until the manual
    // renewal has run, however slowly the gate below is passed.
    let keeper_ttl = Duration::from_secs(3);
    let holder = f.builder().time_to_live(keeper_ttl).build().unwrap();
    let other = f.registry();
    // The keeper's first renewal (with 3 s) stops after its send instant was taken.
    let keeper = Gate::first_at("backend::renew_sent");
    let guard = holder.obtain("reorder").unwrap().lock().unwrap();
    keeper.wait_entered();
    // Let the keeper go once the manual renewal has run, or waits for the keeper's turn.
    let (manual_done, manual_done_rx) = crossbeam_channel::bounded(2);
    on_reaching("lease::renew_waits_for_turn", manual_done.clone());
    let releaser = thread::spawn(move || {
        let _ = manual_done_rx.recv_timeout(GENEROUS);
        keeper.open();
    });
    let renewed = guard.renew_with_ttl(Duration::from_secs(60));
    let _ = manual_done.try_send(());
    releaser.join().unwrap();
    wait_until("both renewals ran", || holder.statistics().renewals >= 2);
    // Past the keeper's 3 s: if its statement ran last, the row has expired.
    thread::sleep(keeper_ttl + Duration::from_millis(500));
    assert_exclusive(&guard, &other);
    assert!(renewed.is_ok(), "{renewed:?}");
    drop(guard);
    scenario.teardown();
}

/// Another session's transaction holding one lock row (`SELECT … FOR UPDATE`): a statement on
/// that row waits on the server, unanswered, until the transaction ends, and then runs.
#[cfg(feature = "mysql")]
struct RowHeld(mysql::Conn);

#[cfg(feature = "mysql")]
impl RowHeld {
    fn on(f: &Fixture, key: &str) -> RowHeld {
        use mysql::prelude::Queryable;
        let mut session = mysql::Conn::new(mysql::Opts::from_url(&common::mysql_url()).unwrap())
            .expect("a second session");
        session.query_drop("START TRANSACTION").unwrap();
        // The whole primary key: the row alone is locked, not the gap before it (where
        // other keys' rows would be inserted).
        let held: Vec<mysql::Row> = session
            .query(format!(
                "SELECT LOCK_KEY FROM {} WHERE LOCK_KEY = '{}' AND REGION = '{}' FOR UPDATE",
                f.table(),
                leasehold::lock_key_for(key),
                f.registry().region()
            ))
            .unwrap();
        assert_eq!(held.len(), 1, "the row of {key} exists");
        RowHeld(session)
    }

    fn end(mut self) {
        use mysql::prelude::Queryable;
        self.0.query_drop("ROLLBACK").unwrap();
    }
}

/// A manual renewal that finds its row locked by another session tries again until its
/// deadline; when the deadline comes while a later try is still out (here held at a fail
/// point), the timeout still names the row lock that the wait was for.
#[cfg(feature = "mysql")]
#[test]
fn a_renewal_whose_deadline_comes_during_a_retry_names_the_row_lock() {
    let scenario = fail::FailScenario::setup();
    let Some(f) = Fixture::new(Db::Mysql, "renew_retry_timeout") else {
        return;
    };
    let registry = f
        .builder()
        .renewal(false)
        .operation_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let guard = registry.obtain("retried").unwrap().lock().unwrap();
    let row = RowHeld::on(&f, "retried");
    // The first try finds the row locked; the next is held past the deadline.
    fail::cfg("backend::renew_sent", "1*off->sleep(1000)").unwrap();
    let outcome = guard.renew();
    fail::remove("backend::renew_sent");
    row.end();
    match outcome {
        Err(e @ leasehold::Error::Timeout { .. }) => {
            let text = e.to_string();
            assert!(text.contains("stayed locked by another session"), "{text}");
        }
        other => panic!("expected a timeout naming the row lock, got {other:?}"),
    }
    drop(guard);
    scenario.teardown();
}

/// A manual renewal with a shorter time-to-live times out for its caller but
/// runs on the server later. Another session holds its row locked past the caller's deadline
/// (the caller's socket gives up at the deadline; the server's statement waits on), then lets
/// go. The holder must count with it. (An unbounded renewal would wait for the row and
/// succeed once the session lets go anyway, after 10 s.)
#[cfg(feature = "mysql")]
#[test]
fn a_renewal_that_timed_out_still_bounds_the_holders_deadline() {
    let scenario = fail::FailScenario::setup();
    let Some(f) = Fixture::new(Db::Mysql, "timed_out_renewal") else {
        return;
    };
    let other = f.registry();
    // A renew statement of the user's own (the default's text): it runs as it is, waiting for
    // a row another session holds locked (the registry's own skips such a row, and no
    // statement of it would be left to run late).
    let renew = other.statements().renew.clone();
    let holder = f
        .builder()
        .time_to_live(Duration::from_secs(60))
        // Long enough for the lock() below on a busy machine; the held-back renewal times out.
        .operation_timeout(Duration::from_secs(2))
        .custom_sql(leasehold::CustomSql {
            renew: Some(renew),
            ..Default::default()
        })
        .build()
        .unwrap();
    let guard = holder.obtain("late").unwrap().lock().unwrap();
    let row = RowHeld::on(&f, "late");
    let (renewal_done, renewal_done_rx) = crossbeam_channel::bounded(1);
    let letting_go = thread::spawn(move || {
        let _ = renewal_done_rx.recv_timeout(Duration::from_secs(10));
        row.end();
        Instant::now()
    });
    let renewed = guard.renew_with_ttl(Duration::from_secs(1));
    let _ = renewal_done.send(());
    let ran_at = letting_go.join().unwrap();
    assert!(renewed.is_err(), "the renewal was held back: {renewed:?}");
    // The late statement now runs and sets the row to expire a second later.
    let reader = f.registry();
    wait_until("the late renewal ran on the server", || {
        let (now, _) = reader.database_time().unwrap();
        reader.holder("late").unwrap().is_none_or(|row| {
            row.expires_at.duration_since(now).unwrap_or_default() < Duration::from_secs(30)
        })
    });
    thread::sleep(Duration::from_millis(1500).saturating_sub(ran_at.elapsed()));
    assert_exclusive(&guard, &other);
    drop(guard);
    scenario.teardown();
}

/// A shorter time-to-live given to a lease whose keeper already sleeps is renewed
/// on the new schedule.
#[test]
fn a_shorter_ttl_given_by_a_manual_renewal_is_renewed_in_time() {
    let scenario = fail::FailScenario::setup();
    let f = sqlite("shorter_ttl_manual");
    // The keeper renews every 4 s; the manual renewal asks for 3 s, which it must renew every
    // second from then on, or lose.
    let registry = f
        .builder()
        .time_to_live(Duration::from_secs(12))
        .build()
        .unwrap();
    let guard = registry.obtain("shorter").unwrap().lock().unwrap();
    let losses = guard.loss_channel();
    wait_until("the keeper renewed once", || {
        registry.statistics().renewals >= 1
    });
    guard.renew_with_ttl(Duration::from_secs(3)).unwrap();
    let lost = renewed_twice_or_lost(&registry, &losses);
    assert!(lost.is_none(), "lost: {lost:?}");
    assert!(guard.is_held());
    guard.unlock().unwrap();
    scenario.teardown();
}

/// A thread that asked for a shorter time-to-live gets the lease from a
/// local holder and keeps it.
#[test]
fn a_shorter_ttl_asked_for_by_the_next_local_holder_is_renewed_in_time() {
    let scenario = fail::FailScenario::setup();
    let f = sqlite("shorter_ttl_handoff");
    // As above: renewals every 4 s for the registry's leases, every second for the next
    // holder's 3 s.
    let registry = f
        .builder()
        .time_to_live(Duration::from_secs(12))
        .build()
        .unwrap();
    let lock = registry.obtain("shorter").unwrap();
    let first = lock.lock().unwrap();
    let next = {
        let (lock, registry) = (lock.clone(), registry.clone());
        thread::spawn(move || {
            let guard = lock.lock_with_ttl(Duration::from_secs(3)).unwrap();
            let losses = guard.loss_channel();
            let lost = renewed_twice_or_lost(&registry, &losses);
            let held = guard.is_held();
            guard
                .unlock()
                .map_err(|e| e.to_string())
                .and(Ok((held, lost)))
        })
    };
    wait_until("the next thread queues", || lock.queued_threads() == 1);
    first.unlock().unwrap();
    let (held, lost) = next.join().unwrap().unwrap();
    assert!(held && lost.is_none(), "lost after the handoff: {lost:?}");
    scenario.teardown();
}

/// A loss callback that panics does not stop the lease clock.
#[test]
fn a_panicking_loss_callback_does_not_stop_loss_reports() {
    let scenario = fail::FailScenario::setup();
    let f = sqlite("panicking_callback");
    let registry = f
        .builder()
        .time_to_live(Duration::from_millis(50))
        .renewal(false)
        .on_lease_lost(|_| panic!("a callback that panics"))
        .build()
        .unwrap();
    let first = registry.obtain("first").unwrap().lock().unwrap();
    let first_losses = first.loss_channel();
    first_losses.recv_timeout(GENEROUS).expect("first loss");
    let second = registry.obtain("second").unwrap().lock().unwrap();
    let second_losses = second.loss_channel();
    let lost = second_losses.recv_timeout(GENEROUS);
    assert!(lost.is_ok(), "the second loss was never reported");
    drop((first, second));
    scenario.teardown();
}

/// A loss that happens while a loss channel is being registered still reaches it.
#[test]
fn a_loss_during_loss_channel_registration_is_delivered() {
    let scenario = fail::FailScenario::setup();
    let f = sqlite("loss_channel_race");
    let (lost_tx, lost_rx) = crossbeam_channel::unbounded::<LeaseLost>();
    let registry = f
        .builder()
        .time_to_live(Duration::from_millis(100))
        .renewal(false)
        .on_lease_lost(move |event| {
            let _ = lost_tx.send(event.clone());
        })
        .build()
        .unwrap();
    let guard = registry.obtain("race").unwrap().lock().unwrap();
    // Registration waits (once) until the loss has been reported.
    let hits = AtomicUsize::new(0);
    fail::cfg_callback("lease::loss_channel", move || {
        if hits.fetch_add(1, Ordering::SeqCst) == 0 {
            let _ = lost_rx.recv_timeout(GENEROUS);
        }
    })
    .unwrap();
    let losses = guard.loss_channel();
    let delivered = losses.recv_timeout(GENEROUS);
    assert!(delivered.is_ok(), "loss channel silent: {delivered:?}");
    drop(guard);
    scenario.teardown();
}

/// A panic inside an acquire leaves the key usable by the other threads.
#[test]
fn a_panic_inside_an_acquire_does_not_wedge_the_key() {
    let scenario = fail::FailScenario::setup();
    let f = sqlite("panic_in_acquire");
    let registry = f.registry();
    let lock = registry.obtain("wedge").unwrap();
    fail::cfg("lock::acquire_before_statement", "1*panic(injected)").unwrap();
    let panicked = {
        let lock = lock.clone();
        thread::spawn(move || lock.lock().map(drop)).join()
    };
    assert!(panicked.is_err(), "the fail point should have panicked");
    let guard = lock
        .try_lock_for(GENEROUS)
        .unwrap()
        .expect("the key is usable after a panic");
    guard.unlock().unwrap();
    let other = f.registry();
    let taken = other.obtain("wedge").unwrap().try_lock().unwrap();
    assert!(taken.is_some(), "the lease was left held after the panic");
    scenario.teardown();
}

/// A handoff to a thread that asked for another time-to-live returns within the
/// caller's deadline, even when renewals are slow.
#[test]
fn a_handoff_with_another_ttl_returns_within_the_callers_deadline() {
    let scenario = fail::FailScenario::setup();
    let f = sqlite("handoff_deadline");
    let registry = f
        .builder()
        .time_to_live(Duration::from_secs(3))
        .build()
        .unwrap();
    let lock = registry.obtain("deadline").unwrap();
    let first = lock.lock().unwrap();
    let next = {
        let lock = lock.clone();
        thread::spawn(move || {
            let asked = Instant::now();
            let taken =
                lock.try_lock_for_with_ttl(Duration::from_millis(300), Duration::from_secs(20));
            let waited = asked.elapsed();
            (
                taken
                    .map(|guard| guard.is_some())
                    .map_err(|e| e.to_string()),
                waited,
            )
        })
    };
    wait_until("the next thread queues", || lock.queued_threads() == 1);
    // Renewals take 30 s; a try for 300 ms must not wait for them (the bound is generous, for
    // a busy machine: far above 300 ms, far below 30 s).
    fail::cfg("backend::renew_sent", "sleep(30000)").unwrap();
    first.unlock().unwrap();
    let (taken, waited) = next.join().unwrap();
    assert_eq!(taken, Ok(true));
    assert!(
        waited < Duration::from_secs(15),
        "a 300 ms try returned after {waited:?}"
    );
    scenario.teardown();
}

/// A grant that arrives after its time-to-live ran out is not returned as held.
#[test]
fn a_grant_that_arrives_expired_is_not_returned() {
    let scenario = fail::FailScenario::setup();
    let f = sqlite("expired_grant");
    let registry = f
        .builder()
        .time_to_live(Duration::from_secs(2))
        .build()
        .unwrap();
    // The first grant arrives after its 2 s; the one lock() returns has 2 s to be checked.
    fail::cfg("backend::acquire_sent", "1*sleep(2500)").unwrap();
    let guard = registry.obtain("late").unwrap().lock().unwrap();
    assert!(guard.is_held(), "lock() returned a lease already over");
    drop(guard);
    scenario.teardown();
}

/// The leader's `is_leader()` follows a loss the lease knows of, even before the
/// election's agent looks.
#[test]
fn is_leader_turns_false_as_soon_as_the_lease_is_lost() {
    let scenario = fail::FailScenario::setup();
    let f = sqlite("leader_loss");
    let election = LeaderElection::builder(f.builder(), "group")
        // The lease outlasts the wait below: only the renewal that finds the row taken over
        // (every 300 ms) can end the leadership in time.
        .lease_duration(Duration::from_secs(30))
        .lock_keep_alive_period(Duration::from_millis(300))
        .build()
        .unwrap();
    let leadership = election.acquire().unwrap();
    assert!(leadership.is_leader());
    fail::cfg("leader::agent_watch", "pause").unwrap();
    // Another holder takes the row over: the next renewal finds it (NotOwner).
    let db = rusqlite::Connection::open(f.sqlite_path()).unwrap();
    let changed = db
        .execute(&format!("UPDATE {} SET CLIENT_ID = 'thief'", f.table()), [])
        .unwrap();
    assert_eq!(changed, 1);
    let until = Instant::now() + GENEROUS;
    while leadership.is_leader() && Instant::now() < until {
        thread::sleep(Duration::from_millis(5));
    }
    let still_leader = leadership.is_leader();
    fail::remove("leader::agent_watch");
    assert!(
        !still_leader,
        "is_leader() stayed true after the lease was lost"
    );
    drop(leadership);
    scenario.teardown();
}

/// A holder that finds its own lease expired when it unlocks reports the loss once,
/// to the callback and to its loss channel.
#[test]
fn a_loss_found_by_unlock_is_reported_once() {
    let scenario = fail::FailScenario::setup();
    let f = sqlite("loss_found_by_unlock");
    let reports = Arc::new(AtomicUsize::new(0));
    let registry = {
        let reports = Arc::clone(&reports);
        f.builder()
            .time_to_live(Duration::from_millis(100))
            .renewal(false)
            .on_lease_lost(move |_| {
                reports.fetch_add(1, Ordering::SeqCst);
            })
            .build()
            .unwrap()
    };
    // The lease clock is held back, as if it had not run yet.
    let clock = Gate::first_at("lease::clock_before_expiry");
    let guard = registry.obtain("paused").unwrap().lock().unwrap();
    let losses = guard.loss_channel();
    clock.wait_entered();
    let unlocked = guard.unlock();
    assert!(
        unlocked.as_ref().is_err_and(|e| e.is_lease_lost()),
        "{unlocked:?}"
    );
    clock.open();
    let event = losses.recv_timeout(GENEROUS);
    assert!(
        matches!(
            &event,
            Ok(LeaseLost {
                reason: LossReason::Expired(_),
                ..
            })
        ),
        "{event:?}"
    );
    // The callback runs on the registry's callback thread, after the loss channel fired.
    wait_until("the callback ran", || reports.load(Ordering::SeqCst) > 0);
    thread::sleep(Duration::from_millis(200));
    assert_eq!(reports.load(Ordering::SeqCst), 1, "reported once");
    scenario.teardown();
}

/// Once granted (by a local handoff), a lock call succeeds even when the renewal
/// with the caller's time-to-live fails; the lease keeps what the database has.
#[test]
fn a_handoff_with_another_ttl_succeeds_even_when_renewals_fail() {
    let scenario = fail::FailScenario::setup();
    let f = sqlite("handoff_renewal_fails");
    let registry = f
        .builder()
        .time_to_live(Duration::from_secs(20))
        .operation_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let lock = registry.obtain("retune").unwrap();
    let first = lock.lock().unwrap();
    let next = {
        let lock = lock.clone();
        thread::spawn(move || {
            let taken = lock.lock_with_ttl(Duration::from_secs(5));
            taken
                .map(|guard| guard.is_held())
                .map_err(|e| e.to_string())
        })
    };
    wait_until("the next thread queues", || lock.queued_threads() == 1);
    fail::cfg("backend::renew_sent", "return").unwrap();
    first.unlock().unwrap();
    assert_eq!(next.join().unwrap(), Ok(true));
    scenario.teardown();
}

/// One renewal statement that does not come back (here held at the fail
/// point before it is sent) held up every other lease of the registry behind the single
/// renewal thread; another lease, due later, was never renewed and ran out.
#[test]
fn a_stuck_renewal_does_not_hold_up_the_registrys_other_leases() {
    let scenario = fail::FailScenario::setup();
    let f = sqlite("stuck_renewal");
    let registry = f
        .builder()
        .time_to_live(Duration::from_secs(6))
        .build()
        .unwrap();
    let stuck_renewal = Gate::first_at("lease::renew_batch_before_statement");
    let stuck = registry
        .obtain("stuck")
        .unwrap()
        .lock_with_ttl(Duration::from_secs(3))
        .unwrap();
    stuck_renewal.wait_entered();
    let before = registry.statistics().renewals;
    let other = registry.obtain("other").unwrap().lock().unwrap();
    wait_until("the other lease is renewed twice", || {
        assert!(
            other.is_held(),
            "the other lease ran out behind the stuck renewal"
        );
        registry.statistics().renewals >= before + 2
    });
    assert!(other.is_held());
    stuck_renewal.open();
    drop(stuck);
    other.unlock().unwrap();
    scenario.teardown();
}

/// After a local handoff to a thread that asked for a shorter
/// time-to-live, the renewal carrying it is sent while the holder still counted the old,
/// longer deadline: the row could run out seconds before the holder gave up. From the moment
/// that renewal may run, the deadline is at most its send instant + the new time-to-live.
#[test]
fn a_handoff_to_a_shorter_ttl_bounds_the_deadline_once_its_renewal_is_sent() {
    let scenario = fail::FailScenario::setup();
    let f = sqlite("shorter_ttl_deadline");
    let registry = f
        .builder()
        .time_to_live(Duration::from_secs(30))
        .build()
        .unwrap();
    let lock = registry.obtain("shorter").unwrap();
    let first = lock.lock().unwrap();
    let (measure, measure_rx) = crossbeam_channel::bounded::<()>(1);
    let next = {
        let lock = lock.clone();
        thread::spawn(move || {
            let guard = lock.lock_with_ttl(Duration::from_secs(3)).unwrap();
            measure_rx.recv_timeout(GENEROUS).unwrap();
            let remaining = guard.remaining();
            drop(guard);
            remaining
        })
    };
    let sent = Gate::first_at("backend::renew_sent");
    wait_until("the next thread queues", || lock.queued_threads() == 1);
    first.unlock().unwrap();
    sent.wait_entered();
    measure.send(()).unwrap();
    let remaining = next.join().unwrap();
    sent.open();
    assert!(
        remaining <= Duration::from_secs(3),
        "the holder counted {remaining:?} more while a renewal setting the row to 3 s was sent"
    );
    scenario.teardown();
}

/// Passes `lock` from this thread to another (a handoff, so the grant is shared) until the
/// other's unlock lingers (no release statement ran for it); see `tests/linger.rs`.
fn make_it_linger(registry: &LockRegistry, lock: &leasehold::Lock) {
    for _ in 0..20 {
        let guard = lock.lock().unwrap();
        let before = registry.statistics().releases;
        let next = {
            let lock = lock.clone();
            thread::spawn(move || lock.lock().unwrap().unlock().unwrap())
        };
        wait_until("the next thread queues", || lock.queued_threads() == 1);
        guard.unlock().unwrap();
        next.join().unwrap();
        if registry.statistics().releases == before {
            return;
        }
    }
    panic!("no unlock lingered in 20 tries");
}

/// The end of a linger runs the key's release statement for the registry. One that waits (a
/// row another session holds locked, a server that stops answering — here held at the fail
/// point before the statement) held up the end of every other key's linger behind it on the
/// registry's linger thread, so that key stayed held on the database for another instance.
#[test]
fn a_release_stuck_at_the_end_of_a_linger_holds_up_no_other_keys_linger() {
    let scenario = fail::FailScenario::setup();
    let f = sqlite("stuck_linger_end");
    let registry = f
        .builder()
        .tuning(leasehold::Tuning {
            linger: Duration::from_secs(1),
            ..Default::default()
        })
        .build()
        .unwrap();
    // Only a release that ends a linger stops here (they run on the registry's linger
    // threads), and only the first.
    let release = Gate::first_at_matching("lock::release_before_statement", || {
        thread::current()
            .name()
            .is_some_and(|name| name.starts_with("leasehold-linger"))
    });
    let stuck = registry.obtain("stuck").unwrap();
    make_it_linger(&registry, &stuck);
    release.wait_entered();
    let other = registry.obtain("other").unwrap();
    make_it_linger(&registry, &other);
    // The other key's linger ends within a second; its row is then free for another instance,
    // while the first key's release still waits.
    let outsider = f.registry();
    let taken = outsider
        .obtain("other")
        .unwrap()
        .try_lock_for(Duration::from_secs(10))
        .unwrap();
    release.open();
    assert!(
        taken.is_some(),
        "the other key stayed held behind the stuck release of the first"
    );
    scenario.teardown();
}

/// A renewal that finds another holder only after the lease's deadline passed reported
/// `NotOwner`, as if the row had been taken while the lease still ran, whenever it noticed
/// before the lease clock did (seen once across a PostgreSQL promotion: the report came 3.7 ms
/// after another instance's normal grant). Here the clock is held back, as if starved, and the
/// renewal waits at a gate across the deadline while another registry takes the expired row:
/// the loss is `Expired`, whichever thread notices first.
#[test]
fn a_renewal_that_finds_another_holder_after_the_deadline_reports_expiry() {
    let scenario = fail::FailScenario::setup();
    let f = sqlite("late_not_owner");
    let registry = f
        .builder()
        .time_to_live(Duration::from_secs(1))
        .build()
        .unwrap();
    // The background renewal is held after its send instant (before the deadline) and before
    // its statement runs.
    let renewal = Gate::first_at("backend::renew_sent");
    let clock = Gate::first_at("lease::clock_before_expiry");
    let guard = registry.obtain("late").unwrap().lock().unwrap();
    let losses = guard.loss_channel();
    renewal.wait_entered();
    clock.wait_entered();
    assert!(guard.remaining().is_zero(), "the clock saw the expiry");
    let other = f.registry();
    let taken = other
        .obtain("late")
        .unwrap()
        .try_lock_for(GENEROUS)
        .unwrap()
        .expect("the expired row is granted to another registry");
    // Only the renewal can report the loss now: it finds the other registry's row.
    renewal.open();
    let event = losses.recv_timeout(GENEROUS);
    clock.open();
    assert!(
        matches!(
            &event,
            Ok(LeaseLost {
                reason: LossReason::Expired(_),
                ..
            })
        ),
        "{event:?}"
    );
    assert!(
        guard.unlock().is_err_and(|e| e.is_lease_lost()),
        "the unlock reports the loss"
    );
    drop(taken);
    scenario.teardown();
}

/// A renewal whose turn began before `unlock_keeping_for` ran after it,
/// matched the kept row and set it to now + TTL: a 60 s keep became 3 s.
#[test]
fn a_renewal_in_flight_does_not_cut_a_kept_row_short() {
    let scenario = fail::FailScenario::setup();
    let f = sqlite("renewal_during_keep");
    let registry = f
        .builder()
        .time_to_live(Duration::from_secs(3))
        .build()
        .unwrap();
    let renewal = Gate::first_at("lease::renew_batch_before_statement");
    let guard = registry.obtain("kept").unwrap().lock().unwrap();
    renewal.wait_entered();
    guard.unlock_keeping_for(Duration::from_secs(60)).unwrap();
    let before = registry.statistics().renewals;
    renewal.open();
    wait_until("the renewal in flight was sent", || {
        registry.statistics().renewals > before
    });
    // The statement has been sent; give it time to run (its outcome is what is checked).
    thread::sleep(Duration::from_millis(500));
    let holder = f
        .registry()
        .holder("kept")
        .unwrap()
        .expect("the row is kept");
    let (now, _) = registry.database_time().unwrap();
    let left = holder.expires_at.duration_since(now).unwrap_or_default();
    assert!(
        left > Duration::from_secs(30),
        "the kept row runs out in {left:?} instead of about 60 s"
    );
    scenario.teardown();
}

/// A statement given up at its caller's deadline (its socket's read times out) discards its
/// connection. r2d2 closes a discarded connection without waking the callers waiting for one or
/// opening one for them: with `pool_size(1)`, a release that began waiting meanwhile waited out
/// its whole deadline (seen one run in three in
/// `conformance::mysql::a_full_pool_does_not_starve_renewals`, after pollers gave up). The
/// statement is held unanswered by another session holding its row locked.
#[cfg(feature = "mysql")]
#[test]
fn a_caller_waiting_for_the_connection_of_an_abandoned_statement_gets_a_new_one() {
    let scenario = fail::FailScenario::setup();
    let Some(f) = Fixture::new(Db::Mysql, "abandoned_connection") else {
        return;
    };
    let registry = f
        .builder()
        .pool_size(1)
        .operation_timeout(GENEROUS)
        .build()
        .unwrap();
    // The row of "abandoned" exists, and another session holds it locked.
    let lock = f.registry().obtain("abandoned").unwrap();
    lock.lock().unwrap().unlock().unwrap();
    let row = RowHeld::on(&f, "abandoned");
    let guard = registry.obtain("mine").unwrap().lock().unwrap();
    // The next acquire's statement waits on that row with the only main connection, until its
    // caller's deadline.
    let (sent, sent_rx) = crossbeam_channel::bounded(1);
    on_reaching("backend::acquire_sent", sent);
    let lock = registry.obtain("abandoned").unwrap();
    let abandoned = thread::spawn(move || {
        let gave_up = lock
            .try_lock_for(Duration::from_secs(5))
            .map(|guard| guard.is_some());
        (gave_up, Instant::now())
    });
    sent_rx
        .recv_timeout(GENEROUS)
        .expect("the acquire was sent");
    // The release (on this thread) asks for that connection meanwhile.
    let (releasing, releasing_rx) = crossbeam_channel::bounded(1);
    on_reaching("lock::release_before_statement", releasing);
    let started =
        thread::spawn(move || releasing_rx.recv_timeout(GENEROUS).map(|()| Instant::now()));
    let released = guard.unlock();
    let release_started = started.join().unwrap().expect("the release started");
    let (gave_up, gave_up_at) = abandoned.join().unwrap();
    row.end();
    assert!(
        !matches!(gave_up, Ok(true)),
        "the acquire was held back: {gave_up:?}"
    );
    assert!(
        release_started < gave_up_at,
        "inconclusive: the release began only after the acquire gave up (a starved machine?)"
    );
    assert!(
        released.is_ok(),
        "the release got no connection: {released:?}"
    );
    scenario.teardown();
}

/// Local handoff of permits: a waiter claims a permit its releasing thread offers,
/// but leaves before its holder sees it queued on the slot's lock (its wait ran out on the way
/// in). The release must go to the database at once: the holder waited for a claimant that
/// would never come, until `operation_timeout`, with its permit held.
#[test]
fn a_claimant_that_leaves_before_queueing_does_not_hold_up_the_release() {
    let scenario = fail::FailScenario::setup();
    let f = sqlite("claimant_leaves");
    let registry = f
        .builder()
        .operation_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let semaphore = registry.semaphore("claimed", 1).unwrap();
    let permit = semaphore.acquire().unwrap();
    let waiter = {
        let semaphore = semaphore.clone();
        thread::spawn(move || semaphore.try_acquire_for(GENEROUS).map(|p| p.is_some()))
    };
    wait_until("the waiter waits", || semaphore.waiting_threads() == 1);
    fail::cfg("semaphore::claim_before_lock", "1*return").unwrap();
    let started = Instant::now();
    permit.unlock().unwrap();
    let took = started.elapsed();
    // Without the fix this took the whole 60 s operation timeout.
    assert!(
        took < Duration::from_secs(30),
        "unlock waited {took:?} for a claimant that had left"
    );
    // The waiter goes on waiting and takes the permit from the database.
    assert!(waiter.join().unwrap().unwrap(), "the waiter got the permit");
    scenario.teardown();
}

/// A waiter's sleeps between attempts are spread around
/// `idle_between_tries` (±25 %), so that it cannot stay in lock-step with another instance
/// that polls at the same interval a few milliseconds before it (Spring Integration's
/// `idleBetweenTries` is 100 ms, like leasehold's default) and takes every release first.
/// Without wake-ups nothing cuts a sleep short: before, no gap between two of a waiter's
/// attempts was shorter than the interval; now about 30 % of them are more than 10 % shorter.
#[test]
fn a_waiters_sleeps_between_attempts_are_spread_around_the_interval() {
    let scenario = fail::FailScenario::setup();
    let f = sqlite("poll_spread");
    let holder = f.registry();
    let guard = holder.obtain("spread").unwrap().lock().unwrap();
    const IDLE: Duration = Duration::from_millis(100);
    let waiter = f
        .builder()
        .idle_between_tries(IDLE)
        .notifications(false)
        .build()
        .unwrap();
    let lock = waiter.obtain("spread").unwrap();
    let attempts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&attempts);
    fail::cfg_callback("lock::acquire_before_statement", move || {
        seen.lock().unwrap().push(Instant::now())
    })
    .unwrap();
    let got = lock.try_lock_for(Duration::from_secs(3)).unwrap();
    fail::remove("lock::acquire_before_statement");
    assert!(got.is_none(), "the key was held all along");
    guard.unlock().unwrap();
    let attempts = attempts.lock().unwrap().clone();
    // The last sleep ends at the caller's deadline: not a full one.
    let gaps: Vec<Duration> = attempts
        .windows(2)
        .map(|pair| pair[1] - pair[0])
        .take(attempts.len().saturating_sub(2))
        .collect();
    assert!(gaps.len() >= 10, "only {} attempts in 3 s", attempts.len());
    let shortest = gaps.iter().min().unwrap();
    assert!(
        *shortest < IDLE.mul_f64(0.9),
        "every one of {} sleeps between attempts lasted the interval or longer (shortest {shortest:?})",
        gaps.len()
    );
    scenario.teardown();
}

/// Runs `work` on a thread named `name` (fail point callbacks pick threads by name).
fn named<T: Send + 'static>(
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> thread::JoinHandle<T> {
    thread::Builder::new()
        .name(name.into())
        .spawn(work)
        .unwrap()
}

fn on_thread(name: &'static str) -> impl Fn() -> bool + Send + Sync + 'static {
    move || thread::current().name() == Some(name)
}

/// A bounded wait for a permit that found every permit held ends in `Ok(None)`, also when the
/// waiter's own first attempt comes so late that its statement runs out of time: here it waited
/// while another thread of its registry polled (and found the permit held), took over polling
/// when that thread gave up, and its statement missed the deadline (forced by a fail point
/// that holds it past it).
#[test]
fn a_bounded_wait_for_a_permit_found_held_times_out_as_none() {
    let scenario = fail::FailScenario::setup();
    let f = sqlite("permit_timeout_none");
    let holder = f.registry();
    let permit = holder.semaphore("busy", 1).unwrap().acquire().unwrap();
    // One round per poller: it then sleeps until its deadline.
    let waiters = f
        .builder()
        .idle_between_tries(Duration::from_secs(600))
        .build()
        .unwrap();
    let semaphore = waiters.semaphore("busy", 1).unwrap();
    let first = {
        let semaphore = semaphore.clone();
        named("first", move || {
            semaphore
                .try_acquire_for(Duration::from_millis(800))
                .map(|p| p.is_some())
        })
    };
    wait_until("the first waiter polls", || {
        semaphore.waiting_threads() == 1
    });
    // The late waiter's statement is held until its deadline has passed.
    let hits = AtomicUsize::new(0);
    fail::cfg_callback("lock::acquire_before_statement", move || {
        if thread::current().name() == Some("late") && hits.fetch_add(1, Ordering::SeqCst) == 0 {
            thread::sleep(Duration::from_millis(2500));
        }
    })
    .unwrap();
    let late = {
        let semaphore = semaphore.clone();
        named("late", move || {
            semaphore
                .try_acquire_for(Duration::from_millis(1500))
                .map(|p| p.is_some())
        })
    };
    assert!(!first.join().unwrap().unwrap(), "the permit was held");
    match late.join().unwrap() {
        Ok(got) => assert!(!got, "the permit was held"),
        Err(e) => panic!("a wait for a permit found held failed instead of timing out: {e}"),
    }
    permit.unlock().unwrap();
    scenario.teardown();
}

/// A bounded write wait that took the write row and then ran out of time in its listing of the
/// readers (held past the deadline by a fail point) ends in `Ok(None)`.
#[test]
fn a_bounded_write_wait_that_runs_out_in_its_listing_times_out_as_none() {
    let scenario = fail::FailScenario::setup();
    let f = sqlite("write_timeout_none");
    let (readers, writers) = (f.registry(), f.registry());
    let read = readers.rw_lock("doc").unwrap().read().unwrap();
    fail::cfg("rwlock::write_before_listing", "sleep(400)").unwrap();
    let outcome = writers
        .rw_lock("doc")
        .unwrap()
        .try_write_for(Duration::from_millis(200));
    fail::remove("rwlock::write_before_listing");
    match outcome {
        Ok(got) => assert!(got.is_none(), "a reader held the lock"),
        Err(e) => panic!("a bounded write wait failed instead of timing out: {e}"),
    }
    read.unlock().unwrap();
    scenario.teardown();
}

/// A blocking `write()` whose write row runs out while it waits for a reader (its process
/// paused past the time-to-live; here its registry renews nothing) was never granted: it goes
/// on waiting, takes the write row again, and gets the lock once the reader leaves.
#[test]
fn a_waiting_writer_whose_claim_runs_out_goes_on_waiting() {
    let scenario = fail::FailScenario::setup();
    let f = sqlite("claim_runs_out");
    let readers = f.registry();
    let paused = f.builder().renewal(false).build().unwrap();
    let read = readers.rw_lock("doc").unwrap().read().unwrap();
    let read_token = read.fencing_token();
    let lock = paused.rw_lock("doc").unwrap();
    let writer = named("writer", move || {
        lock.write_with_ttl(Duration::from_millis(400))
            .map(|guard| guard.fencing_token())
    });
    // Several times the time-to-live: the write row ran out at least twice.
    thread::sleep(Duration::from_millis(1500));
    assert!(
        !writer.is_finished(),
        "the waiting writer returned: {:?}",
        writer.join().unwrap()
    );
    read.unlock().unwrap();
    let token = writer
        .join()
        .unwrap()
        .expect("the writer gets the lock once the reader leaves");
    assert!(token > read_token);
    scenario.teardown();
}

/// Writer preference across a timed-out writer: writer 1 holds the write row and waits for a
/// reader; writer 2 (another instance) waits for the write row, and is held by a fail point
/// before its next attempt. Writer 1's wait ends and it lets the write row go: a new reader
/// still stays out, as writer 2's claim keeps the lock; writer 2 then gets the lock once the
/// first reader leaves.
#[test]
fn a_writer_that_times_out_leaves_no_gap_for_readers() {
    let scenario = fail::FailScenario::setup();
    let f = sqlite("writer_gap");
    let (readers, first, second, late) = (f.registry(), f.registry(), f.registry(), f.registry());
    let read = readers.rw_lock("doc").unwrap().read().unwrap();
    let one = first.rw_lock("doc").unwrap();
    let writer_one = named("writer-one", move || {
        one.try_write_for(Duration::from_millis(1500))
            .map(|got| got.is_some())
    });
    wait_until("writer 1 holds the write row", || {
        readers
            .rw_lock_status("doc")
            .unwrap()
            .held_writer()
            .is_some()
    });
    // Writer 2's third attempt and later ones stop at the gate: its first attempt at the
    // write row and its claim (where there is one) have run by then.
    let hits = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&hits);
    let gate = Gate::first_at_matching("lock::acquire_before_statement", move || {
        on_thread("writer-two")() && seen.fetch_add(1, Ordering::SeqCst) >= 2
    });
    let two = second.rw_lock("doc").unwrap();
    let writer_two = named("writer-two", move || {
        two.write().map(|guard| guard.fencing_token())
    });
    gate.wait_entered();
    assert!(
        !writer_one.join().unwrap().unwrap(),
        "writer 1 timed out: the reader held the lock"
    );
    // The gap: the write row is free, writer 2 has not taken it yet.
    let entered = late.rw_lock("doc").unwrap().try_read().unwrap();
    assert!(
        entered.is_none(),
        "a reader entered while writer 2 waited for the write row"
    );
    gate.open();
    read.unlock().unwrap();
    writer_two
        .join()
        .unwrap()
        .expect("writer 2 gets the lock once the reader leaves");
    scenario.teardown();
}

/// A bounded read wait that found the lock free and then ran out of time in its attempt at a
/// read slot (held past the deadline by a fail point) ends in `Ok(None)`: the database had
/// answered during the wait.
#[test]
fn a_bounded_read_wait_that_runs_out_in_its_slot_attempt_times_out_as_none() {
    let scenario = fail::FailScenario::setup();
    let f = sqlite("read_timeout_none");
    let registry = f.registry();
    let hits = AtomicUsize::new(0);
    fail::cfg_callback("lock::acquire_before_statement", move || {
        if thread::current().name() == Some("reader") && hits.fetch_add(1, Ordering::SeqCst) == 0 {
            thread::sleep(Duration::from_millis(600));
        }
    })
    .unwrap();
    let lock = registry.rw_lock("doc").unwrap();
    let outcome = named("reader", move || {
        lock.try_read_for(Duration::from_millis(300))
            .map(|got| got.is_some())
    })
    .join()
    .unwrap();
    match outcome {
        Ok(got) => assert!(!got, "its only attempt at a slot ran past the deadline"),
        Err(e) => panic!("a bounded read wait failed instead of timing out: {e}"),
    }
    scenario.teardown();
}

/// A named holder's release reaches a waiting instance as soon as the holder lets the key's
/// named lock go, before the waiter's watcher reads the row: with that read held back and
/// polling too rare to matter, the waiter is still granted the lock.
#[cfg(feature = "mysql")]
#[test]
fn a_named_holders_release_wakes_a_waiter_before_the_watcher_reads_the_row() {
    let scenario = fail::FailScenario::setup();
    let Some(f) = Fixture::new(Db::Mysql, "named_release") else {
        return;
    };
    let holder = f.registry();
    let waiter = f
        .builder()
        .idle_between_tries(Duration::from_secs(600))
        .build()
        .unwrap();
    let guard = holder.obtain("named").unwrap().lock().unwrap();
    let (name_held, name_held_rx) = crossbeam_channel::unbounded();
    on_reaching("mysql::watcher_name_held", name_held);
    let (granted, granted_rx) = crossbeam_channel::bounded(1);
    let waiting = thread::spawn(move || {
        let taken = waiter.obtain("named").unwrap().try_lock_for(GENEROUS * 2);
        let _ = granted.send(taken.map(|guard| guard.is_some()));
    });
    // The watcher's `GET_LOCK` timed out: the holder has named its lease.
    name_held_rx
        .recv_timeout(GENEROUS)
        .expect("the waiter's watcher found the key's name held");
    let look = Gate::first_at("mysql::watcher_before_look");
    guard.unlock().unwrap();
    let outcome = granted_rx.recv_timeout(GENEROUS);
    look.open();
    assert!(
        matches!(outcome, Ok(Ok(true))),
        "the waiter was not woken while its watcher's look was held back: {outcome:?}"
    );
    waiting.join().unwrap();
    scenario.teardown();
}

/// A holder without a named lock (Spring Integration's) that deletes its row after the
/// waiter's watcher reported and before it read the row — just after the attempt that report
/// caused was refused — is still reported by that read: the waiter, whose polls are too rare to
/// matter, is granted the lock. The watcher is held before its read until the waiter's
/// attempts since the report have been refused (two refusals, then a pause for an attempt the
/// report caused); on a machine too slow for that pause the attempt comes after the deletion
/// and the test checks less.
#[cfg(feature = "mysql")]
#[test]
fn a_row_deleted_between_a_watchers_report_and_its_read_still_wakes_the_waiter() {
    let scenario = fail::FailScenario::setup();
    let Some(f) = Fixture::new(Db::Mysql, "deleted_before_look") else {
        return;
    };
    let waiter = f
        .builder()
        .idle_between_tries(Duration::from_secs(600))
        .build()
        .unwrap();
    let row = format!(
        "LOCK_KEY = '{}' AND REGION = 'DEFAULT'",
        leasehold::lock_key_for("spring")
    );
    let mut raw = common::raw::Raw::open(&f);
    raw.execute(&format!(
        "INSERT INTO {} (LOCK_KEY, REGION, CLIENT_ID, CREATED_DATE, EXPIRED_AFTER) \
         VALUES ('{}', 'DEFAULT', 'a-spring-instance', UTC_TIMESTAMP(6), \
         UTC_TIMESTAMP(6) + INTERVAL 10 MINUTE)",
        f.table(),
        leasehold::lock_key_for("spring")
    ));
    let look = Gate::first_at("mysql::watcher_before_look");
    let (granted, granted_rx) = crossbeam_channel::bounded(1);
    let waiting = {
        let waiter = waiter.clone();
        thread::spawn(move || {
            let taken = waiter.obtain("spring").unwrap().try_lock_for(GENEROUS * 2);
            let _ = granted.send(taken.map(|guard| guard.is_some()));
        })
    };
    look.wait_entered();
    wait_until("the waiter is refused twice", || {
        waiter.statistics().contended_tries >= 2
    });
    thread::sleep(Duration::from_millis(300));
    assert_eq!(
        raw.execute(&format!("DELETE FROM {} WHERE {row}", f.table())),
        1
    );
    look.open();
    let outcome = granted_rx.recv_timeout(GENEROUS);
    assert!(
        matches!(outcome, Ok(Ok(true))),
        "the deletion after the watcher's report never reached the waiter: {outcome:?}"
    );
    waiting.join().unwrap();
    scenario.teardown();
}

/// A writer that waits for a reader while its write row runs out (its renewals fail, as in a
/// process paused past its time-to-live) was granted nothing: it claims again, and the
/// registry's loss callback does not run for it. A plain lock of the same registry that runs
/// out afterwards is reported, so the callback thread has got past the writer's loss. Once the
/// write side is granted, its loss is reported.
#[test]
fn a_writer_whose_claim_runs_out_while_it_waits_reports_no_loss() {
    let scenario = fail::FailScenario::setup();
    let f = sqlite("claim_runs_out");
    let readers = f
        .builder()
        .time_to_live(Duration::from_secs(120))
        .build()
        .unwrap();
    let reported = Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let writers = {
        let reported = Arc::clone(&reported);
        f.builder()
            .time_to_live(Duration::from_millis(300))
            .on_lease_lost(move |lost| reported.lock().push(lost.key.clone()))
            .build()
            .unwrap()
    };
    let reading = readers.rw_lock("doc").unwrap().read().unwrap();
    let (waiting, waiting_rx) = crossbeam_channel::unbounded();
    on_reaching("rwlock::write_waits_for_readers", waiting);
    let writer = writers.rw_lock("doc").unwrap();
    let (granted, granted_rx) = crossbeam_channel::bounded(1);
    let writing = thread::spawn(move || {
        let guard = writer
            .try_write_for(GENEROUS * 2)
            .map_err(|e| e.to_string())?
            .ok_or("the write side was not granted")?;
        let _ = granted.send(());
        let until = Instant::now() + GENEROUS;
        while guard.is_held() && Instant::now() < until {
            thread::sleep(Duration::from_millis(10));
        }
        Ok::<bool, String>(!guard.is_held())
    });
    waiting_rx
        .recv_timeout(GENEROUS)
        .expect("the writer holds the write row and waits for the reader");
    fail::cfg("backend::renew_sent", "return").unwrap();
    // The first write row ran out: the writer claimed again.
    wait_until("the writer claims again", || {
        writers.statistics().grants >= 2
    });
    let sentinel = writers.obtain("sentinel").unwrap().lock().unwrap();
    wait_until("the sentinel's loss is reported", || {
        reported.lock().iter().any(|key| key == "sentinel")
    });
    assert!(
        !reported.lock().iter().any(|key| key == "doc"),
        "a claim that ran out was reported lost: {:?}",
        reported.lock()
    );
    drop(sentinel);
    fail::cfg("backend::renew_sent", "off").unwrap();
    drop(reading);
    granted_rx
        .recv_timeout(GENEROUS)
        .expect("the write side is granted once the reader left");
    fail::cfg("backend::renew_sent", "return").unwrap();
    assert_eq!(writing.join().unwrap(), Ok(true), "the write side ran out");
    wait_until("the write side's loss is reported", || {
        reported.lock().iter().any(|key| key == "doc")
    });
    scenario.teardown();
}

/// A registry granted a key from its place in the waiting line gives the place up in the
/// background (SQLite, MySQL), and sends no acquire of the key until it has: its old place,
/// still in the line, must not put it ahead of an instance that waits there. A waits in line,
/// then B; A is granted and lets go while its leaving is held at `backend::leave_line`; A's
/// next wait must not get the key past B, whose place is the earliest live one but A's.
#[test]
fn a_registry_leaving_the_line_does_not_take_the_key_ahead_of_one_in_line() {
    let scenario = fail::FailScenario::setup();
    let f = sqlite("leaving_line");
    let place_of = |registry: &LockRegistry| {
        let conn = rusqlite::Connection::open(f.sqlite_path()).unwrap();
        conn.busy_timeout(GENEROUS).unwrap();
        let sql = format!(
            "SELECT count(*) FROM {}_QUEUE WHERE CLIENT_ID = ?1",
            f.table()
        );
        let count: i64 = conn
            .query_row(&sql, [registry.client_id()], |row| row.get(0))
            .unwrap();
        count > 0
    };
    let holder = f.registry();
    // A polls often; B's polls come 30 s or more apart, so it sends nothing in the window.
    let a = f
        .builder()
        .notifications(false)
        .idle_between_tries(Duration::from_millis(50))
        .build()
        .unwrap();
    let b = f
        .builder()
        .notifications(false)
        .idle_between_tries(Duration::from_secs(60))
        .build()
        .unwrap();
    let held = holder.obtain("line").unwrap().lock().unwrap();
    let leaving = Gate::first_at("backend::leave_line");
    let a_waits = {
        let lock = a.obtain("line").unwrap();
        thread::spawn(move || {
            let guard = lock
                .try_lock_for(GENEROUS)
                .unwrap()
                .expect("A is first in line");
            guard.unlock().unwrap();
            // A's place is being left (held at the gate): B waits in line.
            let again = lock.try_lock_for(Duration::from_secs(2)).unwrap();
            again.map(|guard| guard.unlock().unwrap()).is_some()
        })
    };
    wait_until("A has a place in line", || place_of(&a));
    // B's place comes after A's on the database clock.
    thread::sleep(Duration::from_millis(5));
    let b_waits = {
        let lock = b.obtain("line").unwrap();
        // Longer than its next poll: a waiter takes a place only when it will poll again.
        thread::spawn(move || {
            lock.try_lock_for(Duration::from_secs(600))
                .map(|guard| guard.is_some())
        })
    };
    wait_until("B has a place in line", || place_of(&b));
    held.unlock().unwrap();
    leaving.wait_entered();
    let a_again = a_waits.join().unwrap();
    leaving.open();
    b.close();
    let _ = b_waits.join().unwrap();
    assert!(
        !a_again,
        "A, leaving the line, took the key again ahead of B, which waited in line"
    );
    scenario.teardown();
}

/// A thread that ends its registry's turn on a key and asks for it again at once comes after
/// the registry's threads already waiting for it: only the oldest waiter polls the database,
/// so threads of one registry are granted the key in the order they asked, across the turn's
/// end as within it.
#[test]
fn a_thread_that_ends_a_turn_and_asks_again_comes_after_those_waiting() {
    let _scenario = fail::FailScenario::setup();
    let f = sqlite("fifo_across_a_turn_end");
    let registry = Arc::new(
        f.builder()
            .tuning(leasehold::Tuning {
                turn_limit: Some(Duration::from_millis(1)),
                ..Default::default()
            })
            .build()
            .unwrap(),
    );
    let lock = registry.obtain("fifo").unwrap();
    let guard = lock.lock().unwrap();
    let queued = Arc::new(AtomicUsize::new(0));
    {
        let queued = Arc::clone(&queued);
        fail::cfg_callback("lock::queued", move || {
            queued.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    }
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let waiter = {
        let (registry, order) = (Arc::clone(&registry), Arc::clone(&order));
        thread::Builder::new()
            .name("waiter".into())
            .spawn(move || {
                let guard = registry.obtain("fifo").unwrap().lock().unwrap();
                order.lock().unwrap().push("waiter");
                guard.unlock().unwrap();
            })
            .unwrap()
    };
    wait_until("the waiter queues", || queued.load(Ordering::SeqCst) == 1);
    // Once woken, the waiter runs again only after a while, as on a busy machine: the
    // releaser, asking again at once, is the first to look at the free key.
    fail::cfg_callback("lock::waiter_woken", || {
        if thread::current().name() == Some("waiter") {
            thread::sleep(Duration::from_millis(100));
        }
    })
    .unwrap();
    // Past the turn's length, with a thread waiting: the release ends the turn (the row goes
    // back to the database, reserved for pollers) and wakes the waiter.
    thread::sleep(Duration::from_millis(5));
    guard.unlock().unwrap();
    let again = lock.lock().unwrap();
    order.lock().unwrap().push("releaser");
    again.unlock().unwrap();
    waiter.join().unwrap();
    assert!(
        registry.statistics().turns_ended >= 1,
        "the release ended the turn"
    );
    assert_eq!(*order.lock().unwrap(), ["waiter", "releaser"]);
}
