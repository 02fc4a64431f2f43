//! Waiting in line: instances that wait for a key are served in the order they started
//! waiting, on every backend.
//!
//! Four instances (registries of their own) of two threads each take one key over and over.
//! A *turn* is one database grant — its fencing token — with the local handoffs inside it. In
//! line, while one instance waits, every other instance starts at most one turn that it was
//! ahead for, and at most one more that began while the waiting instance's place was being
//! taken; without a line, an instance that polls at the right moments gets turn after turn.
//! An instance's wait ends with its turn: a thread whose wait spans a turn of its own instance
//! (another of its threads held the key, and the turn ended before this thread had it) counts
//! from that turn's end.
//! The assertion counts turns, never time: a busy machine changes how long a wait lasts, not
//! how many turns of others it sees.

mod common;

mod suite {
    use crate::common::Fixture;
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};
    use std::thread;
    use std::time::{Duration, Instant};

    const INSTANCES: usize = 4;
    const THREADS: usize = 2;
    const SECTIONS: usize = 60;

    /// One critical section: who, when its wait began, when it was granted and released, and
    /// the grant's token.
    #[derive(Clone, Copy, Debug)]
    struct Section {
        instance: usize,
        asked: Instant,
        granted: Instant,
        released: Instant,
        token: u64,
    }

    pub fn waiting_instances_are_served_in_order(f: &Fixture) {
        let registries: Vec<_> = (0..INSTANCES)
            .map(|_| {
                f.builder()
                    .tuning(leasehold::Tuning {
                        turn_limit: Some(Duration::from_millis(30)),
                        ..Default::default()
                    })
                    .build()
                    .unwrap()
            })
            .collect();
        let sections = Arc::new(Mutex::new(Vec::new()));
        let workers: Vec<_> = registries
            .iter()
            .enumerate()
            .flat_map(|(instance, registry)| {
                (0..THREADS).map(move |thread| (instance, thread, registry))
            })
            .map(|(instance, thread, registry)| {
                let lock = registry.obtain("line").unwrap();
                let sections = Arc::clone(&sections);
                thread::spawn(move || {
                    for round in 0..SECTIONS {
                        let asked = Instant::now();
                        let guard = lock.lock().unwrap();
                        let granted = Instant::now();
                        let token = guard.fencing_token();
                        thread::sleep(Duration::from_millis(1 + ((round + thread) % 4) as u64));
                        let released = Instant::now();
                        guard.unlock().unwrap();
                        sections.lock().unwrap().push(Section {
                            instance,
                            asked,
                            granted,
                            released,
                            token,
                        });
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().unwrap();
        }
        let sections = sections.lock().unwrap().clone();
        // Turns: (start, end, instance) per token.
        let mut turns: BTreeMap<u64, (Instant, Instant, usize)> = BTreeMap::new();
        for s in &sections {
            let turn = turns
                .entry(s.token)
                .or_insert((s.granted, s.released, s.instance));
            assert_eq!(turn.2, s.instance, "one token, two instances: {s:?}");
            turn.0 = turn.0.min(s.granted);
            turn.1 = turn.1.max(s.released);
        }
        let mut worst = (0, None);
        for wait in &sections {
            // The instance's wait: from the thread's asking, or from the end of a turn of its
            // own instance that came meanwhile (another of its threads held the key, and the
            // turn ended before this thread had it).
            let from = turns
                .values()
                .filter(|(_, end, instance)| *instance == wait.instance && *end < wait.granted)
                .map(|(_, end, _)| *end)
                .max()
                .map_or(wait.asked, |end| end.max(wait.asked));
            for other in (0..INSTANCES).filter(|i| *i != wait.instance) {
                let started = turns
                    .values()
                    .filter(|(start, _, instance)| {
                        *instance == other && *start > from && *start < wait.granted
                    })
                    .count();
                if started > worst.0 {
                    worst = (started, Some((wait, other, from)));
                }
            }
        }
        println!(
            "{:?}: {} sections in {} turns; the most turns another instance started during one \
             wait: {} ({:?})",
            f.db,
            sections.len(),
            turns.len(),
            worst.0,
            worst.1
        );
        if let Some((wait, _, from)) = worst.1.filter(|_| worst.0 > 2) {
            let base = wait.asked;
            let at = |t: Instant| {
                if t >= base {
                    format!("+{:?}", t - base)
                } else {
                    format!("-{:?}", base - t)
                }
            };
            let mut around: Vec<_> = turns
                .values()
                .filter(|(start, end, _)| {
                    *end + Duration::from_millis(300) > base && *start < wait.granted
                })
                .collect();
            around.sort_by_key(|(start, _, _)| *start);
            println!(
                "the wait of instance {} from +0 (counted from {}) to {}; turns around it:",
                wait.instance,
                at(from),
                at(wait.granted)
            );
            for (start, end, instance) in around {
                println!("  instance {instance}: {} .. {}", at(*start), at(*end));
            }
            for s in sections.iter().filter(|s| {
                s.instance == wait.instance && s.released > base && s.asked < wait.granted
            }) {
                println!(
                    "  own section: asked {} granted {} released {} token {}",
                    at(s.asked),
                    at(s.granted),
                    at(s.released),
                    s.token
                );
            }
        }
        assert!(
            worst.0 <= 2,
            "instance {:?} started {} turns while one wait of another went on: {:?}",
            worst.1.map(|(_, other, _)| other),
            worst.0,
            worst.1.map(|(wait, _, _)| wait)
        );
    }
}

/// A place in the line that another session holds locked (a place being taken, refreshed or
/// left that instant, or an operator's `SELECT … FOR UPDATE`) never turns the acquire of a
/// free key into a refusal.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn a_locked_place_never_refuses_a_free_key(f: &common::Fixture) {
    use common::raw::Raw;
    let key = "line-locked";
    let queue = format!("{}_QUEUE", f.table());
    // An expired place, written and not yet committed: its row stays locked.
    let mut holder = Raw::open(f);
    holder.execute_batch("BEGIN");
    holder.execute(&format!(
        "INSERT INTO {queue} (LOCK_KEY, REGION, CLIENT_ID, SINCE, EXPIRED_AFTER) VALUES \
         ('{}', 'DEFAULT', 'gone', '2000-01-01 00:00:00', '2000-01-01 00:00:00')",
        leasehold::lock_key_for(key)
    ));
    let registry = f.registry();
    let lock = registry.obtain(key).unwrap();
    let guard = lock.try_lock().unwrap();
    assert!(
        guard.is_some(),
        "the key is free: a locked place must not refuse it"
    );
    drop(guard);
    holder.execute_batch("ROLLBACK");
}

macro_rules! line {
    ($db:expr) => {
        crate::suite_for!($db; waiting_instances_are_served_in_order);
    };
}

#[cfg(feature = "sqlite")]
mod sqlite {
    line!(crate::common::Db::Sqlite);
}

#[cfg(feature = "postgres")]
mod postgres {
    line!(crate::common::Db::Postgres);

    #[test]
    fn a_locked_place_never_refuses_a_free_key() {
        if let Some(f) = crate::common::Fixture::new(crate::common::Db::Postgres, "line_locked") {
            super::a_locked_place_never_refuses_a_free_key(&f);
        }
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    line!(crate::common::Db::Mysql);

    #[test]
    fn a_locked_place_never_refuses_a_free_key() {
        if let Some(f) = crate::common::Fixture::new(crate::common::Db::Mysql, "line_locked") {
            super::a_locked_place_never_refuses_a_free_key(&f);
        }
    }
}
