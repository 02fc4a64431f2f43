//! Many leases, few connections (issue 12): one registry holds thousands of locks across
//! several renewals and loses none, renewing them in batches rather than one statement each,
//! on every backend.

mod common;

mod suite {
    use crate::common::Fixture;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    const LEASES: usize = 2_000;

    pub fn thousands_of_held_leases_are_renewed_in_batches_and_none_is_lost(f: &Fixture) {
        let lost = Arc::new(AtomicUsize::new(0));
        let ttl = Duration::from_secs(3);
        let registry = {
            let lost = Arc::clone(&lost);
            f.builder()
                .time_to_live(ttl)
                .on_lease_lost(move |_| {
                    lost.fetch_add(1, Ordering::SeqCst);
                })
                .build()
                .unwrap()
        };
        let guards: Vec<_> = (0..LEASES)
            .map(|n| {
                registry
                    .obtain(&format!("entity-{n}"))
                    .unwrap()
                    .lock()
                    .unwrap()
            })
            .collect();
        let held_since = Instant::now();
        let before = registry.statistics().renewals;
        // Three renewal periods (a third of the time-to-live each) after the last grant.
        std::thread::sleep(ttl + Duration::from_millis(200));
        let renewals = registry.statistics().renewals - before;
        let still_held = guards.iter().filter(|guard| guard.is_held()).count();
        println!(
            "{:?}: {LEASES} leases held {:?}: {renewals} renew statements, {still_held} held, {} lost",
            f.db,
            held_since.elapsed(),
            lost.load(Ordering::SeqCst)
        );
        assert_eq!(lost.load(Ordering::SeqCst), 0, "leases lost");
        assert_eq!(still_held, LEASES);
        // Each lease was due about three times; batches make that far fewer statements.
        assert!(
            renewals < LEASES as u64,
            "{renewals} renew statements for {LEASES} leases"
        );
        let unlocked = guards
            .into_iter()
            .map(|guard| guard.unlock())
            .filter(Result::is_err)
            .count();
        assert_eq!(unlocked, 0, "unlocks that found the lease lost");
    }
}

crate::suite_for!(crate::common::Db::Sqlite; thousands_of_held_leases_are_renewed_in_batches_and_none_is_lost);

#[cfg(feature = "postgres")]
mod postgres {
    crate::suite_for!(crate::common::Db::Postgres; thousands_of_held_leases_are_renewed_in_batches_and_none_is_lost);
}

#[cfg(feature = "mysql")]
mod mysql {
    crate::suite_for!(crate::common::Db::Mysql; thousands_of_held_leases_are_renewed_in_batches_and_none_is_lost);
}
