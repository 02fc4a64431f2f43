//! What the `metrics` feature costs an uncontended `lock()` + `unlock()`.
//!
//! Three variants of the same loop on the same registry, named by what the build and the
//! thread have:
//!
//! - `feature_off`: built without the `metrics` feature (only `Statistics`' atomic counters);
//! - `no_recorder`: built with it, no recorder installed (the facade's no-op recorder);
//! - `recorder`: built with it, `metrics-util`'s debugging recorder in place for the thread
//!   (`metrics::with_local_recorder`: every event of a lock + unlock happens on the caller's
//!   thread). It keeps counters and gauges in a registry keyed by name and labels and
//!   histogram samples in atomic buckets, as the Prometheus exporter does.
//!
//! A build runs the variants it can (`feature_off`, or `no_recorder` and `recorder`), each
//! through criterion and then interleaved — 101 rounds of 100 cycles (SQLite) or 10
//! (PostgreSQL) per variant in turn — so that the load of a shared machine drifts over all of
//! them alike. `recorder / no_recorder` is the median of the ratios of neighbouring rounds.
//! The medians of the rounds go to stdout and to `target/metrics_bench.txt`; a build with the
//! feature prints its ratios to the last `feature_off` run found there. Run both builds back
//! to back (alternating a few times on a loaded machine, where runs differ by ±30 %):
//!
//! ```text
//! cargo bench --no-default-features --features sqlite,postgres --bench metrics
//! cargo bench --all-features --bench metrics
//! ```
//!
//! SQLite always (a file in a temporary directory, under `/dev/shm` where it exists); PostgreSQL at `LEASEHOLD_POSTGRES_URL`
//! (default as in the tests) when it answers, with `prepared_statements(true)` so that the
//! statements cost as little as they can and the metrics' share shows.

use criterion::Criterion;
use leasehold::{Lock, LockRegistry};
use std::time::{Duration, Instant};

/// The interleaved rounds per variant (the cycles of one round are given per database).
const ROUNDS: usize = 101;

/// `lock()` + `unlock()` `cycles` times; the mean time of one.
fn cycle(lock: &Lock, cycles: u32) -> Duration {
    let started = Instant::now();
    for _ in 0..cycles {
        lock.lock().unwrap().unlock().unwrap();
    }
    started.elapsed() / cycles
}

/// The variants this build measures, each a way to run `f` with or without a recorder.
type Variant = (&'static str, fn(&mut dyn FnMut()));

#[cfg(not(feature = "metrics"))]
const VARIANTS: &[Variant] = &[("feature_off", |f| f())];

#[cfg(feature = "metrics")]
const VARIANTS: &[Variant] = &[
    ("no_recorder", |f| f()),
    ("recorder", |f| {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        metrics::with_local_recorder(&recorder, f)
    }),
];

/// Criterion's figures, then for every variant the median of the interleaved rounds (ns per
/// cycle) and the median of its ratios to the first variant's round just before.
fn bench(
    c: &mut Criterion,
    database: &str,
    registry: &LockRegistry,
    cycles: u32,
) -> Vec<(f64, f64)> {
    let lock = registry.obtain("bench-metrics").unwrap();
    let mut group = c.benchmark_group(format!("metrics/{database}"));
    for (name, run) in VARIANTS {
        run(&mut || {
            group.bench_function(format!("lock_unlock_{name}"), |b| {
                b.iter(|| lock.lock().unwrap().unlock().unwrap())
            });
        });
    }
    group.finish();
    let mut rounds = vec![Vec::with_capacity(ROUNDS); VARIANTS.len()];
    for _ in 0..ROUNDS {
        for ((_, run), times) in VARIANTS.iter().zip(&mut rounds) {
            run(&mut || times.push(cycle(&lock, cycles).as_nanos() as f64));
        }
    }
    // Each variant against the first, round by round: neighbours in time share the load.
    let ratios: Vec<f64> = rounds
        .iter()
        .map(|times| median(times.iter().zip(&rounds[0]).map(|(t, first)| t / first)))
        .collect();
    rounds
        .into_iter()
        .map(|times| median(times.into_iter()))
        .zip(ratios)
        .collect()
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    let mut medians: Vec<(String, &str, f64, f64)> = Vec::new();
    let mut record = |database: &str, figures: Vec<(f64, f64)>| {
        for ((variant, _), (median, ratio)) in VARIANTS.iter().zip(figures) {
            medians.push((database.to_string(), variant, median, ratio));
        }
    };

    // In memory where the system has a tmpfs: the file system's own noise stays out.
    let shm = std::path::Path::new("/dev/shm");
    let dir = match shm.is_dir() {
        true => tempfile::tempdir_in(shm),
        false => tempfile::tempdir(),
    }
    .unwrap();
    let sqlite = LockRegistry::sqlite(dir.path().join("bench.db"))
        .create_table(true)
        .build()
        .expect("SQLite registry");
    record("sqlite", bench(&mut c, "sqlite", &sqlite, 100));

    #[cfg(feature = "postgres")]
    {
        let url = std::env::var("LEASEHOLD_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        let prefix = format!("bench_metrics_{}_", std::process::id());
        match LockRegistry::postgres(&url)
            .prefix(prefix.clone())
            .create_table(true)
            .prepared_statements(true)
            .build()
        {
            Ok(registry) => {
                record("postgres", bench(&mut c, "postgres", &registry, 10));
                drop(registry);
                if let Ok(mut client) = postgres::Client::connect(&url, postgres::NoTls) {
                    let _ = client.batch_execute(&format!(
                        "DROP TABLE IF EXISTS {prefix}LOCK; DROP TABLE IF EXISTS {prefix}LOCK_FLOOR"
                    ));
                }
            }
            Err(e) => eprintln!("skipping PostgreSQL: {e}"),
        }
    }
    c.final_summary();

    let file = std::path::Path::new(
        &std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into()),
    )
    .join("metrics_bench.txt");
    let before = std::fs::read_to_string(&file).unwrap_or_default();
    let earlier = |database: &str, variant: &str| {
        before.lines().find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some(database) && words.next() == Some(variant))
                .then(|| words.next()?.parse::<f64>().ok())
                .flatten()
        })
    };
    let mut kept: Vec<String> = before
        .lines()
        .filter(|line| {
            !VARIANTS
                .iter()
                .any(|(variant, _)| line.split_whitespace().nth(1) == Some(variant))
        })
        .map(str::to_string)
        .collect();
    println!("\nmedians of {ROUNDS} interleaved rounds, per lock() + unlock():");
    for (database, variant, median, _) in &medians {
        println!("{database:>9} {variant:<12} {:>10.1} µs", median / 1000.0);
        kept.push(format!("{database} {variant} {median:.0}"));
    }
    for (database, variant, median, ratio) in &medians {
        if *variant == "recorder" {
            println!(
                "{database:>9} recorder / no_recorder: {ratio:.3} (median of the ratios of \
                 neighbouring rounds)"
            );
        }
        if let Some(off) = earlier(database, "feature_off").filter(|_| *variant != "feature_off") {
            println!(
                "{database:>9} {variant} / feature_off: {:.3} (against the last feature_off run)",
                median / off
            );
        }
    }
    std::fs::write(&file, kept.join("\n") + "\n").unwrap();
    println!("written to {}", file.display());
}
