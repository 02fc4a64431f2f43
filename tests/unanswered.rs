//! Acquires whose answer never comes leave nothing behind: a grant the database made for a
//! call that had given up (its deadline passed, its connection broke) is found and given back,
//! the call reports "held" or a timeout as usual, and another instance gets the key long
//! before the grant's time-to-live would have run out. Dropping or closing the registry waits
//! for that.
//!
//! Two ways to put an acquire's answer out of reach:
//! - the fail point `backend::acquire_answered` loses the answer of a statement that ran
//!   (every backend);
//! - on the servers, a table lock taken by a connection of the test's own holds the acquire
//!   statement inside the server past the call's deadline, and is let go after the call
//!   returned, so the statement grants the row with nobody waiting for its answer.
//!
//! The time-to-live is a minute, so a grant left behind would hold the key far longer than
//! any wait of these tests.

mod common;

// The server test and the fail-point tests each need features of their own.
#[allow(dead_code)]
mod suite {
    use crate::common::raw::Raw;
    use crate::common::{Db, Fixture};
    use leasehold::Error;
    use std::time::Duration;

    pub const TTL: Duration = Duration::from_secs(60);

    /// `other` gets the key with one try (no wait), and no row names `gone` as its holder.
    pub fn free_for_another(f: &Fixture, gone_client: &str, key: &str) {
        let other = f.registry();
        if let Some(holder) = other.holder(key).expect("holder") {
            assert_ne!(
                holder.client_id, gone_client,
                "the grant of an unanswered acquire was left behind: {holder:?}"
            );
        }
        let guard = other
            .obtain(key)
            .unwrap()
            .try_lock()
            .expect("try_lock")
            .expect("the key is free for another instance");
        guard.unlock().unwrap();
    }

    /// A statement held in the server past the call's deadline by a table lock, which is let
    /// go after the call returned: the statement then grants the row to a caller that has
    /// gone. Dropping the registry waits until that grant is given back.
    pub fn a_statement_held_past_the_deadline_leaves_no_grant_behind(f: &Fixture) {
        let registry = f.builder().time_to_live(TTL).build().unwrap();
        let client = registry.client_id().to_string();
        let lock = registry.obtain("held-in-server").unwrap();
        // A connection and a first grant, so that the next acquire only sends its statement.
        lock.lock().unwrap().unlock().unwrap();
        let table = f.table();
        let mut blocker = Raw::open(f);
        match f.db {
            Db::Postgres => blocker.execute_batch(&format!(
                "BEGIN; LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"
            )),
            Db::Mysql => blocker.execute_batch(&format!("LOCK TABLES {table} WRITE")),
            Db::Sqlite => unreachable!("servers only"),
        }
        let outcome = lock.try_lock_for(Duration::from_millis(300));
        assert!(
            matches!(outcome, Err(Error::Timeout { .. })),
            "an acquire without an answer reports a timeout: {outcome:?}"
        );
        // The server took the statement and did not answer in the call's time: the message
        // says the wait may be too short, not that every connection is busy.
        let text = outcome.unwrap_err().to_string();
        assert!(
            text.contains("not answered in that time") && text.contains("allow more time"),
            "{text}"
        );
        match f.db {
            Db::Postgres => blocker.execute_batch("COMMIT"),
            _ => blocker.execute_batch("UNLOCK TABLES"),
        }
        drop(lock);
        drop(registry);
        free_for_another(f, &client, "held-in-server");
    }

    pub fn servers(f: &Fixture) {
        // Fail points are process-wide: none of the other tests' may be set meanwhile.
        #[cfg(feature = "failpoints")]
        let _scenario = fail::FailScenario::setup();
        a_statement_held_past_the_deadline_leaves_no_grant_behind(f);
    }

    #[cfg(feature = "failpoints")]
    pub mod lost {
        use super::{free_for_another, TTL};
        use crate::common::Fixture;
        use leasehold::Error;
        use std::time::Duration;

        /// The answer of a granting statement is lost; the call's wait goes on: the grant is
        /// given back before the next attempt, which is granted.
        pub fn a_lost_answer_is_resolved_and_the_wait_goes_on(f: &Fixture) {
            let _scenario = fail::FailScenario::setup();
            let registry = f.builder().time_to_live(TTL).build().unwrap();
            fail::cfg("backend::acquire_answered", "1*return").unwrap();
            let guard = registry.obtain("lost-answer").unwrap().lock().unwrap();
            fail::remove("backend::acquire_answered");
            let holder = registry.holder("lost-answer").unwrap().expect("held");
            assert_eq!(holder.client_id, registry.client_id());
            assert_eq!(holder.fencing_token, guard.fencing_token());
            let stats = registry.statistics();
            assert_eq!(stats.unanswered_grants_released, 1, "{stats:?}");
            assert_eq!(stats.grants, 2, "{stats:?}");
            guard.unlock().unwrap();
        }

        /// The answer of a granting statement is lost after the call's deadline: the call
        /// reports a timeout, and the grant is given back; closing the registry waits for it.
        pub fn a_grant_without_an_answer_at_the_deadline_is_given_back(f: &Fixture) {
            let _scenario = fail::FailScenario::setup();
            let registry = f.builder().time_to_live(TTL).build().unwrap();
            let client = registry.client_id().to_string();
            let lock = registry.obtain("late-answer").unwrap();
            lock.lock().unwrap().unlock().unwrap();
            fail::cfg("backend::acquire_answered", "1*return(400)").unwrap();
            let outcome = lock.try_lock_for(Duration::from_millis(50));
            assert!(
                matches!(outcome, Err(Error::Timeout { .. })),
                "an acquire without an answer reports a timeout: {outcome:?}"
            );
            registry.close();
            fail::remove("backend::acquire_answered");
            let stats = registry.statistics();
            assert_eq!(stats.unanswered_grants_released, 1, "{stats:?}");
            free_for_another(f, &client, "late-answer");
        }

        /// A wait that had found the key held reports `Ok(None)` when its last attempt got no
        /// answer, and the grant that attempt made is given back.
        pub fn a_wait_that_found_the_key_held_ends_with_none(f: &Fixture) {
            let _scenario = fail::FailScenario::setup();
            let holder = f.registry();
            let registry = f.builder().time_to_live(TTL).build().unwrap();
            let client = registry.client_id().to_string();
            let held = holder.obtain("found-held").unwrap().lock().unwrap();
            let lock = registry.obtain("found-held").unwrap();
            assert!(lock.try_lock().unwrap().is_none());
            let waiter = std::thread::spawn(move || {
                let outcome = lock
                    .try_lock_for(Duration::from_millis(300))
                    .map(|g| g.is_some());
                (outcome, lock)
            });
            // Once the wait found the key held, its next attempt, after the release, is granted
            // and its answer lost.
            while registry.statistics().contended_tries < 2 {
                std::thread::sleep(Duration::from_millis(1));
            }
            fail::cfg("backend::acquire_answered", "1*return(400)").unwrap();
            held.unlock().unwrap();
            let (outcome, lock) = waiter.join().unwrap();
            assert!(
                matches!(outcome, Ok(false) | Err(Error::Timeout { .. })),
                "{outcome:?}"
            );
            drop(lock);
            registry.close();
            fail::remove("backend::acquire_answered");
            free_for_another(f, &client, "found-held");
        }

        /// Which primitive `made_again` drops and obtains again.
        #[derive(Clone, Copy)]
        enum Primitive {
            WriteSide,
            Permit,
        }

        /// A semaphore or reader/writer lock whose row's acquire lost its answer is dropped
        /// while the resolution of that acquire has not looked at the row yet, and obtained
        /// again after the lost grant ran out. The new handle must share the row's state and
        /// wait for the resolution: a new acquire of the row meanwhile would be granted, and the
        /// resolution, finding a grant that names this registry, would give the new holder's
        /// row back under it.
        fn made_again(f: &Fixture, primitive: Primitive) {
            let _scenario = fail::FailScenario::setup();
            let ttl = Duration::from_secs(1);
            let registry = f.builder().time_to_live(ttl).build().unwrap();
            let name = "made-again";
            let try_for = |wait: Duration| -> leasehold::Result<Option<Box<dyn FnOnce()>>> {
                Ok(match primitive {
                    Primitive::WriteSide => registry
                        .rw_lock(name)?
                        .try_write_for(wait)?
                        .map(|g| Box::new(move || g.unlock().unwrap()) as Box<dyn FnOnce()>),
                    Primitive::Permit => registry
                        .semaphore(name, 1)?
                        .try_acquire_for(wait)?
                        .map(|g| Box::new(move || g.unlock().unwrap()) as Box<dyn FnOnce()>),
                })
            };
            let held_in_table = || match primitive {
                Primitive::WriteSide => registry
                    .rw_lock_status(name)
                    .unwrap()
                    .held_writer()
                    .is_some(),
                Primitive::Permit => !registry.semaphore_status(name).unwrap().held().is_empty(),
            };
            fail::cfg("lock::background_job_starts", "pause").unwrap();
            // Granted in the table, answer lost after the call's wait: resolved in the
            // background, which waits.
            fail::cfg("backend::acquire_answered", "1*return(100)").unwrap();
            let first = try_for(Duration::from_millis(50));
            assert!(!matches!(first, Ok(Some(_))), "the answer was lost");
            let expired_by = std::time::Instant::now() + Duration::from_secs(60);
            while held_in_table() {
                assert!(
                    std::time::Instant::now() < expired_by,
                    "the lost grant never ran out"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            // Every handle of the first call is gone; the lost grant has run out.
            let during = try_for(Duration::from_millis(300)).unwrap();
            let polled_during = during.is_some();
            fail::remove("lock::background_job_starts");
            let unlock = match during {
                Some(unlock) => unlock,
                None => try_for(Duration::from_secs(30))
                    .unwrap()
                    .expect("granted once the resolution is over"),
            };
            assert!(
                !polled_during,
                "a handle made again was granted the row while its resolution was still running"
            );
            unlock();
            registry.close();
        }

        pub fn a_write_side_made_again_waits_for_its_rows_resolution(f: &Fixture) {
            made_again(f, Primitive::WriteSide);
        }

        pub fn a_semaphore_made_again_waits_for_its_rows_resolution(f: &Fixture) {
            made_again(f, Primitive::Permit);
        }
    }
}

macro_rules! lost {
    ($db:expr; $($test:ident),*) => {
        #[cfg(feature = "failpoints")]
        mod lost {$(
            #[test]
            fn $test() {
                if let Some(f) = crate::common::Fixture::new($db, stringify!($test)) {
                    crate::suite::lost::$test(&f);
                }
            }
        )*}
    };
    ($db:expr) => {
        lost!($db;
            a_lost_answer_is_resolved_and_the_wait_goes_on,
            a_grant_without_an_answer_at_the_deadline_is_given_back,
            a_wait_that_found_the_key_held_ends_with_none,
            a_write_side_made_again_waits_for_its_rows_resolution,
            a_semaphore_made_again_waits_for_its_rows_resolution
        );
    };
}

#[cfg(feature = "sqlite")]
mod sqlite {
    lost!(crate::common::Db::Sqlite);
}

#[cfg(feature = "postgres")]
mod postgres {
    crate::suite_for!(crate::common::Db::Postgres; servers);
    lost!(crate::common::Db::Postgres);
}

#[cfg(feature = "mysql")]
mod mysql {
    crate::suite_for!(crate::common::Db::Mysql; servers);
    lost!(crate::common::Db::Mysql);
}
