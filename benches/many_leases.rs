//! Many leases held by one registry: what holding them costs the process and the
//! database, and whether any is lost — also with the machine's cores kept busy.
//!
//! For every backend that is compiled in and answering (SQLite always; PostgreSQL and MariaDB
//! at `LEASEHOLD_POSTGRES_URL` / `LEASEHOLD_MYSQL_URL`, defaults as in the tests), and for 100,
//! 1,000 and 10,000 leases (PostgreSQL also 50,000), one registry with default settings takes
//! that many locks one after another on one thread, holds them for three times-to-live plus a
//! second, and lets them go. Then, *under load*, 100,000 leases the same way while three busy
//! processes (shell loops, each in a session of its own, so the scheduler weighs them as it
//! weighs other programs) keep the cores occupied from the end of the acquisitions until every
//! lease has been let go. The run records, in one line per backend and count:
//!
//! - **acquire**: how long taking all the locks took (one acquire statement each);
//! - **OS threads** of the process (`/proc/self/status` `Threads`) at the end and at the peak
//!   of the hold (the peak includes the six r2d2 workers of the previous run's registry, which
//!   end at their pool's next 30 s tick);
//! - **connections** the registry had open at the peak and at the end of the hold, counted by
//!   the server: PostgreSQL's `pg_stat_activity` by an `application_name` set in the URL,
//!   MariaDB's `PROCESSLIST` by a user of the benchmark's own (`leasehold_bench`, created with
//!   the URL's user, which needs `CREATE USER`). SQLite has no server: `–`;
//! - **RSS** (`VmRSS`) at the peak of the hold, and how much it grew from before the registry
//!   was built (the process's memory is not handed back between runs, so the growth of a large
//!   run after smaller ones understates it a little);
//! - **renewal statements per second** during the hold (`LockRegistry::statistics().renewals`:
//!   batches count one each), and how many lease renewals each carried on average (every lease
//!   is renewed every third of the time-to-live; fewer means renewals ran late);
//! - **client CPU** during the hold (`/proc/self/stat` `utime` + `stime`), as a share of one
//!   core;
//! - **leases lost**: `on_lease_lost` calls (with their reasons), and guards that no longer hold
//!   at the end; with losses, how many of them had been reported by the end of the hold.
//!
//! The lines go to stdout and to `target/many_leases.txt`, with a Markdown table for the
//! README. Criterion then times taking 100 and 1,000 locks in a row (`acquire_many/<backend>`),
//! releasing them untimed between samples.
//!
//! `cargo bench --all-features --bench many_leases`. Environment: `LEASEHOLD_BENCH_TTL_MS` (the
//! time-to-live, default 10,000: the registry's default; the hold lasts three of them plus a
//! second), `LEASEHOLD_BENCH_LEASES` (comma-separated counts, default `100,1000,10000`),
//! `LEASEHOLD_BENCH_POSTGRES_EXTRA` (counts run on PostgreSQL only, default `50000`),
//! `LEASEHOLD_BENCH_LOADED` (counts held under load on every backend, default `100000`; empty
//! for none), `LEASEHOLD_BENCH_HOGS` (busy processes under load, default 3),
//! `LEASEHOLD_BENCH_BACKENDS` (default `sqlite,postgres,mariadb`), `LEASEHOLD_BENCH_TRACE` (set:
//! a line a second from the end of the acquisitions to the last release). Without `--bench`
//! (`cargo test --benches`) it runs a smoke test: SQLite, 10 leases of 300 ms, and 10 under
//! one busy process.
//!
//! # Design notes
//!
//! - Renewals: the lease clock (one thread per process) hands each lease to its registry's
//!   renewer a sixteenth of its renewal period before it is due, together with every lease due
//!   within the next eighth, and the renewal workers (at most `renewal_pool_size`, two by
//!   default) renew them with one statement per 500 leases of one time-to-live. Leases taken
//!   one after another fall due one after another, so a statement carries the leases due
//!   within that window: leases taken faster than that fill whole batches, leases taken slowly
//!   travel a few at a time; the figures show it. Threads do not grow with leases.
//! - Under load: the registry needs a statement per 500 leases per renewal period (60 a second
//!   for 100,000 leases of 10 s) from a share of two cores. Renewals run late when that share
//!   is short; a lease is lost only when no renewal of its own is confirmed before its
//!   deadline (see "Bounds" in `src/lease/renewer.rs`), and each loss is reported within two
//!   looks of the lease clock after its deadline.
//! - Losses: the hold runs on a machine shared with the servers; a run during which other work
//!   starved the servers for seconds loses leases (the reasons are printed under the line).
//! - Connections: pools open connections on demand and close those idle for
//!   `idle_connection_timeout` (60 s), so the main pool holds what the acquiring thread used
//!   (one connection) and the renewal pool what the renewal workers used (up to two).
//! - Threads per registry: the renewal workers (on demand; one ends after a second without
//!   work); r2d2 starts three worker threads per pool (six per registry: they open connections
//!   and close idle ones); PostgreSQL adds the release listener's thread (no connection unless
//!   a thread waits); MySQL runs statements on statement threads, which end after 10 s without
//!   work. Per process: the lease clock.

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use leasehold::{LockGuard, LockRegistry, RegistryBuilder};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The table every run uses (prefix `BENCH_MANY_`): rows are released, not deleted, so later
/// runs take the same rows again.
const PREFIX: &str = "BENCH_MANY_";

/// A backend to run on: how to build a registry there and how to count its connections.
struct Target {
    name: &'static str,
    builder: Box<dyn Fn() -> RegistryBuilder>,
    census: Census,
    sizes: Vec<usize>,
}

/// Counts one registry's connections as the server sees them.
enum Census {
    None,
    #[cfg(feature = "postgres")]
    Postgres {
        admin: Box<postgres::Client>,
        application_name: String,
    },
    #[cfg(feature = "mysql")]
    Mysql {
        admin: Box<mysql::Conn>,
        user: String,
    },
}

impl Census {
    fn count(&mut self) -> Option<usize> {
        match self {
            Census::None => None,
            #[cfg(feature = "postgres")]
            Census::Postgres {
                admin,
                application_name,
            } => admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                    &[application_name],
                )
                .ok()
                .map(|row| row.get::<_, i64>(0) as usize),
            #[cfg(feature = "mysql")]
            Census::Mysql { admin, user } => {
                use mysql::prelude::Queryable;
                admin
                    .exec_first::<u64, _, _>(
                        "SELECT count(*) FROM information_schema.PROCESSLIST WHERE USER = ?",
                        (user.as_str(),),
                    )
                    .ok()
                    .flatten()
                    .map(|n| n as usize)
            }
        }
    }
}

/// One line of the report.
struct Figures {
    backend: &'static str,
    leases: usize,
    /// Busy processes beside the hold and the release.
    hogs: usize,
    ttl: Duration,
    acquire: Duration,
    held: Duration,
    threads_peak: u64,
    threads_end: u64,
    connections_peak: Option<usize>,
    connections_end: Option<usize>,
    rss_peak_kb: u64,
    rss_growth_kb: u64,
    renewals_per_second: f64,
    /// Lease renewals per renewal statement.
    leases_per_statement: f64,
    cpu_share: f64,
    lost: u64,
    /// Losses reported (`on_lease_lost` calls) by the end of the hold.
    lost_by_end: u64,
    /// Why leases were lost, with how many each.
    reasons: BTreeMap<String, u64>,
    not_held: usize,
    release: Duration,
}

/// A field of `/proc/self/status` (`Threads`, `VmRSS` in kB).
fn status(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// User + system CPU time of the process so far.
fn cpu_time(ticks_per_second: u64) -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    Duration::from_secs_f64(ticks as f64 / ticks_per_second as f64)
}

fn clock_ticks_per_second() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok()?.trim().parse().ok())
        .unwrap_or(100)
}

#[path = "../tests/common/cpu_hogs.rs"]
mod cpu_hogs;
use cpu_hogs::CpuHogs;

/// With `LEASEHOLD_BENCH_TRACE` set: a line a second from the end of the acquisitions to the
/// last release (statements and leases renewed, releases, the mean and longest renewal
/// statement, failed renewals, losses), so that a run that loses leases shows when and beside
/// what.
struct Trace {
    stop: Option<crossbeam_channel::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Trace {
    fn start(registry: &LockRegistry, lost: &Arc<AtomicU64>) -> Trace {
        if std::env::var_os("LEASEHOLD_BENCH_TRACE").is_none() {
            return Trace {
                stop: None,
                thread: None,
            };
        }
        let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
        let (registry, lost) = (registry.clone(), Arc::clone(lost));
        let thread = std::thread::spawn(move || {
            let started = Instant::now();
            let mut last = registry.statistics();
            while let Err(crossbeam_channel::RecvTimeoutError::Timeout) =
                stopped.recv_timeout(Duration::from_secs(1))
            {
                let now = registry.statistics();
                let statements = now.renewals - last.renewals;
                let mean = (now.renewal_time - last.renewal_time)
                    .checked_div(statements.max(1) as u32)
                    .unwrap_or_default();
                println!(
                    "  {:>5.0} s: {} renewal statements ({} leases renewed, {} failed, mean \
                     {mean:.0?}, longest so far {:.0?}), {} releases, {} held, {} lost",
                    started.elapsed().as_secs_f64(),
                    statements,
                    now.leases_renewed - last.leases_renewed,
                    now.renewals_failed - last.renewals_failed,
                    now.longest_renewal,
                    now.releases - last.releases,
                    now.held_leases,
                    lost.load(Ordering::Relaxed),
                );
                last = now;
            }
        });
        Trace {
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Takes `leases` locks with one registry on `target`, holds them for `hold`, measures, and
/// lets them go; `hogs` busy processes run from the end of the acquisitions until every lease
/// has been let go.
fn hold(
    target: &mut Target,
    leases: usize,
    hogs: usize,
    ttl: Duration,
    hold: Duration,
    ticks: u64,
) -> Figures {
    let lost = Arc::new(AtomicU64::new(0));
    let reasons = Arc::new(std::sync::Mutex::new(BTreeMap::<String, u64>::new()));
    let rss_before = status("VmRSS");
    let registry = {
        let (lost, reasons) = (Arc::clone(&lost), Arc::clone(&reasons));
        (target.builder)()
            .time_to_live(ttl)
            .on_lease_lost(move |event| {
                lost.fetch_add(1, Ordering::Relaxed);
                *reasons
                    .lock()
                    .unwrap()
                    .entry(event.reason.to_string())
                    .or_default() += 1;
            })
            .build()
            .expect("registry")
    };
    let started = Instant::now();
    let guards: Vec<LockGuard> = (0..leases)
        .map(|n| {
            registry
                .obtain(&format!("lease-{n}"))
                .unwrap()
                .lock()
                .expect("lock")
        })
        .collect();
    let acquire = started.elapsed();
    let busy = CpuHogs::start(hogs);
    let trace = Trace::start(&registry, &lost);
    let (before, cpu_before, held_since) = (registry.statistics(), cpu_time(ticks), Instant::now());
    let (mut threads_peak, mut rss_peak, mut connections_peak) = (0, 0, None::<usize>);
    loop {
        threads_peak = threads_peak.max(status("Threads"));
        rss_peak = rss_peak.max(status("VmRSS"));
        if let Some(now) = target.census.count() {
            connections_peak = Some(connections_peak.unwrap_or(0).max(now));
        }
        if held_since.elapsed() >= hold {
            break;
        }
        std::thread::sleep(
            Duration::from_millis(250).min(hold.saturating_sub(held_since.elapsed())),
        );
    }
    let held = held_since.elapsed();
    let after = registry.statistics();
    let renewals = after.renewals - before.renewals;
    let leases_renewed = after.leases_renewed - before.leases_renewed;
    let cpu = cpu_time(ticks).saturating_sub(cpu_before);
    let not_held = guards.iter().filter(|guard| !guard.is_held()).count();
    let lost_by_end = lost.load(Ordering::Relaxed);
    let threads_end = status("Threads");
    let connections_end = target.census.count();
    let released = Instant::now();
    for guard in guards {
        let _ = guard.unlock();
    }
    let release = released.elapsed();
    drop(trace);
    drop(busy);
    drop(registry);
    let reasons = std::mem::take(&mut *reasons.lock().unwrap());
    Figures {
        backend: target.name,
        leases,
        hogs,
        ttl,
        acquire,
        held,
        threads_peak,
        threads_end,
        connections_peak,
        connections_end,
        rss_peak_kb: rss_peak,
        rss_growth_kb: rss_peak.saturating_sub(rss_before),
        renewals_per_second: renewals as f64 / held.as_secs_f64(),
        leases_per_statement: leases_renewed as f64 / renewals.max(1) as f64,
        cpu_share: cpu.as_secs_f64() / held.as_secs_f64(),
        lost: lost.load(Ordering::Relaxed),
        lost_by_end,
        reasons,
        not_held,
        release,
    }
}

fn optional(count: Option<usize>) -> String {
    count.map_or("–".into(), |n| n.to_string())
}

impl Figures {
    fn line(&self) -> String {
        format!(
            "{:<10} {:>6} leases{}, ttl {:?}: acquired in {:.2} s, held {:.1} s: {} OS threads \
             (peak; {} at the end), {} connections (peak; {} at the end), RSS {:.1} MB (+{:.1} \
             MB), {:.2} renewal statements/s ({:.0} leases each), client CPU {:.1} % of a core, \
             {} lost, {} not held; released in {:.2} s",
            self.backend,
            self.leases,
            self.under_load(),
            self.ttl,
            self.acquire.as_secs_f64(),
            self.held.as_secs_f64(),
            self.threads_peak,
            self.threads_end,
            optional(self.connections_peak),
            optional(self.connections_end),
            self.rss_peak_kb as f64 / 1024.0,
            self.rss_growth_kb as f64 / 1024.0,
            self.renewals_per_second,
            self.leases_per_statement,
            self.cpu_share * 100.0,
            self.lost,
            self.not_held,
            self.release.as_secs_f64(),
        ) + &self.reported_by_end()
            + &self
                .reasons
                .iter()
                .map(|(reason, n)| format!("\n    {n} lost: {reason}"))
                .collect::<String>()
    }

    /// `, 3 CPU hogs` for a run under load.
    fn under_load(&self) -> String {
        match self.hogs {
            0 => String::new(),
            1 => ", 1 CPU hog".into(),
            n => format!(", {n} CPU hogs"),
        }
    }

    /// With losses: how many had reached `on_lease_lost` by the end of the hold.
    fn reported_by_end(&self) -> String {
        if self.lost == 0 && self.not_held == 0 {
            return String::new();
        }
        format!(
            "\n    {} of the {} not held had been reported by the end of the hold",
            self.lost_by_end, self.not_held
        )
    }

    fn row(&self) -> String {
        format!(
            "| {} | {} | {:.2} s | {} ({}) | {} | {:.0} MB (+{:.0} MB) | {:.1} ({:.0} {} each) \
             | {:.1} % | {} |",
            self.backend,
            thousands(self.leases) + &self.under_load(),
            self.acquire.as_secs_f64(),
            self.threads_end,
            self.threads_peak,
            optional(self.connections_peak),
            self.rss_peak_kb as f64 / 1024.0,
            self.rss_growth_kb as f64 / 1024.0,
            self.renewals_per_second,
            self.leases_per_statement,
            if self.leases_per_statement.round() == 1.0 {
                "lease"
            } else {
                "leases"
            },
            self.cpu_share * 100.0,
            self.lost.max(self.not_held as u64),
        )
    }
}

fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn counts(variable: &str, default: &str) -> Vec<usize> {
    std::env::var(variable)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .filter_map(|n| n.trim().replace('_', "").parse().ok())
        .collect()
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.into())
}

/// The backends that answer, each with its connection census.
fn targets(dir: &std::path::Path, sizes: &[usize], full: bool) -> Vec<Target> {
    let path = dir.join("many.db");
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(unused_mut))]
    let mut targets = vec![Target {
        name: "SQLite",
        builder: Box::new(move || {
            LockRegistry::sqlite(&path)
                .prefix(PREFIX)
                .create_table(true)
        }),
        census: Census::None,
        sizes: sizes.to_vec(),
    }];
    if !full {
        return targets;
    }
    #[cfg(feature = "postgres")]
    {
        let url = env_or(
            "LEASEHOLD_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432/test",
        );
        let application_name = format!("leasehold_bench_{}", std::process::id());
        let tagged = if !url.contains("://") {
            format!("{url} application_name={application_name}")
        } else if url.contains('?') {
            format!("{url}&application_name={application_name}")
        } else {
            format!("{url}?application_name={application_name}")
        };
        match postgres::Client::connect(&url, postgres::NoTls) {
            Ok(admin) => {
                let mut sizes = sizes.to_vec();
                sizes.extend(counts("LEASEHOLD_BENCH_POSTGRES_EXTRA", "50000"));
                targets.push(Target {
                    name: "PostgreSQL",
                    builder: Box::new(move || {
                        LockRegistry::postgres(tagged.clone())
                            .prefix(PREFIX)
                            .create_table(true)
                    }),
                    census: Census::Postgres {
                        admin: Box::new(admin),
                        application_name,
                    },
                    sizes,
                });
            }
            Err(e) => println!("PostgreSQL skipped: {e}"),
        }
    }
    #[cfg(feature = "mysql")]
    {
        use mysql::prelude::Queryable;
        let url = env_or("LEASEHOLD_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
        let user = "leasehold_bench";
        let prepared = mysql::Opts::from_url(&url)
            .map_err(|e| e.to_string())
            .and_then(|opts| {
                let database = opts.get_db_name().unwrap_or("test").to_string();
                let mut admin = mysql::Conn::new(opts).map_err(|e| e.to_string())?;
                // 'localhost' too: the driver may switch to the server's Unix socket.
                for host in ["%", "localhost"] {
                    admin
                        .query_drop(format!("CREATE USER IF NOT EXISTS '{user}'@'{host}'"))
                        .and_then(|()| {
                            admin.query_drop(format!(
                                "GRANT ALL ON `{database}`.* TO '{user}'@'{host}'"
                            ))
                        })
                        .map_err(|e| format!("a user of the benchmark's own: {e}"))?;
                }
                Ok(admin)
            });
        match prepared {
            Ok(admin) => {
                let rest = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
                let server = rest.rsplit_once('@').map_or(rest, |(_, server)| server);
                let bench_url = format!("mysql://{user}@{server}");
                targets.push(Target {
                    name: "MariaDB",
                    builder: Box::new(move || {
                        LockRegistry::mysql(bench_url.clone())
                            .prefix(PREFIX)
                            .create_table(true)
                    }),
                    census: Census::Mysql {
                        admin: Box::new(admin),
                        user: user.into(),
                    },
                    sizes: sizes.to_vec(),
                });
            }
            Err(e) => println!("MariaDB skipped: {e}"),
        }
    }
    targets
}

/// Criterion: taking `n` locks in a row, for 100 and 1,000.
fn time_acquisitions(c: &mut Criterion, targets: &[Target], sizes: &[usize]) {
    let mut group = c.benchmark_group("acquire_many");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for target in targets {
        let registry = (target.builder)().build().expect("registry");
        for &n in sizes {
            group.throughput(Throughput::Elements(n as u64));
            group.bench_with_input(BenchmarkId::new(target.name, n), &n, |b, &n| {
                b.iter_custom(|iterations| {
                    let mut taken = Duration::ZERO;
                    for _ in 0..iterations {
                        let started = Instant::now();
                        let guards: Vec<LockGuard> = (0..n)
                            .map(|i| {
                                registry
                                    .obtain(&format!("timed-{i}"))
                                    .unwrap()
                                    .lock()
                                    .unwrap()
                            })
                            .collect();
                        taken += started.elapsed();
                        for guard in guards {
                            guard.unlock().unwrap();
                        }
                    }
                    taken
                })
            });
        }
    }
    group.finish();
}

fn main() {
    let full = std::env::args().any(|arg| arg == "--bench");
    let mut c = Criterion::default().configure_from_args();
    let ttl = Duration::from_millis(
        std::env::var("LEASEHOLD_BENCH_TTL_MS")
            .ok()
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(if full { 10_000 } else { 300 }),
    );
    let sizes = if full {
        counts("LEASEHOLD_BENCH_LEASES", "100,1000,10000")
    } else {
        vec![10]
    };
    let (loaded, hogs) = if full {
        let hogs = std::env::var("LEASEHOLD_BENCH_HOGS")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(3);
        (counts("LEASEHOLD_BENCH_LOADED", "100000"), hogs)
    } else {
        (vec![10], 1)
    };
    let hold_for = ttl * 3 + Duration::from_secs(1);
    let ticks = clock_ticks_per_second();
    let dir = tempfile::tempdir().expect("temporary directory");
    let wanted = std::env::var("LEASEHOLD_BENCH_BACKENDS")
        .unwrap_or_else(|_| "sqlite,postgres,mariadb".into())
        .to_ascii_lowercase();
    let mut targets: Vec<Target> = targets(dir.path(), &sizes, full)
        .into_iter()
        .filter(|target| {
            let name = target.name.to_ascii_lowercase();
            wanted
                .split(',')
                .map(str::trim)
                .any(|w| !w.is_empty() && (name.starts_with(w) || w.starts_with(&name)))
        })
        .collect();
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .unwrap_or_default();
    let mut report = format!(
        "many_leases, {}: time-to-live {ttl:?}, each count held {hold_for:?}\n",
        date.trim()
    );
    let mut rows = Vec::new();
    for target in &mut targets {
        let runs = target.sizes.iter().map(|&leases| (leases, 0));
        let runs: Vec<(usize, usize)> = runs.chain(loaded.iter().map(|&n| (n, hogs))).collect();
        for (leases, hogs) in runs {
            let figures = hold(target, leases, hogs, ttl, hold_for, ticks);
            println!("{}", figures.line());
            writeln!(report, "{}", figures.line()).unwrap();
            rows.push(figures.row());
        }
    }
    report.push_str(
        "\n| backend | leases held | acquire all | OS threads at the end (peak) | connections \
         (peak) | RSS (growth) | renewal statements/s | client CPU | lost |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for row in rows {
        report.push_str(&row);
        report.push('\n');
    }
    println!("\n{report}");
    let out = std::path::Path::new(
        &std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into()),
    )
    .join("many_leases.txt");
    if full {
        match std::fs::write(&out, &report) {
            Ok(()) => println!("written to {}", out.display()),
            Err(e) => println!("could not write {}: {e}", out.display()),
        }
    }
    let timed: Vec<usize> = if full { vec![100, 1_000] } else { vec![10] };
    time_acquisitions(&mut c, &targets, &timed);
    c.final_summary();
}
