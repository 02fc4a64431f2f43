//! `leasehold`: run a command under a distributed lock, and inspect or administer the lock
//! table, from a shell or cron (feature `cli`).
//!
//! ```text
//! leasehold run --database sqlite:/var/lib/jobs/locks.db --key nightly-report --keep-for 5m -- ./report.sh
//! leasehold lead --group billing-scheduler -- ./scheduler
//! leasehold status --key nightly-report
//! leasehold list --key nightly-report --json
//! leasehold init --print
//! leasehold release --key nightly-report --force
//! leasehold cleanup --older-than 7d
//! ```
//!
//! Exit codes of `run` and `lead`: the command's own when it ran to its end with the lease
//! (leadership) held (128 + the signal's number when a signal ended it); otherwise one of the
//! codes below (see [`exit`]). Under `run` the command also sees `LEASEHOLD_KEY` and
//! `LEASEHOLD_FENCING_TOKEN` in its environment; under `lead`, `LEASEHOLD_GROUP`,
//! `LEASEHOLD_TERM` and `LEASEHOLD_FENCING_TOKEN` (the term).
//!
//! The command stays in leasehold's process group, so that it can read a terminal. A signal
//! sent to leasehold (`kill`) is forwarded to it; one a terminal generates (Ctrl-C) already
//! reaches the whole foreground group, so leasehold does not forward it a second time. A
//! signal sent to the whole group (`kill -TERM -PGID`) reaches the command twice. On Linux
//! the command also gets SIGTERM when leasehold itself dies (even by SIGKILL), because its lock
//! would run out and another instance could start.

#![deny(unsafe_code)]

use clap::{Args, Parser, Subcommand};
use leasehold::crossbeam_channel::{self, select};
use leasehold::{Error, LeaderElection, LockRegistry, LockRow, LockState, RegistryBuilder};
use std::ffi::OsString;
use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant, SystemTime};

/// The exit codes of `leasehold` itself (those of `sysexits.h` where one fits).
mod exit {
    /// The arguments are wrong, a key or a setting among them (`EX_USAGE`).
    pub const USAGE: u8 = 64;
    /// `leasehold` failed: the database could not be reached or refused, the table is
    /// missing (`EX_SOFTWARE`).
    pub const ERROR: u8 = 70;
    /// The lease (or leadership, under `lead`) was lost while the command ran (it was stopped)
    /// or before it ended: another instance may have run at the same time (`EX_IOERR`).
    pub const LOST: u8 = 74;
    /// The lock was held elsewhere: `--no-wait`, or `--wait` ran out (`EX_TEMPFAIL`).
    pub const BUSY: u8 = 75;
    /// The command was found but could not be started (as a shell reports it).
    pub const CANNOT_RUN: u8 = 126;
    /// The command was not found (as a shell reports it).
    pub const NOT_FOUND: u8 = 127;
    /// `status`: the key is free.
    pub const FREE: u8 = 1;
}

const AFTER_HELP: &str = "\
Exit codes of `run`: the command's own (128 + N when signal N ended it); 75 the lock was held \
elsewhere (--no-wait, or --wait ran out); 74 the lease was lost (the command was stopped, or \
ended after the loss); 70 leasehold failed (database, table); 64 bad arguments, keys or settings; \
126/127 the command could not be started / was not found. `lead` exits likewise: the command's \
own when it ended while leading; 74 when leadership was lost and --once (or a signal) ended \
the loop; 128 + N when signal N arrived while standing by.

SIGINT, SIGTERM and SIGHUP sent to leasehold go to the command; those a terminal sends \
(Ctrl-C, hangup) reach the command directly, in the same process group, and are not \
sent twice.";

/// Distributed locks in a SQL database for shell scripts and cron jobs.
#[derive(Parser, Debug)]
#[command(name = "leasehold", version, after_help = AFTER_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand, Debug)]
enum Commands {
    /// Run COMMAND while holding the lock KEY; renew it while COMMAND runs, release it after.
    Run(RunArgs),
    /// Run COMMAND while this instance leads GROUP; stop it when leadership is lost, then
    /// compete again (or exit, with --once).
    Lead(LeadArgs),
    /// Show who holds KEY (exit 0) or that it is free (exit 1).
    Status(KeyArgs),
    /// List the rows of the table and region: held, expired and released locks.
    List(ListArgs),
    /// Create the lock table and its deletion floor (or print their DDL with --print).
    Init(InitArgs),
    /// Free KEY whatever holds it; the holder learns at its next renewal.
    Release(ReleaseArgs),
    /// Delete rows released or expired longer ago than --older-than.
    Cleanup(CleanupArgs),
}

#[derive(Args, Debug)]
struct Database {
    /// The lock table's database: sqlite:PATH, postgres://USER@HOST:PORT/DB or
    /// mysql://USER@HOST:PORT/DB.
    #[arg(long, env = "LEASEHOLD_DATABASE_URL", value_name = "URL")]
    database: String,
    /// The table name prefix: the table is PREFIX + LOCK.
    #[arg(long, default_value = "INT_")]
    prefix: String,
    /// The region the locks live in.
    #[arg(long, default_value = "DEFAULT")]
    region: String,
    /// Only check the table; do not create it (and its deletion floor) when missing.
    #[arg(long)]
    no_create_table: bool,
    /// Report waiting, acquired, renewed, lost and released on stderr, with timestamps.
    #[arg(long, short)]
    verbose: bool,
}

#[derive(Args, Debug)]
struct KeyArgs {
    #[command(flatten)]
    database: Database,
    /// The lock's name.
    #[arg(long)]
    key: String,
}

#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    database: Database,
    /// The lock's name.
    #[arg(long)]
    key: String,
    /// How long the lock outlives a crash of this process (it is renewed every third of it).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// Give up after waiting this long for the lock (exit 75). Default: wait until granted.
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "no_wait")]
    wait: Option<Duration>,
    /// Give up at once if the lock is held elsewhere (exit 75).
    #[arg(long)]
    no_wait: bool,
    /// Keep the lock held until this long after it was granted, even when COMMAND ends
    /// sooner, so that another run of the job within the period finds it held.
    #[arg(long, value_parser = humantime::parse_duration)]
    keep_for: Option<Duration>,
    /// How long COMMAND has to end after SIGTERM, once the lease is lost, before SIGKILL.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    grace: Duration,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

#[derive(Args, Debug)]
struct LeadArgs {
    #[command(flatten)]
    database: Database,
    /// The group's name: every instance that may lead names the same group (it is the key of
    /// the lock the leader holds).
    #[arg(long)]
    group: String,
    /// How long leadership outlives a crash of this process (it is renewed every third of it;
    /// a leader that cannot renew stops the command with a tenth of it left).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// How often a standby tries to become leader.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    poll: Duration,
    /// How long COMMAND has to end after SIGTERM, once leadership is lost, before SIGKILL.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    grace: Duration,
    /// Exit (code 74) once leadership is lost and COMMAND has stopped, instead of standing by
    /// to lead again.
    #[arg(long)]
    once: bool,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

#[derive(Args, Debug)]
struct ReleaseArgs {
    #[command(flatten)]
    key: KeyArgs,
    /// Required: the lock is freed whoever holds it.
    #[arg(long)]
    force: bool,
}

#[derive(Args, Debug)]
struct ListArgs {
    #[command(flatten)]
    database: Database,
    /// A lock name to show instead of its lock key (the table keeps only a hash of each
    /// name); repeat for several. Rows of other names show their lock key.
    #[arg(long = "key", value_name = "NAME")]
    keys: Vec<String>,
    /// One JSON array of objects instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct InitArgs {
    #[command(flatten)]
    database: Database,
    /// Print the DDL for the database instead of running it (nothing is connected to).
    #[arg(long)]
    print: bool,
}

#[derive(Args, Debug)]
struct CleanupArgs {
    #[command(flatten)]
    database: Database,
    /// Delete rows released or expired longer ago than this (released rows count from their
    /// last grant).
    #[arg(long, value_parser = humantime::parse_duration)]
    older_than: Duration,
}

/// A failure of leasehold itself: one line, and the exit code.
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn new(code: u8, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Failure {
        let code = match error {
            Error::LeaseLost { .. } => exit::LOST,
            Error::InvalidKey { .. } | Error::InvalidSetting { .. } => exit::USAGE,
            _ => exit::ERROR,
        };
        Failure::new(code, error.to_string())
    }
}

/// Stderr reports of `--verbose`, and the library's warnings always.
struct Reporter {
    verbose: bool,
}

impl Reporter {
    fn say(&self, what: std::fmt::Arguments<'_>) {
        if self.verbose {
            eprintln!(
                "{} leasehold: {what}",
                humantime::format_rfc3339_millis(SystemTime::now())
            );
        }
    }
}

impl log::Log for Reporter {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Warn
            || (self.verbose && metadata.level() <= log::Level::Info)
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            eprintln!(
                "{} leasehold: {}: {}",
                humantime::format_rfc3339_millis(SystemTime::now()),
                record.level().as_str().to_ascii_lowercase(),
                record.args()
            );
        }
    }

    fn flush(&self) {}
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { exit::USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let verbose = match &cli.command {
        Commands::Run(a) => a.database.verbose,
        Commands::Lead(a) => a.database.verbose,
        Commands::Status(a) => a.database.verbose,
        Commands::List(a) => a.database.verbose,
        Commands::Init(a) => a.database.verbose,
        Commands::Release(a) => a.key.database.verbose,
        Commands::Cleanup(a) => a.database.verbose,
    };
    let reporter = Reporter { verbose };
    if log::set_logger(Box::leak(Box::new(Reporter { verbose }))).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
    let outcome = match cli.command {
        Commands::Run(args) => run(args, &reporter),
        Commands::Lead(args) => lead(args, &reporter),
        Commands::Status(args) => status(args),
        Commands::List(args) => list(args),
        Commands::Init(args) => init(args),
        Commands::Release(args) => release(args),
        Commands::Cleanup(args) => cleanup(args),
    };
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            eprintln!("leasehold: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

/// The URL names a database this build cannot reach.
#[cfg_attr(
    all(feature = "sqlite", feature = "postgres", feature = "mysql"),
    allow(dead_code)
)]
fn without(feature: &str) -> Failure {
    Failure::new(
        exit::USAGE,
        format!(
            "this leasehold was built without the `{feature}` feature; install it with \
             `cargo install leasehold --features cli,{feature}`"
        ),
    )
}

/// A registry on the database of `database`.
fn registry(database: &Database, ttl: Option<Duration>) -> Result<LockRegistry, Failure> {
    let mut builder = builder(database)?;
    if let Some(ttl) = ttl {
        builder = builder.time_to_live(ttl);
    }
    Ok(builder.build()?)
}

/// A registry builder for the database of `database`, with its prefix, region and client id.
fn builder(database: &Database) -> Result<RegistryBuilder, Failure> {
    let url = database.database.as_str();
    let builder = if let Some(path) = url.strip_prefix("sqlite:") {
        let path = path.strip_prefix("//").unwrap_or(path);
        if path.is_empty() {
            return Err(Failure::new(
                exit::USAGE,
                "the database URL sqlite: names no file: use sqlite:PATH, e.g. \
                 sqlite:/var/lib/jobs/locks.db",
            ));
        }
        #[cfg(feature = "sqlite")]
        {
            LockRegistry::sqlite(path)
        }
        #[cfg(not(feature = "sqlite"))]
        return Err(without("sqlite"));
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        #[cfg(feature = "postgres")]
        {
            LockRegistry::postgres(url)
        }
        #[cfg(not(feature = "postgres"))]
        return Err(without("postgres"));
    } else if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        #[cfg(feature = "mysql")]
        {
            LockRegistry::mysql(url.replacen("mariadb://", "mysql://", 1))
        }
        #[cfg(not(feature = "mysql"))]
        return Err(without("mysql"));
    } else {
        return Err(Failure::new(
            exit::USAGE,
            format!(
                "unknown database URL {url:?}: use sqlite:PATH, postgres://USER@HOST:PORT/DB or \
                 mysql://USER@HOST:PORT/DB (or set LEASEHOLD_DATABASE_URL)"
            ),
        ));
    };
    Ok(builder
        .client_id(client_id())
        .prefix(database.prefix.clone())
        .region(database.region.clone())
        .create_table(!database.no_create_table))
}

/// `HOST/PID/RANDOM` (at most 36 characters), so that `status` tells operators where the
/// holder runs; the random part keeps it unique when a pid is reused.
fn client_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host: String = host
        .trim()
        .chars()
        .filter(|c| c.is_ascii_graphic() && *c != '/')
        .take(18)
        .collect();
    let random = uuid::Uuid::new_v4().simple().to_string();
    let id = format!("{}/{}/{}", host, std::process::id(), &random[..8]);
    id.chars().take(36).collect()
}

fn status(args: KeyArgs) -> Result<u8, Failure> {
    let registry = registry(&args.database, None)?;
    let Some(holder) = registry.holder(&args.key)? else {
        println!("{}: free", args.key);
        return Ok(exit::FREE);
    };
    let (now, _) = registry.database_time()?;
    let left = holder.expires_at.duration_since(now).unwrap_or_default();
    println!(
        "{}: held by {} since {} (database clock, UTC), expires in {}, fencing token {}",
        args.key,
        holder.client_id,
        humantime::format_rfc3339_millis(holder.acquired),
        rounded(left),
        holder.fencing_token
    );
    Ok(0)
}

/// A duration for people: tenths of a second under 10 s, whole seconds above (`1h 5m 3s`).
fn rounded(duration: Duration) -> String {
    if duration < Duration::from_secs(10) {
        format!("{:.1}s", duration.as_secs_f64())
    } else {
        humantime::format_duration(Duration::from_secs(duration.as_secs())).to_string()
    }
}

/// How long until `row` expires (or how long ago it did), seen at `now` on the database clock.
fn expires_in(row: &LockRow, now: SystemTime) -> String {
    match row.state {
        LockState::Released => "-".into(),
        _ => match row.expires_at.duration_since(now) {
            Ok(left) => rounded(left),
            Err(past) => format!("{} ago", rounded(past.duration())),
        },
    }
}

fn list(args: ListArgs) -> Result<u8, Failure> {
    let registry = registry(&args.database, None)?;
    let listing = registry.listing().resolving(&args.keys)?;
    let rows = listing.rows().collect::<leasehold::Result<Vec<_>>>()?;
    let (now, _) = registry.database_time()?;
    if args.json {
        println!("{}", rows_json(&rows, now));
    } else if rows.is_empty() {
        println!(
            "no locks in table {} (region {})",
            registry.table(),
            registry.region()
        );
    } else {
        print!("{}", rows_table(&rows, now));
    }
    Ok(0)
}

/// The rows as a table for people: one line each, columns padded to their widest cell.
fn rows_table(rows: &[LockRow], now: SystemTime) -> String {
    let header = [
        "KEY",
        "STATE",
        "HOLDER",
        "ACQUIRED (UTC)",
        "EXPIRES IN",
        "TOKEN",
    ];
    let mut lines: Vec<[String; 6]> = vec![header.map(String::from)];
    for row in rows {
        lines.push([
            row.label().to_string(),
            row.state.to_string(),
            row.client_id.clone().unwrap_or_else(|| "-".into()),
            humantime::format_rfc3339_millis(row.acquired).to_string(),
            expires_in(row, now),
            row.fencing_token.to_string(),
        ]);
    }
    let mut widths = [0; 6];
    for line in &lines {
        for (width, cell) in widths.iter_mut().zip(line) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for line in &lines {
        let cells: Vec<String> = line
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// `text` as a JSON string literal.
fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The rows as one JSON array: `key` (the name, or null when not resolved), `lock_key`,
/// `state`, `client_id` (null once released), `acquired` and `expires_at` (RFC 3339, UTC, on
/// the database clock; `expires_at` null once released), `expires_in_ms` (negative once
/// expired, null once released) and `fencing_token`.
fn rows_json(rows: &[LockRow], now: SystemTime) -> String {
    let optional = |text: Option<&str>| text.map_or_else(|| "null".into(), json_string);
    let objects: Vec<String> = rows
        .iter()
        .map(|row| {
            let released = row.state == LockState::Released;
            let expires_at =
                (!released).then(|| humantime::format_rfc3339_millis(row.expires_at).to_string());
            let expires_in_ms = if released {
                "null".to_string()
            } else {
                match row.expires_at.duration_since(now) {
                    Ok(left) => left.as_millis().to_string(),
                    Err(past) => format!("-{}", past.duration().as_millis()),
                }
            };
            format!(
                "{{\"key\":{},\"lock_key\":{},\"state\":{},\"client_id\":{},\"acquired\":{},\
                 \"expires_at\":{},\"expires_in_ms\":{},\"fencing_token\":{}}}",
                optional(row.name.as_deref()),
                json_string(&row.lock_key),
                json_string(row.state.as_str()),
                optional(row.client_id.as_deref()),
                json_string(&humantime::format_rfc3339_millis(row.acquired).to_string()),
                optional(expires_at.as_deref()),
                expires_in_ms,
                row.fencing_token
            )
        })
        .collect();
    format!("[{}]", objects.join(","))
}

fn init(args: InitArgs) -> Result<u8, Failure> {
    let builder = builder(&args.database)?;
    if args.print {
        print!("{}", builder.table_ddl()?);
        return Ok(0);
    }
    if args.database.no_create_table {
        return Err(Failure::new(
            exit::USAGE,
            "init creates the table: drop --no-create-table (or use --print to see the DDL)",
        ));
    }
    let registry = builder.create_table(true).build()?;
    println!(
        "table {} is ready on {} (with its deletion floor unless a warning said otherwise)",
        registry.table(),
        registry.backend_name()
    );
    Ok(0)
}

fn release(args: ReleaseArgs) -> Result<u8, Failure> {
    if !args.force {
        return Err(Failure::new(
            exit::USAGE,
            "release frees the lock whoever holds it: add --force to do that (the holder \
             learns at its next renewal, and may act until then)",
        ));
    }
    let registry = registry(&args.key.database, None)?;
    let holder = registry.holder(&args.key.key)?;
    if registry.force_release(&args.key.key)? {
        let by = holder.map_or_else(String::new, |h| format!(" from {}", h.client_id));
        println!("{}: released{by}", args.key.key);
    } else {
        println!("{}: was free", args.key.key);
    }
    Ok(0)
}

fn cleanup(args: CleanupArgs) -> Result<u8, Failure> {
    let registry = registry(&args.database, None)?;
    let deleted = registry.delete_released_and_expired(args.older_than)?;
    println!("deleted {deleted} rows");
    Ok(0)
}

/// Sends `signal` to the child, unless it has been reaped (its pid may be reused then).
#[allow(unsafe_code)]
fn signal_child(child: &mut Child, signal: i32) {
    if matches!(child.try_wait(), Ok(None)) {
        let pid = child.id() as libc::pid_t;
        // SAFETY: kill(2) with a pid we spawned and have not reaped, so it is still ours.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

/// The exit code of a status: its code, or 128 + the signal that ended it.
fn code_of(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => (128 + signal) as u8,
        (None, None) => exit::ERROR,
    }
}

/// Starts `command` with `env`; on failure, the exit code a shell would give and a message.
fn spawn(command: &[OsString], env: &[(&str, String)]) -> Result<Child, (u8, String)> {
    let mut builder = Command::new(&command[0]);
    builder.args(&command[1..]);
    for (name, value) in env {
        builder.env(name, value);
    }
    stop_with_leasehold(&mut builder);
    builder.spawn().map_err(|e| {
        let code = match e.kind() {
            std::io::ErrorKind::NotFound => exit::NOT_FOUND,
            _ => exit::CANNOT_RUN,
        };
        (code, format!("cannot run {:?}: {e}", command[0]))
    })
}

/// Makes the command receive SIGTERM when leasehold dies (Linux's parent-death signal), so
/// that a SIGKILLed leasehold does not leave it running unprotected once the lease runs out.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn stop_with_leasehold(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    let leasehold = std::process::id();
    // SAFETY: the closure runs in the child between fork and exec and calls only prctl(2),
    // getppid(2) and kill(2), which are async-signal-safe; it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // leasehold may have died before the prctl: then nobody would signal.
            if libc::getppid() as u32 != leasehold {
                libc::kill(libc::getpid(), libc::SIGTERM);
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn stop_with_leasehold(_command: &mut Command) {}

/// What a loss channel reports: a lease's loss (`run`) or a term's (`lead`).
trait Loss {
    /// Why, for the message that stops the command.
    fn reason(&self) -> String;
}

impl Loss for leasehold::LeaseLost {
    fn reason(&self) -> String {
        self.reason.to_string()
    }
}

impl Loss for leasehold::LeadershipLost {
    fn reason(&self) -> String {
        self.reason.to_string()
    }
}

/// How a supervised command ended.
struct Ended {
    status: std::process::ExitStatus,
    /// The lease or leadership was lost while it ran (it was told to stop).
    lost: bool,
    /// A signal was forwarded to it.
    signalled: bool,
}

/// Waits for `child` to end, forwarding `signals` to it; when `losses` delivers, stops it with
/// SIGTERM and, after `grace`, SIGKILL. `what` names what can be lost in messages ("the lease
/// of \"KEY\""); `tick` runs about every 20 ms.
fn supervise<T: Loss>(
    child: &mut Child,
    losses: crossbeam_channel::Receiver<T>,
    signals: &crossbeam_channel::Receiver<Received>,
    grace: Duration,
    what: &str,
    reporter: &Reporter,
    mut tick: impl FnMut(),
) -> Result<Ended, Failure> {
    let mut losses = losses;
    let (mut lost_at, mut signalled): (Option<Instant>, bool) = (None, false);
    loop {
        select! {
            recv(losses) -> lost => {
                if let Ok(lost) = lost {
                    eprintln!(
                        "leasehold: lost {what} ({}); stopping the command with SIGTERM, then \
                         SIGKILL after {}",
                        lost.reason(),
                        humantime::format_duration(grace)
                    );
                    signal_child(child, libc::SIGTERM);
                    lost_at = Some(Instant::now());
                }
                losses = crossbeam_channel::never();
            },
            recv(signals) -> received => {
                if let Ok(received) = received {
                    signalled = true;
                    if received.from_terminal {
                        reporter.say(format_args!(
                            "signal {} came from the terminal, which sent it to the command too",
                            received.signal
                        ));
                    } else {
                        reporter.say(format_args!(
                            "forwarding signal {} to the command",
                            received.signal
                        ));
                        signal_child(child, received.signal);
                    }
                }
            },
            default(Duration::from_millis(20)) => {}
        }
        match child.try_wait() {
            Ok(Some(status)) => {
                return Ok(Ended {
                    status,
                    lost: lost_at.is_some(),
                    signalled,
                })
            }
            Ok(None) => {}
            Err(e) => {
                return Err(Failure::new(
                    exit::ERROR,
                    format!("waiting for the command: {e}"),
                ))
            }
        }
        if lost_at.is_some_and(|at| at.elapsed() >= grace) {
            eprintln!("leasehold: the command did not end after SIGTERM; sending SIGKILL");
            let _ = child.kill();
            lost_at = Some(Instant::now() + Duration::from_secs(3600));
        }
        if lost_at.is_none() {
            tick();
        }
    }
}

fn run(args: RunArgs, reporter: &Reporter) -> Result<u8, Failure> {
    let registry = registry(&args.database, Some(args.ttl))?;
    let lock = registry.obtain(&args.key)?;
    reporter.say(format_args!("waiting for {:?}", args.key));
    let guard = if args.no_wait {
        lock.try_lock()?
    } else if let Some(wait) = args.wait {
        lock.try_lock_for(wait)?
    } else {
        Some(lock.lock()?)
    };
    let Some(guard) = guard else {
        let holder = registry.holder(&args.key).ok().flatten();
        let by = holder.map_or_else(String::new, |h| format!(" by {}", h.client_id));
        eprintln!(
            "leasehold: {:?} is held{by}; not running the command",
            args.key
        );
        return Ok(exit::BUSY);
    };
    // From here on SIGINT, SIGTERM and SIGHUP go to the command (before, they end leasehold
    // as usual, and a grant in flight runs out after its time-to-live).
    let signals = forward_signals()?;
    let token = guard.fencing_token();
    reporter.say(format_args!(
        "acquired {:?} (fencing token {token})",
        args.key
    ));
    let env = [
        ("LEASEHOLD_KEY", args.key.clone()),
        ("LEASEHOLD_FENCING_TOKEN", token.to_string()),
    ];
    let mut child = match spawn(&args.command, &env) {
        Ok(child) => child,
        Err((code, message)) => {
            let released = guard.unlock();
            eprintln!("leasehold: {message}");
            released?;
            return Ok(code);
        }
    };
    let mut remaining = guard.remaining();
    let ended = supervise(
        &mut child,
        guard.loss_channel(),
        &signals,
        args.grace,
        &format!("the lease of {:?}", args.key),
        reporter,
        || {
            let now_remaining = guard.remaining();
            if now_remaining > remaining + Duration::from_millis(1) {
                reporter.say(format_args!(
                    "renewed {:?} ({} left)",
                    args.key,
                    rounded(now_remaining)
                ));
            }
            remaining = now_remaining;
        },
    )?;
    let code = code_of(ended.status);
    reporter.say(format_args!("the command ended with exit code {code}"));
    let released = match args.keep_for {
        Some(keep) => guard.unlock_keeping_for(keep),
        None => guard.unlock(),
    };
    match released {
        Ok(()) if !ended.lost => {
            match args.keep_for {
                Some(keep) => reporter.say(format_args!(
                    "released {:?}, kept held until {} after the grant",
                    args.key,
                    humantime::format_duration(keep)
                )),
                None => reporter.say(format_args!("released {:?}", args.key)),
            }
            Ok(code)
        }
        Ok(()) | Err(Error::LeaseLost { .. }) => {
            if !ended.lost {
                eprintln!(
                    "leasehold: the lease of {:?} was lost before the command ended (exit code \
                     {code}); another instance may have run at the same time",
                    args.key
                );
            }
            Ok(exit::LOST)
        }
        Err(e) => {
            eprintln!(
                "leasehold: the command ended (exit code {code}) but releasing {:?} failed: {e}; \
                 the lock runs out after its time-to-live",
                args.key
            );
            Ok(exit::ERROR)
        }
    }
}

fn lead(args: LeadArgs, reporter: &Reporter) -> Result<u8, Failure> {
    let election = LeaderElection::builder(builder(&args.database)?, args.group.clone())
        .lease_duration(args.ttl)
        .lock_acquire_sleep_interval(args.poll)
        .build()?;
    // Caught from the start: while standing by, a signal ends leasehold (128 + its number);
    // while the command runs, it goes to the command.
    let signals = forward_signals()?;
    let group = &args.group;
    loop {
        reporter.say(format_args!("standing by for the leadership of {group:?}"));
        let leadership = loop {
            if let Ok(received) = signals.try_recv() {
                reporter.say(format_args!(
                    "signal {} while standing by; exiting",
                    received.signal
                ));
                return Ok((128 + received.signal) as u8);
            }
            match election.try_acquire_for(args.poll) {
                Ok(Some(leadership)) => break leadership,
                Ok(None) => {}
                // The database failed the attempts of this round (the election logged each
                // one): a standby outlives outages, and tries again.
                Err(Error::Timeout { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        };
        let term = leadership.term();
        reporter.say(format_args!("leading {group:?} (term {term})"));
        let env = [
            ("LEASEHOLD_GROUP", group.clone()),
            ("LEASEHOLD_TERM", term.to_string()),
            ("LEASEHOLD_FENCING_TOKEN", term.to_string()),
        ];
        let mut child = match spawn(&args.command, &env) {
            Ok(child) => child,
            Err((code, message)) => {
                let resigned = leadership.resign();
                eprintln!("leasehold: {message}");
                resigned?;
                return Ok(code);
            }
        };
        let ended = supervise(
            &mut child,
            leadership.loss_channel(),
            &signals,
            args.grace,
            &format!("the leadership of {group:?} (term {term})"),
            reporter,
            || {},
        )?;
        let code = code_of(ended.status);
        if !ended.lost {
            reporter.say(format_args!(
                "the command ended with exit code {code}; resigning"
            ));
            return match leadership.resign() {
                Ok(()) => Ok(code),
                Err(Error::LeaseLost { .. }) => {
                    eprintln!(
                        "leasehold: the leadership of {group:?} was lost before the command \
                         ended (exit code {code}); another instance may have led at the same time"
                    );
                    Ok(exit::LOST)
                }
                Err(e) => {
                    eprintln!(
                        "leasehold: the command ended (exit code {code}) but resigning {group:?} \
                         failed: {e}; the lease runs out after its time-to-live"
                    );
                    Ok(exit::ERROR)
                }
            };
        }
        drop(leadership);
        reporter.say(format_args!(
            "the command stopped with exit code {code} after the loss"
        ));
        if args.once || ended.signalled {
            return Ok(exit::LOST);
        }
    }
}

/// A signal leasehold caught.
#[derive(Debug, Clone, Copy)]
struct Received {
    signal: i32,
    /// Sent by the kernel for a terminal (Ctrl-C, hangup): it went to the whole
    /// foreground process group, the command included, so it is not forwarded again.
    from_terminal: bool,
}

/// SIGINT, SIGTERM and SIGHUP received by leasehold, for forwarding to the command.
fn forward_signals() -> Result<crossbeam_channel::Receiver<Received>, Failure> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    use signal_hook::iterator::exfiltrator::WithRawSiginfo;
    let mut signals =
        signal_hook::iterator::SignalsInfo::<WithRawSiginfo>::new([SIGINT, SIGTERM, SIGHUP])
            .map_err(|e| Failure::new(exit::ERROR, format!("cannot catch signals: {e}")))?;
    let (sender, receiver) = crossbeam_channel::unbounded();
    std::thread::Builder::new()
        .name("leasehold-signals".into())
        .spawn(move || {
            for info in signals.forever() {
                let received = Received {
                    signal: info.si_signo,
                    from_terminal: info.si_code == libc::SI_KERNEL,
                };
                if sender.send(received).is_err() {
                    break;
                }
            }
        })
        .map_err(|e| Failure::new(exit::ERROR, format!("cannot start a thread: {e}")))?;
    Ok(receiver)
}
