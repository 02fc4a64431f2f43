//! Fenced transactions, against every database: a holder's write in its own transaction
//! commits only while its lease holds, a takeover waits for an open fenced transaction, and a
//! stale holder's write is refused with nothing of it committed — for every primitive.
//!
//! Each test keeps a ledger (`{prefix}LEDGER`, one row with a total) in the database of the
//! lock table and writes it through the database's own driver. Waits are bounded generously;
//! a lease that must expire has a short time-to-live and renewal off, and is only waited out.
//! `chaos` runs `examples/fenced_ledger.rs` in child processes (this test binary, started again
//! with `FENCED_LEDGER_CHILD` set) and stops them with `SIGSTOP` inside their sections.

mod common;

mod suite {
    use crate::common::{Db, Fixture};
    use leasehold::{
        AnyGuard, Error, FenceSql, FenceableTransaction, Fenced, LeaderElection, Leadership,
        LockGuard, LossReason, Permit, ReadGuard, WriteGuard,
    };
    use std::time::{Duration, Instant};

    const GENEROUS: Duration = Duration::from_secs(20);

    /// The fence of every guard type, to write one helper for all.
    pub trait Fence {
        fn fence_in<T: FenceableTransaction>(&self, tx: T) -> leasehold::Result<Fenced<'_, T>>;
    }

    macro_rules! fence_for {
        ($($guard:ty),*) => {$(
            impl Fence for $guard {
                fn fence_in<T: FenceableTransaction>(
                    &self,
                    tx: T,
                ) -> leasehold::Result<Fenced<'_, T>> {
                    self.fence(tx)
                }
            }
        )*};
    }
    fence_for!(LockGuard, Permit, ReadGuard, WriteGuard, AnyGuard, Leadership);

    /// A connection of the user's own, on the fixture's database.
    #[allow(clippy::large_enum_variant)] // one per test, never moved about
    pub enum Conn {
        #[cfg(feature = "sqlite")]
        Sqlite(leasehold::rusqlite::Connection),
        #[cfg(feature = "postgres")]
        Postgres(leasehold::postgres::Client),
        #[cfg(feature = "mysql")]
        Mysql(leasehold::mysql::Conn),
    }

    /// The ledger table of one test, dropped at the end.
    pub struct Ledger {
        pub conn: Conn,
        pub table: String,
        /// Made the table (and drops it).
        owner: bool,
    }

    impl Conn {
        pub fn open(f: &Fixture) -> Conn {
            match f.db {
                #[cfg(feature = "sqlite")]
                Db::Sqlite => {
                    let conn = leasehold::rusqlite::Connection::open(f.sqlite_path()).unwrap();
                    conn.busy_timeout(GENEROUS).unwrap();
                    Conn::Sqlite(conn)
                }
                #[cfg(feature = "postgres")]
                Db::Postgres => Conn::Postgres(
                    leasehold::postgres::Client::connect(
                        &crate::common::postgres_url(),
                        leasehold::postgres::NoTls,
                    )
                    .unwrap(),
                ),
                #[cfg(feature = "mysql")]
                Db::Mysql => Conn::Mysql(
                    leasehold::mysql::Conn::new(
                        leasehold::mysql::Opts::from_url(&crate::common::mysql_url()).unwrap(),
                    )
                    .unwrap(),
                ),
                #[allow(unreachable_patterns)]
                other => panic!("{other:?} is not compiled in"),
            }
        }

        /// Runs `sql` outside a transaction.
        pub fn run(&mut self, sql: &str) {
            match self {
                #[cfg(feature = "sqlite")]
                Conn::Sqlite(c) => c.execute_batch(sql).unwrap(),
                #[cfg(feature = "postgres")]
                Conn::Postgres(c) => c.batch_execute(sql).unwrap(),
                #[cfg(feature = "mysql")]
                Conn::Mysql(c) => {
                    use leasehold::mysql::prelude::Queryable;
                    c.query_drop(sql).unwrap()
                }
            }
        }
    }

    impl Conn {
        /// Drops `table` from a server (SQLite's go with the fixture's directory).
        #[cfg_attr(
            not(any(feature = "postgres", feature = "mysql")),
            allow(unused_variables)
        )]
        pub fn drop_table(&mut self, table: &str) {
            match self {
                #[cfg(feature = "sqlite")]
                Conn::Sqlite(_) => {}
                #[cfg(feature = "postgres")]
                Conn::Postgres(c) => {
                    let _ = c.batch_execute(&format!("DROP TABLE IF EXISTS {table}"));
                }
                #[cfg(feature = "mysql")]
                Conn::Mysql(c) => {
                    use leasehold::mysql::prelude::Queryable;
                    let _ = c.query_drop(format!("DROP TABLE IF EXISTS {table}"));
                }
            }
        }

        /// Makes this connection wait at most `seconds` for a lock held by another session.
        pub fn wait_for_locks_at_most(&mut self, seconds: u64) {
            match self {
                #[cfg(feature = "sqlite")]
                Conn::Sqlite(c) => c.busy_timeout(Duration::from_secs(seconds)).unwrap(),
                #[cfg(feature = "postgres")]
                Conn::Postgres(c) => c
                    .batch_execute(&format!("SET lock_timeout = '{seconds}s'"))
                    .unwrap(),
                #[cfg(feature = "mysql")]
                Conn::Mysql(c) => {
                    use leasehold::mysql::prelude::Queryable;
                    c.query_drop(format!("SET SESSION innodb_lock_wait_timeout = {seconds}"))
                        .unwrap()
                }
            }
        }

        /// Runs `sql` outside a transaction; the rows it changed, or the database's refusal.
        #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
        pub fn try_run(&mut self, sql: &str) -> Result<u64, String> {
            match self {
                #[cfg(feature = "sqlite")]
                Conn::Sqlite(c) => c
                    .execute(sql, [])
                    .map(|n| n as u64)
                    .map_err(|e| e.to_string()),
                #[cfg(feature = "postgres")]
                Conn::Postgres(c) => c.execute(sql, &[]).map_err(|e| e.to_string()),
                #[cfg(feature = "mysql")]
                Conn::Mysql(c) => {
                    use leasehold::mysql::prelude::Queryable;
                    c.query_drop(sql).map_err(|e| e.to_string())?;
                    Ok(c.affected_rows())
                }
            }
        }
    }

    impl Ledger {
        pub fn new(f: &Fixture) -> Ledger {
            let table = format!("{}LEDGER", f.prefix);
            let mut conn = Conn::open(f);
            conn.run(&format!(
                "CREATE TABLE {table} (ID INTEGER PRIMARY KEY, TOTAL BIGINT NOT NULL)"
            ));
            conn.run(&format!("INSERT INTO {table} (ID, TOTAL) VALUES (1, 0)"));
            Ledger {
                conn,
                table,
                owner: true,
            }
        }

        /// Another connection on the same ledger.
        pub fn other(&self, f: &Fixture) -> Ledger {
            Ledger {
                conn: Conn::open(f),
                table: self.table.clone(),
                owner: false,
            }
        }

        pub fn total(&mut self) -> i64 {
            let sql = format!("SELECT TOTAL FROM {} WHERE ID = 1", self.table);
            match &mut self.conn {
                #[cfg(feature = "sqlite")]
                Conn::Sqlite(c) => c.query_row(&sql, [], |r| r.get(0)).unwrap(),
                #[cfg(feature = "postgres")]
                Conn::Postgres(c) => c.query_one(sql.as_str(), &[]).unwrap().get(0),
                #[cfg(feature = "mysql")]
                Conn::Mysql(c) => {
                    use leasehold::mysql::prelude::Queryable;
                    c.query_first(sql).unwrap().unwrap()
                }
            }
        }

        /// One transaction: adds `early` (a write made before the fence, as by a holder that
        /// paused afterwards), fences with `guard`, runs `inside` (the pause; its argument runs
        /// a statement in the transaction, to keep it busy), then reads the total and writes it
        /// + `add`, and commits.
        pub fn fenced_add(
            &mut self,
            guard: &impl Fence,
            early: i64,
            add: i64,
            inside: impl FnOnce(&mut dyn FnMut()),
        ) -> leasehold::Result<()> {
            let table = &self.table;
            let bump = format!("UPDATE {table} SET TOTAL = TOTAL + {early} WHERE ID = 1");
            let read = format!("SELECT TOTAL FROM {table} WHERE ID = 1");
            let write =
                |total: i64| format!("UPDATE {table} SET TOTAL = {} WHERE ID = 1", total + add);
            match &mut self.conn {
                #[cfg(feature = "sqlite")]
                Conn::Sqlite(c) => {
                    let tx = c.transaction().unwrap();
                    if early != 0 {
                        tx.execute(&bump, []).unwrap();
                    }
                    let tx = guard.fence_in(tx)?;
                    inside(&mut || tx.query_row("SELECT 1", [], |_| Ok(())).unwrap());
                    let total: i64 = tx.query_row(&read, [], |r| r.get(0)).unwrap();
                    tx.execute(&write(total), []).unwrap();
                    tx.commit()
                }
                #[cfg(feature = "postgres")]
                Conn::Postgres(c) => {
                    let mut tx = c.transaction().unwrap();
                    if early != 0 {
                        tx.execute(bump.as_str(), &[]).unwrap();
                    }
                    let mut tx = guard.fence_in(tx)?;
                    inside(&mut || {
                        tx.execute("SELECT 1", &[]).unwrap();
                    });
                    let total: i64 = tx.query_one(read.as_str(), &[]).unwrap().get(0);
                    tx.execute(write(total).as_str(), &[]).unwrap();
                    tx.commit()
                }
                #[cfg(feature = "mysql")]
                Conn::Mysql(c) => {
                    use leasehold::mysql::prelude::Queryable;
                    let mut tx = c.start_transaction(Default::default()).unwrap();
                    if early != 0 {
                        tx.query_drop(&bump).unwrap();
                    }
                    let mut tx = guard.fence_in(tx)?;
                    inside(&mut || tx.query_drop("SELECT 1").unwrap());
                    let total: i64 = tx.query_first(&read).unwrap().unwrap();
                    tx.query_drop(write(total)).unwrap();
                    tx.commit()
                }
            }
        }

        /// Runs `fence`'s statement in a transaction through the driver's own API (as a user of
        /// another driver would), rolls back, and says whether it returned a row.
        pub fn run_fence_sql(&mut self, fence: &FenceSql) -> bool {
            let p = &fence.params;
            match &mut self.conn {
                #[cfg(feature = "sqlite")]
                Conn::Sqlite(c) => {
                    use leasehold::rusqlite::OptionalExtension;
                    let tx = c.transaction().unwrap();
                    let row: Option<i64> = tx
                        .query_row(
                            &fence.sql,
                            leasehold::rusqlite::params![
                                p.lock_key,
                                p.region,
                                p.client_id,
                                p.fencing_token
                            ],
                            |r| r.get(0),
                        )
                        .optional()
                        .unwrap();
                    tx.rollback().unwrap();
                    row.is_some()
                }
                #[cfg(feature = "postgres")]
                Conn::Postgres(c) => {
                    let mut tx = c.transaction().unwrap();
                    let row = tx
                        .query_opt(
                            fence.sql.as_str(),
                            &[&p.lock_key, &p.region, &p.client_id, &p.fencing_token],
                        )
                        .unwrap();
                    tx.rollback().unwrap();
                    row.is_some()
                }
                #[cfg(feature = "mysql")]
                Conn::Mysql(c) => {
                    use leasehold::mysql::prelude::Queryable;
                    let mut tx = c.start_transaction(Default::default()).unwrap();
                    let row: Option<i64> = tx
                        .exec_first(
                            &fence.sql,
                            (&p.lock_key, &p.region, &p.client_id, p.fencing_token),
                        )
                        .unwrap();
                    tx.rollback().unwrap();
                    row.is_some()
                }
            }
        }
    }

    impl Drop for Ledger {
        fn drop(&mut self) {
            if self.owner {
                self.conn.drop_table(&self.table);
            }
        }
    }

    fn lost_reason(result: leasehold::Result<()>) -> LossReason {
        match result {
            Err(Error::LeaseLost { reason, .. }) => reason,
            other => panic!("a fence on a lost lease must fail with LeaseLost, got {other:?}"),
        }
    }

    /// Keeps a fenced transaction busy (a statement every 50 ms, through `tick`) until `done`.
    fn busy_until(tick: &mut dyn FnMut(), done: impl Fn() -> bool) {
        let until = Instant::now() + GENEROUS;
        while !done() {
            assert!(Instant::now() < until, "waited in vain");
            tick();
            std::thread::sleep(Duration::from_millis(50));
        }
        tick();
    }

    /// Keeps a fenced transaction busy for `how_long`.
    fn busy_for(tick: &mut dyn FnMut(), how_long: Duration) {
        let until = Instant::now() + how_long;
        busy_until(tick, || Instant::now() >= until);
    }

    /// Waits until `guard` counts its lease as gone.
    fn wait_lost(is_held: impl Fn() -> bool) {
        let until = Instant::now() + GENEROUS;
        while is_held() {
            assert!(Instant::now() < until, "a short lease never ran out");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn every_primitive_commits_a_fenced_write_while_it_holds(f: &Fixture) {
        let mut ledger = Ledger::new(f);
        let registry = f.registry();
        let lock = registry.obtain("ledger").unwrap().lock().unwrap();
        ledger.fenced_add(&lock, 0, 1, |_| {}).unwrap();
        lock.unlock().unwrap();

        let permit = registry
            .semaphore("ledger-sem", 2)
            .unwrap()
            .acquire()
            .unwrap();
        ledger.fenced_add(&permit, 0, 1, |_| {}).unwrap();
        permit.unlock().unwrap();

        let rw = registry.rw_lock("ledger-rw").unwrap();
        let read = rw.read().unwrap();
        ledger.fenced_add(&read, 0, 1, |_| {}).unwrap();
        drop(read);
        let write = rw.write().unwrap();
        ledger.fenced_add(&write, 0, 1, |_| {}).unwrap();
        drop(write);

        let election = LeaderElection::builder(f.builder(), "ledger-leader")
            .build()
            .unwrap();
        let leadership = election.acquire().unwrap();
        ledger.fenced_add(&leadership, 0, 1, |_| {}).unwrap();
        leadership.resign().unwrap();

        let any: AnyGuard = registry
            .obtain("ledger-any")
            .unwrap()
            .lock()
            .unwrap()
            .into();
        ledger.fenced_add(&any, 0, 1, |_| {}).unwrap();
        assert_eq!(
            any.fence_sql().unwrap().params.lock_key,
            leasehold::lock_key_for("ledger-any")
        );
        any.unlock().unwrap();

        assert_eq!(ledger.total(), 6);
    }

    /// A fence's SQL, run through the driver by hand, finds the row of every primitive's grant
    /// while it is held, and no row once it is released.
    pub fn fence_sql_finds_the_row_only_while_held(f: &Fixture) {
        let mut ledger = Ledger::new(f);
        let registry = f.registry();
        let sem = registry.semaphore("sql-sem", 1).unwrap();
        let rw = registry.rw_lock("sql-rw").unwrap();
        let election = LeaderElection::builder(f.builder(), "sql-leader")
            .build()
            .unwrap();
        let mut check = |fence: FenceSql, release: Box<dyn FnOnce() + '_>| {
            assert!(ledger.run_fence_sql(&fence), "held, yet refused: {fence:?}");
            release();
            assert!(
                !ledger.run_fence_sql(&fence),
                "released, yet found: {fence:?}"
            );
        };
        let lock = registry.obtain("sql-lock").unwrap().lock().unwrap();
        let fence = lock.fence_sql().unwrap();
        assert_eq!(fence.params.fencing_token, lock.fencing_token() as i64);
        assert_eq!(fence.params.client_id, registry.client_id());
        assert_eq!(fence.params.lock_key, leasehold::lock_key_for("sql-lock"));
        check(fence, Box::new(move || lock.unlock().unwrap()));
        let permit = sem.acquire().unwrap();
        check(
            permit.fence_sql().unwrap(),
            Box::new(move || permit.unlock().unwrap()),
        );
        let read = rw.read().unwrap();
        check(read.fence_sql().unwrap(), Box::new(move || drop(read)));
        let write = rw.write().unwrap();
        check(write.fence_sql().unwrap(), Box::new(move || drop(write)));
        let leadership = election.acquire().unwrap();
        check(
            leadership.fence_sql().unwrap(),
            Box::new(move || leadership.resign().unwrap()),
        );
    }

    /// A holder whose lease ran out learns it from the fence without a statement; what its
    /// transaction wrote before is rolled back.
    pub fn a_fence_on_a_lost_lease_fails_at_once(f: &Fixture) {
        let mut ledger = Ledger::new(f);
        let crashed = f.builder().renewal(false).build().unwrap();
        let guard = crashed
            .obtain("lost")
            .unwrap()
            .lock_with_ttl(Duration::from_millis(300))
            .unwrap();
        wait_lost(|| guard.is_held());
        // Another session keeps the lock row (SQLite: the file) locked, and the user's
        // connection waits at most 3 s for a lock: a fence that sent a statement would fail
        // with a database error after that wait, not with LeaseLost.
        let mut blocker = ledger.other(f);
        let row = format!(
            "SELECT FENCING_TOKEN FROM {} WHERE LOCK_KEY = '{}' FOR UPDATE",
            f.table(),
            leasehold::lock_key_for("lost")
        );
        match f.db {
            Db::Sqlite => blocker.conn.run("BEGIN IMMEDIATE"),
            Db::Postgres => blocker.conn.run(&format!("BEGIN; {row}")),
            Db::Mysql => {
                blocker.conn.run("START TRANSACTION");
                blocker.conn.run(&row);
            }
        }
        ledger.conn.wait_for_locks_at_most(3);
        // SQLite's writer would keep every other writer out; the write before the fence is
        // made on the servers only.
        let early = if f.db == Db::Sqlite { 0 } else { 100 };
        let reason = lost_reason(ledger.fenced_add(&guard, early, 1, |_| {
            panic!("the fence let a lost lease through")
        }));
        assert!(matches!(reason, LossReason::Expired(_)), "{reason:?}");
        blocker.conn.run("ROLLBACK");
        assert!(matches!(guard.fence_sql(), Err(Error::LeaseLost { .. })));
        assert_eq!(
            ledger.total(),
            0,
            "nothing of the refused transaction commits"
        );
    }

    /// The database refuses the fence of a holder that still counts its lease as held when the
    /// row was taken meanwhile (here: freed by an operator and granted to another instance);
    /// the lease is then reported lost.
    pub fn the_database_refuses_a_fence_after_the_row_was_taken(f: &Fixture) {
        let mut ledger = Ledger::new(f);
        let (mine, other) = (f.registry(), f.registry());
        let guard = mine
            .obtain("taken")
            .unwrap()
            .lock_with_ttl(Duration::from_secs(60))
            .unwrap();
        let losses = guard.loss_channel();
        assert!(other.force_release("taken").unwrap());
        let fresh = other
            .obtain("taken")
            .unwrap()
            .try_lock()
            .unwrap()
            .expect("free");
        assert!(guard.is_held(), "no renewal has run yet");
        let early = if f.db == Db::Sqlite { 0 } else { 100 };
        let reason = lost_reason(ledger.fenced_add(&guard, early, 1, |_| {
            panic!("the fence let a taken row through")
        }));
        assert_eq!(reason, LossReason::NotOwner);
        assert!(!guard.is_held());
        assert!(
            losses.recv_timeout(GENEROUS).is_ok(),
            "the loss is reported"
        );
        assert_eq!(ledger.total(), 0);
        ledger.fenced_add(&fresh, 0, 1, |_| {}).unwrap();
        assert_eq!(ledger.total(), 1);
    }

    /// Another instance's acquire waits for an open fenced transaction, even past the lease's
    /// expiry on the database clock, and gets the lock after the commit, seeing its write.
    pub fn a_takeover_waits_for_an_open_fenced_transaction(f: &Fixture) {
        let mut ledger = Ledger::new(f);
        let mut next = ledger.other(f);
        let holder = f.builder().renewal(false).build().unwrap();
        let other = f.registry();
        let guard = holder
            .obtain("wait")
            .unwrap()
            .lock_with_ttl(Duration::from_millis(500))
            .unwrap();
        let (granted_tx, granted) = crossbeam_channel::bounded(1);
        let taker = std::thread::spawn(move || {
            let lock = other.obtain("wait").unwrap();
            let fresh = lock.try_lock_for(Duration::from_secs(60)).unwrap();
            let fresh = fresh.expect("granted after the fenced transaction ended");
            granted_tx.send(()).unwrap();
            let result = next.fenced_add(&fresh, 0, 10, |_| {});
            fresh.unlock().unwrap();
            result
        });
        ledger
            .fenced_add(&guard, 0, 1, |tick| {
                // The lease runs out on both clocks (the holder's deadline comes first; the
                // row's expiry follows by the drift allowance), and well beyond, while the
                // transaction keeps working (an idle one would be ended by the server).
                busy_until(tick, || !guard.is_held());
                busy_for(tick, Duration::from_millis(1500));
                assert!(
                    granted.try_recv().is_err(),
                    "another instance took the lock while a fenced transaction was open"
                );
            })
            .unwrap();
        taker.join().unwrap().unwrap();
        assert_eq!(ledger.total(), 11, "the next holder saw the fenced write");
        assert!(
            guard.unlock().is_err(),
            "the lease ran out while the transaction ran"
        );
    }

    /// A renewal by hand while the lease's own fenced transaction holds its row is refused at
    /// once, saying so, and the transaction still commits; after it, the renewal works.
    pub fn a_renewal_inside_its_own_fence_is_refused_at_once(f: &Fixture) {
        let mut ledger = Ledger::new(f);
        let registry = f.builder().renewal(false).build().unwrap();
        let guard = registry.obtain("renew-inside").unwrap().lock().unwrap();
        let mut inside_renewal = None;
        ledger
            .fenced_add(&guard, 0, 1, |_| inside_renewal = Some(guard.renew()))
            .unwrap();
        match inside_renewal.expect("renewed inside") {
            Err(e @ leasehold::Error::InvalidSetting { .. }) => {
                let text = e.to_string();
                assert!(text.contains("fenced transaction"), "{text}");
            }
            other => panic!("expected a refusal naming the fenced transaction, got {other:?}"),
        }
        assert!(guard.is_held());
        guard.renew().unwrap();
        assert_eq!(ledger.total(), 1);
        guard.unlock().unwrap();
    }

    /// A renewal by hand that meets its row locked by another session tries again until its
    /// deadline, then names the row lock, not the network.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub fn a_renewal_that_meets_a_locked_row_names_the_row_lock(f: &Fixture) {
        let registry = f
            .builder()
            .renewal(false)
            .operation_timeout(Duration::from_millis(500))
            .build()
            .unwrap();
        let guard = registry.obtain("renew-locked").unwrap().lock().unwrap();
        let mut other = Conn::open(f);
        let table = f.table();
        other.run("BEGIN");
        other.run(&format!(
            "SELECT CLIENT_ID FROM {table} WHERE LOCK_KEY = '{}' FOR UPDATE",
            leasehold::lock_key_for("renew-locked")
        ));
        let outcome = guard.renew();
        other.run("ROLLBACK");
        match outcome {
            Err(e @ leasehold::Error::Timeout { .. }) => {
                let text = e.to_string();
                assert!(
                    text.contains("stayed locked by another session")
                        && !text.contains("unreachable"),
                    "{text}"
                );
            }
            other => panic!("expected a timeout naming the row lock, got {other:?}"),
        }
        guard.renew().unwrap();
        guard.unlock().unwrap();
    }

    /// A fenced transaction that outlasts the lease keeps the holder's own renewal out (the
    /// renewal skips or waits for the locked row) longer than the fence's own extension lasts,
    /// so the lease is reported lost while the transaction runs; its commit is still safe, and
    /// the lock goes to nobody before it.
    pub fn a_fenced_transaction_longer_than_the_lease_commits_and_loses_the_lease(f: &Fixture) {
        let mut ledger = Ledger::new(f);
        let mut next = ledger.other(f);
        let holder = f.registry();
        let other = f.registry();
        let guard = holder
            .obtain("long")
            .unwrap()
            .lock_with_ttl(Duration::from_millis(600))
            .unwrap();
        let losses = guard.loss_channel();
        let (granted_tx, granted) = crossbeam_channel::bounded(1);
        let taker = std::thread::spawn(move || {
            let lock = other.obtain("long").unwrap();
            let fresh = lock.try_lock_for(Duration::from_secs(60)).unwrap();
            let fresh = fresh.expect("granted after the fenced transaction ended");
            granted_tx.send(()).unwrap();
            let result = next.fenced_add(&fresh, 0, 10, |_| {});
            fresh.unlock().unwrap();
            result
        });
        ledger
            .fenced_add(&guard, 0, 1, |tick| {
                busy_until(tick, || !losses.is_empty());
                losses
                    .try_recv()
                    .expect("the lease is lost while its row is locked");
                busy_for(tick, Duration::from_millis(600));
                assert!(
                    granted.try_recv().is_err(),
                    "another instance took the lock while a fenced transaction was open"
                );
            })
            .unwrap();
        assert!(guard.unlock().unwrap_err().is_lease_lost());
        taker.join().unwrap().unwrap();
        assert_eq!(ledger.total(), 11, "the next holder saw the fenced write");
    }

    /// A Spring Integration instance on the same table waits too: its takeover `UPDATE` of an
    /// expired row (Spring's statement, its timestamps taken from the database here) cannot
    /// complete while a fenced transaction holds the row, and takes it after the commit.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub fn a_spring_takeover_waits_for_an_open_fenced_transaction(f: &Fixture) {
        let mut ledger = Ledger::new(f);
        let mut spring = ledger.other(f);
        let holder = f.builder().renewal(false).build().unwrap();
        let guard = holder
            .obtain("spring")
            .unwrap()
            .lock_with_ttl(Duration::from_millis(1500))
            .unwrap();
        let now = match f.db {
            Db::Postgres => "(now() AT TIME ZONE 'UTC')",
            _ => "UTC_TIMESTAMP(6)",
        };
        spring.conn.wait_for_locks_at_most(1);
        let takeover = format!(
            "UPDATE {table} SET CLIENT_ID = 'spring-instance', CREATED_DATE = {now}, \
             EXPIRED_AFTER = {now} + INTERVAL '10' SECOND WHERE REGION = '{region}' \
             AND LOCK_KEY = '{key}' AND (CLIENT_ID = 'spring-instance' OR EXPIRED_AFTER < {now})",
            table = f.table(),
            region = holder.region(),
            key = leasehold::lock_key_for("spring"),
        );
        ledger
            .fenced_add(&guard, 0, 1, |tick| {
                // The takeover waits 1 s for the row, with the transaction idle meanwhile:
                // well inside the 2 s the server lets it idle (the time-to-live, rounded up).
                busy_until(tick, || !guard.is_held());
                busy_for(tick, Duration::from_millis(300));
                let waited = spring.conn.try_run(&takeover);
                assert!(
                    waited.is_err(),
                    "Spring's takeover did not wait for the fenced transaction: {waited:?}"
                );
            })
            .unwrap();
        assert_eq!(
            spring.conn.try_run(&takeover),
            Ok(1),
            "Spring takes the expired row"
        );
        assert_eq!(ledger.total(), 1);
        assert!(guard.unlock().unwrap_err().is_lease_lost());
    }

    /// A transaction on another type of database than the registry's is refused, and nothing
    /// runs in it.
    #[cfg(all(feature = "sqlite", any(feature = "postgres", feature = "mysql")))]
    pub fn a_transaction_on_another_database_type_is_refused(f: &Fixture) {
        let registry = f.registry();
        let guard = registry.obtain("elsewhere").unwrap().lock().unwrap();
        let mut conn = leasehold::rusqlite::Connection::open_in_memory().unwrap();
        let tx = conn.transaction().unwrap();
        match guard.fence(tx) {
            Err(Error::InvalidSetting { setting, reason }) => {
                assert_eq!(setting, "fence");
                assert!(reason.contains("registry's database"), "{reason}");
            }
            other => panic!("expected InvalidSetting, got {other:?}"),
        }
        assert!(
            guard.is_held(),
            "a refused transaction does not touch the lease"
        );
    }

    /// SQL run through the fenced handle that ends the transaction (here a `COMMIT`, as a
    /// statement with an implicit commit would) and writes on: the fenced commit refuses, with
    /// a typed error, and nothing written after the end commits through it. On PostgreSQL and
    /// SQLite the later write is made in a new transaction (`BEGIN`); on MySQL autocommit is off
    /// while fenced, so a write after the end opens one by itself. Afterwards the session is
    /// as before (MySQL: autocommit on).
    pub fn a_transaction_ended_inside_the_fence_is_refused_at_commit(f: &Fixture) {
        let mut ledger = Ledger::new(f);
        let mut reader = ledger.other(f);
        let registry = f.registry();
        let guard = registry.obtain("ended").unwrap().lock().unwrap();
        let table = ledger.table.clone();
        let add = |n: i64| format!("UPDATE {table} SET TOTAL = TOTAL + {n} WHERE ID = 1");
        let result = match &mut ledger.conn {
            #[cfg(feature = "sqlite")]
            Conn::Sqlite(c) => {
                let tx = guard.fence(c.transaction().unwrap()).unwrap();
                tx.execute(&add(1), []).unwrap();
                tx.execute_batch("COMMIT; BEGIN").unwrap();
                tx.execute(&add(10), []).unwrap();
                tx.commit()
            }
            #[cfg(feature = "postgres")]
            Conn::Postgres(c) => {
                let mut tx = guard.fence(c.transaction().unwrap()).unwrap();
                tx.execute(add(1).as_str(), &[]).unwrap();
                tx.batch_execute("COMMIT; BEGIN").unwrap();
                tx.execute(add(10).as_str(), &[]).unwrap();
                tx.commit()
            }
            #[cfg(feature = "mysql")]
            Conn::Mysql(c) => {
                use leasehold::mysql::prelude::Queryable;
                let tx = c.start_transaction(Default::default()).unwrap();
                let mut tx = guard.fence(tx).unwrap();
                tx.query_drop(add(1)).unwrap();
                tx.query_drop("COMMIT").unwrap();
                tx.query_drop(add(10)).unwrap();
                tx.commit()
            }
        };
        match result {
            Err(Error::InvalidSetting { setting, reason }) => {
                assert_eq!(setting, "fence");
                assert!(reason.contains("ended"), "{reason}");
            }
            other => panic!("a fenced commit of an ended transaction must be refused: {other:?}"),
        }
        assert_eq!(
            reader.total(),
            1,
            "the write before the end committed with it, the one after did not"
        );
        ledger.conn.run(&add(100));
        assert_eq!(reader.total(), 101, "the session commits as before");
        assert!(guard.is_held());
        guard.unlock().unwrap();
    }

    /// A savepoint (the postgres crate's nested `Transaction`) is refused with a typed error:
    /// its commit would only release the savepoint, and the writes would commit later with the
    /// outer transaction, after the guard was let go. So is a transaction that runs inside a
    /// savepoint (the crate rolls a dropped one back without releasing it). The outer
    /// transaction goes on without the refused writes; a fence right after `BEGIN` passes.
    #[cfg(feature = "postgres")]
    pub fn a_savepoint_is_refused_and_its_transaction_goes_on(f: &Fixture) {
        let mut ledger = Ledger::new(f);
        let mut reader = ledger.other(f);
        let registry = f.registry();
        let guard = registry.obtain("nested").unwrap().lock().unwrap();
        let table = ledger.table.clone();
        let add = |n: i64| format!("UPDATE {table} SET TOTAL = TOTAL + {n} WHERE ID = 1");
        let c = match &mut ledger.conn {
            Conn::Postgres(c) => c,
            #[allow(unreachable_patterns)]
            _ => unreachable!("a PostgreSQL fixture"),
        };
        let refused = |result: leasehold::Result<()>| match result {
            Err(Error::InvalidSetting { setting, reason }) => {
                assert_eq!(setting, "fence");
                assert!(reason.contains("savepoint"), "{reason}");
            }
            other => panic!("a savepoint must be refused: {other:?}"),
        };
        let commit = |tx: Fenced<'_, leasehold::postgres::Transaction<'_>>| {
            let _ = tx.commit();
        };

        let mut outer = c.transaction().unwrap();
        outer.execute(add(100).as_str(), &[]).unwrap();
        let mut nested = outer.transaction().unwrap();
        nested.execute(add(1000).as_str(), &[]).unwrap();
        refused(guard.fence(nested).map(commit));
        refused(guard.fence(outer.savepoint("named").unwrap()).map(commit));
        refused(guard.fence(outer).map(commit));
        assert!(
            guard.is_held(),
            "a refused transaction does not touch the lease"
        );
        assert_eq!(
            reader.total(),
            0,
            "nothing of the refused transactions commits"
        );

        let mut outer = c.transaction().unwrap();
        outer.execute(add(100).as_str(), &[]).unwrap();
        let mut nested = outer.transaction().unwrap();
        nested.execute(add(1000).as_str(), &[]).unwrap();
        refused(guard.fence(nested).map(commit));
        outer.commit().unwrap();
        assert_eq!(
            reader.total(),
            100,
            "the outer transaction commits its own writes, not the refused savepoint's"
        );

        let mut tx = guard.fence(c.transaction().unwrap()).unwrap();
        tx.execute(add(1).as_str(), &[]).unwrap();
        let mut inside = tx.transaction().unwrap();
        inside.execute(add(10).as_str(), &[]).unwrap();
        inside.commit().unwrap();
        tx.commit().unwrap();
        assert_eq!(
            reader.total(),
            111,
            "a savepoint inside a fenced transaction is fine"
        );
        guard.unlock().unwrap();
    }

    /// A fenced transaction that sits idle (its holder frozen, or just not getting on) is ended
    /// by the server about one time-to-live after its last statement, so its key frees then
    /// instead of never: another instance gets the lock within a few time-to-lives, and the
    /// idle transaction commits nothing.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub fn an_idle_fenced_transaction_frees_its_key_about_one_ttl_later(f: &Fixture) {
        const TTL: Duration = Duration::from_secs(2);
        let mut ledger = Ledger::new(f);
        let mut reader = ledger.other(f);
        let holder = f.registry();
        let other = f.registry();
        let guard = holder.obtain("idle").unwrap().lock_with_ttl(TTL).unwrap();
        let waited = |then: std::time::Instant| {
            let fresh = other.obtain("idle").unwrap().try_lock_for(TTL * 8).unwrap();
            let took = then.elapsed();
            let fresh = fresh.expect("the key freed while the fenced transaction sat idle");
            fresh.unlock().unwrap();
            took
        };
        let table = ledger.table.clone();
        let add = format!("UPDATE {table} SET TOTAL = TOTAL + 1 WHERE ID = 1");
        let (took, committed) = match &mut ledger.conn {
            #[cfg(feature = "sqlite")]
            Conn::Sqlite(_) => unreachable!("a server fixture"),
            #[cfg(feature = "postgres")]
            Conn::Postgres(c) => {
                let mut tx = guard.fence(c.transaction().unwrap()).unwrap();
                tx.execute(add.as_str(), &[]).unwrap();
                let took = waited(Instant::now());
                (took, tx.commit())
            }
            #[cfg(feature = "mysql")]
            Conn::Mysql(c) => {
                use leasehold::mysql::prelude::Queryable;
                let tx = c.start_transaction(Default::default()).unwrap();
                let mut tx = guard.fence(tx).unwrap();
                tx.query_drop(&add).unwrap();
                let took = waited(Instant::now());
                (took, tx.commit())
            }
        };
        println!(
            "{:?}: the key freed {took:?} after the transaction went idle",
            f.db
        );
        assert!(
            took < TTL * 6,
            "an idle fenced transaction kept its key for {took:?}, time-to-live {TTL:?}"
        );
        assert!(
            matches!(committed, Err(Error::Database { .. })),
            "the server ended the idle transaction: {committed:?}"
        );
        assert_eq!(reader.total(), 0, "nothing of the idle transaction commits");
        assert!(guard.unlock().unwrap_err().is_lease_lost());
    }

    /// SQLite has no server to end an idle fenced transaction: while one is open, every other
    /// writer of the file waits, and fails after its `operation_timeout` with `Timeout` — an
    /// acquire of another key too, with the fenced lease long run out. Once the transaction
    /// ends, the file is free again.
    #[cfg(feature = "sqlite")]
    pub fn on_sqlite_an_idle_fenced_transaction_keeps_every_writer_out_until_it_ends(f: &Fixture) {
        let mut ledger = Ledger::new(f);
        let holder = f.builder().renewal(false).build().unwrap();
        let other = f
            .builder()
            .operation_timeout(Duration::from_millis(500))
            .build()
            .unwrap();
        let guard = holder
            .obtain("idle")
            .unwrap()
            .lock_with_ttl(Duration::from_millis(300))
            .unwrap();
        ledger
            .fenced_add(&guard, 0, 1, |_| {
                wait_lost(|| guard.is_held());
                for key in ["idle", "elsewhere"] {
                    match other.obtain(key).unwrap().try_lock() {
                        Err(Error::Timeout { .. }) => {}
                        other => {
                            panic!("{key}: a writer got past the fenced transaction: {other:?}")
                        }
                    }
                }
            })
            .unwrap();
        assert!(other.obtain("idle").unwrap().try_lock().unwrap().is_some());
        assert!(other
            .obtain("elsewhere")
            .unwrap()
            .try_lock()
            .unwrap()
            .is_some());
        assert_eq!(ledger.total(), 1);
    }

    /// On SQLite a fenced transaction holds the file's one write lock, so another registry's
    /// acquire meets "busy" for as long as it lasts. A `lock()` without a deadline waits on
    /// through back-to-back fenced transactions, each longer than its `operation_timeout`,
    /// and gets the key once its holder lets it go.
    #[cfg(feature = "sqlite")]
    pub fn on_sqlite_a_lock_without_deadline_waits_through_fenced_transactions(f: &Fixture) {
        let mut ledger = Ledger::new(f);
        let holder = f.registry();
        let waiter = f
            .builder()
            .operation_timeout(Duration::from_millis(300))
            .build()
            .unwrap();
        let guard = holder.obtain("busy").unwrap().lock().unwrap();
        let (started_tx, started) = crossbeam_channel::bounded(1);
        let (done_tx, done) = crossbeam_channel::bounded(1);
        let mut start = Some((waiter, started_tx, done_tx));
        let mut thread = None;
        for round in 0..3 {
            ledger
                .fenced_add(&guard, 0, 1, |tick| {
                    if let Some((waiter, started_tx, done_tx)) = start.take() {
                        thread = Some(std::thread::spawn(move || {
                            started_tx.send(()).unwrap();
                            let got = waiter.obtain("busy").unwrap().lock();
                            let got = got.map(|guard| guard.unlock().unwrap());
                            done_tx.send(got).unwrap();
                        }));
                        started.recv_timeout(GENEROUS).unwrap();
                    }
                    // Three of the waiter's operation timeouts, while it waits.
                    busy_for(tick, Duration::from_millis(900));
                    assert!(
                        done.is_empty(),
                        "round {round}: the waiter returned while the key was held: {:?}",
                        done.try_recv()
                    );
                })
                .unwrap();
        }
        guard.unlock().unwrap();
        let got = done
            .recv_timeout(GENEROUS)
            .expect("the waiter got the key once it was let go");
        got.expect("lock() without a deadline waits instead of failing");
        thread.unwrap().join().unwrap();
        assert_eq!(ledger.total(), 3);
    }

    /// The server's bound on a fenced transaction's idle time is the lease's time-to-live,
    /// rounded up to whole seconds, or the session's own when that is tighter; the session's
    /// settings are as before once the transaction has ended.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub fn the_idle_bound_is_the_time_to_live_or_a_tighter_one_and_is_restored(f: &Fixture) {
        let mut ledger = Ledger::new(f);
        let registry = f.registry();
        let guard = registry
            .obtain("bound")
            .unwrap()
            .lock_with_ttl(Duration::from_millis(2500))
            .unwrap();
        match &mut ledger.conn {
            #[cfg(feature = "sqlite")]
            Conn::Sqlite(_) => unreachable!("a server fixture"),
            #[cfg(feature = "postgres")]
            Conn::Postgres(c) => {
                let show = "SHOW idle_in_transaction_session_timeout";
                let setting = |c: &mut leasehold::postgres::Client| -> String {
                    c.query_one(show, &[]).unwrap().get(0)
                };
                for (session, inside) in [("0", "3s"), ("1s", "1s"), ("1h", "3s")] {
                    c.batch_execute(&format!(
                        "SET idle_in_transaction_session_timeout = '{session}'"
                    ))
                    .unwrap();
                    let before = setting(c);
                    let mut tx = guard.fence(c.transaction().unwrap()).unwrap();
                    let bound: String = tx.query_one(show, &[]).unwrap().get(0);
                    assert_eq!(bound, inside, "session {session}");
                    tx.commit().unwrap();
                    assert_eq!(setting(c), before);
                }
                guard.unlock().unwrap();
            }
            #[cfg(feature = "mysql")]
            Conn::Mysql(c) => {
                use leasehold::mysql::prelude::Queryable;
                let version: String = c.query_first("SELECT VERSION()").unwrap().unwrap();
                let names = if version.contains("MariaDB") {
                    "@@SESSION.autocommit + 0, @@SESSION.wait_timeout, \
                     @@SESSION.idle_transaction_timeout, \
                     @@SESSION.idle_write_transaction_timeout, \
                     @@SESSION.idle_readonly_transaction_timeout"
                } else {
                    "@@SESSION.autocommit + 0, @@SESSION.wait_timeout"
                };
                let read = format!("SELECT CONCAT_WS(' ', {names})");
                // autocommit, wait_timeout (and on MariaDB idle_transaction_timeout, its write
                // and read-only variants) inside the fenced transaction.
                let inside_values = |tight: bool| -> &str {
                    match (version.contains("MariaDB"), tight) {
                        (true, false) => "0 3 3 0 0",
                        (true, true) => "0 3 1 0 0",
                        (false, false) => "0 3",
                        (false, true) => "0 1",
                    }
                };
                for (tight, end) in [(false, "commit"), (true, "rollback"), (true, "drop")] {
                    if tight {
                        let set = if version.contains("MariaDB") {
                            "SET SESSION idle_transaction_timeout = 1"
                        } else {
                            "SET SESSION wait_timeout = 1"
                        };
                        c.query_drop(set).unwrap();
                    }
                    let before: String = c.query_first(&read).unwrap().unwrap();
                    let tx = c.start_transaction(Default::default()).unwrap();
                    let mut tx = guard.fence(tx).unwrap();
                    let inside: String = tx.query_first(&read).unwrap().unwrap();
                    assert_eq!(inside, inside_values(tight), "before: {before}");
                    match end {
                        "commit" => tx.commit().unwrap(),
                        "rollback" => tx.rollback().unwrap(),
                        _ => drop(tx),
                    }
                    let after: String = c.query_first(&read).unwrap().unwrap();
                    assert_eq!(after, before, "after {end}");
                }
                // A fence the database refuses restores the session too.
                let before: String = c.query_first(&read).unwrap().unwrap();
                assert!(registry.force_release("bound").unwrap());
                let tx = c.start_transaction(Default::default()).unwrap();
                assert!(guard.fence(tx).unwrap_err().is_lease_lost());
                let after: String = c.query_first(&read).unwrap().unwrap();
                assert_eq!(after, before, "after a refused fence");
                assert!(guard.unlock().unwrap_err().is_lease_lost());
            }
        }
    }

    /// How long `lock_key`'s row still has on the database's clock, read now through `conn`.
    fn row_remaining(f: &Fixture, conn: &mut Conn, lock_key: &str) -> Duration {
        let table = f.table();
        let ms: f64 = match conn {
            #[cfg(feature = "sqlite")]
            Conn::Sqlite(c) => c
                .query_row(
                    &format!(
                        "SELECT (julianday(EXPIRED_AFTER) - julianday('now')) * 86400000.0 \
                         FROM {table} WHERE LOCK_KEY = ?1"
                    ),
                    [lock_key],
                    |r| r.get(0),
                )
                .unwrap(),
            #[cfg(feature = "postgres")]
            Conn::Postgres(c) => c
                .query_one(
                    format!(
                        "SELECT CAST(EXTRACT(EPOCH FROM EXPIRED_AFTER \
                         - (clock_timestamp() AT TIME ZONE 'UTC')) * 1000 AS FLOAT8) \
                         FROM {table} WHERE LOCK_KEY = $1"
                    )
                    .as_str(),
                    &[&lock_key],
                )
                .unwrap()
                .get(0),
            #[cfg(feature = "mysql")]
            Conn::Mysql(c) => {
                use leasehold::mysql::prelude::Queryable;
                let micros: i64 = c
                    .exec_first(
                        format!(
                            "SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), EXPIRED_AFTER) \
                             FROM {table} WHERE LOCK_KEY = ?"
                        ),
                        (lock_key,),
                    )
                    .unwrap()
                    .unwrap();
                micros as f64 / 1000.0
            }
        };
        Duration::from_secs_f64(ms.max(0.0) / 1000.0)
    }

    /// A fenced transaction of 70 % of the time-to-live, begun late in the lease and open
    /// across the instant its renewal falls due (which skips or waits for the row the
    /// transaction holds), keeps the lease: the fence's statement extends the row, and the
    /// holder's deadline follows it — while the transaction holds the row, and on commit. The
    /// deadline after the commit is no later than the row's expiry on the database's clock,
    /// and the background renewal goes on from there.
    pub fn a_fenced_transaction_shorter_than_the_lease_keeps_it(f: &Fixture) {
        const TTL: Duration = Duration::from_secs(2);
        let mut ledger = Ledger::new(f);
        let mut reader = ledger.other(f);
        // Renewed every second: the renewal falls due half-way through the lease.
        let registry = f
            .builder()
            .renew_every(Duration::from_secs(1))
            .build()
            .unwrap();
        let guard = registry
            .obtain("seventy")
            .unwrap()
            .lock_with_ttl(TTL)
            .unwrap();
        let losses = guard.loss_channel();
        // The deadline the grant gave, which no renewal moves while the row is locked.
        let granted_until = Instant::now() + guard.remaining();
        // The fence comes 600 ms into the lease (before its renewal is due at 1 s).
        std::thread::sleep(Duration::from_millis(600));
        let fenced_at = Instant::now();
        ledger
            .fenced_add(&guard, 0, 1, |tick| {
                // Open across the renewal's due instant and past the grant's deadline.
                busy_until(tick, || {
                    Instant::now() > granted_until + Duration::from_millis(50)
                });
                assert!(
                    guard.is_held(),
                    "the lease ran out inside its fenced transaction"
                );
            })
            .unwrap();
        println!(
            "{:?}: fenced transaction of {:?} kept the lease",
            f.db,
            fenced_at.elapsed()
        );
        assert!(guard.is_held(), "the commit lost the lease");
        assert!(
            losses.is_empty(),
            "a loss was reported: {:?}",
            losses.try_recv()
        );
        let lock_key = leasehold::lock_key_for("seventy");
        let row = row_remaining(f, &mut reader.conn, &lock_key);
        let holder = guard.remaining();
        assert!(
            holder <= row,
            "the holder counts on {holder:?} more, the row on the database's clock {row:?}"
        );
        // The renewal takes over again: the lease outlives another two time-to-lives.
        let until = Instant::now() + TTL * 2;
        while Instant::now() < until {
            assert!(guard.is_held(), "lost after the fenced transaction");
            std::thread::sleep(Duration::from_millis(50));
        }
        guard.unlock().unwrap();
        assert_eq!(ledger.total(), 1);
    }

    /// A reader/writer lock's sides judge each other's rows by reading them, without waiting
    /// for a fenced transaction: a read guard's fence does not renew its lease, so a writer of
    /// another instance that enters once the read slot has expired on the database's clock
    /// never holds beside a reader that still counts itself held.
    pub fn a_read_guards_fence_never_outlasts_its_slot_for_a_writer(f: &Fixture) {
        const TTL: Duration = Duration::from_secs(1);
        let mut ledger = Ledger::new(f);
        let readers = f.builder().renewal(false).build().unwrap();
        let writers = f.registry();
        let read = readers
            .rw_lock("shared")
            .unwrap()
            .try_read_for_with_ttl(GENEROUS, TTL)
            .unwrap()
            .expect("free");
        let granted_until = Instant::now() + read.remaining();
        std::thread::sleep(Duration::from_millis(300));
        let (wrote_tx, wrote) = crossbeam_channel::bounded(1);
        let writer = std::thread::spawn(move || {
            let write = writers
                .rw_lock("shared")
                .unwrap()
                .try_write_for(GENEROUS)
                .unwrap();
            wrote_tx.send(()).unwrap();
            drop(write.expect("the writer gets in"));
        });
        ledger
            .fenced_add(&read, 0, 1, |tick| {
                busy_until(tick, || {
                    let writing = !wrote.is_empty();
                    assert!(
                        !(writing && read.is_held()),
                        "a writer holds beside a reader that counts itself held"
                    );
                    Instant::now() > granted_until + TTL
                });
            })
            .unwrap();
        assert!(!read.is_held(), "the fence renewed a read guard's lease");
        writer.join().unwrap();
        drop(read);
    }

    /// Fenced transactions of one lease run one at a time (each holds the row's write lock):
    /// a thread that fences a second one while its first is open is refused at once instead
    /// of waiting for itself, and another thread's fence waits for the first to end.
    pub fn fenced_transactions_of_one_lease_run_one_at_a_time(f: &Fixture) {
        let mut ledger = Ledger::new(f);
        let mut second = ledger.other(f);
        let mut third = ledger.other(f);
        // A leadership can be shared between threads (a lock guard cannot).
        let election = LeaderElection::builder(f.builder(), "one-at-a-time")
            .build()
            .unwrap();
        let guard = election.acquire().unwrap();
        let (entered_tx, entered) = crossbeam_channel::bounded(1);
        std::thread::scope(|scope| {
            ledger
                .fenced_add(&guard, 0, 1, |tick| {
                    match second.fenced_add(&guard, 0, 10, |_| panic!("a second fence passed")) {
                        Err(Error::InvalidSetting { setting, reason }) => {
                            assert_eq!(setting, "fence");
                            assert!(reason.contains("this thread"), "{reason}");
                        }
                        other => panic!("expected a refusal, got {other:?}"),
                    }
                    let guard = &guard;
                    let third = &mut third;
                    let entered_tx = entered_tx.clone();
                    scope.spawn(move || {
                        third
                            .fenced_add(guard, 0, 100, |_| entered_tx.send(()).unwrap())
                            .unwrap();
                    });
                    busy_for(tick, Duration::from_millis(300));
                    assert!(
                        entered.is_empty(),
                        "another thread's fence got past an open one of the same lease"
                    );
                })
                .unwrap();
            entered
                .recv_timeout(GENEROUS)
                .expect("the other thread's fence passed once the first ended");
        });
        assert_eq!(ledger.total(), 101);
        guard.resign().unwrap();
    }

    /// A fenced transaction that rolls back leaves the row's expiry as it was, and so the
    /// holder's deadline: kept only while the transaction held the row, the lease is lost
    /// once it ends if its deadline passed meanwhile.
    pub fn a_rolled_back_fenced_transaction_gives_the_lease_nothing(f: &Fixture) {
        let mut ledger = Ledger::new(f);
        let mut reader = ledger.other(f);
        let registry = f.builder().renewal(false).build().unwrap();
        let guard = registry
            .obtain("rolled-back")
            .unwrap()
            .lock_with_ttl(Duration::from_secs(2))
            .unwrap();
        let granted_until = Instant::now() + guard.remaining();
        std::thread::sleep(Duration::from_millis(600));
        // The transaction ends by unwinding: the fenced handle's drop rolls it back.
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            ledger.fenced_add(&guard, 0, 1, |tick| {
                busy_until(tick, || {
                    Instant::now() > granted_until + Duration::from_millis(50)
                });
                assert!(
                    guard.is_held(),
                    "the row is held while the transaction is open"
                );
                panic!("rolled back on purpose");
            })
        }));
        assert!(unwound.is_err());
        assert!(!guard.is_held(), "a rolled-back fence kept the lease");
        let row = row_remaining(f, &mut reader.conn, &leasehold::lock_key_for("rolled-back"));
        assert_eq!(
            row,
            Duration::ZERO,
            "the rolled-back fence extended the row"
        );
        assert_eq!(reader.total(), 0);
    }

    /// A holder paused between its own check of the lease and the fence statement, resumed
    /// after its lease ran out and another instance took the lock: the database refuses it,
    /// and nothing of its transaction commits.
    #[cfg(feature = "failpoints")]
    pub fn a_resumed_stale_holder_is_refused_by_the_database(f: &Fixture) {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Mutex};
        // The fail point is process-wide: one test of this binary configures it at a time.
        static GATE: Mutex<()> = Mutex::new(());
        let _serial = GATE.lock().unwrap_or_else(|e| e.into_inner());
        let (entered_tx, entered) = crossbeam_channel::bounded::<()>(1);
        let (open, open_rx) = crossbeam_channel::bounded::<()>(1);
        let armed = Arc::new(AtomicBool::new(true));
        let arm = Arc::clone(&armed);
        fail::cfg_callback("fence::before_check", move || {
            let stale = std::thread::current().name() == Some("stale-holder");
            if stale && arm.swap(false, Ordering::SeqCst) {
                let _ = entered_tx.send(());
                let _ = open_rx.recv_timeout(GENEROUS);
            }
        })
        .unwrap();

        let mut ledger = Ledger::new(f);
        let mut stale_ledger = ledger.other(f);
        let crashed = f.builder().renewal(false).build().unwrap();
        let db = f.db;
        let stale = std::thread::Builder::new()
            .name("stale-holder".into())
            .spawn(move || {
                let guard = crashed
                    .obtain("stale")
                    .unwrap()
                    .lock_with_ttl(Duration::from_millis(300))
                    .unwrap();
                let early = if db == Db::Sqlite { 0 } else { 100 };
                let result = stale_ledger.fenced_add(&guard, early, 1, |_| {
                    panic!("a stale holder's fence passed")
                });
                (result, guard.is_held())
            })
            .unwrap();
        entered
            .recv_timeout(GENEROUS)
            .expect("the stale holder reached its fence");
        let fresh = f
            .registry()
            .obtain("stale")
            .unwrap()
            .try_lock_for(GENEROUS)
            .unwrap()
            .expect("taken over after the stale lease ran out");
        open.send(()).unwrap();
        let (result, still_held) = stale.join().unwrap();
        fail::remove("fence::before_check");
        assert!(!armed.load(Ordering::SeqCst));
        lost_reason(result);
        assert!(!still_held);
        assert_eq!(
            ledger.total(),
            0,
            "nothing of the stale holder's transaction commits"
        );
        ledger.fenced_add(&fresh, 0, 1, |_| {}).unwrap();
        assert_eq!(ledger.total(), 1);
    }
}

macro_rules! fenced {
    ($db:expr) => {
        crate::suite_for!($db;
            every_primitive_commits_a_fenced_write_while_it_holds,
            fence_sql_finds_the_row_only_while_held,
            a_fence_on_a_lost_lease_fails_at_once,
            the_database_refuses_a_fence_after_the_row_was_taken,
            a_takeover_waits_for_an_open_fenced_transaction,
            a_fenced_transaction_longer_than_the_lease_commits_and_loses_the_lease,
            a_transaction_ended_inside_the_fence_is_refused_at_commit,
            a_renewal_inside_its_own_fence_is_refused_at_once,
            a_fenced_transaction_shorter_than_the_lease_keeps_it,
            a_rolled_back_fenced_transaction_gives_the_lease_nothing,
            fenced_transactions_of_one_lease_run_one_at_a_time,
            a_read_guards_fence_never_outlasts_its_slot_for_a_writer,
        );
        #[cfg(feature = "failpoints")]
        crate::suite_for!($db; a_resumed_stale_holder_is_refused_by_the_database);
    };
}

#[cfg(feature = "sqlite")]
mod sqlite {
    fenced!(crate::common::Db::Sqlite);
    crate::suite_for!(crate::common::Db::Sqlite;
        on_sqlite_an_idle_fenced_transaction_keeps_every_writer_out_until_it_ends,
        on_sqlite_a_lock_without_deadline_waits_through_fenced_transactions,
    );
}

#[cfg(feature = "postgres")]
mod postgres {
    fenced!(crate::common::Db::Postgres);
    #[cfg(feature = "sqlite")]
    crate::suite_for!(crate::common::Db::Postgres; a_transaction_on_another_database_type_is_refused);
    crate::suite_for!(crate::common::Db::Postgres; a_spring_takeover_waits_for_an_open_fenced_transaction);
    crate::suite_for!(crate::common::Db::Postgres;
        a_renewal_that_meets_a_locked_row_names_the_row_lock,
        a_savepoint_is_refused_and_its_transaction_goes_on,
        an_idle_fenced_transaction_frees_its_key_about_one_ttl_later,
        the_idle_bound_is_the_time_to_live_or_a_tighter_one_and_is_restored,
    );
}

#[cfg(feature = "mysql")]
mod mysql {
    fenced!(crate::common::Db::Mysql);
    #[cfg(feature = "sqlite")]
    crate::suite_for!(crate::common::Db::Mysql; a_transaction_on_another_database_type_is_refused);
    crate::suite_for!(crate::common::Db::Mysql; a_spring_takeover_waits_for_an_open_fenced_transaction);
    crate::suite_for!(crate::common::Db::Mysql;
        a_renewal_that_meets_a_locked_row_names_the_row_lock,
        an_idle_fenced_transaction_frees_its_key_about_one_ttl_later,
        the_idle_bound_is_the_time_to_live_or_a_tighter_one_and_is_restored,
    );
}

/// The example's ledger, run by the chaos test's child processes.
#[cfg(all(unix, feature = "sqlite"))]
#[allow(dead_code)]
#[path = "../examples/fenced_ledger.rs"]
mod ledger_example;

/// The child process of the chaos test (a no-op unless the test started it): runs the
/// example's sections with the options in `FENCED_LEDGER_CHILD`, one per line.
#[cfg(all(unix, feature = "sqlite"))]
#[test]
fn fenced_ledger_child() {
    let Ok(args) = std::env::var("FENCED_LEDGER_CHILD") else {
        return;
    };
    let options = ledger_example::Options::parse(args.lines().map(String::from)).unwrap();
    ledger_example::run(&options).unwrap();
}

/// Chaos: three processes run the example's sections on one ledger while this test stops one
/// of them (`SIGSTOP`) inside its section for three times its lease and resumes it, again and
/// again. Fenced, the ledger ends with exactly one increment per committed section; the same
/// run unfenced (the control) loses updates.
#[cfg(all(unix, feature = "sqlite"))]
mod chaos {
    use crate::common::{Db, Fixture};
    use crate::ledger_example::{Ledger, Mode};
    use std::io::{BufRead, BufReader};
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    const TTL: Duration = Duration::from_secs(1);
    const STOPPED_FOR: Duration = Duration::from_secs(4);
    /// Stops that must catch a holder inside its section (a stop that comes too late, after
    /// the section ended, does not count).
    const STOPS: u32 = 3;
    const CHILDREN: usize = 3;

    /// What one run counted.
    #[derive(Debug, Default)]
    struct Run {
        committed: i64,
        refused: u32,
        failed: u32,
        total: i64,
        /// Stops that caught a holder inside its section (no outcome until it was resumed).
        inside: u32,
    }

    fn database(f: &Fixture) -> String {
        match f.db {
            Db::Sqlite => f.sqlite_path().to_string_lossy().into_owned(),
            Db::Postgres => crate::common::postgres_url(),
            Db::Mysql => crate::common::mysql_url(),
        }
    }

    fn signal(child: &Child, signal: libc::c_int) {
        // SAFETY: kill(2) on the id of a child this test started and has not reaped.
        #[allow(unsafe_code)]
        let sent = unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        assert_eq!(sent, 0, "signal {signal} to child {}", child.id());
    }

    /// Runs the children in `mode`, stopping one at each `stop_at` step ("granted" or "read").
    fn run(f: &Fixture, mode: Mode, stop_at: &[&str]) -> Run {
        let database = database(f);
        let table = format!("{}LEDGER", f.prefix);
        let mut ledger = Ledger::open(&database).unwrap();
        ledger.create(&table).unwrap();
        let until = f.sqlite_path().with_file_name(format!("stop-{mode:?}"));
        let mode_name = format!("{mode:?}").to_lowercase();
        let args = [
            database.as_str(),
            "--prefix",
            &f.prefix,
            "--mode",
            &mode_name,
            "--sections",
            "0",
            "--until",
            &until.to_string_lossy(),
            "--ttl-ms",
            &TTL.as_millis().to_string(),
            "--pause-ms",
            "500",
        ]
        .join("\n");
        let (lines_tx, lines) = crossbeam_channel::unbounded::<(usize, String)>();
        let mut children = Vec::new();
        for index in 0..CHILDREN {
            let mut child = Command::new(std::env::current_exe().unwrap())
                .args(["fenced_ledger_child", "--exact", "--nocapture"])
                .env("FENCED_LEDGER_CHILD", &args)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let out = BufReader::new(child.stdout.take().unwrap());
            let tx = lines_tx.clone();
            std::thread::spawn(move || {
                for line in out.lines().map_while(Result::ok) {
                    let _ = tx.send((index, line));
                }
            });
            children.push(child);
        }
        drop(lines_tx);

        let mut run = Run::default();
        let mut stops = 0;
        // (child, section, resume at, whether its outcome was seen)
        let mut stopped: Option<(usize, u64, Instant, bool)> = None;
        let mut settled_at = Instant::now() + Duration::from_secs(1);
        let started = Instant::now();
        let give_up = started + Duration::from_secs(50);
        // CHAOS_TRACE=1 prints every step and stop, for a look at a run.
        let trace = std::env::var_os("CHAOS_TRACE").is_some();
        let count = |run: &mut Run, line: &str| -> Option<(String, u64)> {
            let mut words = line.split_whitespace();
            let step = words.next()?.to_string();
            let section: u64 = words.next()?.parse().ok()?;
            match step.as_str() {
                "committed" => run.committed += 1,
                "refused" => run.refused += 1,
                "failed" => run.failed += 1,
                _ => {}
            }
            Some((step, section))
        };
        loop {
            let now = Instant::now();
            if let Some((child, _, resume_at, seen)) = stopped {
                if now >= resume_at {
                    signal(&children[child], libc::SIGCONT);
                    run.inside += u32::from(!seen);
                    stopped = None;
                    settled_at = now + Duration::from_secs(1);
                }
            }
            if stopped.is_none() && (run.inside >= STOPS && now >= settled_at || now >= give_up) {
                break;
            }
            let Ok((child, line)) = lines.recv_timeout(Duration::from_millis(20)) else {
                continue;
            };
            if trace {
                println!("{:>8.3?} child {child}: {line}", started.elapsed());
            }
            let Some((step, section)) = count(&mut run, &line) else {
                continue;
            };
            if let Some((held, at_section, _, seen)) = &mut stopped {
                if *held == child && *at_section == section && step != "read" && step != "granted" {
                    *seen = true;
                }
            }
            if stopped.is_none()
                && run.inside < STOPS
                && Instant::now() >= settled_at
                && stop_at[stops as usize % stop_at.len()] == step
            {
                signal(&children[child], libc::SIGSTOP);
                if trace {
                    println!("{:>8.3?} SIGSTOP child {child}", started.elapsed());
                }
                stopped = Some((child, section, Instant::now() + STOPPED_FOR, false));
                stops += 1;
            }
        }
        std::fs::write(&until, b"").unwrap();
        let ended = Instant::now() + Duration::from_secs(60);
        for child in &mut children {
            loop {
                if let Some(status) = child.try_wait().unwrap() {
                    assert!(status.success(), "a ledger child failed: {status}");
                    break;
                }
                if Instant::now() > ended {
                    let _ = child.kill();
                    panic!("a ledger child did not stop");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        for (_, line) in lines.iter() {
            count(&mut run, &line);
        }
        assert!(
            run.inside >= STOPS,
            "{stops} stops, of which fewer than {STOPS} caught a holder inside its section \
             within 50 s: {run:?}"
        );
        run.total = ledger.total(&table).unwrap();
        match &mut ledger {
            Ledger::Sqlite(_) => {}
            #[cfg(feature = "postgres")]
            Ledger::Postgres(c) => c.batch_execute(&format!("DROP TABLE {table}")).unwrap(),
            #[cfg(feature = "mysql")]
            Ledger::Mysql(c) => {
                use leasehold::mysql::prelude::Queryable;
                c.query_drop(format!("DROP TABLE {table}")).unwrap()
            }
        }
        run
    }

    pub fn fenced_sections_never_lose_an_update_when_holders_are_stopped(f: &Fixture) {
        let run = run(f, Mode::Fenced, &["read", "granted"]);
        println!("{:?} fenced: {run:?}", f.db);
        assert!(
            run.inside >= 1,
            "no stop caught a holder inside its section: {run:?}"
        );
        assert!(run.committed > 0, "{run:?}");
        assert_eq!(
            run.total, run.committed,
            "exactly one increment per committed section: {run:?}"
        );
    }

    /// The control: the same run without the fence loses updates. On SQLite a plain
    /// transaction that read before a takeover cannot write afterwards (its snapshot is
    /// stale), so its control writes outside a transaction.
    pub fn unfenced_sections_lose_updates_when_holders_are_stopped(f: &Fixture) {
        let mode = match f.db {
            Db::Sqlite => Mode::Autocommit,
            _ => Mode::Plain,
        };
        let run = run(f, mode, &["read"]);
        println!("{:?} {mode:?}: {run:?}", f.db);
        assert!(
            run.total < run.committed,
            "the control lost no update, so the chaos run proves nothing: {run:?}"
        );
    }

    /// One `#[test]` per chaos function for a backend (as `suite_for!` does for `suite`).
    macro_rules! chaos_for {
        ($db:expr) => {
            #[test]
            fn fenced_sections_never_lose_an_update_when_holders_are_stopped() {
                let name = "chaos_fenced";
                if let Some(f) = crate::common::Fixture::new($db, name) {
                    super::fenced_sections_never_lose_an_update_when_holders_are_stopped(&f);
                }
            }

            #[test]
            fn unfenced_sections_lose_updates_when_holders_are_stopped() {
                if let Some(f) = crate::common::Fixture::new($db, "chaos_unfenced") {
                    super::unfenced_sections_lose_updates_when_holders_are_stopped(&f);
                }
            }
        };
    }

    mod sqlite {
        chaos_for!(crate::common::Db::Sqlite);
    }

    #[cfg(feature = "postgres")]
    mod postgres {
        chaos_for!(crate::common::Db::Postgres);
    }

    #[cfg(feature = "mysql")]
    mod mysql {
        chaos_for!(crate::common::Db::Mysql);
    }
}
