//! The supervisor that runs a command for `run` and `lead`, and stops it — every process of
//! it — when the lease (or leadership) is lost or leasehold itself dies.
//!
//! # Design
//!
//! - **Its own process group** ([`group`]). The command starts in a new process group whose
//!   id is its pid (`setpgid` in the child, before `exec`). Everything it starts stays in that
//!   group unless it leaves on purpose, so leasehold can signal the whole tree with
//!   `kill(-pgid)`, and tell when it has ended: `kill(-pgid, 0)` fails with `ESRCH`.
//! - **Signals** ([`signals`]): SIGINT, SIGQUIT, SIGTERM and SIGHUP sent to leasehold are
//!   forwarded to the whole group, once; a forwarded SIGTERM is followed by SIGKILL to the
//!   group after `--grace`, as after a loss. SIGTSTP and SIGCONT ([`stops`]) go to the group
//!   too, and leasehold stops itself only between two database statements.
//! - **A loss**: SIGTERM (and SIGCONT, so that a stopped process can act on it) to the group;
//!   after `--grace`, SIGKILL to the group. leasehold reports "lost" (74) only once no process
//!   of the group is left. When the command ends by itself, leasehold waits likewise for what
//!   it left running in its group (as flock(1) holds its lock while a child started in the
//!   background keeps the descriptor) and only then releases.
//! - **What the command left running**: once the command has ended, leasehold takes the
//!   terminal back, as a shell does when its job's process ends, and says on stderr what it
//!   waits for (at once under `--verbose`, else after a second, so that the last processes of
//!   a pipeline pass unmentioned). An interrupt (Ctrl-C or Ctrl-\ on the terminal, which now
//!   reach leasehold; SIGINT or SIGQUIT) then stops the group as a loss does — a shell's
//!   background jobs ignore SIGINT and SIGQUIT, so forwarding them would change nothing.
//! - **The terminal** ([`terminal`]): when leasehold has a controlling terminal and is in
//!   its foreground process group (whatever its standard input), the command's group becomes
//!   the foreground group (`tcsetpgrp`, SIGTTOU blocked around it) before the command starts,
//!   and leasehold takes the terminal back when the group is gone. The command reads the
//!   terminal as if run directly; Ctrl-C reaches its group once (leasehold, now in the
//!   background, does not see it). Ctrl-Z stops the command's group; leasehold then takes the
//!   terminal back and stops its own group too, so the shell sees the job stopped; `fg`
//!   continues leasehold, which gives the terminal back and continues the command (`bg`
//!   continues it without the terminal). While stopped, leasehold does not renew: a stop
//!   longer than the time-to-live loses the lease, and the command is stopped as after any
//!   loss once it is continued.
//! - **leasehold's death** ([`watchdog`]): a small process, leasehold run again as the hidden
//!   subcommand `__watchdog`, in its own process group, holds the read end of a pipe whose
//!   write end only leasehold holds. The command's child writes its group id into the pipe
//!   before `exec`, so the watchdog knows the group before the command runs. When leasehold
//!   dies, even by SIGKILL, the kernel closes the write end; the watchdog reads end-of-file,
//!   sends SIGTERM to the group, waits `--grace`, then sends SIGKILL. Once the group is gone,
//!   leasehold tells the watchdog so ("disarms" it) before it releases the lock.
//!
//! Zombies: a process that died stays a member of its group until reaped. On Linux leasehold is
//! a child subreaper: the orphans of the group become its children, and it reaps every child
//! of its own in the group, not only the command ([`Group::poll`]), the moment it ends —
//! rather than when the init of the system or container gets to it, which may be a second or
//! more later. Orphans that had left the group are reaped too. Elsewhere init adopts and reaps
//! orphans, or leasehold when it is PID 1.
//!
//! Group ids are process ids, reused once free: leasehold and the watchdog signal a group only
//! after checking that it has members (a group id stays taken while it has any), and leasehold
//! disarms the watchdog as soon as the group is gone. What is left is the moment between a
//! group's last member ending and that check, too short for the system to hand the id out
//! again in practice.
//!
//! Not tracked: a process that leaves the group (`setsid`, a daemon that detaches, a
//! `setpgid` of its own) is no longer the command's as far as leasehold can tell, and runs on
//! after a loss or leasehold's death. Run such programs in the foreground (most daemons have
//! an option for it), or under a service manager.

mod group;
mod signals;
pub mod stops;
mod terminal;
pub mod watchdog;

pub use group::{code_of, spawn, Group, State};
pub use signals::forward_signals;
pub use stops::Stops;
pub use watchdog::Watchdog;

use crate::exit::Failure;
use crate::report::Reporter;
use leasehold::crossbeam_channel::{self, select};
use std::time::{Duration, Instant};

/// What a loss channel reports: a lease's loss (`run`) or a term's (`lead`).
pub trait Loss {
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
pub struct Ended {
    /// The command's own status (the first process, not those it started).
    pub status: std::process::ExitStatus,
    /// The lease or leadership was lost while it ran (it was told to stop).
    pub lost: bool,
    /// A signal was forwarded to it, or an interrupt stopped what it left running.
    pub signalled: bool,
}

/// Waits until every process of `group` has ended, forwarding `signals` to the group; when
/// `losses` delivers, stops the group with SIGTERM and, after `grace`, SIGKILL, and likewise
/// SIGKILL `grace` after a forwarded SIGTERM, or after an interrupt (SIGINT, SIGQUIT) that
/// arrives once the command has ended and left processes in its group. `stops` forwards
/// SIGTSTP and SIGCONT while the group runs. `what` names what can be lost in messages ("the
/// lease of \"KEY\""); `tick` runs about every 20 ms until a loss.
#[allow(clippy::too_many_arguments)]
pub fn supervise<T: Loss>(
    mut group: Group<'_>,
    losses: crossbeam_channel::Receiver<T>,
    signals: &crossbeam_channel::Receiver<i32>,
    stops: &Stops,
    grace: Duration,
    what: &str,
    reporter: &Reporter,
    tick: impl FnMut(),
) -> Result<Ended, Failure> {
    stops.running(group.pid(), group.has_terminal());
    let ended = watch_group(&mut group, losses, signals, grace, what, reporter, tick);
    stops.ended();
    ended
}

/// How long the processes a command left in its group may outlive it before leasehold says,
/// without `--verbose`, that it waits for them: a pipeline's last processes end within it.
const LEFTOVERS_SAID_AFTER: Duration = Duration::from_secs(1);

/// [`supervise`], while `stops` knows the group.
fn watch_group<T: Loss>(
    group: &mut Group<'_>,
    losses: crossbeam_channel::Receiver<T>,
    signals: &crossbeam_channel::Receiver<i32>,
    grace: Duration,
    what: &str,
    reporter: &Reporter,
    mut tick: impl FnMut(),
) -> Result<Ended, Failure> {
    let mut losses = losses;
    let (mut lost_at, mut killed, mut signalled) = (None::<Instant>, false, false);
    // When the group was told to end (a loss, a forwarded SIGTERM, an interrupt once the
    // command has ended): SIGKILL `grace` later.
    let mut terminated_at = None::<Instant>;
    // When the command ended while processes of its group lived on, and whether that was said.
    let (mut command_ended, mut said_leftovers) = (None::<Instant>, false);
    let grace_text = humantime::format_duration(grace);
    loop {
        select! {
            recv(losses) -> lost => {
                if let Ok(lost) = lost {
                    eprintln!(
                        "leasehold: lost {what} ({}); stopping the command's process group with \
                         SIGTERM, then SIGKILL after {grace_text}",
                        crate::exit::for_cli(&lost.reason()),
                    );
                    group.terminate();
                    lost_at = Some(Instant::now());
                    terminated_at = terminated_at.or(lost_at);
                }
                losses = crossbeam_channel::never();
            },
            recv(signals) -> received => {
                if let Ok(signal) = received {
                    signalled = true;
                    let interrupt = signal == libc::SIGINT || signal == libc::SIGQUIT;
                    if interrupt && command_ended.is_some() {
                        // What is left of the group ignores or never sees the terminal's
                        // signals (a shell's background jobs ignore SIGINT and SIGQUIT):
                        // leasehold stops it.
                        if terminated_at.is_none() {
                            eprintln!(
                                "leasehold: interrupted: stopping what the command left in its \
                                 process group {} with SIGTERM, then SIGKILL after {grace_text}",
                                group.pid()
                            );
                            group.terminate();
                            terminated_at = Some(Instant::now());
                        }
                    } else if signal == libc::SIGTERM {
                        reporter.say(format_args!(
                            "forwarding signal {signal} to the command's process group"
                        ));
                        // As after a loss: stopped processes act on it, and SIGKILL follows
                        // after the grace (as `timeout -k` does).
                        group.terminate();
                        if terminated_at.is_none() {
                            reporter.say(format_args!(
                                "the command's process group gets SIGKILL if it has not ended \
                                 in {grace_text}"
                            ));
                            terminated_at = Some(Instant::now());
                        }
                    } else {
                        reporter.say(format_args!(
                            "forwarding signal {signal} to the command's process group"
                        ));
                        group.signal(signal);
                    }
                }
            },
            default(Duration::from_millis(20)) => {}
        }
        match group.poll()? {
            State::Running => {}
            State::Stopped => group.stopped(),
            State::Leftovers(status) => {
                let ended = *command_ended.get_or_insert_with(|| {
                    // As a shell does once its job's process has ended: the terminal's
                    // signals go to leasehold again, not to what the command left running.
                    group.release_terminal();
                    Instant::now()
                });
                let say_after = match reporter.verbose {
                    true => Duration::ZERO,
                    false => LEFTOVERS_SAID_AFTER,
                };
                if !said_leftovers && ended.elapsed() >= say_after {
                    said_leftovers = true;
                    let pgid = group.pid();
                    let then = match terminated_at {
                        Some(_) => format!("they get SIGKILL {grace_text} after the SIGTERM"),
                        None if group.has_terminal() => {
                            format!("Ctrl-C stops them (SIGTERM, then SIGKILL after {grace_text})")
                        }
                        None => format!(
                            "SIGINT to leasehold (pid {}) stops them (SIGTERM, then SIGKILL \
                             after {grace_text})",
                            std::process::id()
                        ),
                    };
                    eprintln!(
                        "leasehold: the command ended (exit code {}); waiting for the processes \
                         it left in its process group {pgid} (`pgrep -g {pgid}` lists them) \
                         before giving up {what}; {then}",
                        code_of(status)
                    );
                }
            }
            State::Gone(status) => {
                group.finish();
                return Ok(Ended {
                    status,
                    lost: lost_at.is_some(),
                    signalled,
                });
            }
        }
        if !killed && terminated_at.is_some_and(|at| at.elapsed() >= grace) {
            eprintln!(
                "leasehold: the command's process group did not end within {grace_text} of \
                 SIGTERM; sending SIGKILL"
            );
            group.kill();
            killed = true;
        }
        if lost_at.is_none() {
            tick();
        }
    }
}
