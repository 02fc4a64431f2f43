//! `leasehold run`: run a command while holding a lock (or several, all or none: a lock set;
//! or one permit of a semaphore, `--permits`; or a side of a reader/writer lock,
//! `--read`/`--write`), renewing it, and release it (or keep it held, `--keep-for`) when the
//! command ends.

use crate::args::RunArgs;
use crate::database::{builder_for, connect_timeout, creating};
use crate::exit::{self, for_cli, Failure};
use crate::output::rounded;
use crate::report::Reporter;
use crate::supervisor::{code_of, forward_signals, spawn, supervise, Stops, Watchdog};
use leasehold::{AnyGuard, Error, LockSetGuard};
use std::time::{Duration, Instant};

/// What the command runs under: the lock, a permit of the semaphore, a side of the
/// reader/writer lock, or the locks of several keys.
enum Held {
    One(AnyGuard),
    Set(LockSetGuard),
}

impl Held {
    /// The token of the (first) key's grant.
    fn fencing_token(&self) -> u64 {
        match self {
            Held::One(guard) => guard.fencing_token(),
            Held::Set(set) => set.guards()[0].fencing_token(),
        }
    }

    fn remaining(&self) -> Duration {
        match self {
            Held::One(guard) => guard.remaining(),
            Held::Set(set) => set.remaining(),
        }
    }

    fn loss_channel(&self) -> leasehold::crossbeam_channel::Receiver<leasehold::LeaseLost> {
        match self {
            Held::One(guard) => guard.loss_channel(),
            Held::Set(set) => set.loss_channel(),
        }
    }

    fn unlock(self) -> leasehold::Result<()> {
        match self {
            Held::One(guard) => guard.unlock(),
            Held::Set(set) => set.unlock(),
        }
    }
}

/// `--keep-for`, which the arguments allow only for one lock.
fn unlock_keeping_for(held: Held, keep: Duration) -> leasehold::Result<()> {
    match held {
        Held::One(AnyGuard::Lock(guard)) => guard.unlock_keeping_for(keep),
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
    let several = args.keys.len() > 1;
    if several && (args.permits.is_some() || args.read || args.write || args.keep_for.is_some()) {
        return Err(Failure::new(
            exit::USAGE,
            "several --key hold plain locks together; --permits, --read, --write and \
             --keep-for take one --key",
        ));
    }
    // The key as messages name it: one key, or the set's keys in the order they are taken.
    let shown = match several {
        false => format!("{:?}", args.keys[0]),
        true => {
            let mut keys: Vec<&String> = args.keys.iter().collect();
            keys.sort();
            keys.dedup();
            format!("the keys {keys:?}")
        }
    };
    let key = &args.keys[0];
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
    reporter.say(format_args!("waiting for {shown}"));
    let rw_lock = (args.read || args.write)
        .then(|| registry.rw_lock(key))
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
            .map(|guard| Held::One(guard.into()))
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
            .map(|guard| Held::One(guard.into()))
        }
        None if several => {
            let set = registry.lock_set(&args.keys)?;
            take(
                &args,
                started,
                || set.try_lock(),
                |wait| set.try_lock_for(wait),
                || set.lock(),
            )?
            .map(Held::Set)
        }
        None => {
            let lock = registry.obtain(key)?;
            take(
                &args,
                started,
                || lock.try_lock(),
                |wait| lock.try_lock_for(wait),
                || lock.lock(),
            )?
            .map(|guard| Held::One(guard.into()))
        }
        Some(permits) => {
            let semaphore = registry.semaphore(key, permits)?;
            take(
                &args,
                started,
                || semaphore.try_acquire(),
                |wait| semaphore.try_acquire_for(wait),
                || semaphore.acquire(),
            )?
            .map(|guard| Held::One(guard.into()))
        }
    };
    let Some(guard) = guard else {
        if args.quiet {
            return Ok(args.conflict_exit_code);
        }
        if args.read || args.write {
            let side = if args.read { "read" } else { "write" };
            eprintln!("leasehold: the {side} side of {shown} is not free; not running the command");
            return Ok(args.conflict_exit_code);
        }
        if let Some(permits) = args.permits {
            eprintln!(
                "leasehold: all {permits} permits of {shown} are held; not running the command"
            );
            return Ok(args.conflict_exit_code);
        }
        if several {
            eprintln!("leasehold: of {shown}, one is held elsewhere; not running the command");
            return Ok(args.conflict_exit_code);
        }
        let holder = registry.holder(key).ok().flatten();
        let by = holder.map_or_else(String::new, |h| format!(" by {}", h.client_id));
        eprintln!("leasehold: {shown} is held{by}; not running the command");
        return Ok(args.conflict_exit_code);
    };
    // From here on SIGINT, SIGTERM and SIGHUP go to the command (before, they end leasehold
    // as usual, and a grant in flight runs out after its time-to-live).
    let signals = forward_signals()?;
    let token = guard.fencing_token();
    let mut env = vec![("LEASEHOLD_FENCING_TOKEN", token.to_string())];
    match &guard {
        Held::One(AnyGuard::Lock(_)) => {
            reporter.say(format_args!("acquired {shown} (fencing token {token})"))
        }
        Held::One(AnyGuard::Read(_) | AnyGuard::Write(_)) => reporter.say(format_args!(
            "acquired the {} side of {shown} (fencing token {token})",
            if args.read { "read" } else { "write" },
        )),
        Held::One(AnyGuard::Permit(permit)) => {
            reporter.say(format_args!(
                "acquired permit {} of {shown} (fencing token {token})",
                permit.slot(),
            ));
            env.push(("LEASEHOLD_PERMIT", permit.slot().to_string()));
        }
        Held::Set(set) => {
            let tokens = set.fencing_tokens();
            let lines: Vec<String> = tokens
                .iter()
                .map(|(key, token)| format!("{token} {key}"))
                .collect();
            reporter.say(format_args!(
                "acquired {shown} (fencing tokens {:?})",
                tokens.iter().map(|(_, token)| token).collect::<Vec<_>>()
            ));
            env.push(("LEASEHOLD_FENCING_TOKENS", lines.join("\n")));
        }
    }
    // The key of LEASEHOLD_FENCING_TOKEN: a set's first in its order.
    let first = match &guard {
        Held::Set(set) => set.guards()[0].key().to_string(),
        Held::One(_) => key.clone(),
    };
    env.push(("LEASEHOLD_KEY", first));
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
        &format!("the lease of {shown}"),
        reporter,
        || {
            let now_remaining = guard.remaining();
            if now_remaining > remaining + Duration::from_millis(1) {
                reporter.say(format_args!(
                    "renewed {shown} ({} left)",
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
                    "released {shown}, kept held until {} after the grant",
                    humantime::format_duration(keep)
                )),
                None => reporter.say(format_args!("released {shown}")),
            }
            Ok(code)
        }
        Ok(()) | Err(Error::LeaseLost { .. }) => {
            if !ended.lost {
                eprintln!(
                    "leasehold: the lease of {shown} was lost before the command ended (exit \
                     code {code}); another instance may have run at the same time"
                );
            }
            Ok(exit::LOST)
        }
        Err(e) => {
            eprintln!(
                "leasehold: the command ended (exit code {code}) but releasing {shown} failed: \
                 {}; the lock runs out after its time-to-live",
                for_cli(&e.to_string())
            );
            Ok(exit::ERROR)
        }
    }
}
