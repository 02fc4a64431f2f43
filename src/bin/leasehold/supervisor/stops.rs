//! Stop signals: SIGTSTP and SIGCONT sent to leasehold, and leasehold stopping itself.
//!
//! A process stopped inside an SQLite statement that writes keeps the database file's write
//! lock: every lock of every process on that file waits until it is continued, and their
//! leases run out meanwhile. So leasehold never stops where SIGTSTP happens to find it. From
//! the start of `run` and `lead` a thread catches SIGTSTP and SIGCONT:
//!
//! - SIGTSTP while the command runs goes to the command's process group (leasehold goes on
//!   renewing). On a terminal the group's stop makes leasehold stop itself as a job
//!   ([`super::Group::stopped`]); otherwise leasehold keeps running and the command stays
//!   stopped until SIGCONT.
//! - SIGTSTP while no command runs (waiting for the lock, standing by) stops leasehold itself.
//! - SIGCONT while the command runs without a terminal goes to the command's group too (on a
//!   terminal, `fg` and `bg` reach leasehold, which continues the command itself once it has
//!   handed the terminal over).
//!
//! Leasehold stops itself only through [`stop_self`]: it first waits for the SQLite statement
//! in flight, if any, and keeps new ones from starting
//! ([`leasehold::pause_sqlite_statements`]) until it is continued; then it stops with SIGTSTP's
//! default action, so that a shell sees the job stopped by SIGTSTP (exit status 148), and an
//! orphaned process group ignores the stop as the kernel does for every such group.
#![allow(unsafe_code)]

use super::group::signal_group;
use crate::exit::{self, Failure};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;

/// What the catching thread needs to know: the command's group while it runs.
#[derive(Default)]
struct Shared {
    /// The command's process group, 0 while none runs.
    group: AtomicI32,
    /// Whether the command has the terminal.
    terminal: AtomicBool,
}

/// leasehold's side of the thread that catches SIGTSTP and SIGCONT.
pub struct Stops {
    shared: Arc<Shared>,
}

impl Stops {
    /// From now on SIGTSTP and SIGCONT are caught (see the module docs).
    pub fn catch() -> Result<Stops, Failure> {
        use signal_hook::consts::{SIGCONT, SIGTSTP};
        let mut signals = signal_hook::iterator::Signals::new([SIGTSTP, SIGCONT])
            .map_err(|e| Failure::new(exit::ERROR, format!("cannot catch signals: {e}")))?;
        let shared = Arc::new(Shared::default());
        let seen = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("leasehold-stops".into())
            .spawn(move || {
                for signal in signals.forever() {
                    let group = seen.group.load(Ordering::SeqCst);
                    match signal {
                        SIGTSTP if group > 0 => signal_group(group, SIGTSTP),
                        SIGTSTP => stop_self(Whom::Myself),
                        SIGCONT if group > 0 && !seen.terminal.load(Ordering::SeqCst) => {
                            signal_group(group, SIGCONT)
                        }
                        _ => {}
                    }
                }
            })
            .map_err(|e| Failure::new(exit::ERROR, format!("cannot start a thread: {e}")))?;
        Ok(Stops { shared })
    }

    /// The command runs in process group `group` (with the terminal, or not).
    pub fn running(&self, group: libc::pid_t, terminal: bool) {
        self.shared.terminal.store(terminal, Ordering::SeqCst);
        self.shared.group.store(group, Ordering::SeqCst);
    }

    /// No command runs any more.
    pub fn ended(&self) {
        self.shared.group.store(0, Ordering::SeqCst);
    }
}

/// Who stops in [`stop_self`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Whom {
    /// leasehold alone (its job's other processes got their own SIGTSTP, if any).
    Myself,
    /// leasehold's whole process group: its job, as a shell sees it.
    MyGroup,
}

/// Stops leasehold (or its process group) with SIGTSTP's default action, outside any SQLite
/// statement, and returns once it is continued (at once when the group is orphaned).
pub fn stop_self(whom: Whom) {
    #[cfg(feature = "sqlite")]
    let _pause = leasehold::pause_sqlite_statements();
    // SAFETY: sigaction(2) with a zeroed action whose handler is SIG_DFL and whose mask is
    // emptied by sigemptyset, saving the installed action (signal-hook's) to put it back
    // unchanged; raise(3) and kill(2) send SIGTSTP to this thread or to our own process group.
    unsafe {
        let mut default = std::mem::zeroed::<libc::sigaction>();
        default.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut default.sa_mask);
        let mut caught = std::mem::zeroed::<libc::sigaction>();
        if libc::sigaction(libc::SIGTSTP, &default, &mut caught) != 0 {
            return;
        }
        match whom {
            // To this thread: it stops the process before raise returns.
            Whom::Myself => {
                libc::raise(libc::SIGTSTP);
            }
            // Called from the main thread, which the kernel prefers for a signal to the
            // process; it acts on it on the way back from kill.
            Whom::MyGroup => {
                libc::kill(0, libc::SIGTSTP);
            }
        }
        libc::sigaction(libc::SIGTSTP, &caught, std::ptr::null_mut());
    }
}
