//! A tour of leasehold on the embedded default, SQLite, in a temporary directory.
//!
//! Two registries on one file play two instances of a service. The tour shows, with timings:
//! the instant local handoff between threads of one instance, a handoff between instances,
//! expiry takeover after a holder stalls, how the stalled holder learns it lost the lease,
//! and how fencing tokens let the protected resource refuse its late write.
//!
//! Run it with `cargo run --release --example quickstart`. It needs nothing but leasehold and
//! the standard library: copy it into `src/main.rs` of a crate that depends on `leasehold`.

use leasehold::{LockRegistry, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

fn main() -> Result<()> {
    let dir = ScratchDir::new();
    let path = dir.0.join("locks.db");
    println!("leasehold quickstart: lock table in {}\n", path.display());

    let instance_a = LockRegistry::sqlite(&path).create_table(true).build()?;
    let instance_b = LockRegistry::sqlite(&path).build()?;
    println!(
        "instance A = client {}\ninstance B = client {}\n",
        instance_a.client_id(),
        instance_b.client_id()
    );

    local_handoff(&instance_a)?;
    cross_instance_handoff(&instance_a, &instance_b)?;
    stalled_holder_is_fenced_off(&path, &instance_b)?;
    Ok(())
}

/// A directory of this run's own under the system's temporary directory, removed (with the
/// lock table in it) when the tour ends.
struct ScratchDir(std::path::PathBuf);

impl ScratchDir {
    fn new() -> ScratchDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let dir = std::env::temp_dir().join(format!(
            "leasehold-quickstart-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        ScratchDir(dir)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Four threads of one instance take turns: after the first grant the lock moves between them
/// without a database statement.
fn local_handoff(instance: &LockRegistry) -> Result<()> {
    println!("1. Local handoff: 4 threads of instance A share the lock \"report\"");
    let before = instance.statistics();
    let lock = instance.obtain("report")?;
    let start = Arc::new(Barrier::new(4));
    let tokens = Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    let workers: Vec<_> = (0..4)
        .map(|worker| {
            let (lock, start, tokens) = (lock.clone(), start.clone(), tokens.clone());
            thread::spawn(move || -> Result<Duration> {
                start.wait();
                let mut waited = Duration::ZERO;
                for _ in 0..250 {
                    let asked = Instant::now();
                    let guard = lock.lock()?;
                    waited += asked.elapsed();
                    tokens.lock().unwrap().insert(guard.fencing_token());
                    guard.unlock()?;
                }
                println!(
                    "   thread {worker}: 250 turns, mean wait {:?}",
                    waited / 250
                );
                Ok(waited)
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("worker thread")?;
    }
    let after = instance.statistics();
    let grants = after.grants - before.grants;
    let tokens = tokens.lock().unwrap();
    println!(
        "   1000 acquisitions: {grants} took the lock from the database ({} acquire and {} \
         release statements, {} distinct fencing tokens from {} to {}); the other {} passed it \
         from thread to thread without a statement, keeping their grant's token\n",
        after.acquires - before.acquires,
        after.releases - before.releases,
        tokens.len(),
        tokens.first().copied().unwrap_or_default(),
        tokens.last().copied().unwrap_or_default(),
        1000 - grants
    );
    Ok(())
}

/// Instance A holds the lock; instance B waits. A's release wakes B at once (release
/// notifications: on SQLite the release board beside the file, on Linux; PostgreSQL `NOTIFY`
/// and MySQL named locks do the same); without them B would see the release at its next poll
/// of the database (every `idle_between_tries`, 100 ms by default).
fn cross_instance_handoff(a: &LockRegistry, b: &LockRegistry) -> Result<()> {
    println!("2. Cross-instance handoff: A holds \"invoice-run\", B waits");
    let held = a.obtain("invoice-run")?.lock()?;
    println!("   A holds it with fencing token {}", held.fencing_token());
    let waiter = {
        let lock = b.obtain("invoice-run")?;
        thread::spawn(move || -> Result<(Instant, u64)> {
            let guard = lock.lock()?;
            let got_at = Instant::now();
            let token = guard.fencing_token();
            guard.unlock()?;
            Ok((got_at, token))
        })
    };
    // Release between two of B's polls (it polls every 100 ms from when it asked), so that a
    // quick handoff can only come from the wake-up.
    thread::sleep(Duration::from_millis(250));
    let released_at = Instant::now();
    held.unlock()?;
    let (got_at, token) = waiter.join().expect("waiter thread")?;
    println!(
        "   A released after 250 ms; B got it {:?} later, with token {token}: the release woke \
         it (with notifications(false) it would wait for its next poll)\n",
        got_at.saturating_duration_since(released_at)
    );
    Ok(())
}

/// A third instance takes a lease with renewal off and a 1 s time-to-live, then stalls (as a
/// paused or hung process would). B takes over once the lease expires on the database's clock;
/// the stalled holder learns it lost the lease, and the resource refuses its late write.
fn stalled_holder_is_fenced_off(path: &std::path::Path, b: &LockRegistry) -> Result<()> {
    println!("3. Expiry takeover: instance C takes \"ledger\" for 1 s and stalls");
    let instance_c = LockRegistry::sqlite(path)
        .renewal(false)
        .on_lease_lost(|lost| {
            println!(
                "   [C's loss callback] lease on {:?} (token {}) lost: {}",
                lost.key, lost.fencing_token, lost.reason
            )
        })
        .build()?;
    let ledger = FencedLedger::default();
    let stalled = instance_c
        .obtain("ledger")?
        .lock_with_ttl(Duration::from_secs(1))?;
    let lost_signal = stalled.loss_channel();
    ledger.write(stalled.fencing_token(), "C: first entry");
    let asked = Instant::now();
    let taken = b.obtain("ledger")?.lock()?;
    println!(
        "   B took over after {:?} with token {} (C had {})",
        asked.elapsed(),
        taken.fencing_token(),
        stalled.fencing_token()
    );
    ledger.write(taken.fencing_token(), "B: second entry");
    if let Ok(lost) = lost_signal.recv_timeout(Duration::from_secs(5)) {
        println!("   C's loss channel fired: {}", lost.reason);
    }
    println!("   C wakes up; is_held() = {}", stalled.is_held());
    ledger.write(stalled.fencing_token(), "C: late entry");
    match stalled.unlock() {
        Err(e) => println!("   C's unlock() reports: {e}"),
        Ok(()) => println!("   C's unlock() unexpectedly succeeded"),
    }
    taken.unlock()?;
    println!("   ledger: {:?}", ledger.entries.lock().unwrap());
    Ok(())
}

/// A resource that checks fencing tokens: it refuses writes with a token smaller than the
/// largest it has accepted.
#[derive(Default)]
struct FencedLedger {
    highest_token: AtomicU64,
    entries: Mutex<Vec<&'static str>>,
}

impl FencedLedger {
    fn write(&self, token: u64, entry: &'static str) {
        let mut entries = self.entries.lock().unwrap();
        let highest = self.highest_token.load(Ordering::SeqCst);
        if token < highest {
            println!("   ledger refuses {entry:?}: token {token} < {highest}");
            return;
        }
        self.highest_token.store(token, Ordering::SeqCst);
        entries.push(entry);
        println!("   ledger accepts {entry:?} with token {token}");
    }
}
