//! Semaphores and reader/writer locks beside the lock, in the same run on the same database.
//!
//! For every backend compiled in and answering (SQLite always; PostgreSQL and MariaDB at
//! `LEASEHOLD_POSTGRES_URL` / `LEASEHOLD_MYSQL_URL`, defaults as in the tests):
//!
//! - `lock_unlock`: an uncontended `lock()` + `unlock()` (the baseline: two statements);
//! - `permit_acquire_release`: an uncontended `acquire()` + `unlock()` of a semaphore of 4
//!   (the same two statements on a permit's row);
//! - `read_unlock`: an uncontended `read()` + `unlock()` (check, acquire, check, release);
//! - `write_unlock`: an uncontended `write()` + `unlock()` (acquire, listing, release);
//! - `permit_handoff_instances`: registry A releases the only permit of a semaphore of 1 while
//!   registry B (own pool) waits in `acquire()`: from A's `unlock()` to B's `acquire()`
//!   returning, woken by the backend's release wake-ups.
//! - `lock_handoff_processes` (the baseline of the next two): this process releases a lock
//!   while another OS process (this binary, re-spawned as a child) waits in `lock()` on it:
//!   from the `unlock()` call to the child's grant, as `benches/databases.rs` measures it;
//! - `permit_handoff_processes`: the same for the only permit of a semaphore of 1 (the child
//!   waits in `acquire()`);
//! - `write_handoff_processes`: the same for the write side of a reader/writer lock (the child
//!   waits in `write()`; after the write row it lists the read slots once).
//!
//! Before each handoff the holder waits 5 to 105 ms (pseudo-random), so that the release comes
//! at any point of the waiter's poll cycle. The two processes read the same system clock.
//!
//! `cargo bench --all-features --bench semaphore`.

#[path = "common/child.rs"]
mod child;

use child::ChildProcess;
use criterion::Criterion;
use leasehold::{LockRegistry, RegistryBuilder};
use std::io::{BufRead, Write};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Set in the child process: the target it connects to (see [`Target::encode`]).
const CHILD_ENV: &str = "LEASEHOLD_SEMAPHORE_BENCH_CHILD";

/// Where the registries of a backend live; passed to the child process as text.
#[derive(Clone, Debug)]
enum Target {
    Sqlite(String),
    #[cfg(feature = "postgres")]
    Postgres(String, String),
    #[cfg(feature = "mysql")]
    Mysql(String, String),
}

impl Target {
    fn encode(&self) -> String {
        match self {
            Target::Sqlite(path) => format!("sqlite|{path}"),
            #[cfg(feature = "postgres")]
            Target::Postgres(url, prefix) => format!("postgres|{prefix}|{url}"),
            #[cfg(feature = "mysql")]
            Target::Mysql(url, prefix) => format!("mysql|{prefix}|{url}"),
        }
    }

    fn decode(text: &str) -> Target {
        let (kind, rest) = text.split_once('|').expect("kind|location");
        match kind {
            "sqlite" => Target::Sqlite(rest.into()),
            #[cfg(feature = "postgres")]
            "postgres" => {
                let (prefix, url) = rest.split_once('|').expect("prefix|url");
                Target::Postgres(url.into(), prefix.into())
            }
            #[cfg(feature = "mysql")]
            "mysql" => {
                let (prefix, url) = rest.split_once('|').expect("prefix|url");
                Target::Mysql(url.into(), prefix.into())
            }
            other => panic!("unknown target {other}"),
        }
    }

    fn builder(&self) -> RegistryBuilder {
        match self {
            Target::Sqlite(path) => LockRegistry::sqlite(path),
            #[cfg(feature = "postgres")]
            Target::Postgres(url, prefix) => {
                LockRegistry::postgres(url.clone()).prefix(prefix.clone())
            }
            #[cfg(feature = "mysql")]
            Target::Mysql(url, prefix) => LockRegistry::mysql(url.clone()).prefix(prefix.clone()),
        }
    }
}

/// What is handed over between the processes.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Lock,
    Permit,
    Write,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Lock => "lock",
            Kind::Permit => "permit",
            Kind::Write => "write",
        }
    }
}

const PROCESS_KEY: &str = "bench-process-handoff";

/// Takes `kind` of [`PROCESS_KEY`] in `registry`, waiting as long as it takes; returns a
/// closure that releases it.
fn take(registry: &LockRegistry, kind: Kind) -> Box<dyn FnOnce()> {
    match kind {
        Kind::Lock => {
            let guard = registry.obtain(PROCESS_KEY).unwrap().lock().unwrap();
            Box::new(move || guard.unlock().unwrap())
        }
        Kind::Permit => {
            let semaphore = registry.semaphore(PROCESS_KEY, 1).unwrap();
            let permit = semaphore.acquire().unwrap();
            Box::new(move || permit.unlock().unwrap())
        }
        Kind::Write => {
            let guard = registry.rw_lock(PROCESS_KEY).unwrap().write().unwrap();
            Box::new(move || guard.unlock().unwrap())
        }
    }
}

fn micros_now() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

/// Child mode: for each line naming a kind, take it, print when it was granted (µs since the
/// epoch), release it.
fn child(target: &Target) {
    let registry = target.builder().build().expect("child registry");
    let mut stdout = std::io::stdout();
    writeln!(stdout, "ready").unwrap();
    stdout.flush().unwrap();
    for line in std::io::stdin().lock().lines() {
        let kind = match line.unwrap().as_str() {
            "lock" => Kind::Lock,
            "permit" => Kind::Permit,
            "write" => Kind::Write,
            _ => break,
        };
        let release = take(&registry, kind);
        let granted = micros_now();
        release();
        writeln!(stdout, "{granted}").unwrap();
        stdout.flush().unwrap();
    }
}

/// The child process of one backend, waiting for what it is told to take.
struct ProcessWaiter(ChildProcess);

impl ProcessWaiter {
    fn new(target: &Target) -> Self {
        ProcessWaiter(ChildProcess::spawn(CHILD_ENV, &target.encode()))
    }

    fn start(&mut self, kind: Kind) {
        self.0.send(kind.name());
    }

    fn granted(&mut self) -> u128 {
        self.0.read_line().parse().expect("grant time")
    }
}

/// `iterations` handoffs of `kind` from `holder` to the child; the sum of (grant − release
/// call).
fn process_handoffs(
    holder: &LockRegistry,
    waiter: &mut ProcessWaiter,
    kind: Kind,
    iterations: u64,
) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iterations {
        let release = take(holder, kind);
        waiter.start(kind);
        // Let the child find it held and wait, then release at any point of its poll cycle.
        thread::sleep(Duration::from_millis(5 + rand_ms()));
        let released = micros_now();
        release();
        let granted = waiter.granted();
        total += Duration::from_micros(granted.saturating_sub(released) as u64);
    }
    total
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
fn prefix() -> String {
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros();
    format!("bench_sem_{}_{stamp}_", std::process::id())
}

fn bench_backend(c: &mut Criterion, name: &str, target: &Target) {
    let builder = || target.builder();
    let Ok(registry) = builder().create_table(true).build() else {
        eprintln!("{name}: not answering, skipped");
        return;
    };
    let mut group = c.benchmark_group(name);
    group.sample_size(20);
    let lock = registry.obtain("bench-lock").unwrap();
    group.bench_function("lock_unlock", |b| {
        b.iter(|| lock.lock().unwrap().unlock().unwrap())
    });
    let semaphore = registry.semaphore("bench-semaphore", 4).unwrap();
    group.bench_function("permit_acquire_release", |b| {
        b.iter(|| semaphore.acquire().unwrap().unlock().unwrap())
    });
    let rw = registry.rw_lock("bench-rw").unwrap();
    group.bench_function("read_unlock", |b| {
        b.iter(|| rw.read().unwrap().unlock().unwrap())
    });
    group.bench_function("write_unlock", |b| {
        b.iter(|| rw.write().unwrap().unlock().unwrap())
    });

    let waiter = builder().build().unwrap();
    group.sample_size(10);
    group.bench_function("permit_handoff_instances", |b| {
        b.iter_custom(|rounds| {
            let mut total = Duration::ZERO;
            for _ in 0..rounds {
                let held = registry
                    .semaphore("bench-handoff", 1)
                    .unwrap()
                    .acquire()
                    .unwrap();
                let waiting = waiter.semaphore("bench-handoff", 1).unwrap();
                let (granted, got) = mpsc::channel();
                let (started, ready) = mpsc::channel();
                let thread = thread::spawn(move || {
                    started.send(()).unwrap();
                    let permit = waiting.acquire().unwrap();
                    granted.send(Instant::now()).unwrap();
                    permit.unlock().unwrap();
                });
                ready.recv().unwrap();
                // Let the waiter find the permit held and go to sleep between polls.
                thread::sleep(Duration::from_millis(5 + rand_ms()));
                let released = Instant::now();
                held.unlock().unwrap();
                total += got.recv().unwrap().duration_since(released);
                thread.join().unwrap();
            }
            total
        })
    });
    let mut waiter = ProcessWaiter::new(target);
    for (bench, kind) in [
        ("lock_handoff_processes", Kind::Lock),
        ("permit_handoff_processes", Kind::Permit),
        ("write_handoff_processes", Kind::Write),
    ] {
        group.bench_function(bench, |b| {
            b.iter_custom(|n| process_handoffs(&registry, &mut waiter, kind, n))
        });
    }
    group.finish();
}

/// 0–99 ms, so that a handoff does not land on the same phase of the poll interval each time.
fn rand_ms() -> u64 {
    u64::from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
            % 100,
    )
}

fn main() {
    if let Ok(target) = std::env::var(CHILD_ENV) {
        child(&Target::decode(&target));
        return;
    }
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.db");
    let sqlite = Target::Sqlite(path.to_string_lossy().into_owned());
    bench_backend(&mut c, "sqlite", &sqlite);
    #[cfg(feature = "postgres")]
    {
        let url = std::env::var("LEASEHOLD_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        let prefix = prefix();
        let target = Target::Postgres(url.clone(), prefix.clone());
        bench_backend(&mut c, "postgres", &target);
        drop_tables_postgres(&url, &prefix);
    }
    #[cfg(feature = "mysql")]
    {
        let url = std::env::var("LEASEHOLD_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
        let prefix = prefix();
        let target = Target::Mysql(url.clone(), prefix.clone());
        bench_backend(&mut c, "mysql", &target);
        drop_tables_mysql(&url, &prefix);
    }
    c.final_summary();
}

#[cfg(feature = "postgres")]
fn drop_tables_postgres(url: &str, prefix: &str) {
    if let Ok(mut client) = postgres::Client::connect(url, postgres::NoTls) {
        let _ = client.batch_execute(&format!(
            "DROP TABLE IF EXISTS {prefix}LOCK CASCADE; DROP TABLE IF EXISTS {prefix}LOCK_FLOOR \
             CASCADE; DROP TABLE IF EXISTS {prefix}LOCK_SEM; DROP FUNCTION IF EXISTS \
             {prefix}LOCK_FLOOR() CASCADE"
        ));
    }
}

#[cfg(feature = "mysql")]
fn drop_tables_mysql(url: &str, prefix: &str) {
    use mysql::prelude::Queryable;
    if let Ok(mut conn) = mysql::Conn::new(mysql::Opts::from_url(url).unwrap()) {
        let _ = conn.query_drop(format!(
            "DROP TABLE IF EXISTS {prefix}LOCK, {prefix}LOCK_FLOOR, {prefix}LOCK_SEM"
        ));
    }
}
