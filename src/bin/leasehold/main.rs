//! `leasehold`: run a command under a distributed lock, and inspect or administer the lock
//! table, from a shell or cron (feature `cli`).
//!
//! ```text
//! leasehold run --database sqlite:/var/lib/jobs/locks.db --key nightly-report --keep-for 5m -- ./report.sh
//! leasehold run --key partner-export --permits 4 -- ./export.sh
//! leasehold run --key cache --write -- ./rebuild-cache.sh   # beside no --read run of cache
//! leasehold lead --group billing-scheduler -- ./scheduler
//! leasehold status --key nightly-report
//! leasehold list --key nightly-report --json
//! leasehold list --holder web-3/ --watch
//! leasehold status --key nightly-report --watch 1
//! leasehold init --print
//! leasehold release --key nightly-report --force
//! leasehold cleanup --older-than 7d
//! ```
//!
//! Exit codes of `run` and `lead`: the command's own when it ran to its end with the lease
//! (leadership) held (128 + the signal's number when a signal ended it); otherwise one of the
//! codes below (see [`exit`]). Under `run` the command also sees `LEASEHOLD_KEY` and
//! `LEASEHOLD_FENCING_TOKEN` in its environment (and `LEASEHOLD_PERMIT` with `--permits`; with
//! several `--key`, the first key's, and `LEASEHOLD_FENCING_TOKENS`: a line `TOKEN KEY` per
//! key); under `lead`, `LEASEHOLD_GROUP`,
//! `LEASEHOLD_TERM` and `LEASEHOLD_FENCING_TOKEN` (the term).
//!
//! # Where things live
//!
//! | module | what it holds |
//! |---|---|
//! | [`args`] | the command line: every subcommand's options, durations and their ranges |
//! | [`database`] | the database URL, the registry builder, the holder's client id |
//! | [`supervisor`] | starting the command, forwarding signals, stopping it on a loss |
//! | [`commands`] | one module per subcommand |
//! | [`output`] | tables and JSON for `list` and `status`, durations for people |
//! | [`watch`] | `--watch` of `status` and `list`: refreshing, the screen, stopping on a signal |
//! | [`report`] | `--verbose` reports and the library's warnings on stderr |
//! | [`exit`] | leasehold's own exit codes, and the failure type that carries one |

//!
//! # Platforms
//!
//! Unix only: Linux, macOS and the BSDs. Everything the supervisor uses is POSIX (process
//! groups, `tcsetpgrp`, `waitpid`, `kill`, signal masks, pipes); Linux adds only cosmetics
//! (`/proc/self/exe` to start the watchdog from the very binary even after an upgrade replaced
//! it, and the watchdog's name in `ps`). Windows has no process groups or signals to forward in
//! this sense, and is refused at compile time; the library itself does not need the `cli`
//! feature.

#![deny(unsafe_code)]

#[cfg(not(unix))]
compile_error!(
    "the `leasehold` command (feature `cli`) runs on Unix only (Linux, macOS, the BSDs): it \
     supervises commands through POSIX process groups and signals. On Windows, build the \
     library without the `cli` feature."
);

#[cfg(unix)]
mod args;
#[cfg(unix)]
mod commands;
#[cfg(unix)]
mod database;
#[cfg(unix)]
mod exit;
#[cfg(unix)]
mod output;
#[cfg(unix)]
mod report;
#[cfg(unix)]
mod supervisor;
#[cfg(unix)]
mod watch;

#[cfg(not(unix))]
fn main() {}

#[cfg(unix)]
fn main() -> std::process::ExitCode {
    use args::{Cli, Commands};
    use clap::Parser;
    use report::Reporter;
    use std::process::ExitCode;

    // Test builds only: fail points named in FAILPOINTS (see the crate's `failpoints` feature).
    #[cfg(feature = "failpoints")]
    let _fail_points = fail::FailScenario::setup();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { exit::USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let verbose = cli.command.database().is_some_and(|d| d.verbose);
    let reporter = Reporter { verbose };
    if log::set_logger(Box::leak(Box::new(Reporter { verbose }))).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
    let outcome = match cli.command {
        Commands::Run(args) => commands::run::run(args, &reporter),
        Commands::Lead(args) => commands::lead::lead(args, &reporter),
        Commands::Status(args) => commands::status::status(args),
        Commands::List(args) => commands::list::list(args),
        Commands::Init(args) => commands::init::init(args),
        Commands::Release(args) => commands::release::release(args),
        Commands::Cleanup(args) => commands::cleanup::cleanup(args),
        Commands::Watchdog(args) => supervisor::watchdog::watch(args),
    };
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            eprintln!("leasehold: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}
