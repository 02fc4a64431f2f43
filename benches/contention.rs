//! Contended throughput: two instances × four threads each on four keys, every
//! thread taking a random key, running an empty critical section and letting go, as fast as
//! it can. Each figure is the time per critical section (lower is better), next to baselines
//! measured in the same run on the same server with the same harness:
//!
//! - `leasehold`: two registries with default settings (an instance is a registry: its own
//!   pools, client id and listener; one process keeps the harness simple and the figures
//!   comparable, at the price of sharing the process's lease clock);
//! - `leasehold_linger_2ms`, `leasehold_linger_1ms`: the same with shorter lingers than the
//!   default 5 ms;
//! - `leasehold_without_linger`: the same with `Tuning::linger` zero (every release nobody
//!   here queues on runs its statement at once);
//! - `leasehold_without_turns`: the same with `Tuning::turn_limit` `None`
//!   (no fair turns: what the fairness for polling instances costs);
//! - `raw_row`: a bare lease row per key — `UPDATE … SET holder, expires = now + 30 s WHERE
//!   key AND expires < now` to take it (one row affected: held), the same `UPDATE` setting
//!   `expires` back to the past to let go, one connection per thread, a refused thread
//!   sleeping 10 ms before it tries again; the same durability as the registry's statements
//!   (on PostgreSQL the release commits without a disk sync, as leasehold's does;
//!   `common/raw_row.rs`, shared with `benches/throughput.rs`);
//! - `native` (PostgreSQL, MySQL): the server's own lock, no table — `pg_advisory_lock` /
//!   `pg_advisory_unlock`, `GET_LOCK(name, 3600)` / `RELEASE_LOCK`, one session per thread.
//!
//! An outside witness per key (an atomic flag) checks that no two sections overlap; the bench
//! panics if one does.
//!
//! `cargo bench --all-features --bench contention`; the README's contention table lists the
//! medians of one run as ratios to the raw row. PostgreSQL and MariaDB at
//! `LEASEHOLD_POSTGRES_URL` / `LEASEHOLD_MYSQL_URL` (defaults as in the tests) are skipped if
//! they do not answer.

#[path = "common/raw_row.rs"]
mod raw_row;

use criterion::Criterion;
use leasehold::LockRegistry;
use raw_row::RawRow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const INSTANCES: usize = 2;
const THREADS: usize = 4;
const KEYS: usize = 4;

/// One thread's way of running a critical section on key `k`.
type Section = Box<dyn FnMut(usize, &Witness) + Send>;
/// One section per thread of both instances.
type Threads = Vec<Mutex<Section>>;

/// One flag per key: set while someone is inside its critical section.
struct Witness([AtomicBool; KEYS]);

impl Witness {
    fn new() -> Self {
        Witness(std::array::from_fn(|_| AtomicBool::new(false)))
    }

    fn inside(&self, k: usize) {
        assert!(
            !self.0[k].swap(true, Ordering::SeqCst),
            "two holders of key {k} at once"
        );
        self.0[k].store(false, Ordering::SeqCst);
    }
}

/// Runs `sections` critical sections over all threads; returns the elapsed time.
fn contend(threads: &[Mutex<Section>], witness: &Witness, sections: u64) -> Duration {
    let left = AtomicU64::new(sections);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for (n, section) in threads.iter().enumerate() {
            let left = &left;
            scope.spawn(move || {
                let mut section = section.lock().unwrap();
                let mut state = 0x9E37_79B9_7F4A_7C15_u64 ^ (n as u64 + 1);
                while left
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                    .is_ok()
                {
                    // xorshift: a random key per section.
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    section((state % KEYS as u64) as usize, witness);
                }
            });
        }
    });
    started.elapsed()
}

fn bench(c: &mut Criterion, name: &str, threads: &[Mutex<Section>]) {
    let witness = Witness::new();
    c.bench_function(name, |b| {
        b.iter_custom(|sections| contend(threads, &witness, sections))
    });
}

/// Two registries, four threads each, each thread with handles on every key: benched as
/// `name`, then the registries' statements per critical section are printed.
fn bench_leasehold(
    c: &mut Criterion,
    name: &str,
    builder: impl Fn() -> leasehold::RegistryBuilder,
) {
    let registries: Vec<LockRegistry> = (0..INSTANCES)
        .map(|_| builder().build().expect("registry"))
        .collect();
    let mut threads = Vec::new();
    for registry in &registries {
        for _ in 0..THREADS {
            let locks: Vec<_> = (0..KEYS)
                .map(|k| registry.obtain(&format!("contended-{k}")).unwrap())
                .collect();
            let section: Section = Box::new(move |k, witness| {
                let guard = locks[k].lock().expect("granted");
                witness.inside(k);
                guard.unlock().expect("released");
            });
            threads.push(Mutex::new(section));
        }
    }
    bench(c, name, &threads);
    let stats: Vec<_> = registries.iter().map(LockRegistry::statistics).collect();
    let sum = |f: fn(&leasehold::Statistics) -> u64| stats.iter().map(f).sum::<u64>();
    let sections = (sum(|s| s.grants) + sum(|s| s.local_handoffs)) as f64;
    if sections == 0.0 {
        return; // filtered out
    }
    let shares: Vec<String> = stats
        .iter()
        .map(|s| {
            let mine = (s.grants + s.local_handoffs) as f64;
            format!("{:.0} %", 100.0 * mine / sections)
        })
        .collect();
    println!(
        "{name}: per critical section {:.2} acquire statements ({:.2} refused), {:.2} grants, \
         {:.2} local handoffs (re-takes from a linger included), {:.2} releases; sections per \
         instance {}",
        sum(|s| s.acquires) as f64 / sections,
        sum(|s| s.contended_tries) as f64 / sections,
        sum(|s| s.grants) as f64 / sections,
        sum(|s| s.local_handoffs) as f64 / sections,
        sum(|s| s.releases) as f64 / sections,
        shares.join(" / "),
    );
}

fn with_linger(builder: leasehold::RegistryBuilder, millis: u64) -> leasehold::RegistryBuilder {
    builder.create_table(true).tuning(leasehold::Tuning {
        linger: Duration::from_millis(millis),
        ..Default::default()
    })
}

fn without_turns(builder: leasehold::RegistryBuilder) -> leasehold::RegistryBuilder {
    builder.create_table(true).tuning(leasehold::Tuning {
        turn_limit: None,
        ..Default::default()
    })
}

/// The bare lease rows of `spec` (see `common/raw_row.rs`), one connection per thread, or why
/// the server cannot be used.
fn raw_threads(spec: &str) -> Result<Threads, String> {
    RawRow::setup(spec, KEYS)?;
    Ok((0..INSTANCES * THREADS)
        .map(|n| {
            let mut row = RawRow::connect(spec);
            let me = format!("thread-{n}");
            let section: Section = Box::new(move |k, witness| {
                row.lock(&me, k);
                witness.inside(k);
                row.unlock(&me, k);
            });
            Mutex::new(section)
        })
        .collect())
}

#[cfg(feature = "postgres")]
fn postgres_threads(url: &str) -> Option<(Threads, Threads)> {
    let connect = || postgres::Client::connect(url, postgres::NoTls);
    let raw = match raw_threads(&format!("postgres|{url}")) {
        Ok(raw) => raw,
        Err(e) => {
            eprintln!("skipping PostgreSQL: {e}");
            return None;
        }
    };
    let native = (0..INSTANCES * THREADS)
        .map(|_| {
            let mut client = connect().unwrap();
            let lock = client.prepare("SELECT pg_advisory_lock($1)").unwrap();
            let unlock = client.prepare("SELECT pg_advisory_unlock($1)").unwrap();
            let section: Section = Box::new(move |k, witness| {
                let k = 7_000_000 + k as i64;
                client.execute(&lock, &[&k]).unwrap();
                witness.inside((k - 7_000_000) as usize);
                client.execute(&unlock, &[&k]).unwrap();
            });
            Mutex::new(section)
        })
        .collect();
    Some((raw, native))
}

#[cfg(feature = "mysql")]
fn mysql_threads(url: &str) -> Option<(Threads, Threads)> {
    use mysql::prelude::Queryable;
    let connect = || {
        mysql::Opts::from_url(url)
            .map_err(mysql::Error::from)
            .and_then(mysql::Conn::new)
    };
    let raw = match raw_threads(&format!("mysql|{url}")) {
        Ok(raw) => raw,
        Err(e) => {
            eprintln!("skipping MariaDB: {e}");
            return None;
        }
    };
    let native = (0..INSTANCES * THREADS)
        .map(|_| {
            let mut conn = connect().unwrap();
            let section: Section = Box::new(move |k, witness| {
                let name = format!("bench-contended-{k}");
                let got: Option<i64> = conn
                    .exec_first("SELECT GET_LOCK(?, 3600)", (&name,))
                    .unwrap()
                    .flatten();
                assert_eq!(got, Some(1));
                witness.inside(k);
                conn.exec_drop("SELECT RELEASE_LOCK(?)", (&name,)).unwrap();
            });
            Mutex::new(section)
        })
        .collect();
    Some((raw, native))
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.into())
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(10))
        .configure_from_args();

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("contention.db");
    bench_leasehold(&mut c, "sqlite/leasehold", || {
        LockRegistry::sqlite(&path).create_table(true)
    });
    bench_leasehold(&mut c, "sqlite/leasehold_linger_2ms", || {
        with_linger(LockRegistry::sqlite(&path), 2)
    });
    bench_leasehold(&mut c, "sqlite/leasehold_linger_1ms", || {
        with_linger(LockRegistry::sqlite(&path), 1)
    });
    bench_leasehold(&mut c, "sqlite/leasehold_without_linger", || {
        with_linger(LockRegistry::sqlite(&path), 0)
    });
    bench_leasehold(&mut c, "sqlite/leasehold_without_turns", || {
        without_turns(LockRegistry::sqlite(&path))
    });
    bench(
        &mut c,
        "sqlite/raw_row",
        &raw_threads(&format!("sqlite|{}", path.display())).unwrap(),
    );

    #[cfg(feature = "postgres")]
    {
        let url = env_or(
            "LEASEHOLD_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432/test",
        );
        if let Some((raw, native)) = postgres_threads(&url) {
            bench_leasehold(&mut c, "postgres/leasehold", || {
                LockRegistry::postgres(url.clone())
                    .prefix("BENCH_")
                    .create_table(true)
            });
            bench_leasehold(&mut c, "postgres/leasehold_linger_2ms", || {
                with_linger(LockRegistry::postgres(url.clone()).prefix("BENCH_"), 2)
            });
            bench_leasehold(&mut c, "postgres/leasehold_linger_1ms", || {
                with_linger(LockRegistry::postgres(url.clone()).prefix("BENCH_"), 1)
            });
            bench_leasehold(&mut c, "postgres/leasehold_without_linger", || {
                with_linger(LockRegistry::postgres(url.clone()).prefix("BENCH_"), 0)
            });
            bench_leasehold(&mut c, "postgres/leasehold_without_turns", || {
                without_turns(LockRegistry::postgres(url.clone()).prefix("BENCH_"))
            });
            bench(&mut c, "postgres/raw_row", &raw);
            bench(&mut c, "postgres/native", &native);
        }
    }

    #[cfg(feature = "mysql")]
    {
        let url = env_or("LEASEHOLD_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
        if let Some((raw, native)) = mysql_threads(&url) {
            bench_leasehold(&mut c, "mysql/leasehold", || {
                LockRegistry::mysql(url.clone())
                    .prefix("BENCH_")
                    .create_table(true)
            });
            bench_leasehold(&mut c, "mysql/leasehold_linger_2ms", || {
                with_linger(LockRegistry::mysql(url.clone()).prefix("BENCH_"), 2)
            });
            bench_leasehold(&mut c, "mysql/leasehold_linger_1ms", || {
                with_linger(LockRegistry::mysql(url.clone()).prefix("BENCH_"), 1)
            });
            bench_leasehold(&mut c, "mysql/leasehold_without_linger", || {
                with_linger(LockRegistry::mysql(url.clone()).prefix("BENCH_"), 0)
            });
            bench_leasehold(&mut c, "mysql/leasehold_without_turns", || {
                without_turns(LockRegistry::mysql(url.clone()).prefix("BENCH_"))
            });
            bench(&mut c, "mysql/raw_row", &raw);
            bench(&mut c, "mysql/native", &native);
        }
    }

    c.final_summary();
}
