//! Reader/writer locks against every database: never a writer beside another holder across
//! registries and threads (an outside witness checks), a waiting writer keeps new readers of
//! every instance out and gets in under a continuous stream of readers, a write token exceeds
//! every earlier grant (also while another session holds the row of the largest token locked),
//! read slot rows locked elsewhere cost only those rows, crashed holders' rows come back after
//! their time-to-live, and bad input is refused (PostgreSQL also through PgBouncer in
//! transaction mode). Waits are bounded generously; no assertion is on elapsed time.

mod common;

mod suite {
    use crate::common::Fixture;
    use leasehold::Error;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};
    use std::thread;
    use std::time::{Duration, Instant};

    const GENEROUS: Duration = Duration::from_secs(20);

    /// The outside witness: readers inside, whether a writer is inside, and violations seen.
    #[derive(Default)]
    struct Witness {
        readers: AtomicUsize,
        writer: AtomicBool,
        most_readers: AtomicUsize,
        violations: AtomicUsize,
    }

    impl Witness {
        fn enter_read(&self) {
            let now = self.readers.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_readers.fetch_max(now, Ordering::SeqCst);
            if self.writer.load(Ordering::SeqCst) {
                self.violations.fetch_add(1, Ordering::SeqCst);
            }
        }
        fn leave_read(&self) {
            self.readers.fetch_sub(1, Ordering::SeqCst);
        }
        fn enter_write(&self) {
            if self.writer.swap(true, Ordering::SeqCst) || self.readers.load(Ordering::SeqCst) > 0 {
                self.violations.fetch_add(1, Ordering::SeqCst);
            }
        }
        fn leave_write(&self) {
            self.writer.store(false, Ordering::SeqCst);
        }
    }

    pub fn a_writer_never_holds_beside_another_holder_across_registries(f: &Fixture) {
        const REGISTRIES: usize = 3;
        const ROUNDS: usize = 6;
        let registries: Vec<_> = (0..REGISTRIES).map(|_| f.registry()).collect();
        let witness = Arc::new(Witness::default());
        let start = Arc::new(Barrier::new(REGISTRIES * 3));
        let mut workers = Vec::new();
        for registry in &registries {
            for role in ["read", "read", "write"] {
                let lock = registry.rw_lock("cache").unwrap();
                let (witness, start) = (witness.clone(), start.clone());
                workers.push(thread::spawn(move || {
                    start.wait();
                    for _ in 0..ROUNDS {
                        if role == "read" {
                            let guard = lock.try_read_for(GENEROUS).unwrap().expect("read");
                            witness.enter_read();
                            thread::sleep(Duration::from_millis(5));
                            witness.leave_read();
                            guard.unlock().unwrap();
                        } else {
                            let guard = lock.try_write_for(GENEROUS).unwrap().expect("write");
                            witness.enter_write();
                            thread::sleep(Duration::from_millis(2));
                            witness.leave_write();
                            guard.unlock().unwrap();
                        }
                    }
                }));
            }
        }
        for worker in workers {
            worker.join().unwrap();
        }
        assert_eq!(witness.violations.load(Ordering::SeqCst), 0);
    }

    pub fn readers_share_and_a_writer_excludes_them(f: &Fixture) {
        let (a, b) = (f.registry(), f.registry());
        let (at_a, at_b) = (a.rw_lock("doc").unwrap(), b.rw_lock("doc").unwrap());
        let first = at_a.read().unwrap();
        let second = at_a
            .try_read()
            .unwrap()
            .expect("a second reader of one registry");
        let third = at_b
            .try_read()
            .unwrap()
            .expect("a reader of another instance");
        assert_ne!(first.slot(), second.slot());
        assert!(first.is_held() && third.remaining() > Duration::ZERO);
        assert!(at_b.try_write().unwrap().is_none(), "readers hold it");
        assert!(at_a
            .try_write_for(Duration::from_millis(100))
            .unwrap()
            .is_none());
        drop((first, second));
        third.unlock().unwrap();
        let writing = at_b.try_write_for(GENEROUS).unwrap().expect("free");
        writing.renew().unwrap();
        assert!(at_a.try_read().unwrap().is_none(), "the writer holds it");
        assert!(at_a.try_write().unwrap().is_none());
        assert!(b.rw_lock("doc").unwrap().try_read().unwrap().is_none());
        writing.unlock().unwrap();
        assert!(at_a.try_read_for(GENEROUS).unwrap().is_some());
    }

    pub fn a_waiting_writer_keeps_new_readers_of_every_instance_out(f: &Fixture) {
        let (a, b, c) = (f.registry(), f.registry(), f.registry());
        let reading = a.rw_lock("queue").unwrap().read().unwrap();
        let writer_lock = b.rw_lock("queue").unwrap();
        let writer = thread::spawn(move || {
            writer_lock
                .try_write_for(GENEROUS)
                .unwrap()
                .map(|guard| guard.fencing_token())
        });
        // Until the writer waits, new readers still get in (and leave again).
        let refused = {
            let other = c.rw_lock("queue").unwrap();
            let until = Instant::now() + GENEROUS;
            loop {
                match other.try_read().unwrap() {
                    None => break true,
                    Some(guard) => drop(guard),
                }
                if Instant::now() > until {
                    break false;
                }
                thread::sleep(Duration::from_millis(10));
            }
        };
        assert!(refused, "a waiting writer did not keep a new reader out");
        assert!(reading.is_held(), "the reader inside keeps its hold");
        let read_token = reading.fencing_token();
        reading.unlock().unwrap();
        let token = writer.join().unwrap().expect("the writer got in");
        assert!(token > read_token);
    }

    pub fn a_waiting_writer_gets_in_under_a_continuous_stream_of_readers(f: &Fixture) {
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicUsize::new(0));
        let registries = [f.registry(), f.registry()];
        let mut readers = Vec::new();
        for registry in &registries {
            for _ in 0..2 {
                let lock = registry.rw_lock("hot").unwrap();
                let (stop, reads) = (stop.clone(), reads.clone());
                readers.push(thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        if let Some(guard) = lock.try_read_for(Duration::from_millis(200)).unwrap()
                        {
                            reads.fetch_add(1, Ordering::SeqCst);
                            thread::sleep(Duration::from_millis(30));
                            drop(guard);
                        }
                    }
                }));
            }
        }
        let until = Instant::now() + GENEROUS;
        while reads.load(Ordering::SeqCst) < 8 && Instant::now() < until {
            thread::sleep(Duration::from_millis(5));
        }
        let writer = f.registry();
        let written = writer
            .rw_lock("hot")
            .unwrap()
            .try_write_for(GENEROUS)
            .unwrap();
        let got_in = written.is_some();
        drop(written);
        stop.store(true, Ordering::SeqCst);
        for reader in readers {
            reader.join().unwrap();
        }
        assert!(reads.load(Ordering::SeqCst) >= 8, "the readers ran");
        assert!(got_in, "the writer was starved by the readers");
    }

    pub fn a_write_token_exceeds_every_earlier_read_and_write_grant(f: &Fixture) {
        let (a, b) = (f.registry(), f.registry());
        let (at_a, at_b) = (a.rw_lock("ledger").unwrap(), b.rw_lock("ledger").unwrap());
        let mut highest = 0u64;
        for round in 0..15 {
            let (reader, writer) = if round % 2 == 0 {
                (&at_a, &at_b)
            } else {
                (&at_b, &at_a)
            };
            for _ in 0..2 {
                let read = reader.try_read_for(GENEROUS).unwrap().expect("read");
                highest = highest.max(read.fencing_token());
                read.unlock().unwrap();
            }
            let write = writer.try_write_for(GENEROUS).unwrap().expect("write");
            assert!(
                write.fencing_token() > highest,
                "write token {} after {highest}",
                write.fencing_token()
            );
            highest = write.fencing_token();
            write.unlock().unwrap();
        }
    }

    pub fn crashed_holders_rows_come_back_after_their_time_to_live(f: &Fixture) {
        let ttl = Duration::from_millis(300);
        let crashed = f.builder().renewal(false).build().unwrap();
        let other = f.registry().rw_lock("crash").unwrap();
        // A reader crashes: the writer gets in after its lease runs out.
        let stale = crashed
            .rw_lock("crash")
            .unwrap()
            .read_with_ttl(ttl)
            .unwrap();
        std::mem::forget(stale);
        let writing = other
            .try_write_for(GENEROUS)
            .unwrap()
            .expect("the read ran out");
        writing.unlock().unwrap();
        // A writer crashes: readers get in after its lease runs out.
        let crashed = f.builder().renewal(false).build().unwrap();
        let stale = crashed
            .rw_lock("crash")
            .unwrap()
            .write_with_ttl(ttl)
            .unwrap();
        let write_token = stale.fencing_token();
        std::mem::forget(stale);
        let reading = other
            .try_read_for(GENEROUS)
            .unwrap()
            .expect("the write ran out");
        drop(reading);
        let again = other.try_write_for(GENEROUS).unwrap().expect("free");
        assert!(again.fencing_token() > write_token);
    }

    pub fn bad_input_gets_typed_errors(f: &Fixture) {
        let registry = f.registry();
        assert!(matches!(
            registry.rw_lock(""),
            Err(Error::InvalidKey { .. })
        ));
        let lock = registry.rw_lock("bad").unwrap();
        for attempt in [
            lock.try_read_with_ttl(Duration::from_millis(1)).map(drop),
            lock.try_write_with_ttl(Duration::from_millis(1)).map(drop),
        ] {
            assert!(
                matches!(attempt, Err(Error::InvalidSetting { .. })),
                "{attempt:?}"
            );
        }
        // Neither side was left taken by the refused calls.
        let write = lock.try_write().unwrap().expect("free");
        write.unlock().unwrap();
        let read = lock.try_read().unwrap().expect("free");
        read.unlock().unwrap();
    }

    pub fn a_lock_a_semaphore_and_a_rw_lock_of_one_name_are_unrelated(f: &Fixture) {
        let registry = f.registry();
        let lock = registry.obtain("same").unwrap().lock().unwrap();
        let permit = registry.semaphore("same", 1).unwrap().acquire().unwrap();
        let write = registry
            .rw_lock("same")
            .unwrap()
            .try_write()
            .unwrap()
            .expect("unrelated to the lock and the semaphore");
        // The write took its token with a grant of a read slot and let it go: held rows only.
        let rows = registry.listing().page(None, 100).unwrap();
        let mut parts: Vec<Option<String>> = rows
            .iter()
            .filter(|row| row.state == leasehold::LockState::Held)
            .map(|row| row.part())
            .collect();
        parts.sort();
        assert_eq!(
            parts,
            [None, Some("permit 0".into()), Some("write".into())],
            "{rows:?}"
        );
        let read = registry.rw_lock("other").unwrap().read().unwrap();
        let row = registry
            .listing()
            .page(None, 100)
            .unwrap()
            .into_iter()
            .find(|row| {
                row.state == leasehold::LockState::Held
                    && row.part().is_some_and(|part| part.starts_with("read "))
            })
            .expect("the read slot's row");
        assert_eq!(row.part(), Some(format!("read {}", read.slot())));
        drop((lock, permit, write));
    }

    /// Read slot rows another session holds locked (`SELECT … FOR UPDATE` in an open
    /// transaction; every other slot here) cost only those rows: each bounded read gets a free
    /// slot, though about every other one starts its round at a locked row. SQLite locks whole
    /// files, not rows: nothing to check there.
    pub fn read_slot_rows_another_session_holds_locked_cost_only_those_rows(f: &Fixture) {
        let registry = f.registry();
        let lock = registry.rw_lock("locked-rows").unwrap();
        // Every slot gets its row: one thread takes them all.
        let all: Vec<_> = (0..leasehold::MAX_READERS)
            .map(|_| lock.read().unwrap())
            .collect();
        drop(all);
        let status = registry.rw_lock_status("locked-rows").unwrap();
        assert_eq!(status.readers.len(), leasehold::MAX_READERS as usize);
        let locked: Vec<String> = status
            .readers
            .iter()
            .step_by(2)
            .map(|row| row.lock_key.clone())
            .collect();
        let Some(row_lock) = crate::common::row_lock::RowLock::hold(f, &locked) else {
            return;
        };
        for round in 0..12 {
            match lock.try_read_for(Duration::from_secs(5)) {
                Ok(Some(read)) => {
                    assert_eq!(read.slot() % 2, 1, "a locked slot was granted");
                    read.unlock().unwrap();
                }
                other => panic!("{:?}: round {round}: {other:?} with free slots", f.db),
            }
        }
        drop(row_lock);
    }

    /// The read slot whose row has the largest token, locked by another session (an
    /// operator's `SELECT … FOR UPDATE` on a released slot, in an open transaction) while no
    /// reader holds the lock: a bounded write still gets in, with a token above every earlier
    /// read and write grant. Each round locks the slot that is the largest then (the previous
    /// write's or a read's), and a second writer takes the write side meanwhile too. SQLite
    /// locks whole files, not rows: nothing to check there.
    pub fn a_writer_gets_in_while_the_largest_token_slot_is_locked_elsewhere(f: &Fixture) {
        let (a, b) = (f.registry(), f.registry());
        let (at_a, at_b) = (a.rw_lock("pinned").unwrap(), b.rw_lock("pinned").unwrap());
        let mut earlier = 0u64;
        // Several slots get rows, then a write takes its token.
        let reads: Vec<_> = (0..4).map(|_| at_a.read().unwrap()).collect();
        for read in &reads {
            earlier = earlier.max(read.fencing_token());
        }
        drop(reads);
        let write = at_b.try_write_for(GENEROUS).unwrap().expect("write");
        assert!(write.fencing_token() > earlier);
        earlier = write.fencing_token();
        write.unlock().unwrap();
        for round in 0..4 {
            if round % 2 == 1 {
                // The largest token is a read's this round.
                let read = at_a.try_read_for(GENEROUS).unwrap().expect("read");
                assert!(read.fencing_token() > 0);
                earlier = earlier.max(read.fencing_token());
                read.unlock().unwrap();
            }
            let status = a.rw_lock_status("pinned").unwrap();
            assert!(status.held_readers().is_empty(), "{:?}", status.readers);
            let top = status
                .readers
                .iter()
                .max_by_key(|row| row.fencing_token)
                .expect("read slot rows")
                .clone();
            assert!(top.fencing_token >= earlier, "{top:?} after {earlier}");
            let Some(row_lock) = crate::common::row_lock::RowLock::hold(f, &[top.lock_key]) else {
                return;
            };
            for writer in [&at_a, &at_b] {
                let write = match writer.try_write_for(Duration::from_secs(5)) {
                    Ok(Some(write)) => write,
                    other => panic!(
                        "{:?}: round {round}: {other:?} with no reader and the slot of token {} \
                         locked elsewhere",
                        f.db, top.fencing_token
                    ),
                };
                let token = write.fencing_token();
                assert!(
                    token > earlier && token > top.fencing_token,
                    "{:?}: round {round}: write token {token} after {earlier}",
                    f.db
                );
                earlier = token;
                write.unlock().unwrap();
            }
            drop(row_lock);
        }
    }

    /// The read slot of the largest token ahead of the database clock (as after the clock was
    /// set back) and locked by another session: no other slot's grant is above its token, so
    /// a bounded write returns no guard with a token at or below it (it waits for the row);
    /// once the row is free, the write gets in above it. SQLite locks whole files, not rows:
    /// nothing to check there.
    pub fn a_write_token_stays_above_a_locked_slot_ahead_of_the_clock(f: &Fixture) {
        const AN_HOUR_MICROS: u64 = 3_600_000_000;
        let registry = f.registry();
        let lock = registry.rw_lock("ahead-locked").unwrap();
        let reads: Vec<_> = (0..3).map(|_| lock.read().unwrap()).collect();
        drop(reads);
        let status = registry.rw_lock_status("ahead-locked").unwrap();
        let top = status
            .readers
            .iter()
            .max_by_key(|row| row.fencing_token)
            .expect("read slot rows")
            .lock_key
            .clone();
        let mut raw = crate::common::raw::Raw::open(f);
        let pushed = raw.execute(&format!(
            "UPDATE {} SET FENCING_TOKEN = FENCING_TOKEN + {AN_HOUR_MICROS} \
             WHERE LOCK_KEY = '{top}'",
            f.table()
        ));
        assert_eq!(pushed, 1);
        let ahead = registry
            .rw_lock_status("ahead-locked")
            .unwrap()
            .readers
            .iter()
            .map(|row| row.fencing_token)
            .max()
            .unwrap();
        let Some(row_lock) = crate::common::row_lock::RowLock::hold(f, &[top]) else {
            return;
        };
        if let Some(write) = lock.try_write_for(Duration::from_millis(500)).unwrap() {
            assert!(
                write.fencing_token() > ahead,
                "{:?}: write token {} with the slot of token {ahead} locked",
                f.db,
                write.fencing_token()
            );
        }
        drop(row_lock);
        let write = lock.try_write_for(GENEROUS).unwrap().expect("write");
        assert!(
            write.fencing_token() > ahead,
            "{:?}: write token {} after {ahead}",
            f.db,
            write.fencing_token()
        );
    }
}

macro_rules! rw_locks {
    ($db:expr) => {
        crate::suite_for!($db;
            a_writer_never_holds_beside_another_holder_across_registries,
            readers_share_and_a_writer_excludes_them,
            a_waiting_writer_keeps_new_readers_of_every_instance_out,
            a_waiting_writer_gets_in_under_a_continuous_stream_of_readers,
            a_write_token_exceeds_every_earlier_read_and_write_grant,
            crashed_holders_rows_come_back_after_their_time_to_live,
            bad_input_gets_typed_errors,
            a_lock_a_semaphore_and_a_rw_lock_of_one_name_are_unrelated,
            read_slot_rows_another_session_holds_locked_cost_only_those_rows,
            a_writer_gets_in_while_the_largest_token_slot_is_locked_elsewhere,
            a_write_token_stays_above_a_locked_slot_ahead_of_the_clock,
        );
    };
}

#[cfg(feature = "sqlite")]
mod sqlite {
    rw_locks!(crate::common::Db::Sqlite);
}

#[cfg(feature = "postgres")]
mod postgres {
    rw_locks!(crate::common::Db::Postgres);
}

#[cfg(feature = "mysql")]
mod mysql {
    rw_locks!(crate::common::Db::Mysql);
}

#[cfg(all(feature = "postgres", unix))]
mod postgres_through_pgbouncer {
    rw_locks!(crate::common::pgbouncer::through_pgbouncer());
}
