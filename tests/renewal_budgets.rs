//! How long a renewal attempt may last depends only on the leases it carries and on the nominal
//! slack of the others, never on how late another lease already is: a lease that ran late is
//! lost on its own, and the leases renewed in the same statement are renewed.
//!
//! Fail points pin the interleaving; one scenario at a time (fail points are the process's).

#![cfg(all(feature = "failpoints", feature = "sqlite"))]

mod common;

use common::gates::{wait_until, Gate, GENEROUS};
use common::{Db, Fixture};
use leasehold::LossReason;
use std::time::Duration;

/// Two leases of one time-to-live (6 s, renewed every 2 s) travel in one renew statement: `late`,
/// whose renewal fell due seconds ago and which has well under half a renewal period left, and
/// `on_time`, whose renewal just fell due. The lease clock is held (as on a starved machine)
/// until `late` has less than 0.7 s left, so that it hands both over together; the worker is
/// then held before the statement until `late`'s deadline has passed. `late` is lost — its
/// renewal was not confirmed before its deadline — and `on_time` is renewed by that statement:
/// the attempt's time does not end at the deadline of a lease that is already gone.
#[test]
fn a_late_lease_does_not_cut_short_the_renewal_of_the_lease_sent_with_it() {
    let scenario = fail::FailScenario::setup();
    let f = Fixture::new(Db::Sqlite, "late_lease_batch").expect("SQLite fixture");
    let ttl = Duration::from_secs(6);
    let registry = f
        .builder()
        .time_to_live(ttl)
        .tuning(leasehold::Tuning {
            renewal_pool_size: 1,
            ..leasehold::Tuning::default()
        })
        .build()
        .unwrap();
    // Another registry's unrenewed lease runs out first: the lease clock stops at the gate
    // before it reports it, and hands nothing over until the gate opens.
    let clock = Gate::first_at("lease::clock_before_expiry");
    let bait_registry = f
        .builder()
        .renewal(false)
        .time_to_live(Duration::from_millis(300))
        .build()
        .unwrap();
    let bait = bait_registry.obtain("bait").unwrap().lock().unwrap();
    let late = registry.obtain("late").unwrap().lock().unwrap();
    let late_losses = late.loss_channel();
    clock.wait_entered();
    // Due a second after `late` (which is due 2 s after its grant).
    std::thread::sleep(Duration::from_secs(1));
    let on_time = registry.obtain("on-time").unwrap().lock().unwrap();
    let on_time_losses = on_time.loss_channel();
    let statement = Gate::first_at("lease::renew_batch_before_statement");
    wait_until("the late lease has less than 0.7 s left", || {
        late.remaining() < Duration::from_millis(700)
    });
    assert!(
        late.is_held(),
        "the late lease ran out before the clock went on"
    );
    let before = registry.statistics();
    clock.open();
    statement.wait_entered();
    wait_until("the late lease's deadline has passed", || !late.is_held());
    let on_time_left = on_time.remaining();
    statement.open();
    wait_until("the statement carrying both leases is recorded", || {
        let now = registry.statistics();
        now.leases_renewed + now.renewals_failed > before.leases_renewed + before.renewals_failed
            || on_time.remaining() > on_time_left + Duration::from_millis(500)
    });
    let after = registry.statistics();
    assert!(
        on_time.remaining() > on_time_left + Duration::from_millis(500),
        "the lease renewed with a late one was not renewed ({:?} left, {:?} before; {} \
         renewals failed)",
        on_time.remaining(),
        on_time_left,
        after.renewals_failed - before.renewals_failed
    );
    assert_eq!(
        after.renewals_failed, before.renewals_failed,
        "renewals failed"
    );
    let lost = late_losses
        .recv_timeout(GENEROUS)
        .expect("the late lease's loss");
    assert!(
        matches!(lost.reason, LossReason::Expired(_)),
        "{:?}",
        lost.reason
    );
    assert!(
        on_time_losses.try_recv().is_err(),
        "the on-time lease was lost"
    );
    assert!(on_time.is_held());
    on_time.unlock().unwrap();
    assert!(late.unlock().is_err_and(|e| e.is_lease_lost()));
    drop(bait);
    scenario.teardown();
}

/// A renewal sent in time whose answer is recorded only after the lease's deadline (the
/// worker held between the two, as on a starved machine) leaves the lease lost: `is_held()`
/// said so from the deadline on, and never says otherwise later. The worker reports the loss
/// itself when it records the answer, as expired, even while the lease clock is held and
/// cannot.
#[test]
fn an_answer_after_the_deadline_does_not_revive_the_lease_and_reports_its_loss() {
    let scenario = fail::FailScenario::setup();
    let f = Fixture::new(Db::Sqlite, "answer_after_deadline").expect("SQLite fixture");
    let registry = f
        .builder()
        .time_to_live(Duration::from_secs(6))
        .build()
        .unwrap();
    let record = Gate::first_at("lease::renew_batch_before_record");
    let guard = registry.obtain("slow").unwrap().lock().unwrap();
    let losses = guard.loss_channel();
    // The first renewal (2 s after the grant) was sent and renewed the row; its answer waits.
    record.wait_entered();
    let clock = Gate::first_at("lease::clock_before_expiry");
    let bait_registry = f
        .builder()
        .renewal(false)
        .time_to_live(Duration::from_millis(300))
        .build()
        .unwrap();
    let bait = bait_registry.obtain("bait").unwrap().lock().unwrap();
    clock.wait_entered();
    wait_until("the lease's deadline has passed", || !guard.is_held());
    record.open();
    let mut lost = None;
    wait_until("the answer is recorded", || {
        lost = losses.try_recv().ok();
        lost.is_some() || guard.is_held()
    });
    assert!(
        !guard.is_held(),
        "the lease is held again ({:?} left) after its deadline passed",
        guard.remaining()
    );
    let lost = lost.expect("the loss");
    assert!(
        matches!(lost.reason, LossReason::Expired(_)),
        "{:?}",
        lost.reason
    );
    clock.open();
    assert!(guard.unlock().is_err_and(|e| e.is_lease_lost()));
    drop(bait);
    scenario.teardown();
}

/// With every worker busy, the next statement carries the queued leases whose deadline comes
/// first, not those whose renewal fell due first. One renewal worker (`renewal_pool_size` 1) is
/// held in the statement of a lease `x` while two more are queued: `roomy` (time-to-live 6 s),
/// whose renewal falls due first, and `urgent` (3 s, granted 2.5 s later), due 1.5 s after it
/// but with the earlier deadline. Once both are due and the worker goes on, its next statement
/// renews `urgent`: taken by due time it would renew `roomy` first, and under a backlog a lease
/// whose renewal waited — or whose attempt failed and is retried — would wait behind leases
/// with more time left until it ran out.
#[test]
fn a_busy_renewer_sends_the_queued_lease_with_the_earliest_deadline_first() {
    let scenario = fail::FailScenario::setup();
    let f = Fixture::new(Db::Sqlite, "earliest_deadline").expect("SQLite fixture");
    let registry = f
        .builder()
        .time_to_live(Duration::from_secs(6))
        .tuning(leasehold::Tuning {
            renewal_pool_size: 1,
            ..leasehold::Tuning::default()
        })
        .build()
        .unwrap();
    let queued = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    {
        let queued = std::sync::Arc::clone(&queued);
        fail::cfg_callback("lease::renewer_queued", move || {
            queued.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        })
        .unwrap();
    }
    // The statement of `x` (due 2 s after its grant) holds the only worker.
    let x_statement = Gate::first_at("lease::renew_batch_before_statement");
    let x = registry.obtain("x").unwrap().lock().unwrap();
    wait_until("x is queued", || {
        queued.load(std::sync::atomic::Ordering::SeqCst) >= 1
    });
    x_statement.wait_entered();
    let roomy = registry.obtain("roomy").unwrap().lock().unwrap();
    std::thread::sleep(Duration::from_millis(2_500));
    let urgent = registry
        .obtain("urgent")
        .unwrap()
        .lock_with_ttl(Duration::from_secs(3))
        .unwrap();
    assert!(
        urgent.remaining() < roomy.remaining(),
        "urgent's deadline comes first"
    );
    // Held at the statement after next: by then exactly one statement has run since `x`'s.
    let third = {
        let hits = std::sync::atomic::AtomicUsize::new(0);
        Gate::first_at_matching("lease::renew_batch_before_statement", move || {
            hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 1
        })
    };
    // `roomy` is due 2 s after its grant, `urgent` 1 s after its own (2.5 s later): both are
    // queued (two hand-overs after `x`'s) and due before the worker goes on.
    wait_until("both leases are queued and due", || {
        queued.load(std::sync::atomic::Ordering::SeqCst) >= 3
            && urgent.remaining() < Duration::from_millis(1_900)
    });
    let (roomy_left, urgent_left) = (roomy.remaining(), urgent.remaining());
    assert!(roomy.is_held() && urgent.is_held());
    x_statement.open();
    third.wait_entered();
    let (roomy_renewed, urgent_renewed) = (
        roomy.remaining() > roomy_left,
        urgent.remaining() > urgent_left,
    );
    third.open();
    assert!(
        urgent_renewed && !roomy_renewed,
        "the statement after x's renewed {} (urgent {:?} left before, {:?} now; roomy {:?} \
         before, {:?} now)",
        match (urgent_renewed, roomy_renewed) {
            (true, true) => "both",
            (true, false) => "urgent",
            (false, true) => "roomy, the lease with more time left",
            (false, false) => "neither",
        },
        urgent_left,
        urgent.remaining(),
        roomy_left,
        roomy.remaining()
    );
    for guard in [x, roomy, urgent] {
        guard.unlock().unwrap();
    }
    scenario.teardown();
}
