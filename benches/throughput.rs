//! Contended throughput between processes, over runs of many turns: two processes × four
//! threads on four keys, every thread running an empty critical section and letting go, as
//! fast as it can, for [`SECONDS`] seconds. Each process is one instance: one registry
//! (default settings) or, for the baseline, a bare lease row per key with one connection per
//! thread, a refused thread trying again after 10 ms (`common/raw_row.rs`). Two shapes:
//!
//! - *shared keys*: each section on a random key, so the threads of a process share every key
//!   (most of leasehold's sections are local handoffs within a turn);
//! - *a key per thread*: thread *n* of each process always takes key *n*, so each key has one
//!   thread in each process and every section of leasehold's is a database grant.
//!
//! The registry and the raw row alternate, round after round, so that drift of the machine
//! falls on both alike. `benches/contention.rs` measures the shared-keys shape inside one
//! process with criterion's samples; this bench runs each round long enough to hold dozens of
//! turn ends per key, and reports, per round and per process: critical sections a second,
//! database grants, and the longest single wait for a key (from the call to the grant).
//!
//! An outside witness checks that no two sections of one key overlap: each thread holds a
//! `flock` on the key's file (a descriptor of its own) while inside, taken without waiting; a
//! refusal means another holder is inside and fails the bench.
//!
//! `cargo bench --all-features --bench throughput`; `LEASEHOLD_THROUGHPUT_ROUNDS` (3),
//! `LEASEHOLD_THROUGHPUT_SECONDS` (10) and `LEASEHOLD_THROUGHPUT_BACKENDS` (a comma-separated
//! subset of `sqlite,postgres,mysql`). The servers as for the tests; one that does not answer is
//! skipped. A summary goes to `target/throughput.txt` for `benches/report`.

#[path = "common/child.rs"]
mod child;
#[path = "common/raw_row.rs"]
mod raw_row;
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[path = "common/urls.rs"]
mod urls;

use child::ChildProcess;
use raw_row::RawRow;
use std::fs::File;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const PROCESSES: usize = 2;
const THREADS: usize = 4;
const KEYS: usize = 4;
const ROUNDS: usize = 3;
const SECONDS: u64 = 10;
/// The environment variable that makes this binary a child: `MODE|SHAPE|BACKEND|LOCATION|DIR`.
const CHILD: &str = "LEASEHOLD_THROUGHPUT_CHILD";

/// Which keys a thread takes.
#[derive(Clone, Copy)]
enum Shape {
    /// A random one of the four per section: threads of a process share every key.
    SharedKeys,
    /// Always the same one: each key has one thread in each process, so every section of
    /// leasehold's is a database grant.
    KeyPerThread,
}

impl Shape {
    fn name(self) -> &'static str {
        match self {
            Shape::SharedKeys => "shared-keys",
            Shape::KeyPerThread => "key-per-thread",
        }
    }
}

/// What one process did in a round.
struct Outcome {
    sections: u64,
    grants: u64,
    longest_wait: Duration,
}

fn main() {
    if let Ok(spec) = std::env::var(CHILD) {
        return child(&spec);
    }
    let rounds = env_number("LEASEHOLD_THROUGHPUT_ROUNDS", ROUNDS as u64) as usize;
    let seconds = env_number("LEASEHOLD_THROUGHPUT_SECONDS", SECONDS);
    let wanted = std::env::var("LEASEHOLD_THROUGHPUT_BACKENDS")
        .unwrap_or_else(|_| "sqlite,postgres,mysql".into());
    let dir = tempfile::tempdir().unwrap();
    let mut summary = String::new();
    for backend in wanted.split(',') {
        let Some(location) = location(backend, dir.path()) else {
            continue;
        };
        let spec = format!("{backend}|{location}");
        if let Err(e) = RawRow::setup(&spec, KEYS) {
            eprintln!("skipping {backend}: {e}");
            continue;
        }
        for shape in [Shape::SharedKeys, Shape::KeyPerThread] {
            let (mut ours, mut raw) = (Vec::new(), Vec::new());
            for round in 1..=rounds {
                for (mode, results) in [("leasehold", &mut ours), ("raw_row", &mut raw)] {
                    let outcomes = run(mode, shape, &spec, dir.path(), seconds);
                    let sections: u64 = outcomes.iter().map(|o| o.sections).sum();
                    let line = format!(
                        "{backend} {} round {round} {mode}: {:.0} sections/s; per process: \
                         sections {}, grants {}, longest wait {} ms",
                        shape.name(),
                        sections as f64 / seconds as f64,
                        join(&outcomes, |o| o.sections.to_string()),
                        join(&outcomes, |o| o.grants.to_string()),
                        join(&outcomes, |o| o.longest_wait.as_millis().to_string()),
                    );
                    println!("{line}");
                    summary.push_str(&line);
                    summary.push('\n');
                    results.push(sections as f64 / seconds as f64);
                }
            }
            let ratios: Vec<String> = ours
                .iter()
                .zip(&raw)
                .map(|(ours, raw)| format!("{:.2}", ours / raw))
                .collect();
            let line = format!(
                "{backend} {} ratio to the raw row per round: {}",
                shape.name(),
                ratios.join(", ")
            );
            println!("{line}");
            summary.push_str(&line);
            summary.push('\n');
        }
    }
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/throughput.txt");
    std::fs::write(out, summary).unwrap();
}

/// Where `backend` is, or `None` (said) when it is not compiled in.
fn location(backend: &str, dir: &Path) -> Option<String> {
    match backend {
        "sqlite" => Some(dir.join("throughput.db").display().to_string()),
        #[cfg(feature = "postgres")]
        "postgres" => Some(urls::without_tls(
            &urls::env_or(
                "LEASEHOLD_POSTGRES_URL",
                "postgres://postgres@127.0.0.1:5432/test",
            ),
            "sslmode=disable",
        )),
        #[cfg(feature = "mysql")]
        "mysql" => Some(urls::without_tls(
            &urls::env_or("LEASEHOLD_MYSQL_URL", "mysql://root@127.0.0.1:3306/test"),
            "ssl-mode=DISABLED",
        )),
        other => {
            eprintln!("skipping {other}: not a backend of this build");
            None
        }
    }
}

/// One round: both processes start together and run `seconds`.
fn run(mode: &str, shape: Shape, spec: &str, dir: &Path, seconds: u64) -> Vec<Outcome> {
    let mut children: Vec<ChildProcess> = (0..PROCESSES)
        .map(|_| {
            let spec = format!("{mode}|{}|{spec}|{}", shape.name(), dir.display());
            ChildProcess::spawn(CHILD, &spec)
        })
        .collect();
    for child in &mut children {
        child.send(&format!("go {seconds}"));
    }
    children
        .iter_mut()
        .map(|child| {
            let line = child.read_line();
            let numbers: Vec<u64> = line
                .split(' ')
                .map(|n| n.parse().unwrap_or_else(|_| panic!("child said {line:?}")))
                .collect();
            Outcome {
                sections: numbers[0],
                grants: numbers[1],
                longest_wait: Duration::from_micros(numbers[2]),
            }
        })
        .collect()
}

/// A child: one instance of `mode` on the backend; prints `SECTIONS GRANTS LONGEST_WAIT_µs`.
fn child(spec: &str) {
    let mut parts = spec.splitn(5, '|');
    let (mode, pinned, backend, location, dir) = (
        parts.next().unwrap(),
        parts.next().unwrap() == Shape::KeyPerThread.name(),
        parts.next().unwrap(),
        parts.next().unwrap(),
        PathBuf::from(parts.next().unwrap()),
    );
    let db = format!("{backend}|{location}");
    let registry = (mode == "leasehold").then(|| {
        let builder = match backend {
            "sqlite" => leasehold::LockRegistry::sqlite(location),
            #[cfg(feature = "postgres")]
            "postgres" => leasehold::LockRegistry::postgres(location),
            #[cfg(feature = "mysql")]
            "mysql" => leasehold::LockRegistry::mysql(location),
            other => panic!("unknown backend {other}"),
        };
        builder
            .prefix("BENCH_THROUGHPUT_")
            .create_table(true)
            .build()
            .unwrap()
    });
    // Everything is connected before the round starts.
    let mut takers: Vec<Taker> = (0..THREADS)
        .map(|n| {
            let witness: Vec<File> = (0..KEYS)
                .map(|k| {
                    File::options()
                        .create(true)
                        .truncate(false)
                        .write(true)
                        .open(dir.join(format!("witness-{k}")))
                        .unwrap()
                })
                .collect();
            match &registry {
                Some(registry) => Taker::Leasehold { registry, witness },
                None => Taker::Raw {
                    row: Box::new(RawRow::connect(&db)),
                    me: format!("{}-{n}", std::process::id()),
                    witness,
                },
            }
        })
        .collect();
    println!("ready");
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
    let seconds: u64 = line.trim().strip_prefix("go ").unwrap().parse().unwrap();
    let end = Instant::now() + Duration::from_secs(seconds);
    let before = registry.as_ref().map(|r| r.statistics().grants);
    let results: Vec<(u64, Duration)> = std::thread::scope(|scope| {
        let threads: Vec<_> = takers
            .iter_mut()
            .enumerate()
            .map(|(n, taker)| scope.spawn(move || taker.run(n, pinned, end)))
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let grants = match (&registry, before) {
        (Some(registry), Some(before)) => registry.statistics().grants - before,
        _ => results.iter().map(|r| r.0).sum(),
    };
    println!(
        "{} {} {}",
        results.iter().map(|r| r.0).sum::<u64>(),
        grants,
        results.iter().map(|r| r.1).max().unwrap().as_micros()
    );
}

enum Taker<'a> {
    Leasehold {
        registry: &'a leasehold::LockRegistry,
        witness: Vec<File>,
    },
    Raw {
        row: Box<RawRow>,
        me: String,
        witness: Vec<File>,
    },
}

impl Taker<'_> {
    /// Sections until `end` (on the key `n` if `pinned`): how many, and the longest wait for a
    /// key.
    fn run(&mut self, n: usize, pinned: bool, end: Instant) -> (u64, Duration) {
        let mut state = 0x9E37_79B9_7F4A_7C15_u64 ^ (n as u64 + 1) ^ u64::from(std::process::id());
        let (mut sections, mut longest) = (0, Duration::ZERO);
        // Handles stay on the thread that uses them.
        let locks: Vec<leasehold::Lock> = match self {
            Taker::Leasehold { registry, .. } => (0..KEYS)
                .map(|k| registry.obtain(&format!("throughput-{k}")).unwrap())
                .collect(),
            Taker::Raw { .. } => Vec::new(),
        };
        while Instant::now() < end {
            // xorshift: a random key per section.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let k = if pinned {
                n % KEYS
            } else {
                (state % KEYS as u64) as usize
            };
            let asked = Instant::now();
            match self {
                Taker::Leasehold { witness, .. } => {
                    let guard = locks[k].lock().expect("granted");
                    longest = longest.max(asked.elapsed());
                    enter(&witness[k], k);
                    witness[k].unlock().unwrap();
                    guard.unlock().expect("released");
                }
                Taker::Raw { row, me, witness } => {
                    row.lock(me, k);
                    longest = longest.max(asked.elapsed());
                    enter(&witness[k], k);
                    witness[k].unlock().unwrap();
                    row.unlock(me, k);
                }
            }
            sections += 1;
        }
        (sections, longest)
    }
}

/// Enters the witness of key `k`, held until the holder lets go of its file lock: nobody else
/// may be inside.
fn enter(file: &File, k: usize) {
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => panic!("two holders of key {k} at once"),
        Err(std::fs::TryLockError::Error(e)) => panic!("witness of key {k}: {e}"),
    }
}

fn join(outcomes: &[Outcome], f: impl Fn(&Outcome) -> String) -> String {
    outcomes.iter().map(f).collect::<Vec<_>>().join(" / ")
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
