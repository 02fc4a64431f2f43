//! Tests of the named-lock thread's timing: how it backs off under short leases, and when a
//! name it must take is due. Its server refuses every connection.

use super::*;

/// A manager whose server refuses every connection: the thread's statements fail at once
/// (a name it tries to take is wanted again later), which is all these tests need.
fn unreachable_manager() -> MysqlManager {
    MysqlManager {
        opts: vec![mysql::Opts::from_url("mysql://root@127.0.0.1:1/test").unwrap()],
        prefer_tls: false,
        named_locks: Default::default(),
        ids: Default::default(),
        mariadb: Default::default(),
    }
}

/// Leases that end before [`TAKE_DELAY`], one after another (a registry locking and
/// unlocking in a loop): the named-lock thread glances at them on a timer that backs off
/// to [`MAX_GLANCE`] instead of waking about every [`TAKE_DELAY`], and grants do not wake
/// it while it glances. A lease the test thread was kept from ending in time (a loaded
/// machine) is taken, which starts the back-off afresh: the bound allows for that.
#[test]
fn short_leases_in_a_loop_wake_the_named_lock_thread_rarely() {
    let named = NamedLocks::start(unreachable_manager(), Duration::from_secs(60));
    let name = lock_name("T_LOCK", "DEFAULT", "loop");
    let started = Instant::now();
    let mut cycles = 0u64;
    while started.elapsed() < Duration::from_millis(600) {
        named.take(name.clone());
        named.drop_after(name.clone(), Duration::ZERO);
        cycles += 1;
        std::thread::sleep(Duration::from_micros(200));
    }
    let elapsed = started.elapsed();
    let (looks, taken) = {
        let pending = named.shared.pending.lock();
        (pending.looks, pending.taken)
    };
    // Each take restarts the back-off: 2, 4, 8, 16 ms, about five looks before the pause
    // is back at its longest.
    let bound = elapsed.as_millis() as u64 / (MAX_GLANCE.as_millis() as u64 / 2) + 6 * taken + 10;
    assert!(
        looks <= bound,
        "{cycles} short leases in {elapsed:?} woke the named-lock thread {looks} times \
         ({taken} names taken); at most {bound} expected"
    );
}

/// A lease that lasted (its name taken) and then a quiet spell: the back-off does not
/// carry over, so the next grant wakes the thread and its name is due [`TAKE_DELAY`]
/// after it, as a waiter elsewhere expects (a watcher that finds the name free learns of
/// the release only at its next look at the row).
#[test]
fn a_grant_after_a_lease_that_lasted_is_looked_at_when_due() {
    let named = NamedLocks::start(unreachable_manager(), Duration::from_secs(60));
    let short = lock_name("T_LOCK", "DEFAULT", "short");
    let long = lock_name("T_LOCK", "DEFAULT", "long");
    // Short leases first, so that the thread backs off ...
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(100) {
        named.take(short.clone());
        named.drop_after(short.clone(), Duration::ZERO);
        std::thread::sleep(Duration::from_micros(200));
    }
    // ... then one that lasts until its name was taken, and a quiet spell.
    named.take(long.clone());
    let waited = Instant::now();
    while named.shared.pending.lock().taken == 0 {
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "the name was never taken"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(50));
    let before = named.shared.pending.lock().looks;
    named.drop_after(long.clone(), Duration::ZERO);
    // The thread lets the name go and then stops glancing (no grant came meanwhile): it
    // looks about twice, not every few milliseconds for a while.
    let waited = Instant::now();
    while named.shared.pending.lock().glance.is_some() {
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "the thread kept glancing"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(50));
    let (taken, looks) = {
        let pending = named.shared.pending.lock();
        (pending.taken, pending.looks)
    };
    assert!(
        looks - before <= 6,
        "after the last lease ended the thread looked {} times",
        looks - before
    );
    named.take(long.clone());
    // The name is due at most `TAKE_DELAY` after this instant.
    let granted = Instant::now();
    // The thread's first look after the grant plans the next one at the grant's due (or
    // takes the name, when it looks that late).
    let waited = Instant::now();
    let glance = loop {
        {
            let pending = named.shared.pending.lock();
            if pending.taken > taken {
                break None;
            }
            if pending.looks > looks {
                break pending.glance;
            }
        }
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "the thread never looked"
        );
        std::thread::sleep(Duration::from_micros(100));
    };
    if let Some(glance) = glance {
        assert!(
            glance <= granted + TAKE_DELAY,
            "after a quiet spell the next look at a grant came {:?} after it",
            glance - granted
        );
    }
}
