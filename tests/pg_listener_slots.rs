//! PostgreSQL's release listener never takes one of a server's last free connection slots:
//! it connects, reads `max_connections`, the reserved slots and the connections open, and
//! keeps its connection only while a tenth of the slots (at least 5) stay free beside it;
//! otherwise it closes it, says why once in a warning, and the registry's waiters poll.
//!
//! A test cannot fill a shared server's slots cheaply (nor should it: other tests use it), so
//! the fail point `postgres::listener_slots_taken` adds phantom connections to the live count
//! the listener reads: as many as the server has free slots now, which leaves it none.

#![cfg(all(feature = "postgres", feature = "failpoints"))]

mod common;

use common::{postgres_url, warnings, Db, Fixture};
use std::time::{Duration, Instant};

/// Bound on every wait.
const GENEROUS: Duration = Duration::from_secs(60);

/// The fail point is the whole process's: one test at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn admin() -> postgres::Client {
    postgres::Client::connect(&postgres_url(), postgres::NoTls).expect("PostgreSQL")
}

/// How many sessions `LISTEN` on `f`'s table now.
fn listening(f: &Fixture) -> i64 {
    let query = format!("LISTEN \"{}\"", f.table().to_ascii_lowercase());
    admin()
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE query = $1",
            &[&query],
        )
        .unwrap()
        .get(0)
}

/// The server's free connection slots now, for ordinary users.
fn free_slots() -> i64 {
    admin()
        .query_one(
            "SELECT CAST(current_setting('max_connections') AS INTEGER) \
             - CAST(current_setting('superuser_reserved_connections') AS INTEGER) \
             - COALESCE(CAST(NULLIF(current_setting('reserved_connections', true), '') AS INTEGER), 0) \
             - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')",
            &[],
        )
        .unwrap()
        .get(0)
}

/// Removes a fail point when dropped, however the test ends.
struct ClearOnDrop(&'static str);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        fail::remove(self.0);
    }
}

/// One waiter for a held key, with polls a minute apart unless `poll` says otherwise: the
/// sessions listening on the table while it waits (the most seen), and how long it waited
/// after the release.
fn wait_for_a_release(f: &Fixture, poll: Duration) -> (i64, Duration) {
    let holder = f.registry();
    let waiter = f.builder().idle_between_tries(poll).build().unwrap();
    let held = holder.obtain("slots").unwrap().lock().unwrap();
    let lock = waiter.obtain("slots").unwrap();
    let waiting = std::thread::spawn(move || lock.try_lock_for(GENEROUS).unwrap().is_some());
    // The listener connects on the waiter's first sleep, probes, then listens.
    let mut most = 0;
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        most = most.max(listening(f));
        if most > 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let released = Instant::now();
    held.unlock().unwrap();
    assert!(waiting.join().unwrap(), "the waiter did not get the lock");
    (most, released.elapsed())
}

/// With plenty of free slots the listener listens, and a release wakes the waiter long before
/// its next poll.
#[test]
fn with_free_slots_the_listener_listens() {
    let _alone = one_at_a_time();
    let Some(f) = Fixture::new(Db::Postgres, "pgslotsfree") else {
        return;
    };
    let (listeners, woken_after) = wait_for_a_release(&f, Duration::from_secs(60));
    assert_eq!(listeners, 1, "no listener while waiting");
    assert!(
        woken_after < Duration::from_secs(30),
        "the waiter was not woken ({woken_after:?})"
    );
}

/// With no free slot beside it, the listener gives its connection back at once and says so
/// once, naming the arithmetic; the waiter polls and gets the lock.
#[test]
fn the_listener_leaves_a_servers_last_free_slots_alone() {
    let _alone = one_at_a_time();
    warnings::keep();
    let Some(f) = Fixture::new(Db::Postgres, "pgslotsfull") else {
        return;
    };
    let _fail_point = ClearOnDrop("postgres::listener_slots_taken");
    // Every slot free now is taken, as far as the listener can tell (plus the listener's).
    fail::cfg(
        "postgres::listener_slots_taken",
        &format!("return({})", free_slots()),
    )
    .unwrap();
    let (listeners, _) = wait_for_a_release(&f, Duration::from_millis(50));
    assert_eq!(listeners, 0, "a listener took one of the last free slots");
    let said = warnings::containing("connection slots free beside the release listener");
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].contains("max_connections"), "{}", said[0]);
}
