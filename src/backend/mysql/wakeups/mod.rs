//! MySQL / MariaDB release wake-ups through the server's named locks (`GET_LOCK`).
//!
//! MySQL has no notifications, but a session blocked in `GET_LOCK(name, timeout)` returns the
//! moment the session holding `name` lets it go. So:
//!
//! - **Holders** (one *named-lock connection* per registry, opened when the registry first
//!   holds a lock and closed after `idle_connection_timeout` without one): once a lease has
//!   lasted [`TAKE_DELAY`] (2 ms), the registry takes the key's named lock on that connection
//!   (`GET_LOCK(name, 0.05)`, in the background, never delaying the lock call; tried again
//!   every 100 ms while the lease lasts if a watcher held it for an instant or the connection
//!   failed); after the release statement committed it lets it go (`RELEASE_LOCK`). A lease
//!   released sooner never takes it: an uncontended `lock()` + `unlock()` costs no named-lock
//!   statement, and its waiters elsewhere learn of the release from the row (below). The
//!   named-lock thread does not wake for every grant: it glances at the young leases on a
//!   timer that backs off from 2 ms to [`MAX_GLANCE`] (16 ms) while the glances find none
//!   that lasted (see `Holder::run`), so while this registry's leases come and go faster
//!   than [`TAKE_DELAY`] a longer one is named up to [`MAX_GLANCE`] after its grant. A session
//!   may hold many named locks, so one connection serves every lease of the registry. A
//!   release that ends a turn (see "Bounded turn" in `lock.rs`) keeps the
//!   named lock for [`QUIET_HOLD`], so that the instances it stepped aside for — pollers,
//!   Spring Integration — get there first.
//! - **Waiters** (the registry's listener, only while one of its threads waits, as on
//!   PostgreSQL; see [`crate::wakeups`]): one *watcher* thread with its own connection per
//!   key that a thread of the registry waits for, at most [`MAX_WATCHED_KEYS`] per registry
//!   (beyond that, waiters poll). A watcher blocks in `GET_LOCK(name, 1)`; when that returns 1
//!   it reads the key's row ([`look_sql`]) and, if it shows a release newer than the
//!   watcher's previous `GET_LOCK` and than the release it reported last, tells the registry
//!   (which tries the row at once); then it lets the
//!   name go. The row decides, never how long `GET_LOCK` took: another watcher holding the
//!   name for an instant is no release, and on a busy machine an instant answer can be slow.
//!
//! The row stays the only judge of who holds the lock: a wake-up only makes a waiter try
//! sooner. When nobody holds the named lock (a lease younger than [`TAKE_DELAY`], a holder
//! whose named-lock connection failed or that crashed — its session ended — a Spring
//! Integration holder, a holder whose `GET_LOCK` lost a race), `GET_LOCK` returns at once.
//! What the watcher does then depends on the row:
//!
//! ```text
//!                 GET_LOCK answered at once, and the row is held
//!   blocking ─────────────────────────────────────────────────────► looking
//!   GET_LOCK(name, 1)                                               one SELECT of the row
//!      ▲  ▲                                                         every LOOK or more
//!      │  └──────────────── the holder took its name ──────────────────┤
//!      └──── the row released, deleted or run out: reported ───────────┘
//! ```
//!
//! - *Blocking*: a release found on the row is reported if it is new (see above); a row
//!   that is gone, or held but run out, is reported if the watcher saw it held since its last
//!   report. Two answers are reported before the look as well: the very first `GET_LOCK` (it
//!   may follow a release), and a `GET_LOCK` that returns 1 after the watcher saw the name
//!   held by another session (a look found it named, or a `GET_LOCK` timed out) — that
//!   session let it go: a release, the end of a quiet hold, or the session ended. A waiting
//!   registry thus hears of a named holder's release one round trip sooner. The look after
//!   such a report reports again a key it finds free — a release since the previous
//!   `GET_LOCK` not reported yet, and after the very first answer any release, deletion or
//!   expiry —, since the attempt the report caused may have been refused just before the row
//!   changed. Each name let go costs the waiting registry at most two attempts that the row
//!   refuses.
//! - *Looking* (the row is held without its named lock): the watcher no longer takes the
//!   name; every [`LOOK`] (4 ms) it reads the row and whether anyone holds the name
//!   (`IS_USED_LOCK`), one statement on its own connection. A holder that takes its name (a
//!   leasehold lease that lasted) sends it back to blocking. A row that is deleted (Spring
//!   Integration's unlock), runs out (a holder that stopped renewing) or is released is
//!   reported at once. While the row stays exactly as it was (same holder, grant and expiry)
//!   for [`ACTIVE`] (50 ms), the pause doubles up to [`MAX_BACKOFF`]; any change (Spring
//!   Integration deletes and inserts its row for each lock) starts it again at [`LOOK`].
//!
//! So a Spring Integration holder's unlock reaches leasehold's waiters within a few
//! milliseconds — Spring inserts its row again for its next lock right after the delete, and
//! whoever tries first in between gets the key — at the price of about 250 primary-key reads a
//! second per watched key (at most [`MAX_WATCHED_KEYS`] a registry) while such a holder keeps
//! taking and letting go of it (10 a second once the holder keeps the row unchanged).
//!
//! A name is `lh1:` and the MD5 of (table, region, `LOCK_KEY`) in hex: 36 characters, under
//! MySQL's limit of 64. Names are server-wide; keys of two databases on one server sharing a
//! name cost an extra attempt, nothing more.

use super::MysqlManager;
use crate::backend::{ListenerEvent, ListenerHandler, ListenerReply};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use mysql::prelude::Queryable;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Keys one registry watches at once.
pub(crate) const MAX_WATCHED_KEYS: usize = 16;
/// How long a quiet release (the end of a fair turn) keeps the named lock.
pub(crate) const QUIET_HOLD: Duration = Duration::from_millis(250);
/// How long a holder waits for a named lock that a watcher holds for an instant.
const TAKE_WAIT: &str = "0.05";
/// How long a lease lasts before its holder takes the key's named lock.
pub(crate) const TAKE_DELAY: Duration = Duration::from_millis(2);
/// The longest pause of the named-lock thread between two glances at the young grants that
/// found none due (see [`Holder::run`]): the latest a lease is named after its grant.
const MAX_GLANCE: Duration = Duration::from_millis(16);
/// The longest pause of a watcher between `GET_LOCK`s that returned at once.
const MAX_BACKOFF: Duration = Duration::from_millis(100);
/// One blocking `GET_LOCK` of a watcher, in seconds: how soon it notices it is not needed.
const WATCH_SLICE: &str = "1";

/// The named lock of a key.
pub(crate) fn lock_name(table: &str, region: &str, lock_key: &str) -> String {
    use md5::{Digest, Md5};
    let mut hasher = Md5::new();
    for part in [table, region, lock_key] {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    let digest = hasher.finalize();
    let mut name = String::with_capacity(36);
    name.push_str("lh1:");
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for byte in digest.iter() {
        name.push(char::from(HEX[usize::from(byte >> 4)]));
        name.push(char::from(HEX[usize::from(byte & 15)]));
    }
    name
}

/// What the registry's threads leave for its named-lock thread, under one mutex (never held
/// during a statement: a caller's `take` or `drop_after` never waits for the server).
#[derive(Default)]
struct Pending {
    /// Grants the thread has not seen yet, with the instant their name is due to be taken
    /// (the grant + [`TAKE_DELAY`]). A lease that ends before the thread gets to it is simply
    /// removed: it costs no statement and no wake-up of the thread.
    young: HashMap<String, Instant>,
    /// Ended leases whose grant the thread had seen: let the name go after the delay.
    ended: Vec<(String, Duration)>,
    /// `Some(at)`: the thread looks at [`Pending::young`] by `at` without being told (it is
    /// *glancing*, see [`Holder::run`]), so a grant need not wake it. `None`: it sleeps until
    /// notified (or until a timer of its own that may be far off), and a grant wakes it.
    glance: Option<Instant>,
    /// Leases that ended unseen (shorter than [`TAKE_DELAY`]) since the thread's last look:
    /// while there are such, it keeps glancing, backing off.
    short: u64,
    /// The registry is gone: the thread ends.
    stopped: bool,
    /// How often the thread has looked at the map (tests count its wake-ups with it).
    looks: u64,
    /// How many names it took.
    taken: u64,
}

struct Shared {
    pending: parking_lot::Mutex<Pending>,
    changed: parking_lot::Condvar,
}

/// The holder side of one registry: a thread with the named-lock connection.
pub(crate) struct NamedLocks {
    shared: Arc<Shared>,
}

impl NamedLocks {
    /// Starts the named-lock thread; it ends when the `NamedLocks` is dropped.
    pub fn start(manager: MysqlManager, idle_timeout: Duration) -> NamedLocks {
        let shared = Arc::new(Shared {
            pending: parking_lot::Mutex::new(Pending::default()),
            changed: parking_lot::Condvar::new(),
        });
        let holder = Holder {
            manager,
            idle_timeout,
            conn: None,
            names: HashMap::new(),
        };
        let theirs = Arc::clone(&shared);
        let _ = std::thread::Builder::new()
            .name("leasehold-names".into())
            .spawn(move || holder.run(&theirs));
        NamedLocks { shared }
    }

    /// A lease on the key of `name` was granted.
    pub fn take(&self, name: String) {
        let now = Instant::now();
        let mut pending = self.shared.pending.lock();
        pending.young.entry(name).or_insert(now + TAKE_DELAY);
        if pending.glance.is_none() {
            // The thread sleeps until told: tell it, and mark that it will look (so the next
            // grant, a moment later, does not wake it again).
            pending.glance = Some(now + TAKE_DELAY);
            self.shared.changed.notify_one();
        }
    }

    /// A lease on the key of `name` ended (released, lost, or handed on quietly with `delay`).
    pub fn drop_after(&self, name: String, delay: Duration) {
        let mut pending = self.shared.pending.lock();
        if pending.young.remove(&name).is_none() {
            pending.ended.push((name, delay));
            self.shared.changed.notify_one();
        } else {
            pending.short += 1;
        }
    }
}

impl Drop for NamedLocks {
    fn drop(&mut self) {
        self.shared.pending.lock().stopped = true;
        self.shared.changed.notify_one();
    }
}

struct Holder {
    manager: MysqlManager,
    idle_timeout: Duration,
    conn: Option<mysql::Conn>,
    /// The names of the keys this registry holds.
    names: HashMap<String, Name>,
}

/// Where one key's named lock stands.
#[derive(Debug, Clone, Copy)]
enum Name {
    /// Taken on the connection; `Some(at)`: to be let go at `at`.
    Taken(Option<Instant>),
    /// Not taken yet (a watcher held it for an instant, or the connection failed): tried
    /// again at this instant, for as long as the lease lasts. Until then, other instances'
    /// watchers find it free and learn of the release from the row, at their next back-off
    /// step (as for a lease younger than [`TAKE_DELAY`], whose grant is still in
    /// [`Pending::young`]).
    Wanted(Instant),
}

/// How soon a named lock that could not be taken is tried again.
const RETRY_TAKE: Duration = Duration::from_millis(100);

impl Holder {
    /// The thread. It wakes when told (a grant while it was not glancing, an ended lease
    /// whose name it took, the registry gone) and at the earliest of its own instants: a
    /// name to let go or to try again, the connection's idle timeout, and its next *glance*
    /// at the young grants. It glances while leases come and go: a look that finds a grant
    /// due takes its name, and the next glance comes at the next grant's due; a look that
    /// finds leases that ended unseen (shorter than [`TAKE_DELAY`]) doubles the pause
    /// before the next glance, up to [`MAX_GLANCE`]; a look that finds no grant since the
    /// previous one ends the glancing (the pause starts afresh at [`TAKE_DELAY`]), and the
    /// next grant wakes the thread. So a registry that locks and unlocks in a loop, every
    /// lease shorter than [`TAKE_DELAY`], wakes the thread about once per [`MAX_GLANCE`]
    /// (grants do not wake it while it glances), a lease that follows a quiet spell or a
    /// lease that lasted is named [`TAKE_DELAY`] after its grant, and one that follows
    /// short leases at most [`MAX_GLANCE`] after it.
    fn run(mut self, shared: &Shared) {
        let mut idle_since = Instant::now();
        let mut pause = TAKE_DELAY;
        loop {
            // What came in, taken under the mutex; the statements run after it is let go.
            let (ended, due) = {
                let mut pending = shared.pending.lock();
                loop {
                    if pending.stopped {
                        return;
                    }
                    pending.looks += 1;
                    let now = Instant::now();
                    let due: Vec<String> = pending
                        .young
                        .iter()
                        .filter(|(_, at)| **at <= now)
                        .map(|(name, _)| name.clone())
                        .collect();
                    for name in &due {
                        pending.young.remove(name);
                    }
                    let own = self
                        .names
                        .values()
                        .filter_map(|name| match *name {
                            Name::Taken(at) => at,
                            Name::Wanted(at) => Some(at),
                        })
                        .min();
                    if !due.is_empty() {
                        pause = TAKE_DELAY;
                        pending.taken += due.len() as u64;
                    }
                    if !due.is_empty()
                        || !pending.ended.is_empty()
                        || own.is_some_and(|at| at <= now)
                    {
                        // Glancing goes on: the statements run first, then the thread looks
                        // again without waiting for a grant to tell it.
                        pending.glance = Some(now);
                        break (std::mem::take(&mut pending.ended), due);
                    }
                    // Nothing due: when to look again. Back off while leases end unseen;
                    // stop glancing (start afresh) when none came since the last look.
                    let short = std::mem::take(&mut pending.short);
                    if short > 0 {
                        pause = (pause * 2).min(MAX_GLANCE);
                    }
                    let glance = match pending.young.values().min().copied() {
                        Some(first) => Some(first.max(now + pause.saturating_sub(TAKE_DELAY))),
                        None if short > 0 => Some(now + pause),
                        None => {
                            pause = TAKE_DELAY;
                            None
                        }
                    };
                    pending.glance = glance;
                    let idle = (self.conn.is_some() && self.names.is_empty())
                        .then(|| idle_since + self.idle_timeout);
                    let next = [own, glance, idle].into_iter().flatten().min();
                    match next {
                        Some(at) if at <= now => break (Vec::new(), Vec::new()),
                        Some(at) => {
                            shared.changed.wait_until(&mut pending, at);
                        }
                        None => shared.changed.wait(&mut pending),
                    }
                }
            };
            for (name, delay) in ended {
                match self.names.get(&name).copied() {
                    Some(Name::Taken(_)) => {
                        self.names
                            .insert(name, Name::Taken(Some(Instant::now() + delay)));
                    }
                    Some(Name::Wanted(_)) => {
                        self.names.remove(&name);
                    }
                    None => {}
                }
            }
            for name in due {
                match self.names.get(&name).copied() {
                    // Taken again before the drop came due (the key's next holder is this
                    // registry).
                    Some(Name::Taken(_)) => {
                        self.names.insert(name, Name::Taken(None));
                    }
                    _ => self.take(name),
                }
            }
            let now = Instant::now();
            let own_due: Vec<(String, Name)> = self
                .names
                .iter()
                .filter(|(_, name)| match **name {
                    Name::Taken(at) => at.is_some_and(|at| at <= now),
                    Name::Wanted(at) => at <= now,
                })
                .map(|(key, name)| (key.clone(), *name))
                .collect();
            for (key, name) in own_due {
                match name {
                    Name::Taken(_) => {
                        self.names.remove(&key);
                        self.call("RELEASE_LOCK", &key, "");
                    }
                    Name::Wanted(_) => self.take(key),
                }
            }
            if self.names.is_empty() {
                if self.conn.is_some() && now >= idle_since + self.idle_timeout {
                    self.conn = None;
                }
            } else {
                idle_since = now;
            }
        }
    }

    /// Takes `name`, or marks it wanted when it cannot be taken now.
    fn take(&mut self, name: String) {
        let state = if self.call("GET_LOCK", &name, TAKE_WAIT) == Some(1) {
            Name::Taken(None)
        } else {
            Name::Wanted(Instant::now() + RETRY_TAKE)
        };
        self.names.insert(name, state);
    }

    /// Runs `SELECT function(name[, extra])`, opening the connection first when needed; a
    /// failure drops the connection (and with it, on the server, every name it held).
    fn call(&mut self, function: &str, name: &str, extra: &str) -> Option<i64> {
        if self.conn.is_none() {
            match self.manager.open_side_connection() {
                Ok(conn) => self.conn = Some(conn),
                Err(e) => {
                    log::debug!("MySQL named-lock connection: {e}");
                    return None;
                }
            }
        }
        let conn = self.conn.as_mut()?;
        let sql = if extra.is_empty() {
            format!("SELECT {function}(?)")
        } else {
            format!("SELECT {function}(?, {extra})")
        };
        match conn.exec_first::<Option<i64>, _, _>(sql, (name,)) {
            Ok(value) => value.flatten(),
            Err(e) => {
                log::debug!("MySQL named lock {name}: {e}");
                // The server let go of every name this session held: take them again.
                self.conn = None;
                let again = Instant::now() + RETRY_TAKE;
                for state in self.names.values_mut() {
                    if let Name::Taken(None) = state {
                        *state = Name::Wanted(again);
                    }
                }
                None
            }
        }
    }
}

/// Starts the listener (the waiter side) of a registry; see the module docs.
pub(crate) fn listen(
    manager: MysqlManager,
    table: String,
    region: String,
    handler: ListenerHandler,
    requests: Receiver<()>,
) -> bool {
    let listener = Listener {
        manager,
        table,
        region,
        handler,
        requests,
        watchers: HashMap::new(),
    };
    crate::backend::listener::spawn_listener("MySQL", move || listener.run())
}

struct Listener {
    manager: MysqlManager,
    table: String,
    region: String,
    handler: ListenerHandler,
    requests: Receiver<()>,
    /// The watcher of each watched `LOCK_KEY`: setting the flag stops it.
    watchers: HashMap<String, Arc<AtomicBool>>,
}

impl Listener {
    /// How often a subscribed listener reports a tick.
    const TICK: Duration = Duration::from_secs(1);

    fn run(mut self) {
        while self.requests.recv().is_ok() {
            while self.requests.try_recv().is_ok() {}
            if (self.handler)(ListenerEvent::Subscribed) == ListenerReply::Stop {
                return;
            }
            let mut next_tick = Instant::now() + Self::TICK;
            let stop = loop {
                self.reconcile();
                let now = Instant::now();
                if now >= next_tick {
                    next_tick = now + Self::TICK;
                    match (self.handler)(ListenerEvent::Tick) {
                        ListenerReply::Keep => {}
                        ListenerReply::Unsubscribe => break false,
                        ListenerReply::Stop => break true,
                    }
                }
                // A request while subscribed: a thread started waiting for another key.
                match self
                    .requests
                    .recv_timeout(next_tick.saturating_duration_since(Instant::now()))
                {
                    Ok(()) | Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => break true,
                }
            };
            for (_, stop) in self.watchers.drain() {
                stop.store(true, Ordering::Release);
            }
            if stop {
                return;
            }
        }
    }

    /// Starts a watcher for every newly watched key (up to the bound) and stops those whose
    /// key nobody waits for any more.
    fn reconcile(&mut self) {
        let watched = std::cell::RefCell::new(Vec::new());
        let each = |lock_key: &str| watched.borrow_mut().push(lock_key.to_string());
        (self.handler)(ListenerEvent::Watched { each: &each });
        let watched = watched.into_inner();
        self.watchers.retain(|lock_key, stop| {
            let keep = watched.contains(lock_key);
            if !keep {
                stop.store(true, Ordering::Release);
            }
            keep
        });
        for lock_key in watched {
            if self.watchers.len() >= MAX_WATCHED_KEYS {
                break;
            }
            if self.watchers.contains_key(&lock_key) {
                continue;
            }
            let stop = Arc::new(AtomicBool::new(false));
            let watcher = Watcher {
                manager: self.manager.clone(),
                name: lock_name(&self.table, &self.region, &lock_key),
                look: look_sql(&self.table),
                region: self.region.clone(),
                lock_key: lock_key.clone(),
                handler: Arc::clone(&self.handler),
                stop: Arc::clone(&stop),
            };
            let spawned = std::thread::Builder::new()
                .name("leasehold-watch".into())
                .spawn(move || watcher.run());
            if spawned.is_ok() {
                self.watchers.insert(lock_key, stop);
            }
        }
    }
}

/// A key's last release, read off its row (see [`look_sql`]).
#[derive(Debug, Clone, Copy)]
struct Release {
    /// How long ago it was, on the server's clock.
    since: Duration,
    /// When it was (µs after the epoch, the server's clock): tells one release from the next.
    at: i64,
}

/// A held row as one look saw it: its holder, grant time and expiry. Any change (another
/// grant, a renewal, Spring Integration's delete and insert between two looks) makes another.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Holding {
    client_id: Option<String>,
    created: Option<i64>,
    expires: Option<i64>,
}

/// What one look at a key's row found.
#[derive(Debug)]
enum Row {
    /// No row: it was never inserted, or it was deleted (Spring Integration's unlock, an
    /// operator's cleanup). Nobody holds the key.
    Gone,
    /// Released by leasehold (`CLIENT_ID` is NULL): the release, or `None` while the row is
    /// still reserved for pollers (a quiet release's time lies ahead).
    Released(Option<Release>),
    /// Held. `expired`: its time-to-live ran out (and no reservation holds it), so a grant
    /// takes it over. `named`: some session holds the key's named lock (a leasehold holder
    /// announces its release through it; at the look after a `GET_LOCK` of the watcher's own
    /// it is the watcher itself).
    Held {
        holding: Holding,
        expired: bool,
        named: bool,
    },
}

/// Blocks on one key's named lock and reports its releases.
struct Watcher {
    manager: MysqlManager,
    name: String,
    /// See [`look_sql`].
    look: String,
    region: String,
    lock_key: String,
    handler: ListenerHandler,
    stop: Arc<AtomicBool>,
}

/// One look at a key's row, with whether its named lock is held. A release stores its own
/// time in `CREATED_DATE` — or, for a release that ends a turn, the end of the row's
/// reservation for pollers, a time to come. Returns (released, expiry, time since the release
/// or grant, the release's or grant's time, expired, named, holder), times in µs after the
/// epoch; no row when there is none.
fn look_sql(table: &str) -> String {
    format!(
        "SELECT CLIENT_ID IS NULL, \
         TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', EXPIRED_AFTER), \
         TIMESTAMPDIFF(MICROSECOND, CREATED_DATE, UTC_TIMESTAMP(6)), \
         TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', CREATED_DATE), \
         EXPIRED_AFTER < UTC_TIMESTAMP(6) AND CREATED_DATE <= UTC_TIMESTAMP(6), \
         IS_USED_LOCK(?) IS NOT NULL, CLIENT_ID \
         FROM {table} WHERE LOCK_KEY = ? AND REGION = ?"
    )
}

/// How much older than a watcher's previous `GET_LOCK` a release found on the row may be and
/// still be reported (the server's clock against this host's, and the statements between).
const RELEASE_SLACK: Duration = Duration::from_millis(5);

/// The pause between a watcher's looks at a row held without its named lock (a Spring
/// Integration holder, a lease younger than [`TAKE_DELAY`]) while the row keeps changing.
const LOOK: Duration = Duration::from_millis(4);

/// A held row unchanged for this long is no longer looked at every [`LOOK`]: the pause
/// doubles up to [`MAX_BACKOFF`] (a long hold, a crashed holder's row running out).
const ACTIVE: Duration = Duration::from_millis(50);

impl Watcher {
    /// Looks at the key's row; `None` when it could not be read.
    fn look(&self, conn: &mut mysql::Conn) -> Option<Row> {
        type Columns = (
            Option<bool>,
            Option<i64>,
            Option<i64>,
            Option<i64>,
            Option<bool>,
            Option<bool>,
            Option<String>,
        );
        let read = conn.exec_first::<Columns, _, _>(
            self.look.as_str(),
            (&self.name, &self.lock_key, &self.region),
        );
        let Some((released, expires, since, created, expired, named, client_id)) = read.ok()?
        else {
            return Some(Row::Gone);
        };
        if released == Some(true) {
            let release = match (since.map(u64::try_from), created) {
                (Some(Ok(since)), Some(at)) => Some(Release {
                    since: Duration::from_micros(since),
                    at,
                }),
                _ => None,
            };
            return Some(Row::Released(release));
        }
        Some(Row::Held {
            holding: Holding {
                client_id,
                created,
                expires,
            },
            expired: expired == Some(true),
            named: named == Some(true),
        })
    }

    /// Tells the registry that the key may be free; `false` when the registry is gone.
    fn report(&self) -> bool {
        let event = ListenerEvent::Released {
            lock_key: &self.lock_key,
        };
        (self.handler)(event) != ListenerReply::Stop
    }

    fn run(self) {
        let mut conn: Option<mysql::Conn> = None;
        let mut first = true;
        let mut backoff = Duration::ZERO;
        // When the previous `GET_LOCK` began: a release since then, found on the row although
        // the name was free, is one this watcher has not reported...
        let mut previous = Instant::now();
        // ... unless it is the one reported last.
        let mut reported: Option<i64> = None;
        // A holder was seen since the last report: the row gone, or run out, is news.
        let mut held_since_report = false;
        // The row as last seen held without its named lock, and when it last changed: while
        // this is set the watcher *looks* at the row every `LOOK` instead of blocking in
        // `GET_LOCK`, which returns at once for such a holder.
        let mut unnamed: Option<(Holding, Instant)> = None;
        // The watcher last saw the key's name held by another session (a look found it
        // named, or a `GET_LOCK` timed out): the next `GET_LOCK` that returns 1 means that
        // session let it go, and is reported before the look.
        let mut named_elsewhere = false;
        let get = format!("SELECT GET_LOCK(?, {WATCH_SLICE})");
        while !self.stop.load(Ordering::Acquire) {
            if conn.is_none() {
                match self.manager.open_side_connection() {
                    Ok(opened) => conn = Some(opened),
                    Err(e) => {
                        log::debug!("MySQL release watcher: {e}");
                        std::thread::sleep(MAX_BACKOFF);
                        continue;
                    }
                }
            }
            let Some(open) = conn.as_mut() else { continue };
            if let Some((seen, changed)) = unnamed.take() {
                // Looking: one statement a look, no named lock taken.
                std::thread::sleep(backoff);
                match self.look(open) {
                    None => {
                        conn = None;
                        continue;
                    }
                    // The holder took its name (a leasehold lease that lasted): block on it.
                    Some(Row::Held { named: true, .. }) => {
                        named_elsewhere = true;
                        continue;
                    }
                    Some(Row::Held {
                        holding,
                        expired: false,
                        ..
                    }) => {
                        if holding != seen {
                            backoff = LOOK;
                            unnamed = Some((holding, Instant::now()));
                        } else {
                            if changed.elapsed() >= ACTIVE {
                                backoff = (backoff * 2).min(MAX_BACKOFF);
                            }
                            unnamed = Some((seen, changed));
                        }
                        continue;
                    }
                    // Deleted (Spring Integration's unlock) or run out: nobody holds it.
                    Some(Row::Gone) | Some(Row::Held { expired: true, .. }) => {}
                    // Released by its holder: reported unless it was already, or it is a
                    // quiet release whose reservation for pollers lasts (back to blocking).
                    Some(Row::Released(Some(release))) if reported != Some(release.at) => {
                        reported = Some(release.at);
                    }
                    Some(Row::Released(_)) => continue,
                }
                held_since_report = false;
                backoff = Duration::ZERO;
                if !self.report() {
                    return;
                }
                continue;
            }
            let started = Instant::now();
            let got = open.exec_first::<Option<i64>, _, _>(get.as_str(), (&self.name,));
            let since_previous = std::mem::replace(&mut previous, started).elapsed();
            match got {
                Ok(Some(Some(1))) => {
                    // The name was let go, or was free (the holder had not taken it: a lease
                    // younger than `TAKE_DELAY`, a lost connection, a holder that crashed or
                    // is not leasehold), or another watcher held it for an instant: the row
                    // says whether a release came meanwhile. How long `GET_LOCK` took says
                    // nothing (a busy machine makes an instant answer slow). A name that
                    // another session held was let go, and the first answer may follow a
                    // release: both are reported before the look, and again by the look when
                    // it finds news (see the module docs).
                    let let_go = std::mem::take(&mut named_elsewhere) || first;
                    if let_go {
                        held_since_report = false;
                        if !self.report() {
                            return;
                        }
                    }
                    fail_point!("mysql::watcher_before_look");
                    let row = self.look(open);
                    let news = match &row {
                        Some(Row::Released(release)) => {
                            let unannounced = release.is_some_and(|r| {
                                r.since <= since_previous + RELEASE_SLACK && reported != Some(r.at)
                            });
                            if first || unannounced {
                                reported = release.map(|r| r.at);
                            }
                            first || unannounced
                        }
                        // Deleted, or run out, since a holder was seen.
                        Some(Row::Gone) | Some(Row::Held { expired: true, .. }) => {
                            first || held_since_report
                        }
                        // Held (reported already if this is the first answer).
                        Some(Row::Held { holding, .. }) => {
                            held_since_report = true;
                            // Held without its name: look at the row from now on.
                            unnamed = Some((holding.clone(), Instant::now()));
                            false
                        }
                        None => false,
                    };
                    first = false;
                    match news {
                        // Reported again after a report before the look: the attempt that
                        // one caused may have been refused just before the row changed.
                        true => {
                            held_since_report = false;
                            if !self.report() {
                                return;
                            }
                            backoff = Duration::ZERO;
                        }
                        false if unnamed.is_some() => backoff = LOOK,
                        false => {
                            backoff = (backoff * 2).max(Duration::from_millis(1)).min(MAX_BACKOFF)
                        }
                    }
                    if open
                        .exec_drop("SELECT RELEASE_LOCK(?)", (&self.name,))
                        .is_err()
                    {
                        conn = None;
                        unnamed = None;
                    }
                    if unnamed.is_none() && !backoff.is_zero() {
                        std::thread::sleep(backoff);
                    }
                }
                // Timed out: the holder still holds it.
                Ok(Some(Some(_))) => {
                    first = false;
                    held_since_report = true;
                    named_elsewhere = true;
                    fail_point!("mysql::watcher_name_held");
                }
                Ok(_) | Err(_) => {
                    conn = None;
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
