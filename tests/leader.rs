//! Leader election against every compiled-in database.
//!
//! Each function in `suite` takes a [`Fixture`] (its own table on one real database) and is
//! instantiated once per backend at the bottom. Waits are bounded generously so a broken build
//! fails instead of hanging; the only timing assertions are generous upper bounds (a takeover
//! after `resign()` within 10 s of a 30 s lease), and "the loss was reported before the lease
//! expired" is checked on the database clock (the time the row had left when the test looked,
//! plus how long after the report it looked). Leases that must survive last seconds, so that a
//! machine too busy to run a renewal for a second or two does not fail a test.
//!
//! How the hard cases are produced, honestly:
//! - **a killed leader**: a child process (this test binary, re-run with
//!   `--exact contender_child_process`) becomes leader and is killed with `SIGKILL`: it stops
//!   renewing and never releases.
//! - **a leader that cannot renew**: another connection takes the table's write lock and keeps
//!   it (SQLite `BEGIN IMMEDIATE`, PostgreSQL `LOCK TABLE … ACCESS EXCLUSIVE`, MySQL
//!   `LOCK TABLES … WRITE`), so renewals neither succeed nor fail: they hang or get "busy" as
//!   with an unreachable server. When the loss is reported, that same connection asks the
//!   database whether the lease row is still unexpired on the database clock.
//! - **a lease taken away**: the row is deleted under the leader.

mod common;

/// What the tests below do to the table on a plain connection of their own
/// ([`common::raw::Raw`]): hold its write lock, and read how long its leases have left.
mod raw {
    pub use crate::common::raw::Raw;

    /// Takes the write lock of `table` and keeps it until [`unblock`].
    pub fn block(raw: &mut Raw, table: &str) {
        let sql = match raw {
            #[cfg(feature = "sqlite")]
            Raw::Sqlite(_) => "BEGIN IMMEDIATE".to_string(),
            #[cfg(feature = "postgres")]
            Raw::Postgres(_) => format!("BEGIN; LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"),
            #[cfg(feature = "mysql")]
            Raw::Mysql(_) => format!("LOCK TABLES {table} WRITE"),
        };
        let _ = table;
        raw.execute_batch(&sql);
    }

    pub fn unblock(raw: &mut Raw) {
        let sql = match raw {
            #[cfg(feature = "sqlite")]
            Raw::Sqlite(_) => "COMMIT",
            #[cfg(feature = "postgres")]
            Raw::Postgres(_) => "COMMIT",
            #[cfg(feature = "mysql")]
            Raw::Mysql(_) => "UNLOCK TABLES",
        };
        raw.execute_batch(sql);
    }

    /// The most time, in milliseconds, a lease row of `table` has left on the database
    /// clock, read now (negative: every row has expired).
    pub fn longest_left_ms(raw: &mut Raw, table: &str) -> i64 {
        let left = match raw {
            #[cfg(feature = "sqlite")]
            Raw::Sqlite(_) => {
                "CAST((julianday(EXPIRED_AFTER) - julianday('now')) * 86400000 AS INTEGER)"
            }
            #[cfg(feature = "postgres")]
            Raw::Postgres(_) => {
                "CAST(EXTRACT(EPOCH FROM EXPIRED_AFTER - (clock_timestamp() AT TIME ZONE \
                 'UTC')) * 1000 AS BIGINT)"
            }
            #[cfg(feature = "mysql")]
            Raw::Mysql(_) => {
                "CAST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), EXPIRED_AFTER) DIV 1000 \
                 AS SIGNED)"
            }
        };
        raw.number(&format!("SELECT MAX({left}) FROM {table}"))
    }
}

/// What the child process needs to join a fixture's table.
mod child {
    use crate::common::{Db, Fixture};
    use leasehold::{LeaderElection, LockRegistry};
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Child, Command, Stdio};
    use std::time::Duration;

    const DB: &str = "LEASEHOLD_LEADER_CHILD_DB";
    const TARGET: &str = "LEASEHOLD_LEADER_CHILD_TARGET";
    const PREFIX: &str = "LEASEHOLD_LEADER_CHILD_PREFIX";
    const GROUP: &str = "LEASEHOLD_LEADER_CHILD_GROUP";
    const TIMINGS: &str = "LEASEHOLD_LEADER_CHILD_TIMINGS_MS";

    /// A contender in a child process; killed (SIGKILL) when dropped.
    pub struct Contender {
        process: Child,
        pub lines: crossbeam_channel::Receiver<String>,
    }

    impl Contender {
        /// Starts this test binary as a contender for `group` on `f`'s table, with
        /// (lease, keep-alive, sleep) in milliseconds.
        pub fn spawn(f: &Fixture, group: &str, timings: (u64, u64, u64)) -> Contender {
            let (db, target) = match f.db {
                Db::Sqlite => ("sqlite", f.sqlite_path().display().to_string()),
                Db::Postgres => ("postgres", crate::common::postgres_url()),
                Db::Mysql => ("mysql", crate::common::mysql_url()),
            };
            let mut process = Command::new(std::env::current_exe().expect("test binary"))
                .args(["--exact", "contender_child_process", "--nocapture"])
                .args(["--test-threads", "1"])
                .env(DB, db)
                .env(TARGET, target)
                .env(PREFIX, &f.prefix)
                .env(GROUP, group)
                .env(
                    TIMINGS,
                    format!("{},{},{}", timings.0, timings.1, timings.2),
                )
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("start the child contender");
            let stdout = process.stdout.take().expect("piped stdout");
            let (tx, lines) = crossbeam_channel::unbounded();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
            Contender { process, lines }
        }

        /// Waits for the child's `ELECTED <term>` line.
        pub fn elected(&self, within: Duration) -> u64 {
            let deadline = std::time::Instant::now() + within;
            loop {
                let line = self
                    .lines
                    .recv_deadline(deadline)
                    .expect("the child contender was not elected in time");
                // libtest may have printed "test contender_child_process ... " first.
                if let Some((_, term)) = line.split_once("ELECTED ") {
                    return term.trim().parse().expect("a term number");
                }
            }
        }

        /// Kills the process without letting it release anything.
        pub fn kill(&mut self) {
            let _ = self.process.kill();
            let _ = self.process.wait();
        }
    }

    impl Drop for Contender {
        fn drop(&mut self) {
            self.kill();
        }
    }

    /// The child's side: runs only when the parent set the environment.
    pub fn run_if_asked() {
        let Ok(db) = std::env::var(DB) else { return };
        let target = std::env::var(TARGET).expect(TARGET);
        let builder = match db.as_str() {
            #[cfg(feature = "sqlite")]
            "sqlite" => LockRegistry::sqlite(target),
            #[cfg(feature = "postgres")]
            "postgres" => LockRegistry::postgres(target),
            #[cfg(feature = "mysql")]
            "mysql" => LockRegistry::mysql(target),
            other => panic!("{other} support is not compiled in"),
        };
        let ms: Vec<u64> = std::env::var(TIMINGS)
            .expect(TIMINGS)
            .split(',')
            .map(|n| n.parse().expect("milliseconds"))
            .collect();
        let election = LeaderElection::builder(
            builder.prefix(std::env::var(PREFIX).expect(PREFIX)),
            std::env::var(GROUP).expect(GROUP),
        )
        .lease_duration(Duration::from_millis(ms[0]))
        .lock_keep_alive_period(Duration::from_millis(ms[1]))
        .lock_acquire_sleep_interval(Duration::from_millis(ms[2]))
        .build()
        .expect("child election");
        let leadership = election.acquire().expect("child elected");
        println!("ELECTED {}", leadership.term());
        std::io::stdout().flush().expect("flush");
        // Lead (renewing) until killed; the parent never lets it get this far.
        std::thread::sleep(Duration::from_secs(120));
    }
}

mod suite {
    use crate::common::Fixture;
    use crate::raw::{self, Raw};
    use leasehold::{
        Error, LeaderElection, LeaderElectionBuilder, Leadership, LeadershipLossReason,
        LeadershipLost, LossReason,
    };
    use parking_lot::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::thread;
    use std::time::{Duration, Instant, SystemTime};

    const GENEROUS: Duration = Duration::from_secs(20);
    const HOUR: Duration = Duration::from_secs(3600);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// An election of `group` on the fixture's table with (lease, keep-alive, sleep) timings.
    fn election(f: &Fixture, group: &str, timings: (u64, u64, u64)) -> LeaderElectionBuilder {
        LeaderElection::builder(f.builder(), group)
            .lease_duration(ms(timings.0))
            .lock_keep_alive_period(ms(timings.1))
            .lock_acquire_sleep_interval(ms(timings.2))
    }

    /// Waits until `condition` holds, or panics after [`GENEROUS`].
    fn eventually(what: &str, condition: impl Fn() -> bool) {
        let deadline = Instant::now() + GENEROUS;
        while !condition() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            thread::sleep(ms(5));
        }
    }

    /// One term as a contender saw it.
    #[derive(Debug, Clone, Copy)]
    struct Term {
        number: u64,
        contender: usize,
        start: Instant,
        end: Instant,
    }

    /// Records terms and catches two leaders at once: every leader sets a shared flag for the
    /// whole of its term, and finding it set already is an overlap.
    #[derive(Default)]
    struct Checker {
        inside: AtomicBool,
        overlaps: AtomicUsize,
        terms: Mutex<Vec<Term>>,
    }

    impl Checker {
        /// Acts as leader for `hold`, checking that nobody else does and that the term stays
        /// held throughout.
        fn lead(&self, contender: usize, leadership: &Leadership, hold: Duration) {
            assert!(leadership.is_leader(), "a fresh term must be held");
            if self.inside.swap(true, Ordering::SeqCst) {
                self.overlaps.fetch_add(1, Ordering::SeqCst);
            }
            let start = Instant::now();
            thread::sleep(hold);
            assert!(leadership.is_leader(), "term lost while leading");
            let end = Instant::now();
            self.inside.store(false, Ordering::SeqCst);
            self.terms.lock().push(Term {
                number: leadership.term(),
                contender,
                start,
                end,
            });
        }

        /// No overlap, and terms in time order carry increasing numbers.
        fn verify(&self, expected_terms: usize) {
            assert_eq!(
                self.overlaps.load(Ordering::SeqCst),
                0,
                "two leaders at once"
            );
            let mut terms = self.terms.lock().clone();
            assert_eq!(terms.len(), expected_terms);
            terms.sort_by_key(|t| t.start);
            for pair in terms.windows(2) {
                assert!(pair[0].end <= pair[1].start, "overlapping terms: {pair:?}");
                assert!(pair[0].number < pair[1].number, "term numbers: {pair:?}");
            }
            let leaders: std::collections::HashSet<usize> =
                terms.iter().map(|t| t.contender).collect();
            assert!(leaders.len() > 1, "only one contender ever led: {terms:?}");
        }
    }

    /// Every contender takes `rounds` terms, each `hold` long, then resigns.
    fn compete(elections: Vec<LeaderElection>, rounds: usize, hold: Duration) -> Arc<Checker> {
        let checker = Arc::new(Checker::default());
        let contenders: Vec<_> = elections
            .into_iter()
            .enumerate()
            .map(|(i, election)| {
                let checker = Arc::clone(&checker);
                thread::spawn(move || {
                    for _ in 0..rounds {
                        let leadership = election
                            .try_acquire_for(GENEROUS)
                            .unwrap()
                            .expect("elected eventually");
                        checker.lead(i, &leadership, hold);
                        leadership.resign().unwrap();
                    }
                })
            })
            .collect();
        for contender in contenders {
            contender.join().unwrap();
        }
        checker
    }

    pub fn never_two_leaders_at_once(f: &Fixture) {
        const CONTENDERS: usize = 4;
        const ROUNDS: usize = 4;
        let elections = (0..CONTENDERS)
            .map(|_| election(f, "singleton", (6000, 1000, 20)).build().unwrap())
            .collect();
        compete(elections, ROUNDS, ms(10)).verify(CONTENDERS * ROUNDS);
    }

    pub fn skewed_client_clocks_cannot_make_a_second_leader(f: &Fixture) {
        // Renewed every second, the lease survives a renewal 2.5 s late.
        let timings = (4000, 1000, 20);
        let ahead = election(f, "skewed", timings)
            .client_clock(|| SystemTime::now() + HOUR)
            .max_allowable_diff_from_db_time(ms(1000))
            .build()
            .unwrap();
        let behind = election(f, "skewed", timings)
            .client_clock(|| SystemTime::now() - HOUR)
            .max_allowable_diff_from_db_time(ms(1000))
            .build()
            .unwrap();
        // The same skew with the correction off: measured, reported, not applied.
        let uncorrected = election(f, "skewed", timings)
            .client_clock(|| SystemTime::now() + HOUR)
            .build()
            .unwrap();
        let close = |a: SystemTime, b: SystemTime| {
            let gap = a.duration_since(b).unwrap_or_else(|e| e.duration());
            gap < Duration::from_secs(60)
        };
        for (e, database_ahead) in [(&ahead, false), (&behind, true), (&uncorrected, false)] {
            let offset = e.clock_offset();
            let error = offset.magnitude().abs_diff(HOUR);
            assert!(error < Duration::from_secs(60), "offset {offset} measured");
            assert_eq!(offset.database_is_ahead(), database_ahead, "{offset}");
            let again = e.measure_clock_offset().unwrap();
            assert!(again.measured_at() > offset.measured_at());
        }
        assert!(ahead.is_adjusting_clock() && behind.is_adjusting_clock());
        assert!(!uncorrected.is_adjusting_clock());
        assert!(
            close(ahead.now(), SystemTime::now()),
            "corrected onto the database clock"
        );
        assert!(close(behind.now(), SystemTime::now()));
        assert!(
            close(uncorrected.now(), SystemTime::now() + HOUR),
            "not corrected"
        );

        // A leader whose clock is an hour ahead keeps its lease for one and a half lease
        // lengths while the others, an hour behind or uncorrected, poll: expiry is the
        // database's business.
        let leadership = ahead.acquire().unwrap();
        assert!(close(leadership.elected_at(), SystemTime::now()));
        let ends = leadership.lease_ends_at();
        assert!(close(ends, SystemTime::now() + ms(timings.0)), "{ends:?}");
        let until = Instant::now() + 3 * ms(timings.0) / 2;
        while Instant::now() < until {
            assert!(
                behind.try_acquire().unwrap().is_none(),
                "stolen by a slow clock"
            );
            assert!(
                uncorrected.try_acquire().unwrap().is_none(),
                "stolen by a fast clock"
            );
            assert!(leadership.is_leader());
            thread::sleep(ms(50));
        }
        let first = leadership.term();
        leadership.resign().unwrap();
        let next = behind
            .try_acquire_for(GENEROUS)
            .unwrap()
            .expect("handed over");
        assert!(next.term() > first);
        next.resign().unwrap();

        // And no two leaders when they all compete.
        compete(vec![ahead, behind, uncorrected], 3, ms(10)).verify(9);
    }

    pub fn a_killed_leader_is_replaced_after_its_lease(f: &Fixture) {
        // Renewed every second, the child's lease survives a renewal 2.5 s late.
        let timings = (4000, 1000, 50);
        let mut killed = crate::child::Contender::spawn(f, "killed", timings);
        let killed_term = killed.elected(GENEROUS);
        let standby = election(f, "killed", timings).build().unwrap();
        assert!(standby.try_acquire().unwrap().is_none(), "the child leads");
        let (elected_tx, elected) = crossbeam_channel::bounded(1);
        let waiting = standby.clone();
        let standing_by = thread::spawn(move || {
            let leadership = waiting.acquire().unwrap();
            elected_tx.send((Instant::now(), leadership)).unwrap();
        });
        // The child keeps renewing: nobody takes over during one and a half lease lengths.
        assert!(
            elected.recv_timeout(3 * ms(timings.0) / 2).is_err(),
            "taken from a live leader"
        );
        killed.kill();
        let killed_at = Instant::now();
        let (at, leadership) = elected
            .recv_timeout(ms(timings.0 + timings.2) + GENEROUS)
            .expect("a standby takes over after the lease");
        standing_by.join().unwrap();
        eprintln!("takeover {:?} after the kill", at.duration_since(killed_at));
        assert!(leadership.term() > killed_term);
        assert!(standby.is_leader());
        leadership.resign().unwrap();
    }

    pub fn resign_hands_over_without_waiting_out_the_lease(f: &Fixture) {
        // A 30 s lease: a takeover within 10 s can only come from the release.
        let timings = (30_000, 10_000, 50);
        let first = election(f, "handover", timings).build().unwrap();
        let second = election(f, "handover", timings).build().unwrap();
        let leadership = first.acquire().unwrap();
        let (elected_tx, elected) = crossbeam_channel::bounded(1);
        let waiting = second.clone();
        let standing_by = thread::spawn(move || {
            let leadership = waiting.acquire().unwrap();
            elected_tx.send((Instant::now(), leadership)).unwrap();
        });
        assert!(
            elected.recv_timeout(ms(300)).is_err(),
            "taken from a live leader"
        );
        let losses = leadership.loss_channel();
        let term = leadership.term();
        let resigned_at = Instant::now();
        leadership.resign().unwrap();
        assert!(!first.is_leader());
        assert!(
            matches!(
                losses.recv_timeout(GENEROUS),
                Err(crossbeam_channel::RecvTimeoutError::Disconnected)
            ),
            "resigning is not a loss"
        );
        let (at, next) = elected
            .recv_timeout(Duration::from_secs(10))
            .expect("handed over");
        standing_by.join().unwrap();
        eprintln!("handover {:?} after resign", at.duration_since(resigned_at));
        assert!(next.term() > term);
        assert_eq!(second.current_term(), Some(next.term()));

        // Dropping a leadership resigns too.
        drop(next);
        let back = first.try_acquire_for(Duration::from_secs(10)).unwrap();
        assert!(back.expect("handed back on drop").term() > term);
    }

    pub fn a_leader_that_cannot_renew_steps_down_before_its_lease_ends(f: &Fixture) {
        // The leader steps down a margin (a tenth of the lease, 1.5 s) before its lease ends:
        // long enough for its agent thread to get to run on a busy machine.
        let timings = (15_000, 1000, 50);
        let reported = Arc::new(Mutex::new(Vec::<(LeadershipLost, Instant)>::new()));
        let record = Arc::clone(&reported);
        let leader = election(f, "stranded", timings)
            .on_leadership_lost(move |lost| record.lock().push((lost.clone(), Instant::now())))
            .build()
            .unwrap();
        let standby = election(f, "stranded", timings).build().unwrap();
        let leadership = leader.acquire().unwrap();
        let losses = leadership.loss_channel();
        let mut conn = Raw::open(f);
        raw::block(&mut conn, &f.table());
        let blocked_at = Instant::now();
        let lost = losses.recv_timeout(GENEROUS).expect("loss reported");
        // The loss is reported while the database still counts the lease as running: the
        // time the row has left when the test looks, plus the time from the report (the
        // callback) to the look (on a busy machine the look may come after the expiry).
        let looked = Instant::now();
        let left_ms = raw::longest_left_ms(&mut conn, &f.table());
        eventually("the loss callback", || !reported.lock().is_empty());
        let reported_at = reported.lock()[0].1;
        let left_at_report = left_ms + looked.duration_since(reported_at).as_millis() as i64;
        let after = blocked_at.elapsed();
        assert!(
            left_at_report > 0,
            "the loss came only after the lease had expired ({left_at_report} ms left)"
        );
        eprintln!(
            "loss reported {after:?} after renewals stopped getting through, {left_at_report} ms \
             before the lease ended: {lost}"
        );
        assert_eq!(lost.term, leadership.term());
        assert!(
            matches!(
                lost.reason,
                LeadershipLossReason::RenewalOverdue
                    | LeadershipLossReason::Lease(LossReason::Expired(_))
            ),
            "{lost}"
        );
        assert!(!leadership.is_leader());
        assert!(!leader.is_leader());
        assert_eq!(leadership.remaining(), Duration::ZERO);
        let callbacks: Vec<_> = reported
            .lock()
            .iter()
            .map(|(lost, _)| lost.clone())
            .collect();
        assert_eq!(callbacks, vec![lost.clone()], "callback called once");
        raw::unblock(&mut conn);
        let next = standby
            .try_acquire_for(GENEROUS)
            .unwrap()
            .expect("taken over");
        assert!(next.term() > leadership.term());
        assert!(leadership.resign().unwrap_err().is_lease_lost());
    }

    pub fn the_run_loop_reports_a_loss_and_competes_again(f: &Fixture) {
        #[derive(Debug, Clone, PartialEq)]
        enum Event {
            Elected(u64),
            Lost(u64, LeadershipLossReason),
        }
        // A lease that outlives a busy machine's delays: it is lost only by the deletion.
        let timings = (6000, 300, 20);
        let contender = election(f, "looped", timings).build().unwrap();
        let events = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = crossbeam_channel::bounded::<()>(1);
        let runner = {
            let (contender, events) = (contender.clone(), Arc::clone(&events));
            thread::spawn(move || {
                let lost_events = Arc::clone(&events);
                contender.run(
                    |leadership| events.lock().push(Event::Elected(leadership.term())),
                    |lost| {
                        let event = Event::Lost(lost.term, lost.reason.clone());
                        lost_events.lock().push(event)
                    },
                    &stopped,
                )
            })
        };
        eventually("the first election", || events.lock().len() == 1);
        let Event::Elected(first) = events.lock()[0].clone() else {
            panic!("{:?}", events.lock())
        };
        assert!(contender.is_leader());
        // Take the lease away: the next renewal finds no row.
        Raw::open(f).execute(&format!("DELETE FROM {}", f.table()));
        eventually("a loss and a re-election", || events.lock().len() >= 3);
        let seen = events.lock().clone();
        assert_eq!(
            seen[1],
            Event::Lost(first, LeadershipLossReason::Lease(LossReason::NotOwner))
        );
        let Event::Elected(second) = seen[2] else {
            panic!("{seen:?}")
        };
        assert!(second > first, "{seen:?}");

        // Stopping resigns: a standby with the same 6 s lease gets it without waiting it out.
        let standby = election(f, "looped", timings).build().unwrap();
        assert!(standby.try_acquire().unwrap().is_none());
        stop.send(()).unwrap();
        runner.join().unwrap().unwrap();
        assert!(!contender.is_leader());
        let next = standby
            .try_acquire_for(GENEROUS)
            .unwrap()
            .expect("handed over");
        assert!(next.term() > second);
        assert_eq!(events.lock().len(), 3, "stopping is not a loss");
    }

    pub fn try_acquire_and_fail_if_locked_never_stand_by(f: &Fixture) {
        // A standby would sleep 20 s between attempts: far longer than a busy machine delays
        // the calls below.
        let timings = (5000, 1000, 20_000);
        let leader = election(f, "busy", timings).build().unwrap();
        let other = election(f, "busy", timings).build().unwrap();
        let impatient = election(f, "busy", timings)
            .fail_if_locked(true)
            .build()
            .unwrap();
        let leadership = leader.try_acquire().unwrap().expect("free");
        assert_eq!(leader.current_term(), Some(leadership.term()));
        assert!(
            leader.try_acquire().unwrap().is_none(),
            "one term per election"
        );
        assert!(
            leader.try_acquire_for(ms(100)).unwrap().is_none(),
            "a bounded wait ends while this election leads"
        );
        assert!(other.try_acquire().unwrap().is_none());
        assert!(!other.is_leader());
        assert_eq!(other.current_term(), None);
        assert!(other.try_acquire_for(ms(100)).unwrap().is_none());
        let started = Instant::now();
        let refused = impatient.acquire().expect_err("fail_if_locked");
        match &refused {
            Error::AlreadyHeld {
                key,
                by_this_instance,
            } => assert!(!by_this_instance && key == "busy", "{refused}"),
            other => panic!("expected AlreadyHeld, got {other}"),
        }
        let (_stop, stopped) = crossbeam_channel::bounded::<()>(1);
        let run = impatient.run(|_| panic!("elected"), |_| panic!("lost"), &stopped);
        assert!(matches!(run, Err(Error::AlreadyHeld { .. })), "{run:?}");
        // Both returned without standing by (a standby would sleep 20 s between attempts).
        assert!(started.elapsed() < ms(timings.2), "{:?}", started.elapsed());
        leadership.resign().unwrap();
        let taken = impatient.acquire().expect("free again");
        assert!(impatient.is_leader());
        taken.resign().unwrap();
    }

    pub fn timings_that_cannot_renew_in_time_are_rejected(f: &Fixture) {
        let setting = |builder: LeaderElectionBuilder| match builder.build() {
            Err(Error::InvalidSetting { setting, .. }) => setting,
            other => panic!("expected a setting error, got {other:?}"),
        };
        let s = Duration::from_secs;
        let with = |lease: Duration, keep_alive: Duration| {
            LeaderElection::builder(f.builder(), "strict")
                .lease_duration(lease)
                .lock_keep_alive_period(keep_alive)
        };
        // The seed's own example: renewing every 10 s a lease of 5 s.
        assert_eq!(setting(with(s(5), s(10))), "renew_every");
        assert_eq!(setting(with(s(10), s(10))), "renew_every");
        // Less than one period of slack before the step-down (10 s lease: at most 4.5 s).
        assert_eq!(setting(with(s(10), ms(4501))), "renew_every");
        assert_eq!(setting(with(s(10), Duration::ZERO)), "renew_every");
        assert_eq!(setting(with(Duration::ZERO, ms(1))), "time_to_live");
        assert_eq!(
            setting(with(s(10), s(1)).lock_acquire_sleep_interval(Duration::ZERO)),
            "idle_between_tries"
        );
        let fine = with(s(10), ms(4500)).build().unwrap();
        assert_eq!(fine.lock_keep_alive_period(), ms(4500));
        assert_eq!(fine.step_down_margin(), s(1));
        let defaults = LeaderElection::builder(f.builder(), "strict")
            .build()
            .unwrap();
        assert_eq!(defaults.lease_duration(), s(10));
        assert!(defaults.lock_keep_alive_period() * 2 + s(1) <= s(10));
        // The registry's words and ActiveMQ's read the same settings.
        let named = LeaderElection::builder(f.builder(), "strict")
            .time_to_live(s(9))
            .renew_every(s(2))
            .idle_between_tries(ms(700))
            .build()
            .unwrap();
        assert_eq!(
            (
                named.time_to_live(),
                named.renew_every(),
                named.idle_between_tries()
            ),
            (s(9), s(2), ms(700))
        );
        assert_eq!(
            (
                named.lease_duration(),
                named.lock_keep_alive_period(),
                named.lock_acquire_sleep_interval()
            ),
            (s(9), s(2), ms(700))
        );
        assert_eq!(defaults.renew_every(), defaults.time_to_live() / 3);
        assert!(matches!(
            LeaderElection::builder(f.builder(), "").build(),
            Err(Error::InvalidKey { .. })
        ));
    }
}

/// The child side of `a_killed_leader_is_replaced_after_its_lease`; does nothing when run as
/// part of the suite.
#[test]
fn contender_child_process() {
    child::run_if_asked();
}

macro_rules! leader_suite {
    ($db:expr) => {
        crate::suite_for!($db;
            never_two_leaders_at_once,
            skewed_client_clocks_cannot_make_a_second_leader,
            a_killed_leader_is_replaced_after_its_lease,
            resign_hands_over_without_waiting_out_the_lease,
            a_leader_that_cannot_renew_steps_down_before_its_lease_ends,
            the_run_loop_reports_a_loss_and_competes_again,
            try_acquire_and_fail_if_locked_never_stand_by,
            timings_that_cannot_renew_in_time_are_rejected,
        );
    };
}

#[cfg(feature = "sqlite")]
mod sqlite {
    leader_suite!(crate::common::Db::Sqlite);
}

#[cfg(feature = "postgres")]
mod postgres {
    leader_suite!(crate::common::Db::Postgres);
}

#[cfg(feature = "mysql")]
mod mysql {
    leader_suite!(crate::common::Db::Mysql);
}
