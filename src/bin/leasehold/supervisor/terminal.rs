//! The terminal: handing its foreground to the command's process group and taking it back.
#![allow(unsafe_code)]

use std::os::unix::io::RawFd;

/// leasehold's standard input, a terminal whose foreground process group is leasehold's.
pub struct Terminal {
    fd: RawFd,
    /// leasehold's own process group, which gets the terminal back.
    own_group: libc::pid_t,
}

impl Terminal {
    /// The terminal on standard input, if leasehold is in its foreground process group (an
    /// interactive shell started it in the foreground); `None` under cron, systemd, a pipe,
    /// or in the background.
    pub fn foreground() -> Option<Terminal> {
        let fd = libc::STDIN_FILENO;
        // SAFETY: isatty, tcgetpgrp and getpgrp only read the state of a descriptor and of
        // this process.
        unsafe {
            if libc::isatty(fd) != 1 {
                return None;
            }
            let own_group = libc::getpgrp();
            (libc::tcgetpgrp(fd) == own_group).then_some(Terminal { fd, own_group })
        }
    }

    /// The terminal's descriptor, for the command's child to take the foreground itself.
    pub fn fd(&self) -> RawFd {
        self.fd
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
            libc::tcsetpgrp(self.fd, group);
            libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
        }
    }

    /// Gives the terminal back to leasehold's own process group.
    pub fn take_back(&self) {
        self.give_to(self.own_group);
    }
}
