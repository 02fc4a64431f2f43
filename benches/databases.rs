//! Per-database costs, each next to baselines measured in the same run on the same server.
//!
//! For every backend that is compiled in and answering (SQLite always; PostgreSQL and MariaDB
//! at `LEASEHOLD_POSTGRES_URL` / `LEASEHOLD_MYSQL_URL`, defaults as in the tests):
//!
//! - `select_1`: a prepared `SELECT 1` round trip on a raw driver connection (baseline);
//! - `durable_commit`: a prepared one-row `UPDATE` committed durably (baseline);
//! - `lock_unlock`: an uncontended `lock()` + `unlock()` through a registry;
//! - `lock_unlock_prepared` (PostgreSQL): the same with `prepared_statements(true)`, named
//!   statements prepared once per connection (what the default picks on a connection straight
//!   to the server) — forced, so that the figure does not depend on the detection;
//! - `lease_statements` (every backend): the registry's own acquire and release statements
//!   ([`LockRegistry::statements`]) run back to back on the raw connection with the
//!   registry's parameters, protocol and durability — the floor under `lock_unlock`, so the
//!   difference is what the registry itself costs. On PostgreSQL they go unnamed
//!   (`query_typed`, as `prepared_statements(false)` sends them, behind a pooler);
//!   `lease_statements_prepared` runs them as named statements prepared once, the baseline of
//!   `lock_unlock_prepared` and, in the interleaved rounds, of the default registry. On MySQL they are prepared once in `?` form (the registry's
//!   connections do the same) and the token is read from the insert id;
//! - `unlock` and `lease_release`: the registry's `unlock()` and the raw release statement
//!   alone, each timed after an untimed grant;
//! - `lock_unlock_no_wakeups`: `lock_unlock` with `notifications(false)`: what the wake-up
//!   machinery adds to an uncontended lock (MySQL's named lock taken and let go on a
//!   connection of its own, SQLite's release board);
//! - after each backend's group, the same pairs measured in 301 alternating rounds of 40 calls
//!   (`lock_unlock` against `lease_statements`, `unlock` against `lease_release`; also
//!   without wake-ups and, on PostgreSQL, with unnamed statements against the unnamed
//!   baseline), printed with the median of
//!   the rounds' ratios and appended to `target/databases_interleaved.txt`: on a loaded
//!   machine, drift between criterion's benches is as large as the registry's own cost;
//! - `durable_then_unsynced_commit` (PostgreSQL): the durable commit, then the same `UPDATE`
//!   committed without a disk sync — the floor of any design that syncs a grant and not its
//!   release, as leasehold does; a write costs the server more than `SELECT 1`, so this floor
//!   lies above "one durable commit + two `SELECT 1`" wherever the server's work for a one-row
//!   write exceeds a round trip;
//! - `spring_statements` (PostgreSQL): Spring Integration's statements for one uncontended lock
//!   and unlock (`UPDATE` finding no row, `INSERT`, `DELETE`), each committed on its own — a
//!   lower bound of what a `JdbcLockRegistry` pays, which runs them in transactions;
//! - `durable_commit_after_idle` (in the handoff group): the durable commit again, but after
//!   the same idle pause the handoffs wait through; on a virtual machine waking idle processes
//!   costs more than the commit itself, and every handoff pays that too;
//! - `handoff_instances`: registry A releases, registry B (own pool) was waiting in `lock()`:
//!   time from A's `unlock()` call to B's `lock()` returning;
//! - `handoff_processes`: the same with B in another OS process (this binary, re-spawned).
//! - `server_handoff` (MySQL): the server's own handoff between two sessions — one holds a
//!   named lock, the other waits in `GET_LOCK` on it, the first lets go after the same idle
//!   pause — the baseline of MySQL's wake-ups, which use the same primitive.
//! - `handoff_instances_default_turns` (PostgreSQL with notifications): `handoff_instances` with
//!   the default `Tuning::turn_limit` (the others run without a limit), to
//!   show what fair turns cost.
//!
//! Every backend runs the handoffs twice: with release wake-ups (PostgreSQL's
//! `LISTEN`/`NOTIFY`, SQLite's release board, MySQL's named locks; the default) and with polling
//! only (`<backend>_polling`). Polling backends sleep
//! `idle_between_tries` = 100 ms between attempts, so their handoffs take about half that.
//!
//! `cargo bench --all-features --bench databases`; the README's Performance table lists the
//! medians as ratios to the baselines of the same run. `LEASEHOLD_BENCH_BACKENDS=sqlite,mysql`
//! (say) measures only those; `LEASEHOLD_BENCH_UNCONTENDED_ONLY=1` skips the handoff groups.

#[path = "common/child.rs"]
mod child;
// Its `RawLease` serves `tails`; here only its PostgreSQL parameter types and MySQL
// parameter lists.
#[allow(dead_code)]
#[path = "common/raw_lease.rs"]
mod raw_lease;
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[path = "common/urls.rs"]
mod urls;

use child::ChildProcess;
use criterion::Criterion;
use leasehold::{LockRegistry, RegistryBuilder};
#[cfg(feature = "mysql")]
use raw_lease::mysql_params;
#[cfg(feature = "postgres")]
use raw_lease::PG_TYPES;
use std::io::{BufRead, Write};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
#[cfg(any(feature = "postgres", feature = "mysql"))]
use urls::{env_or, without_tls};

const CHILD_ENV: &str = "LEASEHOLD_BENCH_CHILD";
const HANDOFF_KEY: &str = "bench-handoff";

/// Where a registry lives; also passed to the child process as text.
#[derive(Clone, Debug)]
enum Target {
    Sqlite(String),
    #[cfg(feature = "postgres")]
    Postgres(String),
    #[cfg(feature = "mysql")]
    Mysql(String),
}

impl Target {
    fn encode(&self) -> String {
        match self {
            Target::Sqlite(path) => format!("sqlite|{path}"),
            #[cfg(feature = "postgres")]
            Target::Postgres(url) => format!("postgres|{url}"),
            #[cfg(feature = "mysql")]
            Target::Mysql(url) => format!("mysql|{url}"),
        }
    }

    fn decode(text: &str) -> Target {
        let (kind, location) = text.split_once('|').expect("kind|location");
        match kind {
            "sqlite" => Target::Sqlite(location.into()),
            #[cfg(feature = "postgres")]
            "postgres" => Target::Postgres(location.into()),
            #[cfg(feature = "mysql")]
            "mysql" => Target::Mysql(location.into()),
            other => panic!("unknown target {other}"),
        }
    }

    fn builder(&self, notifications: bool) -> RegistryBuilder {
        let builder = match self {
            Target::Sqlite(path) => LockRegistry::sqlite(path),
            #[cfg(feature = "postgres")]
            Target::Postgres(url) => LockRegistry::postgres(url.clone()),
            #[cfg(feature = "mysql")]
            Target::Mysql(url) => LockRegistry::mysql(url.clone()),
        };
        builder
            .prefix("BENCH_")
            .create_table(true)
            .notifications(notifications)
            .tuning(leasehold::Tuning {
                turn_limit: None,
                ..Default::default()
            })
    }
}

fn micros_now() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

/// Child mode: on each `go` line, lock, print when it was granted, unlock, print `done`.
fn child(target: Target, notifications: bool) {
    let registry = target
        .builder(notifications)
        .build()
        .expect("child registry");
    let lock = registry.obtain(HANDOFF_KEY).unwrap();
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    writeln!(stdout, "ready").unwrap();
    for line in stdin.lock().lines() {
        if line.unwrap() != "go" {
            break;
        }
        let guard = lock.lock().unwrap();
        let granted = micros_now();
        guard.unlock().unwrap();
        writeln!(stdout, "{granted}").unwrap();
        stdout.flush().unwrap();
    }
}

/// The waiting side of a handoff: a thread with its own registry, or another process.
trait Waiter {
    /// Starts waiting for the lock; returns once the waiter is (about to be) blocked.
    fn start(&mut self);
    /// Waits for the grant; returns when it happened (µs since the epoch) after the waiter
    /// has released again.
    fn granted(&mut self) -> u128;
}

struct ThreadWaiter {
    go: mpsc::Sender<()>,
    done: mpsc::Receiver<u128>,
}

impl ThreadWaiter {
    fn new(registry: LockRegistry) -> Self {
        let (go, go_rx) = mpsc::channel::<()>();
        let (done_tx, done) = mpsc::channel();
        thread::spawn(move || {
            let lock = registry.obtain(HANDOFF_KEY).unwrap();
            for () in go_rx {
                let guard = lock.lock().unwrap();
                let granted = micros_now();
                guard.unlock().unwrap();
                if done_tx.send(granted).is_err() {
                    break;
                }
            }
        });
        ThreadWaiter { go, done }
    }
}

impl Waiter for ThreadWaiter {
    fn start(&mut self) {
        self.go.send(()).unwrap();
    }
    fn granted(&mut self) -> u128 {
        self.done.recv().unwrap()
    }
}

struct ProcessWaiter(ChildProcess);

impl ProcessWaiter {
    fn new(target: &Target, notifications: bool) -> Self {
        ProcessWaiter(ChildProcess::spawn(
            CHILD_ENV,
            &format!("{}|{notifications}", target.encode()),
        ))
    }
}

impl Waiter for ProcessWaiter {
    fn start(&mut self) {
        self.0.send("go");
    }
    fn granted(&mut self) -> u128 {
        self.0.read_line().parse().expect("grant time")
    }
}

/// A pause of 5 to 105 ms (pseudo-random, uniform): the idle time before each handoff.
struct IdlePause(u64);

impl IdlePause {
    fn new() -> Self {
        IdlePause(micros_now() as u64 | 1)
    }

    fn sleep(&mut self) {
        let seed = &mut self.0;
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        thread::sleep(Duration::from_millis(5 + *seed % 100));
    }
}

/// `iterations` handoffs from `holder` to `waiter`; the sum of (grant − release call).
fn handoffs(holder: &LockRegistry, waiter: &mut dyn Waiter, iterations: u64) -> Duration {
    let lock = holder.obtain(HANDOFF_KEY).unwrap();
    let mut total = Duration::ZERO;
    let mut pause = IdlePause::new();
    for _ in 0..iterations {
        let guard = lock.lock().unwrap();
        waiter.start();
        // Let the waiter make its first (failing) attempt and start waiting, then release at a
        // random point of its polling cycle, as a real release would.
        pause.sleep();
        let released = micros_now();
        guard.unlock().unwrap();
        let granted = waiter.granted();
        total += Duration::from_micros(granted.saturating_sub(released) as u64);
    }
    total
}

fn bench_backend(c: &mut Criterion, name: &str, target: &Target, raw: &mut dyn Raw) {
    let mut group = c.benchmark_group(name);
    group.bench_function("select_1", |b| b.iter(|| raw.select_1()));
    group.bench_function("durable_commit", |b| b.iter(|| raw.commit()));
    let registry = target.builder(true).build().expect("registry");
    let lock = registry.obtain("bench-uncontended").unwrap();
    group.bench_function("lock_unlock", |b| {
        b.iter(|| lock.lock().unwrap().unlock().unwrap())
    });
    if raw.prepare_lease(registry.statements()) {
        group.bench_function("lease_statements", |b| b.iter(|| raw.lease_cycle()));
    }
    // Interleaved with the above, the release on its own: the registry's `unlock()` and the
    // raw release statement, each after an untimed grant.
    group.bench_function("unlock", |b| {
        b.iter_custom(|n| {
            let mut total = Duration::ZERO;
            for _ in 0..n {
                let guard = lock.lock().unwrap();
                let started = std::time::Instant::now();
                guard.unlock().unwrap();
                total += started.elapsed();
            }
            total
        })
    });
    if raw.has_lease() {
        group.bench_function("lease_release", |b| {
            b.iter_custom(|n| {
                let mut total = Duration::ZERO;
                for _ in 0..n {
                    let token = raw.lease_acquire();
                    let started = std::time::Instant::now();
                    raw.lease_release(token);
                    total += started.elapsed();
                }
                total
            })
        });
    }
    // Without release wake-ups: what the wake-up machinery adds to an uncontended lock (MySQL's
    // named lock taken after each grant and let go after each release, on a connection of its
    // own; SQLite's release board; PostgreSQL's notification is part of the release statement).
    let quiet = target
        .builder(false)
        .build()
        .expect("registry without wake-ups");
    let quiet_lock = quiet.obtain("bench-uncontended-quiet").unwrap();
    group.bench_function("lock_unlock_no_wakeups", |b| {
        b.iter(|| quiet_lock.lock().unwrap().unlock().unwrap())
    });
    if raw.has_unsynced_commit() {
        group.bench_function("durable_then_unsynced_commit", |b| {
            b.iter(|| {
                raw.commit();
                raw.unsynced_commit();
            })
        });
    }
    if raw.prepare_spring("BENCH_LOCK") {
        group.bench_function("spring_statements", |b| b.iter(|| raw.spring_cycle()));
    }
    if name == "postgres" {
        // The same lock and unlock with named statements forced (what the default detects on
        // this direct connection).
        let prepared = target
            .builder(true)
            .prepared_statements(true)
            .build()
            .expect("registry with prepared statements");
        let lock = prepared.obtain("bench-uncontended-prepared").unwrap();
        group.bench_function("lock_unlock_prepared", |b| {
            b.iter(|| lock.lock().unwrap().unlock().unwrap())
        });
        if raw.lease_prepared(true) {
            group.bench_function("lease_statements_prepared", |b| {
                b.iter(|| raw.lease_cycle())
            });
            raw.lease_prepared(false);
        }
        // What skipping the disk sync on release buys: the same release, committed durably.
        let durable = target
            .builder(true)
            .custom_sql(leasehold::CustomSql {
                release: Some(
                    "WITH released AS (UPDATE BENCH_LOCK SET CLIENT_ID = NULL, \
                 EXPIRED_AFTER = TIMESTAMP '1970-01-01 00:00:00' WHERE LOCK_KEY = $1 \
                 AND REGION = $2 AND CLIENT_ID = $3 AND FENCING_TOKEN = $5 \
                 AND EXPIRED_AFTER >= (now() AT TIME ZONE 'UTC') RETURNING 1) \
                 SELECT pg_notify('bench_lock', $1 || ' ' || $2) FROM released"
                        .into(),
                ),
                ..Default::default()
            })
            .build()
            .expect("registry with a durable release");
        let lock = durable.obtain("bench-uncontended-durable").unwrap();
        group.bench_function("lock_unlock_durable_release", |b| {
            b.iter(|| lock.lock().unwrap().unlock().unwrap())
        });
    }
    group.finish();
    if raw.has_lease() {
        // On PostgreSQL the default registry on this direct connection sends named statements:
        // its baseline runs the same statements prepared once.
        let named = raw.lease_prepared(true);
        interleaved(name, &lock, raw, "");
        interleaved(name, &quiet_lock, raw, " (no wake-ups)");
        if named {
            raw.lease_prepared(false);
            let unnamed = target
                .builder(true)
                .prepared_statements(false)
                .build()
                .expect("registry with unnamed statements");
            let lock = unnamed.obtain("bench-uncontended-unnamed").unwrap();
            interleaved(name, &lock, raw, " (unnamed, as behind a pooler)");
        }
    }
    if uncontended_only() {
        return;
    }
    let polling_variants = [(true, name.to_string()), (false, format!("{name}_polling"))];
    for (notifications, label) in &polling_variants {
        let mut group = c.benchmark_group(label);
        group.sample_size(10);
        group.warm_up_time(Duration::from_millis(500));
        group.measurement_time(Duration::from_secs(
            if *notifications && name == "postgres" {
                3
            } else {
                8
            },
        ));
        if *notifications && raw.server_handoff(1).is_some() {
            group.bench_function("server_handoff", |b| {
                b.iter_custom(|n| raw.server_handoff(n).unwrap())
            });
        }
        if *notifications {
            group.bench_function("durable_commit_after_idle", |b| {
                b.iter_custom(|n| {
                    let mut pause = IdlePause::new();
                    let mut total = Duration::ZERO;
                    for _ in 0..n {
                        pause.sleep();
                        let started = std::time::Instant::now();
                        raw.commit();
                        total += started.elapsed();
                    }
                    total
                })
            });
        }
        let holder = target.builder(*notifications).build().unwrap();
        let mut thread_waiter = ThreadWaiter::new(target.builder(*notifications).build().unwrap());
        group.bench_function("handoff_instances", |b| {
            b.iter_custom(|n| handoffs(&holder, &mut thread_waiter, n))
        });
        let mut process_waiter = ProcessWaiter::new(target, *notifications);
        group.bench_function("handoff_processes", |b| {
            b.iter_custom(|n| handoffs(&holder, &mut process_waiter, n))
        });
        if *notifications && name == "postgres" {
            // What fair turns cost a ping-pong handoff: the default turn limit instead of no
            // limit.
            let with_turns = |target: &Target| {
                target
                    .builder(true)
                    .tuning(leasehold::Tuning::default())
                    .build()
                    .unwrap()
            };
            let holder = with_turns(target);
            let mut waiter = ThreadWaiter::new(with_turns(target));
            group.bench_function("handoff_instances_default_turns", |b| {
                b.iter_custom(|n| handoffs(&holder, &mut waiter, n))
            });
        }
        group.finish();
    }
}

/// The medians of `values`.
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The registry's `lock()` + `unlock()` against the raw lease statements, and its `unlock()`
/// against the raw release, in alternating rounds (which one goes first alternates too), so
/// that the machine's drift hits both alike; prints per-call medians over the rounds and the
/// median of the rounds' ratios, and appends them to `target/databases_interleaved.txt`.
fn interleaved(name: &str, lock: &leasehold::Lock, raw: &mut dyn Raw, mode: &str) {
    // One round's ratio scatters widely where client and server share a small machine; the
    // median of this many rounds holds steady between runs.
    const ROUNDS: usize = 301;
    const CALLS: u32 = 40;
    let cycle_registry = |lock: &leasehold::Lock| {
        let started = std::time::Instant::now();
        for _ in 0..CALLS {
            lock.lock().unwrap().unlock().unwrap();
        }
        started.elapsed().as_secs_f64() / CALLS as f64
    };
    let cycle_raw = |raw: &mut dyn Raw| {
        let started = std::time::Instant::now();
        for _ in 0..CALLS {
            raw.lease_cycle();
        }
        started.elapsed().as_secs_f64() / CALLS as f64
    };
    let unlock_registry = |lock: &leasehold::Lock| {
        let mut total = Duration::ZERO;
        for _ in 0..CALLS {
            let guard = lock.lock().unwrap();
            let started = std::time::Instant::now();
            guard.unlock().unwrap();
            total += started.elapsed();
        }
        total.as_secs_f64() / CALLS as f64
    };
    let release_raw = |raw: &mut dyn Raw| {
        let mut total = Duration::ZERO;
        for _ in 0..CALLS {
            let token = raw.lease_acquire();
            let started = std::time::Instant::now();
            raw.lease_release(token);
            total += started.elapsed();
        }
        total.as_secs_f64() / CALLS as f64
    };
    let (mut registry, mut statements, mut ratios) = (vec![], vec![], vec![]);
    let (mut unlocks, mut releases, mut unlock_ratios) = (vec![], vec![], vec![]);
    for round in 0..ROUNDS {
        let (a, b, c, d) = if round % 2 == 0 {
            let a = cycle_registry(lock);
            let b = cycle_raw(raw);
            let c = unlock_registry(lock);
            (a, b, c, release_raw(raw))
        } else {
            let b = cycle_raw(raw);
            let a = cycle_registry(lock);
            let d = release_raw(raw);
            (a, b, unlock_registry(lock), d)
        };
        registry.push(a);
        statements.push(b);
        ratios.push(a / b);
        unlocks.push(c);
        releases.push(d);
        unlock_ratios.push(c / d);
    }
    let us = |seconds: f64| seconds * 1e6;
    let text = format!(
        "{name}{mode} interleaved ({ROUNDS} rounds of {CALLS}): lock_unlock {:.1} µs, \
         lease_statements {:.1} µs, ratio {:.3}; unlock {:.1} µs, lease_release {:.1} µs, \
         ratio {:.3}\n",
        us(median(&mut registry)),
        us(median(&mut statements)),
        median(&mut ratios),
        us(median(&mut unlocks)),
        us(median(&mut releases)),
        median(&mut unlock_ratios),
    );
    print!("{text}");
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/databases_interleaved.txt");
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = file.write_all(text.as_bytes());
    }
}

/// The raw-driver baselines of one database.
trait Raw {
    fn select_1(&mut self);
    fn commit(&mut self);
    /// Prepares the registry's `statements` for [`Raw::lease_cycle`], to run them as the
    /// registry does (same protocol, same parameters, same durability); `false` where that is
    /// not measured.
    fn prepare_lease(&mut self, _statements: &leasehold::Statements) -> bool {
        false
    }
    /// Whether [`Raw::prepare_lease`] succeeded.
    fn has_lease(&self) -> bool {
        false
    }
    /// PostgreSQL: run the lease statements as named prepared statements (`true`, as
    /// `prepared_statements(true)`) or unnamed (`false`, the registry's default); `false`
    /// where there is no such choice.
    fn lease_prepared(&mut self, _prepared: bool) -> bool {
        false
    }
    /// Runs the registry's acquire statement on the free key; its fencing token.
    fn lease_acquire(&mut self) -> i64 {
        unreachable!("no lease statements")
    }
    /// Runs the registry's release statement for the lease granted with `token`.
    fn lease_release(&mut self, _token: i64) {}
    /// Runs the acquire, then the release of the lease it granted.
    fn lease_cycle(&mut self) {
        let token = self.lease_acquire();
        self.lease_release(token);
    }
    /// Whether one transaction can skip the disk sync at commit (PostgreSQL).
    fn has_unsynced_commit(&self) -> bool {
        false
    }
    /// The baseline's `UPDATE`, committed without waiting for the disk.
    fn unsynced_commit(&mut self) {}
    /// Prepares Spring's statements on `table` for [`Raw::spring_cycle`]; `false` where that
    /// is not measured.
    fn prepare_spring(&mut self, _table: &str) -> bool {
        false
    }
    /// One uncontended lock + unlock the way Spring Integration's `JdbcLockRegistry` does it,
    /// each statement committed on its own (a lower bound: Spring wraps them in transactions
    /// that cost more round trips): `UPDATE` (no row: Spring deleted it), `INSERT`, `DELETE`.
    fn spring_cycle(&mut self) {}
    /// `iterations` handoffs through the database's own blocking primitive, where it has one
    /// (MySQL's `GET_LOCK`), as a baseline of the handoffs.
    fn server_handoff(&mut self, _iterations: u64) -> Option<Duration> {
        None
    }
}

/// The raw-statement lease's key, client and time-to-live (µs): one row, free between cycles.
const RAW_LEASE_KEY: &str = "bench-raw-statements";
const RAW_CLIENT: &str = "bench-raw-client";
const RAW_TTL_MICROS: i64 = 10_000_000;
/// Parameter 4 of the registry's release: an uncontended release continues a turn of age 0.
const RAW_RELEASE_TURN: i64 = 0;

struct RawSqlite {
    conn: rusqlite::Connection,
    /// The registry's acquire and release statements.
    lease: Option<(String, String)>,
}

impl RawSqlite {
    /// Runs `sql` (cached, as the registry's connections cache it) with the documented
    /// parameters 1 to its highest, bound by number as the registry binds them.
    fn run(&mut self, sql: &str, values: [&dyn rusqlite::ToSql; 6], row: bool) -> Option<i64> {
        let mut statement = self.conn.prepare_cached(sql).unwrap();
        for (index, value) in values.iter().enumerate() {
            if index < statement.parameter_count() {
                statement.raw_bind_parameter(index + 1, value).unwrap();
            }
        }
        if row {
            let mut rows = statement.raw_query();
            let row = rows.next().unwrap();
            row.map(|row| row.get(0).unwrap())
        } else {
            Some(statement.raw_execute().unwrap() as i64)
        }
    }
}

impl Raw for RawSqlite {
    fn select_1(&mut self) {
        let mut statement = self.conn.prepare_cached("SELECT 1").unwrap();
        statement.query_row([], |row| row.get::<_, i64>(0)).unwrap();
    }
    fn commit(&mut self) {
        let mut statement = self
            .conn
            .prepare_cached("UPDATE bench_commit SET n = n + 1 WHERE id = 1")
            .unwrap();
        statement.execute([]).unwrap();
    }
    fn prepare_lease(&mut self, statements: &leasehold::Statements) -> bool {
        self.lease = Some((statements.acquire.clone(), statements.release.clone()));
        true
    }
    fn has_lease(&self) -> bool {
        self.lease.is_some()
    }
    fn lease_acquire(&mut self) -> i64 {
        let (acquire, _) = self.lease.clone().expect("prepared");
        let key = leasehold::lock_key_for(RAW_LEASE_KEY);
        let values: [&dyn rusqlite::ToSql; 6] = [
            &key,
            &"DEFAULT",
            &RAW_CLIENT,
            &RAW_TTL_MICROS,
            &0_i64,
            &RAW_LEASE_KEY,
        ];
        self.run(&acquire, values, true).expect("granted")
    }
    fn lease_release(&mut self, token: i64) {
        let (_, release) = self.lease.clone().expect("prepared");
        let key = leasehold::lock_key_for(RAW_LEASE_KEY);
        let values: [&dyn rusqlite::ToSql; 6] = [
            &key,
            &"DEFAULT",
            &RAW_CLIENT,
            &RAW_RELEASE_TURN,
            &token,
            &"",
        ];
        assert_eq!(self.run(&release, values, false), Some(1));
    }
}

/// The key and client id of the Spring cycle.
#[cfg(feature = "postgres")]
const SPRING_BENCH_KEY: &str = "bench-spring-statements";
#[cfg(feature = "postgres")]
const SPRING_CLIENT: &str = "bench-spring-client";

#[cfg(feature = "postgres")]
struct RawPostgres {
    client: postgres::Client,
    select_1: postgres::Statement,
    commit: postgres::Statement,
    /// The registry's acquire and release statements, as text (sent unnamed, as the
    /// registry's default) and prepared (as with `prepared_statements(true)`).
    lease: Option<PgLease>,
    /// Whether [`Raw::lease_cycle`] runs the prepared ones.
    lease_prepared: bool,
    /// `commit` with `synchronous_commit` off for its transaction.
    unsynced_commit: postgres::Statement,
    /// Spring's update, insert and delete.
    spring: Option<[postgres::Statement; 3]>,
}

/// The registry's statements on PostgreSQL, both ways it can send them.
#[cfg(feature = "postgres")]
struct PgLease {
    acquire_sql: String,
    release_sql: String,
    acquire: postgres::Statement,
    release: postgres::Statement,
}

/// The six documented parameters with the registry's types, for `query_typed`.
#[cfg(feature = "postgres")]
fn pg_typed<'a>(
    values: &[&'a (dyn postgres::types::ToSql + Sync); 6],
) -> Vec<(
    &'a (dyn postgres::types::ToSql + Sync),
    postgres::types::Type,
)> {
    values.iter().copied().zip(PG_TYPES).collect()
}

#[cfg(feature = "postgres")]
impl Raw for RawPostgres {
    fn select_1(&mut self) {
        self.client.query_one(&self.select_1, &[]).unwrap();
    }
    fn commit(&mut self) {
        self.client.execute(&self.commit, &[]).unwrap();
    }
    fn prepare_lease(&mut self, statements: &leasehold::Statements) -> bool {
        let acquire = self.client.prepare_typed(&statements.acquire, &PG_TYPES);
        let release = self.client.prepare_typed(&statements.release, &PG_TYPES);
        self.lease = Some(PgLease {
            acquire_sql: statements.acquire.clone(),
            release_sql: statements.release.clone(),
            acquire: acquire.unwrap(),
            release: release.unwrap(),
        });
        true
    }
    fn has_lease(&self) -> bool {
        self.lease.is_some()
    }
    fn lease_prepared(&mut self, prepared: bool) -> bool {
        self.lease_prepared = prepared;
        true
    }
    fn lease_acquire(&mut self) -> i64 {
        let lease = self.lease.as_ref().expect("prepared");
        let key = leasehold::lock_key_for(RAW_LEASE_KEY);
        let (ttl, token) = (RAW_TTL_MICROS, 0_i64);
        let values: [&(dyn postgres::types::ToSql + Sync); 6] =
            [&key, &"DEFAULT", &RAW_CLIENT, &ttl, &token, &RAW_LEASE_KEY];
        let rows = match self.lease_prepared {
            true => self.client.query(&lease.acquire, &values),
            false => self
                .client
                .query_typed(&lease.acquire_sql, &pg_typed(&values)),
        };
        rows.unwrap().first().expect("granted").get(0)
    }
    fn lease_release(&mut self, token: i64) {
        let lease = self.lease.as_ref().expect("prepared");
        let key = leasehold::lock_key_for(RAW_LEASE_KEY);
        let turn = RAW_RELEASE_TURN;
        let values: [&(dyn postgres::types::ToSql + Sync); 6] =
            [&key, &"DEFAULT", &RAW_CLIENT, &turn, &token, &""];
        let released = match self.lease_prepared {
            true => self.client.execute(&lease.release, &values),
            false => self
                .client
                .execute_typed(&lease.release_sql, &pg_typed(&values)),
        };
        assert_eq!(released.unwrap(), 1);
    }
    fn has_unsynced_commit(&self) -> bool {
        true
    }
    fn unsynced_commit(&mut self) {
        self.client.execute(&self.unsynced_commit, &[]).unwrap();
    }
    fn prepare_spring(&mut self, table: &str) -> bool {
        let sql = [
            format!(
                "UPDATE {table} SET CLIENT_ID=$1, EXPIRED_AFTER=$2 WHERE REGION=$3 \
                 AND LOCK_KEY=$4 AND (CLIENT_ID=$5 OR EXPIRED_AFTER<$6)"
            ),
            format!(
                "INSERT INTO {table} (REGION, LOCK_KEY, CLIENT_ID, CREATED_DATE, EXPIRED_AFTER) \
                 VALUES ($1, $2, $3, $4, $5)"
            ),
            format!("DELETE FROM {table} WHERE REGION=$1 AND LOCK_KEY=$2 AND CLIENT_ID=$3"),
        ];
        let prepared = sql.map(|sql| self.client.prepare(&sql).unwrap());
        // A run stopped between Spring's insert and delete leaves the row behind; the cycle
        // expects Spring's state after a release: no row.
        let key = leasehold::lock_key_for(SPRING_BENCH_KEY);
        let leftover = [
            &"DEFAULT" as &(dyn postgres::types::ToSql + Sync),
            &key,
            &SPRING_CLIENT,
        ];
        self.client.execute(&prepared[2], &leftover).unwrap();
        self.spring = Some(prepared);
        true
    }
    fn spring_cycle(&mut self) {
        let [update, insert, delete] = self.spring.as_ref().expect("prepared");
        let key = leasehold::lock_key_for(SPRING_BENCH_KEY);
        let (region, client_id) = ("DEFAULT", SPRING_CLIENT);
        let now = SystemTime::now();
        let expires = now + Duration::from_secs(10);
        let updated = self
            .client
            .execute(
                update,
                &[&client_id, &expires, &region, &key, &client_id, &now],
            )
            .unwrap();
        assert_eq!(updated, 0, "Spring deleted the row when it released");
        let inserted = self
            .client
            .execute(insert, &[&region, &key, &client_id, &now, &expires]);
        assert_eq!(inserted.unwrap(), 1);
        let deleted = self.client.execute(delete, &[&region, &key, &client_id]);
        assert_eq!(deleted.unwrap(), 1);
    }
}

#[cfg(feature = "mysql")]
type MysqlLease = (
    (mysql::Statement, Vec<usize>),
    (mysql::Statement, Vec<usize>),
);

#[cfg(feature = "mysql")]
struct RawMysql {
    conn: mysql::Conn,
    url: String,
    /// The registry's acquire and release statements, prepared in `?` form, each with the
    /// parameter every `?` takes.
    lease: Option<MysqlLease>,
}

/// The server's own handoff between two sessions: `iterations` times, this connection holds a
/// named lock, a second connection (on a thread of its own) blocks in `GET_LOCK` on it, and
/// after the idle pause this one lets it go; the sum of (return of the waiter's `GET_LOCK` −
/// `RELEASE_LOCK` call).
#[cfg(feature = "mysql")]
fn named_lock_handoffs(holder: &mut mysql::Conn, url: &str, iterations: u64) -> Duration {
    use mysql::prelude::Queryable;
    const NAME: &str = "leasehold_bench_handoff";
    let mut waiter = mysql::Conn::new(mysql::Opts::from_url(url).unwrap()).unwrap();
    let (go, starts) = crossbeam_channel::bounded::<()>(0);
    let (granted, grants) = crossbeam_channel::bounded::<u128>(0);
    let waiting = thread::spawn(move || {
        while starts.recv().is_ok() {
            let got: Option<i64> = waiter
                .exec_first("SELECT GET_LOCK(?, 60)", (NAME,))
                .unwrap();
            let at = micros_now();
            assert_eq!(got, Some(1));
            waiter.exec_drop("SELECT RELEASE_LOCK(?)", (NAME,)).unwrap();
            granted.send(at).unwrap();
        }
    });
    let mut total = Duration::ZERO;
    let mut pause = IdlePause::new();
    for _ in 0..iterations {
        let taken: Option<i64> = holder
            .exec_first("SELECT GET_LOCK(?, 60)", (NAME,))
            .unwrap();
        assert_eq!(taken, Some(1));
        go.send(()).unwrap();
        pause.sleep();
        let released = micros_now();
        holder.exec_drop("SELECT RELEASE_LOCK(?)", (NAME,)).unwrap();
        let at = grants.recv().unwrap();
        total += Duration::from_micros(at.saturating_sub(released) as u64);
    }
    drop(go);
    waiting.join().unwrap();
    total
}

#[cfg(feature = "mysql")]
impl Raw for RawMysql {
    fn select_1(&mut self) {
        use mysql::prelude::Queryable;
        let _: Option<i64> = self.conn.exec_first("SELECT 1", ()).unwrap();
    }
    fn server_handoff(&mut self, iterations: u64) -> Option<Duration> {
        Some(named_lock_handoffs(&mut self.conn, &self.url, iterations))
    }
    fn commit(&mut self) {
        use mysql::prelude::Queryable;
        self.conn
            .exec_drop("UPDATE bench_commit SET n = n + 1 WHERE id = 1", ())
            .unwrap();
    }
    fn prepare_lease(&mut self, statements: &leasehold::Statements) -> bool {
        use mysql::prelude::Queryable;
        let (acquire, acquire_order) = mysql_params::question_marks(&statements.acquire);
        let (release, release_order) = mysql_params::question_marks(&statements.release);
        let acquire = self.conn.prep(acquire).unwrap();
        let release = self.conn.prep(release).unwrap();
        assert_eq!(acquire.num_columns(), 0, "the token comes in the insert id");
        self.lease = Some(((acquire, acquire_order), (release, release_order)));
        true
    }
    fn has_lease(&self) -> bool {
        self.lease.is_some()
    }
    fn lease_acquire(&mut self) -> i64 {
        use mysql::prelude::Queryable;
        let ((acquire, order), _) = self.lease.as_ref().expect("prepared");
        let key = leasehold::lock_key_for(RAW_LEASE_KEY);
        let values =
            mysql_params::values(&key, RAW_CLIENT, RAW_TTL_MICROS, 0, RAW_LEASE_KEY, order);
        self.conn.exec_drop(acquire, values).unwrap();
        let token = self.conn.last_insert_id() as i64;
        assert_ne!(token, 0, "granted");
        token
    }
    fn lease_release(&mut self, token: i64) {
        use mysql::prelude::Queryable;
        let (_, (release, order)) = self.lease.as_ref().expect("prepared");
        let key = leasehold::lock_key_for(RAW_LEASE_KEY);
        let values = mysql_params::values(&key, RAW_CLIENT, RAW_RELEASE_TURN, token, "", order);
        self.conn.exec_drop(release, values).unwrap();
        assert_eq!(self.conn.affected_rows(), 1);
    }
}

/// Whether `backend` is to be measured: all are, unless `LEASEHOLD_BENCH_BACKENDS` (a
/// comma-separated list: `sqlite,postgres,mysql`) leaves it out.
fn wanted(backend: &str) -> bool {
    std::env::var("LEASEHOLD_BENCH_BACKENDS").map_or(true, |list| list.contains(backend))
}

/// Whether only the uncontended measurements run (`LEASEHOLD_BENCH_UNCONTENDED_ONLY` set):
/// no handoff groups, no child processes.
fn uncontended_only() -> bool {
    std::env::var_os("LEASEHOLD_BENCH_UNCONTENDED_ONLY").is_some()
}

fn main() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        let (target, notifications) = spec.rsplit_once('|').expect("target|notifications");
        child(Target::decode(target), notifications == "true");
        return;
    }
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.db");
    let target = Target::Sqlite(path.to_string_lossy().into_owned());
    target.builder(true).build().expect("SQLite registry");
    let sqlite = rusqlite::Connection::open(&path).unwrap();
    sqlite
        .execute_batch(
            "PRAGMA synchronous = NORMAL; \
             CREATE TABLE IF NOT EXISTS bench_commit (id INTEGER PRIMARY KEY, n INTEGER); \
             INSERT OR IGNORE INTO bench_commit VALUES (1, 0);",
        )
        .unwrap();
    let mut raw = RawSqlite {
        conn: sqlite,
        lease: None,
    };
    if wanted("sqlite") {
        bench_backend(&mut c, "sqlite", &target, &mut raw);
    }

    #[cfg(feature = "postgres")]
    {
        let url = env_or(
            "LEASEHOLD_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432/test",
        );
        match postgres::Client::connect(&url, postgres::NoTls) {
            _ if !wanted("postgres") => {}
            Ok(mut client) => {
                client
                    .batch_execute(
                        "CREATE TABLE IF NOT EXISTS bench_commit (id int PRIMARY KEY, n bigint); \
                         INSERT INTO bench_commit VALUES (1, 0) ON CONFLICT DO NOTHING",
                    )
                    .unwrap();
                let select = client.prepare("SELECT 1").unwrap();
                let update = client
                    .prepare("UPDATE bench_commit SET n = n + 1 WHERE id = 1")
                    .unwrap();
                let unsynced_commit = client
                    .prepare(
                        "WITH unsynced AS (SELECT set_config('synchronous_commit', 'off', true)) \
                         UPDATE bench_commit SET n = n + 1 FROM unsynced WHERE id = 1",
                    )
                    .unwrap();
                let mut raw = RawPostgres {
                    client,
                    select_1: select,
                    commit: update,
                    lease: None,
                    lease_prepared: false,
                    unsynced_commit,
                    spring: None,
                };
                let target = Target::Postgres(without_tls(&url, "sslmode=disable"));
                bench_backend(&mut c, "postgres", &target, &mut raw);
            }
            Err(e) => eprintln!("skipping PostgreSQL: {e}"),
        }
    }

    #[cfg(feature = "mysql")]
    {
        let url = env_or("LEASEHOLD_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
        // As the registry's connections: UPDATE reports the rows it matched.
        let opts = mysql::Opts::from_url(&url).map(|opts| {
            mysql::OptsBuilder::from_opts(opts)
                .additional_capabilities(mysql::consts::CapabilityFlags::CLIENT_FOUND_ROWS)
        });
        match opts.map_err(mysql::Error::from).and_then(mysql::Conn::new) {
            _ if !wanted("mysql") => {}
            Ok(mut conn) => {
                use mysql::prelude::Queryable;
                conn.query_drop(
                    "CREATE TABLE IF NOT EXISTS bench_commit (id int PRIMARY KEY, n bigint)",
                )
                .unwrap();
                conn.query_drop("INSERT IGNORE INTO bench_commit VALUES (1, 0)")
                    .unwrap();
                let target = Target::Mysql(without_tls(&url, "ssl-mode=DISABLED"));
                let mut raw = RawMysql {
                    conn,
                    url,
                    lease: None,
                };
                bench_backend(&mut c, "mysql", &target, &mut raw);
            }
            Err(e) => eprintln!("skipping MariaDB: {e}"),
        }
    }

    c.final_summary();
}
