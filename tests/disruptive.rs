//! Disruptive tests: database servers restarted or stopped while leases are held and threads
//! wait, and connections cut or frozen by a loopback TCP proxy between leasehold and the
//! server.
//!
//! They restart the shared test servers, so every test here is `#[ignore]`d and runs in a step
//! of its own, after the other suites, one test at a time:
//!
//! ```sh
//! cargo test --all-features --test disruptive -- --ignored --test-threads=1
//! ```
//!
//! PostgreSQL is restarted with `pg_ctlcluster`, MariaDB with `mysqladmin shutdown` and
//! `start-stop-daemon --pidfile` (as `.ci/run` starts it), started and waited for by its own pid
//! file and port, so that another `mariadbd` beside it (a spare port, a Galera node) is neither
//! taken for it nor disturbed (`common::mariadb`); a guard starts a stopped server again even
//! when a test fails. No process is signalled.
//!
//! A lock held by a thread can only be asked about on that thread (guards are `!Send`), so
//! holders here live on threads of their own, driven by commands ([`Holder`]), and every call
//! that could hang runs under a watchdog ([`within`]) with a generous bound: a call that does not
//! come back in time is reported as blocking past its deadline instead of hanging the suite.
//! Findings are collected and asserted at the end, so one run shows all of them.

#![cfg(any(feature = "postgres", feature = "mysql"))]

mod common;

use common::{Db, Fixture};
use crossbeam_channel::{Receiver, Sender};
use leasehold::{Error, LeaseLost, LockRegistry, RegistryBuilder};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// Bound on waits that only guard against a hang.
const GENEROUS: Duration = Duration::from_secs(60);
/// What a call may take past its own deadline before it counts as blocking past it.
const SLACK: Duration = Duration::from_secs(3);
/// The `idle_between_tries` of `Fixture::builder`.
const FIXTURE_IDLE: Duration = Duration::from_millis(20);

/// Runs `call` on a thread of its own and waits at most `bound` for it: `Err` if it is still
/// running then (the thread is left behind, blocked).
fn within<T: Send + 'static>(
    bound: Duration,
    call: impl FnOnce() -> T + Send + 'static,
) -> Result<(T, Duration), Duration> {
    let (sender, receiver) = crossbeam_channel::bounded(1);
    let started = Instant::now();
    thread::spawn(move || {
        let value = call();
        let _ = sender.send((value, started.elapsed()));
    });
    receiver.recv_timeout(bound).map_err(|_| started.elapsed())
}

/// Findings of one test, asserted together at its end.
#[derive(Default)]
struct Findings(Vec<String>);

impl Findings {
    fn check(&mut self, ok: bool, finding: impl Into<String>) {
        if !ok {
            let finding = finding.into();
            eprintln!("FINDING: {finding}");
            self.0.push(finding);
        }
    }

    /// Checks that `registry` grants a fresh key again (its pool recovered).
    fn check_recovers(&mut self, registry: &LockRegistry, key: &str, what: &str) {
        let lock = registry.obtain(key).unwrap();
        let fresh = within(GENEROUS, move || {
            lock.try_lock_for(Duration::from_secs(20))
                .map(|g| g.is_some())
        });
        self.check(
            matches!(fresh, Ok((Ok(true), _))),
            format!("{what}: {fresh:?}"),
        );
    }

    fn assert_none(self) {
        assert!(self.0.is_empty(), "findings:\n- {}", self.0.join("\n- "));
    }
}

enum HolderCommand {
    IsHeld,
    Renew,
    Unlock,
}

enum HolderReply {
    Held(bool),
    Done(Result<(), Error>),
}

/// A lock held on a thread of its own, driven by commands.
struct Holder {
    commands: Sender<HolderCommand>,
    replies: Receiver<HolderReply>,
    token: u64,
    loss: Receiver<LeaseLost>,
}

impl Holder {
    /// Acquires `key` (waiting at most `GENEROUS`) on a new thread.
    fn start(registry: &LockRegistry, key: &str) -> Holder {
        let lock = registry.obtain(key).unwrap();
        let (commands, inbox) = crossbeam_channel::unbounded::<HolderCommand>();
        let (outbox, replies) = crossbeam_channel::unbounded();
        let (started, start) = crossbeam_channel::bounded(1);
        thread::spawn(move || {
            let guard = match lock.try_lock_for(GENEROUS) {
                Ok(Some(guard)) => guard,
                other => {
                    let _ = started.send(Err(format!("{other:?}")));
                    return;
                }
            };
            let _ = started.send(Ok((guard.fencing_token(), guard.loss_channel())));
            let mut guard = Some(guard);
            for command in inbox {
                let reply = match (command, guard.take()) {
                    (HolderCommand::IsHeld, Some(held)) => {
                        let reply = HolderReply::Held(held.is_held());
                        guard = Some(held);
                        reply
                    }
                    (HolderCommand::Renew, Some(held)) => {
                        let reply = HolderReply::Done(held.renew());
                        guard = Some(held);
                        reply
                    }
                    (HolderCommand::Unlock, Some(held)) => HolderReply::Done(held.unlock()),
                    (_, None) => HolderReply::Held(false),
                };
                if outbox.send(reply).is_err() {
                    return;
                }
            }
        });
        let (token, loss) = start
            .recv_timeout(GENEROUS)
            .expect("the holder thread answers")
            .expect("the holder gets the lock");
        Holder {
            commands,
            replies,
            token,
            loss,
        }
    }

    fn ask(&self, command: HolderCommand, bound: Duration) -> Result<(HolderReply, Duration), ()> {
        let started = Instant::now();
        self.commands.send(command).map_err(|_| ())?;
        let reply = self.replies.recv_timeout(bound).map_err(|_| ())?;
        Ok((reply, started.elapsed()))
    }

    /// `is_held()` on the holder's thread; it never blocks, so a short bound is plenty.
    fn is_held(&self) -> bool {
        match self.ask(HolderCommand::IsHeld, GENEROUS) {
            Ok((HolderReply::Held(held), _)) => held,
            _ => panic!("the holder thread does not answer is_held()"),
        }
    }

    /// `renew()` or `unlock()`, `Err` if it has not returned within `bound`.
    fn run(
        &self,
        command: HolderCommand,
        bound: Duration,
    ) -> Result<(Result<(), Error>, Duration), ()> {
        match self.ask(command, bound)? {
            (HolderReply::Done(outcome), took) => Ok((outcome, took)),
            (HolderReply::Held(_), _) => Err(()),
        }
    }
}

/// A loopback TCP proxy to a database server that can cut or freeze its connections.
struct Proxy {
    address: SocketAddr,
    shared: Arc<ProxyShared>,
}

struct ProxyShared {
    frozen: AtomicBool,
    stopped: AtomicBool,
    connections: Mutex<Vec<TcpStream>>,
}

impl Proxy {
    fn to(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let address = listener.local_addr().unwrap();
        let shared = Arc::new(ProxyShared {
            frozen: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            connections: Mutex::new(Vec::new()),
        });
        let accepting = Arc::clone(&shared);
        thread::spawn(move || {
            while !accepting.stopped.load(Ordering::SeqCst) {
                let client = match listener.accept() {
                    Ok((client, _)) => client,
                    Err(_) => {
                        thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                };
                client.set_nonblocking(false).unwrap();
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                {
                    let mut connections = accepting.connections.lock().unwrap();
                    connections.push(client.try_clone().unwrap());
                    connections.push(server.try_clone().unwrap());
                }
                for (from, to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let pumping = Arc::clone(&accepting);
                    thread::spawn(move || pump(from, to, &pumping));
                }
            }
        });
        Proxy { address, shared }
    }

    /// Stops forwarding bytes in both directions; connections stay open (a hung server or
    /// network). New connections hang too.
    fn freeze(&self) {
        self.shared.frozen.store(true, Ordering::SeqCst);
    }

    fn thaw(&self) {
        self.shared.frozen.store(false, Ordering::SeqCst);
    }

    /// Closes every connection open now (a dropped network or a restarted middlebox).
    fn cut(&self) {
        for stream in self.shared.connections.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// `url` with its host and port replaced by this proxy's.
    fn url_for(&self, url: &str) -> String {
        let (scheme, rest) = url.split_once("://").unwrap();
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let user = authority
            .rsplit_once('@')
            .map(|(user, _)| format!("{user}@"));
        let url = format!(
            "{scheme}://{}{}{path}",
            user.unwrap_or_default(),
            self.address
        );
        if scheme.starts_with("mysql") {
            // The MySQL driver otherwise switches a local server to its Unix socket, around
            // the proxy.
            let separator = if url.contains('?') { '&' } else { '?' };
            format!("{url}{separator}prefer_socket=false")
        } else {
            url
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        self.thaw();
        self.cut();
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, shared: &ProxyShared) {
    let mut buffer = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        while shared.frozen.load(Ordering::SeqCst) && !shared.stopped.load(Ordering::SeqCst) {
            thread::sleep(Duration::from_millis(5));
        }
        if to.write_all(&buffer[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

/// The server URL of a fixture's database.
fn server_url(db: Db) -> String {
    match db {
        Db::Postgres => common::postgres_url(),
        Db::Mysql => common::mysql_url(),
        Db::Sqlite => panic!("SQLite has no server"),
    }
}

/// The host and port a server URL names.
fn server_address(db: Db) -> SocketAddr {
    let url = server_url(db);
    let rest = url.split_once("://").unwrap().1;
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let host = match (host.contains(':'), db) {
        (true, _) => host.to_string(),
        (false, Db::Postgres) => format!("{host}:5432"),
        (false, _) => format!("{host}:3306"),
    };
    host.to_socket_addrs().unwrap().next().unwrap()
}

/// A builder on the fixture's table at `url` (e.g. through a proxy), with the fixture's timings.
fn builder_at(f: &Fixture, url: &str) -> RegistryBuilder {
    let builder = match f.db {
        #[cfg(feature = "postgres")]
        Db::Postgres => LockRegistry::postgres(url),
        #[cfg(feature = "mysql")]
        Db::Mysql => LockRegistry::mysql(url),
        other => panic!("{other:?} is not a server compiled in"),
    };
    builder
        .prefix(f.prefix.clone())
        .idle_between_tries(FIXTURE_IDLE)
        .connect_timeout(Duration::from_secs(3))
}

/// The ids of this process's PostgreSQL release listener threads, found by their name
/// (`leasehold-listen`, which the kernel cuts to 15 bytes) in `/proc/self/task`.
#[cfg(feature = "postgres")]
fn listener_threads() -> std::collections::BTreeSet<String> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Default::default();
    };
    tasks
        .filter_map(|task| {
            let task = task.ok()?;
            let name = std::fs::read_to_string(task.path().join("comm")).ok()?;
            name.starts_with("leasehold-list")
                .then(|| task.file_name().into_string().ok())?
        })
        .collect()
}

/// How many server connections `LISTEN` on the fixture's table now (asked directly, not
/// through a proxy).
#[cfg(feature = "postgres")]
fn listening_backends(f: &Fixture) -> i64 {
    let mut admin = ::postgres::Client::connect(&server_url(f.db), ::postgres::NoTls).unwrap();
    admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE query = $1",
            &[&format!("LISTEN \"{}\"", f.table().to_ascii_lowercase())],
        )
        .unwrap()
        .get(0)
}

/// Waits up to `bound` for `done`; returns whether it came true.
#[cfg(feature = "postgres")]
fn eventually(bound: Duration, mut done: impl FnMut() -> bool) -> bool {
    let give_up = Instant::now() + bound;
    while !done() {
        if Instant::now() >= give_up {
            return false;
        }
        thread::sleep(Duration::from_millis(50));
    }
    true
}

/// Makes the fail point `name` freeze `proxy` the first time it is reached; the flag tells
/// whether it was.
#[cfg(all(feature = "postgres", feature = "failpoints"))]
fn freeze_at(proxy: &Proxy, name: &'static str) -> Arc<AtomicBool> {
    let fired = Arc::new(AtomicBool::new(false));
    let (flag, shared) = (Arc::clone(&fired), Arc::clone(&proxy.shared));
    fail::cfg_callback(name, move || {
        if !flag.swap(true, Ordering::SeqCst) {
            shared.frozen.store(true, Ordering::SeqCst);
        }
    })
    .unwrap();
    fired
}

/// Starting, stopping and restarting the local test servers.
mod server {
    use super::{Db, GENEROUS};
    use crate::common::mariadb::{run, Mariadb};
    use std::process::Command;
    use std::time::{Duration, Instant};

    fn succeeds(program: &str, args: &[&str]) -> bool {
        Command::new(program)
            .args(args)
            .output()
            .is_ok_and(|out| out.status.success())
    }

    fn postgres_version() -> String {
        let mut versions: Vec<String> = std::fs::read_dir("/etc/postgresql")
            .expect("a PostgreSQL cluster in /etc/postgresql")
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .collect();
        versions.sort();
        versions.into_iter().next().expect("a PostgreSQL version")
    }

    fn pg_ctlcluster(action: &str) {
        let version = postgres_version();
        run(
            "pg_ctlcluster",
            &["--skip-systemctl-redirect", &version, "main", action],
        );
    }

    pub fn is_up(db: Db) -> bool {
        match db {
            Db::Postgres => succeeds("pg_isready", &["-h", "127.0.0.1", "-p", "5432", "-q"]),
            Db::Mysql => Mariadb::system().is_up(),
            Db::Sqlite => true,
        }
    }

    /// How long a server may take to stop or start on a busy machine (MariaDB flushes its
    /// buffer pool and may recover on start).
    const SERVER_DEADLINE: Duration = Duration::from_secs(180);

    fn wait_for(db: Db, up: bool) {
        let give_up = Instant::now() + GENEROUS;
        while is_up(db) != up {
            assert!(Instant::now() < give_up, "{db:?} did not go up={up}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn stop(db: Db) {
        match db {
            Db::Postgres => {
                pg_ctlcluster("stop");
                wait_for(db, false);
            }
            Db::Mysql => Mariadb::system().stop(SERVER_DEADLINE),
            Db::Sqlite => {}
        }
    }

    pub fn start(db: Db) {
        match db {
            Db::Postgres => {
                pg_ctlcluster("start");
                wait_for(db, true);
            }
            Db::Mysql => Mariadb::system().start(SERVER_DEADLINE),
            Db::Sqlite => {}
        }
    }

    pub fn restart(db: Db) {
        match db {
            Db::Postgres => {
                pg_ctlcluster("restart");
                wait_for(db, true);
            }
            _ => {
                stop(db);
                start(db);
            }
        }
    }

    /// Starts the server again when dropped, if it is down (a failed test must not leave it
    /// stopped for the suites after it).
    pub struct KeepUp(pub Db);

    impl Drop for KeepUp {
        fn drop(&mut self) {
            if !is_up(self.0) {
                eprintln!("restarting {:?} after the test", self.0);
                start(self.0);
            }
        }
    }
}

mod suite {
    use super::*;

    /// A holder keeps its lease through a quick restart (renewing on new connections) or
    /// reports it lost; threads of another instance waiting for the locks get them once the
    /// holder lets go; nothing panics or hangs; both registries work afterwards.
    pub fn a_server_restart_while_leases_are_held_and_threads_wait(f: &Fixture) {
        let _keep_up = server::KeepUp(f.db);
        let mut findings = Findings::default();
        let holder_registry = f
            .builder()
            .time_to_live(Duration::from_secs(10))
            .build()
            .unwrap();
        let waiter_registry = f.registry();
        let keys = ["restart-0", "restart-1"];
        let holders: Vec<Holder> = keys
            .iter()
            .map(|key| Holder::start(&holder_registry, key))
            .collect();
        let (results, waited) = crossbeam_channel::unbounded();
        let mut waiters = Vec::new();
        for waiter in 0..3 {
            let lock = waiter_registry.obtain(keys[waiter % 2]).unwrap();
            let results = results.clone();
            waiters.push(thread::spawn(move || {
                let outcome = lock.try_lock_for(GENEROUS).map(|guard| {
                    guard.map(|guard| {
                        let token = guard.fencing_token();
                        (token, guard.unlock().map_err(|e| e.to_string()))
                    })
                });
                let _ = results.send((waiter, outcome.map_err(|e| e.to_string())));
            }));
        }
        drop(results);
        thread::sleep(Duration::from_millis(300));
        let restart_began = Instant::now();
        server::restart(f.db);
        println!("{:?} restarted in {:?}", f.db, restart_began.elapsed());
        // Let renewals run into the new server before judging the holders.
        thread::sleep(Duration::from_secs(4));
        // Waiters that came back before any holder unlocked (each waits on keys[waiter % 2]).
        let early: Vec<_> = waited.try_iter().collect();
        for (holder, key) in holders.iter().zip(keys) {
            let held = holder.is_held();
            let lost = holder.loss.try_recv().ok();
            match &lost {
                None => println!("{key}: lease kept through the restart"),
                Some(lost) => println!("{key}: loss reported: {}", lost.reason),
            }
            findings.check(
                held == lost.is_none(),
                format!("{key}: is_held() = {held} but loss message {lost:?}"),
            );
            if held {
                findings.check(
                    !early.iter().any(|(waiter, _)| keys[waiter % 2] == key),
                    format!("{key}: a waiter got a lock its holder still holds"),
                );
            }
            match holder.run(HolderCommand::Unlock, Duration::from_secs(5) + SLACK) {
                Ok((outcome, took)) => {
                    findings.check(
                        outcome.is_ok() == held,
                        format!("{key}: held = {held}, unlock() = {outcome:?} after {took:?}"),
                    );
                }
                Err(()) => findings.check(false, format!("{key}: unlock() blocked")),
            }
        }
        let late = (early.len()..3).map(|_| waited.recv_timeout(GENEROUS));
        for result in early.into_iter().map(Ok).chain(late) {
            match result {
                Ok((waiter, Ok(Some((_, Ok(())))))) => println!("waiter {waiter} resumed"),
                Ok((waiter, other)) => findings.check(false, format!("waiter {waiter}: {other:?}")),
                Err(_) => findings.check(false, "a waiter never came back".to_string()),
            }
        }
        for waiter in waiters {
            findings.check(waiter.join().is_ok(), "a waiter panicked");
        }
        for registry in [&holder_registry, &waiter_registry] {
            findings.check_recovers(registry, "after-restart", "pool did not recover");
        }
        findings.assert_none();
    }

    /// An outage longer than the time-to-live: the holder reports the loss by its deadline,
    /// calls made during the outage return by their deadlines, and after the server is back
    /// a waiting instance takes the lock with a larger token.
    pub fn an_outage_longer_than_the_ttl_reports_the_loss_and_recovers(f: &Fixture) {
        let _keep_up = server::KeepUp(f.db);
        let mut findings = Findings::default();
        let ttl = Duration::from_secs(2);
        let holder_registry = f
            .builder()
            .time_to_live(ttl)
            .operation_timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        let holder = Holder::start(&holder_registry, "outage");
        let waiter = f.registry().obtain("outage").unwrap();
        let (waiter_result, waited) = crossbeam_channel::bounded(1);
        thread::spawn(move || {
            let outcome = waiter
                .try_lock_for(GENEROUS)
                .map(|g| g.map(|g| g.fencing_token()));
            let _ = waiter_result.send(outcome);
        });
        server::stop(f.db);
        let stopped_at = Instant::now();
        let lock = holder_registry.obtain("during-outage").unwrap();
        let attempt = within(Duration::from_millis(500) + SLACK, move || {
            lock.try_lock_for(Duration::from_millis(500))
                .map(|g| g.is_some())
        });
        findings.check(
            matches!(attempt, Ok((Err(_) | Ok(false), _))),
            format!("try_lock_for(500ms) while the server is down: {attempt:?}"),
        );
        match holder.loss.recv_timeout(ttl + SLACK) {
            Ok(lost) => println!(
                "{:?}: loss reported {:?} after the stop: {}",
                f.db,
                stopped_at.elapsed(),
                lost.reason
            ),
            Err(e) => findings.check(false, format!("no loss reported within TTL: {e}")),
        }
        findings.check(
            !holder.is_held(),
            "is_held() after the outage outlived the TTL",
        );
        match holder.run(HolderCommand::Unlock, Duration::from_secs(2) + SLACK) {
            Ok((outcome, took)) => findings.check(
                matches!(outcome, Err(Error::LeaseLost { .. })),
                format!("unlock() during the outage: {outcome:?} after {took:?}"),
            ),
            Err(()) => findings.check(false, "unlock() during the outage blocked"),
        }
        findings.check(
            waited.is_empty(),
            "the waiter got the lock during the outage",
        );
        server::start(f.db);
        match waited.recv_timeout(GENEROUS) {
            Ok(Ok(Some(token))) => findings.check(
                token > holder.token,
                format!("token {token} after the outage <= {}", holder.token),
            ),
            other => findings.check(false, format!("the waiter after the outage: {other:?}")),
        }
        findings.check_recovers(&holder_registry, "after-outage", "pool did not recover");
        findings.assert_none();
    }

    /// With every byte between registry and server held back, calls return by their
    /// deadlines, the lease is reported lost no later than another instance takes it, and the
    /// registry works again once the connection thaws.
    pub fn a_frozen_connection_does_not_block_calls_past_their_deadlines(f: &Fixture) {
        let mut findings = Findings::default();
        let proxy = Proxy::to(server_address(f.db));
        let ttl = Duration::from_secs(3);
        let holder_registry = builder_at(f, &proxy.url_for(&server_url(f.db)))
            .time_to_live(ttl)
            .operation_timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        let other = f.registry();
        let holder = Holder::start(&holder_registry, "frozen");
        proxy.freeze();
        let lock = holder_registry.obtain("frozen-other").unwrap();
        let attempt = within(Duration::from_millis(500) + SLACK, move || {
            lock.try_lock_for(Duration::from_millis(500))
                .map(|g| g.is_some())
        });
        findings.check(
            matches!(attempt, Ok((Err(_) | Ok(false), _))),
            format!("try_lock_for(500ms) through a frozen connection: {attempt:?}"),
        );
        let taken = other
            .obtain("frozen")
            .unwrap()
            .try_lock_for(ttl + FIXTURE_IDLE + Duration::from_secs(15))
            .unwrap();
        let taken_at = Instant::now();
        let reported_before_takeover = !holder.loss.is_empty();
        findings.check(taken.is_some(), "no takeover of a frozen holder's lease");
        let held = holder.is_held();
        findings.check(
            !held,
            "is_held() still true when another instance holds the lock",
        );
        match holder.loss.recv_timeout(SLACK) {
            Ok(lost) => println!(
                "{:?}: loss message (already there when the other instance got the lock: \
                 {reported_before_takeover}; read {:?} later): {}",
                f.db,
                taken_at.elapsed(),
                lost.reason
            ),
            Err(_) => findings.check(
                false,
                format!(
                    "no loss message within {SLACK:?} of another instance taking the lock \
                     (the renewal is stuck on the frozen connection)"
                ),
            ),
        }
        match holder.run(HolderCommand::Unlock, Duration::from_secs(2) + SLACK) {
            Ok((outcome, took)) => findings.check(
                matches!(outcome, Err(Error::LeaseLost { .. })),
                format!("unlock() through a frozen connection: {outcome:?} after {took:?}"),
            ),
            Err(()) => findings.check(
                false,
                "unlock() through a frozen connection blocked past operation_timeout",
            ),
        }
        proxy.thaw();
        findings.check_recovers(
            &holder_registry,
            "after-thaw",
            "registry did not recover after the thaw",
        );
        if let Some(guard) = taken {
            findings.check(guard.unlock().is_ok(), "the taker lost its lease");
        }
        findings.assert_none();
    }

    /// A server that accepts connections but never answers (a hung server behind a live
    /// socket): `build()` gives up after `connect_timeout` with an error instead of hanging.
    pub fn building_against_a_server_that_never_answers_fails_in_time(f: &Fixture) {
        let proxy = Proxy::to(server_address(f.db));
        proxy.freeze();
        let url = proxy.url_for(&server_url(f.db));
        let builder = builder_at(f, &url).connect_timeout(Duration::from_secs(1));
        let built = within(Duration::from_secs(1) + SLACK, move || {
            builder.build().map(drop)
        });
        assert!(
            matches!(built, Ok((Err(_), _))),
            "build() against a silent server: {built:?}"
        );
        proxy.thaw();
    }

    /// `build()` (notifications on, the default) opens no listener connection; the first
    /// thread that waits has the listener connect, and the server stops answering just then:
    /// once it answers again the listener subscribes, and a release wakes the waiter at once
    /// (it polls only every 30 s).
    #[cfg(all(feature = "postgres", feature = "failpoints"))]
    pub fn a_listener_that_gets_no_answer_when_connecting_comes_back(f: &Fixture) {
        let _scenario = fail::FailScenario::setup();
        let mut findings = Findings::default();
        let proxy = Proxy::to(server_address(f.db));
        let connect_timeout = Duration::from_secs(2);
        let builder = builder_at(f, &proxy.url_for(&server_url(f.db)))
            .notifications(true)
            .connect_timeout(connect_timeout)
            .idle_between_tries(Duration::from_secs(30));
        let fired = freeze_at(&proxy, "postgres::listener_before_connect");
        let built = within(connect_timeout + SLACK, move || builder.build());
        findings.check(
            !fired.load(Ordering::SeqCst),
            "build() connected a listener before any thread waited",
        );
        let registry = match built {
            Ok((Ok(registry), took)) => {
                println!("build() returned in {took:?}");
                registry
            }
            Ok((Err(e), took)) => {
                findings.check(false, format!("build() failed after {took:?}: {e}"));
                return findings.assert_none();
            }
            Err(waited) => {
                findings.check(
                    false,
                    format!(
                        "build() with connect_timeout({connect_timeout:?}) still blocked after \
                         {waited:?} on the listener's connection"
                    ),
                );
                return findings.assert_none();
            }
        };
        let holder = f.registry();
        let guard = holder.obtain("silent-listener").unwrap().lock().unwrap();
        let lock = registry.obtain("silent-listener").unwrap();
        let (granted, got) = crossbeam_channel::bounded(1);
        thread::spawn(move || {
            let outcome = lock.try_lock_for(GENEROUS).map(|g| g.map(|g| g.unlock()));
            let _ = granted.send(format!("{outcome:?}"));
        });
        findings.check(
            eventually(Duration::from_secs(10), || fired.load(Ordering::SeqCst)),
            "the waiting thread did not have the listener connect",
        );
        fail::remove("postgres::listener_before_connect");
        proxy.thaw();
        findings.check(
            eventually(Duration::from_secs(10), || listening_backends(f) == 1),
            "the listener did not subscribe once the server answered again",
        );
        thread::sleep(Duration::from_millis(300));
        let released = Instant::now();
        guard.unlock().unwrap();
        match got.recv_timeout(Duration::from_secs(10)) {
            Ok(outcome) => {
                println!(
                    "waiter: {outcome} {:?} after the release",
                    released.elapsed()
                );
                findings.check(outcome == "Ok(Some(Ok(())))", format!("waiter: {outcome}"));
            }
            Err(_) => findings.check(false, "the release did not wake the waiter"),
        }
        findings.assert_none();
    }

    /// The listener's connection freezes while it is subscribed, so its `UNLISTEN` (sent once
    /// the registry stops waiting) gets no answer: dropping the registry still ends the
    /// listener thread within one bounded call.
    #[cfg(feature = "postgres")]
    pub fn a_listener_frozen_in_unlisten_ends_with_its_registry(f: &Fixture) {
        frozen_listener_ends_with_its_registry(f, None);
    }

    /// The server stops answering just as the listener sends `LISTEN`: dropping the registry
    /// still ends the listener thread within one bounded call.
    #[cfg(all(feature = "postgres", feature = "failpoints"))]
    pub fn a_listener_frozen_in_listen_ends_with_its_registry(f: &Fixture) {
        let _scenario = fail::FailScenario::setup();
        frozen_listener_ends_with_its_registry(f, Some("postgres::listener_before_listen"));
    }

    /// A registry through a proxy waits for a lock another instance holds, so its listener
    /// subscribes; the proxy freezes (at the fail point `freeze_at`, else once the
    /// subscription shows on the server); the waiter gives up, the registry is dropped, and its
    /// listener thread must end within `connect_timeout` (the bound of every listener call)
    /// plus a tick and slack.
    #[cfg(feature = "postgres")]
    fn frozen_listener_ends_with_its_registry(f: &Fixture, freeze_at_point: Option<&'static str>) {
        let mut findings = Findings::default();
        let proxy = Proxy::to(server_address(f.db));
        let connect_timeout = Duration::from_secs(2);
        let before = listener_threads();
        let registry = builder_at(f, &proxy.url_for(&server_url(f.db)))
            .connect_timeout(connect_timeout)
            .operation_timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        // A thread names itself once it runs.
        let mut ours = Vec::new();
        eventually(Duration::from_secs(2), || {
            ours = listener_threads().difference(&before).cloned().collect();
            !ours.is_empty()
        });
        assert_eq!(
            ours.len(),
            1,
            "one new thread named leasehold-listen in /proc/self/task: {ours:?}"
        );
        let other = f.registry();
        let holder = Holder::start(&other, "frozen-listener");
        #[cfg(feature = "failpoints")]
        let fired = freeze_at_point.map(|name| freeze_at(&proxy, name));
        #[cfg(not(feature = "failpoints"))]
        let fired: Option<Arc<AtomicBool>> = freeze_at_point.map(|_| unreachable!());
        let lock = registry.obtain("frozen-listener").unwrap();
        let (waited, waiter) = crossbeam_channel::bounded(1);
        thread::spawn(move || {
            let outcome = lock
                .try_lock_for(Duration::from_secs(3))
                .map(|g| g.is_some());
            let _ = waited.send(outcome);
        });
        match &fired {
            Some(fired) => assert!(
                eventually(Duration::from_secs(10), || fired.load(Ordering::SeqCst)),
                "the listener never reached {freeze_at_point:?}"
            ),
            None => {
                assert!(
                    eventually(Duration::from_secs(10), || listening_backends(f) == 1),
                    "the listener did not subscribe"
                );
                // Let the answer to LISTEN reach the listener before freezing.
                thread::sleep(Duration::from_millis(300));
                proxy.freeze();
            }
        }
        let outcome = waiter.recv_timeout(GENEROUS);
        findings.check(
            matches!(outcome, Ok(Err(_) | Ok(false))),
            format!("the waiter through a frozen proxy: {outcome:?}"),
        );
        // Two ticks without a waiter: the listener unsubscribes (or still tries to subscribe).
        thread::sleep(Duration::from_millis(3500));
        drop(registry);
        let dropped = Instant::now();
        let bound = connect_timeout + Duration::from_secs(1) + SLACK;
        let ended = eventually(bound, || !listener_threads().contains(&ours[0]));
        if ended {
            println!(
                "the listener thread ended {:?} after the registry",
                dropped.elapsed()
            );
        }
        findings.check(
            ended,
            format!(
                "the listener thread of a dropped registry (frozen at {}) still runs after \
                 {:?}",
                freeze_at_point.unwrap_or("UNLISTEN"),
                dropped.elapsed()
            ),
        );
        proxy.thaw();
        match holder.run(HolderCommand::Unlock, GENEROUS) {
            Ok((outcome, _)) => findings.check(outcome.is_ok(), format!("unlock(): {outcome:?}")),
            Err(()) => findings.check(false, "unlock() blocked"),
        }
        findings.assert_none();
    }

    /// Connections cut again and again: renewals and releases go through on new connections
    /// and the lease is kept.
    pub fn cut_connections_are_replaced_and_the_lease_kept(f: &Fixture) {
        let mut findings = Findings::default();
        let proxy = Proxy::to(server_address(f.db));
        let holder_registry = builder_at(f, &proxy.url_for(&server_url(f.db)))
            .time_to_live(Duration::from_secs(2))
            .build()
            .unwrap();
        let other = f.registry().obtain("cut").unwrap();
        let holder = Holder::start(&holder_registry, "cut");
        for _ in 0..6 {
            proxy.cut();
            thread::sleep(Duration::from_millis(500));
            findings.check(
                other.try_lock().unwrap().is_none(),
                "another instance took a lease whose holder only lost connections",
            );
        }
        findings.check(holder.is_held(), "lease lost to cut connections");
        findings.check(
            holder.loss.try_recv().is_err(),
            "loss reported for cut connections",
        );
        proxy.cut();
        match holder.run(HolderCommand::Renew, GENEROUS) {
            Ok((outcome, _)) => {
                findings.check(outcome.is_ok(), format!("renew() after a cut: {outcome:?}"))
            }
            Err(()) => findings.check(false, "renew() after a cut blocked"),
        }
        proxy.cut();
        match holder.run(HolderCommand::Unlock, GENEROUS) {
            Ok((outcome, _)) => findings.check(
                outcome.is_ok(),
                format!("unlock() after a cut: {outcome:?}"),
            ),
            Err(()) => findings.check(false, "unlock() after a cut blocked"),
        }
        let taken = other.try_lock_for(Duration::from_secs(10)).unwrap();
        findings.check(
            taken
                .as_ref()
                .is_some_and(|g| g.fencing_token() > holder.token),
            "the released lock was not free for another instance",
        );
        findings.assert_none();
    }
}

/// One `#[ignore]`d test per suite function for a backend.
macro_rules! disruptive {
    ($db:expr; $($test:ident),* $(,)?) => {
        $(
            #[test]
            #[ignore = "disrupts shared servers: run by .ci/run in its own step"]
            fn $test() {
                if let Some(fixture) = $crate::common::Fixture::new($db, stringify!($test)) {
                    $crate::suite::$test(&fixture);
                }
            }
        )*
    };
}

macro_rules! all_disruptive {
    ($db:expr) => {
        disruptive!($db;
            a_frozen_connection_does_not_block_calls_past_their_deadlines,
            cut_connections_are_replaced_and_the_lease_kept,
            building_against_a_server_that_never_answers_fails_in_time,
            a_server_restart_while_leases_are_held_and_threads_wait,
            an_outage_longer_than_the_ttl_reports_the_loss_and_recovers,
        );
    };
}

#[cfg(feature = "postgres")]
mod postgres {
    all_disruptive!(crate::common::Db::Postgres);
    disruptive!(crate::common::Db::Postgres;
        a_listener_frozen_in_unlisten_ends_with_its_registry,
    );
    #[cfg(feature = "failpoints")]
    disruptive!(crate::common::Db::Postgres;
        a_listener_that_gets_no_answer_when_connecting_comes_back,
        a_listener_frozen_in_listen_ends_with_its_registry,
    );
}

#[cfg(feature = "mysql")]
mod mysql {
    all_disruptive!(crate::common::Db::Mysql);
}

/// The proxy itself forwards, freezes and cuts (no server needed: an echo server stands in).
#[test]
fn the_proxy_forwards_freezes_and_cuts() {
    let echo = TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = echo.local_addr().unwrap();
    thread::spawn(move || {
        for stream in echo.incoming() {
            let Ok(mut stream) = stream else { break };
            thread::spawn(move || {
                let mut buffer = [0u8; 64];
                while let Ok(n @ 1..) = stream.read(&mut buffer) {
                    if stream.write_all(&buffer[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    let proxy = Proxy::to(upstream);
    assert_eq!(
        proxy.url_for("postgres://postgres@127.0.0.1:5432/test"),
        format!("postgres://postgres@{}/test", proxy.address)
    );
    let mut client = TcpStream::connect(proxy.address).unwrap();
    client
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut reply = [0u8; 4];
    client.write_all(b"ping").unwrap();
    client.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"ping");
    proxy.freeze();
    client.write_all(b"held").unwrap();
    assert!(
        client.read_exact(&mut reply).is_err(),
        "forwarded while frozen"
    );
    proxy.thaw();
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    client.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"held");
    proxy.cut();
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    match client.read(&mut reply) {
        Ok(0) => {}
        Err(e) if !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("the connection is still open after a cut: {other:?}"),
    }
}
