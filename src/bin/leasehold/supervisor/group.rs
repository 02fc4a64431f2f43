//! The command's process group: starting the command in it, signalling it, and telling when
//! every process of it has ended.
#![allow(unsafe_code)]

use super::terminal::Terminal;
use super::watchdog::Watchdog;
use crate::exit::{self, Failure};
use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus};

/// Whether any process of process group `pgid` is left (one we may not signal counts).
pub fn exists(pgid: libc::pid_t) -> bool {
    // SAFETY: kill(2) with signal 0 only checks; a negative pid names a process group.
    let sent = unsafe { libc::kill(-pgid, 0) };
    sent == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Sends `signal` to every process of group `pgid`, if any is left.
pub fn signal_group(pgid: libc::pid_t, signal: libc::c_int) {
    if exists(pgid) {
        // SAFETY: kill(2) on a process group that still has members, so that its id has not
        // been given to another group.
        unsafe {
            libc::kill(-pgid, signal);
        }
    }
}

/// The exit code of a status: its code, or 128 + the signal that ended it.
pub fn code_of(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => (128 + signal) as u8,
        (None, None) => exit::ERROR,
    }
}

/// Makes leasehold the parent of the processes of the command's group whose own parent ends
/// (Linux: a child subreaper), so that it reaps them itself the moment they end: a zombie
/// still counts as a member of its group, and the init of some containers reaps orphans a
/// second or more late. Elsewhere init adopts and reaps them.
fn adopt_orphans() {
    // SAFETY: prctl(2) with PR_SET_CHILD_SUBREAPER and an integer argument changes only this
    // process's attribute.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1);
    }
}

/// A command running in a process group of its own.
pub struct Group<'w> {
    /// The command's pid, which is also its group's id.
    pid: libc::pid_t,
    /// The command's status, once it has been reaped.
    status: Option<ExitStatus>,
    /// The terminal the group was given, to take back when it is gone.
    terminal: Option<Terminal>,
    watchdog: &'w Watchdog,
    finished: bool,
}

/// What [`Group::poll`] found.
pub enum State {
    /// The command runs.
    Running,
    /// The command was stopped (SIGTSTP, SIGSTOP, SIGTTIN).
    Stopped,
    /// The command has ended (with this status); processes it started are left in its group.
    Leftovers(ExitStatus),
    /// The command and every process of its group have ended.
    Gone(ExitStatus),
}

/// Starts `command` with `env` in a new process group, which gets the terminal when
/// leasehold has it (see [`Terminal::foreground`]); the group's id reaches `watchdog` before
/// the command runs. On failure, the exit code a shell would give and a message.
pub fn spawn<'w>(
    command: &[OsString],
    env: &[(&str, String)],
    watchdog: &'w Watchdog,
) -> Result<Group<'w>, (u8, String)> {
    let mut builder = Command::new(&command[0]);
    builder.args(&command[1..]);
    for (name, value) in env {
        builder.env(name, value);
    }
    adopt_orphans();
    let terminal = Terminal::foreground();
    let tty = terminal.as_ref().map(Terminal::fd);
    let watch = watchdog.fd();
    // SAFETY: the closure runs in the child between fork and exec; it calls only setpgid,
    // getpid, sigemptyset, sigaddset, sigprocmask, tcsetpgrp, signal and write, which are
    // async-signal-safe, and allocates nothing.
    unsafe {
        builder.pre_exec(move || {
            if libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let pid = libc::getpid();
            if let Some(tty) = tty {
                // From the background group this would stop us with SIGTTOU; blocked, it
                // goes through. A failure leaves the command in the background.
                let mut blocked = std::mem::zeroed::<libc::sigset_t>();
                let mut before = std::mem::zeroed::<libc::sigset_t>();
                libc::sigemptyset(&mut blocked);
                libc::sigaddset(&mut blocked, libc::SIGTTOU);
                libc::sigprocmask(libc::SIG_BLOCK, &blocked, &mut before);
                libc::tcsetpgrp(tty, pid);
                libc::sigprocmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
            }
            // The watchdog learns the group before the command runs. A watchdog that is gone
            // fails the write (EPIPE, SIGPIPE ignored for it) and the command does not start.
            let record = pid.to_ne_bytes();
            let before = libc::signal(libc::SIGPIPE, libc::SIG_IGN);
            let written = libc::write(watch, record.as_ptr().cast(), record.len());
            libc::signal(libc::SIGPIPE, before);
            if written != record.len() as isize {
                // std carries only an errno back from here; EPIPE is ours (exec never fails so).
                return Err(std::io::Error::from_raw_os_error(libc::EPIPE));
            }
            Ok(())
        });
    }
    match builder.spawn() {
        Ok(child) => Ok(Group {
            pid: child.id() as libc::pid_t,
            status: None,
            terminal,
            watchdog,
            finished: false,
        }),
        Err(e) => {
            // The child may have taken the terminal before exec failed; leasehold had it.
            if let Some(terminal) = &terminal {
                terminal.give_to(terminal.own_group());
            }
            watchdog.disarm();
            if e.raw_os_error() == Some(libc::EPIPE) {
                return Err((
                    exit::ERROR,
                    "leasehold's watchdog ended, so the command could not be stopped if \
                     leasehold died; not starting it"
                        .to_string(),
                ));
            }
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_RUN,
            };
            Err((code, format!("cannot run {:?}: {e}", command[0])))
        }
    }
}

impl Group<'_> {
    /// The group's id (the command's pid).
    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }

    /// Whether the group was given the terminal.
    pub fn has_terminal(&self) -> bool {
        self.terminal.is_some()
    }

    /// Sends `signal` to every process of the group.
    pub fn signal(&self, signal: libc::c_int) {
        signal_group(self.pid, signal);
    }

    /// SIGTERM to the group, and SIGCONT so that stopped processes act on it.
    pub fn terminate(&self) {
        self.signal(libc::SIGTERM);
        self.signal(libc::SIGCONT);
    }

    /// SIGKILL to the group.
    pub fn kill(&self) {
        self.signal(libc::SIGKILL);
    }

    /// Reaps the command if it has ended, and says what is left.
    ///
    /// Processes of the group whose parent died are adopted by leasehold ([`adopt_orphans`],
    /// Linux) or by init (or leasehold again, when it is PID 1 of a container): so leasehold
    /// also reaps any child of its own in the group. A zombie still counts as a member of its
    /// group, and one nobody reaped would keep the group "running" for ever.
    pub fn poll(&mut self) -> Result<State, Failure> {
        loop {
            let mut raw = 0;
            // SAFETY: waitpid(2) on children of ours in the command's group, which nobody else
            // reaps.
            let reaped =
                unsafe { libc::waitpid(-self.pid, &mut raw, libc::WNOHANG | libc::WUNTRACED) };
            if reaped == 0 {
                break;
            }
            if reaped < 0 {
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    // No child of ours is left in the group.
                    Some(libc::ECHILD) if self.status.is_some() => break,
                    _ => {
                        return Err(Failure::new(
                            exit::ERROR,
                            format!("waiting for the command: {e}"),
                        ))
                    }
                }
            }
            if reaped != self.pid {
                continue; // an adopted process of the group: its status is not ours to report
            }
            if libc::WIFSTOPPED(raw) {
                return Ok(State::Stopped);
            }
            self.status = Some(ExitStatus::from_raw(raw));
        }
        self.reap_strays();
        match self.status {
            None => Ok(State::Running),
            Some(status) if exists(self.pid) => Ok(State::Leftovers(status)),
            Some(status) => Ok(State::Gone(status)),
        }
    }

    /// Reaps the processes leasehold adopted ([`adopt_orphans`]) that had left the command's
    /// group (`setsid`) and have ended since, so that none stays a zombie while leasehold runs.
    /// Each is looked at before it is reaped: the command's group and the watchdog are reaped
    /// elsewhere, and the first of them found waitable ends the round.
    fn reap_strays(&self) {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        loop {
            // SAFETY: waitid(2) with WNOWAIT fills `info` without reaping; getpgid(2) reads a
            // process's group; waitpid(2) reaps one child of ours that no other code waits for.
            unsafe {
                let mut info = std::mem::zeroed::<libc::siginfo_t>();
                let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
                if libc::waitid(libc::P_ALL, 0, &mut info, flags) != 0 {
                    return;
                }
                let pid = info.si_pid();
                if pid == 0 || pid == self.watchdog.pid() || libc::getpgid(pid) == self.pid {
                    return;
                }
                let mut raw = 0;
                libc::waitpid(pid, &mut raw, libc::WNOHANG);
            }
        }
    }

    /// The command has ended: gives the terminal back to leasehold's own process group if the
    /// command's group has it, as a shell takes it back once its job's process has ended.
    pub fn release_terminal(&self) {
        if let Some(terminal) = &self.terminal {
            terminal.take_back_from(self.pid);
        }
    }

    /// The command was stopped. If leasehold has a terminal (Ctrl-Z, or the command read the
    /// terminal from the background after `bg`), leasehold takes the terminal back and stops
    /// its own process group, as a shell expects of a job (between two database statements,
    /// see [`super::stops`]); when continued, it gives the
    /// terminal to the command again if the job is in the foreground (`fg`; after `bg` the
    /// shell keeps it) and continues the command. A group that is orphaned ignores that stop,
    /// and the command is continued at once. A command stopped otherwise (`kill -STOP`,
    /// without a terminal) is left to whoever stopped it.
    pub fn stopped(&self) {
        let Some(terminal) = &self.terminal else {
            return;
        };
        terminal.take_back_from(self.pid);
        super::stops::stop_self(super::stops::Whom::MyGroup);
        if terminal.ours() {
            terminal.give_to(self.pid);
        }
        self.signal(libc::SIGCONT);
    }

    /// The group is gone: take the terminal back, and disarm the watchdog.
    pub fn finish(&mut self) {
        if !self.finished {
            self.finished = true;
            if let Some(terminal) = &self.terminal {
                terminal.take_back_from(self.pid);
            }
            self.watchdog.disarm();
        }
    }
}

impl Drop for Group<'_> {
    /// A group given up on (leasehold fails while it runs) keeps the watchdog armed: it is
    /// stopped when leasehold exits. The terminal comes back at once.
    fn drop(&mut self) {
        if !self.finished {
            if let Some(terminal) = &self.terminal {
                terminal.take_back_from(self.pid);
            }
        }
    }
}
