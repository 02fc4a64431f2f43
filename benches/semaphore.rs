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
//!
//! `cargo bench --all-features --bench semaphore`.

use criterion::Criterion;
use leasehold::{LockRegistry, RegistryBuilder};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn prefix() -> String {
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros();
    format!("bench_sem_{}_{stamp}_", std::process::id())
}

fn bench_backend(c: &mut Criterion, name: &str, builder: impl Fn() -> RegistryBuilder) {
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
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.db");
    bench_backend(&mut c, "sqlite", || LockRegistry::sqlite(&path));
    #[cfg(feature = "postgres")]
    {
        let url = std::env::var("LEASEHOLD_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        let prefix = prefix();
        bench_backend(&mut c, "postgres", || {
            LockRegistry::postgres(url.clone()).prefix(prefix.clone())
        });
        drop_tables_postgres(&url, &prefix);
    }
    #[cfg(feature = "mysql")]
    {
        let url = std::env::var("LEASEHOLD_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
        let prefix = prefix();
        bench_backend(&mut c, "mysql", || {
            LockRegistry::mysql(url.clone()).prefix(prefix.clone())
        });
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
