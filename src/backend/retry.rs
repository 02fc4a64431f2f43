//! The retry loop every operation of a store runs in: a pooled connection per attempt, deadlines
//! that a silent server cannot stretch, short pauses between transient failures.

use super::pools::Pool;
use super::{statement_threads, Backend, Conn, Failure, FailureKind, Path, Session, SqlStore};
use crate::error::{DatabaseError, Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

impl<B: Backend> SqlStore<B> {
    /// Runs `attempt` on a pooled connection until it succeeds, fails for good, or `deadline`
    /// passes. Transient failures sleep a short, doubling pause (1 ms to 100 ms, never past the
    /// deadline); broken connections are discarded, and with them the idle connections of
    /// their pool ([`discard_idle`]).
    ///
    /// A server or connection that stops answering cannot hold the caller past `deadline`:
    /// either the backend bounds the call itself ([`Backend::runs_inline`]), or the attempt runs on
    /// a statement thread ([`statement_threads`]) while the caller waits at most until the
    /// deadline. Either way the connection is discarded, and replaced at once for the callers
    /// waiting meanwhile ([`Pool::discarded`]; r2d2 would leave them waiting).
    pub(super) fn run<T, F>(
        &self,
        path: Path,
        operation: &'static str,
        deadline: Instant,
        attempt: F,
    ) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(&mut Conn<B>) -> Result<T, Failure> + Send + Sync + 'static,
    {
        self.run_noting(path, operation, deadline, attempt, None)
    }

    /// [`SqlStore::run`] for a statement that must not be sent again while an earlier
    /// sending's outcome is unknown (an acquire): the first attempt that was sent and got no
    /// answer — none before the deadline, or a broken connection — ends the loop with its
    /// error, and `unanswered` tells which server session it ran in.
    pub(super) fn run_noting<T, F>(
        &self,
        path: Path,
        operation: &'static str,
        deadline: Instant,
        attempt: F,
        mut unanswered: Option<&mut Option<Unanswered>>,
    ) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(&mut Conn<B>) -> Result<T, Failure> + Send + Sync + 'static,
    {
        // Shared with a statement thread only where attempts run on one: an inline backend
        // calls it in place, with no allocation per operation.
        let attempt = if B::runs_inline() {
            Attempt::Inline(attempt)
        } else {
            Attempt::Shared(Arc::new(attempt))
        };
        let pool = match path {
            Path::Main => &self.pool,
            Path::Renewal => &self.renewal_pool,
        };
        let started = Instant::now();
        // `backend::renewal_hangs`, configured `return(ms)`: a renewal whose deadline is more
        // than `ms` away gets no answer before it, as from a hung server (test-only).
        #[cfg(feature = "failpoints")]
        if path == Path::Renewal {
            let over = fail::eval("backend::renewal_hangs", |arg| {
                arg.and_then(|ms| ms.parse::<u64>().ok()).unwrap_or(0)
            });
            if over.is_some_and(|ms| deadline > started + Duration::from_millis(ms)) {
                std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
            }
        }
        let mut pause = Duration::from_millis(1);
        let mut last: Option<DatabaseError> = None;
        // The first look at the deadline reuses `started` (one clock read less per operation).
        let mut now = started;
        loop {
            let remaining = deadline.saturating_duration_since(now);
            if remaining.is_zero() {
                return Err(Error::Timeout {
                    operation,
                    waited: started.elapsed(),
                    source: last,
                });
            }
            match pool.get_timeout(remaining) {
                Err(e) => last = Some(Box::new(e)),
                Ok(mut conn) => {
                    let session = unanswered
                        .is_some()
                        .then(|| B::session(&mut conn))
                        .flatten();
                    let outcome = attempt_once::<B, T, F>(pool, conn, &attempt, deadline);
                    let no_answer = match &outcome {
                        None => true,
                        Some(Err(failure)) => failure.kind == FailureKind::Broken,
                        Some(Ok(_)) => false,
                    };
                    match outcome {
                        None => {
                            discard_idle::<B>(pool);
                            last = Some(
                                format!("no answer from {} before the deadline", B::NAME).into(),
                            )
                        }
                        Some(Ok(value)) => return Ok(value),
                        Some(Err(failure)) => {
                            log::debug!("{operation} on {}: {failure:?}", B::NAME);
                            match failure.kind {
                                FailureKind::Fatal => {
                                    return Err(Error::Database {
                                        operation,
                                        hint: failure.hint,
                                        source: failure.source,
                                    })
                                }
                                FailureKind::Broken => discard_idle::<B>(pool),
                                FailureKind::Transient => {}
                            }
                            // A connection ended at the deadline (MySQL's watchdog shuts
                            // its socket down then) is a statement without an answer.
                            last = Some(match failure.kind {
                                FailureKind::Broken if Instant::now() >= deadline => format!(
                                    "no answer from {} before the deadline ({})",
                                    B::NAME,
                                    failure.source
                                )
                                .into(),
                                _ => failure.source,
                            });
                        }
                    }
                    if let Some(slot) = unanswered.as_deref_mut().filter(|_| no_answer) {
                        *slot = Some(Unanswered { session });
                        return Err(Error::Timeout {
                            operation,
                            waited: started.elapsed(),
                            source: last,
                        });
                    }
                }
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            std::thread::sleep(pause.min(remaining));
            pause = (pause * 2).min(Duration::from_millis(100));
            now = Instant::now();
        }
    }
}

/// An attempt that was sent and never answered (see [`SqlStore::run_noting`]): the server
/// session it ran in, when the backend can tell ([`Backend::session`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unanswered {
    pub session: Option<Session>,
}

/// An operation's attempt as [`SqlStore::run`] keeps it across retries: in place for a backend
/// that runs inline, shared for one whose attempts run on statement threads.
enum Attempt<F> {
    Inline(F),
    Shared(Arc<F>),
}

/// Discards the connections idle in `pool` after one of its connections broke or did not
/// answer: they were opened to the same server, which has likely gone (a crash, a failover) or
/// hangs, and each would cost a caller an attempt — up to its whole deadline on a hung server.
/// The next attempt opens a new connection, which finds the server that answers now (with
/// several hosts in the URL, the new primary). Healthy ones cost only a reconnection.
fn discard_idle<B: Backend>(pool: &Pool<B::Manager>) {
    // Bounded: a backend whose marked connections went back to the pool would loop forever.
    let mut discarded = 0;
    while discarded < pool.max_size() {
        let Some(mut idle) = pool.try_get() else {
            break;
        };
        B::mark_broken(&mut idle);
        discarded += 1;
    }
    // Replaced only for callers waiting meanwhile, as any discarded connection.
    for _ in 0..discarded {
        pool.discarded();
    }
}

/// One attempt on `conn`: on the calling thread when [`Backend::runs_inline`], else
/// on a statement thread, waiting at most until `deadline` (`None`: no answer in time). A
/// connection whose attempt failed as broken, or was abandoned, is flagged for discarding, and
/// once dropped, replaced for callers waiting in `pool` ([`Pool::discarded`]); a healthy one
/// goes back through [`Pool::give_back`] (which parks it on SQLite's main pool, see `pools`).
/// Either way the connection is back in its pool before the caller has the answer, so that a
/// statement following at once reuses it instead of opening another.
fn attempt_once<B, T, F>(
    pool: &Pool<B::Manager>,
    mut conn: r2d2::PooledConnection<B::Manager>,
    attempt: &Attempt<F>,
    deadline: Instant,
) -> Option<Result<T, Failure>>
where
    B: Backend,
    T: Send + 'static,
    F: Fn(&mut Conn<B>) -> Result<T, Failure> + Send + Sync + 'static,
{
    // Gives `conn` back to `pool`; a broken one (or one given up, `abandoned`) is flagged,
    // and replaced for waiting callers once r2d2 has dropped it.
    let give_back = |pool: &Pool<B::Manager>,
                     mut conn: r2d2::PooledConnection<B::Manager>,
                     outcome: &Result<T, Failure>,
                     abandoned: bool| {
        let broken = abandoned || matches!(outcome, Err(f) if f.kind == FailureKind::Broken);
        if broken {
            B::mark_broken(&mut conn);
            drop(conn);
            pool.discarded();
        } else {
            pool.give_back(conn);
        }
    };
    B::set_deadline(&mut conn, deadline);
    let attempt = match attempt {
        Attempt::Inline(attempt) => {
            let outcome = attempt(&mut conn);
            give_back(pool, conn, &outcome, false);
            return Some(outcome);
        }
        Attempt::Shared(attempt) => Arc::clone(attempt),
    };
    let (answer, answered) = crossbeam_channel::bounded(1);
    let abandoned = Arc::new(AtomicBool::new(false));
    let gone = Arc::clone(&abandoned);
    let pool = pool.clone();
    statement_threads::run(Box::new(move || {
        let outcome = attempt(&mut conn);
        give_back(&pool, conn, &outcome, gone.load(Ordering::Acquire));
        Box::new(move || {
            let _ = answer.send(outcome);
        })
    }));
    let outcome = answered.recv_deadline(deadline).ok();
    if outcome.is_none() {
        abandoned.store(true, Ordering::Release);
    }
    outcome
}

/// A random time between half of `idle` and `idle`: the sleep of a poller between attempts,
/// and the length of a turn (with `turn_limit`).
pub(crate) fn jittered(idle: Duration) -> Duration {
    use std::cell::Cell;
    use std::hash::BuildHasher;
    thread_local! {
        static STATE: Cell<u64> = Cell::new(
            std::collections::hash_map::RandomState::new().hash_one(std::thread::current().id())
                | 1,
        );
    }
    // xorshift64: a fraction in [0, 1) from its top 53 bits.
    let bits = STATE.with(|state| {
        let mut x = state.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        state.set(x);
        x
    });
    let fraction = (bits >> 11) as f64 / (1u64 << 53) as f64;
    idle.mul_f64(0.5 + 0.5 * fraction)
}
