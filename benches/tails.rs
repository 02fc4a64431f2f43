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
//! The floors, in the same shape (the same idle pause, then a commit by this process, a
//! wake-up of the child, a commit by the child), each measured as many times:
//!
//! - *own statements*: the registry's release statement, a pipe wake-up, its acquire statement
//!   (granted), on raw driver connections ([`RawLease`]): what a handoff of this lock row
//!   costs with nothing of the registry around it — the baseline of the handoff's target;
//! - *commit*: a one-integer `UPDATE` on each side instead, what the machine costs for any
//!   durable handoff;
//! - *commit, read*: the `UPDATE` on this side, a read of that row on the child's: the floor of
//!   a handoff in one commit, whose release grants the next holder, which then only has to
//!   read its grant;
//! - SQLite: the pipe wake-up alone; MySQL and MariaDB: two such commits with the server's own
//!   wake-up between them (the child blocks in `GET_LOCK` on a name this process lets go right
//!   after its commit), the primitive the registry's wake-ups stand on.
//!
//! The handoffs and the floors run in alternating blocks of [`BLOCK`] rounds, so that drift of
//! a loaded machine falls on all of them alike.
//!
//! `LEASEHOLD_TAILS_HANDOFFS` sets the rounds per backend and per floor (default 200, about
//! a minute per backend in all);
//! `LEASEHOLD_TAILS_BACKENDS` (a comma-separated subset of `sqlite,postgres,mysql`) which run.
//! The servers are found as for the tests (`LEASEHOLD_POSTGRES_URL`, `LEASEHOLD_MYSQL_URL`).
//! The summary is also written to `target/tails.txt`.

#[path = "common/child.rs"]
mod child;
#[path = "common/raw_lease.rs"]
mod raw_lease;
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[path = "common/urls.rs"]
mod urls;

use child::ChildProcess;
use leasehold::{LockRegistry, RegistryBuilder};
use raw_lease::RawLease;
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

    /// Reads the row the commits change, without writing: what a holder that was granted the
    /// key by its predecessor's commit needs to learn it (its token and time left).
    fn read(&mut self) {
        const SELECT: &str = "SELECT n FROM bench_tails_commit WHERE id = 1";
        match self {
            RawConn::Sqlite(conn) => {
                let _: i64 = conn
                    .prepare_cached(SELECT)
                    .unwrap()
                    .query_row([], |row| row.get(0))
                    .unwrap();
            }
            #[cfg(feature = "postgres")]
            RawConn::Postgres(client) => {
                client.query_one(SELECT, &[]).unwrap();
            }
            #[cfg(feature = "mysql")]
            RawConn::Mysql(conn) => {
                use mysql::prelude::Queryable;
                let _: Option<i64> = conn.exec_first(SELECT, ()).unwrap();
            }
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

/// How the floor's child hears that the release committed.
#[derive(Clone, Copy, PartialEq)]
enum FloorWake {
    /// A line through a pipe; the commits are the registry's own release and acquire
    /// statements on raw connections ([`RawLease`]).
    OwnStatements,
    /// A line through a pipe; the commits are a one-integer `UPDATE` each.
    Pipe,
    /// A line through a pipe, and nothing else: a bare wake-up of an idle process.
    PipeAlone,
    /// A line through a pipe after a one-integer `UPDATE`; the child then reads that row
    /// instead of committing: the floor of a handoff in one commit, where the release grants
    /// the next holder and the wake-up tells it so.
    PipeThenRead,
    /// The server's own wake-up (MySQL, MariaDB): the child blocks in `GET_LOCK` on a name
    /// that this process lets go right after its commit, then commits.
    NamedLock,
}

impl FloorWake {
    fn mode(self) -> &'static str {
        match self {
            FloorWake::OwnStatements => "own",
            FloorWake::Pipe => "floor",
            FloorWake::PipeAlone => "wake",
            FloorWake::PipeThenRead => "read",
            FloorWake::NamedLock => "named",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            FloorWake::OwnStatements => "own release, pipe wake-up, own acquire",
            FloorWake::Pipe => "commit, pipe wake-up, commit",
            FloorWake::PipeAlone => "pipe wake-up alone",
            FloorWake::PipeThenRead => "commit, pipe wake-up, read",
            FloorWake::NamedLock => "commit, RELEASE_LOCK wakes a GET_LOCK, commit",
        }
    }
}

/// The name the named-lock floor passes between its two processes.
#[cfg(feature = "mysql")]
const FLOOR_NAME: &str = "leasehold_bench_tails_floor";

/// The key of the own-statements floor.
const FLOOR_KEY: &str = "bench-tails-floor";

/// The raw lease of the own-statements floor, on the statements of a registry as [`run`]'s.
fn floor_lease(spec: &str) -> RawLease {
    let registry = builder(spec).build().expect("registry");
    RawLease::open(spec, registry.statements())
}

/// Floor child mode: for each `go`, wait as `wake` says, commit (read with `PipeThenRead`,
/// nothing with `PipeAlone`) and print when that was done. With `OwnStatements` the commit is a grant of the floor's key,
/// which it then releases (untimed) and says `ok`.
fn floor_child(spec: &str, wake: FloorWake) {
    let own = wake == FloorWake::OwnStatements;
    let mut lease = own.then(|| floor_lease(spec));
    let mut conn = (wake != FloorWake::PipeAlone && !own).then(|| RawConn::open(spec));
    #[cfg(feature = "mysql")]
    let mut named = (wake == FloorWake::NamedLock).then(|| named_conn(spec));
    let mut stdout = std::io::stdout();
    writeln!(stdout, "ready").unwrap();
    stdout.flush().unwrap();
    for line in std::io::stdin().lock().lines() {
        if line.unwrap() != "go" {
            break;
        }
        #[cfg(feature = "mysql")]
        if let Some(named) = named.as_mut() {
            use mysql::prelude::Queryable;
            let got: Option<i64> = named
                .exec_first("SELECT GET_LOCK(?, 60)", (FLOOR_NAME,))
                .unwrap();
            assert_eq!(got, Some(1));
        }
        if let Some(conn) = conn.as_mut() {
            match wake {
                FloorWake::PipeThenRead => conn.read(),
                _ => conn.commit(),
            }
        }
        let granted = lease
            .as_mut()
            .map(|lease| lease.acquire(FLOOR_KEY).expect("free"));
        writeln!(stdout, "{}", micros_now()).unwrap();
        stdout.flush().unwrap();
        if let (Some(lease), Some(token)) = (lease.as_mut(), granted) {
            lease.release(FLOOR_KEY, token);
            writeln!(stdout, "ok").unwrap();
            stdout.flush().unwrap();
        }
        #[cfg(feature = "mysql")]
        if let Some(named) = named.as_mut() {
            use mysql::prelude::Queryable;
            named
                .exec_drop("SELECT RELEASE_LOCK(?)", (FLOOR_NAME,))
                .unwrap();
        }
    }
}

/// A raw MySQL connection for the named-lock floor.
#[cfg(feature = "mysql")]
fn named_conn(spec: &str) -> mysql::Conn {
    let (_, location) = spec.split_once('|').expect("kind|location");
    let url = location.split('?').next().unwrap_or(location);
    mysql::Conn::new(mysql::Opts::from_url(url).unwrap()).unwrap()
}

/// The floor of a handoff between processes, in the same shape as [`Handoffs`]: this process
/// tells the child to wait, and after the idle pause commits (the release) and wakes the
/// child; the child commits (the grant). Measured from before the first commit to after the
/// second. What the machine (and, for `NamedLock`, the server's wake-up) adds to any handoff.
struct Floor {
    wake: FloorWake,
    child: ChildProcess,
    conn: Option<RawConn>,
    lease: Option<RawLease>,
    #[cfg(feature = "mysql")]
    named: Option<mysql::Conn>,
}

impl Floor {
    fn start(spec: &str, wake: FloorWake) -> Floor {
        let child = ChildProcess::spawn(CHILD_ENV, &format!("{}|{spec}", wake.mode()));
        let own = wake == FloorWake::OwnStatements;
        Floor {
            wake,
            child,
            conn: (wake != FloorWake::PipeAlone && !own).then(|| RawConn::open(spec)),
            lease: own.then(|| floor_lease(spec)),
            #[cfg(feature = "mysql")]
            named: (wake == FloorWake::NamedLock).then(|| named_conn(spec)),
        }
    }

    fn round(&mut self, pause: &mut IdlePause) -> Duration {
        // The child let go of the floor's key at the end of the previous round.
        let token = self
            .lease
            .as_mut()
            .map(|lease| lease.acquire(FLOOR_KEY).expect("free"));
        #[cfg(feature = "mysql")]
        if let Some(named) = self.named.as_mut() {
            use mysql::prelude::Queryable;
            // The child let go of the name at the end of the previous round.
            let got: Option<i64> = named
                .exec_first("SELECT GET_LOCK(?, 60)", (FLOOR_NAME,))
                .unwrap();
            assert_eq!(got, Some(1));
        }
        if self.wake == FloorWake::NamedLock {
            // The child blocks in its `GET_LOCK` during the pause, as a waiter in `lock()`.
            self.child.send("go");
        }
        pause.sleep();
        let started = micros_now();
        if let Some(conn) = self.conn.as_mut() {
            conn.commit();
        }
        if let (Some(lease), Some(token)) = (self.lease.as_mut(), token) {
            lease.release(FLOOR_KEY, token);
        }
        #[cfg(feature = "mysql")]
        if let Some(named) = self.named.as_mut() {
            use mysql::prelude::Queryable;
            named
                .exec_drop("SELECT RELEASE_LOCK(?)", (FLOOR_NAME,))
                .unwrap();
        }
        if self.wake != FloorWake::NamedLock {
            self.child.send("go");
        }
        let done = read_numbers(&mut self.child)[0];
        if token.is_some() {
            assert_eq!(self.child.read_line(), "ok");
        }
        Duration::from_micros(done.saturating_sub(started))
    }
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

/// The handoffs with the registry's defaults (see the module docs).
struct Handoffs {
    // Kept for `lock`, which is its handle.
    _registry: LockRegistry,
    lock: leasehold::Lock,
    child: ChildProcess,
    started: Instant,
    /// The previous round's take-back, reported with the next round.
    take_back: Duration,
}

impl Handoffs {
    fn start(spec: &str) -> Handoffs {
        let registry = builder(spec).build().expect("registry");
        Handoffs {
            lock: registry.obtain(KEY).unwrap(),
            _registry: registry,
            child: ChildProcess::spawn(CHILD_ENV, spec),
            started: Instant::now(),
            take_back: Duration::ZERO,
        }
    }

    fn round(&mut self, pause: &mut IdlePause) -> Round {
        let lock = &self.lock;
        let guard = lock.lock().unwrap();
        self.child.send("go");
        pause.sleep();
        let at = self.started.elapsed();
        let released = micros_now();
        guard.unlock().unwrap();
        let report = read_numbers(&mut self.child);
        let (granted, acquires, called) = (report[0], report[1], report[2]);
        let round = Round {
            handoff: Duration::from_micros(granted.saturating_sub(released)),
            acquires,
            take_back: self.take_back,
            at,
            from_call: Duration::from_micros(granted.saturating_sub(called)),
        };
        let taking = Instant::now();
        drop(lock.lock().unwrap());
        self.take_back = taking.elapsed();
        // The key is released again before the next round's lock: the child's release was the
        // last statement on the row until now, as in the databases bench.
        round
    }
}

/// Rounds of each kind measured in a row before the next kind's.
const BLOCK: usize = 10;

/// Runs `rounds` handoffs and as many rounds of each floor, in alternating blocks of
/// [`BLOCK`], so that all of them meet the same conditions of the machine; a few rounds of
/// each first, whose figures are dropped (connections, listeners, watchers).
fn run(spec: &str, rounds: usize, floors: &[FloorWake]) -> (Vec<Round>, Vec<Vec<Duration>>) {
    let mut handoffs = Handoffs::start(spec);
    let mut floors: Vec<Floor> = floors
        .iter()
        .map(|wake| Floor::start(spec, *wake))
        .collect();
    let mut pause = IdlePause(micros_now() | 1);
    for _ in 0..5 {
        handoffs.round(&mut pause);
        for floor in &mut floors {
            floor.round(&mut pause);
        }
    }
    let mut measured = Vec::with_capacity(rounds);
    let mut floor_measured = vec![Vec::with_capacity(rounds); floors.len()];
    while measured.len() < rounds {
        let block = BLOCK.min(rounds - measured.len());
        for _ in 0..block {
            measured.push(handoffs.round(&mut pause));
        }
        for (floor, times) in floors.iter_mut().zip(&mut floor_measured) {
            for _ in 0..block {
                times.push(floor.round(&mut pause));
            }
        }
    }
    (measured, floor_measured)
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
            Some(("own", spec)) => floor_child(spec, FloorWake::OwnStatements),
            Some(("floor", spec)) => floor_child(spec, FloorWake::Pipe),
            Some(("wake", spec)) => floor_child(spec, FloorWake::PipeAlone),
            Some(("read", spec)) => floor_child(spec, FloorWake::PipeThenRead),
            Some(("named", spec)) => floor_child(spec, FloorWake::NamedLock),
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
        let mut wakes = vec![
            FloorWake::OwnStatements,
            FloorWake::Pipe,
            FloorWake::PipeThenRead,
        ];
        match name {
            "sqlite" => wakes.push(FloorWake::PipeAlone),
            "mysql" => wakes.push(FloorWake::NamedLock),
            _ => {}
        }
        let (measured, floors) = run(&spec, rounds, &wakes);
        let mut text = String::new();
        summarize(name, &measured, &mut text);
        for (wake, times) in wakes.iter().zip(&floors) {
            summarize_floor(name, wake.describe(), times, &mut text);
        }
        print!("{text}");
        out.push_str(&text);
    }
    let target = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tails.txt");
    let _ = std::fs::write(target, out);
}
