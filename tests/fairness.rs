//! Fair turns between instances (issue 16): with a few instances contending for one key, each
//! gets the lock within a bound, on every backend, with and without release notifications.
//!
//! Instances are registries of their own (their own connections, client ids and listeners),
//! each with two threads running the workload of `common/turns.rs`. The bound of the docs
//! (`RegistryBuilder::turn_window`) is (N − 1) × (`local_handoff_limit` + `turn_window` + a
//! couple of `idle_between_tries`); the test prints every figure and asserts it loosely (three
//! times over, since this machine's scheduling is noisy), that each instance ran at least a third
//! of its fair share of the critical sections, and that no two sections overlapped.

mod common;
#[path = "common/turns.rs"]
mod turns;

mod suite {
    use crate::common::Fixture;
    use crate::turns::{contend, Tally, Witness};
    use std::sync::Arc;
    use std::thread;
    use std::time::{Duration, Instant};

    const INSTANCES: usize = 3;
    const THREADS: usize = 2;
    const RUN: Duration = Duration::from_secs(5);
    const LIMIT: Duration = Duration::from_millis(300);
    const IDLE: Duration = Duration::from_millis(50);

    /// One run at a time: they measure waiting, which the others' threads would distort.
    static ONE_AT_A_TIME: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

    fn run(f: &Fixture, notifications: bool) {
        let _alone = ONE_AT_A_TIME.lock();
        let witness = Arc::new(Witness::default());
        let end = Instant::now() + RUN;
        let registries: Vec<_> = (0..INSTANCES)
            .map(|_| {
                f.builder()
                    .idle_between_tries(IDLE)
                    .local_handoff_limit(Some(LIMIT))
                    .notifications(notifications)
                    .build()
                    .unwrap()
            })
            .collect();
        let window = 2 * IDLE;
        let workers: Vec<Vec<_>> = registries
            .iter()
            .enumerate()
            .map(|(instance, registry)| {
                (0..THREADS)
                    .map(|thread| {
                        let lock = registry.obtain("turns").unwrap();
                        let witness = Arc::clone(&witness);
                        let seed = (instance * THREADS + thread + 1) as u64;
                        thread::spawn(move || {
                            contend(
                                seed,
                                end,
                                &witness,
                                || Some(lock.lock().unwrap()),
                                |guard| guard.unlock().unwrap(),
                            )
                        })
                    })
                    .collect()
            })
            .collect();
        let tallies: Vec<Tally> = workers
            .into_iter()
            .map(|threads| Tally::merge(threads.into_iter().map(|t| t.join().unwrap())))
            .collect();
        let bound = (INSTANCES as u32 - 1) * (LIMIT + window + 2 * IDLE);
        let total: u64 = tallies.iter().map(|t| t.sections).sum();
        for (instance, tally) in tallies.iter().enumerate() {
            println!(
                "{:?} notifications={notifications} instance {instance}: {} of {total} sections \
                 ({:.1} %), longest wait {:?} (bound {bound:?})",
                f.db,
                tally.sections,
                100.0 * tally.sections as f64 / total as f64,
                tally.longest_wait
            );
        }
        assert_eq!(
            witness.overlaps.load(std::sync::atomic::Ordering::SeqCst),
            0
        );
        for (instance, tally) in tallies.iter().enumerate() {
            assert!(
                tally.longest_wait <= 3 * bound,
                "instance {instance} waited {:?}, bound {bound:?}",
                tally.longest_wait
            );
            assert!(
                tally.sections * 3 >= total / INSTANCES as u64,
                "instance {instance} ran {} of {total} sections",
                tally.sections
            );
        }
    }

    pub fn instances_take_turns_with_notifications(f: &Fixture) {
        run(f, true);
    }

    pub fn instances_take_turns_when_polling(f: &Fixture) {
        run(f, false);
    }
}

macro_rules! fairness {
    ($db:expr) => {
        crate::suite_for!($db; instances_take_turns_with_notifications, instances_take_turns_when_polling);
    };
}

#[cfg(feature = "sqlite")]
mod sqlite {
    fairness!(crate::common::Db::Sqlite);
}

#[cfg(feature = "postgres")]
mod postgres {
    fairness!(crate::common::Db::Postgres);
}

#[cfg(feature = "mysql")]
mod mysql {
    fairness!(crate::common::Db::Mysql);
}
