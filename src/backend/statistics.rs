//! Counts of the lease statements a registry has sent.

use std::sync::atomic::{AtomicU64, Ordering};

/// How many lease statements a registry has sent to its database (every attempt counts,
/// including retries). Useful for metrics, and to see that local handoffs and waiting threads
/// cost no statements.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Statistics {
    /// Acquire statements (each poll of a waiter counts).
    pub acquires: u64,
    /// Acquire statements that granted the lock.
    pub grants: u64,
    /// Renew statements, background and manual.
    pub renewals: u64,
    /// Release statements.
    pub releases: u64,
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) acquires: AtomicU64,
    pub(super) grants: AtomicU64,
    pub(super) renewals: AtomicU64,
    pub(super) releases: AtomicU64,
}

impl Counters {
    /// The counts so far.
    pub(super) fn read(&self) -> Statistics {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        Statistics {
            acquires: read(&self.acquires),
            grants: read(&self.grants),
            renewals: read(&self.renewals),
            releases: read(&self.releases),
        }
    }
}
