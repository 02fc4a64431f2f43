//! Background renewals: a registry's [`Renewer`] and its workers (see the `lease` module docs,
//! "Threads" and "Isolation").

use super::{Lease, Turn};
use crate::backend::{Batched, Store};
use parking_lot::{Condvar, Mutex};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// The most leases one renew statement carries.
pub(crate) const MAX_BATCH: usize = 500;

/// A registry's background renewals: the lease clock hands it the leases whose renewal falls
/// due, grouped by time-to-live into chunks of at most [`MAX_BATCH`] leases, and *renewal
/// workers* renew each chunk with one statement on the renewal pool ([`Store::renew_batch`]).
/// Each lease keeps its own state, deadline and loss report: a lease the database no longer
/// records as this client's is reported by itself, a row another session has locked is skipped
/// (that lease alone is retried, and lost at its deadline if the row stays locked), and a batch
/// that fails or hangs only bounds the deadlines of its leases, which the clock reports one by
/// one when they pass.
///
/// **Workers.** A chunk never waits behind another: a chunk submitted while every worker is busy
/// (a statement stuck on a hung server or a slow connection) starts another worker, up to one per
/// renewal connection (`renewal_pool_size`), so one slow statement delays only the leases it
/// carries. A worker that takes work first *gathers*: the clock hands leases over up to a
/// sixteenth of a renewal period before they are due, so the worker waits until the earliest
/// queued lease is due and takes every queued lease of the same time-to-live along (up to
/// [`MAX_BATCH`]); submissions meanwhile go to it rather than to a new worker. That keeps
/// leases due close together in one statement (tens of statements per renewal period for
/// thousands of leases), as a single busy thread did, without one ever waiting for another's
/// statement. A worker idle for [`Renewer::IDLE_TICK`] ends; the next chunk starts one again. No
/// user code runs on a worker (loss callbacks run on the registry's callback thread). Workers
/// hold only a `Weak` to the renewer (which the registry owns) while idle.
///
/// **Bounds.** With every worker busy, a chunk waits until one is free, so an attempt bounds
/// the wait of the leases queued behind it, whatever their time-to-live. An attempt therefore
/// ends (given up as unanswered) by the earliest of: the deadlines of its own leases, half
/// their renewal period, and half the *slack* of every lease the renewer serves — the time a
/// lease has left before its deadline when its renewal falls due (its time-to-live less its
/// renewal period) — the shortest among the leases queued and those handed over recently
/// ([`SlackSeen`]). A lease handed over with its slack left then finds a worker with at least
/// half of it still left, however long the statements of other leases take: a 60 s lease's
/// hung batch holds back a 3 s lease for 1 s at most. (Statements never wait for a row
/// another session holds locked, see `Backend::renew_batch`.)
pub(crate) struct Renewer {
    store: Weak<dyn Store>,
    due: Mutex<RenewerState>,
    wake: Condvar,
    max_workers: usize,
}

struct RenewerState {
    chunks: std::collections::VecDeque<Vec<Arc<Lease>>>,
    workers: usize,
    /// Workers waiting for work.
    idle: usize,
    /// Workers gathering queued leases until the earliest is due (they take later submissions
    /// along, so no other worker is started for them).
    collecting: usize,
    /// The shortest slack among leases handed over recently.
    slack: Option<SlackSeen>,
}

/// The slack of a lease: the time it has before its deadline when its renewal falls due (its
/// time-to-live less its renewal period), and how often it is handed over (its renewal
/// period); `seen`: when a lease with this slack was last handed over.
#[derive(Clone, Copy, Debug)]
pub(super) struct SlackSeen {
    pub slack: Duration,
    pub period: Duration,
    pub seen: Instant,
}

impl SlackSeen {
    /// A lease is handed over once per renewal period: one with this slack not seen for two
    /// periods (and a tick) is gone.
    fn current(self, now: Instant) -> bool {
        now.saturating_duration_since(self.seen) <= self.period * 2 + Renewer::IDLE_TICK
    }

    /// The shorter of `self` (while current) and `other`.
    fn shortest(this: Option<SlackSeen>, other: SlackSeen) -> SlackSeen {
        match this {
            Some(this) if this.slack < other.slack && this.current(other.seen) => this,
            _ => other,
        }
    }
}

/// Counts a worker out when it ends, however it ends.
struct WorkerSlot(Weak<Renewer>);

impl Drop for WorkerSlot {
    fn drop(&mut self) {
        if let Some(renewer) = self.0.upgrade() {
            renewer.due.lock().workers -= 1;
        }
    }
}

impl Renewer {
    /// How long a renewal worker waits for work before it ends.
    pub const IDLE_TICK: Duration = Duration::from_secs(1);

    /// The renewals of the registry of `store`, with at most `max_workers` statements in flight.
    pub fn new(store: Weak<dyn Store>, max_workers: usize) -> Arc<Renewer> {
        Arc::new(Renewer {
            store,
            due: Mutex::new(RenewerState {
                chunks: Default::default(),
                workers: 0,
                idle: 0,
                collecting: 0,
                slack: None,
            }),
            wake: Condvar::new(),
            max_workers: max_workers.max(1),
        })
    }

    /// The store of the registry these renewals belong to.
    pub(crate) fn store(&self) -> Weak<dyn Store> {
        Weak::clone(&self.store)
    }

    /// Hands over leases whose renewal falls due.
    pub(super) fn submit(self: &Arc<Self>, leases: Vec<Arc<Lease>>) {
        let now = Instant::now();
        let slack = leases
            .iter()
            .map(|lease| lease.slack(now))
            .min_by_key(|slack| slack.slack);
        let mut by_ttl: Vec<(Duration, Vec<Arc<Lease>>)> = Vec::new();
        for lease in leases {
            let ttl = lease.ttl();
            match by_ttl
                .iter_mut()
                .find(|(t, group)| *t == ttl && group.len() < MAX_BATCH)
            {
                Some((_, group)) => group.push(lease),
                None => by_ttl.push((ttl, vec![lease])),
            }
        }
        let mut due = self.due.lock();
        if let Some(slack) = slack {
            due.slack = Some(SlackSeen::shortest(due.slack, slack));
        }
        due.chunks
            .extend(by_ttl.into_iter().map(|(_, chunk)| chunk));
        self.make_sure_someone_gathers(&mut due);
    }

    /// Wakes a worker that waits or gathers, or (every worker busy with a statement) starts
    /// another, so that queued leases never wait behind a statement in flight.
    fn make_sure_someone_gathers(self: &Arc<Self>, due: &mut RenewerState) {
        if due.chunks.is_empty() {
            return;
        }
        if due.idle > 0 || due.collecting > 0 {
            self.wake.notify_all();
            return;
        }
        if due.workers >= self.max_workers {
            return;
        }
        let renewer = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("leasehold-renew".into())
            .spawn(move || Renewer::work(renewer));
        match spawned {
            Ok(_) => due.workers += 1,
            Err(e) => log::error!("could not start a renewal worker: {e}"),
        }
    }

    fn work(renewer: Weak<Renewer>) {
        let _slot = WorkerSlot(renewer.clone());
        loop {
            let Some(this) = renewer.upgrade() else {
                return;
            };
            let chunk = {
                let mut due = this.due.lock();
                if due.chunks.is_empty() {
                    due.idle += 1;
                    this.wake.wait_for(&mut due, Self::IDLE_TICK);
                    due.idle -= 1;
                }
                // The clock hands leases over a little before they are due: gather until the
                // earliest is, so that leases falling due meanwhile share the statement.
                due.collecting += 1;
                while let Some(start) = earliest_due(&due.chunks) {
                    if start <= Instant::now() {
                        break;
                    }
                    this.wake.wait_until(&mut due, start);
                }
                due.collecting -= 1;
                let chunk = take_chunk(&mut due.chunks);
                // What is left (another time-to-live) must not wait for this statement.
                this.make_sure_someone_gathers(&mut due);
                (chunk, limit(&due))
            };
            let ((Some(chunk), limit), Some(store)) = (chunk, this.store.upgrade()) else {
                return;
            };
            drop(this);
            renew_chunk(&*store, chunk, limit);
        }
    }
}

/// How long an attempt may last at most (see "Bounds" on [`Renewer`]): half the shortest slack
/// among the queued leases and those handed over recently.
fn limit(due: &RenewerState) -> Option<Duration> {
    let now = Instant::now();
    let queued = due
        .chunks
        .iter()
        .flatten()
        .map(|lease| lease.slack(now).slack)
        .min();
    let recent = due
        .slack
        .filter(|slack| slack.current(now))
        .map(|slack| slack.slack);
    let shortest = queued.into_iter().chain(recent).min()?;
    Some(shortest / 2)
}

/// When the earliest renewal among the queued leases is due.
fn earliest_due(chunks: &std::collections::VecDeque<Vec<Arc<Lease>>>) -> Option<Instant> {
    chunks
        .iter()
        .flatten()
        .map(|lease| lease.renewal_due(&lease.state.lock()))
        .min()
}

/// The next chunk, with every later chunk of the same time-to-live merged into it (up to
/// [`MAX_BATCH`] leases): leases that fell due while the workers were busy go in one statement.
fn take_chunk(chunks: &mut std::collections::VecDeque<Vec<Arc<Lease>>>) -> Option<Vec<Arc<Lease>>> {
    let mut chunk = chunks.pop_front()?;
    let ttl = chunk[0].ttl();
    let mut index = 0;
    while index < chunks.len() && chunk.len() < MAX_BATCH {
        if chunks[index][0].ttl() == ttl && chunk.len() + chunks[index].len() <= MAX_BATCH {
            let more = chunks.remove(index).expect("in range");
            chunk.extend(more);
        } else {
            index += 1;
        }
    }
    Some(chunk)
}

/// A lease whose turn a renewal worker holds.
type Taken = (Arc<Lease>, Turn);

/// Renews one chunk of leases (see [`Renewer`]): one statement per time-to-live their turns
/// carry (one, unless a holder asked for another since the chunk was made).
/// `limit`: how long each attempt may last at most (see "Bounds" on [`Renewer`]).
fn renew_chunk(store: &dyn Store, chunk: Vec<Arc<Lease>>, limit: Option<Duration>) {
    let mut by_ttl: Vec<(Duration, Vec<Taken>)> = Vec::new();
    for lease in chunk {
        if lease.is_over() {
            continue;
        }
        // A manual renewal in flight has the turn: this lease is due again after it.
        let Some(turn) = lease.take_turn(None, None) else {
            lease.state.lock().queued = false;
            continue;
        };
        match by_ttl.iter_mut().find(|(ttl, _)| *ttl == turn.ttl) {
            Some((_, group)) => group.push((lease, turn)),
            None => by_ttl.push((turn.ttl, vec![(lease, turn)])),
        }
    }
    for (ttl, group) in by_ttl {
        renew_group(store, ttl, group, limit);
    }
}

/// One renew statement for leases of one time-to-live, and what it found for each.
fn renew_group(store: &dyn Store, ttl: Duration, group: Vec<Taken>, limit: Option<Duration>) {
    // One attempt may take half a renewal period, never the leases' whole remaining life, nor
    // past the earliest deadline among them, nor longer than `limit` (for the leases it may
    // hold back): a statement that hangs (a hung server, a frozen connection) is given up and
    // retried on another connection a quarter period later (see `end_turn`), several times
    // before the deadline — what lets a lease outlive a primary that hangs.
    let period = group
        .iter()
        .map(|(lease, _)| lease.renew_every(&lease.state.lock()))
        .min()
        .expect("a group is never empty");
    let deadline = group
        .iter()
        .map(|(lease, _)| lease.deadline())
        .min()
        .expect("a group is never empty")
        .min(Instant::now() + period / 2);
    let deadline = limit.map_or(deadline, |limit| deadline.min(Instant::now() + limit));
    let keys: Vec<(&str, i64)> = group
        .iter()
        .map(|(lease, _)| (&*lease.lock_key, lease.token))
        .collect();
    fail_point!("lease::renew_batch_before_statement");
    let sent = Instant::now();
    let outcome = store.renew_batch(&keys, ttl, deadline);
    let (renewed, failed) = match &outcome {
        Ok((_, found)) => (
            found.iter().filter(|f| **f == Batched::Renewed).count(),
            found.iter().filter(|f| **f == Batched::RowBusy).count(),
        ),
        Err(_) => (0, group.len()),
    };
    group[0]
        .0
        .meter
        .renewal(sent.elapsed(), renewed as u64, failed as u64);
    fail_point!("lease::renew_batch_before_record");
    if let Err(e) = &outcome {
        log::warn!("renewing {} leases failed: {e}", group.len());
    }
    for (index, (lease, turn)) in group.iter().enumerate() {
        let mine = match &outcome {
            Ok((sent_at, found)) => match found[index] {
                Batched::Renewed => Ok(Some(*sent_at)),
                Batched::NotHolder => Ok(None),
                Batched::RowBusy => Err(
                    "its row was locked by another session; the renewal skipped it rather than \
                     wait (a long transaction or a `SELECT ... FOR UPDATE` on the lock table?)"
                        .to_string(),
                ),
            },
            Err(e) => Err(e.to_string()),
        };
        lease.end_turn(turn, mine);
    }
}
