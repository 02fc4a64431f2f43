//! The watchdog: a process that stops the command's group when leasehold dies.
//!
//! leasehold starts it (itself again, as the hidden subcommand `__watchdog`) before it takes
//! the lock, in a process group of its own so that signals meant for leasehold's job do not
//! reach it. Its standard input is the read end of a pipe; only leasehold holds the write end
//! (close-on-exec, so neither the watchdog nor the command inherits it past `exec`). On the pipe
//! come 4-byte records: a process group id (> 0) to guard, written by the command's child
//! before `exec`, or 0 once that group is gone. At end-of-file — leasehold exited or was
//! killed, the kernel closed its end — the watchdog sends the guarded group, if it has members
//! left, SIGTERM (and SIGCONT), waits up to the grace period for it to end, then sends
//! SIGKILL, and exits.
//!
//! The watchdog ignores SIGINT, SIGHUP and SIGQUIT (a terminal's signals); SIGKILL ends it,
//! and with it the protection: leasehold does not start a command without a watchdog, but
//! cannot replace one killed afterwards.
#![allow(unsafe_code)]

use super::group::{exists, signal_group};
use crate::args::WatchdogArgs;
use crate::exit::{self, Failure};
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::io::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// leasehold's side of the watchdog: the write end of its pipe.
pub struct Watchdog {
    child: Child,
    pipe: Option<File>,
}

/// A pipe whose two ends are close-on-exec.
fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe(2) fills the two descriptors, which we then own; fcntl(2) sets a flag on
    // each. No other thread forks while this runs (leasehold starts processes from the main
    // thread only), so neither end leaks into a child before its flag is set.
    unsafe {
        if libc::pipe(fds.as_mut_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let ends = (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]));
        for fd in fds {
            if libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(ends)
    }
}

impl Watchdog {
    /// Starts the watchdog, which gives a guarded group `grace` after SIGTERM.
    pub fn start(grace: Duration) -> Result<Watchdog, Failure> {
        let failed = |e: std::io::Error| {
            Failure::new(
                exit::ERROR,
                format!(
                    "cannot start leasehold's watchdog (which stops the command if leasehold \
                     dies): {e}"
                ),
            )
        };
        let (read, write) = pipe().map_err(failed)?;
        // On Linux, /proc/self/exe runs this very binary even if it was replaced or deleted
        // since (an upgrade while a job runs); elsewhere, the path it was started from.
        #[cfg(any(target_os = "linux", target_os = "android"))]
        let program = std::path::PathBuf::from("/proc/self/exe");
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        let program = std::env::current_exe().map_err(failed)?;
        let child = Command::new(program)
            .arg0("leasehold")
            .args(["__watchdog", "--grace-ms", &grace.as_millis().to_string()])
            .stdin(Stdio::from(read))
            .stdout(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(failed)?;
        Ok(Watchdog {
            child,
            pipe: Some(File::from(write)),
        })
    }

    /// Fails if the watchdog has ended (someone killed it): a command started now could not
    /// be stopped if leasehold died.
    pub fn check(&mut self) -> Result<(), Failure> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(Failure::new(
                exit::ERROR,
                format!(
                    "leasehold's watchdog ended ({status}), so the command could not be stopped \
                     if leasehold died; not starting it"
                ),
            )),
            Err(e) => Err(Failure::new(
                exit::ERROR,
                format!("checking leasehold's watchdog: {e}"),
            )),
        }
    }

    /// The watchdog's process id.
    #[cfg_attr(not(any(target_os = "linux", target_os = "android")), allow(dead_code))]
    pub fn pid(&self) -> libc::pid_t {
        self.child.id() as libc::pid_t
    }

    /// The write end, for the command's child to announce its group.
    pub fn fd(&self) -> RawFd {
        self.pipe.as_ref().map_or(-1, |pipe| pipe.as_raw_fd())
    }

    /// Tells the watchdog that the group it guards is gone.
    pub fn disarm(&self) {
        if let Some(mut pipe) = self.pipe.as_ref() {
            let _ = pipe.write_all(&0i32.to_ne_bytes());
        }
    }
}

impl Drop for Watchdog {
    /// Closes the pipe, and waits for the watchdog to end: at once when nothing is guarded,
    /// after stopping the group otherwise.
    fn drop(&mut self) {
        self.pipe = None;
        let _ = self.child.wait();
    }
}

/// The watchdog's own program (`leasehold __watchdog`).
pub fn watch(args: WatchdogArgs) -> Result<u8, Failure> {
    // SAFETY: signal(2) with SIG_IGN, before any other thread exists; prctl(2) names this
    // thread from a NUL-terminated string of 15 bytes.
    unsafe {
        for signal in [libc::SIGINT, libc::SIGHUP, libc::SIGQUIT] {
            libc::signal(signal, libc::SIG_IGN);
        }
        // `ps` shows "leasehold-watch" rather than the "exe" of /proc/self/exe.
        #[cfg(any(target_os = "linux", target_os = "android"))]
        libc::prctl(libc::PR_SET_NAME, c"leasehold-watch".as_ptr());
    }
    let grace = Duration::from_millis(args.grace_ms);
    let mut input = std::io::stdin().lock();
    let mut guarded = None;
    let mut record = [0u8; 4];
    while input.read_exact(&mut record).is_ok() {
        let group = i32::from_ne_bytes(record);
        guarded = (group > 0).then_some(group as libc::pid_t);
    }
    let Some(group) = guarded.filter(|group| exists(*group)) else {
        return Ok(0);
    };
    eprintln!(
        "leasehold: leasehold ended while its command ran; stopping the command's process group \
         {group} with SIGTERM, then SIGKILL after {}",
        humantime::format_duration(grace)
    );
    signal_group(group, libc::SIGTERM);
    signal_group(group, libc::SIGCONT);
    let started = Instant::now();
    while exists(group) && started.elapsed() < grace {
        std::thread::sleep(Duration::from_millis(20));
    }
    if exists(group) {
        eprintln!(
            "leasehold: the command's process group {group} did not end after SIGTERM; sending \
             SIGKILL"
        );
        signal_group(group, libc::SIGKILL);
    }
    Ok(0)
}
