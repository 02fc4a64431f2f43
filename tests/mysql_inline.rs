//! MySQL/MariaDB statements run on their caller's thread, bounded by the caller's deadline
//! through the connection's socket (`src/backend/mysql/mod.rs`, "Deadlines").
//! A server that stops answering is stood for by a loopback proxy that stops forwarding, in
//! both directions, while its connections stay open: a statement then gets no answer at all.

#![cfg(all(feature = "failpoints", feature = "mysql"))]

mod common;

use common::{Db, Fixture};
use leasehold::LockRegistry;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// A loopback proxy to the MySQL server that forwards until [`Silence::freeze`], then holds
/// whatever either side sends (forwarded again after [`Silence::thaw`]); or, after
/// [`Silence::trickle`], forwards the server's answers one byte every [`TRICKLE`].
struct Silence {
    address: SocketAddr,
    frozen: Arc<AtomicBool>,
    trickling: Arc<AtomicBool>,
}

/// The pause before each byte a trickling proxy forwards: shorter than the socket's read
/// timeout (the deadline, 2 s), so that every read gets a byte in time.
const TRICKLE: Duration = Duration::from_millis(1500);

impl Silence {
    fn to(server: SocketAddr) -> Silence {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let frozen = Arc::new(AtomicBool::new(false));
        let trickling = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&frozen);
        let slow = Arc::clone(&trickling);
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(upstream) = TcpStream::connect(server) else {
                    continue;
                };
                // Only the server's answers trickle: a request trickling to the server would
                // leave the client's read without a byte for longer than its timeout.
                let never = Arc::new(AtomicBool::new(false));
                for (from, to, trickling) in [
                    (
                        client.try_clone().unwrap(),
                        upstream.try_clone().unwrap(),
                        never,
                    ),
                    (upstream, client, Arc::clone(&slow)),
                ] {
                    let flag = Arc::clone(&flag);
                    thread::spawn(move || forward(from, to, &flag, &trickling));
                }
            }
        });
        Silence {
            address,
            frozen,
            trickling,
        }
    }

    fn trickle(&self) {
        self.trickling.store(true, Ordering::SeqCst);
    }

    fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    fn thaw(&self) {
        self.frozen.store(false, Ordering::SeqCst);
        self.trickling.store(false, Ordering::SeqCst);
    }

    /// `url` with its server replaced by this proxy, over TCP only (the driver would otherwise
    /// switch a connection to 127.0.0.1 over to the server's Unix socket, `prefer_socket`).
    fn url(&self, url: &str, server: SocketAddr) -> String {
        let replaced = url.replacen(&server.to_string(), &self.address.to_string(), 1);
        assert_ne!(replaced, url, "the URL names {server}");
        let separator = if replaced.contains('?') { '&' } else { '?' };
        format!("{replaced}{separator}prefer_socket=false")
    }
}

/// Copies `from` to `to`, holding the bytes read while `frozen` until it is not, and passing
/// them on a byte every [`TRICKLE`] while `trickling`.
fn forward(mut from: TcpStream, mut to: TcpStream, frozen: &AtomicBool, trickling: &AtomicBool) {
    let mut buffer = [0u8; 16 * 1024];
    'copy: loop {
        let n = match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        while frozen.load(Ordering::SeqCst) {
            thread::sleep(Duration::from_millis(5));
        }
        let mut sent = 0;
        while sent < n && trickling.load(Ordering::SeqCst) {
            thread::sleep(TRICKLE);
            if to.write_all(&buffer[sent..=sent]).is_err() {
                break 'copy;
            }
            sent += 1;
        }
        if to.write_all(&buffer[sent..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

/// The test server's address, from its URL.
fn server_address() -> SocketAddr {
    let opts = mysql::Opts::from_url(&common::mysql_url()).unwrap();
    let host = opts.get_ip_or_hostname();
    let host = if host == "localhost" {
        "127.0.0.1"
    } else {
        &host
    };
    format!("{host}:{}", opts.get_tcp_port()).parse().unwrap()
}

/// An acquire whose server stops answering returns at its caller's deadline, having run on the
/// caller's own thread (no statement thread between them). The socket's own timeout is far
/// longer (the connect timeout, 30 s here), so only the deadline's bound can end the wait in
/// time. The connection is discarded: with a one-connection pool, the next statement gets a
/// new one once the server answers, and the lease held meanwhile is unharmed. Fails before
/// the change (the statement ran on a statement thread).
#[test]
fn a_statement_the_server_does_not_answer_returns_at_its_callers_deadline_on_its_thread() {
    let scenario = fail::FailScenario::setup();
    let server = server_address();
    silent_server("inline_silence", Silence::freeze, |_, proxy| {
        Some(proxy.url(&common::mysql_url(), server))
    });
    scenario.teardown();
}

/// An answer that trickles in — a byte at a time, each within the socket's read timeout —
/// does not hold the call past its deadline either: the deadline watchdog shuts the socket
/// down (`backend/mysql/watchdog.rs`). Fails before it: each read waited at most what was left
/// when the call began, and the trickle (at least a dozen bytes, 1.5 s apart) held the acquire
/// for 20 s and more.
#[test]
fn a_statement_whose_answer_trickles_in_returns_at_its_callers_deadline() {
    let scenario = fail::FailScenario::setup();
    let server = server_address();
    silent_server("inline_trickle", Silence::trickle, |_, proxy| {
        Some(proxy.url(&common::mysql_url(), server))
    });
    scenario.teardown();
}

/// The same over TLS (`ssl-mode=REQUIRED`, the TLS-only user of `tests/tls.rs`): the socket
/// whose timeouts carry the deadline is the TCP socket beneath the TLS stream. Where that user
/// cannot connect it fails under `CI=true` and is skipped otherwise, like `tests/tls.rs`.
#[cfg(feature = "mysql-tls")]
#[test]
fn a_tls_statement_the_server_does_not_answer_returns_at_its_callers_deadline() {
    let scenario = fail::FailScenario::setup();
    let server = server_address();
    silent_server("inline_silence_tls", Silence::freeze, |f, proxy| {
        let url = format!("mysql://leasehold_tls:leasehold_tls@{server}/test?ssl-mode=REQUIRED");
        let direct = LockRegistry::mysql(url.as_str())
            .prefix(f.prefix.clone())
            .connect_timeout(Duration::from_secs(15))
            .build();
        if let Err(e) = direct {
            common::skip_or_fail(&format!(
                "the TLS-only user cannot connect ({e}); .ci/run sets the server up"
            ));
            return None;
        }
        Some(proxy.url(&url, server))
    });
    scenario.teardown();
}

/// Builds a registry on the URL `through` gives for the proxy (`None`: skipped) and checks
/// what the tests above say.
fn silent_server(
    test: &str,
    misbehave: fn(&Silence),
    through: impl Fn(&Fixture, &Silence) -> Option<String>,
) {
    let Some(f) = Fixture::new(Db::Mysql, test) else {
        return;
    };
    let proxy = Silence::to(server_address());
    let Some(url) = through(&f, &proxy) else {
        return;
    };
    let operation_timeout = Duration::from_secs(2);
    let registry = LockRegistry::mysql(url)
        .prefix(f.prefix.clone())
        .pool_size(1)
        .connect_timeout(Duration::from_secs(30))
        .operation_timeout(operation_timeout)
        .time_to_live(Duration::from_secs(60))
        .notifications(false)
        .build()
        .unwrap();
    let guard = registry.obtain("held").unwrap().lock().unwrap();
    // Where each acquire statement runs.
    let runs_on = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&runs_on);
    fail::cfg_callback("backend::acquire_sent", move || {
        seen.lock().unwrap().push(thread::current().id());
    })
    .unwrap();

    misbehave(&proxy);
    let started = Instant::now();
    let outcome = registry.obtain("silent").unwrap().try_lock();
    let waited = started.elapsed();
    assert!(
        outcome.is_err(),
        "the acquire returned {outcome:?}: it got its whole answer instead of ending at its \
         deadline"
    );
    assert!(
        waited < Duration::from_secs(15),
        "the acquire waited {waited:?}: past its deadline ({operation_timeout:?}), as long as \
         the socket's own timeout"
    );
    assert!(
        waited >= operation_timeout - Duration::from_millis(100),
        "gave up after {waited:?}, before its deadline"
    );
    let me = thread::current().id();
    let threads = runs_on.lock().unwrap().clone();
    assert!(
        !threads.is_empty() && threads.iter().all(|t| *t == me),
        "the statement ran on {threads:?}, not on its caller's thread {me:?}"
    );

    // The server answers again: a new connection serves the next statements (the pool's only
    // one was discarded); the held lease never depended on the silent statement. (The proxy
    // now hands the server the abandoned acquire, whose grant, if any, nobody counts on: it
    // runs out.)
    proxy.thaw();
    assert!(guard.is_held());
    let next = registry
        .obtain("next")
        .unwrap()
        .try_lock_for(Duration::from_secs(10))
        .unwrap()
        .expect("a free lock, on a new connection");
    next.unlock().unwrap();
    guard.unlock().unwrap();
}
