//! A profiling aid, not a tour: `cycles` uncontended `lock()` + `unlock()` of one key on a
//! file-backed SQLite registry, or the same two statements on a raw `rusqlite` connection
//! (as `benches/databases.rs` runs them), so that instruction counts (`valgrind
//! --tool=callgrind`) and system calls (`strace -c -f`) of the two can be compared. The setup
//! is the same in every mode: run two cycle counts and subtract to get the cost per cycle.
//!
//! ```text
//! cargo build --release --example sqlite_cycles
//! valgrind --tool=callgrind target/release/examples/sqlite_cycles registry 2000
//! strace -c -f target/release/examples/sqlite_cycles raw 2000
//! ```
//!
//! Modes: `registry` (wake-ups on, as by default), `quiet` (`notifications(false)`), `raw`.

use leasehold::LockRegistry;

const KEY: &str = "cycles-key";
const CLIENT: &str = "cycles-raw-client";

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "registry".into());
    let cycles: u32 = args
        .next()
        .map_or(1000, |n| n.parse().expect("a cycle count"));
    let dir = std::env::temp_dir().join(format!("leasehold-cycles-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cycles.db");
    let registry = LockRegistry::sqlite(&path)
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
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch("PRAGMA synchronous = NORMAL").unwrap();
    let statements = registry.statements();
    let (acquire, release) = (statements.acquire.clone(), statements.release.clone());
    let lock_key = leasehold::lock_key_for(KEY);
    let raw_cycle = || {
        let mut statement = conn.prepare_cached(&acquire).unwrap();
        let values: [&dyn rusqlite::ToSql; 6] = [
            &lock_key,
            &"DEFAULT",
            &CLIENT,
            &10_000_000_i64,
            &0_i64,
            &KEY,
        ];
        for (index, value) in values.iter().enumerate() {
            if index < statement.parameter_count() {
                statement.raw_bind_parameter(index + 1, value).unwrap();
            }
        }
        let token: i64 = statement
            .raw_query()
            .next()
            .unwrap()
            .expect("granted")
            .get(0)
            .unwrap();
        drop(statement);
        let mut statement = conn.prepare_cached(&release).unwrap();
        let values: [&dyn rusqlite::ToSql; 6] =
            [&lock_key, &"DEFAULT", &CLIENT, &0_i64, &token, &""];
        for (index, value) in values.iter().enumerate() {
            if index < statement.parameter_count() {
                statement.raw_bind_parameter(index + 1, value).unwrap();
            }
        }
        assert_eq!(statement.raw_execute().unwrap(), 1);
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
    drop(lock);
    drop(registry);
    let _ = std::fs::remove_dir_all(&dir);
}
