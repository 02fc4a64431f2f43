//! Handoff and lock latency, each next to a baseline measured in the same run.
//!
//! - `local_handoff/condvar_baseline`: a bare `parking_lot` mutex + condvar passing a turn
//!   between two threads — the floor for waking a parked thread on this machine.
//! - `local_handoff/leasehold`: the same ping-pong through one leasehold lock of one registry:
//!   every acquisition is a local handoff, with no database statement.
//!
//! - `local_handoff/leasehold_4_threads`: four threads of one registry taking turns on one
//!   lock as fast as they can; time per acquisition. Every acquisition but the first is a local
//!   handoff, so this measures the cost of the queue with several waiters (who is woken).
//!
//! Database costs and cross-instance handoffs are in `benches/databases.rs`.
//!
//! Run with `cargo bench --bench handoff`; the README's Performance table is made from it.

use criterion::{criterion_group, criterion_main, Criterion};
use leasehold::{Lock, LockRegistry};
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Runs `handoffs` turn passes between the calling thread and a partner, returns the time.
fn condvar_ping_pong(handoffs: u64) -> Duration {
    let shared = Arc::new((Mutex::new(0u64), Condvar::new()));
    let rounds = handoffs.div_ceil(2).max(1);
    let partner = {
        let shared = shared.clone();
        thread::spawn(move || {
            let (turn, changed) = &*shared;
            for round in 0..rounds {
                let mut turn = turn.lock();
                while *turn != 2 * round + 1 {
                    changed.wait(&mut turn);
                }
                *turn += 1;
                changed.notify_one();
            }
        })
    };
    let (turn, changed) = &*shared;
    let start = Instant::now();
    for round in 0..rounds {
        let mut turn = turn.lock();
        *turn = 2 * round + 1;
        changed.notify_one();
        while *turn != 2 * round + 2 {
            changed.wait(&mut turn);
        }
    }
    let elapsed = start.elapsed();
    partner.join().unwrap();
    elapsed
}

/// Waits (spinning, then yielding) until another thread queues on `lock`.
fn until_someone_queues(lock: &Lock) {
    while lock.queued_threads() == 0 {
        thread::yield_now();
    }
}

/// Passes one leasehold lock back and forth `handoffs` times between two threads.
fn leasehold_ping_pong(lock: &Lock, handoffs: u64) -> Duration {
    let rounds = handoffs.div_ceil(2).max(1);
    let mut guard = lock.lock().unwrap();
    let partner = {
        let lock = lock.clone();
        thread::spawn(move || {
            for _ in 0..rounds {
                let guard = lock.lock().unwrap();
                until_someone_queues(&lock);
                drop(guard);
            }
        })
    };
    until_someone_queues(lock);
    let start = Instant::now();
    for round in 0..rounds {
        drop(guard);
        guard = lock.lock().unwrap();
        if round + 1 < rounds {
            until_someone_queues(lock);
        }
    }
    let elapsed = start.elapsed();
    drop(guard);
    partner.join().unwrap();
    elapsed
}

/// Four threads each take and release `lock` until `acquisitions` were made in all.
fn contended(lock: &Lock, acquisitions: u64) -> Duration {
    const THREADS: u64 = 4;
    let each = acquisitions.div_ceil(THREADS).max(1);
    let start_line = Arc::new(std::sync::Barrier::new(THREADS as usize + 1));
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (lock, start_line) = (lock.clone(), start_line.clone());
            thread::spawn(move || {
                start_line.wait();
                for _ in 0..each {
                    drop(lock.lock().unwrap());
                }
            })
        })
        .collect();
    start_line.wait();
    let start = Instant::now();
    for worker in workers {
        worker.join().unwrap();
    }
    start.elapsed() * acquisitions as u32 / (each * THREADS) as u32
}

fn local_handoff(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let registry = LockRegistry::sqlite(dir.path().join("bench.db"))
        .create_table(true)
        .local_handoff_limit(None)
        .build()
        .unwrap();
    let lock = registry.obtain("ping-pong").unwrap();
    let mut group = c.benchmark_group("local_handoff");
    group.bench_function("condvar_baseline", |b| b.iter_custom(condvar_ping_pong));
    group.bench_function("leasehold", |b| {
        b.iter_custom(|handoffs| leasehold_ping_pong(&lock, handoffs))
    });
    group.bench_function("leasehold_4_threads", |b| {
        b.iter_custom(|acquisitions| contended(&lock, acquisitions))
    });
    group.finish();
    let stats = registry.statistics();
    assert!(
        stats.grants < 1000,
        "handoffs must not go to the database: {stats:?}"
    );
}

fn quick() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = quick();
    targets = local_handoff
}
criterion_main!(benches);
