//! The distribution of cross-process handoffs with the default settings.
//!
//! Criterion reports central figures; a handoff's tail is made of the few that missed their
//! wake-up. This harness records every handoff and prints, per backend, the median, p90, p99,
//! the maximum and the share slower than 10 ms (`cargo bench --all-features --bench tails`).
//!
//! Shape (as `databases`' `handoff_processes`, but with the registry's defaults: wake-ups on,
//! fair turns with `Tuning::turn_limit` 1 s): this process holds the
//! key and tells a child process (this binary, re-spawned) to `lock()` it; after an idle pause
//! of 5 to 105 ms it calls `unlock()`. The *handoff* is the time from that call to the child's
//! grant. The child lets go at once and says so; this process then takes the key back (the
//! *return*, timed too) and the next round begins. Each grant serves one hold, so no release
//! ends a turn: every release wakes the other process.
//!
//! Besides the latency, the child reports how many acquire statements each `lock()` sent: a
//! woken handoff sends 2 or 3 (the first try, found held; one more once the waiter listens —
//! its listener subscribed, or on SQLite it is present on the release board — unless the
//! release came first; and the one its wake-up started). A higher count is an extra try (a
//! release of another key of the same board slot) or a waiter that polled (its wake-up was
//! missed; its grant then comes about a multiple of `idle_between_tries` after the call).
//! Slow handoffs are listed with that count and with the time since the previous slow one.
//!
//! `LEASEHOLD_TAILS_HANDOFFS` sets the rounds per backend (default 200, about 15 s each);
//! `LEASEHOLD_TAILS_BACKENDS` (a comma-separated subset of `sqlite,postgres,mysql`) which run.
//! The servers are found as for the tests (`LEASEHOLD_POSTGRES_URL`, `LEASEHOLD_MYSQL_URL`).
//! The summary is also written to `target/tails.txt`.

#[path = "common/child.rs"]
mod child;
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[path = "common/urls.rs"]
mod urls;

use child::ChildProcess;
use leasehold::{LockRegistry, RegistryBuilder};
use std::fmt::Write as _;
use std::io::{BufRead, Write};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
#[cfg(any(feature = "postgres", feature = "mysql"))]
use urls::{env_or, without_tls};

const CHILD_ENV: &str = "LEASEHOLD_TAILS_CHILD";
const KEY: &str = "bench-tails-handoff";
/// A handoff slower than this did not come from a wake-up.
const SLOW: Duration = Duration::from_millis(10);

/// Where the registries live, as passed to the child: `kind|location`.
fn builder(spec: &str) -> RegistryBuilder {
    let (kind, location) = spec.split_once('|').expect("kind|location");
    let builder = match kind {
        "sqlite" => LockRegistry::sqlite(location),
        #[cfg(feature = "postgres")]
        "postgres" => LockRegistry::postgres(location),
        #[cfg(feature = "mysql")]
        "mysql" => LockRegistry::mysql(location),
        other => panic!("unknown backend {other}"),
    };
    // Everything else at its default: wake-ups on, fair turns on.
    builder.prefix("BENCH_").create_table(true)
}

fn micros_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// Child mode: for each `go`, lock, note the grant time and the acquire statements the call
/// sent, unlock, and print both.
fn child(spec: &str) {
    let registry = builder(spec).build().expect("child registry");
    let lock = registry.obtain(KEY).unwrap();
    let mut stdout = std::io::stdout();
    writeln!(stdout, "ready").unwrap();
    stdout.flush().unwrap();
    for line in std::io::stdin().lock().lines() {
        if line.unwrap() != "go" {
            break;
        }
        let before = registry.statistics().acquires;
        let called = micros_now();
        let guard = lock.lock().unwrap();
        let granted = micros_now();
        let acquires = registry.statistics().acquires - before;
        guard.unlock().unwrap();
        writeln!(stdout, "{granted} {acquires} {called}").unwrap();
        stdout.flush().unwrap();
    }
}

/// A raw driver connection that commits a one-row `UPDATE` durably (the floor's statements).
enum RawConn {
    Sqlite(rusqlite::Connection),
    #[cfg(feature = "postgres")]
    Postgres(postgres::Client),
    #[cfg(feature = "mysql")]
    Mysql(mysql::Conn),
}

impl RawConn {
    fn open(spec: &str) -> RawConn {
        let (kind, location) = spec.split_once('|').expect("kind|location");
        const TABLE: &str =
            "CREATE TABLE IF NOT EXISTS bench_tails_commit (id int PRIMARY KEY, n bigint)";
        match kind {
            "sqlite" => {
                let conn = rusqlite::Connection::open(location).unwrap();
                conn.busy_timeout(Duration::from_millis(5000)).unwrap();
                conn.execute_batch(&format!(
                    "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; {TABLE}; \
                     INSERT OR IGNORE INTO bench_tails_commit VALUES (1, 0);"
                ))
                .unwrap();
                RawConn::Sqlite(conn)
            }
            #[cfg(feature = "postgres")]
            "postgres" => {
                let mut client = postgres::Client::connect(location, postgres::NoTls).unwrap();
                client
                    .batch_execute(&format!(
                        "{TABLE}; INSERT INTO bench_tails_commit VALUES (1, 0) \
                         ON CONFLICT DO NOTHING"
                    ))
                    .unwrap();
                RawConn::Postgres(client)
            }
            #[cfg(feature = "mysql")]
            "mysql" => {
                use mysql::prelude::Queryable;
                // The registry's own TLS parameter is not the driver's: left off.
                let url = location.split('?').next().unwrap_or(location);
                let opts = mysql::Opts::from_url(url).unwrap();
                let mut conn = mysql::Conn::new(opts).unwrap();
                conn.query_drop(TABLE).unwrap();
                conn.query_drop("INSERT IGNORE INTO bench_tails_commit VALUES (1, 0)")
                    .unwrap();
                RawConn::Mysql(conn)
            }
            other => panic!("unknown backend {other}"),
        }
    }

    fn commit(&mut self) {
        const UPDATE: &str = "UPDATE bench_tails_commit SET n = n + 1 WHERE id = 1";
        match self {
            RawConn::Sqlite(conn) => {
                conn.prepare_cached(UPDATE).unwrap().execute([]).unwrap();
            }
            #[cfg(feature = "postgres")]
            RawConn::Postgres(client) => {
                client.execute(UPDATE, &[]).unwrap();
            }
            #[cfg(feature = "mysql")]
            RawConn::Mysql(conn) => {
                use mysql::prelude::Queryable;
                conn.exec_drop(UPDATE, ()).unwrap();
            }
        }
    }
}

/// Floor child mode: for each `go` (sent by the holder right after its own commit), commit
/// once (`commits`) and print when that was done; or (`!commits`) print at once when the line
/// arrived: a bare wake-up of an idle process.
fn floor_child(spec: &str, commits: bool) {
    let mut conn = commits.then(|| RawConn::open(spec));
    let mut stdout = std::io::stdout();
    writeln!(stdout, "ready").unwrap();
    stdout.flush().unwrap();
    for line in std::io::stdin().lock().lines() {
        if line.unwrap() != "go" {
            break;
        }
        if let Some(conn) = conn.as_mut() {
            conn.commit();
        }
        writeln!(stdout, "{}", micros_now()).unwrap();
        stdout.flush().unwrap();
    }
}

/// The floor of a handoff between processes, in the same shape as [`run`]: after the idle
/// pause this process commits (the release) and wakes the child through a pipe; the child
/// commits (the grant). Measured from before the first commit to after the second; with
/// `commits` false, only the pipe wake-up. What the machine itself adds to any handoff.
fn floor(spec: &str, rounds: usize, commits: bool) -> Vec<Duration> {
    let mode = if commits { "floor" } else { "wake" };
    let mut child = ChildProcess::spawn(CHILD_ENV, &format!("{mode}|{spec}"));
    let mut conn = commits.then(|| RawConn::open(spec));
    let mut pause = IdlePause(micros_now() | 1);
    let mut measured = Vec::with_capacity(rounds);
    for round in 0..rounds + 5 {
        pause.sleep();
        let started = micros_now();
        if let Some(conn) = conn.as_mut() {
            conn.commit();
        }
        child.send("go");
        let done = read_numbers(&mut child)[0];
        if round >= 5 {
            measured.push(Duration::from_micros(done.saturating_sub(started)));
        }
    }
    measured
}

fn summarize_floor(name: &str, what: &str, measured: &[Duration], out: &mut String) {
    let mut sorted = measured.to_vec();
    sorted.sort();
    let median = percentile(&sorted, 50.0);
    let p90 = percentile(&sorted, 90.0);
    let _ = writeln!(
        out,
        "{name} floor, {what}: median {}, p90 {} = {:.2}× median, p99 {}, max {}; {} over 10 ms",
        ms(median),
        ms(p90),
        p90.as_secs_f64() / median.as_secs_f64(),
        ms(percentile(&sorted, 99.0)),
        ms(*sorted.last().unwrap()),
        sorted.iter().filter(|d| **d > SLOW).count(),
    );
}

/// The numbers of the child's next line: for a handoff, (grant time in µs since the epoch,
/// acquire statements of that `lock()`, when `lock()` was called).
fn read_numbers(child: &mut ChildProcess) -> Vec<u64> {
    child
        .read_line()
        .split_whitespace()
        .map(|n| n.parse().expect("a number"))
        .collect()
}

/// A pseudo-random pause of 5 to 105 ms, the idle time before each handoff.
struct IdlePause(u64);

impl IdlePause {
    fn sleep(&mut self) {
        let seed = &mut self.0;
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        thread::sleep(Duration::from_millis(5 + *seed % 100));
    }
}

/// One handoff as measured.
struct Round {
    /// From the release call to the child's grant.
    handoff: Duration,
    /// The child's acquire statements in that `lock()`.
    acquires: u64,
    /// This process taking the key back after the child let go.
    take_back: Duration,
    /// When the release was called, from the start of the run.
    at: Duration,
    /// From the child's `lock()` call to its grant: a grant by a poll comes about a multiple
    /// of `idle_between_tries` (100 ms) after the call.
    from_call: Duration,
}

fn run(spec: &str, rounds: usize) -> Vec<Round> {
    let registry = builder(spec).build().expect("registry");
    let lock = registry.obtain(KEY).unwrap();
    let mut child = ChildProcess::spawn(CHILD_ENV, spec);
    let mut pause = IdlePause(micros_now() | 1);
    let mut measured = Vec::with_capacity(rounds);
    let started = Instant::now();
    let mut take_back = Duration::ZERO;
    // Warm-up: a few rounds whose figures are dropped (connections, listeners, watchers).
    for round in 0..rounds + 5 {
        let guard = lock.lock().unwrap();
        child.send("go");
        pause.sleep();
        let at = started.elapsed();
        let released = micros_now();
        guard.unlock().unwrap();
        let report = read_numbers(&mut child);
        let (granted, acquires, called) = (report[0], report[1], report[2]);
        if round >= 5 {
            measured.push(Round {
                handoff: Duration::from_micros(granted.saturating_sub(released)),
                acquires,
                take_back,
                at,
                from_call: Duration::from_micros(granted.saturating_sub(called)),
            });
        }
        let taking = Instant::now();
        drop(lock.lock().unwrap());
        take_back = taking.elapsed();
        // The key is released again before the next round's lock: the child's release was the
        // last statement on the row until now, as in the databases bench.
    }
    measured
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn summarize(name: &str, rounds: &[Round], out: &mut String) {
    let mut sorted: Vec<Duration> = rounds.iter().map(|r| r.handoff).collect();
    sorted.sort();
    let median = percentile(&sorted, 50.0);
    let p90 = percentile(&sorted, 90.0);
    let slow: Vec<&Round> = rounds.iter().filter(|r| r.handoff > SLOW).collect();
    let _ = writeln!(
        out,
        "{name}: {} handoffs between processes (defaults): median {}, p90 {} = {:.2}× median, \
         p99 {}, max {}; {} slower than 10 ms ({:.1} %)",
        rounds.len(),
        ms(median),
        ms(p90),
        p90.as_secs_f64() / median.as_secs_f64(),
        ms(percentile(&sorted, 99.0)),
        ms(*sorted.last().unwrap()),
        slow.len(),
        100.0 * slow.len() as f64 / rounds.len() as f64,
    );
    let _ = writeln!(
        out,
        "  p25 {} p75 {} p80 {} p95 {}",
        ms(percentile(&sorted, 25.0)),
        ms(percentile(&sorted, 75.0)),
        ms(percentile(&sorted, 80.0)),
        ms(percentile(&sorted, 95.0)),
    );
    let mut acquires = std::collections::BTreeMap::<u64, usize>::new();
    for round in rounds {
        *acquires.entry(round.acquires).or_default() += 1;
    }
    let _ = writeln!(
        out,
        "  the child's acquire statements per lock() (count: handoffs): {acquires:?}"
    );
    for count in acquires.keys() {
        let mut these: Vec<Duration> = rounds
            .iter()
            .filter(|r| r.acquires == *count)
            .map(|r| r.handoff)
            .collect();
        these.sort();
        let _ = writeln!(
            out,
            "    {count} acquires: median {}, p90 {}, max {}",
            ms(percentile(&these, 50.0)),
            ms(percentile(&these, 90.0)),
            ms(*these.last().unwrap()),
        );
    }
    let mut back: Vec<Duration> = rounds.iter().map(|r| r.take_back).collect();
    back.sort();
    let _ = writeln!(
        out,
        "  taking the key back after the child let go: median {}, p90 {}, max {}; {} over 10 ms",
        ms(percentile(&back, 50.0)),
        ms(percentile(&back, 90.0)),
        ms(*back.last().unwrap()),
        back.iter().filter(|d| **d > SLOW).count(),
    );
    let mut previous: Option<Duration> = None;
    for round in &slow {
        let since = previous.map_or("-".to_string(), |p| ms(round.at - p));
        let _ = writeln!(
            out,
            "  slow: at {:>9} handoff {:>10} acquires {} child's lock() {:>10} (since \
             previous slow {since}; take-back before it {})",
            ms(round.at),
            ms(round.handoff),
            round.acquires,
            ms(round.from_call),
            ms(round.take_back),
        );
        previous = Some(round.at);
    }
}

fn main() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        match spec.split_once('|') {
            Some(("floor", spec)) => floor_child(spec, true),
            Some(("wake", spec)) => floor_child(spec, false),
            _ => child(&spec),
        }
        return;
    }
    let rounds: usize = std::env::var("LEASEHOLD_TAILS_HANDOFFS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    let wanted = std::env::var("LEASEHOLD_TAILS_BACKENDS")
        .unwrap_or_else(|_| "sqlite,postgres,mysql".into());
    let dir = tempfile::tempdir().unwrap();
    let mut specs = Vec::new();
    if wanted.contains("sqlite") {
        let path = dir.path().join("tails.db");
        specs.push(("sqlite", format!("sqlite|{}", path.display())));
    }
    #[cfg(feature = "postgres")]
    if wanted.contains("postgres") {
        let url = env_or(
            "LEASEHOLD_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432/test",
        );
        specs.push((
            "postgres",
            format!("postgres|{}", without_tls(&url, "sslmode=disable")),
        ));
    }
    #[cfg(feature = "mysql")]
    if wanted.contains("mysql") {
        let url = env_or("LEASEHOLD_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
        specs.push((
            "mysql",
            format!("mysql|{}", without_tls(&url, "ssl-mode=DISABLED")),
        ));
    }
    let mut out = String::new();
    for (name, spec) in specs {
        if let Err(e) = builder(&spec).build() {
            eprintln!("skipping {name}: {e}");
            continue;
        }
        let measured = run(&spec, rounds);
        let mut text = String::new();
        summarize(name, &measured, &mut text);
        // The floors, right after, with the same pauses and as many rounds.
        summarize_floor(
            name,
            "commit, pipe wake-up, commit",
            &floor(&spec, rounds, true),
            &mut text,
        );
        if name == "sqlite" {
            summarize_floor(
                name,
                "pipe wake-up alone",
                &floor(&spec, rounds, false),
                &mut text,
            );
        }
        print!("{text}");
        out.push_str(&text);
    }
    let target = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tails.txt");
    let _ = std::fs::write(target, out);
}
