//! `leasehold lead`: run a command while this instance leads a group; stop it when
//! leadership is lost, then stand by again (or exit, `--once`).

use crate::args::LeadArgs;
use crate::database::{builder_for, creating};
use crate::exit::{self, Failure};
use crate::report::Reporter;
use crate::supervisor::{code_of, forward_signals, spawn, supervise, Stops, Watchdog};
use leasehold::{Error, LeaderElection};

pub fn lead(args: LeadArgs, reporter: &Reporter) -> Result<u8, Failure> {
    // First of all: a SIGTSTP must never stop leasehold inside a statement.
    let stops = Stops::catch()?;
    let builder = builder_for(&args.database, creating(args.create))?;
    let election = LeaderElection::builder(builder, args.group.clone())
        .time_to_live(args.ttl)
        .idle_between_tries(args.poll)
        .build()?;
    let mut watchdog = Watchdog::start(args.grace)?;
    // Caught from the start: while standing by, a signal ends leasehold (128 + its number);
    // while the command runs, it goes to the command.
    let signals = forward_signals()?;
    let group = &args.group;
    loop {
        reporter.say(format_args!("standing by for the leadership of {group:?}"));
        let leadership = loop {
            if let Ok(signal) = signals.try_recv() {
                reporter.say(format_args!("signal {signal} while standing by; exiting"));
                return Ok((128 + signal) as u8);
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
        if let Err(failure) = watchdog.check() {
            leadership.resign()?;
            return Err(failure);
        }
        let command = match spawn(&args.command, &env, &watchdog) {
            Ok(command) => command,
            Err((code, message)) => {
                let resigned = leadership.resign();
                eprintln!("leasehold: {message}");
                resigned?;
                return Ok(code);
            }
        };
        let ended = supervise(
            command,
            leadership.loss_channel(),
            &signals,
            &stops,
            args.grace,
            &format!("the leadership of {group:?} (term {term})"),
            reporter,
            || {},
        );
        // If supervising failed, the watchdog stops the command's group before the leadership
        // is given up.
        let ended = match ended {
            Ok(ended) => ended,
            Err(failure) => {
                drop(watchdog);
                drop(leadership);
                return Err(failure);
            }
        };
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
                         failed: {}; the lease runs out after its time-to-live",
                        exit::for_cli(&e.to_string())
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
