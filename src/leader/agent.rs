//! The agent: one thread per election that makes the attempts, holds the lock guard (guards
//! are `!Send`, so they stay on this thread), renews through the registry, watches the lease
//! deadline, and answers the handles' requests.

use super::*;
use crate::wakeups::Nudge;

/// One term, shared by the agent (which updates it) and the [`Leadership`] handle.
pub(super) struct Term {
    pub(super) number: u64,
    pub(super) group: String,
    pub(super) elected_at: SystemTime,
    pub(super) state: Mutex<TermState>,
}

pub(super) struct TermState {
    /// The step-down instant: lease deadline minus the margin, as last seen by the agent.
    pub(super) leader_until: Instant,
    /// The lease deadline as last seen by the agent.
    pub(super) lease_deadline: Instant,
    pub(super) lost: Option<LeadershipLost>,
    /// Resigned (or the election shut down).
    pub(super) ended: bool,
    pub(super) listeners: Vec<Sender<LeadershipLost>>,
    /// The term's lease: a loss the lease knows of ends `is_held()` at once, before the agent
    /// next looks.
    pub(super) lease: Arc<crate::lease::Lease>,
}

impl Term {
    pub(super) fn is_held(&self) -> bool {
        let state = self.state.lock();
        !state.ended
            && state.lost.is_none()
            && Instant::now() < state.leader_until
            && state.lease.is_held()
    }

    pub(super) fn lost(&self) -> Option<LeadershipLost> {
        self.state.lock().lost.clone()
    }

    pub(super) fn leader_until(&self) -> Instant {
        self.state.lock().leader_until
    }

    /// Moves the step-down instant to `deadline - margin`. `false` when the step-down instant
    /// has passed already: a promise of `is_leader()` is never taken back by a late renewal.
    pub(super) fn extend(&self, now: Instant, deadline: Instant, margin: Duration) -> bool {
        let mut state = self.state.lock();
        if now >= state.leader_until {
            return false;
        }
        let until = deadline.checked_sub(margin).unwrap_or(now);
        if until <= now {
            state.leader_until = now;
            return false;
        }
        state.leader_until = state.leader_until.max(until);
        state.lease_deadline = state.lease_deadline.max(deadline);
        true
    }

    pub(super) fn mark_lost(&self, event: &LeadershipLost) {
        let mut state = self.state.lock();
        if state.ended || state.lost.is_some() {
            return;
        }
        state.lost = Some(event.clone());
        for listener in state.listeners.drain(..) {
            let _ = listener.try_send(event.clone());
        }
    }

    pub(super) fn end(&self) {
        let mut state = self.state.lock();
        state.ended = true;
        state.listeners.clear();
    }

    pub(super) fn loss_channel(&self) -> Receiver<LeadershipLost> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let mut state = self.state.lock();
        match &state.lost {
            Some(event) => {
                let _ = tx.try_send(event.clone());
            }
            None if state.ended => {}
            None => state.listeners.push(tx),
        }
        rx
    }
}

/// Wakes the agent when another instance releases the group's lock (see `crate::wakeups`).
pub(super) struct ReleaseWatch {
    pub(super) woken: Sender<()>,
}

impl Nudge for ReleaseWatch {
    fn nudge(&self) {
        // One pending wake-up is enough.
        let _ = self.woken.try_send(());
    }
}

/// What handles ask the agent.
pub(super) enum Command {
    Campaign(Request),
    Withdraw(u64),
    Resign {
        term: u64,
        reply: Option<Sender<Result<()>>>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// One attempt; `Ok(None)` when held elsewhere.
    Once,
    /// One attempt; [`Error::AlreadyHeld`] when held elsewhere.
    OnceOrFail,
    /// Attempts every sleep interval until elected, the deadline passes, or withdrawn.
    StandBy,
}

pub(super) struct Request {
    pub(super) id: u64,
    pub(super) kind: Kind,
    pub(super) deadline: Option<Instant>,
    pub(super) started: Instant,
    pub(super) reply: Sender<Result<Option<Leadership>>>,
    /// The requester's mailbox, for the [`Leadership`] handed out.
    pub(super) commands: Sender<Command>,
}

/// The term this agent holds.
pub(super) struct Held {
    pub(super) guard: LockGuard,
    pub(super) term: Arc<Term>,
    pub(super) lease_loss: Receiver<LeaseLost>,
}

/// The thread that competes, holds the guard and watches it.
pub(super) struct Agent {
    pub(super) shared: Arc<Shared>,
    pub(super) lock: Lock,
    pub(super) commands: Receiver<Command>,
    pub(super) waiting: VecDeque<Request>,
    pub(super) held: Option<Held>,
    pub(super) next_attempt: Instant,
    pub(super) next_check: Instant,
    pub(super) next_clock: Instant,
    pub(super) clock_tick: Sender<()>,
    pub(super) last_error: Option<String>,
    /// This agent as a poller of release notifications, and where its wake-ups arrive.
    pub(super) release_watch: Arc<dyn Nudge>,
    pub(super) released: Receiver<()>,
    /// Whether `release_watch` is registered with the registry.
    pub(super) watching: bool,
    /// After resigning or losing a term, no attempt before this instant, woken or not.
    pub(super) resting_until: Instant,
}

impl Agent {
    pub(super) fn run(mut self) {
        loop {
            let timer = match self.next_wake() {
                Some(at) => crossbeam_channel::at(at),
                None => crossbeam_channel::never(),
            };
            let lease_loss = match &self.held {
                Some(held) => held.lease_loss.clone(),
                None => crossbeam_channel::never(),
            };
            crossbeam_channel::select! {
                recv(self.commands) -> command => match command {
                    Ok(command) => self.handle(command),
                    Err(_) => {
                        self.shut_down();
                        return;
                    }
                },
                recv(self.released) -> _ => {
                    // A closed registry is answered at once, rest or not.
                    let soonest = match self.shared.registry.core.is_closed() {
                        true => Instant::now(),
                        false => Instant::now().max(self.resting_until),
                    };
                    self.next_attempt = self.next_attempt.min(soonest);
                },
                recv(lease_loss) -> event => {
                    let reason = event.map_or(LossReason::Expired(None), |e| e.reason);
                    self.lose(LeadershipLossReason::Lease(reason));
                },
                recv(timer) -> _ => {},
            }
            self.tick();
        }
    }

    pub(super) fn active(&self) -> bool {
        self.held.is_some() || !self.waiting.is_empty()
    }

    pub(super) fn next_wake(&self) -> Option<Instant> {
        let mut times = Vec::with_capacity(4);
        match &self.held {
            Some(held) => times.extend([self.next_check, held.term.leader_until()]),
            None if !self.waiting.is_empty() => times.push(self.next_attempt),
            None => {}
        }
        times.extend(self.waiting.iter().filter_map(|r| r.deadline));
        if self.active() {
            times.push(self.next_clock);
        }
        times.into_iter().min()
    }

    pub(super) fn tick(&mut self) {
        let now = Instant::now();
        if self.active() && now >= self.next_clock {
            self.measure_soon();
        }
        self.expire_waiting(now);
        if self.held.is_some() {
            self.watch();
        } else if !self.waiting.is_empty() && Instant::now() >= self.next_attempt {
            self.attempt();
        }
        self.watch_releases(self.held.is_none() && !self.waiting.is_empty());
    }

    /// Registers or unregisters this agent for release notifications of its group's lock.
    fn watch_releases(&mut self, watch: bool) {
        if watch != self.watching {
            let poller = Arc::downgrade(&self.release_watch);
            self.watching = self.lock.watch_releases(&poller, watch);
        }
    }

    pub(super) fn measure_soon(&mut self) {
        let _ = self.clock_tick.try_send(());
        self.next_clock = Instant::now() + self.shared.timings.keep_alive;
    }

    pub(super) fn handle(&mut self, command: Command) {
        match command {
            Command::Campaign(request) => self.enqueue(request),
            Command::Withdraw(id) => self.waiting.retain(|r| r.id != id),
            Command::Resign { term, reply } => {
                let outcome = self.resign(term);
                if let Some(reply) = reply {
                    let _ = reply.send(outcome);
                } else if let Err(e) = outcome {
                    log::warn!("resigning leadership of {:?}: {e}", self.shared.group);
                }
            }
        }
    }

    pub(super) fn enqueue(&mut self, request: Request) {
        if !self.active() && Instant::now() >= self.next_clock {
            self.measure_soon();
        }
        if request.kind == Kind::StandBy {
            self.waiting.push_back(request);
            return;
        }
        if self.held.is_some() {
            let outcome = match request.kind {
                Kind::OnceOrFail => Err(self.already_led(true)),
                _ => Ok(None),
            };
            let _ = request.reply.send(outcome);
            return;
        }
        match self.lock.try_lock() {
            Ok(Some(guard)) => self.elect(guard, request),
            Ok(None) if request.kind == Kind::OnceOrFail => {
                let _ = request.reply.send(Err(self.already_led(false)));
            }
            Ok(None) => {
                let _ = request.reply.send(Ok(None));
            }
            Err(e) => {
                let _ = request.reply.send(Err(e));
            }
        }
    }

    pub(super) fn already_led(&self, by_this_instance: bool) -> Error {
        Error::AlreadyHeld {
            key: self.shared.group.clone(),
            by_this_instance,
        }
    }

    /// Answers standby requests whose deadline has passed.
    pub(super) fn expire_waiting(&mut self, now: Instant) {
        let mut index = 0;
        while index < self.waiting.len() {
            if self.waiting[index].deadline.is_some_and(|d| d <= now) {
                let request = self.waiting.remove(index).expect("index is in range");
                let outcome = match &self.last_error {
                    Some(last) => Err(Error::Timeout {
                        operation: "acquire leadership",
                        waited: now.duration_since(request.started),
                        source: Some(last.clone().into()),
                    }),
                    None => Ok(None),
                };
                let _ = request.reply.send(outcome);
            } else {
                index += 1;
            }
        }
    }

    /// One attempt on behalf of the standby requests; the next comes one sleep interval later.
    ///
    /// A single `try_lock` rather than a waiting `try_lock_until`, so that the agent stays
    /// responsive to commands between attempts and sends exactly one statement per interval.
    pub(super) fn attempt(&mut self) {
        let sleep = self.shared.timings.sleep;
        // Watch before the attempt, so that a release while it is in flight is not missed;
        // wake-ups from before it are stale.
        self.watch_releases(true);
        while self.released.try_recv().is_ok() {}
        match self.lock.try_lock() {
            Ok(Some(guard)) => {
                self.last_error = None;
                let request = self.waiting.pop_front().expect("attempts need a request");
                self.elect(guard, request);
            }
            Ok(None) => {
                self.last_error = None;
                self.next_attempt = Instant::now() + sleep;
                self.lock.expect_release();
            }
            Err(Error::Closed) => {
                // The registry was closed: no attempt can succeed any more.
                for request in self.waiting.drain(..) {
                    let _ = request.reply.send(Err(Error::Closed));
                }
            }
            Err(e) => {
                log::warn!(
                    "standing by for leadership of {:?}: {e}; retrying in {sleep:?}",
                    self.shared.group
                );
                self.last_error = Some(e.to_string());
                self.next_attempt = Instant::now() + sleep;
            }
        }
    }

    pub(super) fn elect(&mut self, guard: LockGuard, request: Request) {
        let now = Instant::now();
        let deadline = now + guard.remaining();
        let number = guard.fencing_token();
        let term = Arc::new(Term {
            number,
            group: self.shared.group.clone(),
            elected_at: self.shared.now(),
            state: Mutex::new(TermState {
                leader_until: deadline
                    .checked_sub(self.shared.timings.margin)
                    .unwrap_or(now),
                lease_deadline: deadline,
                lost: None,
                ended: false,
                listeners: Vec::new(),
                lease: Arc::clone(guard.lease()),
            }),
        });
        log::info!(
            "elected leader of {:?} (term {number}, client {})",
            self.shared.group,
            self.shared.registry.client_id()
        );
        *self.shared.current.lock() = Some(Arc::clone(&term));
        let lease_loss = guard.loss_channel();
        self.held = Some(Held {
            guard,
            term: Arc::clone(&term),
            lease_loss,
        });
        self.next_check = now + self.shared.timings.keep_alive / 2;
        let leadership = Leadership {
            shared: Arc::clone(&self.shared),
            term,
            commands: request.commands.clone(),
            done: false,
        };
        // If the requester is gone, the returned handle is dropped here and resigns.
        let _ = request.reply.send(Ok(Some(leadership)));
    }

    /// Looks at the guard: extends the step-down instant after a renewal, or steps down.
    pub(super) fn watch(&mut self) {
        fail_point!("leader::agent_watch");
        let Some(held) = &self.held else { return };
        let now = Instant::now();
        if !held.guard.is_held() {
            let reason = held
                .lease_loss
                .try_recv()
                .map_or(LossReason::Expired(None), |event| event.reason);
            self.lose(LeadershipLossReason::Lease(reason));
            return;
        }
        let deadline = now + held.guard.remaining();
        if held.term.extend(now, deadline, self.shared.timings.margin) {
            self.next_check = now + self.shared.timings.keep_alive / 2;
        } else {
            self.lose(LeadershipLossReason::RenewalOverdue);
        }
    }

    /// Ends the held term involuntarily: tells everyone, then releases what is left.
    pub(super) fn lose(&mut self, reason: LeadershipLossReason) {
        let Some(held) = self.held.take() else { return };
        self.clear_current(&held.term);
        let event = LeadershipLost {
            group: self.shared.group.clone(),
            term: held.term.number,
            reason,
        };
        log::warn!("{event}");
        held.term.mark_lost(&event);
        if let Some(callback) = &self.shared.on_lost {
            let called =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| callback(&event)));
            if called.is_err() {
                log::error!(
                    "the on_leadership_lost callback of {:?} panicked",
                    event.group
                );
            }
        }
        if let Err(e) = held.guard.unlock() {
            log::debug!(
                "releasing the lost term {} of {:?}: {e}",
                event.term,
                event.group
            );
        }
        self.rest();
    }

    /// No attempt for one sleep interval, even when woken: another instance gets its turn.
    fn rest(&mut self) {
        self.next_attempt = Instant::now() + self.shared.timings.sleep;
        self.resting_until = self.next_attempt;
    }

    pub(super) fn resign(&mut self, term: u64) -> Result<()> {
        let Some(held) = self.held.take_if(|held| held.term.number == term) else {
            return Ok(());
        };
        self.clear_current(&held.term);
        held.term.end();
        log::info!(
            "resigning leadership of {:?} (term {term})",
            self.shared.group
        );
        let released = held.guard.unlock();
        self.rest();
        released
    }

    pub(super) fn clear_current(&self, term: &Arc<Term>) {
        let mut current = self.shared.current.lock();
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, term)) {
            *current = None;
        }
    }

    pub(super) fn shut_down(&mut self) {
        if let Some(held) = self.held.take() {
            self.clear_current(&held.term);
            held.term.end();
            if let Err(e) = held.guard.unlock() {
                log::warn!(
                    "releasing leadership of {:?} at shutdown: {e}",
                    self.shared.group
                );
            }
        }
    }
}

impl fmt::Debug for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Term")
            .field("group", &self.group)
            .field("number", &self.number)
            .finish()
    }
}
