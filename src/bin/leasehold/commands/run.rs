//! `leasehold run`: run a command while holding a lock (or one permit of a semaphore,
//! `--permits`, or a side of a reader/writer lock, `--read`/`--write`), renewing it, and release it (or keep it held, `--keep-for`) when the command
//! ends.

use crate::args::RunArgs;
use crate::database::{builder_for, connect_timeout, creating};
use crate::exit::{self, for_cli, Failure};
use crate::output::rounded;
use crate::report::Reporter;
use crate::supervisor::{code_of, forward_signals, spawn, supervise, Stops, Watchdog};
use leasehold::{AnyGuard, Error};
use std::time::{Duration, Instant};

/// What the command runs under: the lock, a permit of the semaphore, or a side of the
/// reader/writer lock.
type Held = AnyGuard;

/// `--keep-for`, which the arguments allow only for a lock.
fn unlock_keeping_for(held: Held, keep: Duration) -> leasehold::Result<()> {
    match held {
        Held::Lock(guard) => guard.unlock_keeping_for(keep),
        other => other.unlock(),
    }
}

/// Takes the lock or permit as `--no-wait` / `--wait` / neither say: with `try_once`,
/// `try_for` or `wait`. `--wait` counts from `started`, so that connecting is part of it.
fn take<T>(
    args: &RunArgs,
    started: Instant,
    try_once: impl FnOnce() -> leasehold::Result<Option<T>>,
    try_for: impl FnOnce(Duration) -> leasehold::Result<Option<T>>,
    wait: impl FnOnce() -> leasehold::Result<T>,
) -> leasehold::Result<Option<T>> {
    if args.no_wait {
        try_once()
    } else if let Some(timeout) = args.wait {
        // Past its end (connecting took it all), one attempt.
        try_for(timeout.saturating_sub(started.elapsed()))
    } else {
        wait().map(Some)
    }
}

pub fn run(args: RunArgs, reporter: &Reporter) -> Result<u8, Failure> {
    // First of all: a SIGTSTP must never stop leasehold inside a statement.
    let stops = Stops::catch()?;
    let started = Instant::now();
    let mut builder = builder_for(&args.database, creating(args.create))?.time_to_live(args.ttl);
    // `--wait` bounds connecting too; `--wait 0` is `--no-wait`, which connects as usual.
    if let Some(wait) = args.wait.filter(|wait| !wait.is_zero()) {
        builder = builder.connect_timeout(connect_timeout(&args.database).min(wait));
    }
    let registry = builder.build()?;
    // Before the lock: without a watchdog the command would not be stopped if leasehold died.
    let mut watchdog = Watchdog::start(args.grace)?;
    reporter.say(format_args!("waiting for {:?}", args.key));
    let rw_lock = (args.read || args.write)
        .then(|| registry.rw_lock(&args.key))
        .transpose()?;
    let guard = match args.permits {
        None if args.read => {
            let lock = rw_lock.as_ref().expect("made for --read");
            take(
                &args,
                started,
                || lock.try_read(),
                |wait| lock.try_read_for(wait),
                || lock.read(),
            )?
            .map(Held::Read)
        }
        None if args.write => {
            let lock = rw_lock.as_ref().expect("made for --write");
            take(
                &args,
                started,
                || lock.try_write(),
                |wait| lock.try_write_for(wait),
                || lock.write(),
            )?
            .map(Held::Write)
        }
        None => {
            let lock = registry.obtain(&args.key)?;
            take(
                &args,
                started,
                || lock.try_lock(),
                |wait| lock.try_lock_for(wait),
                || lock.lock(),
            )?
            .map(Held::Lock)
        }
        Some(permits) => {
            let semaphore = registry.semaphore(&args.key, permits)?;
            take(
                &args,
                started,
                || semaphore.try_acquire(),
                |wait| semaphore.try_acquire_for(wait),
                || semaphore.acquire(),
            )?
            .map(Held::Permit)
        }
    };
    let Some(guard) = guard else {
        if args.quiet {
            return Ok(args.conflict_exit_code);
        }
        if args.read || args.write {
            let side = if args.read { "read" } else { "write" };
            eprintln!(
                "leasehold: the {side} side of {:?} is not free; not running the command",
                args.key
            );
            return Ok(args.conflict_exit_code);
        }
        if let Some(permits) = args.permits {
            eprintln!(
                "leasehold: all {permits} permits of {:?} are held; not running the command",
                args.key
            );
            return Ok(args.conflict_exit_code);
        }
        let holder = registry.holder(&args.key).ok().flatten();
        let by = holder.map_or_else(String::new, |h| format!(" by {}", h.client_id));
        eprintln!(
            "leasehold: {:?} is held{by}; not running the command",
            args.key
        );
        return Ok(args.conflict_exit_code);
    };
    // From here on SIGINT, SIGTERM and SIGHUP go to the command (before, they end leasehold
    // as usual, and a grant in flight runs out after its time-to-live).
    let signals = forward_signals()?;
    let token = guard.fencing_token();
    let mut env = vec![
        ("LEASEHOLD_KEY", args.key.clone()),
        ("LEASEHOLD_FENCING_TOKEN", token.to_string()),
    ];
    match &guard {
        Held::Lock(_) => reporter.say(format_args!(
            "acquired {:?} (fencing token {token})",
            args.key
        )),
        Held::Read(_) | Held::Write(_) => reporter.say(format_args!(
            "acquired the {} side of {:?} (fencing token {token})",
            if args.read { "read" } else { "write" },
            args.key
        )),
        Held::Permit(permit) => {
            reporter.say(format_args!(
                "acquired permit {} of {:?} (fencing token {token})",
                permit.slot(),
                args.key
            ));
            env.push(("LEASEHOLD_PERMIT", permit.slot().to_string()));
        }
    }
    if let Err(failure) = watchdog.check() {
        guard.unlock()?;
        return Err(failure);
    }
    let group = match spawn(&args.command, &env, &watchdog) {
        Ok(group) => group,
        Err((code, message)) => {
            let released = guard.unlock();
            eprintln!("leasehold: {message}");
            released?;
            return Ok(code);
        }
    };
    let mut remaining = guard.remaining();
    let ended = supervise(
        group,
        guard.loss_channel(),
        &signals,
        &stops,
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
    );
    // If supervising failed, the watchdog stops the command's group (and waits for it) before
    // the guard, dropped after it, releases the lock.
    let ended = match ended {
        Ok(ended) => ended,
        Err(failure) => {
            drop(watchdog);
            return Err(failure);
        }
    };
    let code = code_of(ended.status);
    reporter.say(format_args!("the command ended with exit code {code}"));
    let released = match args.keep_for {
        Some(keep) => unlock_keeping_for(guard, keep),
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
                "leasehold: the command ended (exit code {code}) but releasing {:?} failed: {}; \
                 the lock runs out after its time-to-live",
                args.key,
                for_cli(&e.to_string())
            );
            Ok(exit::ERROR)
        }
    }
}
