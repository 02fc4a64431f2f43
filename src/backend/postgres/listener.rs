//! PostgreSQL's release wake-ups: the listener thread, its own connection (`LISTEN` on the
//! table's channel, read by the listener itself so that notifications are kept), the decision
//! made before each connection that keeps the listeners of a database from filling the server
//! ([`admit`]), the probe that finds a transaction pooler dropping notifications, and the
//! payload of a release's `NOTIFY` (see [`crate::wakeups`] and the parent module, "Release
//! notifications", which states the bound).

use super::*;

/// Starts the listener of a registry (see [`Backend::listen_for_releases`]); `pool` is the
/// registry's main pool, through which it decides whether to connect ([`admit`]) and sends its
/// probe.
#[cfg_attr(not(feature = "postgres-tls"), allow(clippy::clone_on_copy))]
pub(super) fn start(
    manager: &PgManager,
    pool: &Pool<PgManager>,
    table: &TableSettings,
    idle_timeout: Duration,
    handler: ListenerHandler,
    requests: crossbeam_channel::Receiver<()>,
) -> bool {
    let (config, tls) = manager
        .listener
        .clone()
        .unwrap_or_else(|| (manager.config.clone(), manager.tls.clone()));
    let listener = Listener {
        idle_timeout,
        limit: connect_limit(&config),
        config,
        tls,
        pool: pool.clone(),
        heard: Cell::new(false),
        channel: channel(&table.table),
        region: table.region.clone(),
        handler,
        requests,
        requested: Cell::new(false),
        full_until: Cell::new(None),
        said_full: Cell::new(false),
    };
    // No connection yet: the listener opens one when a thread of the registry first waits
    // (polling covers waiters meanwhile), so a registry that never waits never has one.
    let spawned = std::thread::Builder::new()
        .name("leasehold-listen".into())
        .spawn(move || listener.run(None));
    match spawned {
        Ok(_) => true,
        Err(e) => {
            log::warn!("PostgreSQL release notifications are off (waiters poll): {e}");
            false
        }
    }
}

/// The thread that turns release notifications into wake-ups of this registry's pollers,
/// subscribed only while the registry asks for it (see [`crate::wakeups`]).
///
/// Every call it makes on the database — the decision to connect ([`admit`]), connect,
/// `LISTEN`, `UNLISTEN`, the liveness check — gives up after `limit`, and a call that fails or gives up drops the connection (the next
/// subscription opens a new one). After each such call the thread checks whether the registry
/// is gone, so it outlives its registry by one bounded call at most.
struct Listener {
    config: Config,
    tls: Tls,
    /// The registry's main pool: where the listener decides whether to connect ([`admit`]) and
    /// sends its probe from (see [`Listener::probe`]).
    pool: Pool<PgManager>,
    /// Whether a probe was heard: `LISTEN` here hears other sessions' notifications.
    heard: Cell<bool>,
    /// The bound of each call: the connect timeout.
    limit: Duration,
    /// Unsubscribed this long, the listener closes its connection.
    idle_timeout: Duration,
    channel: String,
    region: String,
    handler: ListenerHandler,
    /// Subscription requests; disconnected once the registry is gone.
    requests: crossbeam_channel::Receiver<()>,
    /// A request [`Listener::gone`] took off the channel, still to be served.
    requested: Cell<bool>,
    /// Until when the listener does not connect: it found the server short of free slots
    /// (see [`Slots`] and [`admit`]).
    full_until: Cell<Option<Instant>>,
    /// Whether the warning about a server short of slots was logged.
    said_full: Cell<bool>,
}

impl Listener {
    /// How often a subscribed listener reports a tick (and learns whether to go on).
    const TICK: Duration = Duration::from_secs(1);
    /// How often a subscribed listener without traffic checks its connection.
    const CHECK: Duration = Duration::from_secs(30);

    /// Waits for subscription requests and serves each until the registry lets it go; ends
    /// with the registry. `conn` is an open connection to start with, if any; an unsubscribed
    /// connection is closed after `idle_timeout`, so a registry none of whose threads waits
    /// keeps no listener connection open.
    fn run(self, mut conn: Option<ListenerConn>) {
        loop {
            let requested = self.requested.take()
                || match conn {
                    Some(_) => match self.requests.recv_timeout(self.idle_timeout) {
                        Ok(()) => true,
                        Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                            conn = None;
                            continue;
                        }
                        Err(crossbeam_channel::RecvTimeoutError::Disconnected) => false,
                    },
                    None => self.requests.recv().is_ok(),
                };
            if !requested {
                return;
            }
            while self.requests.try_recv().is_ok() {}
            if !self.subscribe(&mut conn) || !self.while_subscribed(&mut conn) {
                return;
            }
        }
    }

    /// Whether the registry is gone (it held the sending end of `requests`). Never blocks; a
    /// request found meanwhile is kept for [`Listener::run`].
    fn gone(&self) -> bool {
        match self.requests.try_recv() {
            Ok(()) => {
                self.requested.set(true);
                false
            }
            Err(crossbeam_channel::TryRecvError::Empty) => false,
            Err(crossbeam_channel::TryRecvError::Disconnected) => true,
        }
    }

    /// `LISTEN`s, (re)connecting first when there is no open connection, and tries again every
    /// `TICK` until it works; `false` once the registry is gone.
    fn subscribe(&self, conn: &mut Option<ListenerConn>) -> bool {
        loop {
            let waiting_for_slots = self
                .full_until
                .get()
                .is_some_and(|until| Instant::now() < until);
            if conn.as_ref().is_none_or(ListenerConn::is_closed) && !waiting_for_slots {
                *conn = None;
                fail_point!("postgres::listener_before_connect");
                let decided = admit(&self.pool, self.limit, || {
                    ListenerConn::open(&self.config, &self.tls)
                });
                match decided {
                    Decision::Admitted(Ok(fresh)) => {
                        self.full_until.set(None);
                        *conn = Some(fresh);
                    }
                    Decision::Admitted(Err(e)) => {
                        log::debug!("PostgreSQL release listener reconnecting: {e}")
                    }
                    Decision::Full(slots) => self.short_of_slots(&slots),
                    // Another listener of the database is deciding: the next tick tries again.
                    Decision::Busy => {}
                    Decision::Failed(e) => {
                        log::debug!("PostgreSQL release listener could not count slots: {e}")
                    }
                }
                if self.gone() {
                    return false;
                }
            }
            if let Some(open) = conn {
                fail_point!("postgres::listener_before_listen");
                // Probed before the channel's own LISTEN, which stays the connection's last
                // statement (what pg_stat_activity shows).
                let probed = if self.heard.get() {
                    Ok(())
                } else {
                    match self.probe(open) {
                        Probe::Heard => {
                            self.heard.set(true);
                            Ok(())
                        }
                        // Nothing learned; the next connection probes again.
                        Probe::Unknown(e) => {
                            log::debug!("PostgreSQL release listener could not probe: {e}");
                            Ok(())
                        }
                        Probe::Failed(e) => Err(e),
                        Probe::Gone => return false,
                        Probe::Deaf => {
                            log::warn!(
                                "PostgreSQL release notifications do not reach this registry: \
                                 LISTEN at {} did not hear a notification sent from another \
                                 connection within {:?}, as happens through a transaction-mode \
                                 pooler (PgBouncer pool_mode = transaction); waiters only poll \
                                 now (every idle_between_tries). Give the listener a direct \
                                 connection: RegistryBuilder::listener_url",
                                address(&self.config),
                                self.limit
                            );
                            *conn = None;
                            return false;
                        }
                    }
                };
                let listened = probed.and_then(|()| {
                    open.execute(&format!("LISTEN \"{}\"", self.channel), self.limit)
                });
                match listened {
                    Ok(()) => {
                        return (self.handler)(ListenerEvent::Subscribed) != ListenerReply::Stop
                    }
                    Err(e) => {
                        log::debug!("PostgreSQL release listener could not subscribe: {e}");
                        *conn = None;
                    }
                }
                if self.gone() {
                    return false;
                }
            }
            std::thread::sleep(Self::TICK);
            if (self.handler)(ListenerEvent::Tick) == ListenerReply::Stop {
                return false;
            }
        }
    }

    /// Whether the server leaves enough connection slots free beside `conn`, the listener's
    /// open connection (see [`Slots`]); one bounded call. Not: see
    /// [`Listener::short_of_slots`]. A call that fails means a lost connection (`false`).
    fn room_for(&self, conn: &mut ListenerConn) -> bool {
        let slots = match conn.slots(self.limit) {
            Ok(slots) => slots,
            Err(e) => {
                log::debug!("PostgreSQL release listener lost its connection: {e}");
                return false;
            }
        };
        if slots.enough() {
            return true;
        }
        self.short_of_slots(&slots);
        false
    }

    /// The server is short of free slots for the listener: says so in a warning (once), and
    /// the listener connects again no sooner than [`Listener::CHECK`] later, while waiters
    /// poll.
    fn short_of_slots(&self, slots: &Slots) {
        self.full_until.set(Some(Instant::now() + Self::CHECK));
        if !self.said_full.replace(true) {
            log::warn!(
                "leasehold: the PostgreSQL server at {} has {} connection slots free for \
                 ordinary users ({} max_connections - {} reserved - {} connected); a release \
                 listener leaves at least {} free (a tenth of the slots, at least {MIN_SPARE}) \
                 for the connections that renew leases, so this registry's waiters poll (every \
                 idle_between_tries) and the listener looks again every {:?}. Each waiting \
                 registry with a listener takes one slot: raise max_connections, or let a \
                 fleet's registries share fewer listeners (notifications(false) on some)",
                address(&self.config),
                slots.free(),
                slots.max,
                slots.reserved,
                slots.connected,
                slots.spare(),
                Self::CHECK
            );
        }
    }

    /// Whether `LISTEN` on `conn` hears other sessions: it listens on a channel of its own,
    /// sends a notification there from a connection of the registry's main pool, and waits for it
    /// for one call's bound. A session-mode pooler or a direct connection hears it within
    /// milliseconds. Through a transaction-mode pooler the `LISTEN` ran on a server connection
    /// that went back to the pool, so the notification never comes ([`Probe::Deaf`]).
    /// Releases heard meanwhile are kept for delivery.
    fn probe(&self, conn: &mut ListenerConn) -> Probe {
        // Each step is one bounded call; the registry may be gone after any of them.
        let channel = format!("leasehold_probe_{}", uuid::Uuid::new_v4().simple());
        if let Err(e) = conn.execute(&format!("LISTEN \"{channel}\""), self.limit) {
            return Probe::Failed(e);
        }
        if self.gone() {
            return Probe::Gone;
        }
        let sent = on_pooled(&self.pool, self.limit, |pooled| {
            simple_query(
                pooled,
                &format!("SELECT pg_notify('{channel}', '')"),
                self.limit,
            )
            .map(drop)
        });
        if self.gone() {
            return Probe::Gone;
        }
        let heard = sent.map(|()| {
            let until = Instant::now() + self.limit;
            let mut releases = Vec::new();
            let mut heard = false;
            while let Some(notification) = conn.next_notification(until) {
                if notification.channel() == channel {
                    heard = true;
                    break;
                }
                releases.push(notification);
            }
            for release in releases.into_iter().rev() {
                conn.pending.push_front(release);
            }
            heard
        });
        if self.gone() {
            return Probe::Gone;
        }
        if let Err(e) = conn.execute(&format!("UNLISTEN \"{channel}\""), self.limit) {
            return Probe::Failed(e);
        }
        match heard {
            Ok(true) => Probe::Heard,
            Ok(false) if conn.is_closed() => Probe::Failed("the connection closed".to_string()),
            Ok(false) => Probe::Deaf,
            Err(e) => Probe::Unknown(e),
        }
    }

    /// Delivers notifications and ticks until the registry says to unsubscribe (`true`) or
    /// is gone (`false`); subscribes again after losing the connection.
    fn while_subscribed(&self, conn: &mut Option<ListenerConn>) -> bool {
        let mut checked = Instant::now();
        loop {
            let Some(open) = conn.as_mut() else {
                if !self.subscribe(conn) {
                    return false;
                }
                continue;
            };
            if !self.deliver(open) {
                return false;
            }
            match (self.handler)(ListenerEvent::Tick) {
                ListenerReply::Stop => return false,
                ListenerReply::Unsubscribe => {
                    fail_point!("postgres::listener_before_unlisten");
                    match open.execute("UNLISTEN *", self.limit) {
                        // Releases seen before UNLISTEN would only cause stale wake-ups later.
                        Ok(()) => open.pending.clear(),
                        Err(e) => {
                            // A closed connection listens no more either.
                            log::debug!("PostgreSQL release listener could not unsubscribe: {e}");
                            *conn = None;
                        }
                    }
                    return !self.gone();
                }
                ListenerReply::Keep => {}
            }
            let mut lost = open.is_closed();
            if !lost && checked.elapsed() >= Self::CHECK {
                checked = Instant::now();
                // The liveness check also looks at the server's free slots: a listener gives
                // its slot back when the server fills up.
                lost = !self.room_for(open);
                if self.gone() {
                    return false;
                }
            }
            if lost {
                *conn = None;
                if !self.subscribe(conn) {
                    return false;
                }
            }
        }
    }

    /// Hands the registry the releases that arrive during one `TICK` (less if the connection
    /// closes); `false` once the registry is gone.
    fn deliver(&self, conn: &mut ListenerConn) -> bool {
        let until = Instant::now() + Self::TICK;
        while let Some(notification) = conn.next_notification(until) {
            if let Some((lock_key, _, region)) = parse_release(notification.payload()) {
                if region == self.region
                    && (self.handler)(ListenerEvent::Released { lock_key }) == ListenerReply::Stop
                {
                    return false;
                }
            }
        }
        true
    }
}

/// A listener leaves at least this many of a server's connection slots free for others.
const MIN_SPARE: i64 = 5;

/// A server's connection slots, as a listener's connection sees them: a listener keeps its
/// connection only while at least a tenth of the slots ordinary users may take (at least
/// [`MIN_SPARE`]) stay free beside it, since its wake-ups only make waiters try sooner,
/// while pooled connections, which renew leases, need a slot when they open.
#[derive(Debug)]
pub(super) struct Slots {
    /// `max_connections`.
    max: i64,
    /// Slots kept for superusers and roles with `pg_use_reserved_connections`
    /// (`superuser_reserved_connections` + `reserved_connections`).
    reserved: i64,
    /// Client connections open, the listener's included.
    connected: i64,
}

impl Slots {
    /// The statement that reads them.
    const SQL: &'static str = "SELECT current_setting('max_connections'), \
        CAST(current_setting('superuser_reserved_connections') AS INTEGER) \
        + COALESCE(CAST(NULLIF(current_setting('reserved_connections', true), '') AS INTEGER), 0), \
        (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')";

    fn free(&self) -> i64 {
        self.max - self.reserved - self.connected
    }

    /// How many a listener leaves free.
    fn spare(&self) -> i64 {
        ((self.max - self.reserved) / 10).max(MIN_SPARE)
    }

    /// Whether they leave enough free, the listener's connection counted in `connected`.
    fn enough(&self) -> bool {
        self.free() >= self.spare()
    }

    /// Whether one more connection, not open yet, would leave enough free.
    fn room_for_one_more(&self) -> bool {
        self.free() > self.spare()
    }

    /// Reads them from the row of [`Slots::SQL`]. Fail point `postgres::listener_slots_taken`
    /// (tests): its value is added to the connections open.
    fn from_row(row: &tokio_postgres::SimpleQueryRow) -> Result<Slots, String> {
        let number = |i: usize| -> Result<i64, String> {
            row.get(i)
                .and_then(|text| text.parse().ok())
                .ok_or_else(|| format!("column {i} is not a number"))
        };
        #[allow(unused_mut)]
        let mut slots = Slots {
            max: number(0)?,
            reserved: number(1)?,
            connected: number(2)?,
        };
        #[cfg(feature = "failpoints")]
        if let Some(Some(taken)) = fail::eval("postgres::listener_slots_taken", |value| {
            value.and_then(|value| value.parse::<i64>().ok())
        }) {
            slots.connected += taken;
        }
        Ok(slots)
    }
}

/// The rows among the messages of a simple query, in order.
fn rows(
    messages: &[tokio_postgres::SimpleQueryMessage],
) -> impl Iterator<Item = &tokio_postgres::SimpleQueryRow> {
    messages.iter().filter_map(|message| match message {
        tokio_postgres::SimpleQueryMessage::Row(row) => Some(row),
        _ => None,
    })
}

/// The transaction-scoped advisory lock (`pg_try_advisory_xact_lock` of this key, ASCII
/// "lhlisten") under which the listeners of one database decide one at a time whether to
/// connect (see [`admit`]).
pub(super) const ADMISSION_LOCK: i64 = 0x6c68_6c69_7374_656e;

/// What [`admit`] decided.
pub(super) enum Decision<T> {
    /// There was room for one more connection, and it was opened under the lock: the outcome.
    Admitted(T),
    /// Too few slots free for one more connection: nothing opened.
    Full(Slots),
    /// Another listener of the database was deciding: nothing decided, nothing opened.
    Busy,
    /// The pooled connection failed (why): nothing decided, nothing opened.
    Failed(String),
}

/// Decides, before a listener's connection is opened, whether the server has room for it, and
/// opens it (`open`) only then, so that listeners starting together never overfill the server.
///
/// On a connection of the registry's main pool (through a pooler, if the registry goes through
/// one), in one round trip: `BEGIN`, `pg_try_advisory_xact_lock(`[`ADMISSION_LOCK`]`)`, and the
/// server's slots ([`Slots::SQL`], read after the lock, so it counts every connection opened
/// under the lock before). Without the lock ([`Decision::Busy`]) or without room for one more
/// connection beside the spare ([`Decision::Full`]) it rolls back at once and opens nothing.
/// With both, it runs `open` while the transaction, and so the lock, is held, and commits
/// after: the connection is open, and counted by the next decision, before anyone else decides.
/// The lock is tried, never waited for: a transaction-mode pooler would keep a server
/// connection for each waiting decision, and the registries' statements need them. Each call
/// on the pooled connection is bounded by `limit`, `open` by its own bound (the connect
/// timeout); a pooled connection that fails is discarded, which ends its transaction.
pub(super) fn admit<T>(
    pool: &Pool<PgManager>,
    limit: Duration,
    open: impl FnOnce() -> T,
) -> Decision<T> {
    let decide = format!(
        "BEGIN; SELECT pg_try_advisory_xact_lock({ADMISSION_LOCK}); {}",
        Slots::SQL
    );
    let decided = on_pooled(pool, limit, |pooled| {
        let messages = simple_query(pooled, &decide, limit)?;
        let mut found = rows(&messages);
        let locked = found.next().ok_or("no row")?.get(0) == Some("t");
        let slots = Slots::from_row(found.next().ok_or("no row")?)?;
        if !locked || !slots.room_for_one_more() {
            simple_query(pooled, "ROLLBACK", limit)?;
            return Ok(if locked {
                Decision::Full(slots)
            } else {
                Decision::Busy
            });
        }
        let opened = open();
        if let Err(e) = simple_query(pooled, "COMMIT", limit) {
            // Discarded: its session ends, and with it the transaction and the lock.
            log::debug!("PostgreSQL release listener could not end its decision: {e}");
            pooled.broken = true;
        }
        Ok(Decision::Admitted(opened))
    });
    decided.unwrap_or_else(Decision::Failed)
}

/// Checks the listener URL when the registry is built, as `build()` checks the registry's own
/// URL (`check`: connection attempts until the time it is given), but only through [`admit`],
/// like every other connection of the listener, on the pool the registry has just checked its
/// table on: the check's connection is opened only where a listener's could be, and closed
/// before the decision commits. Another listener deciding meanwhile is waited out for
/// [`BUILD_WAIT`] at most (within `timeout`); past that, or when the server has no room for a
/// listener, the URL is not connected to now (a warning says so when the server is short of
/// slots) and the listener connects when it has room. A refusal for want of a slot (a role's
/// `CONNECTION LIMIT`, or clients outside the decision) warns too; every other fault of the
/// URL fails the build.
pub(super) fn check_at_build(
    pool: &Pool<PgManager>,
    address: &str,
    timeout: Duration,
    check: impl FnOnce(Duration) -> crate::Result<()>,
) -> crate::Result<()> {
    let start = Instant::now();
    let give_up = start + timeout.min(BUILD_WAIT);
    let mut check = Some(check);
    loop {
        let left = timeout.saturating_sub(start.elapsed());
        let decided = admit(pool, left, || match check.take() {
            Some(check) => check(timeout.saturating_sub(start.elapsed())),
            None => Ok(()),
        });
        match decided {
            Decision::Admitted(Ok(())) => return Ok(()),
            Decision::Admitted(Err(e)) if e.to_string().contains(TOO_MANY_CLIENTS) => {
                log::warn!(
                    "leasehold: the listener URL's server has no connection slot left now; \
                     waiters poll until the listener gets one ({e})"
                );
                return Ok(());
            }
            Decision::Admitted(Err(e)) => return Err(e),
            Decision::Full(slots) => {
                log::warn!(
                    "leasehold: the listener URL's server at {address} has {} connection slots \
                     free, and a release listener leaves at least {} free: waiters poll until \
                     it has room, and the URL is checked when the listener connects",
                    slots.free(),
                    slots.spare()
                );
                return Ok(());
            }
            Decision::Busy if Instant::now() < give_up => {
                std::thread::sleep(crate::backend::jittered(Duration::from_millis(40)));
            }
            Decision::Busy => {
                log::debug!(
                    "leasehold: other listeners were deciding whether to connect to {address}; \
                     the listener URL is checked when this registry's listener connects"
                );
                return Ok(());
            }
            Decision::Failed(e) => {
                log::debug!(
                    "leasehold: the listener URL is checked when the listener connects, since \
                     the server's slots could not be counted now: {e}"
                );
                return Ok(());
            }
        }
    }
}

/// How long `build()` waits out other listeners' decisions before it leaves the listener URL
/// unchecked (see [`check_at_build`]).
pub(super) const BUILD_WAIT: Duration = Duration::from_secs(1);

/// Runs `work` on a connection of `pool` (waiting at most `limit` for one); a connection whose
/// work failed is discarded.
fn on_pooled<R>(
    pool: &Pool<PgManager>,
    limit: Duration,
    work: impl FnOnce(&mut PgConn) -> Result<R, String>,
) -> Result<R, String> {
    let mut pooled = pool.get_timeout(limit).map_err(|e| e.to_string())?;
    let outcome = work(&mut pooled);
    if outcome.is_err() {
        pooled.broken = true;
    }
    if pooled.broken {
        drop(pooled);
        pool.discarded();
    } else {
        pool.give_back(pooled);
    }
    outcome
}

/// Runs `sql` (simple query protocol, statements unnamed) on a pooled connection, giving up
/// after `limit`.
fn simple_query(
    conn: &mut PgConn,
    sql: &str,
    limit: Duration,
) -> Result<Vec<tokio_postgres::SimpleQueryMessage>, String> {
    conn.deadline = Instant::now() + limit;
    call!(conn, |client| client.simple_query(sql)).map_err(|failure| failure.source.to_string())
}

/// What [`Listener::probe`] found.
enum Probe {
    /// The notification arrived: `LISTEN` works here.
    Heard,
    /// It did not, on a connection that works: notifications do not reach this session.
    Deaf,
    /// Sending the notification failed (why): nothing learned.
    Unknown(String),
    /// The listener's own connection failed (why): it is dropped, as when `LISTEN` fails.
    Failed(String),
    /// The registry went away meanwhile.
    Gone,
}

/// The listener's connection: the asynchronous client on a current-thread runtime of its own,
/// opened like a pooled connection ([`connect_on`]: the connect timeout bounds the handshake),
/// whose socket the listener reads itself so that notifications are kept. Every wait on it
/// has a deadline.
struct ListenerConn {
    client: Client,
    /// `None` once the connection has closed.
    connection: Option<PgConnection>,
    /// Notifications read while a statement ran, not handed over yet.
    pending: VecDeque<Notification>,
    /// Declared last, so dropped after the socket it drives.
    runtime: ConnRuntime,
}

impl ListenerConn {
    fn open(config: &Config, tls: &Tls) -> Result<ListenerConn, PgConnError> {
        let runtime = connection_runtime()?;
        let (client, connection) = connect_on(&runtime, config, tls)?;
        Ok(ListenerConn {
            client,
            connection: Some(connection),
            pending: VecDeque::new(),
            runtime,
        })
    }

    fn is_closed(&self) -> bool {
        self.connection.is_none() || self.client.is_closed()
    }

    /// Runs `sql` (simple query protocol), giving up after `limit`.
    fn execute(&mut self, sql: &str, limit: Duration) -> Result<(), String> {
        let mut call = pin!(self.client.batch_execute(sql));
        let outcome = read_messages(
            &self.runtime,
            &mut self.connection,
            &mut self.pending,
            Instant::now() + limit,
            |cx, _, _| call.as_mut().poll(cx),
        );
        match outcome {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(e.to_string()),
            None => Err(format!("no answer within {limit:?}")),
        }
    }

    /// The server's connection slots now (see [`Slots`]), giving up after `limit`.
    fn slots(&mut self, limit: Duration) -> Result<Slots, String> {
        let mut call = pin!(self.client.simple_query(Slots::SQL));
        let outcome = read_messages(
            &self.runtime,
            &mut self.connection,
            &mut self.pending,
            Instant::now() + limit,
            |cx, _, _| call.as_mut().poll(cx),
        );
        let messages = match outcome {
            Some(Ok(messages)) => messages,
            Some(Err(e)) => return Err(e.to_string()),
            None => return Err(format!("no answer within {limit:?}")),
        };
        let row = rows(&messages).next().ok_or("no row")?;
        Slots::from_row(row)
    }

    /// The next notification, waiting until `deadline` at most; `None` at the deadline or once
    /// the connection has closed.
    fn next_notification(&mut self, deadline: Instant) -> Option<Notification> {
        if let Some(notification) = self.pending.pop_front() {
            return Some(notification);
        }
        read_messages(
            &self.runtime,
            &mut self.connection,
            &mut self.pending,
            deadline,
            |_, pending, closed| match pending.pop_front() {
                Some(notification) => Poll::Ready(Some(notification)),
                None if closed => Poll::Ready(None),
                None => Poll::Pending,
            },
        )
        .flatten()
    }
}

/// Reads the messages of a listener's connection on `runtime` — notifications go to `pending`;
/// the connection is dropped once it fails or closes — until `ready` (given the pending
/// notifications and whether the connection has closed) has a result; `None` when `deadline`
/// passes first.
fn read_messages<T>(
    runtime: &Runtime,
    connection: &mut Option<PgConnection>,
    pending: &mut VecDeque<Notification>,
    deadline: Instant,
    mut ready: impl FnMut(&mut Context<'_>, &mut VecDeque<Notification>, bool) -> Poll<T>,
) -> Option<T> {
    let reading = poll_fn(|cx| {
        while let Some(open) = connection.as_mut() {
            match open.poll_message(cx) {
                Poll::Ready(Some(Ok(AsyncMessage::Notification(notification)))) => {
                    pending.push_back(notification);
                }
                Poll::Ready(Some(Ok(AsyncMessage::Notice(notice)))) => {
                    log::info!("{}: {}", notice.severity(), notice.message());
                }
                Poll::Ready(Some(Ok(_))) => {}
                Poll::Ready(Some(Err(e))) => {
                    log::debug!("PostgreSQL release listener connection closed: {e}");
                    *connection = None;
                }
                Poll::Ready(None) => *connection = None,
                Poll::Pending => break,
            }
        }
        ready(cx, pending, connection.is_none())
    });
    // The timer must be made inside the runtime, which owns the clock it registers with.
    runtime.block_on(async { tokio::time::timeout_at(deadline.into(), reading).await.ok() })
}

/// Splits a release notification's payload, `<LOCK_KEY> <TURN_AGE_µs> <REGION>`; a payload
/// without the age (`<LOCK_KEY> <REGION>`, from an older release statement) has age zero.
fn parse_release(payload: &str) -> Option<(&str, Duration, &str)> {
    let (lock_key, rest) = payload.split_once(' ')?;
    match rest.split_once(' ') {
        Some((age, region)) if !age.is_empty() && age.bytes().all(|b| b.is_ascii_digit()) => {
            let micros = age.parse().unwrap_or(u64::MAX);
            Some((lock_key, Duration::from_micros(micros), region))
        }
        _ => Some((lock_key, Duration::ZERO, rest)),
    }
}
