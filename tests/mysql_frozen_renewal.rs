//! MySQL/MariaDB: a holder frozen in the middle of its batch renewal (stopped by SIGSTOP, paused
//! in a debugger, a VM pause) holds no row locked. Its leases run out at their deadline and
//! another registry takes their keys after about one time-to-live.
//!
//! The holder is a child process (this test binary again, running `frozen_holder`) that stops
//! itself with SIGSTOP at a fail point between the renewal's statements: every thread of it
//! stops there, as under a real SIGSTOP. One test pair per binary: fail points are the
//! process's.

#![cfg(all(feature = "mysql", feature = "failpoints", target_os = "linux"))]

mod common;

use common::{Db, Fixture};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Plenty on a busy host, yet far below the server's `wait_timeout` (8 h), until which a
/// frozen session's transaction would keep its rows locked.
const GENEROUS: Duration = Duration::from_secs(30);

/// Tells the child which table to use: the parent fixture's prefix.
const CHILD: &str = "LEASEHOLD_FROZEN_HOLDER_PREFIX";

const KEYS: [&str; 3] = ["frozen-a", "frozen-b", "frozen-c"];
const TTL: Duration = Duration::from_secs(2);

/// The child: holds three leases, renewed in one batch, and stops itself between the batch
/// renewal's statements. Does nothing in a normal test run.
#[test]
fn frozen_holder() {
    let Ok(prefix) = std::env::var(CHILD) else {
        return;
    };
    let _scenario = fail::FailScenario::setup();
    let holder = leasehold::LockRegistry::mysql(common::mysql_url())
        .prefix(prefix)
        .time_to_live(TTL)
        .connect_timeout(Duration::from_secs(15))
        .build()
        .unwrap();
    fail::cfg_callback("mysql::renew_batch_between_statements", || {
        // SIGSTOP to this whole process, this thread included, from outside it.
        let _ = Command::new("kill")
            .args(["-STOP", &std::process::id().to_string()])
            .status();
    })
    .unwrap();
    let _guards: Vec<_> = KEYS
        .iter()
        .map(|key| holder.obtain(key).unwrap().lock().unwrap())
        .collect();
    println!("HELD");
    // Stopped at the first batch renewal; the parent kills it.
    std::thread::sleep(Duration::from_secs(120));
}

/// The child process holding `KEYS` on `f`'s table.
struct Holder(Child);

impl Holder {
    fn start(f: &Fixture) -> Holder {
        let child = Command::new(std::env::current_exe().unwrap())
            .args([
                "frozen_holder",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, &f.prefix)
            .stdout(Stdio::null())
            .spawn()
            .expect("the holder process");
        Holder(child)
    }

    /// Whether the process is stopped (`T` in `/proc/<pid>/stat`).
    fn stopped(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.0.id()))
            .ok()
            .and_then(|stat| {
                let (_, after_name) = stat.rsplit_once(')')?;
                after_name
                    .split_whitespace()
                    .next()
                    .map(|state| state == "T")
            })
            .unwrap_or(false)
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The holder stops after the first statement of its batch renewal and stays stopped; another
/// registry waits for each key and gets it once the holder's leases have run out, about one
/// time-to-live after the holder stopped.
#[test]
fn a_holder_frozen_inside_its_batch_renewal_blocks_its_keys_for_one_ttl_at_most() {
    let Some(f) = Fixture::new(Db::Mysql, "frozen_renewal") else {
        return;
    };
    let holder = Holder::start(&f);
    let until = Instant::now() + GENEROUS * 2;
    while !holder.stopped() {
        assert!(
            Instant::now() < until,
            "the holder process did not stop at its batch renewal"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let stopped_at = Instant::now();
    let other = f
        .builder()
        .time_to_live(TTL)
        .operation_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    for key in KEYS {
        let taken = other.obtain(key).unwrap().try_lock_for(GENEROUS);
        assert!(
            matches!(taken, Ok(Some(_))),
            "{key}: not taken {:?} after the holder stopped (its rows stay locked): {:?}",
            stopped_at.elapsed(),
            taken.map(|guard| guard.is_some())
        );
    }
    drop(holder);
}
