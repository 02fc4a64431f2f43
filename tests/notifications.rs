//! Release wake-ups: a release wakes waiters of other registries at once — PostgreSQL through
//! `NOTIFY`, SQLite through the release board shared by the processes of a host — a registry
//! listens only while it has waiters, the listener survives losing its connection (PostgreSQL),
//! wake-ups cross processes and never grant anything (SQLite), and the feature can be turned
//! off.
//!
//! Waiters here poll only every 30 s, so a waiter that gets the lock within a few seconds of
//! the release was woken by the release, not by its timer. A release comes only once the
//! waiter's registry has subscribed (its listener's first nudge makes the waiter try again; on
//! SQLite the waiter tries again once it is present on the board itself), not after a fixed
//! sleep that a busy machine may outlast.

#![cfg(any(
    feature = "postgres",
    feature = "mysql",
    all(feature = "sqlite", target_os = "linux")
))]

mod common;

use common::{Db, Fixture};
use leasehold::LockRegistry;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

const SLOW_POLL: Duration = Duration::from_secs(30);
const WOKEN_WITHIN: Duration = Duration::from_secs(10);

#[cfg(feature = "postgres")]
fn fixture(test: &str) -> Option<Fixture> {
    Fixture::new(Db::Postgres, test)
}

/// Starts a thread in `waiter` that locks `key` and reports when it got it.
fn wait_for(waiter: LockRegistry, key: &'static str) -> (Arc<AtomicBool>, thread::JoinHandle<()>) {
    let granted = Arc::new(AtomicBool::new(false));
    let flag = granted.clone();
    let handle = thread::spawn(move || {
        let lock = waiter.obtain(key).unwrap();
        let guard = lock.try_lock_for(SLOW_POLL * 2).unwrap().expect("granted");
        flag.store(true, Ordering::SeqCst);
        guard.unlock().unwrap();
    });
    (granted, handle)
}

/// Waits until `flag` is set or `within` passes; returns whether it was set.
fn set_within(flag: &AtomicBool, within: Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if flag.load(Ordering::SeqCst) {
            return true;
        }
        thread::sleep(Duration::from_millis(5));
    }
    flag.load(Ordering::SeqCst)
}

/// The waiter's attempts answered so far that found the lock held: what [`until_tried`]
/// counts from.
fn refused(waiter: &LockRegistry) -> u64 {
    waiter.statistics().contended_tries
}

/// Waits until `tries` more of the waiter's attempts than `before` (see [`refused`]) were
/// answered "held": an attempt counts once its answer is in, so none of them is still on its
/// way to the database when this returns, however slow the machine.
fn until_tried(waiter: &LockRegistry, before: u64, tries: u64) {
    let give_up = std::time::Instant::now() + SLOW_POLL;
    while refused(waiter) < before + tries {
        assert!(
            std::time::Instant::now() < give_up,
            "the waiter was not refused {tries} times"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until the waiter has tried once and found the lock held.
fn until_polled(waiter: &LockRegistry, before: u64) {
    until_tried(waiter, before, 1);
}

/// Waits until the waiter's registry listens for releases: it tried once and found the lock
/// held, then its listener subscribed and nudged it to try again, or (SQLite) it became present
/// on the board and tried again (for a release it might have missed meanwhile), and found the
/// lock held again.
fn until_listening(waiter: &LockRegistry, before: u64) {
    until_tried(waiter, before, 2);
}

/// `holder` takes "job", a thread of `waiter` waits for it and polls once (and, when `waiter`
/// listens, once more as its listener subscribes), `holder` releases: whether the waiter got
/// the lock within `within`. Joins the waiter either way.
fn release_reaches_waiter(
    holder: &LockRegistry,
    waiter: &LockRegistry,
    listens: bool,
    within: Duration,
) -> bool {
    let guard = holder.obtain("job").unwrap().lock().unwrap();
    let before = refused(waiter);
    let (granted, handle) = wait_for(waiter.clone(), "job");
    if listens {
        until_listening(waiter, before);
    } else {
        until_polled(waiter, before);
    }
    guard.unlock().unwrap();
    let in_time = set_within(&granted, within);
    handle.join().unwrap();
    assert!(
        granted.load(Ordering::SeqCst),
        "the waiter got the lock in the end"
    );
    in_time
}

/// Backends of `f`'s table that are subscribed to its channel right now, as far as
/// `pg_stat_activity` tells: an idle connection whose last statement was this `LISTEN`.
#[cfg(feature = "postgres")]
fn listening_backends(admin: &mut postgres::Client, f: &Fixture) -> i64 {
    admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle' AND query = $1",
            &[&format!("LISTEN \"{}\"", f.table().to_ascii_lowercase())],
        )
        .unwrap()
        .get(0)
}

#[cfg(feature = "postgres")]
#[test]
fn a_registry_listens_only_while_one_of_its_threads_waits() {
    let Some(f) = fixture("notify_on_demand") else {
        return;
    };
    let mut admin = postgres::Client::connect(&common::postgres_url(), postgres::NoTls).unwrap();
    let holder = f.registry();
    let waiter = f.builder().idle_between_tries(SLOW_POLL).build().unwrap();
    // The row exists before the waits, and the holder's turns begin past the turn gap of
    // that first one: a turn begun by inserting the row is a short one, which a waiter that
    // continues it ends at its release (and then stays away for its turn window, 2 × 30 s
    // here) instead of waiting again at once.
    holder
        .obtain("job")
        .unwrap()
        .lock()
        .unwrap()
        .unlock()
        .unwrap();
    thread::sleep(Duration::from_millis(500));
    let guard = holder.obtain("job").unwrap().lock().unwrap();
    waiter
        .obtain("other")
        .unwrap()
        .lock()
        .unwrap()
        .unlock()
        .unwrap();
    thread::sleep(Duration::from_millis(300));
    assert_eq!(
        listening_backends(&mut admin, &f),
        0,
        "locking and releasing without waiting subscribes nobody"
    );
    let before = refused(&waiter);
    let (granted, handle) = wait_for(waiter.clone(), "job");
    until_listening(&waiter, before);
    assert_eq!(
        listening_backends(&mut admin, &f),
        1,
        "the waiting registry listens, the holding one does not"
    );
    guard.unlock().unwrap();
    assert!(set_within(&granted, WOKEN_WITHIN), "the waiter was woken");
    handle.join().unwrap();
    // The listener lets go one to two ticks (seconds) after the last wait, even while the
    // registry keeps locking keys that are free.
    let busy = waiter.obtain("free").unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while listening_backends(&mut admin, &f) > 0 && std::time::Instant::now() < deadline {
        busy.lock().unwrap().unlock().unwrap();
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        listening_backends(&mut admin, &f),
        0,
        "the listener unsubscribed after the wait"
    );
    assert!(
        release_reaches_waiter(&holder, &waiter, true, WOKEN_WITHIN),
        "a later wait subscribes again"
    );
}

#[cfg(feature = "postgres")]
#[test]
fn the_listener_comes_back_after_its_connection_is_killed() {
    let Some(f) = fixture("notify_reconnects") else {
        return;
    };
    let holder = f.registry();
    // Its polls come a minute or more apart: a try within the minute after the kill is the
    // listener's, however long the listener takes to come back on a busy machine.
    let poll = Duration::from_secs(120);
    let waiter = f.builder().idle_between_tries(poll).build().unwrap();
    let mut admin = postgres::Client::connect(&common::postgres_url(), postgres::NoTls).unwrap();
    let guard = holder.obtain("job").unwrap().lock().unwrap();
    let before = refused(&waiter);
    let (granted, handle) = wait_for(waiter.clone(), "job");
    until_listening(&waiter, before);
    let polls_before = refused(&waiter);
    let killed = admin
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = $1",
            &[&format!("LISTEN \"{}\"", f.table().to_ascii_lowercase())],
        )
        .unwrap()
        .len();
    assert_eq!(killed, 1, "the waiting registry's listener was found");
    // The listener notices and subscribes again (it checks every second); it then has the
    // waiter try once more, for releases it may have missed meanwhile. That try's refusal
    // means the listener is back.
    let deadline = std::time::Instant::now() + poll / 2 - Duration::from_secs(5);
    while refused(&waiter) == polls_before && std::time::Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
    }
    assert!(
        refused(&waiter) > polls_before,
        "the waiter tried again once the listener was back"
    );
    guard.unlock().unwrap();
    assert!(
        set_within(&granted, WOKEN_WITHIN),
        "no wake-up after the listener was killed"
    );
    handle.join().unwrap();
}

/// Set in a child process that runs one test alone.
const ALONE: &str = "LEASEHOLD_NOTIFY_ALONE";

/// Whether to run the body of `test` here: `true` in a child process started for it; in the
/// test itself, starts that child (this binary, running only `test` on `f`'s backend), asserts
/// that it passed, and returns `false`.
fn in_own_process(f: &Fixture, test: &str) -> bool {
    let module = match f.db {
        Db::Sqlite => "sqlite_wakeups",
        Db::Postgres => "postgres_wakeups",
        Db::Mysql => "mysql_wakeups",
    };
    alone(&format!("{module}::{test}"))
}

/// [`in_own_process`] for the test named `test` in full.
fn alone(test: &str) -> bool {
    if std::env::var_os(ALONE).is_some() {
        return true;
    }
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--test-threads", "1"])
        .env(ALONE, "1")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && said.contains("1 passed"),
        "{test} in its own process: {said}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    false
}

/// The body of each test, run on every backend with wake-ups.
mod suite {
    use super::*;
    pub use crate::processes::{
        a_killed_holder_keeps_the_lock_until_its_lease_expires,
        a_release_in_another_process_wakes_a_waiter_before_its_next_poll,
    };

    pub fn a_release_wakes_a_waiter_of_another_registry_before_its_next_poll(f: &Fixture) {
        let holder = f.registry();
        let waiter = f.builder().idle_between_tries(SLOW_POLL).build().unwrap();
        assert!(
            release_reaches_waiter(&holder, &waiter, true, WOKEN_WITHIN),
            "the waiter slept until its next poll"
        );
        // One failed try, one when the subscription took effect (on SQLite, once the waiter is
        // present on the release board), one woken try; on MySQL
        // perhaps one more: a watcher that starts before the holder's named lock is taken (the
        // holder takes it in the background, which a loaded machine can delay) reports its
        // first `GET_LOCK` as a possible release.
        let tries = waiter.statistics().acquires;
        let spurious = u64::from(f.db == Db::Mysql);
        assert!(
            (3..=3 + spurious).contains(&tries),
            "{tries} tries: a failed one, one when subscribed, one woken"
        );
    }

    pub fn without_notifications_a_waiter_wakes_only_at_its_next_poll(f: &Fixture) {
        let holder = f.registry();
        // Its next poll comes 8 s after the first: far later than the release and the half
        // second given to a wake-up, even on a busy machine.
        let waiter = f
            .builder()
            .notifications(false)
            .idle_between_tries(Duration::from_secs(8))
            .build()
            .unwrap();
        assert!(
            !release_reaches_waiter(&holder, &waiter, false, Duration::from_millis(500)),
            "woken without notifications"
        );
        assert_eq!(waiter.statistics().acquires, 2);
    }

    pub fn a_standby_of_another_instance_is_woken_when_the_leader_resigns(f: &Fixture) {
        // Standbys poll every 20 s and the lease lasts 30 s: only the release can explain a
        // takeover within a few seconds.
        let election = || {
            leasehold::LeaderElection::builder(f.builder(), "leader")
                .lease_duration(Duration::from_secs(30))
                .lock_keep_alive_period(Duration::from_secs(10))
                .lock_acquire_sleep_interval(Duration::from_secs(20))
                .build()
                .unwrap()
        };
        let (first, second) = (election(), election());
        let leadership = first.acquire().unwrap();
        let standby = second.clone();
        let standing_by = thread::spawn(move || standby.acquire().unwrap());
        // Let the standby make its first attempt, find the lease held, and subscribe.
        thread::sleep(Duration::from_secs(1));
        assert!(!standing_by.is_finished(), "taken from a live leader");
        let resigned_at = std::time::Instant::now();
        leadership.resign().unwrap();
        let deadline = resigned_at + WOKEN_WITHIN;
        while !standing_by.is_finished() && std::time::Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        assert!(
            standing_by.is_finished(),
            "the standby slept until its next attempt"
        );
        let next = standing_by.join().unwrap();
        assert!(second.is_leader());
        assert!(!first.is_leader(), "the resigning instance rests");
        next.resign().unwrap();
    }

    /// The listener thread ends with its registry (and, on PostgreSQL, its connection). Runs in
    /// a process of its own: it counts the process's threads.
    pub fn the_listener_ends_with_its_registry(f: &Fixture) {
        if !in_own_process(f, "the_listener_ends_with_its_registry") {
            return;
        }
        let listeners = || {
            std::fs::read_dir("/proc/self/task")
                .unwrap()
                .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
                .filter(|name| name.trim() == "leasehold-liste")
                .count()
        };
        // (Only these two registries live in this process. A thread counts once it has run
        // far enough to carry its name, so counts are compared only after the wait.)
        let holder = f.registry();
        let waiter = f.builder().idle_between_tries(SLOW_POLL).build().unwrap();
        assert!(release_reaches_waiter(&holder, &waiter, true, WOKEN_WITHIN));
        assert!(listeners() >= 1, "the waiting registry has a listener");
        drop((holder, waiter));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while listeners() > 0 && std::time::Instant::now() < deadline {
            thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(listeners(), 0, "a listener outlived its registry");
    }
}

macro_rules! wakeup_suite {
    ($db:expr) => {
        crate::suite_for!($db;
            a_release_wakes_a_waiter_of_another_registry_before_its_next_poll,
            without_notifications_a_waiter_wakes_only_at_its_next_poll,
            a_standby_of_another_instance_is_woken_when_the_leader_resigns,
            the_listener_ends_with_its_registry,
            a_release_in_another_process_wakes_a_waiter_before_its_next_poll,
            a_killed_holder_keeps_the_lock_until_its_lease_expires,
        );
    };
}

#[cfg(feature = "postgres")]
mod postgres_wakeups {
    wakeup_suite!(crate::common::Db::Postgres);
}

#[cfg(feature = "mysql")]
mod mysql_wakeups {
    wakeup_suite!(crate::common::Db::Mysql);
}

#[cfg(all(feature = "sqlite", target_os = "linux"))]
mod sqlite_wakeups {
    wakeup_suite!(crate::common::Db::Sqlite);
}

/// Across processes: a child process of this test binary holds the lock.
mod processes {
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    use std::time::Instant;

    const ROLE: &str = "LEASEHOLD_NOTIFY_CHILD";

    /// Not a test of its own: the holder process of the tests below (does nothing unless
    /// started by them). Takes "job" with the time-to-live it is given, says `held`, and
    /// releases when its standard input gives a line (or never, when it is killed first).
    #[test]
    fn child_process_entry() {
        let Ok(database) = std::env::var(ROLE) else {
            return;
        };
        let prefix = std::env::var("LEASEHOLD_NOTIFY_PREFIX").unwrap();
        let ttl: u64 = std::env::var("LEASEHOLD_NOTIFY_TTL_MS")
            .unwrap()
            .parse()
            .unwrap();
        let builder = match database.split_once(':') {
            #[cfg(feature = "sqlite")]
            Some(("sqlite", path)) => LockRegistry::sqlite(path),
            #[cfg(feature = "postgres")]
            Some(("postgres", _)) => LockRegistry::postgres(common::postgres_url()),
            #[cfg(feature = "mysql")]
            Some(("mysql", _)) => LockRegistry::mysql(common::mysql_url()),
            _ => panic!("unknown database {database}"),
        };
        let registry = builder
            .prefix(prefix)
            .time_to_live(Duration::from_millis(ttl))
            .build()
            .unwrap();
        let guard = registry.obtain("job").unwrap().lock().unwrap();
        println!("held");
        std::io::stdout().flush().unwrap();
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).unwrap();
        guard.unlock().unwrap();
        println!("released");
    }

    struct Holder {
        child: std::process::Child,
        lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
    }

    impl Holder {
        /// Starts a holder process on `f`'s file and waits until it holds "job".
        fn start(f: &Fixture, ttl: Duration) -> Holder {
            let mut child = Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "processes::child_process_entry"])
                .args(["--nocapture", "--test-threads", "1"])
                .env(ROLE, database(f))
                .env("LEASEHOLD_NOTIFY_PREFIX", &f.prefix)
                .env("LEASEHOLD_NOTIFY_TTL_MS", ttl.as_millis().to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
            loop {
                // The harness may have started the line ("test … ... ").
                let line = lines.next().expect("the holder said held").unwrap();
                if line.ends_with("held") {
                    break;
                }
            }
            Holder { child, lines }
        }

        fn release(&mut self) {
            writeln!(self.child.stdin.as_mut().unwrap()).unwrap();
        }
    }

    impl Drop for Holder {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// How the child process finds `f`'s database.
    fn database(f: &Fixture) -> String {
        match f.db {
            Db::Sqlite => format!("sqlite:{}", f.sqlite_path().display()),
            Db::Postgres => "postgres:".into(),
            Db::Mysql => "mysql:".into(),
        }
    }

    pub fn a_release_in_another_process_wakes_a_waiter_before_its_next_poll(f: &Fixture) {
        let mut holder = Holder::start(f, Duration::from_secs(30));
        let waiter = f.builder().idle_between_tries(SLOW_POLL).build().unwrap();
        let before = refused(&waiter);
        let (granted, handle) = wait_for(waiter.clone(), "job");
        until_listening(&waiter, before);
        holder.release();
        assert!(
            set_within(&granted, WOKEN_WITHIN),
            "the waiter slept until its next poll"
        );
        handle.join().unwrap();
        let said = holder.lines.next().transpose().unwrap();
        assert!(said.is_some_and(|line| line.ends_with("released")));
    }

    pub fn a_killed_holder_keeps_the_lock_until_its_lease_expires(f: &Fixture) {
        let ttl = Duration::from_secs(3);
        let started = Instant::now();
        let mut holder = Holder::start(f, ttl);
        // Polls often: whatever wakes it, only the row decides.
        let waiter = f
            .builder()
            .idle_between_tries(Duration::from_millis(100))
            .build()
            .unwrap();
        let (granted, handle) = wait_for(waiter.clone(), "job");
        until_polled(&waiter, 0);
        holder.child.kill().unwrap();
        holder.child.wait().unwrap();
        let killed = Instant::now();
        assert!(
            set_within(&granted, ttl * 3),
            "taken after the lease ran out"
        );
        let taken = Instant::now();
        handle.join().unwrap();
        // The lease was granted after `started`, so it ran at least until `started + ttl`.
        assert!(
            taken >= started + ttl,
            "taken {:?} after the holder started, within its time-to-live {ttl:?} (killed after {:?})",
            taken - started,
            killed - started
        );
    }
}

/// MySQL's wake-up resources: named locks while holding, watchers while waiting, nothing after.
#[cfg(feature = "mysql")]
mod mysql_resources {
    use super::*;
    use mysql::prelude::Queryable;

    /// The named lock of `key` in `f`'s table (see `backend::mysql::wakeups`).
    fn lock_name(f: &Fixture, key: &str) -> String {
        use md5::{Digest, Md5};
        let mut hasher = Md5::new();
        for part in [f.table().as_str(), "DEFAULT", &leasehold::lock_key_for(key)] {
            hasher.update(part.as_bytes());
            hasher.update([0]);
        }
        let hex: String = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("lh1:{hex}")
    }

    /// Whether some session holds the named lock `name`.
    fn named_lock_used(admin: &mut mysql::Conn, name: &str) -> bool {
        admin
            .exec_first::<Option<u64>, _, _>("SELECT IS_USED_LOCK(?)", (name,))
            .unwrap()
            .flatten()
            .is_some()
    }

    /// Threads of this process named `name`.
    fn threads(name: &str) -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .filter(|comm| comm.trim() == name)
            .count()
    }

    fn watchers() -> usize {
        threads("leasehold-watch")
    }

    #[test]
    fn named_locks_and_watchers_exist_only_while_holding_and_waiting() {
        let Some(f) = Fixture::new(Db::Mysql, "notify_resources") else {
            return;
        };
        if !alone("mysql_resources::named_locks_and_watchers_exist_only_while_holding_and_waiting")
        {
            return;
        }
        let mut admin =
            mysql::Conn::new(mysql::Opts::from_url(&common::mysql_url()).unwrap()).unwrap();
        let name = lock_name(&f, "job");
        let used = |admin: &mut mysql::Conn| named_lock_used(admin, &name);
        let holder = f.registry();
        let waiter = f.builder().idle_between_tries(SLOW_POLL).build().unwrap();
        let guard = holder.obtain("job").unwrap().lock().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !used(&mut admin) && std::time::Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
        assert!(used(&mut admin), "the holder took the key's named lock");
        assert_eq!(watchers(), 0, "nobody waits yet");
        let before = refused(&waiter);
        let (granted, handle) = wait_for(waiter.clone(), "job");
        until_listening(&waiter, before);
        assert_eq!(watchers(), 1, "one watcher for the waited-for key");
        guard.unlock().unwrap();
        assert!(set_within(&granted, WOKEN_WITHIN), "the waiter was woken");
        handle.join().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while (watchers() > 0 || used(&mut admin)) && std::time::Instant::now() < deadline {
            thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(watchers(), 0, "the watcher ended with the wait");
        assert!(!used(&mut admin), "the named lock went with the lease");
        assert_eq!(
            threads("leasehold-names"),
            2,
            "a named-lock thread in each registry (both held the lock)"
        );
        drop((holder, waiter));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while threads("leasehold-names") > 0 && std::time::Instant::now() < deadline {
            thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(
            threads("leasehold-names"),
            0,
            "the named-lock thread outlived its registry"
        );
    }

    /// A holder whose named lock was busy at the grant (a watcher holds it for an instant
    /// between `GET_LOCK` and `RELEASE_LOCK`; here an outside session holds it longer) takes
    /// it once it is free, so waiters elsewhere are woken by its release after all.
    #[test]
    fn a_named_lock_busy_at_the_grant_is_taken_once_free() {
        let Some(f) = Fixture::new(Db::Mysql, "notify_busy_name") else {
            return;
        };
        let name = lock_name(&f, "job");
        let mut outside =
            mysql::Conn::new(mysql::Opts::from_url(&common::mysql_url()).unwrap()).unwrap();
        let taken: Option<i64> = outside
            .exec_first("SELECT GET_LOCK(?, 0)", (&name,))
            .unwrap();
        assert_eq!(taken, Some(1));
        let holder = f.registry();
        let guard = holder.obtain("job").unwrap().lock().unwrap();
        // The holder's attempt (50 ms) runs out while the outside session holds the name.
        thread::sleep(Duration::from_millis(300));
        let _: Option<i64> = outside
            .exec_first("SELECT RELEASE_LOCK(?)", (&name,))
            .unwrap();
        let mut admin =
            mysql::Conn::new(mysql::Opts::from_url(&common::mysql_url()).unwrap()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut owner: Option<u64> = None;
        while owner.is_none() && std::time::Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
            owner = admin
                .exec_first::<Option<u64>, _, _>("SELECT IS_USED_LOCK(?)", (&name,))
                .unwrap()
                .flatten();
        }
        assert!(owner.is_some(), "the holder never took its named lock");
        // And a waiter elsewhere is woken by the release.
        let waiter = f.builder().idle_between_tries(SLOW_POLL).build().unwrap();
        let before = refused(&waiter);
        let (granted, handle) = wait_for(waiter.clone(), "job");
        until_listening(&waiter, before);
        guard.unlock().unwrap();
        assert!(
            set_within(&granted, WOKEN_WITHIN),
            "the waiter slept until its next poll"
        );
        handle.join().unwrap();
    }

    /// A holder whose named lock is free — it had not taken it yet (a lease younger than the
    /// take delay), or lost it with its connection, as here — still wakes a waiter elsewhere:
    /// the waiter's watcher finds the name free and reads the release off the row.
    #[test]
    fn a_release_without_the_named_lock_still_wakes_a_waiter_elsewhere() {
        let Some(f) = Fixture::new(Db::Mysql, "notify_name_lost") else {
            return;
        };
        let name = lock_name(&f, "job");
        let mut admin =
            mysql::Conn::new(mysql::Opts::from_url(&common::mysql_url()).unwrap()).unwrap();
        let holder = f.registry();
        let guard = holder.obtain("job").unwrap().lock().unwrap();
        let owner = |admin: &mut mysql::Conn| {
            admin
                .exec_first::<Option<u64>, _, _>("SELECT IS_USED_LOCK(?)", (&name,))
                .unwrap()
                .flatten()
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while owner(&mut admin).is_none() && std::time::Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
        let session = owner(&mut admin).expect("the holder took the key's named lock");
        // The named-lock connection goes; the holder learns of it only at its next call.
        admin.exec_drop("KILL ?", (session,)).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while owner(&mut admin).is_some() && std::time::Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
        assert!(
            owner(&mut admin).is_none(),
            "the killed session kept the name"
        );
        let waiter = f.builder().idle_between_tries(SLOW_POLL).build().unwrap();
        let before = refused(&waiter);
        let (granted, handle) = wait_for(waiter.clone(), "job");
        until_listening(&waiter, before);
        // The watcher's first `GET_LOCK` finds the name free and reports it: one more try,
        // which a busy machine may delay past `until_listening` (or none, when the report
        // came before the subscription's own try was sent). From then on the watcher finds
        // the name free at every probe (100 ms apart or less) and the row held, and must
        // not make the waiter try again.
        let tries = waiter.statistics().acquires;
        thread::sleep(Duration::from_secs(4));
        assert!(
            waiter.statistics().acquires <= tries + 1,
            "the waiter tried {} times while the row stayed held",
            waiter.statistics().acquires - tries
        );
        guard.unlock().unwrap();
        assert!(
            set_within(&granted, WOKEN_WITHIN),
            "the waiter slept until its next poll"
        );
        handle.join().unwrap();
    }

    /// `unlock_keeping_for` ends the lease but leaves the row held: the holder lets its named
    /// lock go rather than keep it as long as the registry lives.
    #[test]
    fn a_release_keeping_the_row_lets_the_named_lock_go() {
        let Some(f) = Fixture::new(Db::Mysql, "notify_keep_for") else {
            return;
        };
        let name = lock_name(&f, "job");
        let mut admin =
            mysql::Conn::new(mysql::Opts::from_url(&common::mysql_url()).unwrap()).unwrap();
        let used = |admin: &mut mysql::Conn| named_lock_used(admin, &name);
        let holder = f.registry();
        let guard = holder.obtain("job").unwrap().lock().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !used(&mut admin) && std::time::Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
        assert!(used(&mut admin), "the holder took the key's named lock");
        guard.unlock_keeping_for(Duration::from_secs(60)).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while used(&mut admin) && std::time::Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        assert!(!used(&mut admin), "the named lock outlived the lease");
        assert!(
            holder.holder("job").unwrap().is_some(),
            "the row stays held"
        );
    }
}
