//! Counts of the lease statements a registry has sent.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What a registry has done: the lease statements it sent to its database (every attempt
/// counts, including retries), and what became of its locks and leases — grants by local
/// handoff, contended tries, losses by reason, renewals, wait, hold and renewal times. For
/// dashboards without a metrics stack; with the `metrics` feature the same events also go to
/// the `metrics` facade under the names below.
///
/// # Metric names (feature `metrics`)
///
/// Every metric carries the labels `table` and `region`; with
/// [`Tuning::metrics_key_labels`](crate::Tuning::metrics_key_labels) the
/// per-key ones also carry `key` (off by default: one series per lock name can be many).
///
/// | name | kind | labels | what |
/// |------|------|--------|------|
/// | `leasehold_grants_total` | counter | `via` = `database` / `local_handoff`, key | locks granted to a caller |
/// | `leasehold_contended_tries_total` | counter | key | acquire statements that found the lock held elsewhere |
/// | `leasehold_turns_ended_total` | counter | key | releases that ended a turn, reserving the key for other instances (see [`Tuning::turn_limit`](crate::Tuning::turn_limit)) |
/// | `leasehold_leases_lost_total` | counter | `reason` = `expired` / `not_owner`, key | leases lost |
/// | `leasehold_renewals_total` | counter | | leases renewed in the background or by hand |
/// | `leasehold_renewals_failed_total` | counter | | renewals whose outcome is unknown (no answer, an error, a row locked by another session) |
/// | `leasehold_wait_seconds` | histogram | key | from a lock call to its grant |
/// | `leasehold_hold_seconds` | histogram | key | from a grant to its release, per holder |
/// | `leasehold_renewal_seconds` | histogram | | one renew statement (a batch counts once) |
/// | `leasehold_held_leases` | gauge | | leases this registry holds now |
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
    /// Locks passed to another thread of the registry without a statement.
    pub local_handoffs: u64,
    /// Acquire statements that found the lock held elsewhere.
    pub contended_tries: u64,
    /// Turns that ended: releases past [`Tuning::turn_limit`](crate::Tuning::turn_limit) that
    /// reserved the key for other instances while threads of this registry still wanted it.
    pub turns_ended: u64,
    /// Leases lost because their deadline passed (renewal failed, or was off).
    pub leases_lost_expired: u64,
    /// Leases lost because the database named another holder, or none.
    pub leases_lost_not_owner: u64,
    /// Leases renewed (a batch statement renews several).
    pub leases_renewed: u64,
    /// Renewals whose outcome is unknown: no answer in time, an error, or a row another
    /// session held locked. Each is retried until the lease's deadline.
    pub renewals_failed: u64,
    /// Grants found and released after an acquire statement whose answer never came (no
    /// answer before the call's deadline, a connection that broke): the database had granted
    /// the row, and the registry gave it back rather than leave it held by nobody.
    pub unanswered_grants_released: u64,
    /// Leases the registry holds now.
    pub held_leases: u64,
    /// Time callers spent waiting for locks they were granted, summed.
    pub wait_time: Duration,
    /// Time holders held their locks, summed over released guards.
    pub hold_time: Duration,
    /// Time renew statements took, summed.
    pub renewal_time: Duration,
    /// The longest a renew statement took.
    pub longest_renewal: Duration,
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) acquires: AtomicU64,
    pub(super) grants: AtomicU64,
    pub(super) renewals: AtomicU64,
    pub(super) releases: AtomicU64,
    pub(super) resolved: AtomicU64,
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
            unanswered_grants_released: read(&self.resolved),
            ..Statistics::default()
        }
    }
}
