//! A renewal attempt bounds the wait of every lease queued behind it, not only its own leases:
//! a statement of long-lived leases that gets no answer (a hung server) holds back a short-lived
//! lease for half that lease's slack at most, never past its deadline.
//!
//! A fail point makes every renewal attempt whose deadline is far enough ahead get no answer
//! until its deadline, on SQLite (what hangs is the shared retry loop, not the database). One
//! test per binary: fail points are the process's.

#![cfg(feature = "failpoints")]

mod common;

use common::{Db, Fixture};
use std::time::{Duration, Instant};

/// One renewal worker (`Tuning::renewal_pool_size` 1). A 3 s lease is renewed every second; a 30 s
/// lease's first renewal, 10 s after its grant, hangs for as long as its attempt may last.
/// Bounded by the 30 s lease alone (5 s, half its renewal period) it held the worker past the
/// 3 s lease's deadline; bounded by the 3 s lease's slack too (2 s, so 1 s), the 3 s lease is
/// renewed in time, again and again.
#[test]
fn a_hung_renewal_of_long_leases_does_not_hold_a_short_lease_past_its_deadline() {
    let scenario = fail::FailScenario::setup();
    let f = Fixture::new(Db::Sqlite, "hung_long_renewal").expect("SQLite fixture");
    let registry = f
        .builder()
        .tuning(leasehold::Tuning {
            renewal_pool_size: 1,
            ..leasehold::Tuning::default()
        })
        .time_to_live(Duration::from_secs(3))
        .build()
        .unwrap();
    let short = registry.obtain("short").unwrap().lock().unwrap();
    let short_losses = short.loss_channel();
    let long = registry
        .obtain("long")
        .unwrap()
        .lock_with_ttl(Duration::from_secs(30))
        .unwrap();
    let granted = Instant::now();
    // Attempts of the 3 s lease may last 0.5 s (half its period) and never hang; the 30 s
    // lease's attempts last longer and hang until their deadline.
    fail::cfg("backend::renewal_hangs", "return(700)").unwrap();
    let until = granted + Duration::from_secs(18);
    while Instant::now() < until {
        if let Ok(lost) = short_losses.try_recv() {
            panic!(
                "the 3 s lease was lost {:?} after the 30 s lease's grant: {:?}",
                granted.elapsed(),
                lost.reason
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(short.is_held());
    fail::remove("backend::renewal_hangs");
    short.unlock().unwrap();
    drop(long);
    scenario.teardown();
}
