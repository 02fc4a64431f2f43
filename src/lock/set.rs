//! Lock sets: several keys of one registry held together, all or none.
//!
//! A set takes its keys one by one in one canonical order (their keys' byte order), with the
//! waits of a single lock. Every holder of overlapping sets, in this registry or another
//! instance, asks for the keys they share in the same order, so no two sets wait for each
//! other in a circle: the set that holds the furthest key along the order is never waiting
//! for another set. A thread that holds a lock and then asks for another lock or a set outside
//! that order orders its keys itself, as with any two locks.
//! A set that cannot have every key (a refusal, a deadline, an error) gives back the keys it
//! took before it returns, each as its own guard's drop does (a grant whose answer is unknown
//! is resolved as for a single lock), so nothing of a failed try outlives it.

use super::{Holding, Lock, LockGuard, ThisThread};
use crate::error::{Error, Result};
use crate::lease::LeaseLost;
use crossbeam_channel::Receiver;
use std::time::{Duration, Instant};

/// Several locks of one registry taken together: [`lock`](Self::lock) and the `try_` methods
/// return a [`LockSetGuard`] only with every key held, and hold none of them otherwise. Made
/// by [`LockRegistry::lock_set`](crate::LockRegistry::lock_set).
///
/// The keys are taken in their byte order, whatever order they were given in, so threads and
/// instances that want overlapping sets never deadlock each other. A key another holder keeps
/// is waited for while the keys before it stay held: a set waits at most as long as a single
/// lock of each of its keys would, one after the other, and a deadline bounds the whole set.
/// A set of [`ThisThread`] guards nests with what the thread holds already (a key it holds is
/// taken as a nested guard); [`any_thread`](Self::any_thread) gives a set whose guard may move
/// between threads.
///
/// ```
/// # fn main() -> leasehold::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let registry = leasehold::LockRegistry::sqlite(dir.path().join("l.db")).create_table(true).build()?;
/// use std::time::Duration;
/// let banks = registry.lock_set(["bank-b", "bank-a"])?;
/// let held = banks.try_lock_for(Duration::from_secs(5))?.expect("both banks are free");
/// for (key, token) in held.fencing_tokens() {
///     println!("{key}: writes carry token {token}");
/// }
/// held.unlock()?; // releases both
/// # Ok(()) }
/// ```
pub struct LockSet<H: Holding = ThisThread> {
    /// Distinct keys, in the order they are taken.
    locks: Vec<Lock<H>>,
}

impl<H: Holding> Clone for LockSet<H> {
    fn clone(&self) -> Self {
        LockSet {
            locks: self.locks.clone(),
        }
    }
}

/// How long a set's acquire waits for each key.
#[derive(Clone, Copy)]
enum SetWait {
    No,
    Until(Instant),
    Forever,
}

impl LockSet {
    /// `locks` in any order, repeats allowed; at least one.
    pub(crate) fn new(mut locks: Vec<Lock>) -> Result<Self> {
        if locks.is_empty() {
            return Err(Error::setting(
                "keys",
                "a lock set needs at least one key; pass the keys to hold together",
            ));
        }
        locks.sort_by(|a, b| a.key().cmp(b.key()));
        locks.dedup_by(|a, b| a.key() == b.key());
        Ok(LockSet { locks })
    }
}

impl<H: Holding> LockSet<H> {
    /// The distinct keys of the set, in the order they are taken.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.locks.iter().map(Lock::key)
    }

    /// The same set, whose guard belongs to no thread: `Send` and `Sync`, and not reentrant
    /// (see [`AnyThread`](crate::AnyThread)).
    pub fn any_thread(&self) -> LockSet<crate::AnyThread> {
        LockSet {
            locks: self.locks.iter().map(Lock::any_thread).collect(),
        }
    }

    /// Blocks until every key is held, with the registry's default time-to-live.
    pub fn lock(&self) -> Result<LockSetGuard<H>> {
        self.lock_with_ttl(self.default_ttl())
    }

    /// [`lock`](Self::lock) with a time-to-live for these leases only.
    pub fn lock_with_ttl(&self, ttl: Duration) -> Result<LockSetGuard<H>> {
        let held = self.take(SetWait::Forever, ttl)?;
        Ok(held.expect("an unbounded wait ends only with every key or an error"))
    }

    /// One attempt at each key: `Ok(None)` when one of them is held elsewhere (the keys taken
    /// before it are given back).
    pub fn try_lock(&self) -> Result<Option<LockSetGuard<H>>> {
        self.try_lock_with_ttl(self.default_ttl())
    }

    /// [`try_lock`](Self::try_lock) with a time-to-live for these leases only.
    pub fn try_lock_with_ttl(&self, ttl: Duration) -> Result<Option<LockSetGuard<H>>> {
        self.take(SetWait::No, ttl)
    }

    /// Waits at most `timeout` for every key; `Ok(None)` if they were not all granted in that
    /// time (the keys taken are given back).
    pub fn try_lock_for(&self, timeout: Duration) -> Result<Option<LockSetGuard<H>>> {
        self.try_lock_for_with_ttl(timeout, self.default_ttl())
    }

    /// [`try_lock_for`](Self::try_lock_for) with a time-to-live for these leases only.
    pub fn try_lock_for_with_ttl(
        &self,
        timeout: Duration,
        ttl: Duration,
    ) -> Result<Option<LockSetGuard<H>>> {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.try_lock_until_with_ttl(deadline, ttl),
            None => self.lock_with_ttl(ttl).map(Some),
        }
    }

    /// Waits until `deadline` for every key; `Ok(None)` if they were not all granted by then
    /// (no key is tried once the deadline has passed on the keys before it). A deadline in the
    /// past makes one attempt at each key, like [`try_lock`](Self::try_lock).
    pub fn try_lock_until(&self, deadline: Instant) -> Result<Option<LockSetGuard<H>>> {
        self.try_lock_until_with_ttl(deadline, self.default_ttl())
    }

    /// [`try_lock_until`](Self::try_lock_until) with a time-to-live for these leases only.
    pub fn try_lock_until_with_ttl(
        &self,
        deadline: Instant,
        ttl: Duration,
    ) -> Result<Option<LockSetGuard<H>>> {
        if deadline <= Instant::now() {
            return self.take(SetWait::No, ttl);
        }
        self.take(SetWait::Until(deadline), ttl)
    }

    fn default_ttl(&self) -> Duration {
        self.locks[0].inner.core.settings.time_to_live
    }

    /// Takes the keys in order; on the first that is refused or fails, the guards taken so far
    /// go (last first), releasing their keys.
    fn take(&self, wait: SetWait, ttl: Duration) -> Result<Option<LockSetGuard<H>>> {
        let mut guards: Vec<LockGuard<H>> = Vec::with_capacity(self.locks.len());
        for lock in &self.locks {
            let over = matches!(wait, SetWait::Until(deadline) if deadline <= Instant::now());
            if over && !guards.is_empty() {
                // The set's time ran out on the keys before: no attempt at the rest.
                while let Some(guard) = guards.pop() {
                    drop(guard);
                }
                return Ok(None);
            }
            let taken = match wait {
                SetWait::No => lock.try_lock_with_ttl(ttl),
                SetWait::Until(deadline) => lock.try_lock_until_with_ttl(deadline, ttl),
                SetWait::Forever => lock.lock_with_ttl(ttl).map(Some),
            };
            match taken {
                Ok(Some(guard)) => guards.push(guard),
                other => {
                    while let Some(guard) = guards.pop() {
                        drop(guard);
                    }
                    return other.map(|_| None);
                }
            }
        }
        Ok(Some(LockSetGuard { guards }))
    }
}

impl<H: Holding> std::fmt::Debug for LockSet<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.keys()).finish()
    }
}

/// Proof that every key of a [`LockSet`] is held; releases them all when dropped
/// ([`unlock`](Self::unlock) returns what went wrong). Each key keeps its own lease, renewed
/// as a single lock's; the set is held while every one of them is, and a loss of any of them
/// is a loss of the set.
#[must_use = "if unused the keys are released at once"]
pub struct LockSetGuard<H: Holding = ThisThread> {
    /// One guard per key, in the set's order.
    guards: Vec<LockGuard<H>>,
}

impl<H: Holding> LockSetGuard<H> {
    /// The guard of each key, in the set's order: its fencing token, its
    /// [`fence`](LockGuard::fence), its remaining time.
    pub fn guards(&self) -> &[LockGuard<H>] {
        &self.guards
    }

    /// The guard of `key`, if the set has it.
    pub fn guard(&self, key: &str) -> Option<&LockGuard<H>> {
        self.guards.iter().find(|guard| guard.key() == key)
    }

    /// Each key with the fencing token of its grant, in the set's order. Tokens of different
    /// keys are unrelated: a resource checks the token of the key that protects it.
    pub fn fencing_tokens(&self) -> Vec<(&str, u64)> {
        self.guards
            .iter()
            .map(|guard| (guard.key(), guard.fencing_token()))
            .collect()
    }

    /// `true` while every key's lease is held.
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    /// How long every key is certainly still held if no renewal succeeds from now on: the
    /// least of the keys' remaining times.
    pub fn remaining(&self) -> Duration {
        self.guards
            .iter()
            .map(LockGuard::remaining)
            .min()
            .unwrap_or_default()
    }

    /// A channel that receives one [`LeaseLost`] when the first of the keys' leases is lost
    /// (at once if one already is); it disconnects without a message when every lease ends
    /// normally.
    pub fn loss_channel(&self) -> Receiver<LeaseLost> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        for guard in &self.guards {
            guard.lease.add_loss_listener(tx.clone());
        }
        rx
    }

    /// Renews every key's lease now; the first error, after trying them all.
    pub fn renew(&self) -> Result<()> {
        let mut outcome = Ok(());
        for guard in &self.guards {
            let renewed = guard.renew();
            if outcome.is_ok() {
                outcome = renewed;
            }
        }
        outcome
    }

    /// Releases every key (the last first) and reports whether each lease was held until
    /// then: the first error, after releasing them all. `Err(LeaseLost)` names a key whose
    /// lease was lost: another holder may have had that key while this guard existed.
    pub fn unlock(mut self) -> Result<()> {
        let mut outcome = Ok(());
        while let Some(guard) = self.guards.pop() {
            let released = guard.unlock();
            if outcome.is_ok() {
                outcome = released;
            }
        }
        outcome
    }
}

impl<H: Holding> Drop for LockSetGuard<H> {
    fn drop(&mut self) {
        while let Some(guard) = self.guards.pop() {
            drop(guard);
        }
    }
}

impl<H: Holding> std::fmt::Debug for LockSetGuard<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockSetGuard")
            .field("tokens", &self.fencing_tokens())
            .field("held", &self.is_held())
            .finish()
    }
}
