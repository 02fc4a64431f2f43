//! Fencing tokens keep their order across deletions of released and expired rows, for every
//! primitive on every database: a lock's grants, a semaphore's permits (per permit), a
//! reader/writer lock's read holds (per read slot) and write holds (above every earlier grant
//! of the lock, read or write), and a leader election's terms.
//!
//! Between grants the rows are deleted the two ways the table's other users do it: the
//! registry's own cleanup ([`LockRegistry::delete_released_and_expired`], which `leasehold
//! cleanup --older-than` runs) and Spring Integration's `deleteExpired` (`DELETE … WHERE REGION =
//! ? AND EXPIRED_AFTER < now`) from a plain connection of the test's own. Each function in
//! `suite` takes a [`Fixture`] (its own table on one real database) and is instantiated once
//! per compiled-in backend at the bottom. No assertion is on elapsed time.

mod common;

mod suite {
    use crate::common::raw::Raw;
    use crate::common::{Db, Fixture};
    use leasehold::{LeaderElection, LockRegistry};
    use std::collections::HashMap;
    use std::time::{Duration, Instant};

    const GENEROUS: Duration = Duration::from_secs(20);
    const ROUNDS: usize = 6;

    impl Raw {
        /// Spring Integration's `deleteExpired`: every row of the region whose lease is over on
        /// the database clock (released rows included: their `EXPIRED_AFTER` is in the past).
        fn spring_delete_expired(&mut self, table: &str) -> u64 {
            match self {
                #[cfg(feature = "sqlite")]
                Raw::Sqlite(conn) => conn
                    .execute(
                        &format!(
                            "DELETE FROM {table} WHERE REGION = 'DEFAULT' AND EXPIRED_AFTER < \
                             strftime('%Y-%m-%d %H:%M:%f', 'now')"
                        ),
                        [],
                    )
                    .expect("deleteExpired") as u64,
                #[cfg(feature = "postgres")]
                Raw::Postgres(client) => client
                    .execute(
                        &format!(
                            "DELETE FROM {table} WHERE REGION = 'DEFAULT' \
                             AND EXPIRED_AFTER < (now() AT TIME ZONE 'UTC')"
                        ),
                        &[],
                    )
                    .expect("deleteExpired"),
                #[cfg(feature = "mysql")]
                Raw::Mysql(conn) => {
                    use mysql::prelude::Queryable;
                    conn.query_drop(format!(
                        "DELETE FROM {table} WHERE REGION = 'DEFAULT' \
                         AND EXPIRED_AFTER < UTC_TIMESTAMP(6)"
                    ))
                    .expect("deleteExpired");
                    conn.affected_rows()
                }
            }
        }
    }

    /// Deletes the released and expired rows, by the registry's cleanup in even rounds and by
    /// Spring's `deleteExpired` in odd ones; asserts that rows went (a row released in the
    /// database clock's current tick is kept until the tick is over, so it tries a few times).
    fn delete_released_rows(f: &Fixture, registry: &LockRegistry, raw: &mut Raw, round: usize) {
        let give_up = Instant::now() + GENEROUS;
        loop {
            std::thread::sleep(Duration::from_millis(3));
            let deleted = if round.is_multiple_of(2) {
                registry
                    .delete_released_and_expired(Duration::ZERO)
                    .unwrap()
            } else {
                raw.spring_delete_expired(&f.table())
            };
            if deleted > 0 {
                return;
            }
            assert!(
                Instant::now() < give_up,
                "round {round}: no row was deleted"
            );
        }
    }

    /// The largest token seen per part (a permit's or a read slot's number; 0 for the others).
    #[derive(Default)]
    struct Highest(HashMap<u32, u64>);

    impl Highest {
        /// Asserts that `token` is above every earlier token of `part`, and records it.
        fn rises(&mut self, what: &str, part: u32, token: u64, db: Db) {
            let earlier = self.0.entry(part).or_default();
            assert!(
                token > *earlier,
                "{db:?}: {what} {part} got token {token} after {earlier}"
            );
            *earlier = token;
        }
    }

    pub fn lock_tokens_rise_across_deletions(f: &Fixture) {
        let (a, b) = (f.registry(), f.registry());
        let mut raw = Raw::open(f);
        let mut highest = Highest::default();
        for round in 0..ROUNDS {
            let registry = if round.is_multiple_of(2) { &a } else { &b };
            let guard = registry.obtain("ledger").unwrap().lock().unwrap();
            highest.rises("lock", 0, guard.fencing_token(), f.db);
            guard.unlock().unwrap();
            delete_released_rows(f, &a, &mut raw, round);
        }
    }

    pub fn permit_tokens_rise_per_permit_across_deletions(f: &Fixture) {
        let (a, b) = (f.registry(), f.registry());
        let mut raw = Raw::open(f);
        let mut highest = Highest::default();
        for round in 0..ROUNDS {
            let (first, second) = if round.is_multiple_of(2) {
                (&a, &b)
            } else {
                (&b, &a)
            };
            let one = first.semaphore("exports", 2).unwrap().acquire().unwrap();
            let two = second.semaphore("exports", 2).unwrap().acquire().unwrap();
            for permit in [&one, &two] {
                highest.rises("permit", permit.slot(), permit.fencing_token(), f.db);
            }
            one.unlock().unwrap();
            two.unlock().unwrap();
            delete_released_rows(f, &a, &mut raw, round);
        }
    }

    /// Reads and writes in turn, with the released rows deleted after most of them (a write
    /// follows reads whose rows are kept, then their deletion): every write token is above
    /// every earlier grant of the lock, and every read token above every earlier grant of its
    /// slot and below every later write token.
    pub fn read_and_write_tokens_keep_their_order_across_deletions(f: &Fixture) {
        let (a, b) = (f.registry(), f.registry());
        let (at_a, at_b) = (a.rw_lock("ledger").unwrap(), b.rw_lock("ledger").unwrap());
        let mut raw = Raw::open(f);
        let mut slots = Highest::default();
        let mut every_grant = 0u64;
        let mut deletions = 0;
        for round in 0..ROUNDS {
            let (reader, writer) = if round.is_multiple_of(2) {
                (&at_a, &at_b)
            } else {
                (&at_b, &at_a)
            };
            let read = reader.try_read_for(GENEROUS).unwrap().expect("read");
            let also = writer.try_read_for(GENEROUS).unwrap().expect("read");
            for guard in [&read, &also] {
                slots.rises("read slot", guard.slot(), guard.fencing_token(), f.db);
                every_grant = every_grant.max(guard.fencing_token());
            }
            read.unlock().unwrap();
            also.unlock().unwrap();
            // The released read rows stay for the write in even rounds, go in odd ones.
            if !round.is_multiple_of(2) {
                delete_released_rows(f, &a, &mut raw, deletions);
                deletions += 1;
            }

            let write = writer.try_write_for(GENEROUS).unwrap().expect("write");
            let token = write.fencing_token();
            assert!(
                token > every_grant,
                "{:?}: round {round}: write token {token} after a grant of {every_grant}",
                f.db
            );
            every_grant = token;
            write.unlock().unwrap();
            delete_released_rows(f, &a, &mut raw, deletions);
            deletions += 1;

            // A second write in a row, after its predecessor's rows were deleted.
            let write = reader.try_write_for(GENEROUS).unwrap().expect("write");
            let token = write.fencing_token();
            assert!(
                token > every_grant,
                "{:?}: round {round}: write token {token} after the write token {every_grant}",
                f.db
            );
            every_grant = token;
            write.unlock().unwrap();
            delete_released_rows(f, &a, &mut raw, deletions);
            deletions += 1;
        }
    }

    /// A read slot's token ahead of the database clock (a clock set back, or grants quicker
    /// than its tick): the next write token is above it, and so is the one after the rows
    /// were deleted.
    pub fn a_write_token_passes_a_read_token_ahead_of_the_clock_also_after_deletion(f: &Fixture) {
        const AN_HOUR_MICROS: u64 = 3_600_000_000;
        let registry = f.registry();
        let lock = registry.rw_lock("ahead").unwrap();
        let mut raw = Raw::open(f);
        let read = lock.read().unwrap();
        let slot_key = registry.rw_lock_status("ahead").unwrap().held_readers()[0]
            .lock_key
            .clone();
        read.unlock().unwrap();
        let pushed = raw.execute(&format!(
            "UPDATE {} SET FENCING_TOKEN = FENCING_TOKEN + {AN_HOUR_MICROS} \
             WHERE LOCK_KEY = '{slot_key}'",
            f.table()
        ));
        assert_eq!(pushed, 1);
        let ahead = registry.rw_lock_status("ahead").unwrap().readers[0].fencing_token;
        let write = lock.write().unwrap();
        let mut last = write.fencing_token();
        assert!(last > ahead, "{:?}: write token {last} after {ahead}", f.db);
        write.unlock().unwrap();
        for round in 0..2 {
            delete_released_rows(f, &registry, &mut raw, round);
            let write = lock.write().unwrap();
            let next = write.fencing_token();
            assert!(
                next > last,
                "{:?}: write token {next} after {last} (rows deleted)",
                f.db
            );
            last = next;
            write.unlock().unwrap();
        }
    }

    pub fn leader_terms_rise_across_deletions(f: &Fixture) {
        let election = |f: &Fixture| {
            LeaderElection::builder(f.builder(), "scheduler")
                .lease_duration(Duration::from_secs(10))
                .lock_acquire_sleep_interval(Duration::from_millis(20))
                .build()
                .unwrap()
        };
        let (a, b) = (election(f), election(f));
        let cleaner = f.registry();
        let mut raw = Raw::open(f);
        let mut highest = Highest::default();
        for round in 0..ROUNDS {
            let election = if round.is_multiple_of(2) { &a } else { &b };
            let term = election
                .try_acquire_for(GENEROUS)
                .unwrap()
                .expect("elected");
            highest.rises("term", 0, term.term(), f.db);
            term.resign().unwrap();
            delete_released_rows(f, &cleaner, &mut raw, round);
        }
    }
}

macro_rules! tokens {
    ($db:expr) => {
        crate::suite_for!($db;
            lock_tokens_rise_across_deletions,
            permit_tokens_rise_per_permit_across_deletions,
            read_and_write_tokens_keep_their_order_across_deletions,
            a_write_token_passes_a_read_token_ahead_of_the_clock_also_after_deletion,
            leader_terms_rise_across_deletions,
        );
    };
}

#[cfg(feature = "sqlite")]
mod sqlite {
    tokens!(crate::common::Db::Sqlite);
}

#[cfg(feature = "postgres")]
mod postgres {
    tokens!(crate::common::Db::Postgres);
}

#[cfg(feature = "mysql")]
mod mysql {
    tokens!(crate::common::Db::Mysql);
}
