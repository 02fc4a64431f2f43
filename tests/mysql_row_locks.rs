//! MySQL/MariaDB: rows that another session holds locked (`START TRANSACTION; SELECT … FOR
//! UPDATE` in a `mysql` client, a migration, a long transaction) cost only their own leases and
//! permits:
//!
//! - a renewal never waits for such a row, so leases on other rows are renewed however many
//!   locked rows the renewal workers meet;
//! - an acquire of such a row comes back refused at once (within a second on MySQL) instead of
//!   waiting, so a semaphore's poller goes on to a free permit (a lock's `try_lock()` of such
//!   a row: `isolation.rs`, on PostgreSQL too).
//!
//! Bounds are generous (tens of seconds) so that a loaded machine passes.

#![cfg(feature = "mysql")]

mod common;

use common::{Db, Fixture};
use leasehold::LossReason;
use mysql::prelude::Queryable;
use std::time::{Duration, Instant};

const GENEROUS: Duration = Duration::from_secs(30);

/// Another session's open transaction holding rows locked.
struct RowsHeld(mysql::Conn);

impl RowsHeld {
    /// Locks the rows of `lock_keys` (which must exist) in `f`'s table.
    fn on(f: &Fixture, lock_keys: &[String]) -> RowsHeld {
        let mut session = mysql::Conn::new(mysql::Opts::from_url(&common::mysql_url()).unwrap())
            .expect("a second session");
        session.query_drop("START TRANSACTION").unwrap();
        let region = f.registry().region().to_string();
        for lock_key in lock_keys {
            // The whole primary key: the row alone is locked, not a gap.
            let held: Vec<mysql::Row> = session
                .query(format!(
                    "SELECT LOCK_KEY FROM {} WHERE LOCK_KEY = '{lock_key}' AND REGION = '{region}' \
                     FOR UPDATE",
                    f.table()
                ))
                .unwrap();
            assert_eq!(held.len(), 1, "the row of {lock_key} exists");
        }
        RowsHeld(session)
    }

    fn end(mut self) {
        self.0.query_drop("ROLLBACK").unwrap();
    }
}

/// Two lone leases whose rows another session holds locked, with the default two renewal
/// workers: a third lease, on a row nobody locked, is renewed for several time-to-lives. The
/// two locked leases are lost as expired, each for its locked row.
#[test]
fn two_locked_rows_do_not_hold_back_the_renewal_of_a_third_lease() {
    let Some(f) = Fixture::new(Db::Mysql, "two_locked_rows") else {
        return;
    };
    let ttl = Duration::from_secs(3);
    let registry = f.builder().time_to_live(ttl).build().unwrap();
    let locked: Vec<_> = ["locked-a", "locked-b"]
        .iter()
        .map(|key| registry.obtain(key).unwrap().lock().unwrap())
        .collect();
    let free = registry.obtain("untouched").unwrap().lock().unwrap();
    let free_losses = free.loss_channel();
    let held = RowsHeld::on(&f, &["locked-a", "locked-b"].map(leasehold::lock_key_for));
    let started = Instant::now();
    // The locked leases run out at their deadline (about one time-to-live)...
    for guard in &locked {
        let lost = guard
            .loss_channel()
            .recv_timeout(GENEROUS)
            .expect("a lease whose row stays locked is lost at its deadline");
        assert!(
            matches!(lost.reason, LossReason::Expired(Some(ref why)) if why.contains("locked")),
            "{:?} lost for another reason than its locked row: {:?}",
            guard.key(),
            lost.reason
        );
    }
    // ...while the third is renewed all along: three time-to-lives in all.
    let until = started + ttl * 3;
    while Instant::now() < until {
        if let Ok(lost) = free_losses.try_recv() {
            panic!(
                "the lease on the untouched row was lost after {:?}: {:?}",
                started.elapsed(),
                lost.reason
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(free.is_held());
    held.end();
    free.unlock().unwrap();
}

/// A semaphore with free permits, whose first permit's row another session holds locked:
/// `try_acquire_for(1 s)` gets another permit (the poller tries the locked row first).
#[test]
fn a_locked_permit_row_costs_only_that_permit() {
    let Some(f) = Fixture::new(Db::Mysql, "locked_permit") else {
        return;
    };
    let registry = f.registry();
    let name = "locked-permit";
    let semaphore = registry.semaphore(name, 3).unwrap();
    // Every permit's row exists: take all three and give them back.
    let permits: Vec<_> = (0..3).map(|_| semaphore.acquire().unwrap()).collect();
    drop(permits);
    let hex: String = leasehold::lock_key_for(name)
        .chars()
        .filter(|c| *c != '-')
        .collect();
    for slot in 0..3 {
        let held = RowsHeld::on(&f, &[format!("{hex}#{slot:03}")]);
        // A new registry each time: its poller starts at the first permit.
        let other = f.registry();
        let semaphore = other.semaphore(name, 3).unwrap();
        let permit = semaphore
            .try_acquire_for(Duration::from_secs(1))
            .unwrap_or_else(|e| panic!("permit row {slot} locked: {e}"));
        let permit = permit.unwrap_or_else(|| panic!("permit row {slot} locked: no permit in 1 s"));
        assert_ne!(permit.slot(), slot, "granted the locked permit");
        permit.unlock().unwrap();
        held.end();
    }
}

/// A reader/writer lock all of whose read slots but one another session holds locked: a reader
/// (which starts at a random slot) gets the free one. Bounded by 10 s: on a busy host each
/// locked slot costs a few round trips; waiting for one row took the server's
/// `innodb_lock_wait_timeout` (50 s).
#[test]
fn locked_read_slot_rows_cost_only_those_slots() {
    let Some(f) = Fixture::new(Db::Mysql, "locked_read_slot") else {
        return;
    };
    let registry = f.registry();
    let name = "locked-read-slot";
    // Every read slot gets its row: as many readers at once as there are slots.
    let rw = registry.rw_lock(name).unwrap();
    let readers: Vec<_> = (0..leasehold::MAX_READERS)
        .map(|_| rw.read().unwrap())
        .collect();
    drop(readers);
    let mut slots: Vec<String> = registry
        .rw_lock_status(name)
        .unwrap()
        .readers
        .into_iter()
        .map(|row| row.lock_key)
        .collect();
    assert_eq!(slots.len(), leasehold::MAX_READERS as usize);
    let free = slots.remove(17);
    let held = RowsHeld::on(&f, &slots);
    let other = f.registry();
    let read = other
        .rw_lock(name)
        .unwrap()
        .try_read_for(Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("all read slots but {free} locked: {e}"));
    assert!(
        read.is_some(),
        "all read slots but {free} locked: no read in 10 s"
    );
    drop(read);
    held.end();
}
