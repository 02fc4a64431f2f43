//! Isolation: nothing one lease, callback or row does may break another lease's
//! guarantee. Each test makes one lease (or its callback, or its row) misbehave and checks that
//! the *other* leases are renewed and reported as the guarantees say, on real databases.
//!
//! - A loss callback that blocks (a webhook, a log flush) delays neither the lease clock nor
//!   the renewals, of its own registry or another, nor other leases' loss channels.
//! - A row that another session holds locked (`SELECT … FOR UPDATE` in a psql session, a
//!   migration) costs only its own lease, reported as expired (unknown), not as taken.
//!
//! Fail-point tests of the same issue (a stuck renewal statement, a local handoff to a shorter
//! time-to-live, a renewal in flight during `unlock_keeping_for`) are in `failpoints.rs`.
//!
//! Bounds are generous (tens of seconds) and time-to-lives several seconds long, so that a
//! loaded machine passes; the tests end as soon as what they wait for has happened.

mod common;

use common::{Db, Fixture};
use leasehold::{LockGuard, LockRegistry, LossReason, Statistics};
use std::thread;
use std::time::{Duration, Instant};

const GENEROUS: Duration = Duration::from_secs(30);

/// A loss callback that blocks until the test ends (at most a minute), and tells when it
/// started blocking.
fn blocking_callback(
    entered: crossbeam_channel::Sender<String>,
    release: crossbeam_channel::Receiver<()>,
) -> impl Fn(&leasehold::LeaseLost) + Send + Sync + 'static {
    move |lost| {
        let _ = entered.send(lost.key.clone());
        let _ = release.recv_timeout(Duration::from_secs(60));
    }
}

/// Waits until `registry` has sent `more` renew statements beyond `before`, checking all the
/// while that `guard` is held; panics if it is lost first or `GENEROUS` passes.
fn renewed_while_held(registry: &LockRegistry, before: Statistics, more: u64, guard: &LockGuard) {
    let until = Instant::now() + GENEROUS;
    while registry.statistics().renewals < before.renewals + more {
        assert!(
            guard.is_held(),
            "{:?} was lost while another lease's callback blocked: its renewals stopped",
            guard.key()
        );
        assert!(Instant::now() < until, "no renewals of {:?}", guard.key());
        thread::sleep(Duration::from_millis(20));
    }
    assert!(guard.is_held());
}

fn sqlite(test: &str) -> Fixture {
    Fixture::new(Db::Sqlite, test).expect("SQLite fixture")
}

/// A loss callback that blocks on the lease clock's report of an expired lease of one
/// registry delays neither the renewals nor the loss reports of another registry in the
/// process.
#[test]
fn a_blocking_loss_callback_delays_no_other_registrys_leases() {
    let f = sqlite("blocking_callback_clock");
    let (entered_tx, entered) = crossbeam_channel::unbounded();
    let (release, release_rx) = crossbeam_channel::unbounded::<()>();
    let slow = f
        .builder()
        .renewal(false)
        .on_lease_lost(blocking_callback(entered_tx, release_rx))
        .build()
        .unwrap();
    let renewing = f
        .builder()
        .time_to_live(Duration::from_secs(6))
        .build()
        .unwrap();
    let unrenewed = f.builder().renewal(false).build().unwrap();

    // The slow registry's lease runs out; its callback blocks (on the clock thread, before).
    let expiring = slow
        .obtain("expiring")
        .unwrap()
        .lock_with_ttl(Duration::from_millis(500))
        .unwrap();
    let blocked = entered.recv_timeout(GENEROUS).expect("the callback ran");
    assert_eq!(blocked, "expiring");
    assert!(!expiring.is_held());

    // Meanwhile another registry's lease is renewed, and a third's loss is reported.
    let before = renewing.statistics();
    let kept = renewing.obtain("kept").unwrap().lock().unwrap();
    let other_loss = unrenewed
        .obtain("other-loss")
        .unwrap()
        .lock_with_ttl(Duration::from_millis(500))
        .unwrap();
    let losses = other_loss.loss_channel();
    let event = losses.recv_timeout(GENEROUS);
    assert!(
        matches!(&event, Ok(lost) if matches!(lost.reason, LossReason::Expired(_))),
        "another registry's loss was not reported while a callback blocked: {event:?}"
    );
    renewed_while_held(&renewing, before, 2, &kept);
    let _ = release.send(());
    kept.unlock().unwrap();
}

/// A loss callback that blocks on a loss the renewal found (the row freed by an operator)
/// delays no renewal of the registry's other leases.
#[test]
fn a_blocking_loss_callback_delays_no_renewal_of_its_own_registry() {
    let f = sqlite("blocking_callback_renewal");
    let (entered_tx, entered) = crossbeam_channel::unbounded();
    let (release, release_rx) = crossbeam_channel::unbounded::<()>();
    let registry = f
        .builder()
        .time_to_live(Duration::from_secs(6))
        .on_lease_lost(blocking_callback(entered_tx, release_rx))
        .build()
        .unwrap();
    let freed = registry.obtain("freed").unwrap().lock().unwrap();
    let kept = registry.obtain("kept").unwrap().lock().unwrap();
    assert!(f.registry().force_release("freed").unwrap());
    let losses = freed.loss_channel();
    let event = losses
        .recv_timeout(GENEROUS)
        .expect("the freed lease's loss");
    assert_eq!(event.reason, LossReason::NotOwner);
    assert_eq!(entered.recv_timeout(GENEROUS).unwrap(), "freed");
    // The callback still blocks: the other lease goes on being renewed.
    let before = registry.statistics();
    renewed_while_held(&registry, before, 2, &kept);
    let _ = release.send(());
    kept.unlock().unwrap();
}

/// The callback still runs once per loss, in order, and a panicking one does not stop it.
#[test]
fn loss_callbacks_run_once_each_on_the_registrys_own_thread() {
    let f = sqlite("callback_thread");
    let (seen_tx, seen) = crossbeam_channel::unbounded::<(String, String)>();
    let registry = f
        .builder()
        .renewal(false)
        .on_lease_lost(move |lost| {
            let thread = thread::current().name().unwrap_or("").to_string();
            let _ = seen_tx.send((lost.key.clone(), thread));
            if lost.key == "first" {
                panic!("a callback that panics");
            }
        })
        .build()
        .unwrap();
    for key in ["first", "second"] {
        let guard = registry
            .obtain(key)
            .unwrap()
            .lock_with_ttl(Duration::from_millis(300))
            .unwrap();
        let (lost, thread) = seen.recv_timeout(GENEROUS).expect("callback ran");
        assert_eq!(lost, key);
        assert_eq!(thread, "leasehold-callback");
        assert!(guard.unlock().is_err_and(|e| e.is_lease_lost()));
    }
    thread::sleep(Duration::from_millis(200));
    assert!(seen.try_recv().is_err(), "a loss reported twice");
}

/// Another session holds one lock row locked, as `BEGIN; SELECT … FOR UPDATE` in psql does.
#[cfg(any(feature = "postgres", feature = "mysql"))]
enum RowLocker {
    #[cfg(feature = "postgres")]
    Postgres(postgres::Transaction<'static>),
    #[cfg(feature = "mysql")]
    Mysql(mysql::Conn),
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl RowLocker {
    fn lock(f: &Fixture, key: &str) -> RowLocker {
        let lock_key = leasehold::lock_key_for(key);
        let sql = format!(
            "SELECT * FROM {} WHERE LOCK_KEY = '{lock_key}' FOR UPDATE",
            f.table()
        );
        match f.db {
            #[cfg(feature = "postgres")]
            Db::Postgres => {
                let client = Box::leak(Box::new(
                    postgres::Client::connect(&common::postgres_url(), postgres::NoTls).unwrap(),
                ));
                let mut transaction = client.transaction().unwrap();
                assert_eq!(transaction.query(sql.as_str(), &[]).unwrap().len(), 1);
                RowLocker::Postgres(transaction)
            }
            #[cfg(feature = "mysql")]
            Db::Mysql => {
                use mysql::prelude::Queryable;
                let opts = mysql::Opts::from_url(&common::mysql_url()).unwrap();
                let mut conn = mysql::Conn::new(opts).unwrap();
                conn.query_drop("START TRANSACTION").unwrap();
                let rows: Vec<mysql::Row> = conn.query(sql).unwrap();
                assert_eq!(rows.len(), 1);
                RowLocker::Mysql(conn)
            }
            #[allow(unreachable_patterns)]
            other => panic!("no row locks on {other:?}"),
        }
    }

    fn unlock(self) {
        match self {
            #[cfg(feature = "postgres")]
            RowLocker::Postgres(transaction) => transaction.rollback().unwrap(),
            #[cfg(feature = "mysql")]
            RowLocker::Mysql(mut conn) => {
                use mysql::prelude::Queryable;
                conn.query_drop("ROLLBACK").unwrap();
            }
        }
    }
}

/// One row locked by another session costs only its own lease: the batched renewal skips the
/// locked row, whose lease alone is retried and, the row staying locked, lost as expired (the
/// outcome was unknown), while the other leases of the batch are renewed.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn a_locked_row_costs_only_its_own_lease(db: Db, test: &str) {
    let Some(f) = Fixture::new(db, test) else {
        return;
    };
    let registry = f
        .builder()
        .time_to_live(Duration::from_secs(6))
        .build()
        .unwrap();
    let keys: Vec<String> = (0..10).map(|i| format!("row-{i}")).collect();
    let guards: Vec<LockGuard> = keys
        .iter()
        .map(|key| registry.obtain(key).unwrap().lock().unwrap())
        .collect();
    let locker = RowLocker::lock(&f, &keys[0]);
    let losses = guards[0].loss_channel();
    let before = registry.statistics();
    // The locked row's lease runs out: the row stays locked for longer than its time-to-live.
    let event = losses
        .recv_timeout(GENEROUS)
        .expect("the lease whose row is locked is lost at its deadline");
    assert!(
        matches!(event.reason, LossReason::Expired(Some(ref why)) if why.contains("locked")),
        "lost for another reason than its locked row: {:?}",
        event.reason
    );
    assert!(registry.statistics().renewals > before.renewals);
    let other = f.registry();
    for guard in &guards[1..] {
        assert!(
            guard.is_held(),
            "{:?} was lost with the locked row",
            guard.key()
        );
        assert!(
            other
                .obtain(guard.key())
                .unwrap()
                .try_lock()
                .unwrap()
                .is_none(),
            "{:?} was free on the database",
            guard.key()
        );
    }
    locker.unlock();
    for guard in guards.into_iter().skip(1) {
        guard.unlock().unwrap();
    }
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_a_locked_row_costs_only_its_own_lease() {
    a_locked_row_costs_only_its_own_lease(Db::Postgres, "locked_row_pg");
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_a_locked_row_costs_only_its_own_lease() {
    a_locked_row_costs_only_its_own_lease(Db::Mysql, "locked_row_my");
}

/// A free lock row that another session holds locked (an operator's `SELECT … FOR UPDATE`) is
/// refused to an acquire at once, as a held lock is: the acquire does not wait for the other
/// session (until `operation_timeout`, and then fail), so the row holds up none of the
/// registry's connections and no caller past its own try. Once the session lets go, the key
/// is granted.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn an_acquire_of_a_locked_free_row_is_refused_without_waiting(db: Db, test: &str) {
    let Some(f) = Fixture::new(db, test) else {
        return;
    };
    let registry = f
        .builder()
        .operation_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let lock = registry.obtain("locked-free").unwrap();
    lock.lock().unwrap().unlock().unwrap();
    let locker = RowLocker::lock(&f, "locked-free");
    for _ in 0..3 {
        assert!(
            matches!(lock.try_lock(), Ok(None)),
            "a try of the locked row was not refused"
        );
    }
    assert!(
        matches!(lock.try_lock_for(Duration::from_millis(300)), Ok(None)),
        "a bounded wait for the locked row was not refused at its deadline"
    );
    locker.unlock();
    let guard = lock
        .try_lock_for(GENEROUS)
        .unwrap()
        .expect("granted once the session let go");
    guard.unlock().unwrap();
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_an_acquire_of_a_locked_free_row_is_refused_without_waiting() {
    an_acquire_of_a_locked_free_row_is_refused_without_waiting(Db::Postgres, "locked_free_pg");
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_an_acquire_of_a_locked_free_row_is_refused_without_waiting() {
    an_acquire_of_a_locked_free_row_is_refused_without_waiting(Db::Mysql, "locked_free_my");
}
