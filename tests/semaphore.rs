//! Counting semaphores against every database: never more holders than permits across
//! registries and threads (an outside witness counts them), a crashed holder's permit comes
//! back after its time-to-live, instances that disagree about the number get a typed error,
//! and bad input is refused (PostgreSQL also through PgBouncer in transaction mode). Like the
//! conformance suite, waits are bounded generously and no assertion is on elapsed time.

mod common;

mod suite {
    use crate::common::{Db, Fixture};
    use leasehold::{Error, MAX_PERMITS};
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};
    use std::thread;
    use std::time::{Duration, Instant};

    const GENEROUS: Duration = Duration::from_secs(20);

    /// Runs `sql` on the fixture's database outside leasehold.
    fn execute(f: &Fixture, sql: &str) {
        match f.db {
            #[cfg(feature = "sqlite")]
            Db::Sqlite => {
                rusqlite::Connection::open(f.sqlite_path())
                    .unwrap()
                    .execute_batch(sql)
                    .unwrap();
            }
            #[cfg(feature = "postgres")]
            Db::Postgres => {
                postgres::Client::connect(&crate::common::postgres_url(), postgres::NoTls)
                    .unwrap()
                    .batch_execute(sql)
                    .unwrap();
            }
            #[cfg(feature = "mysql")]
            Db::Mysql => {
                use mysql::prelude::Queryable;
                mysql::Conn::new(mysql::Opts::from_url(&crate::common::mysql_url()).unwrap())
                    .unwrap()
                    .query_drop(sql)
                    .unwrap();
            }
            #[allow(unreachable_patterns)]
            other => panic!("{other:?} support is not compiled in"),
        }
    }

    pub fn never_more_holders_than_permits_across_registries_and_threads(f: &Fixture) {
        const PERMITS: u32 = 3;
        const REGISTRIES: usize = 3;
        const THREADS_PER_REGISTRY: usize = 3;
        const ROUNDS: usize = 8;
        let registries: Vec<_> = (0..REGISTRIES).map(|_| f.registry()).collect();
        // The witnesses: how many hold a permit now (and the most ever), and which slots.
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let slots: Arc<Vec<AtomicBool>> =
            Arc::new((0..PERMITS).map(|_| AtomicBool::new(false)).collect());
        let double_slots = Arc::new(AtomicUsize::new(0));
        let start = Arc::new(Barrier::new(REGISTRIES * THREADS_PER_REGISTRY));
        let mut workers = Vec::new();
        for registry in &registries {
            for _ in 0..THREADS_PER_REGISTRY {
                let semaphore = registry.semaphore("partner-api", PERMITS).unwrap();
                let (inside, most, slots, double_slots, start) = (
                    inside.clone(),
                    most.clone(),
                    slots.clone(),
                    double_slots.clone(),
                    start.clone(),
                );
                workers.push(thread::spawn(move || {
                    start.wait();
                    for _ in 0..ROUNDS {
                        let permit = semaphore
                            .try_acquire_for(GENEROUS)
                            .unwrap()
                            .expect("granted");
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        let slot = &slots[permit.slot() as usize];
                        if slot.swap(true, Ordering::SeqCst) {
                            double_slots.fetch_add(1, Ordering::SeqCst);
                        }
                        thread::sleep(Duration::from_millis(2));
                        slot.store(false, Ordering::SeqCst);
                        inside.fetch_sub(1, Ordering::SeqCst);
                        permit.unlock().unwrap();
                    }
                }));
            }
        }
        for worker in workers {
            worker.join().unwrap();
        }
        let most = most.load(Ordering::SeqCst);
        assert!(
            most <= PERMITS as usize,
            "{most} holders of {PERMITS} permits"
        );
        assert_eq!(double_slots.load(Ordering::SeqCst), 0, "a slot held twice");
        let taken: u64 = registries
            .iter()
            .map(|r| r.statistics())
            .map(|stats| stats.grants + stats.local_handoffs)
            .sum();
        let total = (REGISTRIES * THREADS_PER_REGISTRY * ROUNDS) as u64;
        assert_eq!(
            taken, total,
            "every permit was a grant, or a handoff between threads"
        );
    }

    pub fn every_permit_is_a_slot_of_its_own_and_the_next_try_is_refused(f: &Fixture) {
        let (a, b) = (f.registry(), f.registry());
        let semaphore = a.semaphore("exports", 3).unwrap();
        let first = semaphore.acquire().unwrap();
        let second = semaphore.try_acquire().unwrap().expect("a second permit");
        let third = b
            .semaphore("exports", 3)
            .unwrap()
            .try_acquire()
            .unwrap()
            .expect("the third, from another instance");
        let held: HashSet<u32> = [&first, &second, &third].iter().map(|p| p.slot()).collect();
        assert_eq!(held, HashSet::from([0, 1, 2]));
        assert!(first.is_held() && first.remaining() > Duration::ZERO);
        assert!(semaphore.try_acquire().unwrap().is_none(), "all three held");
        assert!(b
            .semaphore("exports", 3)
            .unwrap()
            .try_acquire_for(Duration::from_millis(100))
            .unwrap()
            .is_none());
        let freed = third.slot();
        third.unlock().unwrap();
        let again = semaphore
            .try_acquire()
            .unwrap()
            .expect("freed by the release");
        assert_eq!(again.slot(), freed);
        first.renew().unwrap();
        second.renew_with_ttl(Duration::from_secs(30)).unwrap();
        assert!(second.remaining() > Duration::from_secs(20));
    }

    pub fn a_waiter_gets_the_permit_another_instance_releases(f: &Fixture) {
        let (a, b) = (f.registry(), f.registry());
        let held = a.semaphore("single", 1).unwrap().acquire().unwrap();
        let waiting = b.semaphore("single", 1).unwrap();
        let waiter = thread::spawn(move || {
            waiting
                .try_acquire_for(GENEROUS)
                .unwrap()
                .map(|permit| permit.fencing_token())
        });
        thread::sleep(Duration::from_millis(50));
        let token = held.fencing_token();
        held.unlock().unwrap();
        let next = waiter.join().unwrap().expect("granted after the release");
        assert!(next > token, "{next} after {token}");
    }

    pub fn threads_of_one_registry_wait_for_each_others_permits(f: &Fixture) {
        let registry = f.registry();
        let semaphore = registry.semaphore("local", 2).unwrap();
        let held = [semaphore.acquire().unwrap(), semaphore.acquire().unwrap()];
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let semaphore = semaphore.clone();
                thread::spawn(move || {
                    let permit = semaphore.try_acquire_for(GENEROUS).unwrap();
                    permit.map(|p| p.unlock().unwrap()).is_some()
                })
            })
            .collect();
        thread::sleep(Duration::from_millis(50));
        drop(held);
        for waiter in waiters {
            assert!(waiter.join().unwrap(), "every waiter got a permit in turn");
        }
    }

    pub fn waiting_threads_of_one_registry_share_one_poller(f: &Fixture) {
        const PERMITS: u64 = 2;
        const THREADS: u64 = 8;
        let holder = f.registry();
        let semaphore = holder.semaphore("crowded", PERMITS as u32).unwrap();
        let held = [semaphore.acquire().unwrap(), semaphore.acquire().unwrap()];
        let waiting = f.registry();
        let window = Duration::from_millis(600);
        let started = Instant::now();
        let waiters: Vec<_> = (0..THREADS)
            .map(|_| {
                let semaphore = waiting.semaphore("crowded", PERMITS as u32).unwrap();
                thread::spawn(move || semaphore.try_acquire_for(window).unwrap().is_none())
            })
            .collect();
        for waiter in waiters {
            assert!(waiter.join().unwrap(), "nobody may get a held permit");
        }
        let waited = started.elapsed();
        let statements = waiting.statistics().acquires;
        // One poller tries both permits, then sleeps 20 ms (the fixture's idle_between_tries):
        // at most one round per 20 ms waited, plus one as each waiter gives up and the next
        // takes over, plus slack for wake-ups; eight pollers would send about eight times that.
        let rounds = (waited.as_millis() / 20) as u64 + THREADS + 10;
        assert!(
            statements <= rounds * PERMITS,
            "{THREADS} waiters sent {statements} statements in {waited:?}"
        );
        assert!(statements > 0, "nobody polled");
        drop(held);
    }

    pub fn a_crashed_holders_permit_comes_back_after_its_time_to_live(f: &Fixture) {
        let crashed = f.builder().renewal(false).build().unwrap();
        let ttl = Duration::from_millis(300);
        let semaphore = crashed.semaphore("crash", 2).unwrap();
        let stale: Vec<_> = (0..2)
            .map(|_| semaphore.acquire_with_ttl(ttl).unwrap())
            .collect();
        let tokens: Vec<(u32, u64)> = stale
            .iter()
            .map(|p| (p.slot(), p.fencing_token()))
            .collect();
        let other = f.registry().semaphore("crash", 2).unwrap();
        let refused = other.try_acquire().unwrap().is_none();
        if stale.iter().all(|p| p.is_held()) {
            assert!(refused, "a permit was taken while both were held");
        }
        // The holder "crashes": nothing releases its rows, which expire on their own.
        for permit in stale {
            std::mem::forget(permit);
        }
        let taken: Vec<_> = (0..2)
            .map(|_| other.try_acquire_for(GENEROUS).unwrap().expect("expired"))
            .collect();
        for permit in &taken {
            let (_, old) = tokens
                .iter()
                .find(|(slot, _)| *slot == permit.slot())
                .unwrap();
            assert!(permit.fencing_token() > *old, "tokens rise per slot");
        }
    }

    pub fn unlocking_a_lost_permit_reports_the_loss(f: &Fixture) {
        let lost = f.builder().renewal(false).build().unwrap();
        let permit = lost
            .semaphore("lost", 1)
            .unwrap()
            .acquire_with_ttl(Duration::from_millis(200))
            .unwrap();
        let losses = permit.loss_channel();
        let other = f
            .registry()
            .semaphore("lost", 1)
            .unwrap()
            .try_acquire_for(GENEROUS)
            .unwrap()
            .expect("taken over after expiry");
        assert!(!permit.is_held());
        assert!(
            losses.recv_timeout(GENEROUS).is_ok(),
            "the loss was reported"
        );
        match permit.unlock() {
            Err(e) => assert!(e.is_lease_lost(), "{e}"),
            Ok(()) => panic!("unlock of a lost permit succeeded"),
        }
        assert!(other.is_held());
    }

    pub fn instances_that_disagree_about_the_permits_get_a_typed_error(f: &Fixture) {
        let (a, b) = (f.registry(), f.registry());
        let four = a.semaphore("pool", 4).unwrap();
        let check = |result: leasehold::Result<leasehold::Semaphore>, asked: u32| match result {
            Err(Error::PermitsMismatch {
                name,
                permits,
                recorded,
                table,
                fix,
            }) => {
                assert_eq!((name.as_str(), permits, recorded), ("pool", asked, 4));
                assert!(table.ends_with("LOCK_SEM"), "{table}");
                assert!(fix.starts_with("DELETE FROM"), "{fix}");
            }
            other => panic!("expected PermitsMismatch, got {other:?}"),
        };
        check(b.semaphore("pool", 5), 5);
        check(a.semaphore("pool", 3), 3);
        drop(four);
        check(a.semaphore("pool", 5), 5);
        assert_eq!(b.semaphore("pool", 4).unwrap().permits(), 4);
        assert!(
            b.semaphore("other-pool", 5).is_ok(),
            "names are independent"
        );
        // Following the error's advice lets a new number be recorded.
        let fix = match a.semaphore("pool", 2) {
            Err(Error::PermitsMismatch { fix, .. }) => fix,
            other => panic!("{other:?}"),
        };
        execute(f, &fix);
        let c = f.registry();
        assert_eq!(c.semaphore("pool", 2).unwrap().permits(), 2);
    }

    pub fn bad_input_gets_typed_errors(f: &Fixture) {
        let registry = f.registry();
        for permits in [0, MAX_PERMITS + 1, u32::MAX] {
            match registry.semaphore("bad", permits) {
                Err(Error::InvalidSetting { setting, .. }) => assert_eq!(setting, "permits"),
                other => panic!("{permits} permits: {other:?}"),
            }
        }
        assert!(matches!(
            registry.semaphore("", 2),
            Err(Error::InvalidKey { .. })
        ));
        let semaphore = registry.semaphore("bad", MAX_PERMITS).unwrap();
        assert!(matches!(
            semaphore.try_acquire_with_ttl(Duration::from_millis(1)),
            Err(Error::InvalidSetting { .. })
        ));
        let permit = semaphore.acquire().unwrap();
        assert!(permit.slot() < MAX_PERMITS);
        assert!(matches!(
            permit.renew_with_ttl(Duration::from_secs(365 * 24 * 3600)),
            Err(Error::InvalidSetting { .. })
        ));
    }

    pub fn a_semaphore_and_a_lock_of_one_name_are_unrelated(f: &Fixture) {
        let (a, b) = (f.registry(), f.registry());
        let lock = a.obtain("shared").unwrap().lock().unwrap();
        let permit = b
            .semaphore("shared", 1)
            .unwrap()
            .try_acquire()
            .unwrap()
            .expect("the lock's row is not a permit's");
        assert!(b.obtain("shared").unwrap().try_lock().unwrap().is_none());
        assert!(a
            .semaphore("shared", 1)
            .unwrap()
            .try_acquire()
            .unwrap()
            .is_none());
        // The lock's row is the name's UUID, as Spring Integration computes it; the permits'
        // rows are not UUIDs, so no Spring lock can ever name one.
        let rows = a.listing().page(None, 100).unwrap();
        let keys: Vec<&str> = rows.iter().map(|row| row.lock_key.as_str()).collect();
        assert!(keys.contains(&leasehold::lock_key_for("shared").as_str()));
        let permit_key = keys
            .iter()
            .find(|key| key.contains('#'))
            .expect("the permit's row");
        assert_eq!(permit_key.len(), 36);
        assert!(uuid_like(permit_key).is_none(), "{permit_key}");
        drop((lock, permit));
    }

    /// `Some` when `text` reads as a canonical UUID.
    fn uuid_like(text: &str) -> Option<()> {
        let bytes = text.as_bytes();
        (bytes.len() == 36
            && bytes.iter().enumerate().all(|(i, b)| match i {
                8 | 13 | 18 | 23 => *b == b'-',
                _ => b.is_ascii_hexdigit(),
            }))
        .then_some(())
    }

    pub fn a_missing_semaphore_table_is_named_with_the_file_to_run(f: &Fixture) {
        let registry = f.registry();
        execute(f, &format!("DROP TABLE {}_SEM", f.table()));
        match registry.semaphore("anything", 2) {
            Err(Error::TableMissing { table, ddl_file }) => {
                assert!(table.ends_with("LOCK_SEM"), "{table}");
                let expected = match f.db {
                    Db::Sqlite => "sql/sqlite_semaphore.sql",
                    Db::Postgres => "sql/postgres_semaphore.sql",
                    Db::Mysql => "sql/mysql_semaphore.sql",
                };
                assert_eq!(ddl_file, expected);
            }
            other => panic!("expected TableMissing, got {other:?}"),
        }
        // Locks work without it, and create_table(true) makes it again.
        assert!(registry
            .obtain("anything")
            .unwrap()
            .try_lock()
            .unwrap()
            .is_some());
        let again = f.builder().create_table(true).build().unwrap();
        assert_eq!(again.semaphore("anything", 2).unwrap().permits(), 2);
    }

    pub fn a_held_permit_keeps_its_lease_past_the_time_to_live(f: &Fixture) {
        let registry = f
            .builder()
            .time_to_live(Duration::from_secs(3))
            .build()
            .unwrap();
        let permit = registry.semaphore("long", 1).unwrap().acquire().unwrap();
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            thread::sleep(Duration::from_millis(200));
        }
        assert!(permit.is_held(), "renewed in the background");
        assert!(f
            .registry()
            .semaphore("long", 1)
            .unwrap()
            .try_acquire()
            .unwrap()
            .is_none());
        permit.unlock().unwrap();
    }

    /// Waits until `count` threads of the registry wait for a permit of `semaphore` between
    /// their tries.
    fn until_waiting(semaphore: &leasehold::Semaphore, count: usize) {
        let until = Instant::now() + GENEROUS;
        while semaphore.waiting_threads() < count {
            assert!(Instant::now() < until, "the waiters never parked");
            thread::sleep(Duration::from_millis(2));
        }
    }

    /// A permit released while another thread of the registry waits is handed over
    /// without a statement, keeping its slot, grant and fencing token, as a lock is.
    pub fn a_released_permit_is_handed_to_a_waiting_thread_without_a_statement(f: &Fixture) {
        // No handoff limit: on a loaded machine the wait below may outlast the default 1 s. A
        // long poll interval: the waiter stays parked (it would not be between two polls).
        let registry = f
            .builder()
            .tuning(leasehold::Tuning {
                turn_limit: None,
                ..Default::default()
            })
            .idle_between_tries(Duration::from_secs(60))
            .build()
            .unwrap();
        let semaphore = registry.semaphore("handoff", 1).unwrap();
        let held = semaphore.acquire().unwrap();
        let (token, slot) = (held.fencing_token(), held.slot());
        let waiter = {
            let semaphore = semaphore.clone();
            thread::spawn(move || {
                let permit = semaphore
                    .try_acquire_for(GENEROUS)
                    .unwrap()
                    .expect("handed over");
                let got = (permit.fencing_token(), permit.slot(), permit.is_held());
                permit.unlock().unwrap();
                got
            })
        };
        until_waiting(&semaphore, 1);
        let before = registry.statistics();
        held.unlock().unwrap();
        assert_eq!(
            waiter.join().unwrap(),
            (token, slot, true),
            "the same grant"
        );
        let after = registry.statistics();
        assert_eq!(after.acquires, before.acquires, "{before:?} -> {after:?}");
        assert_eq!(
            after.releases,
            before.releases + 1,
            "only the final release"
        );
        assert_eq!(after.local_handoffs, before.local_handoffs + 1);
        assert!(
            semaphore.try_acquire().unwrap().is_some(),
            "released at the end"
        );
    }

    /// With `local_handoff(false)` the waiting thread takes the permit from the database, with
    /// a token of its own.
    pub fn without_local_handoff_a_waiting_thread_gets_a_grant_of_its_own(f: &Fixture) {
        // The release nudges the parked waiter, which polls at once.
        let registry = f
            .builder()
            .tuning(leasehold::Tuning {
                local_handoff: false,
                ..Default::default()
            })
            .idle_between_tries(Duration::from_secs(60))
            .build()
            .unwrap();
        let semaphore = registry.semaphore("no-handoff", 1).unwrap();
        let held = semaphore.acquire().unwrap();
        let token = held.fencing_token();
        let waiter = {
            let semaphore = semaphore.clone();
            thread::spawn(move || {
                let permit = semaphore
                    .try_acquire_for(GENEROUS)
                    .unwrap()
                    .expect("granted");
                let token = permit.fencing_token();
                permit.unlock().unwrap();
                token
            })
        };
        until_waiting(&semaphore, 1);
        let before = registry.statistics();
        held.unlock().unwrap();
        let next = waiter.join().unwrap();
        assert!(next > token, "{next} after {token}");
        let after = registry.statistics();
        assert!(after.grants > before.grants, "{before:?} -> {after:?}");
        assert_eq!(after.local_handoffs, before.local_handoffs);
    }

    /// Handoffs between the threads of one registry never put more holders inside than
    /// permits, nor two holders on one slot (an outside count and a flag per slot).
    pub fn handoffs_between_threads_keep_at_most_permits_holders(f: &Fixture) {
        const PERMITS: u32 = 2;
        let registry = f
            .builder()
            .tuning(leasehold::Tuning {
                turn_limit: None,
                ..Default::default()
            })
            .build()
            .unwrap();
        let semaphore = registry.semaphore("handoffs", PERMITS).unwrap();
        let inside = Arc::new(AtomicUsize::new(0));
        let slots: Arc<Vec<AtomicBool>> =
            Arc::new((0..PERMITS).map(|_| AtomicBool::new(false)).collect());
        let workers: Vec<_> = (0..5)
            .map(|_| {
                let (semaphore, inside, slots) = (semaphore.clone(), inside.clone(), slots.clone());
                thread::spawn(move || {
                    for _ in 0..15 {
                        let permit = semaphore
                            .try_acquire_for(GENEROUS)
                            .unwrap()
                            .expect("a turn");
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        assert!(
                            now <= PERMITS as usize,
                            "{now} holders of {PERMITS} permits"
                        );
                        let flag = &slots[permit.slot() as usize];
                        assert!(
                            !flag.swap(true, Ordering::SeqCst),
                            "two holders of one slot"
                        );
                        thread::sleep(Duration::from_millis(2));
                        flag.store(false, Ordering::SeqCst);
                        inside.fetch_sub(1, Ordering::SeqCst);
                        assert!(permit.is_held());
                        permit.unlock().unwrap();
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().unwrap();
        }
        let stats = registry.statistics();
        assert_eq!(stats.held_leases, 0, "{stats:?}");
    }

    /// A permit row another session holds locked (`SELECT … FOR UPDATE` in an open
    /// transaction) costs only that row: every bounded and blocking acquire gets one of the
    /// free permits, also when its round starts at the locked row (the rounds of one registry
    /// start after the slot it was last granted, so they come to it). SQLite locks whole files,
    /// not rows: nothing to check there.
    pub fn a_permit_row_another_session_holds_locked_costs_only_that_row(f: &Fixture) {
        const PERMITS: u32 = 3;
        let registry = f.registry();
        let semaphore = registry.semaphore("locked-row", PERMITS).unwrap();
        let all: Vec<_> = (0..PERMITS).map(|_| semaphore.acquire().unwrap()).collect();
        drop(all);
        let status = registry.semaphore_status("locked-row").unwrap();
        let locked = status.rows[0].lock_key.clone();
        let Some(row_lock) =
            crate::common::row_lock::RowLock::hold(f, std::slice::from_ref(&locked))
        else {
            return;
        };
        let slot_of = |permit: &leasehold::Permit| {
            registry
                .semaphore_status("locked-row")
                .unwrap()
                .rows
                .iter()
                .find(|row| row.part() == Some(format!("permit {}", permit.slot())))
                .map(|row| row.lock_key.clone())
        };
        for round in 0..2 * PERMITS {
            let permit = match semaphore.try_acquire_for(Duration::from_secs(5)) {
                Ok(Some(permit)) => permit,
                other => panic!(
                    "{:?}: round {round}: {other:?} although {} permits were free",
                    f.db,
                    PERMITS - 1
                ),
            };
            assert_ne!(slot_of(&permit).as_ref(), Some(&locked));
            permit.unlock().unwrap();
            let permit = semaphore
                .acquire()
                .unwrap_or_else(|e| panic!("{:?}: round {round}: acquire failed: {e}", f.db));
            permit.unlock().unwrap();
        }
        drop(row_lock);
    }

    /// A blocking acquire whose rounds meet a locked permit row (the other permit held by
    /// another instance) goes on waiting, rather than fail with the row's timeout, and gets
    /// the permit that instance releases.
    pub fn a_blocking_acquire_waits_past_a_locked_row_for_a_released_permit(f: &Fixture) {
        let holder = f.registry();
        let held = holder.semaphore("locked-wait", 2).unwrap();
        let (first, second) = (held.acquire().unwrap(), held.acquire().unwrap());
        let locked = slot_key(&holder, "locked-wait", first.slot());
        first.unlock().unwrap();
        let Some(row_lock) = crate::common::row_lock::RowLock::hold(f, &[locked]) else {
            return;
        };
        // Statements that wait on the locked row run out after a second.
        let waiter = f
            .builder()
            .operation_timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        let semaphore = waiter.semaphore("locked-wait", 2).unwrap();
        let acquiring = thread::spawn(move || semaphore.acquire().map(|permit| permit.slot()));
        // Several times the operation timeout: each round met the locked row.
        thread::sleep(Duration::from_secs(3));
        assert!(
            !acquiring.is_finished(),
            "{:?}: the blocking acquire returned: {:?}",
            f.db,
            acquiring.join().unwrap()
        );
        let free = second.slot();
        second.unlock().unwrap();
        let got = acquiring.join().unwrap().expect("the released permit");
        assert_eq!(got, free);
        drop(row_lock);
    }

    /// The `LOCK_KEY` of permit `slot` of semaphore `name`, from its status.
    fn slot_key(registry: &leasehold::LockRegistry, name: &str, slot: u32) -> String {
        registry
            .semaphore_status(name)
            .unwrap()
            .rows
            .iter()
            .find(|row| row.part() == Some(format!("permit {slot}")))
            .expect("the permit's row")
            .lock_key
            .clone()
    }
}

macro_rules! semaphores {
    ($db:expr) => {
        crate::suite_for!($db;
            never_more_holders_than_permits_across_registries_and_threads,
            every_permit_is_a_slot_of_its_own_and_the_next_try_is_refused,
            a_waiter_gets_the_permit_another_instance_releases,
            threads_of_one_registry_wait_for_each_others_permits,
            waiting_threads_of_one_registry_share_one_poller,
            a_crashed_holders_permit_comes_back_after_its_time_to_live,
            unlocking_a_lost_permit_reports_the_loss,
            instances_that_disagree_about_the_permits_get_a_typed_error,
            bad_input_gets_typed_errors,
            a_semaphore_and_a_lock_of_one_name_are_unrelated,
            a_missing_semaphore_table_is_named_with_the_file_to_run,
            a_held_permit_keeps_its_lease_past_the_time_to_live,
            a_released_permit_is_handed_to_a_waiting_thread_without_a_statement,
            without_local_handoff_a_waiting_thread_gets_a_grant_of_its_own,
            handoffs_between_threads_keep_at_most_permits_holders,
            a_permit_row_another_session_holds_locked_costs_only_that_row,
            a_blocking_acquire_waits_past_a_locked_row_for_a_released_permit,
        );
    };
}

#[cfg(feature = "sqlite")]
mod sqlite {
    semaphores!(crate::common::Db::Sqlite);
}

#[cfg(feature = "postgres")]
mod postgres {
    semaphores!(crate::common::Db::Postgres);
}

#[cfg(feature = "mysql")]
mod mysql {
    semaphores!(crate::common::Db::Mysql);
}

#[cfg(all(feature = "postgres", unix))]
mod postgres_through_pgbouncer {
    semaphores!(crate::common::pgbouncer::through_pgbouncer());
}
