//! Polling the rows of one name (a semaphore's permits, a reader/writer lock's read slots and
//! claim rows) with the plain lock's statements: each row of a round gets a bounded share of
//! the wait, so a row another session holds locked costs only that row.

use super::{Lock, LockGuard};
use crate::core::Settings;
use crate::error::{Error, Result};
use std::time::{Duration, Instant};

/// How many rows of one semaphore (or reader/writer lock) a waiter registers for release
/// wake-ups where the listener watches keys one by one (MySQL: a watcher thread and connection
/// each, at most 16 per registry); releases of the others are found by polling.
pub(crate) const KEYED_WATCHES: usize = 4;

/// How long a poller gives one row of a round at first: a row another session holds locked (a
/// migration, an operator's `SELECT … FOR UPDATE`) costs this much, then the round goes on
/// with the next row.
fn first_patience(settings: &Settings) -> Duration {
    settings
        .idle_between_tries
        .max(Duration::from_millis(100))
        .min(settings.operation_timeout)
}

/// The most rounds a wait passes over a row that did not answer before it tries it again.
const MOST_ROUNDS_PASSED_OVER: u32 = 64;

/// The time a poller gives each row of its rounds: one row that does not answer in it (locked
/// by another session) costs only that row, and the rounds of the same wait then pass over it
/// without a statement for 1, 2, 4, … rounds (at most [`MOST_ROUNDS_PASSED_OVER`]) before
/// they try it again, so a row locked for long costs a statement now and then, not one per
/// round. A round in which rows were tried and none answered (a server that is slow for every
/// statement, or gone) doubles the time for the next round, up to the full statement time, so
/// a slow server is still waited for and a server that is gone still fails the wait.
pub(crate) struct Patience {
    per_row: Duration,
    /// Whether a row answered in this round, and whether one ran out of its time.
    answered: bool,
    ran_out: bool,
    /// Rows that did not answer: `LOCK_KEY`, rounds still passed over, rounds the next time.
    passed_over: Vec<(String, u32, u32)>,
}

impl Patience {
    pub(crate) fn new(settings: &Settings) -> Self {
        Patience {
            per_row: first_patience(settings),
            answered: false,
            ran_out: false,
            passed_over: Vec::new(),
        }
    }

    /// Called when a round is over.
    pub(crate) fn round_over(&mut self, settings: &Settings) {
        if self.ran_out && !self.answered {
            self.per_row = (self.per_row * 2).min(settings.operation_timeout);
        }
        self.answered = false;
        self.ran_out = false;
        for (_, left, _) in &mut self.passed_over {
            *left = left.saturating_sub(1);
        }
    }

    /// One try of one row of a round: the guard, or `None` when the row is held elsewhere,
    /// did not answer within its share of the wait, or is passed over (see [`Patience`]). The
    /// statement gives up at `deadline` if there is one, else after `operation_timeout`;
    /// `Err(Timeout)` only when that whole time ran out.
    pub(crate) fn try_row(
        &mut self,
        lock: &Lock,
        settings: &Settings,
        deadline: Option<Instant>,
        ttl: Duration,
    ) -> Result<Option<LockGuard>> {
        let key = lock.lock_key();
        let known = self.passed_over.iter().position(|(k, _, _)| k == key);
        if known.is_some_and(|at| self.passed_over[at].1 > 0) {
            return Ok(None);
        }
        let now = Instant::now();
        let full = deadline.unwrap_or(now + settings.operation_timeout);
        let row_deadline = full.min(now + self.per_row);
        match lock.try_lock_once_until(row_deadline, ttl) {
            Err(Error::Timeout { .. }) if row_deadline < full => {
                self.ran_out = true;
                match known {
                    Some(at) => {
                        let (_, left, next) = &mut self.passed_over[at];
                        // `round_over` counts this round too.
                        *left = *next + 1;
                        *next = (*next * 2).min(MOST_ROUNDS_PASSED_OVER);
                    }
                    None => self.passed_over.push((key.to_string(), 2, 2)),
                }
                Ok(None)
            }
            Err(e) => Err(e),
            Ok(granted) => {
                self.answered = true;
                if let Some(at) = known {
                    self.passed_over.swap_remove(at);
                }
                Ok(granted)
            }
        }
    }
}
