//! Leader election between processes: three contenders, the leader is killed, a standby takes
//! over; then the new leader resigns and the last standby takes over without waiting out the
//! lease, woken by the release within milliseconds (PostgreSQL `NOTIFY`, MySQL named locks,
//! SQLite's release board on Linux; at its next poll with notifications off or elsewhere).
//!
//! The example re-runs itself as child processes (`leader contender NAME ...`), one per
//! contender, and prints their events on one timeline. The first leader is killed with
//! `SIGKILL`: it neither renews nor releases, so a standby is elected when the lease runs out
//! on the database clock (about lease + sleep interval later). Contender C runs with its
//! wall clock 90 s fast: its offset to the database is measured and the times it reports are
//! corrected, and it never steals the lease.
//!
//! ```text
//! cargo run --release --example leader                   # SQLite in a temporary directory
//! cargo run --release --features postgres --example leader -- postgres://postgres@127.0.0.1:5432/test
//! cargo run --release --features mysql --example leader -- mysql://root@127.0.0.1:3306/test
//! ```
//!
//! (`LEASEHOLD_EXAMPLE_URL` works instead of the argument.) On a server the table is
//! `leader_example_LOCK`, created if missing.
//!
//! To copy it into a crate of yours (`src/main.rs`), depend on `leasehold` (with the database
//! features you need, and `sqlite` for the default) and on `log` = "0.4", which the contenders
//! use to print the crate's warnings; nothing else. The `#[cfg(feature = ...)]` lines name
//! leasehold's features: in your crate keep the branches of the databases you enabled.

use leasehold::{LeaderElection, RegistryBuilder};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const GROUP: &str = "nightly-batch";
const TIME_TO_LIVE: Duration = Duration::from_secs(3);
const RENEW_EVERY: Duration = Duration::from_secs(1);
const IDLE_BETWEEN_TRIES: Duration = Duration::from_millis(250);
const PREFIX: &str = "leader_example_";

type Failure = Box<dyn std::error::Error>;

fn main() -> Result<(), Failure> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("contender") {
        // args[2] is the contender's name, for `ps`; the coordinator labels its lines.
        return contender(&args[3], args.get(4).map(String::as_str));
    }
    let url = args
        .get(1)
        .cloned()
        .or_else(|| std::env::var("LEASEHOLD_EXAMPLE_URL").ok());
    let target = match url {
        Some(url) => url,
        None => {
            // An SQLite file in a directory of this run's own, removed at the end.
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos();
            let dir = std::env::temp_dir()
                .join(format!("leasehold-leader-{}-{nanos}", std::process::id()));
            std::fs::create_dir_all(&dir)?;
            let outcome = coordinate(&dir.join("locks.db").display().to_string());
            let _ = std::fs::remove_dir_all(&dir);
            return outcome;
        }
    };
    coordinate(&target)
}

/// The registry builder for `target`: a URL for a server, else an SQLite file.
fn registry(target: &str) -> Result<RegistryBuilder, Failure> {
    #[cfg(feature = "postgres")]
    if target.starts_with("postgres://") || target.starts_with("postgresql://") {
        return Ok(leasehold::LockRegistry::postgres(target).prefix(PREFIX));
    }
    #[cfg(feature = "mysql")]
    if target.starts_with("mysql://") || target.starts_with("mariadb://") {
        let url = target.replacen("mariadb://", "mysql://", 1);
        return Ok(leasehold::LockRegistry::mysql(url).prefix(PREFIX));
    }
    if target.contains("://") {
        return Err(format!(
            "{target}: build with --features postgres or --features mysql for this database"
        )
        .into());
    }
    sqlite(target)
}

#[cfg(feature = "sqlite")]
fn sqlite(path: &str) -> Result<RegistryBuilder, Failure> {
    Ok(leasehold::LockRegistry::sqlite(path).prefix(PREFIX))
}

#[cfg(not(feature = "sqlite"))]
fn sqlite(_path: &str) -> Result<RegistryBuilder, Failure> {
    Err("SQLite support is not compiled in: pass a database URL".into())
}

// ---------------------------------------------------------------------------------------------
// The coordinator: starts the contenders, kills the leader, prints the timeline.

struct Contender {
    name: String,
    process: Child,
    stdin: Option<ChildStdin>,
}

/// One line of a contender, when it arrived.
struct Line {
    at: Instant,
    from: String,
    text: String,
}

fn coordinate(target: &str) -> Result<(), Failure> {
    // Create the table once, before the contenders race to.
    drop(registry(target)?.create_table(true).build()?);
    println!("leader election example: group {GROUP:?} on {target}");
    println!(
        "time-to-live {TIME_TO_LIVE:?}, renewal every {RENEW_EVERY:?}, standbys try every \
         {IDLE_BETWEEN_TRIES:?}\n"
    );
    let start = Instant::now();
    let (lines_tx, lines) = leasehold::crossbeam_channel::unbounded::<Line>();
    let mut contenders = Vec::new();
    for (name, skew) in [("A", None), ("B", None), ("C", Some("90"))] {
        let mut command = Command::new(std::env::current_exe()?);
        command.args(["contender", name, target]).args(skew);
        let mut process = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdout = process.stdout.take().expect("piped");
        let (tx, from) = (lines_tx.clone(), name.to_string());
        std::thread::spawn(move || {
            for text in BufReader::new(stdout).lines().map_while(Result::ok) {
                let line = Line {
                    at: Instant::now(),
                    from: from.clone(),
                    text,
                };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = process.stdin.take();
        contenders.push(Contender {
            name: name.to_string(),
            process,
            stdin,
        });
    }
    let show = |line: &Line| {
        println!(
            "{:>8.3} s  {}  contender {}: {}",
            line.at.duration_since(start).as_secs_f64(),
            clock(SystemTime::now()),
            line.from,
            line.text
        );
    };
    let note = |text: &str| {
        println!(
            "{:>8.3} s  {}  ** {text}",
            start.elapsed().as_secs_f64(),
            clock(SystemTime::now())
        );
    };
    // Prints lines until one matches, or until `within` passes.
    let wait_for = |what: &dyn Fn(&Line) -> bool, within: Duration| -> Option<Line> {
        let deadline = Instant::now() + within;
        while let Ok(line) = lines.recv_deadline(deadline) {
            show(&line);
            if what(&line) {
                return Some(line);
            }
        }
        None
    };
    let elected = |line: &Line| line.text.starts_with("elected");

    let first = wait_for(&elected, Duration::from_secs(20)).ok_or("nobody was elected")?;
    wait_for(&|_| false, Duration::from_secs(2));
    note(&format!(
        "killing contender {} (SIGKILL: it stops renewing and never releases)",
        first.from
    ));
    let killed_at = Instant::now();
    let leader = contenders
        .iter_mut()
        .find(|c| c.name == first.from)
        .expect("known contender");
    leader.process.kill()?;
    leader.process.wait()?;
    let second = wait_for(&elected, Duration::from_secs(20)).ok_or("no standby took over")?;
    note(&format!(
        "contender {} took over {:.3} s after the kill (time-to-live {:?} + one try interval {:?})",
        second.from,
        second.at.duration_since(killed_at).as_secs_f64(),
        TIME_TO_LIVE,
        IDLE_BETWEEN_TRIES
    ));

    wait_for(&|_| false, Duration::from_millis(1500));
    note(&format!(
        "asking contender {} to stop: its run loop resigns",
        second.from
    ));
    let resigned_at = Instant::now();
    let stopping = contenders
        .iter_mut()
        .find(|c| c.name == second.from)
        .expect("known contender");
    stopping.stdin.take(); // end of input = stop
    let third = wait_for(&elected, Duration::from_secs(20)).ok_or("no handover")?;
    note(&format!(
        "contender {} took over {:.3} s after the resignation, without waiting out the lease",
        third.from,
        third.at.duration_since(resigned_at).as_secs_f64()
    ));

    wait_for(&|_| false, Duration::from_millis(500));
    note("stopping the others");
    for contender in &mut contenders {
        contender.stdin.take();
    }
    for contender in &mut contenders {
        let deadline = Instant::now() + Duration::from_secs(10);
        while contender.process.try_wait()?.is_none() && Instant::now() < deadline {
            while let Ok(line) = lines.recv_timeout(Duration::from_millis(20)) {
                show(&line);
            }
        }
        let _ = contender.process.kill();
        let _ = contender.process.wait();
    }
    while let Ok(line) = lines.try_recv() {
        show(&line);
    }
    note("done");
    Ok(())
}

/// A wall-clock time as `HH:MM:SS.mmm` UTC.
fn clock(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let seconds = since.as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:03} UTC",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60,
        since.subsec_millis()
    )
}

// ---------------------------------------------------------------------------------------------
// A contender (child process): competes until its input ends, reporting on stdout.

/// Prints the crate's warnings as contender lines, so they show on the timeline.
struct StdoutLogger;

impl log::Log for StdoutLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::Level::Warn
    }

    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            say(&format!("[log {}] {}", record.level(), record.args()));
        }
    }

    fn flush(&self) {}
}

fn say(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}");
    let _ = out.flush();
}

fn contender(target: &str, skew_seconds: Option<&str>) -> Result<(), Failure> {
    static LOGGER: StdoutLogger = StdoutLogger;
    let _ = log::set_logger(&LOGGER).map(|()| log::set_max_level(log::LevelFilter::Warn));
    let mut builder = LeaderElection::builder(registry(target)?, GROUP)
        .time_to_live(TIME_TO_LIVE)
        .renew_every(RENEW_EVERY)
        .idle_between_tries(IDLE_BETWEEN_TRIES)
        .max_allowable_diff_from_db_time(Duration::from_millis(500));
    if let Some(skew) = skew_seconds {
        let skew = Duration::from_secs(skew.parse()?);
        say(&format!("my wall clock runs {skew:?} fast"));
        builder = builder.client_clock(move || SystemTime::now() + skew);
    }
    let election = builder.build()?;
    say(&format!(
        "standing by as client {}; clock offset to the database {}{}",
        election.registry().client_id(),
        election.clock_offset(),
        if election.is_adjusting_clock() {
            " -> my reported times are corrected"
        } else {
            ""
        }
    ));
    let (stop_tx, stop) = leasehold::crossbeam_channel::bounded::<()>(1);
    std::thread::spawn(move || {
        // Any line or the end of input stops this contender.
        let _ = std::io::stdin().lock().lines().next();
        let _ = stop_tx.send(());
    });
    election.run(
        |leadership| {
            say(&format!(
                "elected: term {} at {} (reported clock), lease ends {} unless renewed",
                leadership.term(),
                clock(leadership.elected_at()),
                clock(leadership.lease_ends_at())
            ))
        },
        |lost| say(&format!("LOST: {lost}")),
        &stop,
    )?;
    say("stopped (resigned if leading)");
    Ok(())
}
