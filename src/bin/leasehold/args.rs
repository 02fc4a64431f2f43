//! The command line: every subcommand and its options (clap's derive).

use clap::{Args, Parser, Subcommand};
use leasehold::{
    MAX_IDLE_BETWEEN_TRIES, MAX_PERMITS, MAX_TIMEOUT, MAX_TIME_TO_LIVE, MIN_TIME_TO_LIVE,
};
use std::ffi::OsString;
use std::time::Duration;

const AFTER_HELP: &str = "\
Exit codes of `run`: the command's own (128 + N when signal N ended it); 75 the lock was held \
elsewhere (--no-wait, or --wait ran out; flock(1) exits 1 then, and -E 1 does the same); 74 the \
lease was lost (the command was stopped, or ended after the loss); 70 leasehold failed \
(database, table); 64 bad arguments, keys or settings; 126/127 the command could not be \
started / was not found. `lead` exits likewise: the command's own when it ended while leading; \
74 when leadership was lost and --once (or a signal) ended the loop; 128 + N when signal N \
arrived while standing by.

Durations are seconds (10, 1.5), with units (500ms, 10m, 1h 30m) or ISO 8601 (PT10M, P1DT2H).

Only `init` creates the lock table (and an SQLite database file); `run` and `lead` create them \
only with --create. Every other command uses what exists, and exits 70 naming `leasehold init` \
when the table or file is missing: a mistyped --database or --prefix must not make a second, \
empty lock table in which the job runs beside another instance.

The command runs in a process group of its own, which gets the terminal when leasehold has \
it: Ctrl-C reaches the command once. SIGINT, SIGQUIT, SIGTERM and SIGHUP sent to leasehold go \
to the whole group; after a forwarded SIGTERM the group gets SIGKILL once --grace has passed \
(as `timeout -k` does). When the command ends, leasehold waits for what it left running in \
its group before it releases the lock; it takes the terminal back, says so on stderr after a \
second, and an interrupt (Ctrl-C, Ctrl-\\, SIGINT, SIGQUIT) then stops what is left: SIGTERM, \
then SIGKILL after --grace. SIGTSTP sent to leasehold stops the command's group, SIGCONT \
continues it; leasehold itself goes on renewing, and it stops itself (after Ctrl-Z on a \
terminal, or while no command runs) only between two database statements, never inside one. \
On a loss, and when leasehold dies (even by SIGKILL, through a watchdog process shown as \
`leasehold-watch` by `ps -e` and as `leasehold __watchdog` by `ps -ef`), the group gets \
SIGTERM, then SIGKILL after --grace; processes that leave the group (setsid) are not tracked.";

/// Distributed locks in a SQL database for shell scripts and cron jobs.
#[derive(Parser, Debug)]
#[command(name = "leasehold", version, after_help = AFTER_HELP)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Commands,
}

#[derive(Subcommand, Debug)]
pub enum Commands {
    /// Run COMMAND while holding the lock KEY; renew it while COMMAND runs, release it after.
    Run(RunArgs),
    /// Run COMMAND while this instance leads GROUP; stop it when leadership is lost, then
    /// compete again (or exit, with --once).
    Lead(LeadArgs),
    /// Show who holds KEY (exit 0) or that it is free (exit 1): the lock, and the permits of
    /// the semaphore and the readers and writer of the reader/writer lock of that name.
    Status(StatusArgs),
    /// List the rows of the table and region: held, expired and released locks.
    List(ListArgs),
    /// Create the lock table and its deletion floor (or print their DDL with --print).
    Init(InitArgs),
    /// Free KEY whatever holds it; the holder learns at its next renewal.
    Release(ReleaseArgs),
    /// Delete rows released or expired longer ago than --older-than.
    Cleanup(CleanupArgs),
    /// (Internal) the watchdog `run` and `lead` start: stops the command's process group
    /// when leasehold dies.
    #[command(name = "__watchdog", hide = true)]
    Watchdog(WatchdogArgs),
}

#[derive(Args, Debug, Clone)]
pub struct Database {
    /// The lock table's database: sqlite:PATH, postgres://USER@HOST:PORT/DB or
    /// mysql://USER@HOST:PORT/DB.
    #[arg(long, env = "LEASEHOLD_DATABASE_URL", value_name = "URL")]
    pub database: String,
    /// The table name prefix: the table is PREFIX + LOCK.
    #[arg(long, default_value = "INT_")]
    pub prefix: String,
    /// The region the locks live in.
    #[arg(long, default_value = "DEFAULT")]
    pub region: String,
    /// PostgreSQL behind a transaction-mode pooler (PgBouncer, RDS Proxy): a direct URL of the
    /// server for the release listener, so that waiters are woken at once (without it they
    /// poll, and a warning says so once).
    #[arg(long, env = "LEASEHOLD_LISTENER_URL", value_name = "URL")]
    pub listener_url: Option<String>,
    /// PostgreSQL straight to the server (or a session-mode pooler): prepare named statements
    /// once per connection, which saves the server planning each statement. Never through a
    /// transaction-mode pooler.
    #[arg(long)]
    pub prepared_statements: bool,
    /// Accepted and ignored: no command but `init` (and `run` or `lead` with --create)
    /// creates the table.
    #[arg(long, hide = true)]
    pub no_create_table: bool,
    /// Report waiting, acquired, renewed, lost and released on stderr, with timestamps.
    #[arg(long, short)]
    pub verbose: bool,
    /// How long leasehold waits for the database before it gives up (exit 70): to connect at
    /// the start, and then for each step (an attempt to take the lock, the release, a read of
    /// `status` or `list`), retries included; 1ms to 1 day. Default: 5s, and to connect the
    /// URL's own limit when it sets one (PostgreSQL's connect_timeout, in seconds; MySQL's
    /// tcp_connect_timeout_ms), per host. `run --wait` bounds connecting too.
    #[arg(long, value_name = "DURATION", value_parser = db_timeout, allow_hyphen_values = true)]
    pub db_timeout: Option<Duration>,
}

#[derive(Args, Debug)]
pub struct KeyArgs {
    #[command(flatten)]
    pub database: Database,
    /// The lock's name.
    #[arg(long)]
    pub key: String,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub database: Database,
    /// The lock's name. Repeated, the locks are held together, all or none (a lock set: taken
    /// in the keys' byte order, so runs that name shared keys in any order never deadlock);
    /// only for plain locks.
    #[arg(long = "key", value_name = "KEY", required = true)]
    pub keys: Vec<String>,
    /// How long the lock outlives a crash of this process (it is renewed every third of it);
    /// 10ms to 7 days.
    #[arg(long, default_value = "30s", value_parser = time_to_live, allow_hyphen_values = true)]
    pub ttl: Duration,
    /// Give up after waiting this long for the lock, connecting to the database included
    /// (exit 75 where flock(1) exits 1, or --conflict-exit-code): seconds as flock takes them
    /// (10, 1.5), with units (500ms, 10m) or ISO 8601 (PT10M); 0 is --no-wait. Default: wait
    /// until granted.
    #[arg(
        long,
        short = 'w',
        value_name = "SECS",
        value_parser = any_duration,
        allow_hyphen_values = true,
        conflicts_with = "no_wait"
    )]
    pub wait: Option<Duration>,
    /// Give up at once if the lock is held elsewhere (exit 75 where flock(1) exits 1, or
    /// --conflict-exit-code).
    #[arg(long, short = 'n')]
    pub no_wait: bool,
    /// The exit code when the lock was held elsewhere (--no-wait, or --wait ran out), as
    /// flock(1)'s -E.
    #[arg(
        long,
        short = 'E',
        value_name = "N",
        default_value_t = crate::exit::BUSY,
        allow_negative_numbers = true
    )]
    pub conflict_exit_code: u8,
    /// Keep the lock held until this long after it was granted, even when COMMAND ends
    /// sooner, so that another run of the job within the period finds it held (ShedLock's
    /// lockAtLeastFor); at most 7 days.
    #[arg(long, value_parser = keep_for, allow_hyphen_values = true)]
    pub keep_for: Option<Duration>,
    /// How long COMMAND's process group has to end after SIGTERM — once the lease is lost,
    /// leasehold died, or a SIGTERM sent to leasehold was forwarded to it — before SIGKILL to
    /// the whole group (as `timeout -k`); at most 7 days.
    #[arg(long, default_value = "10s", value_parser = grace, allow_hyphen_values = true)]
    pub grace: Duration,
    /// Print nothing when the lock is held elsewhere (--no-wait, or --wait ran out): only the
    /// exit code tells, as with `flock -n` (with -E 0 a crontab line stays silent when it
    /// skips). Failures of leasehold itself are still printed.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Create the lock table (and the SQLite database file) when missing, as `init` does.
    /// Without it, a missing table or file ends leasehold with 70 before anything runs.
    #[arg(long)]
    pub create: bool,
    /// Hold one of N permits of the semaphore KEY instead of the lock KEY: at most N commands
    /// run at once with this KEY across all hosts (1 to 256; every run of KEY must give the
    /// same N). The command gets the permit's number, 0 to N-1, in LEASEHOLD_PERMIT.
    #[arg(
        long,
        value_name = "N",
        value_parser = permits,
        allow_hyphen_values = true,
        conflicts_with = "keep_for"
    )]
    pub permits: Option<u32>,
    /// Hold the read side of the reader/writer lock KEY instead of the lock KEY: runs beside
    /// other --read runs of KEY, never beside a --write run.
    #[arg(long, conflicts_with_all = ["keep_for", "permits", "write"])]
    pub read: bool,
    /// Hold the write side of the reader/writer lock KEY: runs alone, after the --read runs
    /// inside have ended; a waiting --write keeps new --read runs out.
    #[arg(long, conflicts_with_all = ["keep_for", "permits"])]
    pub write: bool,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

#[derive(Args, Debug)]
pub struct LeadArgs {
    #[command(flatten)]
    pub database: Database,
    /// The group's name: every instance that may lead names the same group (it is the key of
    /// the lock the leader holds).
    #[arg(long)]
    pub group: String,
    /// How long leadership outlives a crash of this process (it is renewed every third of it;
    /// a leader that cannot renew stops the command with a tenth of it left); 10ms to 7 days.
    #[arg(long, default_value = "30s", value_parser = time_to_live, allow_hyphen_values = true)]
    pub ttl: Duration,
    /// How often a standby tries to become leader; 1ms to 1h.
    #[arg(long, default_value = "1s", value_parser = poll, allow_hyphen_values = true)]
    pub poll: Duration,
    /// How long COMMAND's process group has to end after SIGTERM — once leadership is lost,
    /// leasehold died, or a SIGTERM sent to leasehold was forwarded to it — before SIGKILL to
    /// the whole group (as `timeout -k`); at most 7 days.
    #[arg(long, default_value = "10s", value_parser = grace, allow_hyphen_values = true)]
    pub grace: Duration,
    /// Create the lock table (and the SQLite database file) when missing, as `init` does.
    /// Without it, a missing table or file ends leasehold with 70 before anything runs.
    #[arg(long)]
    pub create: bool,
    /// Exit (code 74) once leadership is lost and COMMAND has stopped, instead of standing by
    /// to lead again.
    #[arg(long)]
    pub once: bool,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

#[derive(Args, Debug)]
#[command(after_help = STATUS_HELP)]
pub struct StatusArgs {
    #[command(flatten)]
    pub key: KeyArgs,
    /// One JSON object instead of lines: `key`, `lock_key`, `state` ("held", "expired",
    /// "released", as `list` says, or "free" when the table has no row for KEY), and
    /// `client_id`, `acquired`, `expires_at`, `expires_in_ms` and `fencing_token` of the lock's
    /// row as `list --json` shows them (all null when free); `held` (anything of KEY held: the exit code); `semaphore` (null when
    /// KEY has none): `permits`, `held` and `holders`; `rw_lock` (null when KEY has none):
    /// `state` ("free", "read", "write", "writer_waiting"), `readers` and `holders`. Each
    /// holder: `part` ("permit 2", "read 17", "write"), `lock_key`, `client_id`, `acquired`,
    /// `expires_at`, `expires_in_ms`, `fencing_token`.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub watch: Watch,
}

const STATUS_HELP: &str = "\
A lock, a semaphore (`run --permits N`) and a reader/writer lock (`run --read`/`--write`) of \
one name are unrelated; status shows each that KEY has. The lock's line: `KEY: held by …` \
when it is held; `KEY: released, fencing token N` or `KEY: expired …, fencing token N` (the \
word and token `list` shows for its row) when its row is not held; `KEY: free` when the table \
has no row for it and KEY has nothing else. For a semaphore, `KEY: semaphore \
of N permits, K held` (or `all free`) and a line per held permit (`  permit 2: held by …`); \
for a reader/writer lock, `KEY: reader/writer lock, free`, `read by K readers`, `written` or \
`a writer waits for K readers to leave`, and a line for the write row and each read hold. \
Exit 0 when anything of KEY is held, 1 when all of it is free.";

/// `--watch` of `status` and `list`.
#[derive(Args, Debug)]
pub struct Watch {
    /// Show it again every SECS (default 2; 0.1 to 86400, or with units: 500ms, 1m) until
    /// Ctrl-C, SIGTERM or SIGHUP (exit 0; a second signal while a query hangs exits 128 + N).
    /// On a terminal the screen is redrawn in place under a header with the interval and the
    /// database clock, and rows that do not fit are counted; otherwise every refresh is
    /// appended after such a header, and with --json each refresh is one line (JSON Lines).
    /// One connection is kept for the whole watch. A query that fails after the first
    /// refresh is reported (on the screen, or on stderr) and tried again at the next.
    #[arg(
        long,
        value_name = "SECS",
        num_args = 0..=1,
        default_missing_value = "2",
        value_parser = watch_interval,
        allow_negative_numbers = true
    )]
    pub watch: Option<Duration>,
}

#[derive(Args, Debug)]
pub struct ReleaseArgs {
    #[command(flatten)]
    pub key: KeyArgs,
    /// Required: the lock is freed whoever holds it.
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    #[command(flatten)]
    pub database: Database,
    /// Only the rows of lock NAME: its lock, and the permits of the semaphore and the rows of
    /// the reader/writer lock of that name; repeat for several. Without it, every row of the
    /// table and region.
    #[arg(long = "key", value_name = "NAME")]
    pub keys: Vec<String>,
    /// Only the rows held now by client id ID; `HOST/` (ending in `/`) for every holder on
    /// that host, `HOST/PID/` for one process (a client id of `leasehold` or of the library is
    /// `HOST/PID/RANDOM`, the host cut to 18 characters). Repeat for several. Expired and
    /// released rows are left out.
    #[arg(long = "holder", value_name = "ID")]
    pub holders: Vec<String>,
    /// One JSON array of objects instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub watch: Watch,
}

#[derive(Args, Debug)]
pub struct InitArgs {
    #[command(flatten)]
    pub database: Database,
    /// Print the DDL for the database instead of running it (nothing is connected to).
    #[arg(long)]
    pub print: bool,
}

#[derive(Args, Debug)]
pub struct CleanupArgs {
    #[command(flatten)]
    pub database: Database,
    /// Delete rows released or expired longer ago than this (released rows count from their
    /// last grant).
    #[arg(long, value_parser = any_duration, allow_hyphen_values = true)]
    pub older_than: Duration,
}

impl Commands {
    /// The database options of the subcommand (none for the watchdog).
    pub fn database(&self) -> Option<&Database> {
        match self {
            Commands::Run(a) => Some(&a.database),
            Commands::Lead(a) => Some(&a.database),
            Commands::Status(a) => Some(&a.key.database),
            Commands::List(a) => Some(&a.database),
            Commands::Init(a) => Some(&a.database),
            Commands::Release(a) => Some(&a.key.database),
            Commands::Cleanup(a) => Some(&a.database),
            Commands::Watchdog(_) => None,
        }
    }
}

#[derive(Args, Debug)]
pub struct WatchdogArgs {
    /// How long the command's group has after SIGTERM before SIGKILL, in milliseconds.
    #[arg(long)]
    pub grace_ms: u64,
}

/// A duration on the command line: plain seconds as flock(1) takes them (`10`, `1.5`), with
/// units (`500ms`, `10m`, `1h 30m`), or ISO 8601 as Java and ShedLock write them (`PT15M`).
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Some(rest) = text.strip_prefix('-') {
        if rest.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
            return Err("a duration cannot be negative".to_string());
        }
        return Err(format!(
            "{text:?} is not a duration (is the value missing?): give seconds (10, 1.5) or a \
             duration with units (500ms, 10m)"
        ));
    }
    if text.starts_with(['P', 'p']) {
        return iso_8601(text);
    }
    if text.starts_with(|c: char| c.is_ascii_digit() || c == '.')
        && text.chars().all(|c| c.is_ascii_digit() || c == '.')
    {
        let seconds: f64 = text
            .parse()
            .map_err(|_| format!("{text:?} is not a number of seconds"))?;
        return Duration::try_from_secs_f64(seconds)
            .map_err(|_| format!("{text} seconds is too long"));
    }
    humantime::parse_duration(text).map_err(|e| {
        format!(
            "{e}: give seconds (10, 1.5), a duration with units (500ms, 10m, 1h 30m) or ISO \
             8601 (PT10M)"
        )
    })
}

/// An ISO 8601 duration (`PT15M`, `PT1H30M`, `PT0.5S`, `P1D`, `P1DT12H`, `P2W`), upper or
/// lower case, a decimal fraction (`.` or `,`) allowed in every number. Years and months,
/// which have no fixed length, are refused.
fn iso_8601(text: &str) -> Result<Duration, String> {
    let refused = |why: &str| {
        format!(
            "{text:?} is not an ISO 8601 duration ({why}): write e.g. PT15M, PT1H30M, PT0.5S, \
             P1D or P1DT12H"
        )
    };
    let upper = text.to_ascii_uppercase();
    let body = &upper[1..];
    let (days, time) = match body.split_once('T') {
        Some((_, "")) => return Err(refused("nothing after T")),
        Some((days, time)) => (days, time),
        None => (body, ""),
    };
    if body.is_empty() {
        return Err(refused("nothing after P"));
    }
    let mut seconds = 0.0;
    for (mut part, mut units, in_days) in [
        (days, &[('W', 604_800.0), ('D', 86_400.0)][..], true),
        (time, &[('H', 3_600.0), ('M', 60.0), ('S', 1.0)][..], false),
    ] {
        while !part.is_empty() {
            let digits = part
                .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ','))
                .ok_or_else(|| refused("a number without its unit"))?;
            let unit = part[digits..].chars().next().expect("found above");
            let Some(at) = units.iter().position(|(u, _)| *u == unit) else {
                return Err(match unit {
                    'Y' | 'M' if in_days => {
                        refused("years and months have no fixed length: give days")
                    }
                    _ => refused(&format!("{unit} is not a unit there")),
                });
            };
            if digits == 0 {
                return Err(refused(&format!("no number before {unit}")));
            }
            let number: f64 = part[..digits]
                .replace(',', ".")
                .parse()
                .map_err(|_| refused(&format!("{:?} is not a number", &part[..digits])))?;
            seconds += number * units[at].1;
            units = &units[at + 1..];
            part = &part[digits + unit.len_utf8()..];
        }
    }
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("{text} is too long"))
}

/// A duration within `min..=max`; `what` says why the bounds are there.
fn duration_within(
    text: &str,
    min: Duration,
    max: Duration,
    what: &str,
) -> Result<Duration, String> {
    let duration = parse_duration(text)?;
    if duration < min || duration > max {
        return Err(format!(
            "{} is outside the allowed range {} to {} ({what})",
            humantime::format_duration(duration),
            humantime::format_duration(min),
            humantime::format_duration(max)
        ));
    }
    Ok(duration)
}

/// `--permits`: the library's range.
fn permits(text: &str) -> Result<u32, String> {
    let number: i64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a whole number"))?;
    u32::try_from(number)
        .ok()
        .filter(|n| (1..=MAX_PERMITS).contains(n))
        .ok_or_else(|| {
            format!(
                "{number} is outside the allowed range 1 to {MAX_PERMITS} (how many commands \
                 may run at once with this KEY)"
            )
        })
}

/// `--db-timeout`: the library's range for its timeouts.
fn db_timeout(text: &str) -> Result<Duration, String> {
    duration_within(
        text,
        Duration::from_millis(1),
        MAX_TIMEOUT,
        "how long leasehold waits for the database",
    )
}

/// `--wait`, `--older-than`: any length.
fn any_duration(text: &str) -> Result<Duration, String> {
    parse_duration(text)
}

/// `--watch`: often enough to follow a lease, rarely enough not to load the database.
fn watch_interval(text: &str) -> Result<Duration, String> {
    duration_within(
        text,
        Duration::from_millis(100),
        Duration::from_secs(86_400),
        "a display refreshed more often only loads the database",
    )
}

/// `--ttl`: the library's range for a lease.
fn time_to_live(text: &str) -> Result<Duration, String> {
    duration_within(
        text,
        MIN_TIME_TO_LIVE,
        MAX_TIME_TO_LIVE,
        "a lease's time-to-live",
    )
}

/// `--keep-for`: the lock table keeps a row held at most as long as a lease.
fn keep_for(text: &str) -> Result<Duration, String> {
    duration_within(
        text,
        Duration::ZERO,
        MAX_TIME_TO_LIVE,
        "a row is kept held at most as long as the longest lease",
    )
}

/// `--grace`: at most as long as the longest lease.
fn grace(text: &str) -> Result<Duration, String> {
    duration_within(
        text,
        Duration::ZERO,
        MAX_TIME_TO_LIVE,
        "at most as long as the longest lease",
    )
}

/// `--poll`: the library's range for the time between a standby's tries.
fn poll(text: &str) -> Result<Duration, String> {
    duration_within(
        text,
        Duration::from_millis(1),
        MAX_IDLE_BETWEEN_TRIES,
        "zero would spin on the database",
    )
}
