//! Reliability across processes: exclusion under load, a holder killed with SIGKILL, a holder
//! stalled with SIGSTOP past its time-to-live — on every compiled-in database.
//!
//! The other "instances" are child processes: this test binary re-runs itself with
//! `--exact child_process_entry --nocapture` and an environment variable naming the child's
//! role; without that variable `child_process_entry` returns at once. Children get the database,
//! table prefix and a scratch directory through the environment (see `stress::Config::export`).
//! Only processes started here are signalled, by PID, with the `kill` command.
//!
//! No assertion is on elapsed time except generous upper bounds that keep a broken build from
//! hanging; takeover times are printed for the record.

mod common;

#[allow(dead_code)]
#[path = "../examples/stress.rs"]
mod stress;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The environment variable that makes `child_process_entry` do something.
const ROLE: &str = "LEASEHOLD_RELIABILITY_ROLE";
/// The lock key a holder child takes.
const KEY: &str = "LEASEHOLD_RELIABILITY_KEY";
/// Which stress child this is.
const STRESS_CHILD: &str = "LEASEHOLD_STRESS_CHILD";
/// Bound on every wait for a child, so a broken build fails instead of hanging.
const GENEROUS: Duration = Duration::from_secs(60);

/// The entry point of every child process (see the module docs).
#[test]
fn child_process_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let config = stress::Config::from_env_and_args(&[]).expect("configuration from the parent");
    match role.as_str() {
        "stress" => {
            let index = std::env::var(STRESS_CHILD)
                .ok()
                .and_then(|i| i.parse().ok())
                .expect("stress child index");
            stress::child_main(index, &config).expect("stress child");
        }
        "holder" => children::hold_until_killed(&config),
        "stalled" => children::hold_then_stall(&config),
        other => panic!("unknown child role {other:?}"),
    }
}

/// What the child processes do.
mod children {
    use super::{announce, FencedResource, GENEROUS, KEY};
    use crate::stress::Config;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    fn key() -> String {
        std::env::var(KEY).expect("key from the parent")
    }

    /// Takes the lock (renewed in the background) and waits to be killed.
    pub fn hold_until_killed(config: &Config) {
        let registry = config.builder().unwrap().build().unwrap();
        let guard = registry.obtain(&key()).unwrap().lock().unwrap();
        announce(&format!("HOLDING {}", guard.fencing_token()));
        std::thread::sleep(GENEROUS);
        panic!("the parent was supposed to kill this holder");
    }

    /// Takes the lock, writes to the fenced resource, then waits for the parent to stop and
    /// resume this process; then tries a late write and reports what it learns.
    pub fn hold_then_stall(config: &Config) {
        let callbacks = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&callbacks);
        let registry = config
            .builder()
            .unwrap()
            .on_lease_lost(move |_| {
                counted.fetch_add(1, Ordering::SeqCst);
            })
            .build()
            .unwrap();
        let guard = registry.obtain(&key()).unwrap().lock().unwrap();
        let losses = guard.loss_channel();
        let resource = FencedResource::new(&config.dir);
        let token = guard.fencing_token();
        let first = resource.write(token, "stalled-first");
        announce(&format!("HOLDING {token} first_write_accepted={first}"));
        let resumed = config.dir.join("resumed");
        let give_up = Instant::now() + GENEROUS;
        while !resumed.exists() {
            assert!(Instant::now() < give_up, "never resumed");
            std::thread::sleep(Duration::from_millis(5));
        }
        // A resumed process carries on where it stopped: the write comes before any check.
        let late = resource.write(token, "stalled-late");
        let held = guard.is_held();
        let loss = match losses.recv_timeout(GENEROUS) {
            Ok(lost) if lost.fencing_token == token => format!("{:?}", lost.reason),
            Ok(lost) => format!("wrong-token:{}", lost.fencing_token),
            Err(e) => format!("none:{e}"),
        };
        let loss = loss.replace(' ', "_");
        // The callback runs on the registry's callback thread, after the loss channel fired.
        let until = Instant::now() + GENEROUS;
        while callbacks.load(Ordering::SeqCst) == 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        let unlock = match guard.unlock() {
            Ok(()) => "ok".to_string(),
            Err(e) if e.is_lease_lost() => "lease_lost".to_string(),
            Err(e) => format!("other:{e}").replace(' ', "_"),
        };
        announce(&format!(
            "REPORT late_write_accepted={late} is_held={held} loss={loss} callbacks={} \
             unlock={unlock}",
            callbacks.load(Ordering::SeqCst)
        ));
    }
}

/// Prints one line for the parent and flushes it at once.
fn announce(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
}

/// A resource that checks fencing tokens, shared by processes through files: a write is
/// accepted only if its token is at least the largest accepted so far. The check and the
/// write happen under an exclusive file lock, so the resource itself is linearizable; every
/// attempt is logged.
pub struct FencedResource {
    dir: PathBuf,
}

impl FencedResource {
    pub fn new(dir: &Path) -> FencedResource {
        FencedResource {
            dir: dir.to_path_buf(),
        }
    }

    /// Writes on behalf of `who` holding `token`; `true` if accepted.
    pub fn write(&self, token: u64, who: &str) -> bool {
        let guard = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.dir.join("resource.lock"))
            .unwrap();
        guard.lock().unwrap();
        let highest_path = self.dir.join("resource.highest");
        let highest: u64 = std::fs::read_to_string(&highest_path)
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(0);
        let accepted = token >= highest;
        if accepted {
            std::fs::write(&highest_path, token.to_string()).unwrap();
        }
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("resource.log"))
            .unwrap();
        let verdict = if accepted { "accepted" } else { "refused" };
        writeln!(log, "{verdict} {token} {who}").unwrap();
        guard.unlock().unwrap();
        accepted
    }

    /// Every attempt so far: (accepted, token, who).
    pub fn log(&self) -> Vec<(bool, u64, String)> {
        let text = std::fs::read_to_string(self.dir.join("resource.log")).unwrap_or_default();
        text.lines()
            .map(|line| {
                let fields: Vec<&str> = line.split(' ').collect();
                (
                    fields[0] == "accepted",
                    fields[1].parse().unwrap(),
                    fields[2].to_string(),
                )
            })
            .collect()
    }
}

/// A child process of this test binary, with its output collected line by line.
pub struct Spawned {
    child: Child,
    lines: crossbeam_channel::Receiver<String>,
    stderr: Arc<Mutex<String>>,
}

impl Spawned {
    /// Starts this test binary as a child in `role`, with `config` and `extra` in its
    /// environment.
    pub fn start(role: &str, config: &stress::Config, extra: &[(&str, String)]) -> Spawned {
        let mut command = child_command(role);
        config.export(&mut command);
        for (name, value) in extra {
            command.env(name, value);
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("starting a child process");
        let (sender, lines) = crossbeam_channel::unbounded();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut pipe = child.stderr.take().unwrap();
        let collected = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            while let Ok(n @ 1..) = pipe.read(&mut buffer) {
                collected
                    .lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buffer[..n]));
            }
        });
        Spawned {
            child,
            lines,
            stderr,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The rest of the first line containing `mark`; panics (with the child's stderr) if none
    /// comes within `within`.
    pub fn expect(&self, mark: &str, within: Duration) -> String {
        let give_up = Instant::now() + within;
        loop {
            match self.lines.recv_deadline(give_up) {
                Ok(line) => {
                    if let Some((_, rest)) = line.split_once(mark) {
                        return rest.trim().to_string();
                    }
                }
                Err(e) => panic!(
                    "child {} printed no {mark:?} ({e}); its stderr:\n{}",
                    self.pid(),
                    self.stderr.lock().unwrap()
                ),
            }
        }
    }

    /// Sends `signal` (e.g. `KILL`, `STOP`, `CONT`) to this child only.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -{signal} {} failed", self.pid());
    }

    /// Waits for the child to exit (killing it after `within`) and returns its status.
    pub fn wait(&mut self, within: Duration) -> ExitStatus {
        let give_up = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() >= give_up {
                let _ = self.child.kill();
                panic!(
                    "child {} did not exit within {within:?}; its stderr:\n{}",
                    self.pid(),
                    self.stderr.lock().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// This test binary, set up to run only `child_process_entry` in `role`.
fn child_command(role: &str) -> Command {
    let mut command = Command::new(std::env::current_exe().expect("the test binary"));
    command
        .args([
            "--exact",
            "child_process_entry",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(ROLE, role);
    command
}

/// `key=value` fields of a child's line.
fn fields(line: &str) -> std::collections::HashMap<String, String> {
    line.split_whitespace()
        .filter_map(|field| field.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

mod suite {
    use super::{fields, stress, FencedResource, Spawned, GENEROUS};
    use crate::common::{mysql_url, postgres_url, Db, Fixture};
    use std::os::unix::process::ExitStatusExt;
    use std::time::{Duration, Instant};

    /// Slack on top of TTL + idle_between_tries for a takeover: process start-up, a loaded
    /// machine, the acquire itself.
    const SLACK: Duration = Duration::from_secs(15);
    /// The `idle_between_tries` of `Fixture::builder`.
    const FIXTURE_IDLE: Duration = Duration::from_millis(20);

    /// The stress configuration for this fixture's table, with a scratch directory.
    fn config(f: &Fixture, dir: &tempfile::TempDir) -> stress::Config {
        let (db, target) = match f.db {
            Db::Sqlite => ("sqlite", f.sqlite_path().display().to_string()),
            Db::Postgres => ("postgres", postgres_url()),
            Db::Mysql => ("mysql", mysql_url()),
        };
        stress::Config::new(db, &target, &f.prefix, dir.path())
    }

    fn stress_child(index: usize) -> std::process::Command {
        let mut command = super::child_command("stress");
        command.env(super::STRESS_CHILD, index.to_string());
        command
    }

    pub fn exclusion_holds_under_load_across_processes(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config(f, &dir);
        config.processes = 3;
        config.threads = 3;
        config.keys = 3;
        config.duration = Duration::from_secs(6);
        let summary = stress::run(&mut config, &stress_child).unwrap();
        println!("{}", summary.line(&config));
        assert!(summary.failures.is_empty(), "{:?}", summary.failures);
        assert_eq!(summary.violations(), 0, "{}", summary.line(&config));
        assert!(summary.passed(), "{}", summary.line(&config));
        assert_eq!(summary.children.len(), config.processes);
        for (index, child) in summary.children.iter().enumerate() {
            assert!(child.sections > 0, "process {index} never got a lock");
        }
        let switches: u64 = summary.children.iter().map(|c| c.process_switches).sum();
        assert!(switches > 0, "the lock never moved between processes");
    }

    /// The stress driver's chaos (`--chaos 1`): while the run lasts, a random child is stopped
    /// (SIGSTOP, 0.5–3 s) or killed (SIGKILL) and replaced every 2–6 s; the records and the
    /// per-section counts must still show one holder at a time, a killed holder's record is
    /// taken over only by a larger token, and with pauses shorter than the time-to-live (10 s)
    /// no lease is lost. A 12 s run always has at least one such event.
    pub fn exclusion_holds_while_children_are_killed_and_paused(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config(f, &dir);
        config.processes = 3;
        config.threads = 2;
        config.keys = 3;
        config.chaos = true;
        config.duration = Duration::from_secs(12);
        let summary = stress::run(&mut config, &stress_child).unwrap();
        println!("{}", summary.line(&config));
        assert!(summary.failures.is_empty(), "{:?}", summary.failures);
        assert_eq!(summary.violations(), 0, "{}", summary.line(&config));
        assert!(summary.passed(), "{}", summary.line(&config));
        assert!(
            summary.pauses + summary.kills > 0,
            "no child was stopped or killed: {}",
            summary.line(&config)
        );
        assert_eq!(summary.kills, summary.replacements);
    }

    /// Lock sets of two keys each (`--sets 1`), overlapping in every combination and named in
    /// random orders, while children are stopped and killed: one holder per record at a time,
    /// no update lost, and no wait that ran out (a deadlock would).
    pub fn lock_sets_hold_while_children_are_killed_and_paused(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config(f, &dir);
        config.processes = 3;
        config.threads = 2;
        config.keys = 3;
        config.sets = true;
        config.chaos = true;
        config.duration = Duration::from_secs(12);
        let summary = stress::run(&mut config, &stress_child).unwrap();
        println!("{}", summary.line(&config));
        assert!(summary.failures.is_empty(), "{:?}", summary.failures);
        assert_eq!(summary.violations(), 0, "{}", summary.line(&config));
        assert!(summary.passed(), "{}", summary.line(&config));
        assert!(summary.sections() > 0, "no set was granted");
        assert!(
            summary.pauses + summary.kills > 0,
            "no child was stopped or killed: {}",
            summary.line(&config)
        );
    }

    /// Every key a semaphore of 2 permits, a record per permit: never two holders of
    /// one permit (so never more than 2 of a key), across processes and threads.
    pub fn semaphore_permits_hold_under_load_across_processes(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config(f, &dir);
        config.processes = 3;
        config.threads = 3;
        config.keys = 2;
        config.permits = 2;
        config.duration = Duration::from_secs(5);
        let summary = stress::run(&mut config, &stress_child).unwrap();
        println!("{}", summary.line(&config));
        assert!(summary.failures.is_empty(), "{:?}", summary.failures);
        assert!(summary.passed(), "{}", summary.line(&config));
        for (index, child) in summary.children.iter().enumerate() {
            assert!(child.sections > 0, "process {index} never got a permit");
        }
    }

    /// Every key a reader/writer lock, one acquire in four a write: a writer never
    /// runs beside a reader or another writer, across processes and threads.
    pub fn rw_locks_hold_under_load_across_processes(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config(f, &dir);
        config.processes = 3;
        config.threads = 3;
        config.keys = 2;
        config.rw = true;
        config.duration = Duration::from_secs(5);
        let summary = stress::run(&mut config, &stress_child).unwrap();
        println!("{}", summary.line(&config));
        assert!(summary.failures.is_empty(), "{:?}", summary.failures);
        assert!(summary.passed(), "{}", summary.line(&config));
        let writes: u64 = summary.children.iter().flat_map(|c| c.per_key.iter()).sum();
        assert!(writes > 0, "no write ran");
    }

    /// At random moments inside critical sections, every holder's deadline is no
    /// later than its row's expiry on the database clock and the row names it — with other
    /// time-to-lives handed over locally, manual renewals, slow loss callbacks and (servers)
    /// another session locking rows in the mix (see the stress driver's docs).
    pub fn the_holders_deadline_never_outruns_its_row(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config(f, &dir);
        config.processes = 2;
        config.threads = 3;
        config.keys = 3;
        config.duration = Duration::from_secs(6);
        config.mix = true;
        config.probe_every = 2;
        let summary = stress::run(&mut config, &stress_child).unwrap();
        println!("{}", summary.line(&config));
        assert!(summary.passed(), "{}", summary.line(&config));
        let probes: u64 = summary.children.iter().map(|c| c.probes).sum();
        assert!(probes > 0, "no probe compared a holder with its row");
    }

    /// The checker behind the stress run does see overlaps: with every process on a table of
    /// its own, nothing excludes them, and the run must fail.
    #[cfg(feature = "sqlite")]
    pub fn the_stress_checker_detects_processes_that_do_not_exclude_each_other(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config(f, &dir);
        config.processes = 2;
        config.threads = 2;
        config.keys = 1;
        config.work = Duration::from_micros(200);
        config.duration = Duration::from_secs(2);
        config.sabotage = true;
        let summary = stress::run(&mut config, &stress_child).unwrap();
        println!("{}", summary.line(&config));
        assert!(!summary.passed());
        assert!(summary.violations() > 0 || !summary.failures.is_empty());
    }

    pub fn a_killed_holder_is_taken_over_after_its_lease_expires(f: &Fixture) {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config(f, &dir);
        // Renewed every second: the check that nobody takes the lock from the live holder
        // survives a holder process that waits two seconds to run.
        config.ttl = Duration::from_secs(3);
        let taker = f.registry();
        let lock = taker.obtain("killed").unwrap();
        let mut last_token = 0;
        for trial in 0..3 {
            let mut holder = Spawned::start("holder", &config, &[(super::KEY, "killed".into())]);
            let token: u64 = holder.expect("HOLDING", GENEROUS).parse().unwrap();
            assert!(
                token > last_token,
                "trial {trial}: token {token} <= {last_token}"
            );
            assert!(
                lock.try_lock().unwrap().is_none(),
                "trial {trial}: taken while the holder lives"
            );
            holder.signal("KILL");
            let killed_at = Instant::now();
            let status = holder.wait(GENEROUS);
            assert_eq!(status.signal(), Some(9), "trial {trial}: {status}");
            let bound = config.ttl + FIXTURE_IDLE + SLACK;
            let guard = lock
                .try_lock_for(bound)
                .unwrap()
                .unwrap_or_else(|| panic!("trial {trial}: no takeover within {bound:?}"));
            println!(
                "{:?} trial {trial}: taken over {:?} after SIGKILL (TTL {:?})",
                f.db,
                killed_at.elapsed(),
                config.ttl
            );
            assert!(guard.fencing_token() > token);
            last_token = guard.fencing_token();
            guard.unlock().unwrap();
        }
    }

    pub fn a_stalled_holder_learns_it_lost_and_its_late_write_is_refused(f: &Fixture) {
        let taker = f.registry();
        let lock = taker.obtain("stalled").unwrap();
        for trial in 0..2 {
            let dir = tempfile::tempdir().unwrap();
            let mut config = config(f, &dir);
            config.ttl = Duration::from_secs(1);
            let resource = FencedResource::new(dir.path());
            let mut holder = Spawned::start("stalled", &config, &[(super::KEY, "stalled".into())]);
            let holding = holder.expect("HOLDING", GENEROUS);
            let stale_token: u64 = holding.split_whitespace().next().unwrap().parse().unwrap();
            assert_eq!(fields(&holding)["first_write_accepted"], "true");
            // On SQLite a process stopped inside a write transaction would keep the file locked
            // for everyone; the holder is idle here (its keeper runs for microseconds every
            // TTL/3), so that window is tiny.
            holder.signal("STOP");
            let stopped_at = Instant::now();
            let bound = config.ttl + FIXTURE_IDLE + SLACK;
            let taken = lock.try_lock_for(bound);
            let taken_after = stopped_at.elapsed();
            let guard = match taken {
                Ok(Some(guard)) => guard,
                other => {
                    holder.signal("CONT");
                    panic!("trial {trial}: no takeover from a stopped holder: {other:?}")
                }
            };
            println!(
                "{:?} trial {trial}: taken over {taken_after:?} after SIGSTOP (TTL {:?})",
                f.db, config.ttl
            );
            let token = guard.fencing_token();
            assert!(token > stale_token, "{token} <= {stale_token}");
            assert!(resource.write(token, "taker"));
            std::fs::write(dir.path().join("resumed"), "").unwrap();
            holder.signal("CONT");
            let report = fields(&holder.expect("REPORT", GENEROUS));
            let status = holder.wait(GENEROUS);
            assert!(status.success(), "{status}: {}", holder.stderr());
            assert_eq!(report["late_write_accepted"], "false", "{report:?}");
            assert_eq!(report["is_held"], "false", "{report:?}");
            assert!(report["loss"].starts_with("Expired") || report["loss"] == "NotOwner");
            assert_eq!(report["callbacks"], "1", "{report:?}");
            assert_eq!(report["unlock"], "lease_lost", "{report:?}");
            let log = resource.log();
            let verdicts: Vec<(bool, u64)> = log.iter().map(|(a, t, _)| (*a, *t)).collect();
            assert_eq!(
                verdicts,
                [(true, stale_token), (true, token), (false, stale_token)],
                "{log:?}"
            );
            assert!(guard.is_held(), "the taker kept its lease");
            guard.unlock().unwrap();
        }
    }
}

macro_rules! reliability {
    ($db:expr) => {
        crate::suite_for!($db;
            exclusion_holds_under_load_across_processes,
            the_holders_deadline_never_outruns_its_row,
            a_killed_holder_is_taken_over_after_its_lease_expires,
            a_stalled_holder_learns_it_lost_and_its_late_write_is_refused,
            semaphore_permits_hold_under_load_across_processes,
            rw_locks_hold_under_load_across_processes,
            exclusion_holds_while_children_are_killed_and_paused,
            lock_sets_hold_while_children_are_killed_and_paused,
        );
    };
}

#[cfg(feature = "sqlite")]
mod sqlite {
    reliability!(crate::common::Db::Sqlite);
    crate::suite_for!(crate::common::Db::Sqlite;
        the_stress_checker_detects_processes_that_do_not_exclude_each_other);
}

#[cfg(feature = "postgres")]
mod postgres {
    reliability!(crate::common::Db::Postgres);
}

#[cfg(feature = "mysql")]
mod mysql {
    reliability!(crate::common::Db::Mysql);
}
