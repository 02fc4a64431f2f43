//! Lock sets (several keys held together, all or none) and guards that any thread may hold, on
//! every backend.
//!
//! Waits here end by a grant, never by a clock: the bounds in seconds only stop a hung test.

mod common;

use common::raw::Raw;
use common::{Db, Fixture};
use leasehold::{lock_key_for, Error, LockRegistry};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Far above any honest wait here: a bound against hanging only.
const HANG: Duration = Duration::from_secs(120);

fn is_free(registry: &LockRegistry, key: &str) -> bool {
    registry.holder(key).expect("holder").is_none()
}

/// Whether `key` is free once a key that passed between threads of its holder's registry has
/// stopped lingering (`Tuning::linger`, 5 ms by default).
fn is_free_after_linger(registry: &LockRegistry, key: &str) -> bool {
    let until = Instant::now() + HANG;
    while !is_free(registry, key) {
        if Instant::now() > until {
            return false;
        }
        thread::sleep(Duration::from_millis(5));
    }
    true
}

/// A set with one key held elsewhere is refused — by one attempt and at a deadline — and
/// leaves its other keys free; once that key is free the set holds every key, the keys in
/// their byte order, and unlocking frees them all.
fn a_set_holds_every_key_or_none(db: Db) {
    let Some(f) = Fixture::new(db, "set_all_or_none") else {
        return;
    };
    let other = f.registry();
    let mine = f.registry();
    let outsider = f.registry();
    let held = other.obtain("b").unwrap().lock().unwrap();
    let set = mine.lock_set(["c", "a", "b", "a"]).unwrap();
    assert_eq!(set.keys().collect::<Vec<_>>(), ["a", "b", "c"]);

    assert!(set.try_lock().unwrap().is_none(), "b is held elsewhere");
    for key in ["a", "c"] {
        assert!(
            is_free(&outsider, key),
            "{key} was given back by the refused try"
        );
    }
    assert!(set
        .try_lock_for(Duration::from_millis(300))
        .unwrap()
        .is_none());
    for key in ["a", "c"] {
        assert!(
            is_free(&outsider, key),
            "{key} was given back at the deadline"
        );
    }
    let c = outsider.obtain("c").unwrap().try_lock().unwrap();
    assert!(c.is_some(), "c is free for anyone after the refusals");
    drop(c);

    held.unlock().unwrap();
    let guard = set.try_lock_for(HANG).unwrap().expect("every key is free");
    assert!(guard.is_held());
    let tokens = guard.fencing_tokens();
    assert_eq!(
        tokens.iter().map(|(key, _)| *key).collect::<Vec<_>>(),
        ["a", "b", "c"]
    );
    for (key, token) in &tokens {
        let row = outsider.holder(key).unwrap().expect("held");
        assert_eq!(row.fencing_token, *token, "the row of {key} names the set");
        assert!(outsider.obtain(key).unwrap().try_lock().unwrap().is_none());
    }
    assert_eq!(
        guard.guard("b").map(|g| g.fencing_token()),
        Some(tokens[1].1)
    );
    guard.unlock().unwrap();
    for key in ["a", "b", "c"] {
        assert!(is_free(&outsider, key), "{key} is released with the set");
    }
}

/// Threads of three registries take overlapping sets of four keys, each naming its keys in an
/// order of its own, beside single locks: every call returns with all its keys (no deadlock),
/// and no key ever has two holders.
fn overlapping_sets_in_any_order_never_deadlock(db: Db) {
    let Some(f) = Fixture::new(db, "set_overlap") else {
        return;
    };
    const KEYS: [&str; 4] = ["k0", "k1", "k2", "k3"];
    const ROUNDS: usize = 12;
    let holders: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let registries: Vec<Arc<LockRegistry>> = (0..3).map(|_| Arc::new(f.registry())).collect();
    let mut threads = Vec::new();
    for (r, registry) in registries.iter().enumerate() {
        for t in 0..2 {
            let registry = Arc::clone(registry);
            let holders = Arc::clone(&holders);
            let me = r * 2 + t;
            threads.push(thread::spawn(move || {
                for round in 0..ROUNDS {
                    // Sets of two or three keys, named last-first by odd threads.
                    let width = 2 + (me + round) % 2;
                    let mut keys: Vec<&str> =
                        (0..width).map(|i| KEYS[(me + round + i) % 4]).collect();
                    if me % 2 == 1 {
                        keys.reverse();
                    }
                    let single = me == 5 && round % 3 == 0;
                    let held: Vec<String> = if single {
                        keys.truncate(1);
                        keys.iter().map(|k| k.to_string()).collect()
                    } else {
                        keys.iter().map(|k| k.to_string()).collect()
                    };
                    let guard = if single {
                        let lock = registry.obtain(keys[0]).unwrap();
                        let guard = lock.try_lock_for(HANG).unwrap();
                        guard.map(|g| Box::new(g) as Box<dyn std::any::Any>)
                    } else {
                        let set = registry.lock_set(&keys).unwrap();
                        let guard = set.try_lock_for(HANG).unwrap();
                        guard.map(|g| Box::new(g) as Box<dyn std::any::Any>)
                    };
                    assert!(
                        guard.is_some(),
                        "thread {me} round {round}: {keys:?} not granted"
                    );
                    {
                        let mut map = holders.lock();
                        for key in &held {
                            if let Some(other) = map.insert(key.clone(), me) {
                                panic!("{key} held by threads {other} and {me} at once");
                            }
                        }
                    }
                    thread::sleep(Duration::from_millis(1));
                    {
                        let mut map = holders.lock();
                        for key in &held {
                            assert_eq!(map.remove(key), Some(me));
                        }
                    }
                    drop(guard);
                }
            }));
        }
    }
    for thread in threads {
        thread.join().expect("a thread panicked");
    }
    for key in KEYS {
        assert!(
            is_free_after_linger(&registries[0], key),
            "{key} is free at the end"
        );
    }
}

/// A lock set loses when any one of its keys is lost: its loss channel hears it, `is_held`
/// turns false, and `unlock` names the lost key while still releasing the others.
fn a_loss_of_one_key_is_a_loss_of_the_set(db: Db) {
    let Some(f) = Fixture::new(db, "set_loss") else {
        return;
    };
    let registry = f.registry();
    let outsider = f.registry();
    let guard = registry.lock_set(["x", "y"]).unwrap().lock().unwrap();
    let lost = guard.loss_channel();
    let mut raw = Raw::open(&f);
    let taken = raw.execute(&format!(
        "UPDATE {} SET CLIENT_ID = 'thief' WHERE LOCK_KEY = '{}'",
        f.table(),
        lock_key_for("y")
    ));
    assert_eq!(taken, 1);
    assert!(
        matches!(guard.renew(), Err(Error::LeaseLost { ref key, .. }) if key == "y"),
        "the renewal finds y taken"
    );
    let event = lost.recv_timeout(HANG).expect("the set's loss is reported");
    assert_eq!(event.key, "y");
    assert!(!guard.is_held());
    match guard.unlock() {
        Err(Error::LeaseLost { key, .. }) => assert_eq!(key, "y"),
        other => panic!("unlock must report y's loss, got {other:?}"),
    }
    assert!(is_free(&outsider, "x"), "x is released although y was lost");
}

/// A guard for any thread is taken on one thread, used and renewed on another and dropped
/// there: the key goes to the thread of this registry that waits for it (the same grant) and
/// afterwards to another instance. The same for a lock set's guard.
fn a_guard_moves_to_another_thread_and_is_released_there(db: Db) {
    let Some(f) = Fixture::new(db, "any_thread_move") else {
        return;
    };
    // No turn limit: the release hands over however slowly the machine runs.
    let tuning = leasehold::Tuning {
        turn_limit: None,
        ..Default::default()
    };
    let registry = Arc::new(f.builder().tuning(tuning).build().unwrap());
    let outsider = f.registry();
    let lock = registry.obtain("moved").unwrap();
    let guard = lock.any_thread().lock().unwrap();
    let token = guard.fencing_token();

    let waiter = {
        let lock = lock.clone();
        thread::spawn(move || {
            let guard = lock.lock().unwrap();
            let token = guard.fencing_token();
            guard.unlock().unwrap();
            token
        })
    };
    let until = Instant::now() + HANG;
    while lock.queued_threads() == 0 {
        assert!(Instant::now() < until, "the waiter never queued");
        thread::yield_now();
    }
    let (tx, rx) = crossbeam_channel::bounded(1);
    let worker = thread::spawn(move || {
        let guard: leasehold::LockGuard<leasehold::AnyThread> = rx.recv().unwrap();
        assert!(guard.is_held());
        guard.renew().unwrap();
        let token = guard.fencing_token();
        drop(guard);
        token
    });
    tx.send(guard).unwrap();
    assert_eq!(worker.join().unwrap(), token);
    assert_eq!(
        waiter.join().unwrap(),
        token,
        "handed to the waiting thread on the drop"
    );
    assert!(is_free_after_linger(&outsider, "moved"));

    let set_guard = registry
        .lock_set(["m1", "m2"])
        .unwrap()
        .any_thread()
        .lock()
        .unwrap();
    let mut raw = Raw::open(&f);
    let ledger = format!("{}MOVEDLEDGER", f.prefix);
    raw.execute_batch(&format!("CREATE TABLE {ledger} (v BIGINT)"));
    let (released, raw) = thread::spawn(move || {
        // Fenced and released on a thread that did not take it.
        fenced_insert(&set_guard, &mut raw, &ledger, 1).unwrap();
        assert_eq!(raw.number(&format!("SELECT COUNT(*) FROM {ledger}")), 1);
        raw.execute_batch(&format!("DROP TABLE {ledger}"));
        (set_guard.unlock(), raw)
    })
    .join()
    .unwrap();
    released.unwrap();
    drop(raw);
    assert!(is_free(&outsider, "m1") && is_free(&outsider, "m2"));
}

/// A guard for any thread does not nest: asked by the thread that holds the key through a guard
/// of its own, it is refused at once (it would wait for itself); asked again while another such
/// guard holds the key, a try finds the key held.
fn a_guard_for_any_thread_does_not_nest(db: Db) {
    let Some(f) = Fixture::new(db, "any_thread_nest") else {
        return;
    };
    let registry = f.registry();
    let lock = registry.obtain("nest").unwrap();
    let own = lock.lock().unwrap();
    assert!(matches!(
        lock.any_thread().try_lock(),
        Err(Error::InvalidSetting { .. })
    ));
    assert!(matches!(
        lock.any_thread().lock(),
        Err(Error::InvalidSetting { .. })
    ));
    let nested = lock.try_lock().unwrap().expect("nests on this thread");
    drop(nested);
    own.unlock().unwrap();

    let any = lock.any_thread().lock().unwrap();
    assert!(lock.any_thread().try_lock().unwrap().is_none());
    assert!(
        lock.try_lock().unwrap().is_none(),
        "this thread's own guard waits for it too"
    );
    any.unlock().unwrap();
    assert!(lock.try_lock().unwrap().is_some());
}

/// Permits and reader/writer guards for any thread move to another thread and are released
/// there: afterwards another instance gets every permit, the write side, and a read.
fn permits_and_read_write_guards_move_between_threads(db: Db) {
    let Some(f) = Fixture::new(db, "any_thread_kinds") else {
        return;
    };
    let registry = f.registry();
    let outsider = f.registry();
    let semaphore = registry.semaphore("pool", 2).unwrap().any_thread();
    let permits = vec![semaphore.acquire().unwrap(), semaphore.acquire().unwrap()];
    assert!(
        semaphore.try_acquire().unwrap().is_none(),
        "both permits held"
    );
    let rw = registry.rw_lock("doc").unwrap().any_thread();
    let write = rw.write().unwrap();
    let write_token = write.fencing_token();
    let moved = thread::spawn(move || {
        assert!(permits.iter().all(|permit| permit.is_held()));
        for permit in permits {
            permit.unlock().unwrap();
        }
        assert_eq!(write.fencing_token(), write_token);
        write.unlock().unwrap();
    });
    moved.join().expect("the worker ran");
    let theirs = outsider.semaphore("pool", 2).unwrap();
    let first = theirs.try_acquire_for(HANG).unwrap();
    let second = theirs.try_acquire_for(HANG).unwrap();
    assert!(
        first.is_some() && second.is_some(),
        "both permits were released"
    );
    drop((first, second));
    let their_rw = outsider.rw_lock("doc").unwrap();
    let theirs_write = their_rw.try_write_for(HANG).unwrap();
    assert!(theirs_write.is_some(), "the write side was released");
    drop(theirs_write);

    let read = rw.read().unwrap();
    thread::spawn(move || read.unlock().unwrap())
        .join()
        .expect("the reader ran");
    assert!(their_rw.try_write_for(HANG).unwrap().is_some());
}

/// Runs `INSERT INTO table VALUES (value)` in a transaction fenced by the whole set.
fn fenced_insert<H: leasehold::Holding>(
    guard: &leasehold::LockSetGuard<H>,
    raw: &mut Raw,
    table: &str,
    value: i64,
) -> leasehold::Result<()> {
    let sql = format!("INSERT INTO {table} VALUES ({value})");
    match raw {
        #[cfg(feature = "sqlite")]
        Raw::Sqlite(conn) => {
            let tx = guard.fence(conn.transaction().unwrap())?;
            tx.execute(&sql, []).unwrap();
            tx.commit()
        }
        #[cfg(feature = "postgres")]
        Raw::Postgres(client) => {
            let mut tx = guard.fence(client.transaction().unwrap())?;
            tx.execute(sql.as_str(), &[]).unwrap();
            tx.commit()
        }
        #[cfg(feature = "mysql")]
        Raw::Mysql(conn) => {
            use leasehold::mysql::prelude::Queryable;
            let mut tx = guard.fence(conn.start_transaction(Default::default()).unwrap())?;
            tx.query_drop(&sql).unwrap();
            tx.commit()
        }
    }
}

/// A set's fence checks every key's row in one statement: a fenced write commits while every
/// lease holds, and keeps every row from another instance until it ends; once one key's row
/// has another holder, the fence names that key and nothing of the transaction commits.
fn a_sets_fence_checks_every_row(db: Db) {
    let Some(f) = Fixture::new(db, "set_fence") else {
        return;
    };
    let registry = f.registry();
    let outsider = f.registry();
    let mut raw = Raw::open(&f);
    let ledger = format!("{}SETLEDGER", f.prefix);
    raw.execute_batch(&format!("CREATE TABLE {ledger} (v BIGINT)"));
    let guard = registry.lock_set(["p", "q", "r"]).unwrap().lock().unwrap();
    fenced_insert(&guard, &mut raw, &ledger, 1).unwrap();
    assert!(guard.is_held());
    let mut watcher = Raw::open(&f);
    assert_eq!(watcher.number(&format!("SELECT COUNT(*) FROM {ledger}")), 1);

    let taken = raw.execute(&format!(
        "UPDATE {} SET CLIENT_ID = 'thief' WHERE LOCK_KEY = '{}'",
        f.table(),
        lock_key_for("q")
    ));
    assert_eq!(taken, 1);
    match fenced_insert(&guard, &mut raw, &ledger, 2) {
        Err(Error::LeaseLost { key, .. }) => assert_eq!(key, "q"),
        other => panic!("the fence must name q's loss, got {other:?}"),
    }
    assert_eq!(
        watcher.number(&format!("SELECT COUNT(*) FROM {ledger}")),
        1,
        "nothing of the refused transaction committed"
    );
    assert!(!guard.is_held());
    drop(guard);
    drop(outsider);
    raw.execute_batch(&format!("DROP TABLE {ledger}"));
}

macro_rules! on_every_backend {
    ($($module:ident => $db:expr),* $(,)?) => {$(
        mod $module {
            use super::*;

            #[test]
            fn a_set_holds_every_key_or_none() {
                super::a_set_holds_every_key_or_none($db);
            }

            #[test]
            fn overlapping_sets_in_any_order_never_deadlock() {
                super::overlapping_sets_in_any_order_never_deadlock($db);
            }

            #[test]
            fn a_loss_of_one_key_is_a_loss_of_the_set() {
                super::a_loss_of_one_key_is_a_loss_of_the_set($db);
            }

            #[test]
            fn a_guard_moves_to_another_thread_and_is_released_there() {
                super::a_guard_moves_to_another_thread_and_is_released_there($db);
            }

            #[test]
            fn permits_and_read_write_guards_move_between_threads() {
                super::permits_and_read_write_guards_move_between_threads($db);
            }

            #[test]
            fn a_sets_fence_checks_every_row() {
                super::a_sets_fence_checks_every_row($db);
            }

            #[test]
            fn a_guard_for_any_thread_does_not_nest() {
                super::a_guard_for_any_thread_does_not_nest($db);
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
