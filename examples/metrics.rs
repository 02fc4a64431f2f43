//! What a registry measures: a few seconds of contention between two registries on one SQLite
//! file (two "instances", three threads each, four keys), then each registry's
//! [`Statistics`](leasehold::Statistics) — the figures a dashboard graphs. With the `metrics`
//! feature the same events also go to the `metrics` facade, for the exporter an application
//! installs (the README's "Metrics" lists the names).
//!
//! ```sh
//! cargo run --release --example metrics
//! ```

use leasehold::{LockRegistry, Statistics};
use std::thread;
use std::time::{Duration, Instant};

fn main() -> leasehold::Result<()> {
    let path = std::env::temp_dir().join(format!("leasehold-metrics-{}.db", std::process::id()));
    let instances: Vec<LockRegistry> = (0..2)
        .map(|_| {
            LockRegistry::sqlite(&path)
                .create_table(true)
                .time_to_live(Duration::from_secs(3))
                .build()
        })
        .collect::<leasehold::Result<_>>()?;
    let until = Instant::now() + Duration::from_secs(3);
    let mut workers = Vec::new();
    for (index, registry) in instances.iter().enumerate() {
        for thread_no in 0..3 {
            let registry = registry.clone();
            workers.push(thread::spawn(move || -> leasehold::Result<()> {
                let mut n = index * 7 + thread_no;
                while Instant::now() < until {
                    n = (n * 31 + 7) % 1000;
                    let lock = registry.obtain(&format!("job-{}", n % 4))?;
                    if let Some(guard) = lock.try_lock_for(Duration::from_secs(5))? {
                        thread::sleep(Duration::from_millis((n % 5) as u64));
                        guard.unlock()?;
                    }
                }
                Ok(())
            }));
        }
    }
    // One lease held past a renewal, so that renewals show too.
    let long = instances[0].obtain("long-job")?.lock()?;
    for worker in workers {
        worker.join().expect("a worker panicked")?;
    }
    long.unlock()?;
    for (index, registry) in instances.iter().enumerate() {
        print(index, &registry.statistics());
    }
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(path.with_extension("db-wal"));
    let _ = std::fs::remove_file(path.with_extension("db-shm"));
    Ok(())
}

fn print(index: usize, stats: &Statistics) {
    let grants = stats.grants + stats.local_handoffs;
    let per_grant = |total: Duration| total / u32::try_from(grants.max(1)).unwrap_or(u32::MAX);
    println!("instance {index}:");
    println!(
        "  grants            {grants} ({} by the database, {} handed over locally)",
        stats.grants, stats.local_handoffs
    );
    println!(
        "  contended tries   {} (acquire statements that found the lock held)",
        stats.contended_tries
    );
    println!("  mean wait         {:?}", per_grant(stats.wait_time));
    println!("  mean hold         {:?}", per_grant(stats.hold_time));
    println!(
        "  renewals          {} renewed, {} failed, longest statement {:?}",
        stats.leases_renewed, stats.renewals_failed, stats.longest_renewal
    );
    println!(
        "  leases lost       {} expired, {} taken (alert on any)",
        stats.leases_lost_expired, stats.leases_lost_not_owner
    );
    println!(
        "  statements        {} acquire, {} renew, {} release; {} leases held now",
        stats.acquires, stats.renewals, stats.releases, stats.held_leases
    );
}
