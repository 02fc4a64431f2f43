//! `leasehold run`: run a command while holding a lock, renewing it, and release it (or keep
//! it held, `--keep-for`) when the command ends.

use crate::args::RunArgs;
use crate::database::{registry, Tables};
use crate::exit::{self, Failure};
use crate::output::rounded;
use crate::report::Reporter;
use crate::supervisor::{code_of, forward_signals, spawn, supervise, Watchdog};
use leasehold::Error;
use std::time::Duration;

pub fn run(args: RunArgs, reporter: &Reporter) -> Result<u8, Failure> {
    let registry = registry(&args.database, Some(args.ttl), Tables::Create)?;
    // Before the lock: without a watchdog the command would not be stopped if leasehold died.
    let mut watchdog = Watchdog::start(args.grace)?;
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
        return Ok(args.conflict_exit_code);
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
