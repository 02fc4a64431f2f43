//! Stress driver: P processes × T threads over K keys for a bounded time, checking that no two
//! holders are ever inside one key's critical section at once.
//!
//! Each process is one registry (one "instance") on a shared lock table; the driver re-runs its
//! own executable as the child processes. Inside every critical section a thread reads and
//! rewrites a per-key record file in a shared directory, deliberately *non-atomically*:
//!
//! 1. read the record; it must say "nobody inside", and its fencing token must not be larger
//!    than the one this thread holds (tokens never go backwards);
//! 2. write "I am inside" into it, yield, read it back: it must be unchanged;
//! 3. write it back with the counter plus one and "nobody inside".
//!
//! Two holders overlapping in time see each other's marker, a changed record, a half-written
//! file, or lose a counter update; at the end the driver checks that every key's counter equals
//! the number of critical sections the processes report for it. Any of these is a violation,
//! as is a lease lost, an error, or a wait that times out; the driver then exits non-zero.
//!
//! ```sh
//! cargo run --release --example stress                                  # SQLite, temp file
//! cargo run --release --example stress -- --processes 4 --threads 8 --keys 16 --seconds 60
//! cargo run --release --features postgres --example stress -- --url postgres://postgres@127.0.0.1:5432/test
//! cargo run --release --features mysql --example stress -- --url mysql://root@127.0.0.1:3306/test
//! ```
//!
//! Options (each also read from `LEASEHOLD_STRESS_<NAME>`, e.g. `LEASEHOLD_STRESS_SECONDS`):
//! `--processes` (3), `--threads` (4), `--keys` (4), `--seconds` (5), `--path` (SQLite file;
//! default a temporary one), `--url` (PostgreSQL or MySQL server instead of SQLite),
//! `--ttl-ms` (10000), `--idle-ms` (5), `--handoff-ms` (local handoff limit, 20; 0 = none),
//! `--work-us` (busy work inside each critical section, 0), `--prefix` (table prefix, default
//! `t<pid>_stress_`), `--dir` (directory for the record files; default a temporary one),
//! `--sabotage 1` (self-check of the detector: each process gets a table of its own, so the
//! processes do not exclude each other and the run must FAIL with violations).
//!
//! The last line printed is the summary, e.g.
//! `stress: PASS backend=SQLite processes=3 threads=4 keys=4 … critical_sections=… violations=0`.

use leasehold::{LockRegistry, RegistryBuilder};
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Prefix of the environment variables that carry the configuration to child processes.
const ENV: &str = "LEASEHOLD_STRESS_";
/// How long a thread waits for a lock before the wait counts as a failure.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);
/// How many violation details each process prints.
const MAX_DETAILS: usize = 10;
/// Marker of a child's result line on its standard output.
const RESULT_MARK: &str = "STRESS-CHILD";

/// What to run, shared by the parent and its children.
#[derive(Debug, Clone)]
pub struct Config {
    /// `sqlite`, `postgres` or `mysql`.
    pub db: String,
    /// SQLite file path or server URL.
    pub target: String,
    pub processes: usize,
    pub threads: usize,
    pub keys: usize,
    pub duration: Duration,
    pub ttl: Duration,
    pub idle: Duration,
    /// `None`: unlimited local handoffs.
    pub handoff_limit: Option<Duration>,
    pub work: Duration,
    pub prefix: String,
    /// Shared directory holding one record file per key.
    pub dir: PathBuf,
    /// When the children start, in ms since the Unix epoch (set by [`run`]).
    pub start_at_ms: u64,
    /// Detector self-check: every process uses a table of its own, so processes do *not*
    /// exclude each other and the run must report violations.
    pub sabotage: bool,
}

impl Config {
    /// Defaults for everything but where the database and the record directory are.
    pub fn new(db: &str, target: &str, prefix: &str, dir: &Path) -> Config {
        Config {
            db: db.to_string(),
            target: target.to_string(),
            processes: 3,
            threads: 4,
            keys: 4,
            duration: Duration::from_secs(5),
            ttl: Duration::from_secs(10),
            idle: Duration::from_millis(5),
            handoff_limit: Some(Duration::from_millis(20)),
            work: Duration::ZERO,
            prefix: prefix.to_string(),
            dir: dir.to_path_buf(),
            start_at_ms: 0,
            sabotage: false,
        }
    }

    /// A builder for this configuration's table.
    pub fn builder(&self) -> Result<RegistryBuilder, String> {
        let builder = match self.db.as_str() {
            #[cfg(feature = "sqlite")]
            "sqlite" => LockRegistry::sqlite(&self.target),
            #[cfg(feature = "postgres")]
            "postgres" => LockRegistry::postgres(self.target.clone()),
            #[cfg(feature = "mysql")]
            "mysql" => LockRegistry::mysql(self.target.clone()),
            other => {
                return Err(format!(
                    "database {other:?} is not compiled in (features: sqlite, postgres, mysql)"
                ))
            }
        };
        Ok(builder
            .prefix(self.prefix.clone())
            .time_to_live(self.ttl)
            .idle_between_tries(self.idle)
            .local_handoff_limit(self.handoff_limit)
            .pool_size(self.threads as u32 + 2))
    }

    /// Passes this configuration to a child process.
    pub fn export(&self, command: &mut Command) {
        let millis = |d: Duration| d.as_millis().to_string();
        let vars = [
            ("DB", self.db.clone()),
            ("TARGET", self.target.clone()),
            ("PROCESSES", self.processes.to_string()),
            ("THREADS", self.threads.to_string()),
            ("KEYS", self.keys.to_string()),
            ("SECONDS", self.duration.as_secs_f64().to_string()),
            ("TTL_MS", millis(self.ttl)),
            ("IDLE_MS", millis(self.idle)),
            ("HANDOFF_MS", self.handoff_limit.map_or("0".into(), millis)),
            ("WORK_US", self.work.as_micros().to_string()),
            ("PREFIX", self.prefix.clone()),
            ("DIR", self.dir.display().to_string()),
            ("START_AT_MS", self.start_at_ms.to_string()),
            ("SABOTAGE", u8::from(self.sabotage).to_string()),
        ];
        for (name, value) in vars {
            command.env(format!("{ENV}{name}"), value);
        }
    }

    /// Reads the configuration a parent exported, then `args` (`--name value` pairs) on top.
    pub fn from_env_and_args(args: &[String]) -> Result<Config, String> {
        let mut settings: HashMap<String, String> = std::env::vars()
            .filter_map(|(name, value)| Some((name.strip_prefix(ENV)?.to_string(), value)))
            .collect();
        let mut rest = args.iter();
        while let Some(arg) = rest.next() {
            let name = arg
                .strip_prefix("--")
                .ok_or_else(|| format!("unexpected argument {arg:?}"))?;
            let value = rest
                .next()
                .ok_or_else(|| format!("--{name} needs a value"))?;
            let name = name.to_ascii_uppercase().replace('-', "_");
            let name = match name.as_str() {
                "PATH" | "URL" => {
                    settings.insert("DB".into(), db_of(value).into());
                    "TARGET".to_string()
                }
                _ => name,
            };
            settings.insert(name, value.clone());
        }
        let text = |name: &str| settings.get(name).cloned();
        let number = |name: &str, default: u64| -> Result<u64, String> {
            text(name).map_or(Ok(default), |v| {
                v.parse()
                    .map_err(|_| format!("{name}: {v:?} is not a whole number"))
            })
        };
        let db = text("DB").unwrap_or_else(|| "sqlite".into());
        let target = text("TARGET").unwrap_or_default();
        let prefix = text("PREFIX").unwrap_or_else(|| format!("t{}_stress_", std::process::id()));
        let dir = PathBuf::from(text("DIR").unwrap_or_default());
        let mut config = Config::new(&db, &target, &prefix, &dir);
        config.processes = number("PROCESSES", 3)? as usize;
        config.threads = number("THREADS", 4)? as usize;
        config.keys = number("KEYS", 4)? as usize;
        if let Some(seconds) = text("SECONDS") {
            let seconds: f64 = seconds
                .parse()
                .map_err(|_| format!("SECONDS: {seconds:?} is not a number"))?;
            config.duration = Duration::try_from_secs_f64(seconds).map_err(|e| e.to_string())?;
        }
        config.ttl = Duration::from_millis(number("TTL_MS", 10_000)?);
        config.idle = Duration::from_millis(number("IDLE_MS", 5)?);
        config.handoff_limit = match number("HANDOFF_MS", 20)? {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        };
        config.work = Duration::from_micros(number("WORK_US", 0)?);
        config.start_at_ms = number("START_AT_MS", 0)?;
        config.sabotage = number("SABOTAGE", 0)? != 0;
        if config.processes == 0 || config.threads == 0 || config.keys == 0 {
            return Err("processes, threads and keys must be at least 1".into());
        }
        Ok(config)
    }

    fn record_path(&self, key: usize) -> PathBuf {
        self.dir.join(format!("key-{key}.record"))
    }
}

/// The database a `--path`/`--url` value names.
fn db_of(target: &str) -> &'static str {
    if target.starts_with("postgres://") || target.starts_with("postgresql://") {
        "postgres"
    } else if target.starts_with("mysql://") || target.starts_with("mariadb://") {
        "mysql"
    } else {
        "sqlite"
    }
}

/// One key's shared record: who is inside (`-` for nobody), how many critical sections ended,
/// the largest fencing token seen, and the process of the last holder.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    holder: String,
    counter: u64,
    token: u64,
    process: String,
}

impl Record {
    fn free() -> Record {
        Record {
            holder: "-".into(),
            counter: 0,
            token: 0,
            process: "-".into(),
        }
    }

    fn read(path: &Path) -> Result<Record, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("unreadable: {e}"))?;
        let fields: Vec<&str> = text.split_whitespace().collect();
        match fields[..] {
            [holder, counter, token, process] => Ok(Record {
                holder: holder.into(),
                counter: counter.parse().map_err(|_| format!("garbled: {text:?}"))?,
                token: token.parse().map_err(|_| format!("garbled: {text:?}"))?,
                process: process.into(),
            }),
            _ => Err(format!("garbled (half-written?): {text:?}")),
        }
    }

    fn write(&self, path: &Path) -> std::io::Result<()> {
        let text = format!(
            "{} {} {} {}\n",
            self.holder, self.counter, self.token, self.process
        );
        std::fs::write(path, text)
    }
}

/// What one child process did.
#[derive(Debug, Clone, Default)]
pub struct ChildReport {
    pub sections: u64,
    pub violations: u64,
    pub lost: u64,
    pub errors: u64,
    pub timeouts: u64,
    /// Critical sections that saw a larger token than the record's: a new database grant.
    pub new_tokens: u64,
    /// Critical sections whose previous holder was another process.
    pub process_switches: u64,
    pub grants: u64,
    pub acquires: u64,
    pub per_key: Vec<u64>,
}

impl ChildReport {
    fn line(&self, index: usize) -> String {
        let per_key: Vec<String> = self.per_key.iter().map(u64::to_string).collect();
        format!(
            "{RESULT_MARK} index={index} sections={} violations={} lost={} errors={} timeouts={} \
             new_tokens={} process_switches={} grants={} acquires={} per_key={}",
            self.sections,
            self.violations,
            self.lost,
            self.errors,
            self.timeouts,
            self.new_tokens,
            self.process_switches,
            self.grants,
            self.acquires,
            per_key.join(",")
        )
    }

    fn parse(line: &str) -> Option<ChildReport> {
        let fields: HashMap<&str, &str> = line
            .split_once(RESULT_MARK)?
            .1
            .split_whitespace()
            .filter_map(|field| field.split_once('='))
            .collect();
        let number = |name: &str| fields.get(name)?.parse().ok();
        Some(ChildReport {
            sections: number("sections")?,
            violations: number("violations")?,
            lost: number("lost")?,
            errors: number("errors")?,
            timeouts: number("timeouts")?,
            new_tokens: number("new_tokens")?,
            process_switches: number("process_switches")?,
            grants: number("grants")?,
            acquires: number("acquires")?,
            per_key: fields
                .get("per_key")?
                .split(',')
                .map(|n| n.parse().ok())
                .collect::<Option<Vec<u64>>>()?,
        })
    }
}

/// Counters shared by the threads of one child.
#[derive(Default)]
struct Tally {
    sections: AtomicU64,
    violations: AtomicU64,
    lost: AtomicU64,
    errors: AtomicU64,
    timeouts: AtomicU64,
    new_tokens: AtomicU64,
    process_switches: AtomicU64,
    details: Mutex<Vec<String>>,
}

impl Tally {
    fn problem(&self, counter: &AtomicU64, detail: String) {
        counter.fetch_add(1, Ordering::SeqCst);
        let mut details = self.details.lock().unwrap();
        if details.len() < MAX_DETAILS {
            eprintln!("stress: {detail}");
            details.push(detail);
        }
    }
}

/// A small deterministic generator, so the key order differs per thread without a dependency.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Runs one child process's share of the stress and prints its result line; returns the report.
pub fn child_main(index: usize, config: &Config) -> Result<ChildReport, String> {
    let builder = match config.sabotage {
        false => config.builder()?,
        true => config
            .builder()?
            .prefix(format!("{}c{index}_", config.prefix))
            .create_table(true),
    };
    let registry = builder
        .build()
        .map_err(|e| format!("child {index}: registry: {e}"))?;
    let wait = config.start_at_ms.saturating_sub(now_ms());
    thread::sleep(Duration::from_millis(wait));
    let end = Instant::now() + config.duration;
    let tally = Arc::new(Tally::default());
    let per_key: Arc<Vec<AtomicU64>> = Arc::new((0..config.keys).map(|_| 0.into()).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for worker in 0..config.threads {
        let (registry, tally, per_key, stop) = (
            registry.clone(),
            Arc::clone(&tally),
            Arc::clone(&per_key),
            Arc::clone(&stop),
        );
        let config = config.clone();
        workers.push(thread::spawn(move || {
            let me = format!("c{index}t{worker}");
            let process = format!("c{index}");
            let mut random = XorShift(
                0x9E37_79B9_7F4A_7C15 ^ ((index as u64) << 32) ^ (worker as u64 + 1) ^ now_ms(),
            );
            let locks: Vec<_> = (0..config.keys)
                .map(|key| registry.obtain(&format!("stress-{key}")))
                .collect::<Result<_, _>>()
                .expect("valid keys");
            while Instant::now() < end && !stop.load(Ordering::Relaxed) {
                let key = (random.next() % config.keys as u64) as usize;
                let guard = match locks[key].try_lock_for(ACQUIRE_TIMEOUT) {
                    Ok(Some(guard)) => guard,
                    Ok(None) => {
                        tally.problem(
                            &tally.timeouts,
                            format!("{me}: no grant of key {key} within {ACQUIRE_TIMEOUT:?}"),
                        );
                        continue;
                    }
                    Err(e) => {
                        tally.problem(&tally.errors, format!("{me}: lock key {key}: {e}"));
                        thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                };
                critical_section(&config, &tally, key, &me, &process, guard.fencing_token());
                per_key[key].fetch_add(1, Ordering::SeqCst);
                tally.sections.fetch_add(1, Ordering::SeqCst);
                if let Err(e) = guard.unlock() {
                    let counter = if e.is_lease_lost() {
                        &tally.lost
                    } else {
                        &tally.errors
                    };
                    tally.problem(counter, format!("{me}: unlock key {key}: {e}"));
                }
            }
        }));
    }
    let mut panicked = 0;
    for worker in workers {
        if worker.join().is_err() {
            panicked += 1;
        }
    }
    if panicked > 0 {
        tally.errors.fetch_add(panicked, Ordering::SeqCst);
    }
    let stats = registry.statistics();
    let load = |counter: &AtomicU64| counter.load(Ordering::SeqCst);
    let report = ChildReport {
        sections: load(&tally.sections),
        violations: load(&tally.violations),
        lost: load(&tally.lost),
        errors: load(&tally.errors),
        timeouts: load(&tally.timeouts),
        new_tokens: load(&tally.new_tokens),
        process_switches: load(&tally.process_switches),
        grants: stats.grants,
        acquires: stats.acquires,
        per_key: per_key.iter().map(load).collect(),
    };
    println!("{}", report.line(index));
    Ok(report)
}

/// The checked, non-atomic read-modify-write of one key's record (see the module docs).
fn critical_section(
    config: &Config,
    tally: &Tally,
    key: usize,
    me: &str,
    process: &str,
    token: u64,
) {
    let path = config.record_path(key);
    let before = match Record::read(&path) {
        Ok(record) => record,
        Err(e) => {
            tally.problem(&tally.violations, format!("{me} key {key}: record {e}"));
            Record::free()
        }
    };
    if before.holder != "-" {
        tally.problem(
            &tally.violations,
            format!("{me} key {key}: entered while {} was inside", before.holder),
        );
    }
    if token < before.token {
        tally.problem(
            &tally.violations,
            format!(
                "{me} key {key}: fencing token went backwards: {token} < {}",
                before.token
            ),
        );
    }
    if token > before.token {
        tally.new_tokens.fetch_add(1, Ordering::Relaxed);
    }
    if before.process != process && before.process != "-" {
        tally.process_switches.fetch_add(1, Ordering::Relaxed);
    }
    let inside = Record {
        holder: me.to_string(),
        counter: before.counter,
        token: token.max(before.token),
        process: process.to_string(),
    };
    if let Err(e) = inside.write(&path) {
        tally.problem(&tally.errors, format!("{me} key {key}: write record: {e}"));
    }
    thread::yield_now();
    if !config.work.is_zero() {
        let until = Instant::now() + config.work;
        while Instant::now() < until {
            std::hint::spin_loop();
        }
    }
    match Record::read(&path) {
        Ok(seen) if seen == inside => {}
        Ok(seen) => tally.problem(
            &tally.violations,
            format!("{me} key {key}: record changed while inside: {seen:?}"),
        ),
        Err(e) => tally.problem(&tally.violations, format!("{me} key {key}: record {e}")),
    }
    let done = Record {
        holder: "-".into(),
        counter: before.counter + 1,
        ..inside
    };
    if let Err(e) = done.write(&path) {
        tally.problem(&tally.errors, format!("{me} key {key}: write record: {e}"));
    }
}

/// The outcome of a whole run.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub backend: String,
    pub elapsed: Duration,
    pub children: Vec<ChildReport>,
    /// Problems found by the parent: failed children, counters that disagree, records left
    /// with a holder inside.
    pub failures: Vec<String>,
}

impl Summary {
    pub fn sections(&self) -> u64 {
        self.children.iter().map(|c| c.sections).sum()
    }

    fn total(&self, field: impl Fn(&ChildReport) -> u64) -> u64 {
        self.children.iter().map(field).sum()
    }

    /// Violations of exclusion or fencing, found by the children or by the final count.
    pub fn violations(&self) -> u64 {
        self.total(|c| c.violations)
    }

    /// `true` when nothing at all went wrong.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
            && self.total(|c| c.violations + c.lost + c.errors + c.timeouts) == 0
    }

    pub fn line(&self, config: &Config) -> String {
        let sections = self.sections();
        let rate = sections as f64 / self.elapsed.as_secs_f64().max(1e-9);
        format!(
            "stress: {} backend={} processes={} threads={} keys={} duration={:.2}s \
             critical_sections={sections} rate={rate:.0}/s violations={} lost={} errors={} \
             timeouts={} failures={} grants={} new_tokens={} process_switches={} acquires={}",
            if self.passed() { "PASS" } else { "FAIL" },
            self.backend,
            config.processes,
            config.threads,
            config.keys,
            self.elapsed.as_secs_f64(),
            self.violations(),
            self.total(|c| c.lost),
            self.total(|c| c.errors),
            self.total(|c| c.timeouts),
            self.failures.len(),
            self.total(|c| c.grants),
            self.total(|c| c.new_tokens),
            self.total(|c| c.process_switches),
            self.total(|c| c.acquires),
        )
    }
}

/// Creates the table and records, runs `config.processes` children made by `spawn(index)`
/// (which must end up calling [`child_main`] with the exported configuration), waits for
/// them, and checks the records.
pub fn run(config: &mut Config, spawn: &dyn Fn(usize) -> Command) -> Result<Summary, String> {
    let registry = config
        .builder()?
        .create_table(true)
        .build()
        .map_err(|e| format!("creating the lock table: {e}"))?;
    for key in 0..config.keys {
        Record::free()
            .write(&config.record_path(key))
            .map_err(|e| format!("record file in {}: {e}", config.dir.display()))?;
    }
    config.start_at_ms = now_ms() + 1000;
    let mut children = Vec::new();
    for index in 0..config.processes {
        let mut command = spawn(index);
        config.export(&mut command);
        command.stdout(Stdio::piped()).stdin(Stdio::null());
        let child = command
            .spawn()
            .map_err(|e| format!("starting child {index}: {e}"))?;
        children.push(child);
    }
    let started = Instant::now();
    let give_up = started + Duration::from_millis(1000) + config.duration + Duration::from_secs(90);
    let mut summary = Summary {
        backend: registry.backend_name().to_string(),
        ..Summary::default()
    };
    for (index, mut child) in children.into_iter().enumerate() {
        let mut stdout = child.stdout.take().expect("piped");
        let reader = thread::spawn(move || {
            let mut text = String::new();
            let _ = stdout.read_to_string(&mut text);
            text
        });
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() < give_up => thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
            }
        };
        let text = reader.join().unwrap_or_default();
        let report = text.lines().find_map(ChildReport::parse);
        match (status, report) {
            (Some(status), Some(report)) if status.success() => summary.children.push(report),
            (None, _) => summary
                .failures
                .push(format!("child {index} hung and was killed")),
            (Some(status), _) => summary.failures.push(format!(
                "child {index} ended with {status} without a result"
            )),
        }
    }
    summary.elapsed = config.duration.min(started.elapsed());
    for key in 0..config.keys {
        let reported: u64 = summary
            .children
            .iter()
            .filter_map(|c| c.per_key.get(key))
            .sum();
        match Record::read(&config.record_path(key)) {
            Ok(record) if record.holder != "-" => summary
                .failures
                .push(format!("key {key}: {} is still inside", record.holder)),
            Ok(record)
                if record.counter != reported && summary.children.len() == config.processes =>
            {
                summary.failures.push(format!(
                    "key {key}: counter {} but {reported} critical sections: updates were lost",
                    record.counter
                ))
            }
            Ok(_) => {}
            Err(e) => summary.failures.push(format!("key {key}: record {e}")),
        }
    }
    for failure in &summary.failures {
        eprintln!("stress: {failure}");
    }
    Ok(summary)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (child, options) = match args.first().map(String::as_str) {
        Some("--child") => (args.get(1).and_then(|i| i.parse().ok()), &args[2..]),
        _ => (None, &args[..]),
    };
    let mut config = match Config::from_env_and_args(options) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("stress: {e}");
            std::process::exit(2);
        }
    };
    if let Some(index) = child {
        if let Err(e) = child_main(index, &config) {
            eprintln!("stress: {e}");
            std::process::exit(1);
        }
        return;
    }
    // A scratch directory of this run's own (no dependency beyond leasehold), removed at the end.
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let scratch =
        std::env::temp_dir().join(format!("leasehold-stress-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&scratch).expect("a temporary directory");
    if config.target.is_empty() {
        config.target = scratch.join("locks.db").display().to_string();
    }
    if config.dir.as_os_str().is_empty() {
        config.dir = scratch.join("records");
    }
    std::fs::create_dir_all(&config.dir).expect("the record directory");
    let exe = std::env::current_exe().expect("the path of this executable");
    let spawn = |index: usize| {
        let mut command = Command::new(&exe);
        command.arg("--child").arg(index.to_string());
        command
    };
    let outcome = run(&mut config, &spawn);
    let _ = std::fs::remove_dir_all(&scratch);
    match outcome {
        Ok(summary) => {
            println!("{}", summary.line(&config));
            if !summary.passed() {
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("stress: {e}");
            std::process::exit(2);
        }
    }
}
