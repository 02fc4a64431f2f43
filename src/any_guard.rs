//! [`AnyGuard`]: one type for a held lease of any kind, for code that holds a lock, a permit
//! or a reader/writer side depending on its configuration (the `leasehold run` command, the
//! stress tester) and treats them alike afterwards.

use crate::{LeaseLost, LockGuard, Permit, ReadGuard, Result, WriteGuard};
use crossbeam_channel::Receiver;
use std::time::Duration;

/// A held lease of any kind: a [`LockGuard`], a semaphore's [`Permit`], or a reader/writer
/// lock's [`ReadGuard`] or [`WriteGuard`]. Each converts into it with `From`; the methods are
/// those every kind shares, and dropping it releases the lease as dropping the guard inside
/// does.
///
/// ```
/// # fn main() -> leasehold::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let path = dir.path().join("locks.db");
/// use leasehold::{AnyGuard, LockRegistry};
///
/// let registry = LockRegistry::sqlite(&path).create_table(true).build()?;
/// let shared = std::env::var_os("SHARED").is_some();
/// let held: AnyGuard = if shared {
///     registry.rw_lock("report")?.read()?.into()
/// } else {
///     registry.obtain("report")?.lock()?.into()
/// };
/// assert!(held.is_held());
/// assert_eq!(held.name(), "report");
/// println!("token {}", held.fencing_token());
/// held.unlock()?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub enum AnyGuard {
    /// A lock's guard.
    Lock(LockGuard),
    /// A semaphore's permit.
    Permit(Permit),
    /// A reader/writer lock's read side.
    Read(ReadGuard),
    /// A reader/writer lock's write side.
    Write(WriteGuard),
}

/// Calls the same method on whichever guard is inside.
macro_rules! each {
    ($self:expr, $guard:ident => $call:expr) => {
        match $self {
            AnyGuard::Lock($guard) => $call,
            AnyGuard::Permit($guard) => $call,
            AnyGuard::Read($guard) => $call,
            AnyGuard::Write($guard) => $call,
        }
    };
}

impl AnyGuard {
    /// The name it was taken with (a lock's key).
    pub fn name(&self) -> &str {
        match self {
            AnyGuard::Lock(guard) => guard.key(),
            AnyGuard::Permit(permit) => permit.name(),
            AnyGuard::Read(guard) => guard.name(),
            AnyGuard::Write(guard) => guard.name(),
        }
    }

    /// `true` while the lease is held: not reported lost and not past its deadline.
    pub fn is_held(&self) -> bool {
        each!(self, guard => guard.is_held())
    }

    /// The fencing token of the grant behind it (see each kind's `fencing_token`: a permit's
    /// and a read side's order the grants of their slot only).
    pub fn fencing_token(&self) -> u64 {
        each!(self, guard => guard.fencing_token())
    }

    /// How long the lease is certainly still held if no renewal succeeds from now on.
    pub fn remaining(&self) -> Duration {
        each!(self, guard => guard.remaining())
    }

    /// A channel that receives one [`LeaseLost`] if the lease is lost (at once if it already
    /// is); it disconnects without a message when the hold ends normally.
    pub fn loss_channel(&self) -> Receiver<LeaseLost> {
        each!(self, guard => guard.loss_channel())
    }

    /// Renews the lease now with its current time-to-live.
    pub fn renew(&self) -> Result<()> {
        each!(self, guard => guard.renew())
    }

    /// Renews the lease now with a new time-to-live, which later renewals keep (see
    /// [`LockGuard::renew_with_ttl`]).
    pub fn renew_with_ttl(&self, ttl: Duration) -> Result<()> {
        each!(self, guard => guard.renew_with_ttl(ttl))
    }

    /// Releases the lease and reports whether it was still held until then, as the guard
    /// inside does.
    pub fn unlock(self) -> Result<()> {
        each!(self, guard => guard.unlock())
    }
}

impl From<LockGuard> for AnyGuard {
    fn from(guard: LockGuard) -> AnyGuard {
        AnyGuard::Lock(guard)
    }
}

impl From<Permit> for AnyGuard {
    fn from(permit: Permit) -> AnyGuard {
        AnyGuard::Permit(permit)
    }
}

impl From<ReadGuard> for AnyGuard {
    fn from(guard: ReadGuard) -> AnyGuard {
        AnyGuard::Read(guard)
    }
}

impl From<WriteGuard> for AnyGuard {
    fn from(guard: WriteGuard) -> AnyGuard {
        AnyGuard::Write(guard)
    }
}
