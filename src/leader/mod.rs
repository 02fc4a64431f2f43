//! Leader election on the registry: see [`LeaderElection`] for the design, the settings and
//! the guarantees (this module is private; its documentation lives on the public types).
//!
//! Submodules: `builder` validates the timings and starts the threads; `agent` is the thread
//! that competes, holds the lock guard and watches the lease; `clock` measures this instance's
//! offset to the database clock.

use crate::error::{Error, LossReason, Result};
use crate::lease::LeaseLost;
use crate::lock::{Lock, LockGuard};
use crate::registry::{
    LockRegistry, RegistryBuilder, MAX_IDLE_BETWEEN_TRIES, MAX_TIME_TO_LIVE, MIN_TIME_TO_LIVE,
};
use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

mod agent;
mod builder;
mod clock;

use agent::{Agent, Command, Kind, ReleaseWatch, Request, Term};
pub use builder::LeaderElectionBuilder;
use builder::Timings;
use clock::measure;
pub use clock::ClockOffset;

/// A replacement for the client's wall clock; see [`LeaderElectionBuilder::client_clock`].
pub type ClientClock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// Called once per involuntary loss of leadership; see
/// [`LeaderElectionBuilder::on_leadership_lost`].
pub type LeadershipLostCallback = Arc<dyn Fn(&LeadershipLost) + Send + Sync>;

/// Why a term ended without its leader resigning.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeadershipLossReason {
    /// The registry reported the lease lost: a renewal found another holder or none
    /// ([`LossReason::NotOwner`]), or failed for good ([`LossReason::Expired`]).
    Lease(LossReason),
    /// No renewal succeeded in time: the leader stepped down with
    /// [`step_down_margin`](LeaderElection::step_down_margin) of its lease left, before any
    /// standby could be granted the lock.
    RenewalOverdue,
}

impl fmt::Display for LeadershipLossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeadershipLossReason::Lease(reason) => write!(f, "the lease was lost: {reason}"),
            LeadershipLossReason::RenewalOverdue => f.write_str(
                "no renewal succeeded in time; stepped down before the lease could expire",
            ),
        }
    }
}

/// What the loss channel, the loss callback and `run`'s `on_lost` receive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeadershipLost {
    /// The group (the lock key).
    pub group: String,
    /// The term that ended (its fencing token).
    pub term: u64,
    /// Why it ended.
    pub reason: LeadershipLossReason,
}

impl fmt::Display for LeadershipLost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "leadership of {:?} (term {}) lost: {}",
            self.group, self.term, self.reason
        )
    }
}

/// One contender in the leader election of one group: one lock per group, one leader per term.
///
/// Cheap to clone; clones are the same contender (one registry, one `CLIENT_ID`). Create one
/// per instance and group with [`LeaderElection::builder`].
///
/// A group of instances that want exactly one of them to act — a batch scheduler, a singleton
/// consumer, ActiveMQ's master broker — each build a [`LeaderElection`] on the same table and
/// group name. The group name is the key of an ordinary registry lock; the instance holding it
/// is the leader, its keeper thread renews the lease, and the others ("standbys") poll for it.
/// Nothing here changes how locks behave: a term is one database grant of that lock, and its
/// number is the grant's fencing token.
///
/// ```
/// # fn main() -> leasehold::Result<()> {
/// use leasehold::{LeaderElection, LockRegistry};
/// use std::time::Duration;
///
/// let dir = tempfile::tempdir().unwrap();
/// let registry = LockRegistry::sqlite(dir.path().join("locks.db")).create_table(true);
/// let election = LeaderElection::builder(registry, "nightly-batch")
///     .time_to_live(Duration::from_secs(30))
///     .renew_every(Duration::from_secs(10))
///     .idle_between_tries(Duration::from_secs(1))
///     .build()?;
/// let leadership = election.acquire()?; // stands by until elected
/// assert!(election.is_leader());
/// let losses = leadership.loss_channel(); // select on it while doing leader work
/// println!("leading term {} (pass it to what you write to)", leadership.term());
/// # assert!(losses.try_recv().is_err());
/// leadership.resign()?; // a standby takes over at its next poll
/// assert!(!election.is_leader());
/// # Ok(()) }
/// ```
///
/// # The knobs, exactly
///
/// ActiveMQ's lease locker uses `lockAcquireSleepInterval` both as the standby poll interval and
/// as the lease length, and `lockKeepAlivePeriod` as the renewal cadence; a keep-alive period
/// longer than the lease (as in its own documentation's example, 10 s and 5 s) makes the master
/// lose its lease between renewals, and ActiveMQ only warns. Here each duration has one meaning:
///
/// | setting | meaning | default | registry setting it becomes |
/// |---------|---------|---------|-----------------------------|
/// | [`time_to_live`](LeaderElectionBuilder::time_to_live) (ActiveMQ: `lease_duration`) | how long a grant or renewal keeps the leadership on the **database clock** without another renewal; the longest a crashed leader blocks the group | 10 s | `time_to_live` |
/// | [`renew_every`](LeaderElectionBuilder::renew_every) (ActiveMQ: `lock_keep_alive_period`) | the leader's **renewal period**: a renewal is sent this long after the previous one was sent | a third of the time-to-live | `renew_every` |
/// | [`idle_between_tries`](LeaderElectionBuilder::idle_between_tries) (ActiveMQ: `lock_acquire_sleep_interval`) | how long a **standby** sleeps between two attempts to become leader (one statement each; a read when the lease is held) | 1 s | `idle_between_tries` |
/// | [`max_allowable_diff_from_db_time`](LeaderElectionBuilder::max_allowable_diff_from_db_time) | how far this instance's wall clock may be from the database's before the times this election reports are corrected by the measured offset (and a warning is logged); zero turns the correction off | 0 (off) | — |
/// | [`fail_if_locked`](LeaderElectionBuilder::fail_if_locked) | [`acquire`](LeaderElection::acquire) and the first round of [`run`](LeaderElection::run) make one attempt and fail if another instance leads, instead of standing by | `false` | — |
///
/// The builder also sets `renewal(true)` on the registry builder it is given; every other
/// registry setting (connection, table prefix, region, pool sizes, `operation_timeout`, the
/// registry's own `on_lease_lost`) is the caller's.
///
/// **The rule for renewal in time.** A leader that cannot renew *steps down* when its lease has
/// [`step_down_margin`](LeaderElection::step_down_margin) = `time_to_live / 10` left (see
/// below). The first renewal is due one renewal period after the grant; if it fails or is
/// slow, there must still be a whole renewal period for it (or its retries) to get through
/// before the step-down. So `build()` requires
///
/// ```text
/// 2 × renew_every + time_to_live / 10 ≤ time_to_live
/// ```
///
/// i.e. a renewal period of at most 45 % of the time-to-live (4.5 s of 10 s), and rejects
/// anything else with [`Error::InvalidSetting`].
///
/// # Losing leadership, promptly
///
/// A leader must stop acting as one before another instance can become leader. Leadership ends
/// involuntarily in two ways, both reported the same way — [`Leadership::is_leader`] and
/// [`LeaderElection::is_leader`] turn `false`, the term's [`Leadership::loss_channel`] receives
/// a [`LeadershipLost`], the builder's
/// [`on_leadership_lost`](LeaderElectionBuilder::on_leadership_lost) callback runs, and
/// [`run`](LeaderElection::run) calls its `on_lost`:
///
/// - **the registry reports the lease lost** ([`LeadershipLossReason::Lease`]): a renewal found
///   another holder or no row, or failed for good;
/// - **the renewal is overdue** ([`LeadershipLossReason::RenewalOverdue`]): no renewal has
///   succeeded and the lease has only the step-down margin left. The election's agent thread
///   watches the lease deadline itself, so this fires on time even when a renewal statement hangs
///   on an unreachable server. The deadline is the instant the last successful renewal was
///   *sent* plus the lease, on the monotonic clock; the database started its lease later than
///   that, so the leader stops at least one margin before any standby can be granted the lock.
///
/// After a loss the election releases what is left of the lease (best effort) and, if a
/// campaign is still running (`run`), competes again. A [`Leadership`] whose term was lost stays
/// lost: its [`resign`](Leadership::resign) reports [`Error::LeaseLost`].
///
/// `is_leader()` compares the step-down instant with the monotonic clock directly, so it turns
/// `false` on time even if no thread has woken up yet. Like every lease, this cannot protect a
/// leader that is paused (GC, swap, a stopped VM) between checking and acting: pass
/// [`Leadership::term`] to the resources you write to and have them refuse smaller terms.
///
/// # Resigning
///
/// [`Leadership::resign`] (or dropping the [`Leadership`]) releases the lock at once, and a
/// standby takes over without waiting out the lease. On PostgreSQL with release notifications
/// (`RegistryBuilder::notifications`, on by default) the release wakes the standbys of other
/// instances, which try at once: a planned handover takes about one release and one acquire.
/// Elsewhere (or with notifications off) a standby takes over at its next poll, within one
/// `idle_between_tries`. The resigning election waits one such interval before
/// competing again itself, even when woken, so a standby gets the turn.
///
/// # Clock skew
///
/// Whether a lease has expired is decided only by the database, on its own clock, inside the
/// acquire and renew statements: a client whose clock is wrong cannot steal leadership, and a
/// leader's own deadline runs on its monotonic clock. Wall clocks still matter for what the
/// election *reports* — [`Leadership::elected_at`], [`Leadership::lease_ends_at`],
/// [`LeaderElection::now`] — and an operator comparing them across machines wants them on one
/// clock. So each election measures its offset to the database clock: at `build()`, then every
/// renewal period while it leads or stands by (on a helper thread, so a slow database never
/// delays a step-down), and on demand with
/// [`measure_clock_offset`](LeaderElection::measure_clock_offset). The offset is the database
/// time minus the midpoint of the client clock readings taken around the query; it is uncertain
/// by half the round trip, which [`ClockOffset::round_trip`] reports. Unlike ActiveMQ, which
/// measures once, the offset is refreshed, so a clock that steps (NTP, daylight-saving bugs) is
/// caught.
///
/// When `max_allowable_diff_from_db_time` is non-zero and the measured offset exceeds it, the
/// election logs a warning (once, when the offset first exceeds it; an `info` when it is back
/// within) and every wall-clock time it reports is corrected by the offset, i.e. expressed on
/// the database clock. Within the allowance, or with the setting at zero, the client clock is
/// reported as is. [`client_clock`](LeaderElectionBuilder::client_clock) replaces the client
/// clock for tests and simulations.
///
/// # Threads and handles
///
/// A lock guard is `!Send`: it belongs to the thread that acquired it. Each election therefore
/// has one agent thread that makes the attempts, holds the guard of the current term, and
/// watches its deadline; a clock thread measures the offset. [`LeaderElection`] (cheap to clone;
/// clones are the same contender) and [`Leadership`] are `Send` and `Sync` handles that talk to
/// the agent. The threads end when the last election handle and the last leadership handle are
/// dropped; a term still held then is released.
///
/// Callbacks run on the agent thread (`on_leadership_lost`) or the thread calling `run`; they
/// must return promptly and must not call back into the same election. A callback must not own
/// a clone of its election (that would keep the election alive forever).
///
/// Do not lock the group's key yourself through [`LeaderElection::registry`]: a local waiter
/// would be handed the lease when the leader resigns.
#[derive(Clone)]
pub struct LeaderElection {
    handle: Arc<Handle>,
}

/// What election handles share: the agent's mailbox.
struct Handle {
    shared: Arc<Shared>,
    commands: Sender<Command>,
    next_id: AtomicU64,
}

impl LeaderElection {
    /// A builder for an election of `group` (the lock key: 1 to
    /// [`MAX_KEY_BYTES`](crate::MAX_KEY_BYTES) bytes) on the registry `registry` will build.
    /// Configure the connection, table and region on `registry`; the election sets its
    /// timings (see [`LeaderElection`]).
    pub fn builder(registry: RegistryBuilder, group: impl Into<String>) -> LeaderElectionBuilder {
        LeaderElectionBuilder {
            registry,
            group: group.into(),
            lease: Duration::from_secs(10),
            keep_alive: None,
            sleep: Duration::from_secs(1),
            max_diff: Duration::ZERO,
            fail_if_locked: false,
            clock: Arc::new(SystemTime::now),
            on_lost: None,
        }
    }

    /// The group name (the lock key).
    pub fn group(&self) -> &str {
        &self.handle.shared.group
    }

    /// Closes the election's registry (see [`LockRegistry::close`]): a waiting
    /// [`acquire`](Self::acquire) returns [`Error::Closed`] at once, and so does every later
    /// attempt; a term held now stays held until its [`Leadership`] goes or resigns.
    pub fn close(&self) {
        self.handle.shared.registry.close();
    }

    /// The registry this election runs on (for its statistics, client id or clock). Do not
    /// lock the group's key through it.
    pub fn registry(&self) -> &LockRegistry {
        &self.handle.shared.registry
    }

    /// The time-to-live in force ([`LeaderElectionBuilder::time_to_live`]).
    pub fn time_to_live(&self) -> Duration {
        self.handle.shared.timings.lease
    }

    /// The leader's renewal period in force ([`LeaderElectionBuilder::renew_every`]): the
    /// default, a third of the time-to-live, unless one was set.
    pub fn renew_every(&self) -> Duration {
        self.handle.shared.timings.keep_alive
    }

    /// The standby's interval between attempts in force
    /// ([`LeaderElectionBuilder::idle_between_tries`]).
    pub fn idle_between_tries(&self) -> Duration {
        self.handle.shared.timings.sleep
    }

    /// ActiveMQ's name for [`time_to_live`](Self::time_to_live); the same value.
    pub fn lease_duration(&self) -> Duration {
        self.time_to_live()
    }

    /// ActiveMQ's name for [`renew_every`](Self::renew_every); the same value.
    pub fn lock_keep_alive_period(&self) -> Duration {
        self.renew_every()
    }

    /// ActiveMQ's name for [`idle_between_tries`](Self::idle_between_tries); the same value.
    pub fn lock_acquire_sleep_interval(&self) -> Duration {
        self.idle_between_tries()
    }

    /// How much of its lease a leader that cannot renew keeps when it steps down: a tenth of
    /// the lease.
    pub fn step_down_margin(&self) -> Duration {
        self.handle.shared.timings.margin
    }

    /// Stands by until this instance is elected (or, with
    /// [`fail_if_locked`](LeaderElectionBuilder::fail_if_locked), makes one attempt).
    ///
    /// A standby makes one attempt per `idle_between_tries`. Database failures while
    /// standing by are logged at `warn` and retried at the next interval: a standby outlives
    /// outages. Use [`try_acquire_for`](Self::try_acquire_for) to bound the wait. If this
    /// election already leads through another [`Leadership`], this waits for that term to end.
    pub fn acquire(&self) -> Result<Leadership> {
        let kind = if self.handle.shared.timings.fail_if_locked {
            Kind::OnceOrFail
        } else {
            Kind::StandBy
        };
        loop {
            let (_, reply) = self.campaign(kind, None)?;
            if let Some(leadership) = wait(&reply)? {
                return Ok(leadership);
            }
        }
    }

    /// One attempt: `Ok(None)` when another instance leads (or this election already does
    /// through another [`Leadership`]). Errors are returned, not retried beyond the registry's
    /// `operation_timeout`.
    pub fn try_acquire(&self) -> Result<Option<Leadership>> {
        let (_, reply) = self.campaign(Kind::Once, None)?;
        wait(&reply)
    }

    /// Stands by for at most `timeout`; `Ok(None)` if not elected by then. If the last attempt
    /// before the deadline failed, that failure is returned as [`Error::Timeout`] instead.
    pub fn try_acquire_for(&self, timeout: Duration) -> Result<Option<Leadership>> {
        if timeout.is_zero() {
            return self.try_acquire();
        }
        let deadline = Instant::now().checked_add(timeout);
        let (_, reply) = self.campaign(Kind::StandBy, deadline)?;
        wait(&reply)
    }

    /// `true` while this election holds a term it has not lost or resigned, and its lease is
    /// not within the step-down margin of its end without a renewal.
    pub fn is_leader(&self) -> bool {
        self.current().is_some_and(|term| term.is_held())
    }

    /// The number (fencing token) of the term this election holds, if [`is_leader`](Self::is_leader).
    pub fn current_term(&self) -> Option<u64> {
        self.current()
            .filter(|term| term.is_held())
            .map(|term| term.number)
    }

    fn current(&self) -> Option<Arc<Term>> {
        self.handle.shared.current.lock().clone()
    }

    /// The last measured offset to the database clock (measured at `build()` and then every
    /// renewal period while competing or leading).
    pub fn clock_offset(&self) -> ClockOffset {
        self.handle.shared.offset.lock().last
    }

    /// Measures the offset to the database clock now (one query), records it and returns it.
    pub fn measure_clock_offset(&self) -> Result<ClockOffset> {
        self.handle.shared.measure()
    }

    /// `true` while the measured offset exceeds a non-zero
    /// [`max_allowable_diff_from_db_time`](LeaderElectionBuilder::max_allowable_diff_from_db_time)
    /// and reported times are corrected by it.
    pub fn is_adjusting_clock(&self) -> bool {
        self.handle.shared.offset.lock().adjusting
    }

    /// The current time as this election reports times: the client clock, corrected by the
    /// measured offset while [`is_adjusting_clock`](Self::is_adjusting_clock).
    pub fn now(&self) -> SystemTime {
        self.handle.shared.now()
    }

    /// Competes until `stop` receives a message or is disconnected, calling `on_elected` at the
    /// start of every term and `on_lost` when a term is lost (not when this loop resigns).
    ///
    /// Both callbacks run on the calling thread and must return promptly: start and stop the
    /// leader's work elsewhere (`on_elected` gets the [`Leadership`] to read its term and
    /// `loss_channel` from). After a loss the loop stands by again. On `stop` it withdraws, or
    /// resigns the term it holds (a standby takes over at once), and returns. Database failures
    /// while standing by are logged and retried; the loop returns an error only when
    /// [`fail_if_locked`](LeaderElectionBuilder::fail_if_locked) makes its first round fail, or
    /// when the release at `stop` fails.
    pub fn run(
        &self,
        mut on_elected: impl FnMut(&Leadership),
        mut on_lost: impl FnMut(&LeadershipLost),
        stop: &Receiver<()>,
    ) -> Result<()> {
        let mut first = true;
        loop {
            let kind = if first && self.handle.shared.timings.fail_if_locked {
                Kind::OnceOrFail
            } else {
                Kind::StandBy
            };
            first = false;
            let (id, reply) = self.campaign(kind, None)?;
            let leadership = crossbeam_channel::select! {
                recv(reply) -> outcome => match outcome {
                    Ok(Ok(Some(leadership))) => leadership,
                    Ok(Ok(None)) => continue,
                    Ok(Err(e)) => return Err(e),
                    Err(_) => return Err(agent_gone()),
                },
                recv(stop) -> _ => {
                    let _ = self.handle.commands.send(Command::Withdraw(id));
                    // A grant that raced with the withdrawal is handed back at once.
                    if let Ok(Ok(Some(leadership))) = reply.recv_timeout(Duration::ZERO) {
                        leadership.resign().or_else(ignore_loss)?;
                    }
                    return Ok(());
                },
            };
            on_elected(&leadership);
            let losses = leadership.loss_channel();
            crossbeam_channel::select! {
                recv(losses) -> event => {
                    if let Ok(event) = event {
                        on_lost(&event);
                    }
                },
                recv(stop) -> _ => {
                    return match leadership.resign() {
                        Err(e) if e.is_lease_lost() => {
                            if let Ok(event) = losses.try_recv() {
                                on_lost(&event);
                            }
                            Ok(())
                        }
                        other => other,
                    };
                },
            }
        }
    }

    fn campaign(
        &self,
        kind: Kind,
        deadline: Option<Instant>,
    ) -> Result<(u64, Receiver<Result<Option<Leadership>>>)> {
        let id = self.handle.next_id.fetch_add(1, Ordering::Relaxed);
        let (reply, replies) = crossbeam_channel::bounded(1);
        let request = Request {
            id,
            kind,
            deadline,
            started: Instant::now(),
            reply,
            commands: self.handle.commands.clone(),
        };
        self.handle
            .commands
            .send(Command::Campaign(request))
            .map_err(|_| agent_gone())?;
        Ok((id, replies))
    }
}

impl fmt::Debug for LeaderElection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderElection")
            .field("group", &self.handle.shared.group)
            .field("registry", &self.handle.shared.registry)
            .field("current_term", &self.current_term())
            .finish()
    }
}

fn wait(replies: &Receiver<Result<Option<Leadership>>>) -> Result<Option<Leadership>> {
    replies.recv().map_err(|_| agent_gone())?
}

fn ignore_loss(e: Error) -> Result<()> {
    if e.is_lease_lost() {
        Ok(())
    } else {
        Err(e)
    }
}

fn agent_gone() -> Error {
    Error::Database {
        operation: "leader election",
        hint: "the election's agent thread has stopped; see the log for the panic".into(),
        source: "agent thread stopped".into(),
    }
}

/// This instance's leadership of one term. `Send` and `Sync`; dropping it resigns.
///
/// The lock guard of the term stays on the election's agent thread, which renews and watches
/// it; this handle reports what the agent sees.
#[must_use = "dropping a Leadership resigns at once"]
pub struct Leadership {
    shared: Arc<Shared>,
    term: Arc<Term>,
    commands: Sender<Command>,
    done: bool,
}

impl Leadership {
    /// The term number: the fencing token of the grant. Every term of a group has a larger
    /// number than every earlier term, across instances and restarts; pass it to the resources
    /// the leader writes to and have them refuse smaller ones.
    pub fn term(&self) -> u64 {
        self.term.number
    }

    /// The group led.
    pub fn group(&self) -> &str {
        &self.shared.group
    }

    /// The lease of this term (fenced transactions check its row).
    pub(crate) fn lease(&self) -> Arc<crate::lease::Lease> {
        Arc::clone(&self.term.state.lock().lease)
    }

    /// `true` until the term is resigned or lost, and only while the lease has more than the
    /// step-down margin left (a renewal extends it).
    pub fn is_leader(&self) -> bool {
        self.term.is_held()
    }

    /// How much longer this term lasts if no renewal succeeds from now on: the time until the
    /// step-down instant. Zero once the term is over.
    pub fn remaining(&self) -> Duration {
        let state = self.term.state.lock();
        if state.lost.is_some() || state.ended {
            return Duration::ZERO;
        }
        state.leader_until.saturating_duration_since(Instant::now())
    }

    /// A channel that receives one [`LeadershipLost`] if this term is lost (at once if it
    /// already is); it disconnects without a message when the term is resigned. Use it with
    /// `crossbeam_channel::select!` to stop the leader's work promptly.
    pub fn loss_channel(&self) -> Receiver<LeadershipLost> {
        self.term.loss_channel()
    }

    /// When this term began, on the clock the election reports (see
    /// [`LeaderElection::now`]).
    pub fn elected_at(&self) -> SystemTime {
        self.term.elected_at
    }

    /// When the lease ends on the reported clock if no further renewal succeeds: an estimate
    /// from the last renewal the agent has seen (it looks every half renewal period), so it
    /// can lag a renewal but never runs ahead of the lease.
    pub fn lease_ends_at(&self) -> SystemTime {
        let deadline = self.term.state.lock().lease_deadline;
        let left = deadline.saturating_duration_since(Instant::now());
        let now = self.shared.now();
        now.checked_add(left).unwrap_or(now)
    }

    /// Releases the lock at once, so a standby takes over at its next poll without waiting
    /// out the lease. `Err(LeaseLost)` if the term had already been lost: work done since may
    /// not have been exclusive.
    pub fn resign(mut self) -> Result<()> {
        self.done = true;
        if let Some(lost) = self.term.lost() {
            return Err(lost.into_error());
        }
        let (reply, outcome) = crossbeam_channel::bounded(1);
        let resign = Command::Resign {
            term: self.term.number,
            reply: Some(reply),
        };
        if self.commands.send(resign).is_err() {
            return Ok(());
        }
        let released = outcome.recv().unwrap_or(Ok(()));
        match self.term.lost() {
            Some(lost) if released.is_ok() => Err(lost.into_error()),
            _ => released,
        }
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.commands.send(Command::Resign {
                term: self.term.number,
                reply: None,
            });
        }
    }
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("group", &self.shared.group)
            .field("term", &self.term.number)
            .field("is_leader", &self.is_leader())
            .finish()
    }
}

impl LeadershipLost {
    fn into_error(self) -> Error {
        let reason = match self.reason {
            LeadershipLossReason::Lease(reason) => reason,
            LeadershipLossReason::RenewalOverdue => LossReason::Expired(Some(
                "no renewal succeeded in time; the leader stepped down before the lease end".into(),
            )),
        };
        Error::LeaseLost {
            key: self.group,
            reason,
        }
    }
}

/// What the election's threads and handles share.
struct Shared {
    group: String,
    registry: LockRegistry,
    timings: Timings,
    clock: ClientClock,
    offset: Mutex<OffsetState>,
    current: Mutex<Option<Arc<Term>>>,
    on_lost: Option<LeadershipLostCallback>,
}

struct OffsetState {
    last: ClockOffset,
    adjusting: bool,
}

impl Shared {
    fn now(&self) -> SystemTime {
        let client = (self.clock)();
        let offset = self.offset.lock();
        if offset.adjusting {
            offset.last.to_database_time(client)
        } else {
            client
        }
    }

    fn measure(&self) -> Result<ClockOffset> {
        let reading = measure(&self.registry, &self.clock)?;
        self.record_offset(reading);
        Ok(reading)
    }

    /// Keeps the newest reading and switches the correction on or off.
    fn record_offset(&self, reading: ClockOffset) {
        let max = self.timings.max_diff;
        let exceeded = !max.is_zero() && reading.magnitude() > max;
        let mut state = self.offset.lock();
        if reading.measured_at() < state.last.measured_at() {
            return;
        }
        if exceeded && !state.adjusting {
            log::warn!(
                "the clock of this instance differs from the database clock by {reading}, more \
                 than max_allowable_diff_from_db_time ({max:?}): times reported for group {:?} \
                 are corrected by the offset from now on (leases are judged on the database \
                 clock and are not affected)",
                self.group
            );
        } else if !exceeded && state.adjusting {
            log::info!(
                "the clock offset to the database is back within {max:?} ({reading}); times for \
                 group {:?} are no longer corrected",
                self.group
            );
        } else {
            log::debug!("clock offset of group {:?}: {reading}", self.group);
        }
        state.last = reading;
        state.adjusting = exceeded;
    }
}
