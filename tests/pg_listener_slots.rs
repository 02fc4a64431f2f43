//! PostgreSQL's release listener never takes one of a server's last free connection slots:
//! before it connects it reads, through the registry's pool and under an advisory lock that
//! the listeners of the database take one at a time, `max_connections`, the reserved slots and
//! the connections open, and connects only while a tenth of the slots (at least 5) stay free
//! beside it; otherwise it says why once in a warning, and the registry's waiters poll.
//!
//! One test fills the shared server for a few seconds, leaving a few slots beside the spare,
//! and starts many registries at once. The others leave its slots alone: the fail point
//! `postgres::listener_slots_taken` adds phantom connections to the live count the listener
//! reads: as many as the server has free slots now, which leaves it none.

#![cfg(all(feature = "postgres", feature = "failpoints"))]

mod common;

use common::{postgres_url, Db, Fixture};
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

/// A connection of the test's own. Each test opens the one it reads the server's state on
/// (the admin connection) before it fills any slot, and keeps it: a connection opened while the
/// server is full would be refused.
fn admin() -> postgres::Client {
    postgres::Client::connect(&postgres_url(), postgres::NoTls).expect("PostgreSQL")
}

/// How many sessions `LISTEN` on `f`'s table now.
fn listening(admin: &mut postgres::Client, f: &Fixture) -> i64 {
    let query = format!("LISTEN \"{}\"", f.table().to_ascii_lowercase());
    admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE query = $1",
            &[&query],
        )
        .unwrap()
        .get(0)
}

/// The server's free connection slots now, for ordinary users.
fn free_slots(admin: &mut postgres::Client) -> i64 {
    admin
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

/// What this binary logs: every warning, and every record, at any level, that names a
/// connection the server refused for want of a slot (the listener reports a refused
/// connection at debug level).
mod logs {
    use std::sync::Mutex;

    static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

    struct Keeper;

    /// Whether `text` says that the server refused a connection for want of a slot.
    pub fn refusal(text: &str) -> bool {
        text.contains("too many clients") || text.contains("remaining connection slots")
    }

    impl log::Log for Keeper {
        fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
            metadata.level() <= log::Level::Debug
        }
        fn log(&self, record: &log::Record<'_>) {
            if !self.enabled(record.metadata()) {
                return;
            }
            let text = record.args().to_string();
            if record.level() <= log::Level::Warn || refusal(&text) {
                SEEN.lock().unwrap_or_else(|e| e.into_inner()).push(text);
            }
        }
        fn flush(&self) {}
    }

    /// Starts keeping them (once per binary).
    pub fn keep() {
        if log::set_logger(&Keeper).is_ok() {
            log::set_max_level(log::LevelFilter::Debug);
        }
    }

    /// Those kept so far that `matches`.
    pub fn matching(matches: impl Fn(&str) -> bool) -> Vec<String> {
        SEEN.lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|text| matches(text))
            .cloned()
            .collect()
    }

    /// Those kept so far that contain `text`.
    pub fn containing(text: &str) -> Vec<String> {
        matching(|seen| seen.contains(text))
    }
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
fn wait_for_a_release(
    admin: &mut postgres::Client,
    f: &Fixture,
    poll: Duration,
) -> (i64, Duration) {
    let holder = f.registry();
    let waiter = f.builder().idle_between_tries(poll).build().unwrap();
    let held = holder.obtain("slots").unwrap().lock().unwrap();
    let lock = waiter.obtain("slots").unwrap();
    let waiting = std::thread::spawn(move || lock.try_lock_for(GENEROUS).unwrap().is_some());
    // The listener connects on the waiter's first sleep, probes, then listens.
    let mut most = 0;
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        most = most.max(listening(admin, f));
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
    let mut admin = admin();
    let (listeners, woken_after) = wait_for_a_release(&mut admin, &f, Duration::from_secs(60));
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
    logs::keep();
    let Some(f) = Fixture::new(Db::Postgres, "pgslotsfull") else {
        return;
    };
    let mut admin = admin();
    let said_before = logs::containing("connection slots free for ordinary users").len();
    let _fail_point = ClearOnDrop("postgres::listener_slots_taken");
    // Every slot free now is taken, as far as the listener can tell (plus the listener's).
    fail::cfg(
        "postgres::listener_slots_taken",
        &format!("return({})", free_slots(&mut admin)),
    )
    .unwrap();
    let (listeners, _) = wait_for_a_release(&mut admin, &f, Duration::from_millis(50));
    assert_eq!(listeners, 0, "a listener took one of the last free slots");
    let said = logs::containing("connection slots free for ordinary users");
    let said = &said[said_before..];
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].contains("max_connections"), "{}", said[0]);
}

/// The slots a listener leaves free (what the listener computes).
fn spare(admin: &mut postgres::Client) -> i64 {
    let row = admin
        .query_one(
            "SELECT CAST(current_setting('max_connections') AS INTEGER) \
             - CAST(current_setting('superuser_reserved_connections') AS INTEGER) \
             - COALESCE(CAST(NULLIF(current_setting('reserved_connections', true), '') AS INTEGER), 0)",
            &[],
        )
        .unwrap();
    (row.get::<_, i32>(0) as i64 / 10).max(5)
}

/// Connections of this test that take a server's slots, closed when dropped, however the
/// test ends.
struct Occupied {
    _held: Vec<postgres::Client>,
}

impl Occupied {
    /// Takes free slots until `left` are free (none if fewer are), as far as `admin` counts
    /// them; fewer when the server refuses one meanwhile (other clients took the rest).
    fn leaving(admin: &mut postgres::Client, left: i64) -> Occupied {
        let take = free_slots(admin) - left;
        Occupied {
            _held: (0..take.max(0))
                .map_while(|_| postgres::Client::connect(&postgres_url(), postgres::NoTls).ok())
                .collect(),
        }
    }
}

/// Holds every listener that is about to connect (fail point
/// `postgres::listener_before_connect`) until [`Gate::open`], so that they all start at once;
/// later ones pass. Removed when dropped.
struct Gate {
    state: std::sync::Arc<(std::sync::Mutex<(usize, bool)>, std::sync::Condvar)>,
    _clear: ClearOnDrop,
}

impl Gate {
    fn new() -> Gate {
        let state =
            std::sync::Arc::new((std::sync::Mutex::new((0, false)), std::sync::Condvar::new()));
        let held = std::sync::Arc::clone(&state);
        fail::cfg_callback("postgres::listener_before_connect", move || {
            let (lock, changed) = &*held;
            let mut state = lock.lock().unwrap();
            state.0 += 1;
            changed.notify_all();
            let _ = changed
                .wait_timeout_while(state, GENEROUS, |(_, open)| !*open)
                .unwrap();
        })
        .unwrap();
        Gate {
            state,
            _clear: ClearOnDrop("postgres::listener_before_connect"),
        }
    }

    /// Waits until `listeners` are held (at most [`GENEROUS`]), then lets them all go; how many
    /// were held.
    fn open(&self, listeners: usize) -> usize {
        let (lock, changed) = &*self.state;
        let mut state = changed
            .wait_timeout_while(lock.lock().unwrap(), GENEROUS, |(arrived, _)| {
                *arrived < listeners
            })
            .unwrap()
            .0;
        state.1 = true;
        changed.notify_all();
        state.0
    }
}

/// Many registries through a PgBouncer, each with a direct `listener_url`, on a server that
/// has only a few slots free beside the listeners' spare: they build at once and wait for a
/// held key, and their listeners, held just before they connect until all are there, start at
/// once. No connection is refused for want of a slot (none of the listeners', nor anyone's
/// they could see), and every waiter gets the key once it is released, through polling where
/// it has no listener.
#[cfg(unix)]
#[test]
fn listeners_starting_together_never_make_the_server_refuse_a_connection() {
    use common::pgbouncer::PgBouncer;
    use leasehold::LockRegistry;
    use std::sync::{Arc, Barrier};

    /// Registries that start together.
    const REGISTRIES: usize = 60;
    /// The PgBouncer's server connections.
    const BOUNCER: u32 = 2;
    /// Free slots beside the spare and the PgBouncer's, for listeners.
    const ROOM: i64 = 3;

    let _alone = one_at_a_time();
    logs::keep();
    let Some(f) = Fixture::new(Db::Postgres, "pgslotsstart") else {
        return;
    };
    let Some(bouncer) = PgBouncer::start(BOUNCER) else {
        return;
    };
    let mut admin = admin();
    let builder = || {
        LockRegistry::postgres(bouncer.url())
            .prefix(f.prefix.clone())
            .listener_url(postgres_url())
            .idle_between_tries(Duration::from_millis(100))
            .connect_timeout(Duration::from_secs(15))
    };
    let holder = builder().notifications(false).build().unwrap();
    let held = holder.obtain("start").unwrap().lock().unwrap();
    let refusals_before = logs::matching(logs::refusal).len();
    let listeners_full = "connection slots free for ordinary users";
    let full_before = logs::containing(listeners_full).len();

    // Every other slot is taken, for the few seconds of the test only.
    let gate = Gate::new();
    let spare = spare(&mut admin);
    let occupied = Occupied::leaving(&mut admin, spare + ROOM + i64::from(BOUNCER));
    let start = Arc::new(Barrier::new(REGISTRIES + 1));
    let waiters: Vec<_> = (0..REGISTRIES)
        .map(|_| {
            let start = Arc::clone(&start);
            let builder = builder();
            std::thread::spawn(move || {
                start.wait();
                let registry = builder.build().expect("built");
                let lock = registry.obtain("start").unwrap();
                let guard = lock.try_lock_for(GENEROUS * 2).unwrap();
                guard.expect("granted").unlock().unwrap();
            })
        })
        .collect();
    start.wait();
    let free_at_start = free_slots(&mut admin);
    let held_at_once = gate.open(REGISTRIES);
    assert_eq!(
        held_at_once, REGISTRIES,
        "not every listener came to connect"
    );
    // Every listener decides: it listens, or it found no room and said so once (or the
    // server refused a connection, which fails the test below: the slots are given back now).
    let give_up = Instant::now() + GENEROUS;
    let (mut listeners, mut full) = (0, 0);
    while Instant::now() < give_up {
        full = logs::containing(listeners_full).len() - full_before;
        listeners = listening(&mut admin, &f);
        if listeners + full as i64 >= REGISTRIES as i64
            || logs::matching(logs::refusal).len() > refusals_before
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(occupied);
    held.unlock().unwrap();
    for waiter in waiters {
        waiter.join().expect("a waiter got the key");
    }
    let refused: Vec<_> = logs::matching(logs::refusal)
        .into_iter()
        .skip(refusals_before)
        .collect();
    assert!(
        refused.is_empty(),
        "{} connections were refused, the first: {}",
        refused.len(),
        refused[0]
    );
    assert!(
        listeners + full as i64 >= REGISTRIES as i64,
        "only {listeners} listeners listened and {full} found no room, of {REGISTRIES}"
    );
    println!(
        "{listeners} of {REGISTRIES} registries listened, {full} found no room ({free_at_start} \
         slots free, {spare} spare, when they started); the others polled"
    );
}
