//! A profiling aid, not a tour: the MySQL/MariaDB counterpart of `sqlite_cycles.rs`. Runs
//! `cycles` uncontended `lock()` + `unlock()` of one key through a registry, or the registry's
//! own two statements on a raw `mysql` connection (prepared once, as `benches/databases.rs`
//! runs them), so that the instructions the client spends (`valgrind --tool=callgrind`) and
//! its system calls (`strace -c -f`) can be compared. Run two cycle counts and subtract.
//!
//! ```text
//! cargo build --release --features mysql --example mysql_cycles
//! valgrind --tool=callgrind target/release/examples/mysql_cycles registry 2000
//! ```
//!
//! Modes: `registry` (wake-ups on, as by default), `quiet` (`notifications(false)`), `raw`.
//! The server: `LEASEHOLD_MYSQL_URL`, else `mysql://root@127.0.0.1:3306/test`.

use leasehold::LockRegistry;
use mysql::prelude::Queryable;

#[path = "../benches/common/mysql_params.rs"]
mod mysql_params;

const KEY: &str = "cycles-key";
const CLIENT: &str = "cycles-raw-client";

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "registry".into());
    let cycles: u32 = args
        .next()
        .map_or(1000, |n| n.parse().expect("a cycle count"));
    let url = std::env::var("LEASEHOLD_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
    let registry = LockRegistry::mysql(url.as_str())
        .prefix("CYCLES_")
        .create_table(true)
        .notifications(mode != "quiet")
        .tuning(leasehold::Tuning {
            turn_limit: None,
            ..Default::default()
        })
        .build()
        .unwrap();
    let lock = registry.obtain(KEY).unwrap();
    // One cycle of each outside the count, so both modes have prepared their statements.
    lock.lock().unwrap().unlock().unwrap();
    let mut conn = mysql::Conn::new(mysql::Opts::from_url(&url).unwrap()).unwrap();
    let statements = registry.statements();
    let (acquire, acquire_order) = mysql_params::question_marks(&statements.acquire);
    let (release, release_order) = mysql_params::question_marks(&statements.release);
    let (acquire, release) = (conn.prep(acquire).unwrap(), conn.prep(release).unwrap());
    let lock_key = leasehold::lock_key_for(KEY);
    let mut raw_cycle = || {
        let values = |ttl, token, name, order: &[usize]| {
            mysql_params::values(&lock_key, CLIENT, ttl, token, name, order)
        };
        conn.exec_drop(&acquire, values(10_000_000, 0, KEY, &acquire_order))
            .unwrap();
        let token = conn.last_insert_id() as i64;
        assert_ne!(token, 0, "granted");
        conn.exec_drop(&release, values(0, token, "", &release_order))
            .unwrap();
        assert_eq!(conn.affected_rows(), 1, "released");
    };
    raw_cycle();
    let started = std::time::Instant::now();
    for _ in 0..cycles {
        if mode == "raw" {
            raw_cycle();
        } else {
            lock.lock().unwrap().unlock().unwrap();
        }
    }
    let each = started.elapsed().as_secs_f64() * 1e6 / f64::from(cycles.max(1));
    eprintln!("{mode}: {cycles} cycles, {each:.1} µs each");
}
