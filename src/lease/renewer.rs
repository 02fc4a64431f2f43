//! Background renewals: a registry's [`Renewer`] and its workers (see the `lease` module docs,
//! "Threads" and "Isolation").

use super::{Lease, Turn};
use crate::backend::{Batched, Store};
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
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
/// queued lease is due and takes a chunk (see "Order"), with the other queued leases of the
/// same time-to-live (up to [`MAX_BATCH`]); submissions meanwhile join the last queued chunk of
/// their time-to-live and go to that worker rather than to a new one. That keeps leases due
/// close together in one statement (tens of statements per renewal period for thousands of
/// leases) without one ever waiting for another's statement. A queued chunk carries when its
/// earliest renewal falls due, its earliest deadline and its shortest slack, so what a worker decides costs one look
/// per chunk, never one per queued lease. A worker idle for [`Renewer::IDLE_TICK`] ends; the
/// next chunk starts one again. No user code runs on a worker (loss callbacks run on the
/// registry's callback thread). Workers hold only a `Weak` to the renewer (which the registry
/// owns) while idle.
///
/// **Order.** A worker takes, of the queued chunks that are due, the one whose earliest
/// deadline comes first, and merges into it the other queued chunks of its time-to-live,
/// earliest deadline first, while they fit. So a lease that is due waits only for the
/// statements in flight (each ends by its attempt's bound, below) and for statements led by
/// leases whose deadlines come before its own: once the statements fall behind (a server that
/// gets a small share of the machine, renewals beside a stream of other statements), a lease
/// whose renewal waited, or whose attempt failed or found its row busy and is due again, goes
/// ahead of every lease with more time left instead of queuing behind them for another round.
///
/// **Bounds.** Each lease counts a renewal only if its answer comes before its own deadline;
/// a lease whose deadline has passed by the time its statement is sent is reported lost and
/// left out of the statement. An attempt is given up as unanswered at the earliest of: half
/// the renewal period of the leases it carries, the last of their deadlines, and half the
/// *slack* of every lease the renewer serves — the time a lease has before its deadline when
/// its renewal falls due on time (its time-to-live less its renewal period), the shortest among
/// the leases queued and those handed over recently ([`SlackSeen`]). Every term depends only on
/// the leases carried or on a nominal property of the others, never on how late another lease
/// already is, so a lease is lost only when no renewal of its own was confirmed before its own
/// deadline: a late lease costs nobody else their attempt. With every worker busy a chunk waits
/// until one is free, so a lease handed over when its renewal falls due finds a worker with at
/// least half its slack left, however long the statements of other leases take (a 60 s lease's
/// hung batch holds back a 3 s lease for 1 s at most), and is then sent with up to half a
/// renewal period for the answer. (Statements never wait for a row another session holds
/// locked, see `Backend::renew_batch`.)
pub(crate) struct Renewer {
    store: Weak<dyn Store>,
    due: Mutex<RenewerState>,
    wake: Condvar,
    max_workers: usize,
}

struct RenewerState {
    chunks: VecDeque<Chunk>,
    workers: usize,
    /// Workers waiting for work.
    idle: usize,
    /// Workers gathering queued leases until the earliest is due (they take later submissions
    /// along, so no other worker is started for them).
    collecting: usize,
    /// The shortest slack among leases handed over recently.
    slack: Option<SlackSeen>,
}

/// Queued leases of one time-to-live (at most [`MAX_BATCH`]), with what the workers look at
/// instead of each lease: when the earliest renewal among them falls due, their earliest
/// deadline, and their shortest slack (all as handed over).
struct Chunk {
    ttl: Duration,
    leases: Vec<Arc<Lease>>,
    due: Instant,
    deadline: Instant,
    slack: Duration,
}

/// What the clock hands over with a lease (see [`Lease::handover`]).
pub(super) struct Handover {
    pub ttl: Duration,
    /// When its renewal falls due.
    pub due: Instant,
    pub slack: SlackSeen,
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

    /// Hands over leases whose renewal falls due. Each joins the last queued chunk of its
    /// time-to-live while that has room.
    pub(super) fn submit(self: &Arc<Self>, leases: Vec<Arc<Lease>>) {
        let now = Instant::now();
        let handed: Vec<(Arc<Lease>, Handover, Instant)> = leases
            .into_iter()
            .map(|lease| {
                let handover = lease.handover(now);
                let deadline = lease.deadline();
                (lease, handover, deadline)
            })
            .collect();
        let mut due = self.due.lock();
        // The chunk each time-to-live fills.
        let mut filling: Vec<(Duration, usize)> = Vec::new();
        for (lease, handover, deadline) in handed {
            due.slack = Some(SlackSeen::shortest(due.slack, handover.slack));
            let ttl = handover.ttl;
            let at = filling.iter().position(|(t, _)| *t == ttl);
            let open = at
                .map(|at| filling[at].1)
                .or_else(|| due.chunks.iter().rposition(|chunk| chunk.ttl == ttl))
                .filter(|&index| due.chunks[index].leases.len() < MAX_BATCH);
            let index = open.unwrap_or_else(|| {
                due.chunks.push_back(Chunk {
                    ttl,
                    leases: Vec::new(),
                    due: handover.due,
                    deadline,
                    slack: handover.slack.slack,
                });
                due.chunks.len() - 1
            });
            match at {
                Some(at) => filling[at].1 = index,
                None => filling.push((ttl, index)),
            }
            let chunk = &mut due.chunks[index];
            chunk.due = chunk.due.min(handover.due);
            chunk.deadline = chunk.deadline.min(deadline);
            chunk.slack = chunk.slack.min(handover.slack.slack);
            chunk.leases.push(lease);
        }
        self.make_sure_someone_gathers(&mut due);
        drop(due);
        fail_point!("lease::renewer_queued");
    }

    /// A queued lease is to be renewed at once (a holder asked for another time-to-live): its
    /// chunk is due now.
    pub(super) fn expedite(&self, lease: &Lease) {
        let mut due = self.due.lock();
        let queued_in = due.chunks.iter_mut().find(|chunk| {
            chunk
                .leases
                .iter()
                .any(|queued| std::ptr::eq(Arc::as_ptr(queued), lease))
        });
        if let Some(chunk) = queued_in {
            chunk.due = Instant::now();
            self.wake.notify_all();
        }
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
                while let Some(start) = due.chunks.iter().map(|chunk| chunk.due).min() {
                    if start <= Instant::now() {
                        break;
                    }
                    this.wake.wait_until(&mut due, start);
                }
                due.collecting -= 1;
                let chunk = take_chunk(&mut due.chunks, Instant::now());
                // What is left (another time-to-live) must not wait for this statement.
                this.make_sure_someone_gathers(&mut due);
                (chunk, limit(&due))
            };
            let ((Some(chunk), limit), Some(store)) = (chunk, this.store.upgrade()) else {
                return;
            };
            drop(this);
            renew_chunk(&*store, chunk.leases, limit);
        }
    }
}

/// How long an attempt may last at most for the leases it may hold back (see "Bounds" on
/// [`Renewer`]): half the shortest slack among the queued leases and those handed over
/// recently.
fn limit(due: &RenewerState) -> Option<Duration> {
    let now = Instant::now();
    let queued = due.chunks.iter().map(|chunk| chunk.slack).min();
    let recent = due
        .slack
        .filter(|slack| slack.current(now))
        .map(|slack| slack.slack);
    let shortest = queued.into_iter().chain(recent).min()?;
    Some(shortest / 2)
}

/// The next statement's leases (see "Order" on [`Renewer`]): of the chunks due by `now` (or,
/// with none due, of all), the one whose earliest deadline comes first, with the other chunks
/// of its time-to-live merged into it, earliest deadline first, while they fit in
/// [`MAX_BATCH`].
fn take_chunk(chunks: &mut VecDeque<Chunk>, now: Instant) -> Option<Chunk> {
    let any_due = chunks.iter().any(|chunk| chunk.due <= now);
    let first = (0..chunks.len())
        .filter(|&index| !any_due || chunks[index].due <= now)
        .min_by_key(|&index| chunks[index].deadline)?;
    let mut chunk = chunks.remove(first).expect("in range");
    let mut others: Vec<usize> = (0..chunks.len())
        .filter(|&index| chunks[index].ttl == chunk.ttl)
        .collect();
    others.sort_by_key(|&index| chunks[index].deadline);
    let mut merged = Vec::new();
    for index in others {
        if chunk.leases.len() + chunks[index].leases.len() <= MAX_BATCH {
            merged.push(index);
            let more = std::mem::take(&mut chunks[index].leases);
            chunk.leases.extend(more);
        }
        if chunk.leases.len() >= MAX_BATCH {
            break;
        }
    }
    // Highest index first, so that the others keep theirs.
    merged.sort_unstable_by(|a, b| b.cmp(a));
    for index in merged {
        chunks.remove(index);
    }
    Some(chunk)
}

/// A lease whose turn a renewal worker holds.
type Taken = (Arc<Lease>, Turn);

/// Renews one chunk of leases (see [`Renewer`]): one statement per time-to-live their turns
/// carry (one, unless a holder asked for another since the chunk was made). A lease whose
/// deadline has passed is reported lost instead.
/// `limit`: how long each attempt may last at most (see "Bounds" on [`Renewer`]).
fn renew_chunk(store: &dyn Store, chunk: Vec<Arc<Lease>>, limit: Option<Duration>) {
    let mut by_ttl: Vec<(Duration, Vec<Taken>)> = Vec::new();
    for lease in chunk {
        if lease.over_or_lost() {
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
    fail_point!("lease::renew_batch_before_statement");
    // A lease whose deadline has passed is lost: it is not sent, and has no say in how long
    // the attempt for the others may last.
    let now = Instant::now();
    let (group, gone): (Vec<Taken>, Vec<Taken>) = group
        .into_iter()
        .partition(|(lease, _)| lease.deadline() > now);
    for (lease, _) in gone {
        lease.end_turn_unsent();
    }
    if group.is_empty() {
        return;
    }
    let deadline = attempt_deadline(&group, now, limit);
    let keys: Vec<(&str, i64)> = group
        .iter()
        .map(|(lease, _)| (&*lease.lock_key, lease.token))
        .collect();
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

/// When an attempt for `group` (leases whose deadlines are all ahead of `now`) is given up
/// (see "Bounds" on [`Renewer`]): half their renewal period from `now`, `limit` from `now`
/// (for the leases it may hold back), and never past the last deadline among them. A
/// statement that hangs (a hung server, a frozen connection) is given up and retried on
/// another connection a quarter period later (see `Lease::end_turn`), several times before the
/// deadline — what lets a lease outlive a primary that hangs. The earlier deadlines of the
/// group shorten nothing: each lease counts the answer only if it comes before its own.
fn attempt_deadline(group: &[Taken], now: Instant, limit: Option<Duration>) -> Instant {
    let period = group
        .iter()
        .map(|(lease, _)| lease.renew_every(&lease.state.lock()))
        .min()
        .expect("a group is never empty");
    let last = group
        .iter()
        .map(|(lease, _)| lease.deadline())
        .max()
        .expect("a group is never empty");
    let deadline = last.min(now + period / 2);
    limit.map_or(deadline, |limit| deadline.min(now + limit))
}
