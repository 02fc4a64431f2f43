//! Handoff and lock latency, each next to a baseline measured in the same run.
//!
//! - `local_handoff/condvar_baseline`: a bare `parking_lot` mutex + condvar passing a turn
//!   between two threads — the floor for waking a parked thread on this machine.
//! - `local_handoff/leasehold`: the same ping-pong through one leasehold lock of one registry:
//!   every acquisition is a local handoff, with no database statement.
//!
//! - `local_handoff/fair_lock_baseline`: the least a lock that hands itself over in FIFO order
//!   needs (owner and queue under a `parking_lot` mutex, a condvar), passed back and forth with
//!   the same harness as leasehold's lock — the floor for `leasehold`. It costs more than the
//!   condvar ping-pong because each side must see the other queued before letting go.
//! - `local_handoff/leasehold_4_threads`: four threads taking turns on one lock as fast as they
//!   can; time per acquisition. A turn is a local handoff when another thread is queued, else a
//!   release to and a grant from the database (SQLite): the queue under contention, fallbacks
//!   included.
//!
//! Database costs and cross-instance handoffs are in `benches/databases.rs`.
//!
//! Run with `cargo bench --all-features --bench handoff`; `bash benches/report` puts its ratios
//! in `BENCHMARKS.md`.

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

/// The least a lock that hands itself over in FIFO order needs: an owner and a queue under a
/// `parking_lot` mutex, each queued thread waiting on a condvar of its own, which the unlock
/// that makes it the owner wakes. The `fair_lock_baseline` measures it with the same harness
/// as leasehold's lock (each side waits until the other queued before letting go).
#[derive(Default)]
struct FairLock {
    /// The owner, and the queued threads with their condvars, oldest first.
    state: Mutex<(Option<thread::ThreadId>, Queue)>,
}

type Queue = std::collections::VecDeque<(thread::ThreadId, Arc<Condvar>)>;

thread_local! {
    static WAKE: Arc<Condvar> = Arc::new(Condvar::new());
}

impl FairLock {
    fn lock(&self) {
        let me = thread::current().id();
        let mut state = self.state.lock();
        if state.0.is_none() {
            state.0 = Some(me);
            return;
        }
        let wake = WAKE.with(Arc::clone);
        state.1.push_back((me, Arc::clone(&wake)));
        while state.0 != Some(me) {
            wake.wait(&mut state);
        }
    }

    fn unlock(&self) {
        let mut state = self.state.lock();
        let next = state.1.pop_front();
        state.0 = next.as_ref().map(|(thread, _)| *thread);
        if let Some((_, wake)) = next {
            wake.notify_one();
        }
    }

    fn queued(&self) -> usize {
        self.state.lock().1.len()
    }
}

/// [`leasehold_ping_pong`] on a [`FairLock`].
fn fair_lock_ping_pong(handoffs: u64) -> Duration {
    let lock = Arc::new(FairLock::default());
    let rounds = handoffs.div_ceil(2).max(1);
    let until_queued = |lock: &FairLock| {
        while lock.queued() == 0 {
            thread::yield_now();
        }
    };
    lock.lock();
    let partner = {
        let lock = lock.clone();
        thread::spawn(move || {
            for _ in 0..rounds {
                lock.lock();
                until_queued(&lock);
                lock.unlock();
            }
        })
    };
    until_queued(&lock);
    let start = Instant::now();
    for round in 0..rounds {
        lock.unlock();
        lock.lock();
        if round + 1 < rounds {
            until_queued(&lock);
        }
    }
    let elapsed = start.elapsed();
    lock.unlock();
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

/// Four threads each run `take_turn` (take and release one lock) until `acquisitions` were
/// made in all.
fn contended(take_turn: impl Fn() + Clone + Send + 'static, acquisitions: u64) -> Duration {
    const THREADS: u64 = 4;
    let each = acquisitions.div_ceil(THREADS).max(1);
    let start_line = Arc::new(std::sync::Barrier::new(THREADS as usize + 1));
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (take_turn, start_line) = (take_turn.clone(), start_line.clone());
            thread::spawn(move || {
                start_line.wait();
                for _ in 0..each {
                    take_turn();
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
        .tuning(leasehold::Tuning {
            turn_limit: None,
            ..Default::default()
        })
        .build()
        .unwrap();
    let lock = registry.obtain("ping-pong").unwrap();
    let mut group = c.benchmark_group("local_handoff");
    group.bench_function("condvar_baseline", |b| b.iter_custom(condvar_ping_pong));
    group.bench_function("fair_lock_baseline", |b| b.iter_custom(fair_lock_ping_pong));
    group.bench_function("leasehold", |b| {
        b.iter_custom(|handoffs| leasehold_ping_pong(&lock, handoffs))
    });
    let stats = registry.statistics();
    assert!(
        stats.grants < 1000,
        "handoffs must not go to the database: {stats:?}"
    );
    group.bench_function("leasehold_4_threads", |b| {
        b.iter_custom(|acquisitions| {
            let lock = lock.clone();
            contended(move || drop(lock.lock().unwrap()), acquisitions)
        })
    });
    group.finish();
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
