//! Building an election: validating its timings, and starting its threads.

use super::*;

/// The validated timings of an election.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timings {
    pub(super) lease: Duration,
    pub(super) keep_alive: Duration,
    pub(super) sleep: Duration,
    pub(super) max_diff: Duration,
    pub(super) fail_if_locked: bool,
    pub(super) margin: Duration,
}

/// Configures a [`LeaderElection`]; see [`LeaderElection`] for what each setting means.
#[must_use = "a builder does nothing until build() is called"]
pub struct LeaderElectionBuilder {
    pub(super) registry: RegistryBuilder,
    pub(super) group: String,
    pub(super) lease: Duration,
    pub(super) keep_alive: Option<Duration>,
    pub(super) sleep: Duration,
    pub(super) max_diff: Duration,
    pub(super) fail_if_locked: bool,
    pub(super) clock: ClientClock,
    pub(super) on_lost: Option<LeadershipLostCallback>,
}

impl LeaderElectionBuilder {
    /// How long leadership lasts on the database clock after the last successful grant or
    /// renewal; the longest a crashed leader keeps the group without a leader. Defaults to 10 s.
    /// Must be within [`MIN_TIME_TO_LIVE`]..=[`MAX_TIME_TO_LIVE`]. Becomes the registry's
    /// [`time_to_live`](RegistryBuilder::time_to_live). ActiveMQ's name for it:
    /// [`lease_duration`](Self::lease_duration).
    pub fn time_to_live(mut self, ttl: Duration) -> Self {
        self.lease = ttl;
        self
    }

    /// The leader's renewal period: each renewal is sent this long after the previous one was
    /// sent. Defaults to a third of the time-to-live. Must satisfy
    /// `2 × period + time_to_live / 10 ≤ time_to_live` (see [`LeaderElection`]). Becomes the
    /// registry's [`renew_every`](RegistryBuilder::renew_every). ActiveMQ's name for it:
    /// [`lock_keep_alive_period`](Self::lock_keep_alive_period).
    pub fn renew_every(mut self, period: Duration) -> Self {
        self.keep_alive = Some(period);
        self
    }

    /// How long a standby sleeps between attempts to become leader. Defaults to 1 s. A crashed
    /// leader is replaced within about its time-to-live + this; a resigning one within about
    /// this. Must be within 1 ms..=[`MAX_IDLE_BETWEEN_TRIES`]. Becomes the registry's
    /// [`idle_between_tries`](RegistryBuilder::idle_between_tries). ActiveMQ's name for it:
    /// [`lock_acquire_sleep_interval`](Self::lock_acquire_sleep_interval).
    pub fn idle_between_tries(mut self, interval: Duration) -> Self {
        self.sleep = interval;
        self
    }

    /// ActiveMQ's name for [`time_to_live`](Self::time_to_live); the same setting.
    pub fn lease_duration(self, lease: Duration) -> Self {
        self.time_to_live(lease)
    }

    /// ActiveMQ's name for [`renew_every`](Self::renew_every); the same setting.
    pub fn lock_keep_alive_period(self, period: Duration) -> Self {
        self.renew_every(period)
    }

    /// ActiveMQ's name for [`idle_between_tries`](Self::idle_between_tries); the same setting.
    pub fn lock_acquire_sleep_interval(self, interval: Duration) -> Self {
        self.idle_between_tries(interval)
    }

    /// How far this instance's clock may be from the database's before the wall-clock times
    /// the election reports are corrected by the measured offset, with a warning logged.
    /// Defaults to zero, which turns the correction off (the offset is still measured and
    /// available from [`LeaderElection::clock_offset`]). Whether a lease has expired never
    /// depends on it: that is always judged on the database clock.
    pub fn max_allowable_diff_from_db_time(mut self, max: Duration) -> Self {
        self.max_diff = max;
        self
    }

    /// With `true`, [`LeaderElection::acquire`] and the first round of [`LeaderElection::run`]
    /// make one attempt and fail with [`Error::AlreadyHeld`] when another instance leads,
    /// instead of standing by. Defaults to `false`.
    pub fn fail_if_locked(mut self, fail: bool) -> Self {
        self.fail_if_locked = fail;
        self
    }

    /// **For tests and simulations**: the wall clock this instance believes in, instead of
    /// `SystemTime::now`. It is used for the offset measurement and for every wall-clock time
    /// the election reports; leases never depend on it.
    pub fn client_clock(mut self, clock: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Called once per involuntary loss of leadership, on the election's agent thread, right
    /// when the loss is noticed (before the lease is released). Keep it short; it must not
    /// block or call into the same election. Defaults to none (losses are logged at `warn`).
    pub fn on_leadership_lost(
        mut self,
        callback: impl Fn(&LeadershipLost) + Send + Sync + 'static,
    ) -> Self {
        self.on_lost = Some(Arc::new(callback));
        self
    }

    fn timings(&self) -> Result<Timings> {
        let lease = self.lease;
        if !(MIN_TIME_TO_LIVE..=MAX_TIME_TO_LIVE).contains(&lease) {
            return Err(Error::setting(
                "time_to_live",
                format!(
                    "{lease:?} is outside {MIN_TIME_TO_LIVE:?}..={MAX_TIME_TO_LIVE:?}; pick a \
                     lease a little longer than the longest pause you expect between renewals"
                ),
            ));
        }
        let margin = lease / 10;
        let keep_alive = self.keep_alive.unwrap_or(lease / 3);
        if keep_alive.is_zero() {
            return Err(Error::setting(
                "renew_every",
                "must be longer than zero; a third of the time-to-live is the default",
            ));
        }
        let needed = keep_alive.saturating_mul(2).saturating_add(margin);
        if needed > lease {
            return Err(Error::setting(
                "renew_every",
                format!(
                    "{keep_alive:?} leaves no time to renew a {lease:?} lease: the first renewal \
                     is due {keep_alive:?} after the grant and needs one more period of slack \
                     before the leader steps down ({margin:?} before the lease ends), so use at \
                     most {:?} (2 × period + lease / 10 ≤ lease)",
                    (lease - margin) / 2
                ),
            ));
        }
        let sleep = self.sleep;
        if sleep < Duration::from_millis(1) || sleep > MAX_IDLE_BETWEEN_TRIES {
            return Err(Error::setting(
                "idle_between_tries",
                format!(
                    "{sleep:?} is outside 1ms..={MAX_IDLE_BETWEEN_TRIES:?}; zero would spin on \
                     the database"
                ),
            ));
        }
        Ok(Timings {
            lease,
            keep_alive,
            sleep,
            max_diff: self.max_diff,
            fail_if_locked: self.fail_if_locked,
            margin,
        })
    }

    /// Validates the timings, builds the registry, measures the clock offset once and starts
    /// the election's threads. The election does not compete until asked to.
    pub fn build(self) -> Result<LeaderElection> {
        let timings = self.timings()?;
        let registry = self
            .registry
            .time_to_live(timings.lease)
            .renew_every(timings.keep_alive)
            .renewal(true)
            .idle_between_tries(timings.sleep)
            .build()?;
        let lock = registry.obtain(&self.group)?;
        let clock = self.clock;
        let first = measure(&registry, &clock)?;
        let shared = Arc::new(Shared {
            group: self.group,
            registry,
            timings,
            clock,
            offset: Mutex::new(OffsetState {
                last: first,
                adjusting: false,
            }),
            current: Mutex::new(None),
            on_lost: self.on_lost,
        });
        shared.record_offset(first);

        let (tick_tx, tick_rx) = crossbeam_channel::bounded::<()>(1);
        let for_clock = Arc::clone(&shared);
        spawn("leasehold-leader-clock", move || {
            for () in tick_rx {
                if let Err(e) = for_clock.measure() {
                    log::debug!("measuring the clock offset of {:?}: {e}", for_clock.group);
                }
            }
        })?;
        let (commands_tx, commands_rx) = crossbeam_channel::unbounded();
        let (released_tx, released_rx) = crossbeam_channel::bounded::<()>(1);
        let for_agent = Arc::clone(&shared);
        let release_watch: Arc<dyn crate::wakeups::Nudge> =
            Arc::new(ReleaseWatch { woken: released_tx });
        // Closing the registry wakes the agent, which then answers every waiting request.
        shared.registry.track(Arc::downgrade(&release_watch));
        // The agent is built on its own thread: the guard it will hold is `!Send`.
        spawn("leasehold-leader", move || {
            Agent {
                shared: for_agent,
                lock,
                commands: commands_rx,
                waiting: VecDeque::new(),
                held: None,
                next_attempt: Instant::now(),
                next_check: Instant::now(),
                next_clock: Instant::now() + timings.keep_alive,
                clock_tick: tick_tx,
                last_error: None,
                release_watch,
                released: released_rx,
                watching: false,
                resting_until: Instant::now(),
            }
            .run()
        })?;
        Ok(LeaderElection {
            handle: Arc::new(Handle {
                shared,
                commands: commands_tx,
                next_id: AtomicU64::new(0),
            }),
        })
    }
}

pub(super) fn spawn(name: &str, body: impl FnOnce() + Send + 'static) -> Result<()> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(body)
        .map(drop)
        .map_err(|e| Error::Database {
            operation: "start leader election",
            hint: format!("could not start the {name} thread: {e}"),
            source: Box::new(e),
        })
}
