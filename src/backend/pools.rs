//! Connection pools and the first connection: how a store gets its connections.
//!
//! # Connections on demand
//!
//! A store has two pools, the main one (`pool_size`, for acquires, releases and manual renewals)
//! and the renewal pool (`renewal_pool_size`, for background renewals only). Neither opens a
//! connection ahead of need (`min_idle` 0): a pool opens one when a statement finds none idle,
//! up to its size, and closes one that has stayed idle for `idle_connection_timeout`. r2d2
//! looks for idle connections every 30 s (a fixed rate), so an idle connection closes between
//! the timeout and 30 s after it. A process holding one lock therefore keeps one renewal
//! connection (used every renewal period) and, until it times out, the main connection that
//! acquired it. On SQLite a connection is an open file (and its page cache), closed the same
//! way. No connection is replaced for its age alone.
//!
//! # Connections discarded while callers wait
//!
//! r2d2 wakes a caller waiting for a connection when one comes back healthy or a new one is
//! opened, and opens one only for a caller that finds the pool short (when it starts waiting,
//! or each time it is woken). A connection that comes back flagged broken is closed and its
//! slot freed, but no waiting caller is woken and nothing is opened in its place (with
//! `min_idle` 0): a caller that began waiting while the pool was full sleeps until its own
//! timeout, though the pool has room. That happens when the connection comes back from a
//! thread that is not itself waiting: a statement thread whose caller gave up at its deadline,
//! or a caller that returns at its deadline after a broken attempt (MySQL's socket timeout). So the pools here
//! count their waiting callers ([`Pool`]), and whoever drops a broken connection asks for a
//! replacement while any caller waits ([`Pool::discarded`]): the new connection wakes one.
//!
//! # The parked connection (SQLite)
//!
//! An r2d2 checkout and its return cost an uncontended SQLite `lock()` + `unlock()` about as
//! much as the rest of the registry's own work together (r2d2 reads the clock five times per
//! checkout and return, takes its lock twice, clones its pool handle and signals its condition
//! variable), against a statement of a few microseconds. So SQLite's main pool
//! ([`Backend::PARKS_CONNECTION`](super::Backend::PARKS_CONNECTION)) keeps the connection
//! given back last *parked*: still checked out of r2d2, in a slot of the pool ([`Pool`]: a
//! `parking_lot` mutex around an `Option` of it) that the next caller takes before asking r2d2.
//!
//! - **Who touches it.** Any caller thread of the registry: [`Pool::get_timeout`] and
//!   [`Pool::try_get`] take the parked connection if there is one; [`Pool::give_back`] parks a
//!   healthy connection when the slot is empty and nobody waits, and otherwise gives it to
//!   r2d2 as before. The slot's lock is held only to move the connection in or out, never
//!   during a statement. r2d2's timer threads run the idle check (below).
//! - **Pool size.** r2d2 counts the parked connection as checked out, so it still counts
//!   toward `pool_size`; at most one connection is parked, the others idle in r2d2 as before.
//! - **Waiting callers.** A caller that finds the slot empty counts itself waiting (`waiting`,
//!   raised under the slot's lock) before it enters r2d2's checkout, and a connection is parked
//!   only while that count is zero (read under the same lock): so while any caller waits in
//!   r2d2 (the pool is full, or a connection is being opened), every connection goes back to
//!   r2d2, which hands it to a waiter, and none sits parked while a caller sleeps.
//! - **Broken connections** are never parked: a connection whose attempt failed as broken, or
//!   was given up at its deadline, is flagged and dropped into r2d2, which closes it, as before.
//!   Discarding a pool's idle connections after a failure ([`super::retry`]) discards the
//!   parked one too (it comes first from [`Pool::try_get`]).
//! - **Idle timeout.** r2d2 cannot see a parked connection idle, so the pool's own job on
//!   r2d2's timer threads (the pool is given the same three threads r2d2 would start itself)
//!   looks at the slot every half `idle_timeout` (at most 15 s, at least 10 ms): a connection
//!   found parked and unused at enough looks in a row to cover `idle_timeout` is flagged broken
//!   and given back, and r2d2 closes it. So it closes between `idle_timeout` and 1.5 ×
//!   `idle_timeout` after its last use, or up to 30 s after it for timeouts of 30 s and more:
//!   within r2d2's own bound for its idle connections. Parking reads no clock (a flag marks
//!   that the slot was used since the last look). `max_lifetime` is off for every pool, so age
//!   alone never closes a connection, parked or not.
//! - **Shutdown.** The job holds the slot weakly; the registry's pools hold it strongly, so
//!   dropping them gives the parked connection back to r2d2, which closes it with the pool.
//!   The timer threads end with r2d2's pool, their last owner, at once (r2d2's own would
//!   first wait for their next scheduled run, up to 30 s).
//!
//! PostgreSQL's and MySQL's pools park nothing: a server may close a connection idle behind
//! the pool's back, and their round trips dwarf the checkout.
//!
//! # A full server
//!
//! A server that has no connection slot left (PostgreSQL's `max_connections`, or a role's
//! `CONNECTION LIMIT`: SQLSTATE 53300, "too many clients") refuses new connections, not
//! statements on open ones. So a grant secures the lease's renewals
//! ([`SqlStore::secure_renewal`]): when the renewal pool has no connection, the grant opens
//! one before it is handed out; if the server refuses it, the grant is released at once and the
//! caller gets an error naming the full server — a lease whose renewals could not run is never
//! handed out to expire later. The renewal connection then stays while renewals use it (every
//! renewal period, which must stay below `idle_connection_timeout`, as it does by default). A
//! connection that breaks is replaced by a new one, which a full server can still refuse; no
//! client can do better there. Wherever the refusal surfaces — `build()`'s first connection,
//! an acquire or a renewal that needed a new connection and timed out — the message names
//! "too many clients" and the fix ([`crate::error`]'s `TOO_MANY_CLIENTS_FIX`: a pooler,
//! `max_connections`, fewer connections), never "start the server".
//!
//! `build()` still fails fast on a wrong URL or an absent server: each backend opens one
//! direct connection first ([`first_connection`]; SQLite opens the file), and the table check
//! that follows runs on a pooled connection. A host name that does not resolve, or a server of
//! another kind at the URL's port (found by a look at what answers there, [`look_at`]), fails
//! it at once; a server that refuses connections (it may be starting) is tried again until
//! `connect_timeout`.

use super::{Backend, Grant, SqlStore, Store};
#[cfg(any(feature = "postgres", feature = "mysql"))]
use super::{Failure, FailureKind};
use crate::error::{Error, Result, TOO_MANY_CLIENTS, TOO_MANY_CLIENTS_FIX};
use parking_lot::Mutex;
use scheduled_thread_pool::{OnPoolDropBehavior, ScheduledThreadPool};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Pool settings shared by every backend.
#[derive(Debug, Clone)]
pub(crate) struct PoolSettings {
    pub pool_size: u32,
    /// Connections of the renewal pool.
    pub renewal_pool_size: u32,
    /// A pooled connection idle this long is closed (and the PostgreSQL listener's, unsubscribed
    /// this long).
    pub idle_timeout: Duration,
    pub connect_timeout: Duration,
    /// The registry's `operation_timeout`: the usual deadline of one statement.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub operation_timeout: Duration,
    /// PostgreSQL: whether connections prepare named statements and keep them
    /// (`RegistryBuilder::prepared_statements`); `None`: each connection decides.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub prepared_statements: Option<bool>,
    /// PostgreSQL: where the release listener connects instead of the registry's URL
    /// (`RegistryBuilder::listener_url`).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub listener_url: Option<String>,
}

/// A pool of at most `size` connections from `manager`, opened on demand (see the module docs):
/// it opens none now. A connection lives until it breaks or stays idle too long, never
/// replaced for its age alone (r2d2's default `max_lifetime` would do that every 30 minutes,
/// and a renewal that must open a new connection can be refused by a full server).
///
/// `park`: keep the connection last given back parked for the next caller (see the module
/// docs, "The parked connection"); the function flags a connection broken, so that r2d2 closes
/// it when the parked one has stayed idle for `idle_timeout`.
pub(super) fn build_pool<M: r2d2::ManageConnection>(
    manager: M,
    size: u32,
    pool: &PoolSettings,
    park: Option<fn(&mut M::Connection)>,
) -> Pool<M> {
    let mut builder = r2d2::Pool::builder()
        .max_size(size)
        .min_idle(Some(0))
        .idle_timeout(Some(pool.idle_timeout))
        .max_lifetime(None)
        .test_on_check_out(false)
        .connection_timeout(pool.connect_timeout)
        .error_handler(Box::new(r2d2::NopErrorHandler));
    // r2d2's own default (three timer threads per pool), which also run the parked
    // connection's idle check; except that they end as soon as the pool is dropped, where
    // r2d2's own would wait for the next run of their idle check (up to 30 s) first.
    let workers = park.map(|_| {
        Arc::new(
            ScheduledThreadPool::builder()
                .num_threads(3)
                .thread_name_pattern("r2d2-worker-{}")
                .on_drop_behavior(OnPoolDropBehavior::DiscardPendingScheduled)
                .build(),
        )
    });
    if let Some(workers) = &workers {
        builder = builder.thread_pool(Arc::clone(workers));
    }
    let parked = park.zip(workers).map(|(discard, workers)| {
        let parked = Arc::new(Mutex::new(Parked {
            conn: None,
            used: false,
            idle_checks: 0,
        }));
        let (idle_timeout, rate) = (pool.idle_timeout, idle_check_rate(pool.idle_timeout));
        let weak = Arc::downgrade(&parked);
        // The job holds the slot weakly: it does nothing once the pool is gone, and the timer
        // threads end with r2d2's pool, their last owner.
        workers.execute_at_fixed_rate(rate, rate, move || {
            if let Some(parked) = weak.upgrade() {
                close_if_idle(&parked, rate, idle_timeout, discard);
            }
        });
        parked
    });
    Pool {
        pool: builder.build_unchecked(manager),
        waiting: Arc::default(),
        parked,
    }
}

/// How often the parked connection's idle check runs: half the idle timeout, at most 15 s
/// (at least 10 ms), so that it closes between `idle_timeout` and 1.5 × `idle_timeout`, or 30 s
/// after it for long timeouts — r2d2's own bound for its idle connections (see
/// [`close_if_idle`]).
fn idle_check_rate(idle_timeout: Duration) -> Duration {
    (idle_timeout / 2).clamp(Duration::from_millis(10), Duration::from_secs(15))
}

/// The idle check of a parked connection, every `rate`: a connection that stayed parked,
/// unused, through enough checks in a row to cover `idle_timeout` is flagged (`discard`) and
/// given back to r2d2, which closes it, as it closes its own idle connections.
fn close_if_idle<M: r2d2::ManageConnection>(
    parked: &Mutex<Parked<M>>,
    rate: Duration,
    idle_timeout: Duration,
    discard: fn(&mut M::Connection),
) {
    let mut parked = parked.lock();
    if parked.conn.is_none() || parked.used {
        // In use, or parked again since the last check.
        parked.used = false;
        parked.idle_checks = 0;
        return;
    }
    parked.idle_checks = parked.idle_checks.saturating_add(1);
    if rate.saturating_mul(parked.idle_checks) < idle_timeout {
        return;
    }
    parked.idle_checks = 0;
    // Given back to r2d2 under the slot's lock: a caller that finds the slot empty meanwhile
    // enters r2d2 only once r2d2 no longer counts the connection, so it opens a new one
    // rather than wait (with `pool_size(1)`, until its deadline) for a place that nothing
    // would announce. r2d2 never takes the slot's lock, so the order cannot deadlock.
    if let Some(mut conn) = parked.conn.take() {
        discard(&mut conn);
        drop(conn);
    }
}

/// The parked connection of a pool that parks one (see the module docs).
struct Parked<M: r2d2::ManageConnection> {
    /// Checked out of r2d2 and not in use: the next caller takes it.
    conn: Option<r2d2::PooledConnection<M>>,
    /// A connection was parked since the last idle check.
    used: bool,
    /// Idle checks in a row that found the same connection parked and unused.
    idle_checks: u32,
}

/// An r2d2 pool and how many callers wait in it for a connection (see the module docs,
/// "Connections discarded while callers wait"), and its parked connection where it keeps one.
/// Clones share all three.
pub(crate) struct Pool<M: r2d2::ManageConnection> {
    pool: r2d2::Pool<M>,
    waiting: Arc<AtomicUsize>,
    parked: Option<Arc<Mutex<Parked<M>>>>,
}

impl<M: r2d2::ManageConnection> Clone for Pool<M> {
    fn clone(&self) -> Self {
        Pool {
            pool: self.pool.clone(),
            waiting: Arc::clone(&self.waiting),
            parked: self.parked.clone(),
        }
    }
}

impl<M: r2d2::ManageConnection> Pool<M> {
    /// A connection, waiting at most `timeout` for one; counted as waiting meanwhile. The parked
    /// connection, if there is one.
    pub(super) fn get_timeout(
        &self,
        timeout: Duration,
    ) -> Result<r2d2::PooledConnection<M>, r2d2::Error> {
        if let Some(parked) = &self.parked {
            let mut parked = parked.lock();
            if let Some(conn) = parked.conn.take() {
                return Ok(conn);
            }
            // Counted under the slot's lock: from here on nothing is parked until this caller
            // leaves r2d2 (see `give_back`), so it cannot wait for a connection parked meanwhile.
            self.waiting.fetch_add(1, Ordering::SeqCst);
        } else {
            // Counted before r2d2 sees the pool full, so that a connection discarded after that
            // look finds the count raised (r2d2's lock orders the two).
            self.waiting.fetch_add(1, Ordering::SeqCst);
        }
        let conn = self.pool.get_timeout(timeout);
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        conn
    }

    /// An idle connection (the parked one first), if there is one; never waits.
    pub(super) fn try_get(&self) -> Option<r2d2::PooledConnection<M>> {
        if let Some(conn) = self
            .parked
            .as_ref()
            .and_then(|parked| parked.lock().conn.take())
        {
            return Some(conn);
        }
        self.pool.try_get()
    }

    /// Gives back a healthy connection: parks it where the pool parks one, nothing is parked
    /// yet and no caller is inside r2d2's checkout (which would wait for it there); else to
    /// r2d2, which wakes a waiting caller.
    pub(super) fn give_back(&self, conn: r2d2::PooledConnection<M>) {
        if let Some(parked) = &self.parked {
            let mut parked = parked.lock();
            if parked.conn.is_none() && self.waiting.load(Ordering::SeqCst) == 0 {
                parked.conn = Some(conn);
                parked.used = true;
                return;
            }
        }
        drop(conn);
    }

    pub(super) fn state(&self) -> r2d2::State {
        self.pool.state()
    }

    pub(super) fn max_size(&self) -> u32 {
        self.pool.max_size()
    }

    /// To call once a connection flagged broken has been dropped (given back to r2d2, which
    /// closed it): while callers wait, starts a replacement, which wakes one of them when it is
    /// open. A zero-timeout checkout does that: it takes an idle connection if there is one
    /// (given back at once, which wakes a caller too), else starts opening one if the pool has
    /// room, and returns without waiting.
    pub(super) fn discarded(&self) {
        if self.waiting.load(Ordering::SeqCst) > 0 {
            drop(self.pool.get_timeout(Duration::ZERO));
        }
    }
}

/// The least time a grant gets to secure its renewal connection, however little is left of
/// the acquire's deadline.
const SECURING_AT_LEAST: Duration = Duration::from_secs(1);

impl<B: Backend> SqlStore<B> {
    /// After a grant of `lock_key`: makes sure the renewal pool has a connection, so that
    /// renewing the lease does not depend on opening one later — a full server would refuse
    /// it ("too many clients") and the lease would run out. Opened here (by `deadline`, at
    /// least [`SECURING_AT_LEAST`]) when the pool has none; the pool keeps it while renewals
    /// use it. If it cannot be opened, the grant is released at once and the caller gets an
    /// error saying why: a lease whose renewals cannot run is not handed out.
    pub(super) fn secure_renewal(
        &self,
        lock_key: &std::sync::Arc<str>,
        grant: &Grant,
        deadline: Instant,
    ) -> Result<()> {
        if self.renewal_pool.state().connections > 0 {
            return Ok(());
        }
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .max(SECURING_AT_LEAST);
        let failure = match self.renewal_pool.get_timeout(wait) {
            Ok(_connection) => return Ok(()),
            Err(e) => e,
        };
        let released = Store::release(
            self,
            lock_key,
            grant.token,
            Instant::now() + wait,
            Duration::ZERO,
        );
        let given_back = match released {
            Ok(_) => "the lock was granted and given back at once",
            Err(_) => "the lock was granted and is left to expire (giving it back failed too)",
        };
        let mut text = failure.to_string();
        if !text.contains(TOO_MANY_CLIENTS) {
            // The pool's error may not say why (another waiter took its last error): ask once,
            // on a thread of its own, as the pool's own attempts run (the caller may be on a
            // thread of an asynchronous runtime, where a driver cannot block).
            let manager = &self.manager;
            let asked = std::thread::scope(|scope| {
                scope
                    .spawn(|| {
                        r2d2::ManageConnection::connect(manager)
                            .err()
                            .map(|e| e.to_string())
                    })
                    .join()
            });
            if let Ok(Some(why)) = asked {
                text = format!("{text}: {why}");
            }
        }
        let hint = if text.contains(TOO_MANY_CLIENTS) {
            format!(
                "{given_back}: its renewal connection could not be opened, \
                 {TOO_MANY_CLIENTS}: {TOO_MANY_CLIENTS_FIX}"
            )
        } else {
            format!(
                "{given_back}: its renewal connection could not be opened ({text}): check the \
                 server and RegistryBuilder::renewal_pool_size"
            )
        };
        Err(Error::Database {
            operation: "acquire",
            hint,
            source: Box::new(failure),
        })
    }
}

/// How long the first attempt of [`first_connection`] may take before it is given up and
/// looked into: a server of the right kind answers the whole handshake well within it, while a
/// server of another kind may never answer it (each waits for the other to speak first). Later
/// attempts get what is left of the connect timeout.
#[cfg(any(feature = "postgres", feature = "mysql"))]
const FIRST_ATTEMPT: Duration = Duration::from_secs(2);

/// Tries one direct connection (`connect` returns the classified failure and a short detail)
/// until `timeout`, retrying every 50 ms while the failure is not fatal (refused, starting up),
/// so that a wrong password or database name is reported as what it is — a pool would only
/// time out. `connect` gets the longest this attempt may take — [`FIRST_ATTEMPT`] at first
/// (at most `timeout`), then the rest of `timeout` — and the deadline of them all. A backend
/// makes the permanent failures of a connection fatal: a host name that does not resolve
/// ([`unknown_host`]), a server of another kind ([`look_at`]).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn first_connection(
    database: &str,
    address: &str,
    timeout: Duration,
    mut connect: impl FnMut(Duration, Instant) -> Result<(), (Failure, String)>,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let pause = Duration::from_millis(50);
    let mut limit = timeout.min(FIRST_ATTEMPT);
    // A refusal for want of a slot, kept over later failures that say less (an attempt cut
    // short by the deadline).
    let mut full: Option<Failure> = None;
    loop {
        let Err((mut failure, detail)) = connect(limit, deadline) else {
            return Ok(());
        };
        let retry = failure.kind != FailureKind::Fatal;
        if retry && !failure.hint.contains(TOO_MANY_CLIENTS) {
            if let Some(kept) = full.take() {
                failure = kept;
            }
        }
        if !retry || Instant::now() + pause >= deadline {
            let hint = if retry && failure.hint.contains(TOO_MANY_CLIENTS) {
                // The server answered, so "start the server" would mislead.
                format!(
                    "{database} at {address} refused every attempt for {timeout:?}: {}",
                    failure.hint
                )
            } else if retry {
                format!(
                    "cannot reach {database} at {address} within {timeout:?} ({detail}): start \
                     the server or fix the URL"
                )
            } else if failure.hint.contains(address) {
                failure.hint
            } else {
                format!("{} (server {address})", failure.hint)
            };
            return Err(Error::Database {
                operation: "connect",
                hint,
                source: failure.source,
            });
        }
        if failure.hint.contains(TOO_MANY_CLIENTS) {
            full = Some(failure);
        }
        std::thread::sleep(pause);
        limit = deadline
            .saturating_duration_since(Instant::now())
            .max(pause);
    }
}

/// What to report (the hint of a fatal failure) when `host` (a name, not an address) does not
/// resolve for good — retrying cannot help, unlike when a server is starting; `None` when it
/// resolves, or the resolver failed for a while only (no DNS server answered).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn unknown_host(host: &str, port: u16) -> Option<String> {
    use std::net::{IpAddr, ToSocketAddrs};
    let literal = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || literal.parse::<IpAddr>().is_ok() {
        return None;
    }
    let cause = match (host, port).to_socket_addrs() {
        Ok(addresses) if addresses.len() > 0 => return None,
        Ok(_) => "it has no address".to_string(),
        Err(e) if resolver_busy(&e) => return None,
        Err(e) => e.to_string(),
    };
    Some(format!(
        "cannot resolve the host name `{host}` ({cause}): fix the host in the URL, or this \
         machine's name resolution (DNS, /etc/hosts)"
    ))
}

/// Whether a failed name lookup is worth retrying: the resolver could not ask (no DNS server
/// answered, EAI_AGAIN; a system error), as opposed to an answer that the name does not exist.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn resolver_busy(error: &std::io::Error) -> bool {
    match error.raw_os_error() {
        // Windows: WSAHOST_NOT_FOUND, WSANO_DATA.
        Some(11001 | 11004) => false,
        // Unix: EAI_SYSTEM's errno; Windows: WSATRY_AGAIN and the others.
        Some(_) => true,
        // Unix: gai_strerror's text (glibc, macOS "Temporary failure in name resolution",
        // musl "Try again").
        None => {
            let text = error.to_string().to_ascii_lowercase();
            text.contains("temporary") || text.contains("try again")
        }
    }
}

/// The SSLRequest of the PostgreSQL protocol: a PostgreSQL server answers it with one byte,
/// `S` or `N`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
const POSTGRES_SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// What a look at the server behind a failed first connection found ([`look_at`]).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) enum Finding {
    /// A server of another kind answered (or, from a backend, another permanent cause such as
    /// [`unknown_host`]): the hint of a fatal failure.
    Permanent(String),
    /// Something accepts connections there but says nothing: a note for the failure's detail
    /// (a server that is starting behind a proxy, or hangs, or is of another kind).
    Speechless(String),
    /// Nothing learned: nothing accepts connections, or a `database` server answered.
    Nothing,
}

/// What answered at `host:port` (`address` in messages), when a first connection to it as a
/// `database` server ("PostgreSQL" or "MySQL") reached a server that did not answer as one
/// does. Its first bytes tell ([`first_words`]); in about 4 s at worst, and by `deadline`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn look_at(
    host: &str,
    port: u16,
    address: &str,
    database: &str,
    deadline: Instant,
) -> Finding {
    // A MySQL server greets unprompted, at once; a PostgreSQL server never does.
    let (default_port, unprompted) = match database {
        "MySQL" => (3306, Duration::from_millis(300)),
        _ => (5432, Duration::from_millis(150)),
    };
    let words = match first_words(host, port, unprompted, deadline) {
        Words::Said(words) => words,
        Words::Unreachable => return Finding::Nothing,
        Words::Closed => {
            return Finding::Speechless(format!(
                "{address} accepts connections but closes them without a word: a server still \
                 starting behind a proxy, or not a {database} server (or TLS is required)"
            ))
        }
        Words::Silent => {
            return Finding::Speechless(format!(
                "{address} accepts connections but does not answer: a server that hangs, or not \
                 a {database} server (or TLS is required)"
            ))
        }
    };
    let kind = server_kind(&words);
    if kind.is_some_and(|(name, _)| name.starts_with(database)) {
        return Finding::Nothing;
    }
    // A MySQL greeting up to the end of the server's version: its random bytes follow.
    let shown = match kind {
        Some(("MySQL/MariaDB", _)) => words.iter().skip(5).position(|&b| b == 0).map(|at| 5 + at),
        _ => None,
    };
    let said: String = words[..shown.unwrap_or(words.len())]
        .iter()
        .take(40)
        .flat_map(|b| b.escape_ascii())
        .map(char::from)
        .collect();
    Finding::Permanent(match kind {
        Some(("TLS", _)) => format!(
            "{address} is not a {database} server (or TLS is required from the first byte): it \
             answers with TLS (`{said}`), as a TLS proxy or tunnel does: connect to the \
             {database} server itself"
        ),
        Some((name, article)) => {
            let constructor = match name {
                "PostgreSQL" => ", or use LockRegistry::postgres",
                "MySQL/MariaDB" => ", or use LockRegistry::mysql",
                _ => "",
            };
            format!(
                "{address} is not a {database} server: it answers as {article} {name} server \
                 does (`{said}`): point the URL at the {database} server's port \
                 ({default_port} by default){constructor}"
            )
        }
        None => format!(
            "{address} is not a {database} server (or TLS is required): it answers the \
             {database} handshake with `{said}`: point the URL at the {database} server's host \
             and port ({default_port} by default)"
        ),
    })
}

/// What a server sent on new TCP connections ([`first_words`]).
#[cfg(any(feature = "postgres", feature = "mysql"))]
enum Words {
    /// Its first bytes (at most 64).
    Said(Vec<u8>),
    /// It closed the connections without a byte.
    Closed,
    /// It said nothing within the waits.
    Silent,
    /// It could not be connected to.
    Unreachable,
}

/// The first bytes a server at `host:port` sends on a new TCP connection, to tell what kind of
/// server it is: what it sends unprompted within `unprompted` (a MySQL server greets at once),
/// else its answer to [`POSTGRES_SSL_REQUEST`]; else, on a second connection, its answer to a
/// Redis `PING` line (a line-based protocol waits for the end of a line, and Redis for one
/// without a NUL byte). In about 4 s at worst; what is not said by `deadline` is silence.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn first_words(host: &str, port: u16, unprompted: Duration, deadline: Instant) -> Words {
    use std::net::ToSocketAddrs;
    let address = match (host.trim_start_matches('[').trim_end_matches(']'), port)
        .to_socket_addrs()
        .map(|mut addresses| addresses.next())
    {
        Ok(Some(address)) => address,
        _ => return Words::Unreachable,
    };
    let left = || deadline.saturating_duration_since(Instant::now());
    let answer = |unprompted: Duration, prompt: &[u8]| -> Words {
        use std::io::{ErrorKind, Read, Write};
        let connecting = Duration::from_secs(1).min(left());
        let Ok(mut stream) = std::net::TcpStream::connect_timeout(&address, connecting) else {
            return Words::Unreachable;
        };
        let _ = stream.set_nodelay(true);
        let mut words = vec![0u8; 64];
        let mut len = 0;
        for (wait, then_say) in [(unprompted, prompt), (Duration::from_millis(500), &[][..])] {
            if !wait.is_zero() {
                let wait = wait.min(left());
                if wait.is_zero() || stream.set_read_timeout(Some(wait)).is_err() {
                    return Words::Silent;
                }
                match stream.read(&mut words) {
                    Ok(0) => return Words::Closed,
                    Ok(n) => {
                        len = n;
                        break;
                    }
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                    Err(_) => return Words::Closed,
                }
            }
            if !then_say.is_empty() && stream.write_all(then_say).is_err() {
                return Words::Closed;
            }
        }
        if len == 0 {
            return Words::Silent;
        }
        // The rest of an answer sent in pieces.
        let rest = Duration::from_millis(100).min(left());
        if !rest.is_zero() && stream.set_read_timeout(Some(rest)).is_ok() {
            while len < words.len() {
                match stream.read(&mut words[len..]) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => len += n,
                }
            }
        }
        words.truncate(len);
        Words::Said(words)
    };
    match answer(unprompted, &POSTGRES_SSL_REQUEST) {
        Words::Said(words) => Words::Said(words),
        Words::Unreachable => Words::Unreachable,
        first => match answer(Duration::ZERO, b"PING\r\n") {
            Words::Said(words) => Words::Said(words),
            // Closed only when it closed both connections without a word.
            Words::Closed | Words::Unreachable if matches!(first, Words::Closed) => Words::Closed,
            _ => Words::Silent,
        },
    }
}

/// What kind of server sent `words` (from [`first_words`]), when it is one we know: its name
/// and the article before it.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn server_kind(words: &[u8]) -> Option<(&'static str, &'static str)> {
    let kind = match words {
        // A packet header (3-byte length, sequence 0), then protocol version 10, or an error
        // packet (too many connections, host blocked).
        [_, _, _, 0, 10 | 0xff, ..] => ("MySQL/MariaDB", "a"),
        // The answer to the SSLRequest, or an error message (too many clients).
        [b'S'] | [b'N'] | [b'E', _, _, _, _, b'S', ..] => ("PostgreSQL", "a"),
        // A TLS record (handshake or alert): it wants TLS from the first byte.
        [0x15 | 0x16, 3, ..] => ("TLS", "a"),
        [b'H', b'T', b'T', b'P', b'/', ..] => ("HTTP", "an"),
        [b'S', b'S', b'H', b'-', ..] => ("SSH", "an"),
        [b'A', b'M', b'Q', b'P', ..] => ("AMQP (RabbitMQ)", "an"),
        // The answer to `PING`, with or without a password.
        [b'+', b'P', b'O', b'N', b'G', ..] | [b'-', b'N', b'O', b'A', b'U', b'T', b'H', ..] => {
            ("Redis", "a")
        }
        [b'I', b'N', b'F', b'O', b' ', b'{', ..] => ("NATS", "a"),
        _ => return None,
    };
    Some(kind)
}

#[cfg(all(test, any(feature = "postgres", feature = "mysql")))]
mod tests {
    use super::*;

    /// A server at a local port that greets every connection with `answer`, or closes it at
    /// once when `answer` is empty.
    fn fake_server(answer: &'static [u8]) -> u16 {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                if !answer.is_empty() {
                    let _ = stream.write_all(answer);
                    std::thread::sleep(Duration::from_millis(300));
                }
            }
        });
        port
    }

    fn look(answer: &'static [u8], database: &str) -> Finding {
        let port = fake_server(answer);
        let address = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(10);
        look_at("127.0.0.1", port, &address, database, deadline)
    }

    #[test]
    fn a_server_of_the_right_kind_is_not_reported() {
        let greeting = b"J\x00\x00\x00\x0a8.0.36\x00";
        assert!(matches!(look(greeting, "MySQL"), Finding::Nothing));
        assert!(matches!(look(b"N", "PostgreSQL"), Finding::Nothing));
    }

    #[test]
    fn a_server_of_another_kind_is_named() {
        let Finding::Permanent(hint) = look(b"N", "MySQL") else {
            panic!("PostgreSQL's answer taken for MySQL's");
        };
        assert!(
            hint.contains("is not a MySQL server: it answers as a PostgreSQL server"),
            "{hint}"
        );
        assert!(hint.contains("LockRegistry::postgres"), "{hint}");
        let Finding::Permanent(hint) = look(b"HTTP/1.1 400 Bad Request\r\n", "PostgreSQL") else {
            panic!("an HTTP server taken for PostgreSQL");
        };
        assert!(
            hint.contains("is not a PostgreSQL server: it answers as an HTTP server"),
            "{hint}"
        );
    }

    #[test]
    fn an_unknown_answer_or_tls_may_mean_tls_is_required() {
        for answer in [&b"\x15\x03\x03\x00\x02\x02\x32"[..], b"220 mail ESMTP\r\n"] {
            let Finding::Permanent(hint) = look(answer, "PostgreSQL") else {
                panic!("{answer:?} taken for PostgreSQL");
            };
            assert!(
                hint.contains("is not a PostgreSQL server (or TLS is required"),
                "{hint}"
            );
        }
    }

    #[test]
    fn a_server_that_closes_at_once_is_only_noted() {
        let Finding::Speechless(note) = look(b"", "PostgreSQL") else {
            panic!("a closing server taken for a server of another kind");
        };
        assert!(note.contains("closes them without a word"), "{note}");
    }

    /// (An unknown host name is tested against the resolver in `tests/connection_errors.rs`.)
    #[test]
    fn an_address_or_a_known_name_is_not_an_unknown_host() {
        assert_eq!(unknown_host("127.0.0.1", 5432), None);
        assert_eq!(unknown_host("[::1]", 5432), None);
        assert_eq!(unknown_host("localhost", 5432), None);
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod parking {
    use super::*;
    use crate::backend::sqlite::{Sqlite, SqliteManager};
    use crate::backend::{Backend, Conn};

    fn sqlite_pool(
        dir: &tempfile::TempDir,
        size: u32,
        idle_timeout: Duration,
    ) -> Pool<SqliteManager> {
        let settings = PoolSettings {
            pool_size: size,
            renewal_pool_size: 1,
            idle_timeout,
            connect_timeout: Duration::from_secs(10),
            operation_timeout: Duration::from_secs(10),
            prepared_statements: None,
            listener_url: None,
        };
        let manager = SqliteManager::new(dir.path().join("parking.db"));
        let discard = <Sqlite as Backend>::mark_broken as fn(&mut Conn<Sqlite>);
        build_pool(manager, size, &settings, Some(discard))
    }

    #[test]
    fn a_connection_given_back_is_parked_and_closed_once_idle() {
        let dir = tempfile::tempdir().unwrap();
        let idle = Duration::from_millis(200);
        let pool = sqlite_pool(&dir, 2, idle);
        let conn = pool.get_timeout(Duration::from_secs(10)).unwrap();
        pool.give_back(conn);
        // Parked: still checked out of r2d2, not idle there.
        let state = pool.state();
        assert_eq!((state.connections, state.idle_connections), (1, 0));
        let again = pool.get_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(
            pool.state().connections,
            1,
            "the parked connection was not reused"
        );
        pool.give_back(again);
        // Closed between the timeout and 1.5 times it (the idle check runs on r2d2's timer
        // threads, which a loaded machine may delay).
        let give_up = Instant::now() + Duration::from_secs(10);
        while pool.state().connections > 0 && Instant::now() < give_up {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(
            pool.state().connections,
            0,
            "the parked connection stayed open"
        );
        assert!(
            pool.try_get().is_none(),
            "a closed connection is still parked"
        );
        // The next caller opens a new one.
        let conn = pool.get_timeout(Duration::from_secs(10)).unwrap();
        pool.give_back(conn);
        assert_eq!(pool.state().connections, 1);
    }

    #[test]
    fn a_caller_waiting_in_r2d2_is_given_the_connection_instead_of_the_slot() {
        let dir = tempfile::tempdir().unwrap();
        let pool = sqlite_pool(&dir, 1, Duration::from_secs(60));
        let held = pool.get_timeout(Duration::from_secs(10)).unwrap();
        let waiter = {
            let pool = pool.clone();
            std::thread::spawn(move || {
                let conn = pool.get_timeout(Duration::from_secs(20));
                let got = conn.is_ok();
                drop(conn);
                got
            })
        };
        while pool.waiting.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        // Someone waits in r2d2: the connection goes to r2d2, which hands it to the waiter,
        // instead of into the slot.
        pool.give_back(held);
        assert!(pool.parked.as_ref().unwrap().lock().conn.is_none());
        assert!(waiter.join().unwrap(), "the waiter timed out");
    }

    #[test]
    fn discarding_idle_connections_finds_the_parked_one() {
        let dir = tempfile::tempdir().unwrap();
        let pool = sqlite_pool(&dir, 2, Duration::from_secs(60));
        let conn = pool.get_timeout(Duration::from_secs(10)).unwrap();
        pool.give_back(conn);
        let mut parked = pool.try_get().expect("the parked connection");
        Sqlite::mark_broken(&mut parked);
        drop(parked);
        assert_eq!(
            pool.state().connections,
            0,
            "a discarded connection stayed open"
        );
    }

    static CLOSING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

    /// A discard that takes its time (a slow close), and says when it began.
    fn slow_discard(conn: &mut Conn<Sqlite>) {
        Sqlite::mark_broken(conn);
        CLOSING.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(300));
    }

    /// The idle check gives the parked connection back to r2d2 under the slot's lock: a
    /// caller that comes meanwhile to a pool of one finds r2d2 with room once it gets in, and
    /// opens a connection. When the check let go of the lock first, the caller found the slot
    /// empty and r2d2 full, and slept until its deadline: r2d2 announces no place freed by a
    /// broken connection.
    #[test]
    fn a_caller_during_the_idle_close_of_the_only_connection_gets_a_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let idle = Duration::from_secs(60);
        let pool = sqlite_pool(&dir, 1, idle);
        let conn = pool.get_timeout(Duration::from_secs(10)).unwrap();
        pool.give_back(conn);
        let slot = Arc::clone(pool.parked.as_ref().unwrap());
        // The first look sees the connection used since the last one; the second closes it.
        close_if_idle(&slot, idle, idle, slow_discard);
        let closer = std::thread::spawn(move || close_if_idle(&slot, idle, idle, slow_discard));
        while !CLOSING.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let got = pool.get_timeout(Duration::from_secs(10));
        closer.join().unwrap();
        assert!(
            got.is_ok(),
            "a caller during the idle close waited until its deadline: {:?}",
            got.err()
        );
    }
}
