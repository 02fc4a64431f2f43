//! Lingering releases (`Tuning::linger`): a key whose grant has passed between threads of its
//! registry, released while none of them queues on it, stays held for a short while, so that a
//! thread of the registry coming for it takes it without a statement. On every backend: the
//! re-take costs no statement and keeps the grant; a key one thread uses never lingers;
//! another instance still gets the key within the turn bound; a lease lost while it lingers is
//! never handed on; dropping the registry releases the row.
//!
//! Timing-robust: the linger of these tests is the longest accepted (1 s), and a step that a
//! stalled machine may miss (a linger that ran out before the thread came) is tried again.

mod common;

mod suite {
    use crate::common::Fixture;
    use leasehold::{Lock, LockRegistry};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::thread;
    use std::time::{Duration, Instant};

    const LINGER: Duration = Duration::from_secs(1);

    /// A registry whose locks linger for [`LINGER`].
    fn lingering(f: &Fixture) -> LockRegistry {
        f.builder()
            .tuning(leasehold::Tuning {
                linger: LINGER,
                ..Default::default()
            })
            .build()
            .unwrap()
    }

    /// Passes `lock` from this thread to another one (a handoff: the grant is shared), whose
    /// unlock then finds nobody queued and lingers (the registry ran no release statement
    /// for it); returns that grant's fencing token.
    fn make_it_linger(registry: &LockRegistry, lock: &Lock) -> u64 {
        for _ in 0..20 {
            let guard = lock.lock().unwrap();
            let token = guard.fencing_token();
            let before = registry.statistics().releases;
            let next = {
                let lock = lock.clone();
                thread::spawn(move || lock.lock().unwrap().unlock().unwrap())
            };
            while lock.queued_threads() == 0 {
                thread::sleep(Duration::from_millis(1));
            }
            guard.unlock().unwrap();
            next.join().unwrap();
            if registry.statistics().releases == before {
                return token;
            }
            // Past the linger already (a stalled machine): let it run out, and try again.
            thread::sleep(LINGER + Duration::from_millis(200));
        }
        panic!("no unlock after a handoff lingered in 20 tries");
    }

    /// One thread locking a key in a loop keeps the plain release: the row is free between
    /// its holds, for other instances and outside observers alike.
    pub fn a_key_one_thread_locks_in_a_loop_does_not_linger(f: &Fixture) {
        let registry = lingering(f);
        let lock = registry.obtain("one-thread").unwrap();
        let before = registry.statistics();
        for _ in 0..5 {
            lock.lock().unwrap().unlock().unwrap();
        }
        let after = registry.statistics();
        assert_eq!(after.releases, before.releases + 5);
        assert!(f
            .registry()
            .obtain("one-thread")
            .unwrap()
            .try_lock()
            .unwrap()
            .is_some());
    }

    pub fn a_lingering_lease_is_retaken_by_a_local_thread_without_a_statement(f: &Fixture) {
        let registry = lingering(f);
        let lock = registry.obtain("hot").unwrap();
        let mut retaken = false;
        for _ in 0..10 {
            let token = make_it_linger(&registry, &lock);
            let before = registry.statistics();
            let other = lock.clone();
            let (again, held) = thread::spawn(move || {
                let guard = other.lock().unwrap();
                let held = guard.is_held();
                (guard.fencing_token(), held)
            })
            .join()
            .unwrap();
            let after = registry.statistics();
            assert!(held);
            // A thread stalled past the linger takes the key from the database: try again.
            if after.acquires == before.acquires {
                assert_eq!(again, token, "a re-take from a linger is the same grant");
                assert_eq!(after.grants, before.grants);
                assert_eq!(after.local_handoffs, before.local_handoffs + 1);
                retaken = true;
                break;
            }
        }
        assert!(
            retaken,
            "no lingering lease was re-taken without a statement"
        );
        // The last unlock (the spawned thread's guard, dropped) lingers too, and nobody comes:
        // the registry releases the row when the linger runs out.
        let other = f.registry();
        let guard = other
            .obtain("hot")
            .unwrap()
            .try_lock_for(LINGER + Duration::from_secs(10))
            .unwrap();
        assert!(guard.is_some(), "a linger that ran out released the row");
    }

    pub fn linger_zero_releases_at_every_unlock(f: &Fixture) {
        let registry = f
            .builder()
            .tuning(leasehold::Tuning {
                linger: Duration::ZERO,
                ..Default::default()
            })
            .build()
            .unwrap();
        let lock = registry.obtain("cold").unwrap();
        let before = registry.statistics();
        for _ in 0..5 {
            // A handoff, then an unlock with nobody queued: released at once.
            let guard = lock.lock().unwrap();
            let next = {
                let lock = lock.clone();
                thread::spawn(move || lock.lock().unwrap().unlock().unwrap())
            };
            while lock.queued_threads() == 0 {
                thread::sleep(Duration::from_millis(1));
            }
            guard.unlock().unwrap();
            next.join().unwrap();
        }
        let after = registry.statistics();
        assert_eq!(after.releases, before.releases + 5);
        assert_eq!(after.local_handoffs, before.local_handoffs + 5);
    }

    /// Two threads of instance A lock and unlock a key as fast as they can — a release either
    /// hands the key to the other thread or lingers and is taken again at once, so the row is
    /// never free — while B asks for the key now and then. A's turn ends at `turn_limit` (its
    /// grant was shared), so B gets the key within the bound.
    pub fn another_instance_gets_a_key_kept_by_lingers_within_the_turn_bound(f: &Fixture) {
        kept_by_lingers(f, true);
    }

    /// The same with every instance polling (no wake-ups, as Spring's instances do): the row
    /// is free for B only while A stays away after its turn (a plain release at the end of A's
    /// turn would leave B a gap of one statement between A's release and A's next grant, which
    /// a poll every 50 ms almost never hits).
    pub fn a_polling_instance_gets_a_key_kept_by_lingers_within_the_turn_bound(f: &Fixture) {
        kept_by_lingers(f, false);
    }

    fn kept_by_lingers(f: &Fixture, notifications: bool) {
        const LIMIT: Duration = Duration::from_millis(300);
        const IDLE: Duration = Duration::from_millis(50);
        const BUSY_MACHINE: Duration = Duration::from_secs(4);
        let builder = || {
            f.builder()
                .idle_between_tries(IDLE)
                .tuning(leasehold::Tuning {
                    turn_limit: Some(LIMIT),
                    ..Default::default()
                })
                .notifications(notifications)
        };
        let (a, b) = (builder().build().unwrap(), builder().build().unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let hogs: Vec<_> = (0..2)
            .map(|_| {
                let lock = a.obtain("kept").unwrap();
                let stop = Arc::clone(&stop);
                thread::spawn(move || {
                    let started = Instant::now();
                    while !stop.load(Ordering::SeqCst)
                        && started.elapsed() < Duration::from_secs(60)
                    {
                        lock.lock().unwrap().unlock().unwrap();
                    }
                })
            })
            .collect();
        let bound = LIMIT + 2 * IDLE + 2 * IDLE;
        let lock = b.obtain("kept").unwrap();
        let mut waits = Vec::new();
        for _ in 0..3 {
            thread::sleep(Duration::from_millis(200));
            let asked = Instant::now();
            let guard = lock.try_lock_for(3 * bound + BUSY_MACHINE).unwrap();
            waits.push(asked.elapsed());
            assert!(
                guard.is_some(),
                "B waited {:?} for a key A kept by lingers (bound {bound:?}); waits {waits:?}",
                asked.elapsed()
            );
        }
        stop.store(true, Ordering::SeqCst);
        for hog in hogs {
            hog.join().unwrap();
        }
        let stats = a.statistics();
        println!(
            "{:?} notifications={notifications}: B waited {waits:?} (bound {bound:?}); A: {} \
             grants, {} local re-takes",
            f.db, stats.grants, stats.local_handoffs
        );
        assert!(
            stats.local_handoffs > stats.grants,
            "A's unlocks lingered: {stats:?}"
        );
    }

    pub fn a_lease_lost_while_it_lingers_is_not_handed_to_a_later_locker(f: &Fixture) {
        const TTL: Duration = Duration::from_millis(100);
        let registry = f
            .builder()
            .tuning(leasehold::Tuning {
                linger: LINGER,
                ..Default::default()
            })
            .renewal(false)
            .time_to_live(TTL)
            .build()
            .unwrap();
        let lock = registry.obtain("lost-while-lingering").unwrap();
        for _ in 0..10 {
            let token = make_it_linger(&registry, &lock);
            let lingered_at = Instant::now();
            // Not renewed: the lease runs out while it lingers.
            thread::sleep(TTL * 2);
            let guard = lock.lock().unwrap();
            assert!(guard.is_held(), "a later locker got a lease that is over");
            assert!(
                guard.fencing_token() > token,
                "a lost lease was handed on from its linger"
            );
            let stats = registry.statistics();
            assert!(stats.leases_lost_expired >= 1, "{stats:?}");
            guard.unlock().unwrap();
            // A stalled thread may have found the linger already ended: try again.
            if lingered_at.elapsed() < LINGER {
                return;
            }
        }
        panic!("the machine never ran the locker within the linger");
    }

    pub fn dropping_the_registry_releases_a_lingering_key(f: &Fixture) {
        let other = f.registry();
        for _ in 0..10 {
            let registry = lingering(f);
            let lock = registry.obtain("dropped").unwrap();
            make_it_linger(&registry, &lock);
            let lingered_at = Instant::now();
            drop(lock);
            drop(registry);
            let free = other.obtain("dropped").unwrap().try_lock().unwrap();
            // Within the linger the row is free only because the drop released it.
            if lingered_at.elapsed() < LINGER {
                assert!(
                    free.is_some(),
                    "the row stayed held after its registry was dropped"
                );
                return;
            }
        }
        panic!("the machine never dropped the registry within the linger");
    }
}

macro_rules! linger {
    ($db:expr) => {
        crate::suite_for!($db;
            a_lingering_lease_is_retaken_by_a_local_thread_without_a_statement,
            a_key_one_thread_locks_in_a_loop_does_not_linger,
            linger_zero_releases_at_every_unlock,
            another_instance_gets_a_key_kept_by_lingers_within_the_turn_bound,
            a_polling_instance_gets_a_key_kept_by_lingers_within_the_turn_bound,
            a_lease_lost_while_it_lingers_is_not_handed_to_a_later_locker,
            dropping_the_registry_releases_a_lingering_key,
        );
    };
}

#[cfg(feature = "sqlite")]
mod sqlite {
    linger!(crate::common::Db::Sqlite);
}

#[cfg(feature = "postgres")]
mod postgres {
    linger!(crate::common::Db::Postgres);
}

#[cfg(feature = "mysql")]
mod mysql {
    linger!(crate::common::Db::Mysql);
}
