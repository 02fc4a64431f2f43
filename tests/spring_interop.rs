//! leasehold and Spring Integration's `JdbcLockRegistry` sharing one lock table.
//!
//! The Spring side is played here by running Spring's own statements with the driver, the way
//! its `DefaultLockRepository` does: timestamps computed on the client in UTC, acquire as
//! `UPDATE … WHERE REGION=? AND LOCK_KEY=? AND (CLIENT_ID=? OR EXPIRED_AFTER<?)` and then
//! `INSERT` when nothing was updated (a duplicate key meaning "held"), release as `DELETE`.
//! Both sides map keys to `LOCK_KEY` alike ([`leasehold::lock_key_for`]).
//!
//! The servers come from `LEASEHOLD_POSTGRES_URL` and `LEASEHOLD_MYSQL_URL`. When one cannot be
//! reached its tests print why and pass, unless `CI=true`, where they fail.
//!
//! The same file also exercises each backend directly: grant, renew, release, a held try,
//! takeover of an expired lease, tokens counting up, racing registries, connection errors,
//! replacement statements, and that a try refused by a held row writes nothing (no PostgreSQL
//! transaction id, no InnoDB row modified), so polling waiters cost the server no disk sync.
#![cfg(any(feature = "postgres", feature = "mysql"))]

#[path = "common/turns.rs"]
#[allow(dead_code)] // `Tally::longest`: the waits here are picked in turns
mod turns;

mod common;

use leasehold::{lock_key_for, Error, LockRegistry, RegistryBuilder};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// Spring's default time-to-live.
const SPRING_TTL: Duration = Duration::from_secs(10);

/// What the tests need from a database: Spring's statements, a look at a row, cleanup.
trait Spring {
    /// Spring's `acquire`: update, then insert; `false` when another client holds the key.
    fn try_lock(&mut self, key: &str) -> bool;
    /// Spring's `delete`; returns the deleted rows.
    fn unlock(&mut self, key: &str) -> u64;
    /// `(CLIENT_ID, FENCING_TOKEN)` of the key's row, if there is one.
    fn row(&mut self, key: &str) -> Option<(Option<String>, i64)>;
    /// The lock table's name.
    fn table(&self) -> &str;
    /// Runs one statement without parameters.
    fn execute(&mut self, sql: &str);
    /// Runs the acquire statement `sql` for `key` as `client_id` (time-to-live 10 s) inside a
    /// transaction that is then rolled back, and returns whether it granted the lock and
    /// whether the transaction wrote anything: on PostgreSQL, whether it was given a
    /// transaction id (without one there is no WAL record and no commit to sync); on InnoDB,
    /// whether it modified a row.
    fn probe_acquire(&mut self, sql: &str, key: &str, client_id: &str) -> (bool, bool);
    /// Another Spring instance on the same table: its own connection and client id.
    fn another(&self) -> Box<dyn Spring + Send>;
    /// Drops the test's table.
    fn drop_table(&mut self) {
        let sql = format!("DROP TABLE IF EXISTS {}", self.table());
        self.execute(&sql);
    }
}

/// Reports an unreachable server: a failure on CI, a note elsewhere.
fn unreachable(database: &str, url: &str, error: &dyn std::fmt::Display) {
    common::skip_or_fail(&format!("{database} at {url} is unreachable ({error})"));
}

/// A table prefix no other test uses.
fn unique_prefix(database: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("interop_{database}_{}_", &id[..12])
}

/// Runs `test`, then drops the table whatever happened.
fn with_table(spring: &mut dyn Spring, test: impl FnOnce(&mut dyn Spring)) {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| test(&mut *spring)));
    spring.drop_table();
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// Spring holds → leasehold is refused; leasehold holds → Spring is refused; each gets the
/// lock after the other releases it.
fn mutual_exclusion(builder: impl Fn() -> RegistryBuilder, spring: &mut dyn Spring) {
    let registry = builder().build().expect("registry builds");
    let key = format!("interop-{}", uuid::Uuid::new_v4());
    let lock = registry.obtain(&key).unwrap();
    assert_eq!(lock.lock_key(), lock_key_for(&key));

    assert!(spring.try_lock(&key), "Spring takes a free key");
    assert!(lock.try_lock().unwrap().is_none(), "Spring holds it");
    assert_eq!(spring.unlock(&key), 1);

    let guard = lock
        .try_lock()
        .unwrap()
        .expect("free after Spring's release");
    let first = guard.fencing_token();
    assert!(!spring.try_lock(&key), "leasehold holds it");
    guard.renew().unwrap();
    assert_eq!(
        spring.row(&key),
        Some((Some(registry.client_id().to_string()), first as i64))
    );
    guard.unlock().unwrap();
    assert_eq!(
        spring.row(&key).map(|row| row.0),
        Some(None),
        "the row stays, released"
    );

    assert!(spring.try_lock(&key), "Spring takes a released row");
    assert!(lock.try_lock().unwrap().is_none(), "Spring holds it again");
    assert_eq!(spring.unlock(&key), 1);
    let guard = lock.try_lock().unwrap().expect("free again");
    assert!(
        guard.fencing_token() > first,
        "tokens count up across Spring's delete"
    );
    guard.unlock().unwrap();
}

/// A Spring instance polling every 100 ms gets turns while two leasehold instances (two
/// threads each, release notifications on) contend for the same key: the leasehold instances
/// end a turn after `turn_limit` and reserve the row for 2 × `idle_between_tries`, two of
/// Spring's polls. Asserted in turns (see [`assert_turns`]); the times are printed.
fn spring_gets_turns(builder: impl Fn() -> RegistryBuilder, spring: &mut dyn Spring) {
    use turns::{contend, Witness};
    const RUN: Duration = Duration::from_secs(6);
    const LIMIT: Duration = Duration::from_millis(300);
    const SPRING_POLL: Duration = Duration::from_millis(100);
    let key = format!("turns-{}", uuid::Uuid::new_v4());
    let witness = Arc::new(Witness::default());
    let end = Instant::now() + RUN;
    let registries: Vec<Arc<LockRegistry>> = (0..2)
        .map(|_| {
            Arc::new(
                builder()
                    .idle_between_tries(SPRING_POLL)
                    .tuning(leasehold::Tuning {
                        turn_limit: Some(LIMIT),
                        ..Default::default()
                    })
                    .build()
                    .unwrap(),
            )
        })
        .collect();
    let workers: Vec<Vec<_>> = registries
        .iter()
        .enumerate()
        .map(|(r, registry)| {
            (0..2)
                .map(|n| leasehold_thread(2 * r as u64 + n + 1, end, &witness, registry, &key))
                .collect()
        })
        .collect();
    let give_up = end + Duration::from_secs(30);
    let table = spring.table().to_string();
    let spring = std::cell::RefCell::new(spring);
    let spring_tally = contend(
        99,
        end,
        &witness,
        || loop {
            if spring.borrow_mut().try_lock(&key) {
                return Some(());
            }
            if Instant::now() > give_up {
                return None;
            }
            std::thread::sleep(SPRING_POLL);
        },
        |()| assert_eq!(spring.borrow_mut().unlock(&key), 1),
    );
    let leasehold: Vec<_> = workers
        .into_iter()
        .zip(&registries)
        .map(|(threads, registry)| joined(threads, registry))
        .collect();
    println!(
        "{}: Spring ran {} sections, longest wait {:?}; leasehold {} and {} sections, longest \
         waits {:?} and {:?}",
        table,
        spring_tally.sections,
        spring_tally.longest_wait,
        leasehold[0].0.sections,
        leasehold[1].0.sections,
        leasehold[0].0.longest_wait,
        leasehold[1].0.longest_wait,
    );
    assert_eq!(witness.overlaps.load(Ordering::SeqCst), 0);
    assert!(spring_tally.sections > 0, "Spring never got the key");
    assert_turns(
        &[
            ("S0", Side::Spring, &spring_tally),
            ("L0", Side::Leasehold(&leasehold[0].1), &leasehold[0].0),
            ("L1", Side::Leasehold(&leasehold[1].1), &leasehold[1].0),
        ],
        end - RUN,
    );
}

/// Who contends: Spring's statements, which ignore the waiting line, or a leasehold registry
/// with its `turns_ended` (see [`leasehold_thread`]).
#[derive(Clone, Copy, Debug)]
enum Side<'a> {
    Spring,
    Leasehold(&'a [(Instant, u64)]),
}

impl Side<'_> {
    fn is_spring(&self) -> bool {
        matches!(self, Side::Spring)
    }
}

/// One contender: its name, side and tally.
type Contender<'a> = (&'a str, Side<'a>, &'a turns::Tally);

/// A leasehold thread of the workload: its tally and its `turns_ended` at each grant.
type LeaseholdThread = std::thread::JoinHandle<(turns::Tally, Vec<(Instant, u64)>)>;

/// One leasehold thread of the workload on `key`: its tally, and with each of its sections
/// (when granted) the registry's [`Statistics::turns_ended`](leasehold::Statistics) then.
fn leasehold_thread(
    seed: u64,
    end: Instant,
    witness: &Arc<turns::Witness>,
    registry: &Arc<LockRegistry>,
    key: &str,
) -> LeaseholdThread {
    let (witness, registry) = (Arc::clone(witness), Arc::clone(registry));
    let lock = registry.obtain(key).unwrap();
    std::thread::spawn(move || {
        let mut ends = Vec::new();
        let tally = turns::contend(
            seed,
            end,
            &witness,
            || {
                let guard = lock.lock().unwrap();
                ends.push((Instant::now(), registry.statistics().turns_ended));
                Some(guard)
            },
            |guard| guard.unlock().unwrap(),
        );
        (tally, ends)
    })
}

/// The threads of one leasehold instance, joined: its tally, and its `turns_ended` at each
/// grant and (last) now.
fn joined(
    threads: Vec<LeaseholdThread>,
    registry: &LockRegistry,
) -> (turns::Tally, Vec<(Instant, u64)>) {
    let (tallies, ends): (Vec<_>, Vec<_>) = threads.into_iter().map(|t| t.join().unwrap()).unzip();
    let mut ends: Vec<(Instant, u64)> = ends.into_iter().flatten().collect();
    ends.push((Instant::now(), registry.statistics().turns_ended));
    ends.sort();
    (turns::Tally::merge(tallies), ends)
}

/// The key's holders run by run, in order ([`turns::runs`]): a run is the consecutive sections
/// of one contender (an index into the contenders), and the key changed hands between two runs.
fn runs_of(contenders: &[Contender<'_>]) -> Vec<(usize, Instant)> {
    let tallies: Vec<&turns::Tally> = contenders.iter().map(|(_, _, tally)| *tally).collect();
    turns::runs(&tallies)
}

/// Whether run `k` of `runs`, a leasehold instance's, ended its turn at `turn_limit` (and so
/// reserved the row for pollers): the instance's `turns_ended` grew between its last grant
/// before the next run and its first grant after (or the end).
fn ended_a_turn(runs: &[(usize, Instant)], k: usize, ends: &[(Instant, u64)]) -> bool {
    let (who, _) = runs[k];
    let Some(&(_, handed_at)) = runs.get(k + 1) else {
        return false;
    };
    let back_at = runs[k + 1..]
        .iter()
        .find(|(next, _)| *next == who)
        .map(|(_, at)| *at);
    let at = |t: Instant| {
        ends.iter()
            .take_while(|(sampled, _)| *sampled <= t)
            .last()
            .map_or(0, |(_, count)| *count)
    };
    let after = match back_at {
        Some(t) => at(t),
        None => ends.last().map_or(0, |(_, count)| *count),
    };
    after > at(handed_at)
}

/// The most leasehold turns one wait of a leasehold instance may see another leasehold
/// instance start: the one it was behind in line, and one more that began while its place
/// was being taken (as in `tests/waiting_line.rs`). Spring's holds come on top: they ignore
/// the line.
const LEASEHOLD_TURNS_PER_WAIT: usize = 2;

/// The most turn ends at `turn_limit` that one wait of a Spring instance may see go from one
/// leasehold instance to another. Such an end reserves the row for 2 × `idle_between_tries`,
/// two of Spring's polls, and the first Spring try takes it; another leasehold instance gets
/// it only when no Spring try came in that time (the pollers' threads waited that long to
/// run). A turn that ends before its limit — its threads all paused longer than `linger` —
/// is a plain release, which the next instance in line takes: not counted.
const RESERVATIONS_MISSED_PER_SPRING_WAIT: usize = 2;

/// Asserts the README's bounds in turns (how many times the key changed hands while an
/// instance waited), never in time: for every wait of every contender, the runs of the others
/// that began during it ([`turns::wait_start`]: a wait through a run of the contender's own,
/// another of its threads holding the key, counts from that run's end). A leasehold instance sees each other leasehold instance start at
/// most [`LEASEHOLD_TURNS_PER_WAIT`] turns, whatever Spring does; a Spring instance sees at
/// most [`RESERVATIONS_MISSED_PER_SPRING_WAIT`] reserved turn ends go to leasehold. A busy
/// machine makes turns longer, not more numerous. Prints the worst wait of each contender
/// with the turns around it.
fn assert_turns(contenders: &[Contender<'_>], start: Instant) {
    let runs = runs_of(contenders);
    let mut failures = Vec::new();
    for (me, (name, side, tally)) in contenders.iter().enumerate() {
        // (what counted, the wait)
        let mut worst: (usize, Option<(Instant, Instant)>) = (0, None);
        for &(asked, began) in &tally.holds {
            let from = turns::wait_start(&runs, me, (asked, began));
            let during = |k: usize| {
                runs[k].0 != me && runs[k].1 >= from && runs[k].1 > asked && runs[k].1 < began
            };
            let count = match side {
                Side::Leasehold(_) => (0..contenders.len())
                    .filter(|other| *other != me && !contenders[*other].1.is_spring())
                    .map(|other| {
                        (0..runs.len())
                            .filter(|k| during(*k) && runs[*k].0 == other)
                            .count()
                    })
                    .max()
                    .unwrap_or(0),
                Side::Spring => (1..runs.len())
                    .filter(|k| during(*k) && !contenders[runs[*k].0].1.is_spring())
                    .filter(|k| match contenders[runs[k - 1].0].1 {
                        Side::Leasehold(ends) => ended_a_turn(&runs, k - 1, ends),
                        Side::Spring => false,
                    })
                    .count(),
            };
            if count > worst.0 || worst.1.is_none() {
                worst = (count, Some((asked, began)));
            }
        }
        let (limit, what) = match side {
            Side::Leasehold(_) => (
                LEASEHOLD_TURNS_PER_WAIT,
                "turns of one other leasehold instance",
            ),
            Side::Spring => (
                RESERVATIONS_MISSED_PER_SPRING_WAIT,
                "reserved turn ends taken by leasehold",
            ),
        };
        println!(
            "{name}: at most {} {what} during one wait (limit {limit})",
            worst.0
        );
        if let Some(wait) = worst.1.filter(|_| worst.0 > limit) {
            let named: Vec<(&str, &turns::Tally)> =
                contenders.iter().map(|(n, _, t)| (*n, *t)).collect();
            println!(
                "{name} waited through {} {what}, {:.3} s from {:.3} s; the turns:\n{}",
                worst.0,
                wait.1.duration_since(wait.0).as_secs_f64(),
                wait.0.duration_since(start).as_secs_f64(),
                turns::timeline(
                    &named,
                    start,
                    wait,
                    Duration::ZERO,
                    Duration::from_millis(500)
                )
            );
            failures.push(format!("{name} waited through {} {what}", worst.0));
        }
    }
    assert!(failures.is_empty(), "over the bound in turns: {failures:?}");
}

/// With every setting at its default: two Spring
/// instances (Spring's statements, polling every 100 ms, each on its own connection) beside
/// two leasehold registries of two threads each, all on one key, for 12 s. Each Spring
/// instance runs `spring_threads` threads the way Spring Integration's `JdbcLockRegistry`
/// does in one process: a thread takes the instance's local lock of the key first (Spring's
/// `ReentrantLock`) and only then polls the table, and its unlock deletes the row before
/// letting the local lock go, so the instance's next thread inserts it again right after.
/// Prints each instance's sections and longest wait and asserts what the defaults guarantee,
/// in turns ([`assert_turns`]): no overlap, every instance gets the key, a leasehold instance
/// waits through at most the turns of the leasehold instance ahead of it (Spring's holds on
/// top), and a Spring instance never waits through a streak of leasehold turns. With two
/// threads per Spring instance, a Spring instance keeps the key until another instance tries
/// in the instant between its delete and its next thread's insert, which no setting of
/// leasehold's bounds: those holds are one run, which the turns of leasehold instances do not
/// count.
fn two_spring_instances_beside_two_leasehold_instances(
    builder: impl Fn() -> RegistryBuilder,
    spring: &mut dyn Spring,
    spring_threads: u64,
) {
    use std::sync::Mutex;
    use turns::{contend, Tally, Witness};
    const RUN: Duration = Duration::from_secs(12);
    const SPRING_POLL: Duration = Duration::from_millis(100);
    let key = format!("turns-{}", uuid::Uuid::new_v4());
    let witness = Arc::new(Witness::default());
    let end = Instant::now() + RUN;
    let give_up = end + Duration::from_secs(30);
    let registries: Vec<Arc<LockRegistry>> = (0..2)
        .map(|_| Arc::new(builder().build().unwrap()))
        .collect();
    let leasehold: Vec<Vec<_>> = registries
        .iter()
        .map(|registry| {
            (0..2)
                .map(|n| leasehold_thread(n + 1, end, &witness, registry, &key))
                .collect()
        })
        .collect();
    let springs: Vec<_> = (0..2)
        .map(|n| {
            // The instance's connection, and its local lock of the key.
            let instance = Arc::new((Mutex::new(spring.another()), Mutex::new(())));
            let threads: Vec<_> = (0..spring_threads)
                .map(|thread| {
                    let instance = Arc::clone(&instance);
                    let (key, witness) = (key.clone(), Arc::clone(&witness));
                    std::thread::spawn(move || {
                        let (table, local) = (&instance.0, &instance.1);
                        contend(
                            90 + 10 * n + thread,
                            end,
                            &witness,
                            || {
                                let local = local.lock().unwrap();
                                loop {
                                    if table.lock().unwrap().try_lock(&key) {
                                        return Some(local);
                                    }
                                    if Instant::now() > give_up {
                                        return None;
                                    }
                                    std::thread::sleep(SPRING_POLL);
                                }
                            },
                            |local| {
                                assert_eq!(table.lock().unwrap().unlock(&key), 1);
                                drop(local);
                            },
                        )
                    })
                })
                .collect();
            threads
        })
        .collect();
    // A probe of the server beside the round: one primary-key read every 20 ms on a
    // connection of its own. Its longest round trip tells a stall of the server or the
    // machine (every instance waits then) from a wait that fairness should have prevented.
    let probe = {
        let mut reader = spring.another();
        let key = key.clone();
        std::thread::spawn(move || {
            let began = Instant::now();
            let mut longest = (Duration::ZERO, Duration::ZERO);
            while Instant::now() < end {
                let sent = Instant::now();
                reader.row(&key);
                if sent.elapsed() > longest.0 {
                    longest = (sent.elapsed(), sent.duration_since(began));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            longest
        })
    };
    let leasehold: Vec<_> = leasehold
        .into_iter()
        .zip(&registries)
        .map(|(threads, registry)| joined(threads, registry))
        .collect();
    let springs: Vec<Tally> = springs
        .into_iter()
        .map(|threads| Tally::merge(threads.into_iter().map(|s| s.join().unwrap())))
        .collect();
    let (probe_longest, probe_at) = probe.join().unwrap();
    println!(
        "{}: with the defaults, {RUN:?}, {spring_threads} thread(s) per Spring instance: \
         sections (longest wait, from when): Spring {}; leasehold {}; \
         longest probe read {:.3} s at {:.1} s",
        spring.table(),
        springs
            .iter()
            .map(tallied)
            .collect::<Vec<_>>()
            .join(" and "),
        leasehold
            .iter()
            .map(|(tally, _)| tallied(tally))
            .collect::<Vec<_>>()
            .join(" and "),
        probe_longest.as_secs_f64(),
        probe_at.as_secs_f64(),
    );
    assert_eq!(witness.overlaps.load(Ordering::SeqCst), 0);
    let named = [
        ("S0", Side::Spring, &springs[0]),
        ("S1", Side::Spring, &springs[1]),
        ("L0", Side::Leasehold(&leasehold[0].1), &leasehold[0].0),
        ("L1", Side::Leasehold(&leasehold[1].1), &leasehold[1].0),
    ];
    for (name, _, tally) in named {
        assert!(tally.sections > 0, "{name} never got the key");
    }
    assert_turns(&named, end - RUN);
}

/// An instance's sections and longest wait, for the printed summaries.
fn tallied(tally: &turns::Tally) -> String {
    format!(
        "{} ({:.2} s from {:.1} s)",
        tally.sections,
        tally.longest_wait.as_secs_f64(),
        tally.longest_wait_began.as_secs_f64()
    )
}

/// Grant, renew, release, a held try, takeover of an expired lease, tokens counting up.
fn lease_cycle(builder: impl Fn() -> RegistryBuilder, spring: &mut dyn Spring) {
    let a = builder().build().unwrap();
    let b = builder().build().unwrap();
    let key = format!("cycle-{}", uuid::Uuid::new_v4());
    let (lock_a, lock_b) = (a.obtain(&key).unwrap(), b.obtain(&key).unwrap());

    let guard = lock_a.try_lock().unwrap().expect("a free key is granted");
    let t1 = guard.fencing_token();
    assert!(lock_b.try_lock().unwrap().is_none(), "held by a");
    assert!(lock_b.try_lock().unwrap().is_none(), "still held by a");
    guard.renew_with_ttl(Duration::from_secs(20)).unwrap();
    guard.renew().unwrap();
    guard.unlock().unwrap();
    let stats = b.statistics();
    assert_eq!((stats.acquires, stats.grants), (2, 0));

    let guard = lock_b.try_lock().unwrap().expect("released by a");
    let t2 = guard.fencing_token();
    assert!(t2 > t1, "{t2} > {t1}");
    assert!(lock_a.try_lock().unwrap().is_none());
    guard.unlock().unwrap();

    // A lease that runs out is taken over, and its holder learns it lost the lock.
    let c = builder().renewal(false).build().unwrap();
    let guard = c
        .obtain(&key)
        .unwrap()
        .try_lock_with_ttl(Duration::from_secs(1))
        .unwrap()
        .expect("granted");
    let t3 = guard.fencing_token();
    assert!(t3 > t2, "{t3} > {t2}");
    // A second: a 50 ms lease could be over before its grant arrived on a loaded machine (a
    // grant that outlived its time-to-live is refused); the row expires on the database clock
    // at most a time-to-live after the grant returned.
    std::thread::sleep(Duration::from_millis(1_200));
    let taken = lock_b
        .try_lock()
        .unwrap()
        .expect("an expired lease is taken over");
    assert!(taken.fencing_token() > t3);
    assert!(guard.renew().unwrap_err().is_lease_lost());
    assert!(guard.unlock().unwrap_err().is_lease_lost());
    assert_eq!(spring.row(&key).unwrap().0.as_deref(), Some(b.client_id()));
    taken.unlock().unwrap();
}

/// Issue item: a try that finds the lock held must not write. The registry's own acquire
/// statement is run by hand so the transaction can be inspected before it ends.
fn a_refused_try_writes_nothing(builder: impl Fn() -> RegistryBuilder, spring: &mut dyn Spring) {
    let holder = builder().build().unwrap();
    let acquire = holder.statements().acquire.clone();
    let other_client = uuid::Uuid::new_v4().to_string();
    let key = format!("probe-{}", uuid::Uuid::new_v4());
    let guard = holder.obtain(&key).unwrap().try_lock().unwrap().unwrap();
    for _ in 0..3 {
        assert_eq!(
            spring.probe_acquire(&acquire, &key, &other_client),
            (false, false),
            "a refused try must neither grant nor write"
        );
    }
    // The control: on an absent row the statement grants, and that is a write.
    assert_eq!(
        spring.probe_acquire(&acquire, "probe-absent", &other_client),
        (true, true),
        "a grant of an absent key writes"
    );
    assert_eq!(
        spring.probe_acquire(&acquire, &key, &other_client),
        (false, false),
        "still refused, still no write"
    );
    guard.unlock().unwrap();
    assert_eq!(
        spring.probe_acquire(&acquire, &key, &other_client),
        (true, true),
        "a released row is granted, and that is a write"
    );
    assert_eq!(
        spring.row(&key).map(|row| row.0),
        Some(None),
        "the probes were rolled back"
    );
}

/// Registries racing for one key: never two holders, never an error, tokens rising.
fn racing(builder: impl Fn() -> RegistryBuilder + Sync) {
    let key = format!("race-{}", uuid::Uuid::new_v4());
    let inside = AtomicBool::new(false);
    let last_token = AtomicU64::new(0);
    let grants = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                let registry = builder()
                    .idle_between_tries(Duration::from_millis(1))
                    .build()
                    .unwrap();
                let lock = registry.obtain(&key).unwrap();
                for _ in 0..25 {
                    let guard = lock.lock().unwrap();
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                    let token = guard.fencing_token();
                    assert!(token > last_token.swap(token, Ordering::SeqCst));
                    grants.fetch_add(1, Ordering::Relaxed);
                    inside.store(false, Ordering::SeqCst);
                    guard.unlock().unwrap();
                }
            });
        }
    });
    assert_eq!(grants.load(Ordering::Relaxed), 100);
}

/// Registries let loose at once on the same keys: each key goes to exactly one of them, first
/// while the rows are absent (racing inserts), then once they have been released (racing
/// takeovers of existing rows, the path an expired lease takes too).
fn racing_for_each_key(builder: impl Fn() -> RegistryBuilder + Sync) {
    const RACERS: usize = 4;
    const KEYS: usize = 30;
    let run = uuid::Uuid::new_v4();
    let keys: Vec<String> = (0..KEYS).map(|i| format!("burst-{run}-{i}")).collect();
    let registries: Vec<_> = (0..RACERS).map(|_| builder().build().unwrap()).collect();
    for round in ["absent rows", "released rows"] {
        let start = std::sync::Barrier::new(RACERS);
        let done = std::sync::Barrier::new(RACERS);
        let wins: Vec<Vec<bool>> = std::thread::scope(|scope| {
            let racers: Vec<_> = registries
                .iter()
                .map(|registry| {
                    let (start, done, keys) = (&start, &done, &keys);
                    scope.spawn(move || {
                        let locks: Vec<_> =
                            keys.iter().map(|k| registry.obtain(k).unwrap()).collect();
                        start.wait();
                        let guards: Vec<_> =
                            locks.iter().map(|lock| lock.try_lock().unwrap()).collect();
                        // Hold every grant until all racers are done trying.
                        done.wait();
                        guards.iter().map(Option::is_some).collect()
                    })
                })
                .collect();
            racers.into_iter().map(|r| r.join().unwrap()).collect()
        });
        for (i, key) in keys.iter().enumerate() {
            let winners = wins.iter().filter(|won| won[i]).count();
            assert_eq!(winners, 1, "{key} ({round}) had {winners} holders");
        }
    }
}

/// A statement naming a seventh parameter, or an unknown name, is refused when building.
fn assert_rejected(result: leasehold::Result<LockRegistry>, statement: &str) {
    match result {
        Err(Error::InvalidStatement { statement: s, .. }) if s == statement => {}
        other => panic!("expected the {statement} statement to be rejected, got {other:?}"),
    }
}

/// A table in Spring's pre-7.0 layout (no `EXPIRED_AFTER`) and without leasehold's
/// `FENCING_TOKEN`: `build()` names each missing column with a statement that works, in turn.
fn a_pre_7_0_table_gets_statements_that_upgrade_it(
    builder: impl Fn() -> RegistryBuilder,
    spring: &mut dyn Spring,
    timestamp_type: &str,
) {
    let table = spring.table().to_string();
    spring.execute(&format!(
        "CREATE TABLE {table} (LOCK_KEY CHAR(36) NOT NULL, REGION VARCHAR(100) NOT NULL, \
         CLIENT_ID CHAR(36), CREATED_DATE {timestamp_type} NOT NULL, \
         CONSTRAINT {table}_PK PRIMARY KEY (LOCK_KEY, REGION))"
    ));
    for expected in ["EXPIRED_AFTER", "FENCING_TOKEN"] {
        match builder().create_table(false).build() {
            Err(Error::ColumnMissing { column, fix, .. }) => {
                assert_eq!(column, expected);
                spring.execute(&fix);
            }
            other => panic!("expected {expected} to be missing, got {other:?}"),
        }
    }
    let registry = builder()
        .create_table(false)
        .build()
        .expect("upgraded table");
    let guard = registry.obtain("upgraded").unwrap().lock().unwrap();
    assert!(guard.fencing_token() > 0);
    guard.unlock().unwrap();
}

/// The tests whose bodies are the same on every server; each module provides `setup()`.
macro_rules! shared_tests {
    () => {
        #[test]
        fn spring_and_leasehold_exclude_each_other() {
            let Some((builder, mut spring)) = setup() else {
                return;
            };
            with_table(&mut spring, |spring| mutual_exclusion(&builder, spring));
        }

        #[test]
        fn lease_cycle_and_racing_registries() {
            let Some((builder, mut spring)) = setup() else {
                return;
            };
            with_table(&mut spring, |spring| {
                lease_cycle(&builder, spring);
                a_refused_try_writes_nothing(&builder, spring);
                racing(&builder);
                racing_for_each_key(&builder);
            });
        }

        #[test]
        fn spring_instances_get_turns_while_leasehold_instances_contend() {
            let Some((builder, mut spring)) = setup() else {
                return;
            };
            with_table(&mut spring, |spring| spring_gets_turns(&builder, spring));
        }

        #[test]
        fn two_spring_instances_get_turns_beside_two_leasehold_instances_with_the_defaults() {
            let Some((builder, mut spring)) = setup() else {
                return;
            };
            with_table(&mut spring, |spring| {
                two_spring_instances_beside_two_leasehold_instances(&builder, spring, 1)
            });
        }

        /// The same with two threads per Spring instance, as a Spring service whose
        /// threads compete for one key: a Spring instance then keeps the key until another
        /// instance tries within the instant between its delete and its next thread's insert.
        #[test]
        fn two_spring_instances_of_two_threads_get_turns_beside_two_leasehold_instances() {
            let Some((builder, mut spring)) = setup() else {
                return;
            };
            with_table(&mut spring, |spring| {
                two_spring_instances_beside_two_leasehold_instances(&builder, spring, 2)
            });
        }

        #[test]
        fn a_pre_7_0_table_is_upgraded_by_the_statements_named() {
            let Some((builder, mut spring)) = setup() else {
                return;
            };
            with_table(&mut spring, |spring| {
                a_pre_7_0_table_gets_statements_that_upgrade_it(&builder, spring, TIMESTAMP_TYPE)
            });
        }
    };
}

#[cfg(feature = "postgres")]
mod postgres_interop {
    /// The timestamp column type of Spring's PostgreSQL DDL.
    const TIMESTAMP_TYPE: &str = "TIMESTAMP";
    use super::*;
    use postgres::error::SqlState;
    use postgres::{Client, NoTls};

    fn url() -> String {
        std::env::var("LEASEHOLD_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
    }

    struct SpringPg {
        client: Client,
        table: String,
        client_id: String,
    }

    impl Spring for SpringPg {
        fn try_lock(&mut self, key: &str) -> bool {
            let (table, lock_key) = (&self.table, lock_key_for(key));
            let now = SystemTime::now();
            let expires = now + SPRING_TTL;
            let updated = self
                .client
                .execute(
                    &format!(
                        "UPDATE {table} SET CLIENT_ID=$1, EXPIRED_AFTER=$2 WHERE REGION=$3 \
                         AND LOCK_KEY=$4 AND (CLIENT_ID=$5 OR EXPIRED_AFTER<$6)"
                    ),
                    &[
                        &self.client_id,
                        &expires,
                        &"DEFAULT",
                        &lock_key,
                        &self.client_id,
                        &now,
                    ],
                )
                .unwrap();
            if updated > 0 {
                return true;
            }
            let inserted = self.client.execute(
                &format!(
                    "INSERT INTO {table} (REGION, LOCK_KEY, CLIENT_ID, CREATED_DATE, \
                     EXPIRED_AFTER) VALUES ($1, $2, $3, $4, $5)"
                ),
                &[&"DEFAULT", &lock_key, &self.client_id, &now, &expires],
            );
            match inserted {
                Ok(_) => true,
                Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => false,
                // A transient failure (Spring's lock loop tries again at its next poll).
                Err(e) if e.code() == Some(&SqlState::T_R_DEADLOCK_DETECTED) => false,
                Err(e) => panic!("Spring's insert failed: {e}"),
            }
        }

        fn unlock(&mut self, key: &str) -> u64 {
            let table = &self.table;
            self.client
                .execute(
                    &format!(
                        "DELETE FROM {table} WHERE REGION=$1 AND LOCK_KEY=$2 AND CLIENT_ID=$3"
                    ),
                    &[&"DEFAULT", &lock_key_for(key), &self.client_id],
                )
                .unwrap()
        }

        fn row(&mut self, key: &str) -> Option<(Option<String>, i64)> {
            let table = &self.table;
            self.client
                .query_opt(
                    &format!(
                        "SELECT CLIENT_ID::text, FENCING_TOKEN FROM {table} \
                         WHERE REGION='DEFAULT' AND LOCK_KEY=$1"
                    ),
                    &[&lock_key_for(key)],
                )
                .unwrap()
                .map(|row| (row.get(0), row.get(1)))
        }

        fn table(&self) -> &str {
            &self.table
        }

        fn another(&self) -> Box<dyn Spring + Send> {
            Box::new(SpringPg {
                client: Client::connect(&url(), NoTls).expect("a second Spring connection"),
                table: self.table.clone(),
                client_id: uuid::Uuid::new_v4().to_string(),
            })
        }

        fn execute(&mut self, sql: &str) {
            self.client.batch_execute(sql).unwrap();
        }

        fn probe_acquire(&mut self, sql: &str, key: &str, client_id: &str) -> (bool, bool) {
            use postgres::types::{ToSql, Type};
            // The parameter types the registry declares.
            let types = [
                Type::BPCHAR,
                Type::VARCHAR,
                Type::BPCHAR,
                Type::INT8,
                Type::INT8,
                Type::TEXT,
            ];
            let mut transaction = self.client.transaction().unwrap();
            let statement = transaction.prepare_typed(sql, &types).unwrap();
            let (lock_key, ttl_micros, token) = (lock_key_for(key), 10_000_000_i64, 0_i64);
            let params: [&(dyn ToSql + Sync); 6] =
                [&lock_key, &"DEFAULT", &client_id, &ttl_micros, &token, &key];
            let granted = transaction.query(&statement, &params).unwrap().len() == 1;
            let xid: Option<String> = transaction
                .query_one("SELECT pg_current_xact_id_if_assigned()::text", &[])
                .unwrap()
                .get(0);
            transaction.rollback().unwrap();
            (granted, xid.is_some())
        }
    }

    /// A registry builder on a fresh table, and Spring on the same table; `None` if the server
    /// is unreachable (and not on CI).
    fn setup() -> Option<(impl Fn() -> RegistryBuilder + Sync, SpringPg)> {
        let url = url();
        let client = match Client::connect(&url, NoTls) {
            Ok(client) => client,
            Err(e) => {
                unreachable("PostgreSQL", &url, &e);
                return None;
            }
        };
        let prefix = unique_prefix("pg");
        let table = format!("{prefix}LOCK");
        let builder = move || {
            LockRegistry::postgres(url.clone())
                .prefix(prefix.clone())
                .create_table(true)
        };
        let spring = SpringPg {
            client,
            table,
            client_id: uuid::Uuid::new_v4().to_string(),
        };
        Some((builder, spring))
    }

    shared_tests!();

    #[test]
    fn replacement_statements_are_checked() {
        let Some((builder, mut spring)) = setup() else {
            return;
        };
        with_table(&mut spring, |spring| {
            builder().build().unwrap();
            let table = spring.table().to_string();
            // A renew that only extends (a prefix of the parameters is fine).
            let renew = format!(
                "UPDATE {table} SET EXPIRED_AFTER = (now() AT TIME ZONE 'UTC') + \
                 $4 * INTERVAL '1 microsecond' WHERE LOCK_KEY = $1 AND REGION = $2 \
                 AND CLIENT_ID = $3"
            );
            let registry = builder()
                .custom_sql(leasehold::CustomSql {
                    renew: Some(renew),
                    ..Default::default()
                })
                .build()
                .unwrap();
            let guard = registry
                .obtain("custom")
                .unwrap()
                .try_lock()
                .unwrap()
                .unwrap();
            guard.renew().unwrap();
            guard.unlock().unwrap();
            assert_rejected(
                builder()
                    .custom_sql(leasehold::CustomSql {
                        release: Some(format!(
                            "UPDATE {table} SET CLIENT_ID = NULL WHERE LOCK_KEY = $7"
                        )),
                        ..Default::default()
                    })
                    .build(),
                "release",
            );
            assert_rejected(
                builder()
                    .custom_sql(leasehold::CustomSql {
                        acquire: Some(format!(
                            "UPDATE {table} SET CLIENT_ID = $3 WHERE LOCK_KEY = $1"
                        )),
                        ..Default::default()
                    })
                    .build(),
                "acquire",
            );
            // The token, a second column, and nothing more.
            assert_rejected(
                builder()
                    .custom_sql(leasehold::CustomSql {
                        acquire: Some(format!(
                            "SELECT FENCING_TOKEN, TRUE, 1 FROM {table} WHERE LOCK_KEY = $1"
                        )),
                        ..Default::default()
                    })
                    .build(),
                "acquire",
            );
        });
    }

    /// The probe of `a_refused_try_writes_nothing` can tell: the plain upsert the issue warns
    /// about is refused by a held row too, yet it locks the row and so takes a transaction id.
    #[test]
    fn a_plain_upsert_writes_even_when_refused() {
        let Some((builder, mut spring)) = setup() else {
            return;
        };
        with_table(&mut spring, |spring| {
            let holder = builder().build().unwrap();
            let table = spring.table().to_string();
            let upsert = format!(
                "INSERT INTO {table} (LOCK_KEY, REGION, CLIENT_ID, CREATED_DATE, EXPIRED_AFTER) \
                 VALUES ($1, $2, $3, now() AT TIME ZONE 'UTC', \
                 (now() AT TIME ZONE 'UTC') + $4 * INTERVAL '1 microsecond') \
                 ON CONFLICT (LOCK_KEY, REGION) DO UPDATE SET CLIENT_ID = EXCLUDED.CLIENT_ID, \
                 EXPIRED_AFTER = EXCLUDED.EXPIRED_AFTER \
                 WHERE {table}.EXPIRED_AFTER < (now() AT TIME ZONE 'UTC') \
                 RETURNING FENCING_TOKEN"
            );
            let guard = holder.obtain("held").unwrap().lock().unwrap();
            let other_client = uuid::Uuid::new_v4().to_string();
            assert_eq!(
                spring.probe_acquire(&upsert, "held", &other_client),
                (false, true)
            );
            guard.unlock().unwrap();
        });
    }

    #[test]
    fn a_release_wakes_waiters_of_other_registries() {
        let Some((builder, mut spring)) = setup() else {
            return;
        };
        with_table(&mut spring, |spring| {
            let holder = builder().build().unwrap();
            // Polls are a minute apart (30–60 s after a refusal): only the notification can get
            // the waiter the key within the 25 s it waits.
            let waiter = builder()
                .idle_between_tries(Duration::from_secs(60))
                .build()
                .unwrap();
            let guard = holder.obtain("wake").unwrap().lock().unwrap();
            let got = std::thread::scope(|scope| {
                let waiting = scope.spawn(|| {
                    let lock = waiter.obtain("wake").unwrap();
                    let got = lock.try_lock_for(Duration::from_secs(25)).unwrap();
                    got.is_some()
                });
                // The release comes once the waiter was refused twice (its first try, and the
                // one when its subscription took effect): both answers are in, whatever the
                // machine's speed.
                let asked = std::time::Instant::now();
                while waiter.statistics().contended_tries < 2 {
                    assert!(
                        asked.elapsed() < Duration::from_secs(25),
                        "the waiter was not refused twice: {:?}",
                        waiter.statistics()
                    );
                    std::thread::sleep(Duration::from_millis(5));
                }
                guard.unlock().unwrap();
                waiting.join().unwrap()
            });
            assert!(got, "the waiter slept until its next poll");
            assert_eq!(
                waiter.statistics().acquires,
                3,
                "one poll, one when the subscription took effect, one wake-up"
            );

            // The listener goes away with its registry.
            let listeners = |spring: &mut dyn Spring| {
                let sql = format!(
                    "SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN \"{}\"'",
                    spring.table().to_ascii_lowercase()
                );
                let mut client = Client::connect(&url(), NoTls).unwrap();
                client.query_one(&sql, &[]).unwrap().get::<_, i64>(0)
            };
            assert_eq!(
                listeners(spring),
                1,
                "only the registry that waited listens"
            );
            drop((holder, waiter));
            std::thread::sleep(Duration::from_millis(2500));
            assert_eq!(listeners(spring), 0);
        });
    }

    #[test]
    fn connection_errors_say_what_to_fix() {
        let Some((_, mut spring)) = setup() else {
            return;
        };
        with_table(&mut spring, |_| {
            let missing = url().rsplit_once('/').unwrap().0.to_string() + "/leasehold_no_such_db";
            match LockRegistry::postgres(missing).build() {
                Err(Error::Database {
                    operation: "connect",
                    hint,
                    ..
                }) => assert!(hint.contains("does not exist"), "{hint}"),
                other => panic!("unexpected {other:?}"),
            }
            let refused = LockRegistry::postgres("postgres://postgres@127.0.0.1:1/test")
                .connect_timeout(Duration::from_millis(300))
                .build();
            match refused {
                Err(Error::Database {
                    operation: "connect",
                    hint,
                    ..
                }) => assert!(hint.contains("127.0.0.1:1"), "{hint}"),
                other => panic!("unexpected {other:?}"),
            }
        });
    }
}

#[cfg(feature = "mysql")]
mod mysql_interop {
    /// The timestamp column type of Spring's MySQL DDL.
    const TIMESTAMP_TYPE: &str = "DATETIME(6)";
    use super::*;
    use mysql::consts::CapabilityFlags;
    use mysql::prelude::Queryable;
    use mysql::{Conn, Opts, OptsBuilder, Value};

    fn url() -> String {
        std::env::var("LEASEHOLD_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
    }

    /// `time` as the `DATETIME` Spring binds: UTC wall-clock time.
    fn utc(time: SystemTime) -> Value {
        let since = time.duration_since(SystemTime::UNIX_EPOCH).unwrap();
        let secs = since.as_secs();
        let (days, rest) = (secs / 86_400, secs % 86_400);
        let (year, month, day) = civil_date(days as i64);
        Value::Date(
            year as u16,
            month as u8,
            day as u8,
            (rest / 3600) as u8,
            (rest % 3600 / 60) as u8,
            (rest % 60) as u8,
            since.subsec_micros(),
        )
    }

    /// Gregorian (year, month, day) of a day count since 1970-01-01.
    fn civil_date(days: i64) -> (i64, i64, i64) {
        // Count from 0000-03-01 in 400-year eras, so that leap days fall at the end of a year.
        let shifted = days + 719_468;
        let era = shifted.div_euclid(146_097);
        let day_of_era = shifted.rem_euclid(146_097);
        let year_of_era =
            (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
        let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
        let month_from_march = (5 * day_of_year + 2) / 153;
        let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
        let month = if month_from_march < 10 {
            month_from_march + 3
        } else {
            month_from_march - 9
        };
        let year = year_of_era + era * 400 + i64::from(month <= 2);
        (year, month, day)
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_date(0), (1970, 1, 1));
        assert_eq!(civil_date(11_016), (2000, 2, 29));
        assert_eq!(civil_date(20_787), (2026, 11, 30));
        assert_eq!(civil_date(-1), (1969, 12, 31));
    }

    /// A connection as Spring's driver (Connector/J) makes it: it reports found rows, not
    /// changed rows.
    fn spring_connection() -> mysql::Result<Conn> {
        let opts = Opts::from_url(&url()).expect("LEASEHOLD_MYSQL_URL parses");
        Conn::new(
            OptsBuilder::from_opts(opts)
                .additional_capabilities(CapabilityFlags::CLIENT_FOUND_ROWS),
        )
    }

    struct SpringMysql {
        conn: Conn,
        table: String,
        client_id: String,
    }

    impl Spring for SpringMysql {
        fn try_lock(&mut self, key: &str) -> bool {
            let (table, lock_key) = (&self.table, lock_key_for(key));
            let now = SystemTime::now();
            let expires = now + SPRING_TTL;
            let updated = self.conn.exec_drop(
                format!(
                    "UPDATE {table} SET CLIENT_ID=?, EXPIRED_AFTER=? WHERE REGION=? \
                         AND LOCK_KEY=? AND (CLIENT_ID=? OR EXPIRED_AFTER<?)"
                ),
                (
                    &self.client_id,
                    utc(expires),
                    "DEFAULT",
                    &lock_key,
                    &self.client_id,
                    utc(now),
                ),
            );
            match updated {
                Ok(()) if self.conn.affected_rows() > 0 => return true,
                Ok(()) => {}
                // Transient (a deadlock, a lock wait timeout): Spring tries again later.
                Err(mysql::Error::MySqlError(e)) if matches!(e.code, 1205 | 1213) => return false,
                Err(e) => panic!("Spring's update failed: {e}"),
            }
            let inserted = self.conn.exec_drop(
                format!(
                    "INSERT INTO {table} (REGION, LOCK_KEY, CLIENT_ID, CREATED_DATE, \
                     EXPIRED_AFTER) VALUES (?, ?, ?, ?, ?)"
                ),
                (
                    "DEFAULT",
                    &lock_key,
                    &self.client_id,
                    utc(now),
                    utc(expires),
                ),
            );
            match inserted {
                Ok(()) => true,
                Err(mysql::Error::MySqlError(e)) if e.code == 1062 => false,
                // A deadlock with a concurrent insert of the same key (1213) or a lock wait
                // timeout (1205): Spring's lock loop treats these transient failures as "not
                // this time" and tries again at its next poll.
                Err(mysql::Error::MySqlError(e)) if matches!(e.code, 1205 | 1213) => false,
                Err(e) => panic!("Spring's insert failed: {e}"),
            }
        }

        fn unlock(&mut self, key: &str) -> u64 {
            let table = &self.table;
            self.conn
                .exec_drop(
                    format!("DELETE FROM {table} WHERE REGION=? AND LOCK_KEY=? AND CLIENT_ID=?"),
                    ("DEFAULT", lock_key_for(key), &self.client_id),
                )
                .unwrap();
            self.conn.affected_rows()
        }

        fn row(&mut self, key: &str) -> Option<(Option<String>, i64)> {
            let table = &self.table;
            self.conn
                .exec_first(
                    format!(
                        "SELECT CLIENT_ID, FENCING_TOKEN FROM {table} \
                         WHERE REGION='DEFAULT' AND LOCK_KEY=?"
                    ),
                    (lock_key_for(key),),
                )
                .unwrap()
        }

        fn table(&self) -> &str {
            &self.table
        }

        fn another(&self) -> Box<dyn Spring + Send> {
            Box::new(SpringMysql {
                conn: spring_connection().expect("a second Spring connection"),
                table: self.table.clone(),
                client_id: uuid::Uuid::new_v4().to_string(),
            })
        }

        fn execute(&mut self, sql: &str) {
            self.conn.query_drop(sql).unwrap();
        }

        fn probe_acquire(&mut self, sql: &str, key: &str, client_id: &str) -> (bool, bool) {
            self.conn.query_drop("START TRANSACTION").unwrap();
            use mysql::params;
            let params = params! {
                "lock_key" => lock_key_for(key),
                "region" => "DEFAULT",
                "client_id" => client_id,
                "ttl_micros" => 10_000_000_i64,
                "token" => 0_i64,
                "lock_name" => key,
            };
            self.conn.exec_drop(sql, params).unwrap();
            // The default statement reports a grant's token through LAST_INSERT_ID().
            let granted = self.conn.last_insert_id() != 0;
            // InnoDB refreshes the table behind `innodb_trx` at most every 100 ms: wait past that
            // so the row read below is this statement's, not a cached earlier one.
            std::thread::sleep(Duration::from_millis(250));
            let modified: Option<u64> = self
                .conn
                .query_first(
                    "SELECT trx_rows_modified FROM information_schema.innodb_trx \
                     WHERE trx_mysql_thread_id = CONNECTION_ID()",
                )
                .unwrap();
            self.conn.query_drop("ROLLBACK").unwrap();
            let modified = modified.expect("the statement started an InnoDB transaction");
            (granted, modified > 0)
        }
    }

    fn setup() -> Option<(impl Fn() -> RegistryBuilder + Sync, SpringMysql)> {
        let url = url();
        let conn = match spring_connection() {
            Ok(conn) => conn,
            Err(e) => {
                unreachable("MySQL", &url, &e);
                return None;
            }
        };
        let prefix = unique_prefix("my");
        let table = format!("{prefix}LOCK");
        let builder = move || {
            LockRegistry::mysql(url.clone())
                .prefix(prefix.clone())
                .create_table(true)
        };
        let spring = SpringMysql {
            conn,
            table,
            client_id: uuid::Uuid::new_v4().to_string(),
        };
        Some((builder, spring))
    }

    shared_tests!();

    /// A registry whose waiters poll about once a minute (45–75 s): only a release wake-up
    /// gets them the key within the tests' 30 s.
    fn waking_registry(builder: impl Fn() -> RegistryBuilder) -> LockRegistry {
        builder()
            .idle_between_tries(Duration::from_secs(60))
            .build()
            .unwrap()
    }

    /// One thread of `registry` waits for `key`, held by a holder without a named lock, and
    /// sends the token of its grant once it has released it; returns the receiving end once
    /// the waiter's watcher has made it try again (its first look at the key) and it was
    /// refused, so that only a later report can get it the key before its next poll.
    fn waiter_behind_an_unnamed_holder(
        registry: &LockRegistry,
        key: &str,
    ) -> crossbeam_channel::Receiver<u64> {
        let lock = registry.obtain(key).unwrap();
        let (granted, waiter) = crossbeam_channel::bounded(1);
        std::thread::spawn(move || {
            let guard = lock.lock().unwrap();
            let token = guard.fencing_token();
            guard.unlock().unwrap();
            let _ = granted.send(token);
        });
        let waited = std::time::Instant::now();
        while registry.statistics().contended_tries < 2 {
            assert!(
                waited.elapsed() < Duration::from_secs(30),
                "the waiter was not refused twice: {:?}",
                registry.statistics()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        waiter
    }

    /// On MariaDB: a Spring holder takes no named lock, so no `GET_LOCK` tells of its unlock.
    /// The watcher looks at a row held without its named lock every few milliseconds and
    /// reports its deletion: a waiter that polls once a minute gets the key within 30 s.
    #[test]
    fn a_spring_unlock_wakes_a_waiting_registry() {
        let Some((builder, mut spring)) = setup() else {
            return;
        };
        with_table(&mut spring, |spring| {
            let registry = waking_registry(&builder);
            let key = format!("deleted-{}", uuid::Uuid::new_v4());
            registry
                .obtain(&key)
                .unwrap()
                .lock()
                .unwrap()
                .unlock()
                .unwrap();
            assert!(spring.try_lock(&key), "Spring takes the released key");
            let waiter = waiter_behind_an_unnamed_holder(&registry, &key);
            assert_eq!(spring.unlock(&key), 1);
            let token = waiter.recv_timeout(Duration::from_secs(30));
            assert!(token.is_ok(), "the waiter never heard of Spring's unlock");
            assert_eq!(spring.row(&key).map(|(holder, _)| holder), Some(None));
        });
    }

    /// A holder without a named lock that stops renewing (a crashed Spring instance, say): when
    /// its row runs out, the watcher reports it and the waiter takes the row over at once
    /// instead of at its next poll (a minute away).
    #[test]
    fn an_expired_unnamed_holder_wakes_a_waiting_registry() {
        let Some((builder, mut spring)) = setup() else {
            return;
        };
        with_table(&mut spring, |spring| {
            let registry = waking_registry(&builder);
            let key = format!("expired-{}", uuid::Uuid::new_v4());
            assert!(spring.try_lock(&key), "Spring takes the new key");
            let waiter = waiter_behind_an_unnamed_holder(&registry, &key);
            // Spring's lease runs out in 2 s; nobody deletes the row.
            let mut conn = spring_connection().unwrap();
            conn.exec_drop(
                format!(
                    "UPDATE {} SET EXPIRED_AFTER = UTC_TIMESTAMP(6) + INTERVAL 2 SECOND \
                     WHERE LOCK_KEY = ?",
                    spring.table()
                ),
                (lock_key_for(&key),),
            )
            .unwrap();
            let token = waiter.recv_timeout(Duration::from_secs(30));
            assert!(token.is_ok(), "the waiter never heard the row run out");
            assert_eq!(
                spring.row(&key),
                Some((None, token.unwrap() as i64)),
                "the waiter took the expired row over and released it"
            );
        });
    }

    #[test]
    fn replacement_statements_are_checked() {
        let Some((builder, mut spring)) = setup() else {
            return;
        };
        with_table(&mut spring, |spring| {
            builder().build().unwrap();
            let table = spring.table().to_string();
            // Named parameters, any subset, any order.
            let renew = format!(
                "UPDATE {table} SET EXPIRED_AFTER = UTC_TIMESTAMP(6) + INTERVAL :ttl_micros \
                 MICROSECOND WHERE CLIENT_ID = :client_id AND LOCK_KEY = :lock_key \
                 AND REGION = :region"
            );
            let registry = builder()
                .custom_sql(leasehold::CustomSql {
                    renew: Some(renew),
                    ..Default::default()
                })
                .build()
                .unwrap();
            let guard = registry
                .obtain("custom")
                .unwrap()
                .try_lock()
                .unwrap()
                .unwrap();
            guard.renew().unwrap();
            guard.unlock().unwrap();
            // Plain `?` bind parameters 1, 2, 3 in order. This renew changes nothing in the
            // row: with found rows it still counts as renewed.
            let renew = format!(
                "UPDATE {table} SET EXPIRED_AFTER = EXPIRED_AFTER \
                 WHERE LOCK_KEY = ? AND REGION = ? AND CLIENT_ID = ?"
            );
            let registry = builder()
                .custom_sql(leasehold::CustomSql {
                    renew: Some(renew),
                    ..Default::default()
                })
                .build()
                .unwrap();
            let guard = registry
                .obtain("custom")
                .unwrap()
                .try_lock()
                .unwrap()
                .unwrap();
            guard.renew().unwrap();
            guard.unlock().unwrap();
            assert_rejected(
                builder()
                    .custom_sql(leasehold::CustomSql {
                        release: Some(format!(
                            "UPDATE {table} SET CLIENT_ID = NULL WHERE LOCK_KEY = :lockkey"
                        )),
                        ..Default::default()
                    })
                    .build(),
                "release",
            );
            assert_rejected(
                builder()
                    .custom_sql(leasehold::CustomSql {
                        acquire: Some(format!(
                            "UPDATE {table} SET CLIENT_ID = :client_id WHERE LOCK_KEY = :lock_key"
                        )),
                        ..Default::default()
                    })
                    .build(),
                "acquire",
            );
        });
    }

    #[test]
    fn connection_errors_say_what_to_fix() {
        let Some((_, mut spring)) = setup() else {
            return;
        };
        with_table(&mut spring, |_| {
            let missing = url().rsplit_once('/').unwrap().0.to_string() + "/leasehold_no_such_db";
            match LockRegistry::mysql(missing).build() {
                Err(Error::Database {
                    operation: "connect",
                    hint,
                    ..
                }) => assert!(hint.contains("leasehold_no_such_db"), "{hint}"),
                other => panic!("unexpected {other:?}"),
            }
            let refused = LockRegistry::mysql("mysql://root@127.0.0.1:1/test")
                .connect_timeout(Duration::from_millis(300))
                .build();
            match refused {
                Err(Error::Database {
                    operation: "connect",
                    hint,
                    ..
                }) => assert!(hint.contains("127.0.0.1:1"), "{hint}"),
                other => panic!("unexpected {other:?}"),
            }
        });
    }
}
