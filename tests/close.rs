//! Closing a registry from another thread ends every wait of its threads at once with
//! `Error::Closed` — locks, semaphore permits, both sides of reader/writer locks, a standing-by
//! leader election — while what is already held stays held until its guard goes.
//!
//! Waiters poll only once an hour here (`idle_between_tries` at its maximum), so a wait that
//! ends within the test's bound was ended by the close, not by a poll.

mod common;

use common::{Db, Fixture};
use leasehold::{Error, LeaderElection, LockRegistry, MAX_IDLE_BETWEEN_TRIES};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Far above "at once", far below an hour's poll: a bound against hanging only.
const BOUND: Duration = Duration::from_secs(30);

/// A registry on the fixture's table whose waiters poll once an hour and hear no releases.
fn slow_poller(f: &Fixture) -> Arc<LockRegistry> {
    Arc::new(
        f.builder()
            .idle_between_tries(MAX_IDLE_BETWEEN_TRIES)
            .notifications(false)
            .build()
            .unwrap(),
    )
}

/// Waits until `condition` holds (the waiter has made its first attempt), or panics.
fn eventually(what: &str, condition: impl Fn() -> bool) {
    let until = Instant::now() + BOUND;
    while !condition() {
        assert!(
            Instant::now() < until,
            "{what} did not happen within {BOUND:?}"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

/// Runs `wait` on a thread of its own once `started` says it is waiting, closes `registry`,
/// and asserts that the wait ended with `Error::Closed` within the bound.
fn closing_ends(
    registry: &Arc<LockRegistry>,
    what: &str,
    started: impl Fn(&LockRegistry) -> bool,
    wait: impl FnOnce(&LockRegistry) -> leasehold::Result<()> + Send + 'static,
) {
    let (done_tx, done_rx) = crossbeam_channel::bounded(1);
    let waiter = {
        let registry = Arc::clone(registry);
        thread::spawn(move || {
            let outcome = wait(&registry);
            let _ = done_tx.send(outcome);
        })
    };
    eventually(&format!("{what}: the first attempt"), || started(registry));
    assert!(
        done_rx.try_recv().is_err(),
        "{what}: the wait ended before the registry was closed"
    );
    registry.close();
    let outcome = done_rx
        .recv_timeout(BOUND)
        .unwrap_or_else(|_| panic!("{what}: still waiting {BOUND:?} after close()"));
    assert!(matches!(outcome, Err(Error::Closed)), "{what}: {outcome:?}");
    waiter.join().unwrap();
}

fn contended(registry: &LockRegistry) -> bool {
    registry.statistics().contended_tries > 0
}

fn a_blocked_lock_ends_at_once_and_held_locks_stay_held(db: Db) {
    let Some(f) = Fixture::new(db, "close_lock") else {
        return;
    };
    let holder = f.registry();
    let held = holder.obtain("job").unwrap().lock().unwrap();
    let registry = slow_poller(&f);
    // This registry's own lock stays held through the close, until its guard goes.
    let own = registry.obtain("own").unwrap();
    let own_guard = {
        let (tx, rx) = crossbeam_channel::bounded(0);
        let (release_tx, release_rx) = crossbeam_channel::bounded::<()>(0);
        let own = own.clone();
        let keeper = thread::spawn(move || {
            let guard = own.lock().unwrap();
            tx.send(guard.fencing_token()).unwrap();
            release_rx.recv().unwrap();
            assert!(guard.is_held(), "a lock held at close() stays held");
            guard.unlock()
        });
        (rx.recv().unwrap(), release_tx, keeper)
    };
    closing_ends(&registry, "lock()", contended, |registry| {
        registry.obtain("job")?.lock().map(drop)
    });
    // Every later call is refused as well, bounded or not.
    assert!(matches!(
        registry.obtain("job").unwrap().try_lock(),
        Err(Error::Closed)
    ));
    assert!(matches!(
        registry
            .obtain("fresh")
            .unwrap()
            .try_lock_for(Duration::from_secs(60)),
        Err(Error::Closed)
    ));
    let (_token, release, keeper) = own_guard;
    release.send(()).unwrap();
    keeper
        .join()
        .unwrap()
        .expect("the held lock is released by its guard");
    // The other registry's lock was never touched.
    assert!(held.is_held());
    held.unlock().unwrap();
    assert!(holder
        .holder("own")
        .unwrap()
        .is_none_or(|row| row.expires_in.is_zero()));
}

fn blocked_permits_reads_writes_and_standbys_end_at_once(db: Db) {
    let Some(f) = Fixture::new(db, "close_all") else {
        return;
    };
    let holder = f.registry();
    let permit = holder.semaphore("exports", 1).unwrap().acquire().unwrap();
    let registry = slow_poller(&f);
    closing_ends(&registry, "Semaphore::acquire()", contended, |registry| {
        registry.semaphore("exports", 1)?.acquire().map(drop)
    });
    permit.unlock().unwrap();

    let writing = holder.rw_lock("cache").unwrap().write().unwrap();
    let registry = slow_poller(&f);
    closing_ends(
        &registry,
        "RwLock::read()",
        // A reader's first look is a listing, which no statistic counts: give it a moment
        // (had it not started waiting by then, its call after close() is refused all the same).
        |_| {
            thread::sleep(Duration::from_millis(300));
            true
        },
        |registry| registry.rw_lock("cache")?.read().map(drop),
    );
    let registry = slow_poller(&f);
    closing_ends(&registry, "RwLock::write()", contended, |registry| {
        registry.rw_lock("cache")?.write().map(drop)
    });
    writing.unlock().unwrap();

    let leader = LeaderElection::builder(f.builder(), "batch")
        .build()
        .unwrap();
    let leadership = leader.acquire().unwrap();
    let standby = LeaderElection::builder(
        f.builder()
            .idle_between_tries(MAX_IDLE_BETWEEN_TRIES)
            .notifications(false),
        "batch",
    )
    .idle_between_tries(Duration::from_secs(3600))
    .build()
    .unwrap();
    let (done_tx, done_rx) = crossbeam_channel::bounded(1);
    let waiting = {
        let standby = standby.clone();
        thread::spawn(move || {
            let _ = done_tx.send(standby.acquire().map(drop));
        })
    };
    eventually("the standby's first attempt", || {
        standby.registry().statistics().acquires > 0
    });
    assert!(done_rx.try_recv().is_err(), "the standby was elected");
    standby.close();
    let outcome = done_rx
        .recv_timeout(BOUND)
        .expect("the standby still waits after close()");
    assert!(matches!(outcome, Err(Error::Closed)), "{outcome:?}");
    waiting.join().unwrap();
    assert!(
        leader.is_leader(),
        "the leader of another instance is untouched"
    );
    leadership.resign().unwrap();
}

/// A waiter that hears releases (its registry's listener subscribed while it sleeps) is ended
/// by the close as at once as one that only polls.
fn a_blocked_lock_that_hears_releases_ends_at_once(db: Db) {
    let Some(f) = Fixture::new(db, "close_listening") else {
        return;
    };
    let holder = f.registry();
    let held = holder.obtain("job").unwrap().lock().unwrap();
    let registry = Arc::new(
        f.builder()
            .idle_between_tries(MAX_IDLE_BETWEEN_TRIES)
            .build()
            .unwrap(),
    );
    closing_ends(
        &registry,
        "lock() that hears releases",
        |registry| {
            // Its first attempt, then time to subscribe and sleep.
            contended(registry) && {
                thread::sleep(Duration::from_millis(300));
                true
            }
        },
        |registry| registry.obtain("job")?.lock().map(drop),
    );
    held.unlock().unwrap();
}

/// Closing releases a key that lingers (a grant shared by two threads, let go by both, kept
/// for the next of them): nothing the registry no longer holds for anyone stays held.
fn closing_releases_a_lingering_key(db: Db) {
    let Some(f) = Fixture::new(db, "close_lingering") else {
        return;
    };
    // A linger of the longest kind; a machine too busy to look within it tries again.
    for round in 1.. {
        let registry = Arc::new(
            f.builder()
                .tuning(leasehold::Tuning {
                    linger: leasehold::MAX_LINGER,
                    ..Default::default()
                })
                .build()
                .unwrap(),
        );
        let lock = registry.obtain("lingers").unwrap();
        let first = lock.lock().unwrap();
        let second = {
            let lock = lock.clone();
            thread::spawn(move || lock.lock().unwrap().unlock().unwrap())
        };
        eventually("the second thread queued", || lock.queued_threads() > 0);
        first.unlock().unwrap();
        second.join().unwrap();
        let lingering = registry.holder("lingers").unwrap().is_some();
        registry.close();
        if !lingering && round < 5 {
            continue;
        }
        assert!(lingering, "the grant did not linger after both let go");
        assert_eq!(
            registry.holder("lingers").unwrap(),
            None,
            "closing left a lingering grant held"
        );
        break;
    }
    let other = f.registry();
    assert!(other
        .obtain("lingers")
        .unwrap()
        .try_lock()
        .unwrap()
        .is_some());
}

macro_rules! on_every_backend {
    ($($module:ident => $db:expr),*) => {$(
        mod $module {
            use super::*;

            #[test]
            fn a_blocked_lock_ends_at_once_and_held_locks_stay_held() {
                super::a_blocked_lock_ends_at_once_and_held_locks_stay_held($db);
            }

            #[test]
            fn a_blocked_lock_that_hears_releases_ends_at_once() {
                super::a_blocked_lock_that_hears_releases_ends_at_once($db);
            }

            #[test]
            fn closing_releases_a_lingering_key() {
                super::closing_releases_a_lingering_key($db);
            }

            #[test]
            fn blocked_permits_reads_writes_and_standbys_end_at_once() {
                super::blocked_permits_reads_writes_and_standbys_end_at_once($db);
            }
        }
    )*};
}

#[cfg(feature = "sqlite")]
on_every_backend!(sqlite => Db::Sqlite);
#[cfg(feature = "postgres")]
on_every_backend!(postgres => Db::Postgres);
#[cfg(feature = "mysql")]
on_every_backend!(mysql => Db::Mysql);
