//! The supervisor that runs a command for `run` and `lead`: it starts the command, forwards
//! the signals leasehold receives, and stops the command when the lease (or leadership) is
//! lost: SIGTERM, then SIGKILL after the grace period.
//!
//! The command stays in leasehold's process group, so that it can read a terminal. A signal
//! sent to leasehold (`kill`) is forwarded to it; one a terminal generates (Ctrl-C) already
//! reaches the whole foreground group, so leasehold does not forward it a second time. A
//! signal sent to the whole group (`kill -TERM -PGID`) reaches the command twice. On Linux
//! the command also gets SIGTERM when leasehold itself dies (even by SIGKILL), because its lock
//! would run out and another instance could start.

use crate::exit::{self, Failure};
use crate::report::Reporter;
use leasehold::crossbeam_channel::{self, select};
use std::ffi::OsString;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

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
pub fn code_of(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => (128 + signal) as u8,
        (None, None) => exit::ERROR,
    }
}

/// Starts `command` with `env`; on failure, the exit code a shell would give and a message.
pub fn spawn(command: &[OsString], env: &[(&str, String)]) -> Result<Child, (u8, String)> {
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
    pub status: std::process::ExitStatus,
    /// The lease or leadership was lost while it ran (it was told to stop).
    pub lost: bool,
    /// A signal was forwarded to it.
    pub signalled: bool,
}

/// Waits for `child` to end, forwarding `signals` to it; when `losses` delivers, stops it with
/// SIGTERM and, after `grace`, SIGKILL. `what` names what can be lost in messages ("the lease
/// of \"KEY\""); `tick` runs about every 20 ms.
pub fn supervise<T: Loss>(
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

/// A signal leasehold caught.
#[derive(Debug, Clone, Copy)]
pub struct Received {
    pub signal: i32,
    /// Sent by the kernel for a terminal (Ctrl-C, hangup): it went to the whole
    /// foreground process group, the command included, so it is not forwarded again.
    pub from_terminal: bool,
}

/// SIGINT, SIGTERM and SIGHUP received by leasehold, for forwarding to the command.
pub fn forward_signals() -> Result<crossbeam_channel::Receiver<Received>, Failure> {
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
