//! Many leases, few connections: one registry holds thousands of locks across several renewals
//! and loses none, renewing them in batches rather than one statement each, on every backend —
//! also tens of thousands while busy processes keep every core of the machine occupied, where
//! renewals run late and a late lease must cost no other its renewal; and a registry holding
//! one lock keeps at most two connections open at rest, counted by the server (PostgreSQL
//! `pg_stat_activity` by `application_name`, MariaDB `PROCESSLIST` by a user of the test's
//! own). SQLite has no server to count them: its pooled connections are open files, opened and
//! closed by the same pool code.

mod common;

mod suite {
    use crate::common::cpu_hogs::CpuHogs;
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    use crate::common::Db;
    use crate::common::Fixture;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    const LEASES: usize = 2_000;

    /// The test under load runs alone: the others of this file (which `cargo test` runs in
    /// parallel) take it shared, so that no test meets another's CPU hogs and no two sets of
    /// hogs add up.
    static UNDER_LOAD: RunAlone = RunAlone(std::sync::RwLock::new(()));

    struct RunAlone(std::sync::RwLock<()>);

    impl RunAlone {
        fn write(&self) -> std::sync::RwLockWriteGuard<'_, ()> {
            self.0
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
        }

        fn read(&self) -> std::sync::RwLockReadGuard<'_, ()> {
            self.0
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
        }
    }

    /// Counts the connections one registry has open, as its database server sees them.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    enum Census {
        #[cfg(feature = "postgres")]
        Postgres {
            admin: Box<postgres::Client>,
            application_name: String,
        },
        #[cfg(feature = "mysql")]
        Mysql {
            admin: Box<mysql::Conn>,
            users: Vec<String>,
        },
    }

    #[cfg(any(feature = "postgres", feature = "mysql"))]
    impl Census {
        /// A builder for a registry on `f`'s table whose connections the census can tell from
        /// everyone else's (`who` names it), and the census.
        fn new(f: &Fixture, who: &str) -> (leasehold::RegistryBuilder, Census) {
            let tag = format!("lh_{who}_{}", std::process::id());
            match f.db {
                #[cfg(feature = "postgres")]
                Db::Postgres => {
                    let url = crate::common::postgres_url();
                    let admin =
                        postgres::Client::connect(&url, postgres::NoTls).expect("PostgreSQL");
                    let tagged = if !url.contains("://") {
                        format!("{url} application_name={tag}")
                    } else if url.contains('?') {
                        format!("{url}&application_name={tag}")
                    } else {
                        format!("{url}?application_name={tag}")
                    };
                    let builder = leasehold::LockRegistry::postgres(tagged);
                    let census = Census::Postgres {
                        admin: Box::new(admin),
                        application_name: tag,
                    };
                    (fixture_settings(f, builder), census)
                }
                #[cfg(feature = "mysql")]
                Db::Mysql => {
                    use mysql::prelude::Queryable;
                    let url = crate::common::mysql_url();
                    let opts = mysql::Opts::from_url(&url).expect("MySQL URL");
                    let database = opts.get_db_name().unwrap_or("test").to_string();
                    let mut admin = mysql::Conn::new(opts).expect("MySQL");
                    // 'localhost' too: the driver may switch to the server's socket.
                    let mut users = Vec::new();
                    for host in ["%", "localhost"] {
                        let user = format!("'{tag}'@'{host}'");
                        admin
                            .query_drop(format!("DROP USER IF EXISTS {user}"))
                            .and_then(|()| admin.query_drop(format!("CREATE USER {user}")))
                            .and_then(|()| {
                                admin.query_drop(format!("GRANT ALL ON `{database}`.* TO {user}"))
                            })
                            .expect("a user of the test's own (needs CREATE USER)");
                        users.push(user);
                    }
                    let rest = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
                    let server = rest.rsplit_once('@').map_or(rest, |(_, server)| server);
                    let builder = leasehold::LockRegistry::mysql(format!("mysql://{tag}@{server}"));
                    let admin = Box::new(admin);
                    (fixture_settings(f, builder), Census::Mysql { admin, users })
                }
                #[allow(unreachable_patterns)]
                other => panic!("{other:?} support is not compiled in"),
            }
        }

        /// The registry's open connections now.
        fn count(&mut self) -> usize {
            match self {
                #[cfg(feature = "postgres")]
                Census::Postgres {
                    admin,
                    application_name,
                } => {
                    let row = admin
                        .query_one(
                            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                            &[application_name],
                        )
                        .expect("pg_stat_activity");
                    row.get::<_, i64>(0) as usize
                }
                #[cfg(feature = "mysql")]
                Census::Mysql { admin, users } => {
                    use mysql::prelude::Queryable;
                    let name = users[0].split('@').next().unwrap().trim_matches('\'');
                    let count: Option<u64> = admin
                        .exec_first(
                            "SELECT count(*) FROM information_schema.PROCESSLIST WHERE USER = ?",
                            (name,),
                        )
                        .expect("PROCESSLIST");
                    count.unwrap_or(0) as usize
                }
            }
        }
    }

    #[cfg(feature = "mysql")]
    impl Drop for Census {
        #[allow(irrefutable_let_patterns)] // with MySQL alone it is the only variant
        fn drop(&mut self) {
            if let Census::Mysql { admin, users } = self {
                use mysql::prelude::Queryable;
                for user in users {
                    let _ = admin.query_drop(format!("DROP USER IF EXISTS {user}"));
                }
            }
        }
    }

    /// What [`Fixture::builder`] sets, on a builder of another URL.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    fn fixture_settings(
        f: &Fixture,
        builder: leasehold::RegistryBuilder,
    ) -> leasehold::RegistryBuilder {
        builder
            .prefix(f.prefix.clone())
            .idle_between_tries(Duration::from_millis(20))
            .connect_timeout(Duration::from_secs(15))
    }

    /// Pools open connections on demand and close idle ones. A registry
    /// holding one lock keeps at most one main and one renewal connection (plus, on MySQL, the
    /// named-lock connection of release wake-ups while it holds a lock); one whose thread
    /// waits for a lock held elsewhere keeps one (plus the wake-up connection while it waits:
    /// PostgreSQL's listener, MySQL's watcher); once idle connections time out the holder
    /// keeps only its renewal connection (and MySQL's named-lock one), and the other registry
    /// none.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub fn one_lock_keeps_at_most_two_connections_at_rest(f: &Fixture) {
        let _beside_others = UNDER_LOAD.read();
        let idle = Duration::from_secs(3);
        // Renewals every 2 s: the renewal connection stays, and the lease survives a renewal
        // up to 4 s late on a busy machine.
        let ttl = Duration::from_secs(6);
        let lost = Arc::new(AtomicUsize::new(0));
        let (holder, mut holder_census) = Census::new(f, "holder");
        let started = Instant::now();
        let holder = {
            let lost = Arc::clone(&lost);
            holder
                .time_to_live(ttl)
                .tuning(leasehold::Tuning {
                    idle_connection_timeout: idle,
                    ..Default::default()
                })
                .on_lease_lost(move |_| {
                    lost.fetch_add(1, Ordering::SeqCst);
                })
                .build()
                .unwrap()
        };
        let guard = holder.obtain("at-rest").unwrap().lock().unwrap();
        let (mut holder_most, mut waiter_most) = (0, 0);
        let (builder, mut waiter_census) = Census::new(f, "waiter");
        let waiter = builder
            .tuning(leasehold::Tuning {
                idle_connection_timeout: idle,
                ..Default::default()
            })
            .build()
            .unwrap();
        let waiting = {
            let lock = waiter.obtain("at-rest").unwrap();
            std::thread::spawn(move || lock.try_lock_for(Duration::from_secs(3)).unwrap().is_none())
        };
        while !waiting.is_finished() {
            holder_most = holder_most.max(holder_census.count());
            waiter_most = waiter_most.max(waiter_census.count());
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(waiting.join().unwrap(), "the waiter got a held lock");
        let rest_until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < rest_until {
            holder_most = holder_most.max(holder_census.count());
            std::thread::sleep(Duration::from_millis(100));
        }
        // Idle connections close between the timeout and the pools' next look (every 30 s).
        let give_up = Instant::now() + idle + Duration::from_secs(40);
        let (mut holder_now, mut waiter_now) = (holder_census.count(), waiter_census.count());
        while (holder_now > 1 + usize::from(f.db == Db::Mysql) || waiter_now > 0)
            && Instant::now() < give_up
        {
            std::thread::sleep(Duration::from_millis(250));
            holder_now = holder_census.count();
            waiter_now = waiter_census.count();
        }
        println!(
            "{:?}: one lock held: at most {holder_most} connections; waiting elsewhere: at most \
             {waiter_most}; after {:?}: {holder_now} and {waiter_now}",
            f.db,
            started.elapsed()
        );
        // Wake-up connections: one while waiting (both servers), one while holding (MySQL);
        // on PostgreSQL the listener's probe also opens a short-lived connection once, which
        // a census taken at the wrong moment counts (README, "Connections per process"; a CI
        // run on a loaded machine saw it).
        let listener = 1 + usize::from(f.db == Db::Postgres);
        let named_locks = usize::from(f.db == Db::Mysql);
        assert!(
            holder_most <= 2 + named_locks,
            "{holder_most} connections for one held lock"
        );
        assert!(
            waiter_most <= 1 + listener,
            "{waiter_most} connections for one waiting thread"
        );
        assert!(
            holder_now <= 1 + named_locks,
            "{holder_now} connections left open by the holder"
        );
        assert_eq!(waiter_now, 0, "connections left open by the idle registry");
        assert!(guard.is_held());
        assert_eq!(lost.load(Ordering::SeqCst), 0, "the lease was lost");
        guard.unlock().unwrap();
    }

    /// Leases held under load: 100 full batches per renewal period on SQLite, 50 on a server,
    /// whose acquisitions (a round trip each, in a debug build) take most of the test's time.
    /// `benches/many_leases.rs` holds 100,000 the same way on every backend; at these sizes the
    /// test takes about a minute per backend.
    fn leases_under_load(f: &Fixture) -> usize {
        match f.db {
            crate::common::Db::Sqlite => 50_000,
            _ => 25_000,
        }
    }

    /// Threads that take (and give back) the leases of the test under load.
    const TAKERS: usize = 4;

    /// Tens of thousands of leases with the default time-to-live (10 s), taken by four threads,
    /// then held for three times that while three busy processes keep the cores occupied (the
    /// database server and the renewal threads get a share of the machine, not all of it), and
    /// given back one by one with the processes still busy: none is lost. Every lease falls due
    /// once per renewal period (a third of the time-to-live), so the registry renews 15,000
    /// leases a second on SQLite (7,500 on a server) in batches of up to 500. On a starved
    /// machine renewals run late. A late lease must cost no other lease its renewal: an attempt
    /// cut to what its most urgent lease has left fails for the whole batch, whose leases then
    /// run late in turn. And the renewer's own bookkeeping must not grow with the leases queued,
    /// or it takes the share of the machine that the statements need.
    pub fn tens_of_thousands_of_leases_outlive_three_ttls_with_the_cores_busy(f: &Fixture) {
        let _alone = UNDER_LOAD.write();
        let lost = Arc::new(AtomicUsize::new(0));
        // The first few reasons, for the failure message.
        let reasons = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let ttl = Duration::from_secs(10);
        let leases = leases_under_load(f);
        let registry = {
            let (lost, reasons) = (Arc::clone(&lost), Arc::clone(&reasons));
            f.builder()
                .time_to_live(ttl)
                .pool_size(TAKERS as u32)
                .on_lease_lost(move |event| {
                    if lost.fetch_add(1, Ordering::SeqCst) < 3 {
                        let mut reasons = reasons.lock().unwrap_or_else(|e| e.into_inner());
                        reasons.push(event.reason.to_string());
                    }
                })
                .build()
                .unwrap()
        };
        let started = Instant::now();
        // Guards belong to the thread that locked: each taker holds its share until told to
        // give it back, then says how many it still held and how many unlocks found the
        // lease theirs.
        let (held, unlocked, given_back_in) = std::thread::scope(|scope| {
            let (taken_tx, taken) = std::sync::mpsc::channel::<()>();
            let mut give_back = Vec::new();
            let mut takers = Vec::new();
            for taker in 0..TAKERS {
                let (registry, taken_tx) = (&registry, taken_tx.clone());
                let (give_back_tx, give_back_rx) = std::sync::mpsc::channel::<()>();
                give_back.push(give_back_tx);
                takers.push(scope.spawn(move || {
                    let guards: Vec<_> = (taker..leases)
                        .step_by(TAKERS)
                        .map(|n| {
                            registry
                                .obtain(&format!("loaded-{n}"))
                                .unwrap()
                                .lock()
                                .unwrap()
                        })
                        .collect();
                    taken_tx.send(()).unwrap();
                    let _ = give_back_rx.recv();
                    let held = guards.iter().filter(|guard| guard.is_held()).count();
                    let unlocked = guards
                        .into_iter()
                        .map(|guard| guard.unlock())
                        .filter(Result::is_ok)
                        .count();
                    (held, unlocked)
                }));
            }
            drop(taken_tx);
            for _ in 0..TAKERS {
                taken.recv().expect("a taker failed to lock");
            }
            let taken_in = started.elapsed();
            let lost_while_taking = lost.load(Ordering::SeqCst);
            let hogs = CpuHogs::start(3);
            let before = registry.statistics();
            // Three times the time-to-live: every lease renewed about nine times, each time in
            // a batch.
            std::thread::sleep(3 * ttl);
            let after = registry.statistics();
            println!(
                "{:?}: {leases} leases taken in {taken_in:?} ({lost_while_taking} lost \
                 meanwhile), then held {:?} with 3 CPU hogs: {} renew statements for {} \
                 renewals, {} failed; {} lost",
                f.db,
                3 * ttl,
                after.renewals - before.renewals,
                after.leases_renewed - before.leases_renewed,
                after.renewals_failed - before.renewals_failed,
                lost.load(Ordering::SeqCst)
            );
            assert_eq!(
                lost.load(Ordering::SeqCst),
                0,
                "leases lost under load (expired: {}, another holder: {}; the first: {:?})",
                after.leases_lost_expired,
                after.leases_lost_not_owner,
                reasons.lock().unwrap_or_else(|e| e.into_inner())
            );
            let giving_back = Instant::now();
            drop(give_back);
            let (held, unlocked) = takers
                .into_iter()
                .map(|taker| taker.join().unwrap())
                .fold((0, 0), |(held, unlocked), (h, u)| (held + h, unlocked + u));
            drop(hogs);
            (held, unlocked, giving_back.elapsed())
        });
        println!(
            "{:?}: given back in {given_back_in:?} with the hogs still busy; {} lost in all",
            f.db,
            lost.load(Ordering::SeqCst)
        );
        assert_eq!(held, leases, "leases not held at the end");
        assert_eq!(unlocked, leases, "unlocks that found the lease lost");
        assert_eq!(
            lost.load(Ordering::SeqCst),
            0,
            "leases lost while given back"
        );
    }

    pub fn thousands_of_held_leases_are_renewed_in_batches_and_none_is_lost(f: &Fixture) {
        let _beside_others = UNDER_LOAD.read();
        let lost = Arc::new(AtomicUsize::new(0));
        // Renewals every 2 s: a batch of thousands may run late by seconds on a busy machine
        // without a lease running out.
        let ttl = Duration::from_secs(6);
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
        // Each lease was due about three times (6,000 renewals); leases due in the same window
        // (an eighth of the renewal period) share a statement.
        assert!(
            renewals * 20 < LEASES as u64,
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

crate::suite_for!(crate::common::Db::Sqlite; thousands_of_held_leases_are_renewed_in_batches_and_none_is_lost,
    tens_of_thousands_of_leases_outlive_three_ttls_with_the_cores_busy);

#[cfg(feature = "postgres")]
mod postgres {
    crate::suite_for!(crate::common::Db::Postgres; thousands_of_held_leases_are_renewed_in_batches_and_none_is_lost,
        tens_of_thousands_of_leases_outlive_three_ttls_with_the_cores_busy,
        one_lock_keeps_at_most_two_connections_at_rest);
}

#[cfg(feature = "mysql")]
mod mysql {
    crate::suite_for!(crate::common::Db::Mysql; thousands_of_held_leases_are_renewed_in_batches_and_none_is_lost,
        tens_of_thousands_of_leases_outlive_three_ttls_with_the_cores_busy,
        one_lock_keeps_at_most_two_connections_at_rest);
}
