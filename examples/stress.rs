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
//! `--listener-url` (PostgreSQL: a direct URL for the release listener when `--url` is a
//! transaction-mode pooler), `--sabotage 1` (self-check of the detector: each process gets a
//! table of its own, so the processes do not exclude each other and the run must FAIL with
//! violations), `--probe N` (8; 0 = off), `--mix 1` (see below), `--permits N` (0 = locks)
//! `--rw 1`, `--sets 1` and `--chaos 1`.
//!
//! **Lock sets** (`--sets 1`): every acquire takes a lock set of two keys (a random key and
//! another one, named in a random order) and runs the critical section above on the record of
//! each, with that key's token. Sets of different threads and processes overlap in every
//! combination; a set that deadlocked would show as a wait that times out.
//!
//! **Reader/writer locks** (`--rw 1`): every key is a reader/writer lock; one acquire in four
//! takes the write side and runs the critical section above, the others take the read side
//! and only read the record, twice: it must say "nobody inside" and stay the same while they
//! hold it (a writer inside, or one that came in meanwhile, shows). The counters count writes.
//!
//! **Semaphores** (`--permits N`): every key is a semaphore of N permits instead of a lock, and
//! each of its permits has a record of its own, which the holder of that permit checks and
//! rewrites as above. A permit number outside 0..N, or two holders of one permit at once, is a
//! violation; so at most N holders of a key are ever inside. The deadline probe is for locks
//! only.
//!
//! **Chaos** (`--chaos 1`, any mode): while the run lasts, the parent picks a random child every
//! 2–6 s and either stops it (`SIGSTOP`, every thread of a holder) for 0.5–3 s and continues
//! it, or kills it (`SIGKILL`), reaps it, and starts a replacement child with a fresh index and
//! registry (which runs until the common end). A paused child must keep its leases (the pause
//! is far below the default 10 s time-to-live, renewals run every third of it); a lost lease
//! fails the run unless some pause lasted a time-to-live or longer. A killed child is handled
//! without loosening the check for anybody else:
//!
//! - Records name the process inside (pid) beside the holder and its token, and are rewritten
//!   in place, padded to one width, by a single `write` (a kill between a truncation and the
//!   write would leave an empty record nobody could attribute).
//! - Only after it has reaped a killed child does the parent append its pid and the time to
//!   the file `killed` in the record directory. A marker "inside" of such a pid is abandoned
//!   for a holder whose token is larger than the dead holder's (a later grant: the dead lease
//!   ran out first); for a reader (`--rw`), whose token orders its own slot's grants only, for
//!   one whose acquire returned after the reap (no overlap in time, but no proof of the
//!   lease's order: the next writer's token gives that). Any other marker is a violation, a
//!   killed holder's included.
//! - Children append every problem (violation, loss, error, timeout) to a file of their own as
//!   it happens, and the parent adds a killed child's to the totals.
//! - Every child appends one line per finished critical section (the record's number) to its
//!   own counts file, after the record's final write and before the release, so while it still
//!   holds the key (the cost per section is in the summary). The final check is then, for each
//!   record: reported ≤ counter ≤ reported + kills, where reported is the survivors' report
//!   plus the killed children's complete lines (each kill can leave at most the one section on
//!   a record it held: written but not yet appended); and over all records, the sections
//!   written but unreported are at most kills × threads (one in flight per thread). A
//!   survivor's counts file must equal its report. Records still marked by a killed holder at
//!   the end are allowed (`abandoned_at_end`).
//!
//! The summary line then adds pauses, the longest, pauses over the TTL, kills, replacements,
//! whether lost leases were allowed, abandoned markers taken over and left, the unreported
//! sections and the count file's cost per section.
//!
//! **The deadline probe.** In about one critical section in N, the holder compares its own view
//! with the row as the database has it (one statement, [`LockRegistry::holder`]): the row must
//! name this registry and the guard's token, and the time the guard still counts on
//! (`remaining()` read before and after the statement, less the statement's time) must not
//! exceed the time the row has left on the database clock. A probe that fails is a violation: it means a holder believed
//! it held a lock that another instance could already take.
//!
//! **The mix** (`--mix 1`) adds what could break that invariant: every acquire
//! asks for one of three time-to-lives (so local handoffs change it), one section in eight
//! renews by hand with another one, a second registry per process keeps losing short leases
//! (renewal off) to a loss callback that sleeps half a second, and on the servers a thread per
//! process locks a random key's row from another session (`SELECT … FOR UPDATE`) for up to
//! 30 ms every 100–300 ms.
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
    /// Probe the holder's deadline against the row in about one section in this many (0: off).
    pub probe_every: u64,
    /// Other time-to-lives, manual renewals, slow loss callbacks and row locks (module docs).
    pub mix: bool,
    /// PostgreSQL: where the release listener connects (`RegistryBuilder::listener_url`),
    /// when `target` is a transaction-mode pooler.
    pub listener_url: Option<String>,
    /// With N > 0, every key is a semaphore of N permits (a record per permit).
    pub permits: usize,
    /// Every key is a reader/writer lock (one acquire in four writes).
    pub rw: bool,
    /// The parent pauses and kills children while the run lasts (module docs, "Chaos").
    pub chaos: bool,
    /// Every acquire takes a lock set of two keys (module docs, "Lock sets").
    pub sets: bool,
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
            probe_every: 8,
            mix: false,
            listener_url: None,
            permits: 0,
            rw: false,
            chaos: false,
            sets: false,
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
        let builder = match &self.listener_url {
            Some(url) => builder.listener_url(url.clone()),
            None => builder,
        };
        Ok(builder
            .prefix(self.prefix.clone())
            .time_to_live(self.ttl)
            .idle_between_tries(self.idle)
            .tuning(leasehold::Tuning {
                turn_limit: self.handoff_limit,
                ..Default::default()
            })
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
            ("PROBE", self.probe_every.to_string()),
            ("MIX", u8::from(self.mix).to_string()),
            ("PERMITS", self.permits.to_string()),
            ("RW", u8::from(self.rw).to_string()),
            ("CHAOS", u8::from(self.chaos).to_string()),
            ("SETS", u8::from(self.sets).to_string()),
            (
                "LISTENER_URL",
                self.listener_url.clone().unwrap_or_default(),
            ),
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
        config.probe_every = number("PROBE", 8)?;
        config.mix = number("MIX", 0)? != 0;
        config.listener_url = text("LISTENER_URL").filter(|url| !url.is_empty());
        config.permits = number("PERMITS", 0)? as usize;
        config.rw = number("RW", 0)? != 0;
        config.chaos = number("CHAOS", 0)? != 0;
        config.sets = number("SETS", 0)? != 0;
        if config.rw && config.permits > 0 {
            return Err("--rw and --permits exclude each other".into());
        }
        if config.sets && (config.rw || config.permits > 0 || config.keys < 2) {
            return Err("--sets takes locks of at least two keys (no --rw, no --permits)".into());
        }
        if config.processes == 0 || config.threads == 0 || config.keys == 0 {
            return Err("processes, threads and keys must be at least 1".into());
        }
        Ok(config)
    }

    /// How many records there are: one per key, or one per permit of each key.
    fn records(&self) -> usize {
        self.keys * self.permits.max(1)
    }

    fn record_path(&self, key: usize) -> PathBuf {
        self.dir.join(format!("key-{key}.record"))
    }

    /// Chaos: the file where a child appends one line per finished critical section.
    fn counts_path(&self, index: usize) -> PathBuf {
        self.dir.join(format!("counts-{index}"))
    }

    /// Chaos: the file where a child appends its problems as they happen.
    fn problems_path(&self, index: usize) -> PathBuf {
        self.dir.join(format!("problems-{index}"))
    }

    /// Chaos: the file where the parent lists the children it killed, once reaped.
    fn killed_path(&self) -> PathBuf {
        self.dir.join("killed")
    }

    /// Chaos: the children the parent killed and reaped: pid → when it had reaped it (ms since
    /// the Unix epoch).
    fn killed(&self) -> HashMap<u32, u64> {
        std::fs::read_to_string(self.killed_path())
            .unwrap_or_default()
            .lines()
            .filter_map(|line| {
                let (pid, reaped) = line.split_once(' ')?;
                Some((pid.parse().ok()?, reaped.parse().ok()?))
            })
            .collect()
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
/// the largest fencing token seen (while someone is inside: that holder's own token, as a
/// smaller one is already a violation), and the process (name and pid) of the last holder.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    holder: String,
    counter: u64,
    token: u64,
    process: String,
    pid: u32,
}

/// Chaos: the width every record is padded to, so that it is rewritten in place by one
/// `write` without truncating the file first (a holder killed between a truncation and its
/// write would leave an empty record that no one could attribute).
const RECORD_WIDTH: usize = 96;

impl Record {
    fn free() -> Record {
        Record {
            holder: "-".into(),
            counter: 0,
            token: 0,
            process: "-".into(),
            pid: 0,
        }
    }

    fn read(path: &Path) -> Result<Record, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("unreadable: {e}"))?;
        let fields: Vec<&str> = text.split_whitespace().collect();
        match fields[..] {
            [holder, counter, token, process, pid] => Ok(Record {
                holder: holder.into(),
                counter: counter.parse().map_err(|_| format!("garbled: {text:?}"))?,
                token: token.parse().map_err(|_| format!("garbled: {text:?}"))?,
                process: process.into(),
                pid: pid.parse().map_err(|_| format!("garbled: {text:?}"))?,
            }),
            _ => Err(format!("garbled (half-written?): {text:?}")),
        }
    }

    /// Writes the record; `in_place` (chaos): padded to [`RECORD_WIDTH`] and written over the
    /// old one with a single `write`, else truncated and rewritten (the non-atomic original).
    fn write(&self, path: &Path, in_place: bool) -> std::io::Result<()> {
        let text = format!(
            "{} {} {} {} {}",
            self.holder, self.counter, self.token, self.process, self.pid
        );
        if !in_place {
            return std::fs::write(path, text + "\n");
        }
        use std::io::Write;
        let text = format!("{text:<width$}\n", width = RECORD_WIDTH - 1);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        file.write_all(text.as_bytes())
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
    /// Deadline probes that compared the holder with its row (violations count separately).
    pub probes: u64,
    /// Chaos: sections that found the marker of a killed holder and took it as abandoned.
    pub abandoned: u64,
    /// Chaos: time spent appending to the counts file, in total (ns).
    pub count_ns: u64,
    pub per_key: Vec<u64>,
}

impl ChildReport {
    fn line(&self, index: usize) -> String {
        let per_key: Vec<String> = self.per_key.iter().map(u64::to_string).collect();
        format!(
            "{RESULT_MARK} index={index} sections={} violations={} lost={} errors={} timeouts={} \
             new_tokens={} process_switches={} grants={} acquires={} probes={} abandoned={} \
             count_ns={} per_key={}",
            self.sections,
            self.violations,
            self.lost,
            self.errors,
            self.timeouts,
            self.new_tokens,
            self.process_switches,
            self.grants,
            self.acquires,
            self.probes,
            self.abandoned,
            self.count_ns,
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
            probes: number("probes")?,
            abandoned: number("abandoned")?,
            count_ns: number("count_ns")?,
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
    probes: AtomicU64,
    abandoned: AtomicU64,
    count_ns: AtomicU64,
    details: Mutex<Vec<String>>,
    /// Chaos: every problem is also appended here at once (`kind detail`), so that a killed
    /// child's problems still count.
    problems: Option<Mutex<std::fs::File>>,
}

impl Tally {
    fn problem(&self, counter: &AtomicU64, detail: String) {
        counter.fetch_add(1, Ordering::SeqCst);
        if let Some(problems) = &self.problems {
            use std::io::Write;
            let kinds = [
                (&self.violations, "violation"),
                (&self.lost, "lost"),
                (&self.errors, "error"),
                (&self.timeouts, "timeout"),
            ];
            let kind = kinds
                .iter()
                .find(|(c, _)| std::ptr::eq(*c, counter))
                .map_or("error", |(_, kind)| kind);
            let line = format!("{kind} {}\n", detail.replace('\n', " "));
            let _ = problems.lock().unwrap().write_all(line.as_bytes());
        }
        let mut details = self.details.lock().unwrap();
        if details.len() < MAX_DETAILS {
            eprintln!("stress: {detail}");
            details.push(detail);
        }
    }

    /// The guard an acquire of `what` returned, or `None` after counting why not (a wait that
    /// ran out, or an error, after which the worker pauses briefly).
    fn granted<T>(
        &self,
        me: &str,
        what: &str,
        acquired: leasehold::Result<Option<T>>,
    ) -> Option<T> {
        match acquired {
            Ok(Some(guard)) => Some(guard),
            Ok(None) => {
                self.problem(
                    &self.timeouts,
                    format!("{me}: no grant of {what} within {ACQUIRE_TIMEOUT:?}"),
                );
                None
            }
            Err(e) => {
                self.problem(&self.errors, format!("{me}: lock {what}: {e}"));
                thread::sleep(Duration::from_millis(10));
                None
            }
        }
    }

    /// Counts a failed renewal or release of `what`: a lost lease, or an error.
    fn failed(&self, me: &str, doing: &str, what: &str, e: leasehold::Error) {
        let counter = match e.is_lease_lost() {
            true => &self.lost,
            false => &self.errors,
        };
        self.problem(counter, format!("{me}: {doing} {what}: {e}"));
    }

    /// Chaos: appends `record` to this child's counts file while the section's lock is still
    /// held, so a killed child leaves at most this one section per record counted in the
    /// record but not in its file.
    fn count(&self, counts: Option<&Mutex<std::fs::File>>, me: &str, record: usize) {
        if let Some(counts) = counts {
            use std::io::Write;
            let started = Instant::now();
            let line = format!("{record}\n");
            if let Err(e) = counts.lock().unwrap().write_all(line.as_bytes()) {
                self.problem(&self.errors, format!("{me}: counts file: {e}"));
            }
            let spent = started.elapsed().as_nanos() as u64;
            self.count_ns.fetch_add(spent, Ordering::Relaxed);
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
    // The run ends at the same moment for every child, a replacement started late included.
    let end_ms = config.start_at_ms + config.duration.as_millis() as u64;
    let end = Instant::now() + Duration::from_millis(end_ms.saturating_sub(now_ms()));
    let counts = match config.chaos {
        true => Some(Arc::new(Mutex::new(
            std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(config.counts_path(index))
                .map_err(|e| format!("child {index}: counts file: {e}"))?,
        ))),
        false => None,
    };
    let problems = match config.chaos {
        true => Some(Mutex::new(
            std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(config.problems_path(index))
                .map_err(|e| format!("child {index}: problems file: {e}"))?,
        )),
        false => None,
    };
    let tally = Arc::new(Tally {
        problems,
        ..Tally::default()
    });
    let disturbances = match config.mix {
        true => start_disturbances(index, config, end)?,
        false => Vec::new(),
    };
    let per_key: Arc<Vec<AtomicU64>> = Arc::new((0..config.records()).map(|_| 0.into()).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for worker in 0..config.threads {
        let (registry, tally, per_key, stop, counts) = (
            registry.clone(),
            Arc::clone(&tally),
            Arc::clone(&per_key),
            Arc::clone(&stop),
            counts.clone(),
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
            let semaphores: Vec<_> = (0..config.keys)
                .filter(|_| config.permits > 0)
                .map(|key| registry.semaphore(&format!("stress-{key}"), config.permits as u32))
                .collect::<Result<_, _>>()
                .expect("valid semaphores");
            let rw_locks: Vec<_> = (0..config.keys)
                .filter(|_| config.rw)
                .map(|key| registry.rw_lock(&format!("stress-{key}")))
                .collect::<Result<_, _>>()
                .expect("valid reader/writer locks");
            let ttls = [config.ttl, config.ttl * 2 / 3, config.ttl / 2];
            while Instant::now() < end && !stop.load(Ordering::Relaxed) {
                let key = (random.next() % config.keys as u64) as usize;
                let ttl = match config.mix {
                    true => ttls[(random.next() % 3) as usize],
                    false => config.ttl,
                };
                if config.sets {
                    let other = (key + 1 + (random.next() % (config.keys as u64 - 1)) as usize)
                        % config.keys;
                    let mut names = [format!("stress-{key}"), format!("stress-{other}")];
                    if random.next().is_multiple_of(2) {
                        names.reverse();
                    }
                    let set = registry.lock_set(&names).expect("valid keys");
                    let what = format!("{names:?}");
                    let acquired = set.try_lock_for_with_ttl(ACQUIRE_TIMEOUT, ttl);
                    let Some(guard) = tally.granted(&me, &what, acquired) else {
                        continue;
                    };
                    for held in guard.guards() {
                        let record = held.key()["stress-".len()..]
                            .parse::<usize>()
                            .expect("a stress key");
                        critical_section(
                            &config,
                            &tally,
                            record,
                            &me,
                            &process,
                            held.fencing_token(),
                        );
                        per_key[record].fetch_add(1, Ordering::SeqCst);
                        tally.count(counts.as_deref(), &me, record);
                        tally.sections.fetch_add(1, Ordering::SeqCst);
                    }
                    if let Err(e) = guard.unlock() {
                        tally.failed(&me, "unlock", &what, e);
                    }
                    continue;
                }
                let acquired = match (semaphores.get(key), rw_locks.get(key)) {
                    (_, Some(rw)) if random.next().is_multiple_of(4) => rw
                        .try_write_for_with_ttl(ACQUIRE_TIMEOUT, ttl)
                        .map(|guard| guard.map(Held::Write)),
                    (_, Some(rw)) => rw
                        .try_read_for_with_ttl(ACQUIRE_TIMEOUT, ttl)
                        .map(|guard| guard.map(Held::Read)),
                    (Some(semaphore), None) => semaphore
                        .try_acquire_for_with_ttl(ACQUIRE_TIMEOUT, ttl)
                        .map(|permit| permit.map(Held::Permit)),
                    (None, None) => locks[key]
                        .try_lock_for_with_ttl(ACQUIRE_TIMEOUT, ttl)
                        .map(|guard| guard.map(Held::Lock)),
                };
                let granted_ms = now_ms();
                let what = format!("key {key}");
                let Some(guard) = tally.granted(&me, &what, acquired) else {
                    continue;
                };
                if config.mix && random.next().trailing_zeros() >= 3 {
                    let ttl = ttls[(random.next() % 3) as usize];
                    if let Err(e) = guard.renew_with_ttl(ttl) {
                        tally.failed(&me, "renew", &what, e);
                    }
                }
                let record = match &guard {
                    Held::Lock(_) | Held::Read(_) | Held::Write(_) => key,
                    Held::Permit(permit) if (permit.slot() as usize) < config.permits => {
                        key * config.permits + permit.slot() as usize
                    }
                    Held::Permit(permit) => {
                        tally.problem(
                            &tally.violations,
                            format!(
                                "{me} key {key}: permit {} of {}",
                                permit.slot(),
                                config.permits
                            ),
                        );
                        continue;
                    }
                };
                let probed = match &guard {
                    Held::Lock(lock_guard) => Some(lock_guard),
                    _ => None,
                };
                if let Some(guard) = probed
                    .filter(|_| config.probe_every > 0 && random.next() % config.probe_every < 1)
                {
                    match probe(&registry, guard) {
                        Ok(true) => {
                            tally.probes.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(false) => {}
                        Err(e) => tally.problem(&tally.violations, format!("{me} key {key}: {e}")),
                    }
                }
                if let Held::Read(_) = guard {
                    read_section(&config, &tally, record, &me, granted_ms);
                } else {
                    critical_section(
                        &config,
                        &tally,
                        record,
                        &me,
                        &process,
                        guard.fencing_token(),
                    );
                    per_key[record].fetch_add(1, Ordering::SeqCst);
                    tally.count(counts.as_deref(), &me, record);
                }
                tally.sections.fetch_add(1, Ordering::SeqCst);
                if let Err(e) = guard.unlock() {
                    tally.failed(&me, "unlock", &what, e);
                }
            }
        }));
    }
    let mut panicked = 0;
    for worker in disturbances {
        if worker.join().is_err() {
            panicked += 1;
        }
    }
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
        probes: load(&tally.probes),
        abandoned: load(&tally.abandoned),
        count_ns: load(&tally.count_ns),
        per_key: per_key.iter().map(load).collect(),
    };
    println!("{}", report.line(index));
    Ok(report)
}

/// The deadline probe (see the module docs): `Ok(true)` when it compared, `Ok(false)` when the
/// guard was no longer held (a loss, counted where it is reported), `Err` on a violation.
fn probe(registry: &LockRegistry, guard: &leasehold::LockGuard) -> Result<bool, String> {
    let started = Instant::now();
    let before = guard.remaining();
    let row = registry
        .holder(guard.key())
        .map_err(|e| format!("probe: {e}"))?;
    let elapsed = started.elapsed();
    let after = guard.remaining();
    if before.is_zero() || after.is_zero() {
        return Ok(false);
    }
    // The database read its clock at some instant X between the two reads of `remaining()`,
    // not necessarily at once: the statement may wait first (in a pooler's queue for a server
    // connection, for the server's lock on the row). The deadline may also move meanwhile (a
    // renewal with a longer time-to-live answering raises it, after the row was read). What the
    // holder certainly counted on at X is at least the smaller of the deadline's two readings
    // minus the whole statement's time: `before - elapsed` and `after`. Only beyond that is a
    // row's time left proof of a holder counting on time the row does not give it. (Comparing
    // `before` alone failed a probe that had waited 8 ms in PgBouncer's queue; `after` alone, a
    // probe during which a longer renewal of a handed-over lease answered.)
    let counted = before.saturating_sub(elapsed).min(after);
    let Some(row) = row else {
        return Err(format!(
            "probe: the holder counts on {counted:?} more, but the row is not held"
        ));
    };
    if row.client_id != registry.client_id() || row.fencing_token != guard.fencing_token() {
        return Err(format!(
            "probe: the row names {} with token {}, not this holder ({} with token {})",
            row.client_id,
            row.fencing_token,
            registry.client_id(),
            guard.fencing_token()
        ));
    }
    // SQLite keeps milliseconds: the row's expiry may be up to 1 ms short of what was sent.
    if counted > row.expires_in + Duration::from_millis(1) {
        return Err(format!(
            "probe: the holder counts on {counted:?} more, but the row expires in {:?} on the \
             database clock",
            row.expires_in
        ));
    }
    Ok(true)
}

/// The mix's disturbances for one child (see the module docs), running until `end`.
fn start_disturbances(
    index: usize,
    config: &Config,
    end: Instant,
) -> Result<Vec<thread::JoinHandle<()>>, String> {
    let mut threads = Vec::new();
    // Short leases, renewal off, lost one after another to a callback that sleeps.
    let losing = config
        .builder()?
        .renewal(false)
        .on_lease_lost(|_| thread::sleep(Duration::from_millis(500)))
        .build()
        .map_err(|e| format!("child {index}: losing registry: {e}"))?;
    threads.push(thread::spawn(move || {
        let lock = losing
            .obtain(&format!("stress-losing-{index}"))
            .expect("valid key");
        while Instant::now() < end {
            if let Ok(guard) = lock.lock_with_ttl(Duration::from_millis(200)) {
                let losses = guard.loss_channel();
                let _ = losses.recv_timeout(Duration::from_secs(5));
                drop(guard);
            }
        }
    }));
    if config.db != "sqlite" {
        let config = config.clone();
        threads.push(thread::spawn(move || row_locks(index, &config, end)));
    }
    Ok(threads)
}

/// Another session's row locks on the stress keys' rows, until `end` (servers only).
fn row_locks(index: usize, config: &Config, end: Instant) {
    let table = format!("{}LOCK", config.prefix);
    let mut random = XorShift(0x5DEE_CE66 ^ now_ms() ^ (index as u64 + 7));
    let mut session = RowLocker::connect(config);
    while Instant::now() < end {
        thread::sleep(Duration::from_millis(100 + random.next() % 200));
        let key =
            leasehold::lock_key_for(&format!("stress-{}", random.next() % config.keys as u64));
        let sql = format!("SELECT LOCK_KEY FROM {table} WHERE LOCK_KEY = '{key}' FOR UPDATE");
        let hold = Duration::from_millis(random.next() % 30);
        if let Some(session) = session.as_mut() {
            session.lock_for(&sql, hold);
        }
    }
}

/// A plain session of the server's own driver, outside leasehold.
enum RowLocker {
    #[cfg(feature = "postgres")]
    Postgres(Box<postgres::Client>),
    #[cfg(feature = "mysql")]
    Mysql(mysql::Conn),
}

impl RowLocker {
    fn connect(config: &Config) -> Option<RowLocker> {
        let connected = match config.db.as_str() {
            #[cfg(feature = "postgres")]
            "postgres" => postgres::Client::connect(&config.target, postgres::NoTls)
                .map(|client| RowLocker::Postgres(Box::new(client)))
                .map_err(|e| e.to_string()),
            #[cfg(feature = "mysql")]
            "mysql" => mysql::Opts::from_url(&config.target)
                .map_err(|e| e.to_string())
                .and_then(|opts| mysql::Conn::new(opts).map_err(|e| e.to_string()))
                .map(RowLocker::Mysql),
            other => Err(format!("no row locks on {other}")),
        };
        connected
            .map_err(|e| eprintln!("stress: row locker: {e}"))
            .ok()
    }

    /// Locks the row `sql` selects `FOR UPDATE` in a transaction held for `hold`.
    #[allow(unused_variables)]
    fn lock_for(&mut self, sql: &str, hold: Duration) {
        match self {
            #[cfg(feature = "postgres")]
            RowLocker::Postgres(client) => {
                if let Ok(mut transaction) = client.transaction() {
                    let _ = transaction.query(sql, &[]);
                    thread::sleep(hold);
                    let _ = transaction.rollback();
                }
            }
            #[cfg(feature = "mysql")]
            RowLocker::Mysql(conn) => {
                use mysql::prelude::Queryable;
                if conn.query_drop("START TRANSACTION").is_ok() {
                    let _ = conn.query_drop(sql);
                    thread::sleep(hold);
                    let _ = conn.query_drop("ROLLBACK");
                }
            }
            #[allow(unreachable_patterns)]
            _ => {}
        }
    }
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
        // Chaos: the marker of a holder the parent killed and reaped is abandoned for a holder
        // of a later grant (a larger token: the dead one's lease ran out first); any other
        // marker, a killed holder's seen with a token no larger included, is a violation.
        let dead = config.chaos && config.killed().contains_key(&before.pid);
        if dead && token > before.token {
            tally.abandoned.fetch_add(1, Ordering::Relaxed);
        } else {
            tally.problem(
                &tally.violations,
                format!(
                    "{me} key {key}: entered with token {token} while {} (pid {}{}, token {}) \
                     was inside",
                    before.holder,
                    before.pid,
                    if dead { ", killed" } else { "" },
                    before.token
                ),
            );
        }
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
        pid: std::process::id(),
    };
    if let Err(e) = inside.write(&path, config.chaos) {
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
    if let Err(e) = done.write(&path, config.chaos) {
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
    /// Chaos: children stopped and continued, the longest stop, stops of a TTL or longer.
    pub pauses: u64,
    pub longest_pause: Duration,
    pub pauses_over_ttl: u64,
    /// Chaos: what the killed children left: their problems and counts files.
    pub killed: Vec<ChildReport>,
    /// Chaos: children killed, and started in their place.
    pub kills: u64,
    pub replacements: u64,
    /// Chaos: records left with a killed holder's marker at the end.
    pub abandoned_at_end: u64,
    /// Chaos: sections counted in the records but reported by nobody (killed in flight).
    pub unreported: u64,
}

impl Summary {
    pub fn sections(&self) -> u64 {
        self.children.iter().map(|c| c.sections).sum()
    }

    /// Over the children that reported and (problems and counts only) the killed ones.
    fn total(&self, field: impl Fn(&ChildReport) -> u64) -> u64 {
        self.children.iter().chain(&self.killed).map(field).sum()
    }

    /// Violations of exclusion or fencing, found by the children or by the final count.
    pub fn violations(&self) -> u64 {
        self.total(|c| c.violations)
    }

    /// `true` when nothing at all went wrong. A lost lease is allowed only after a child was
    /// stopped for a time-to-live or longer (chaos), which must cost its leases.
    pub fn passed(&self) -> bool {
        let lost = match self.pauses_over_ttl {
            0 => self.total(|c| c.lost),
            _ => 0,
        };
        self.failures.is_empty() && self.total(|c| c.violations + c.errors + c.timeouts) + lost == 0
    }

    pub fn line(&self, config: &Config) -> String {
        let sections = self.sections();
        let rate = sections as f64 / self.elapsed.as_secs_f64().max(1e-9);
        let chaos = match config.chaos {
            false => String::new(),
            true => format!(
                " chaos=1 pauses={} longest_pause={:.2}s pauses_over_ttl={} kills={} \
                 replacements={} lost_allowed={} abandoned={} abandoned_at_end={} \
                 unreported={} count_us_per_section={:.2}",
                self.pauses,
                self.longest_pause.as_secs_f64(),
                self.pauses_over_ttl,
                self.kills,
                self.replacements,
                u8::from(self.pauses_over_ttl > 0),
                self.total(|c| c.abandoned),
                self.abandoned_at_end,
                self.unreported,
                self.children.iter().map(|c| c.count_ns).sum::<u64>() as f64
                    / 1000.0
                    / self
                        .children
                        .iter()
                        .flat_map(|c| &c.per_key)
                        .sum::<u64>()
                        .max(1) as f64,
            ),
        };
        format!(
            "stress: {} backend={} processes={} threads={} keys={} permits={} rw={} sets={} \
             duration={:.2}s \
             critical_sections={sections} rate={rate:.0}/s violations={} lost={} errors={} \
             timeouts={} failures={} grants={} new_tokens={} process_switches={} acquires={} \
             probes={}{chaos}",
            if self.passed() { "PASS" } else { "FAIL" },
            self.backend,
            config.processes,
            config.threads,
            config.keys,
            config.permits,
            u8::from(config.rw),
            u8::from(config.sets),
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
            self.total(|c| c.probes),
        )
    }
}

/// A child process the parent is running, with the thread reading its standard output.
struct Running {
    index: usize,
    child: std::process::Child,
    output: thread::JoinHandle<String>,
}

/// Sends `signal` (`STOP`, `CONT`) to `pid` with the system's `kill`.
fn signal(pid: u32, signal: &str) -> Result<(), String> {
    let status = Command::new("kill")
        .arg("-s")
        .arg(signal)
        .arg(pid.to_string())
        .status()
        .map_err(|e| format!("kill -s {signal} {pid}: {e}"))?;
    match status.success() {
        true => Ok(()),
        false => Err(format!("kill -s {signal} {pid}: {status}")),
    }
}

/// Lines per record in a child's counts file (chaos); a torn last line does not count.
fn read_counts(config: &Config, index: usize) -> Vec<u64> {
    let mut counts = vec![0; config.records()];
    let text = std::fs::read_to_string(config.counts_path(index)).unwrap_or_default();
    for line in text.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
        if let Some(count) = line
            .trim()
            .parse::<usize>()
            .ok()
            .and_then(|r| counts.get_mut(r))
        {
            *count += 1;
        }
    }
    counts
}

/// Creates the table and records, runs `config.processes` children made by `spawn(index)`
/// (which must end up calling [`child_main`] with the exported configuration), waits for
/// them, and checks the records. With `config.chaos`, pauses and kills children meanwhile,
/// replacing each killed one (module docs).
pub fn run(config: &mut Config, spawn: &dyn Fn(usize) -> Command) -> Result<Summary, String> {
    let registry = config
        .builder()?
        .create_table(true)
        .build()
        .map_err(|e| format!("creating the lock table: {e}"))?;
    for key in 0..config.records() {
        Record::free()
            .write(&config.record_path(key), config.chaos)
            .map_err(|e| format!("record file in {}: {e}", config.dir.display()))?;
    }
    config.start_at_ms = now_ms() + 1000;
    let start = |index: usize| -> Result<Running, String> {
        let mut command = spawn(index);
        config.export(&mut command);
        command.stdout(Stdio::piped()).stdin(Stdio::null());
        let mut child = command
            .spawn()
            .map_err(|e| format!("starting child {index}: {e}"))?;
        let mut stdout = child.stdout.take().expect("piped");
        let output = thread::spawn(move || {
            let mut text = String::new();
            let _ = stdout.read_to_string(&mut text);
            text
        });
        Ok(Running {
            index,
            child,
            output,
        })
    };
    let mut running = Vec::new();
    for index in 0..config.processes {
        running.push(start(index)?);
    }
    let started = Instant::now();
    let begin = started + Duration::from_millis(1000);
    let give_up = begin + config.duration + Duration::from_secs(90);
    let mut summary = Summary {
        backend: registry.backend_name().to_string(),
        ..Summary::default()
    };
    let mut killed = Vec::new();
    if config.chaos {
        let mut random = XorShift(0xC4A0_5EED ^ now_ms() ^ u64::from(std::process::id()));
        let mut next_index = config.processes;
        let end = begin + config.duration;
        thread::sleep(begin.saturating_duration_since(Instant::now()));
        loop {
            let gap = Duration::from_millis(2000 + random.next() % 4000);
            if Instant::now() + gap + Duration::from_secs(3) >= end {
                break;
            }
            thread::sleep(gap);
            let victim = (random.next() % running.len() as u64) as usize;
            let pid = running[victim].child.id();
            if random.next().is_multiple_of(2) {
                let pause = Duration::from_millis(500 + random.next() % 2500);
                signal(pid, "STOP")?;
                let stopped = Instant::now();
                thread::sleep(pause);
                signal(pid, "CONT")?;
                let paused = stopped.elapsed();
                eprintln!(
                    "stress: chaos: child {} stopped for {paused:?}",
                    running[victim].index
                );
                summary.pauses += 1;
                summary.longest_pause = summary.longest_pause.max(paused);
                if paused >= config.ttl {
                    summary.pauses_over_ttl += 1;
                }
            } else {
                let mut gone = running.swap_remove(victim);
                let _ = gone.child.kill();
                let _ = gone.child.wait();
                // Only now, with the process reaped and unable to write anything more.
                use std::io::Write;
                std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(config.killed_path())
                    .and_then(|mut file| writeln!(file, "{pid} {}", now_ms()))
                    .map_err(|e| format!("killed file: {e}"))?;
                let _ = gone.output.join();
                eprintln!("stress: chaos: child {} (pid {pid}) killed", gone.index);
                killed.push(gone.index);
                summary.kills += 1;
                running.push(start(next_index)?);
                next_index += 1;
                summary.replacements += 1;
            }
        }
    }
    let expected = running.len();
    for Running {
        index,
        mut child,
        output,
    } in running
    {
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
        let text = output.join().unwrap_or_default();
        let report = text.lines().find_map(ChildReport::parse);
        match (status, report) {
            (Some(status), Some(report)) if status.success() => {
                if config.chaos && read_counts(config, index) != report.per_key {
                    summary.failures.push(format!(
                        "child {index}: its counts file disagrees with its report"
                    ));
                }
                summary.children.push(report)
            }
            (None, _) => summary
                .failures
                .push(format!("child {index} hung and was killed")),
            (Some(status), _) => summary.failures.push(format!(
                "child {index} ended with {status} without a result"
            )),
        }
    }
    summary.elapsed = config.duration.min(started.elapsed());
    for &index in &killed {
        let text = std::fs::read_to_string(config.problems_path(index)).unwrap_or_default();
        let count = |kind: &str| {
            text.lines()
                .filter(|line| line.split_whitespace().next() == Some(kind))
                .count() as u64
        };
        summary.killed.push(ChildReport {
            violations: count("violation"),
            lost: count("lost"),
            errors: count("error"),
            timeouts: count("timeout"),
            per_key: read_counts(config, index),
            ..ChildReport::default()
        });
    }
    let killed_counts: Vec<Vec<u64>> = summary.killed.iter().map(|c| c.per_key.clone()).collect();
    let dead = config.killed();
    let kills = summary.kills;
    for key in 0..config.records() {
        let reported: u64 = summary
            .children
            .iter()
            .filter_map(|c| c.per_key.get(key))
            .chain(killed_counts.iter().map(|counts| &counts[key]))
            .sum();
        match Record::read(&config.record_path(key)) {
            Ok(record) if record.holder != "-" && dead.contains_key(&record.pid) => {
                summary.abandoned_at_end += 1
            }
            Ok(record) if record.holder != "-" => summary
                .failures
                .push(format!("key {key}: {} is still inside", record.holder)),
            _ => {}
        }
        match Record::read(&config.record_path(key)) {
            // A killed child may have ended one section on this record, still holding it,
            // and died before it appended the line: at most one per kill.
            Ok(record)
                if (record.counter < reported || record.counter > reported + kills)
                    && summary.children.len() == expected =>
            {
                summary.failures.push(format!(
                    "key {key}: counter {} but {reported} critical sections reported \
                     ({kills} killed children): updates were lost",
                    record.counter
                ))
            }
            Ok(record) => summary.unreported += record.counter.saturating_sub(reported),
            Err(e) => summary.failures.push(format!("key {key}: record {e}")),
        }
    }
    // And at most one per thread of each killed child over all records (two with lock sets).
    let per_thread = if config.sets { 2 } else { 1 };
    if summary.unreported > kills * config.threads as u64 * per_thread {
        summary.failures.push(format!(
            "{} sections ended in the records but not reported, more than {kills} killed \
             children × {} threads × {per_thread}",
            summary.unreported, config.threads
        ));
    }
    for failure in &summary.failures {
        eprintln!("stress: {failure}");
    }
    Ok(summary)
}

/// What a worker holds: a lock, a permit of a semaphore (`--permits`), or a side of a
/// reader/writer lock (`--rw`).
type Held = leasehold::AnyGuard;

/// A reader's look at `key`'s record (`--rw`): nobody inside, and unchanged while it reads.
/// `granted_ms`: when this reader's acquire returned (ms since the Unix epoch).
fn read_section(config: &Config, tally: &Tally, key: usize, me: &str, granted_ms: u64) {
    let path = config.record_path(key);
    // Chaos: a read token orders the grants of its slot only, so it proves nothing about a
    // writer; a killed writer's marker is abandoned for a reader whose acquire returned after
    // the parent had reaped that writer (the reader's section never ran while it lived). That
    // shows no overlap in time; unlike a token it does not show the grant came after the
    // writer's lease ran out (a reader may have waited since before the kill).
    let abandoned = |record: &Record| {
        config.chaos
            && config
                .killed()
                .get(&record.pid)
                .is_some_and(|&reaped_ms| reaped_ms < granted_ms)
    };
    let look = || match Record::read(&path) {
        Ok(record) if record.holder == "-" => Some(record),
        Ok(record) if abandoned(&record) => {
            tally.abandoned.fetch_add(1, Ordering::Relaxed);
            Some(record)
        }
        Ok(record) => {
            let inside = &record.holder;
            tally.problem(
                &tally.violations,
                format!("{me} key {key}: reading while writer {inside} was inside"),
            );
            None
        }
        Err(e) => {
            tally.problem(&tally.violations, format!("{me} key {key}: record {e}"));
            None
        }
    };
    let Some(before) = look() else { return };
    thread::yield_now();
    if !config.work.is_zero() {
        thread::sleep(config.work);
    }
    if let Some(after) = look() {
        if after != before {
            tally.problem(
                &tally.violations,
                format!("{me} key {key}: the record changed under a reader: {after:?}"),
            );
        }
    }
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
