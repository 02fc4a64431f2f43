//! The terminal: handing its foreground to the command's process group and taking it back.
#![allow(unsafe_code)]

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::{AsRawFd, RawFd};

/// leasehold's controlling terminal, whose foreground process group is leasehold's.
pub struct Terminal {
    /// `/dev/tty`, open (close-on-exec) for as long as the command runs.
    tty: File,
    /// leasehold's own process group, which gets the terminal back.
    own_group: libc::pid_t,
}

impl Terminal {
    /// The controlling terminal, if leasehold is in its foreground process group (an
    /// interactive shell started it in the foreground); `None` under cron, systemd or
    /// `setsid`, and in the background.
    ///
    /// The controlling terminal rather than standard input: with input redirected
    /// (`< file`, `echo | leasehold …`), the command may still read the terminal (a password
    /// prompt reads `/dev/tty`), and Ctrl-Z must stop the command before leasehold: a
    /// leasehold stopped alone would stop renewing while its command runs on.
    pub fn foreground() -> Option<Terminal> {
        let tty = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open("/dev/tty")
            .ok()?;
        // SAFETY: tcgetpgrp and getpgrp only read the state of a descriptor we own and of
        // this process.
        let (foreground, own_group) =
            unsafe { (libc::tcgetpgrp(tty.as_raw_fd()), libc::getpgrp()) };
        (foreground == own_group).then_some(Terminal { tty, own_group })
    }

    /// The terminal's descriptor, for the command's child to take the foreground itself.
    pub fn fd(&self) -> RawFd {
        self.tty.as_raw_fd()
    }

    /// Makes `group` the terminal's foreground process group. leasehold may be in the
    /// background by then, where tcsetpgrp would stop it with SIGTTOU: the calling thread
    /// blocks SIGTTOU around the call.
    pub fn give_to(&self, group: libc::pid_t) {
        // SAFETY: the signal sets are initialised by sigemptyset before use; pthread_sigmask
        // changes this thread's mask only, and it is restored.
        unsafe {
            let mut blocked = std::mem::zeroed::<libc::sigset_t>();
            let mut before = std::mem::zeroed::<libc::sigset_t>();
            libc::sigemptyset(&mut blocked);
            libc::sigaddset(&mut blocked, libc::SIGTTOU);
            libc::pthread_sigmask(libc::SIG_BLOCK, &blocked, &mut before);
            libc::tcsetpgrp(self.tty.as_raw_fd(), group);
            libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
        }
    }

    /// The terminal's foreground process group now.
    fn foreground_group(&self) -> libc::pid_t {
        // SAFETY: tcgetpgrp only reads the state of a descriptor we own.
        unsafe { libc::tcgetpgrp(self.tty.as_raw_fd()) }
    }

    /// leasehold's own process group.
    pub fn own_group(&self) -> libc::pid_t {
        self.own_group
    }

    /// Whether leasehold's own process group is in the foreground (after `fg`, not `bg`).
    pub fn ours(&self) -> bool {
        self.foreground_group() == self.own_group
    }

    /// Gives the terminal back to leasehold's own process group, if `group` (the command's,
    /// alive or gone) still has it: after `bg` the shell has it, and keeps it.
    pub fn take_back_from(&self, group: libc::pid_t) {
        if self.foreground_group() == group {
            self.give_to(self.own_group);
        }
    }
}
