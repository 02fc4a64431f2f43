//! Errors of `build()` that name their cause, against the real local servers: a URL pointed at
//! a server of another kind (PostgreSQL at MariaDB's port, MySQL at PostgreSQL's, either at a
//! Redis server), an unknown host, and a closed port. The first three are permanent and must
//! come back at once, well before the connect timeout; a closed port (a server that may be
//! starting) is retried until the connect timeout.
//!
//! The servers: PostgreSQL at 127.0.0.1:5432 and MariaDB at 127.0.0.1:3306 (the addresses of
//! `LEASEHOLD_POSTGRES_URL` / `LEASEHOLD_MYSQL_URL` when set), Redis at 127.0.0.1:6379
//! (`LEASEHOLD_REDIS_ADDR`). A server that does not answer makes the test fail under `CI=true`
//! and skip with a printed reason otherwise; the Redis cases skip (printed) when no Redis
//! answers.

#![cfg(any(feature = "postgres", feature = "mysql"))]

mod common;

use leasehold::{Error, LockRegistry, RegistryBuilder};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The connect timeout of these registries: a permanent failure must come back well before it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// How soon a permanent failure must come back.
const AT_ONCE: Duration = Duration::from_secs(5);
/// A host name that never resolves (RFC 6761 reserves `.invalid`).
const UNKNOWN_HOST: &str = "no-such-host.invalid";

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// `host:port` of a server URL (`scheme://[user@]host:port/...`).
fn url_address(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?']).next()?;
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    host_port.contains(':').then(|| host_port.to_string())
}

/// Where the PostgreSQL server is, for the MySQL URL aimed at it.
#[cfg(feature = "mysql")]
fn postgres_address() -> String {
    url_address(&common::postgres_url()).unwrap_or_else(|| "127.0.0.1:5432".into())
}

/// Where the MariaDB server is, for the PostgreSQL URL aimed at it.
#[cfg(feature = "postgres")]
fn mysql_address() -> String {
    url_address(&common::mysql_url()).unwrap_or_else(|| "127.0.0.1:3306".into())
}

fn redis_address() -> String {
    std::env::var("LEASEHOLD_REDIS_ADDR").unwrap_or_else(|_| "127.0.0.1:6379".into())
}

fn socket_address(address: &str) -> Option<SocketAddr> {
    address.to_socket_addrs().ok()?.next()
}

/// Whether something accepts TCP connections at `address`.
fn listening(address: &str) -> bool {
    socket_address(address)
        .is_some_and(|a| TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_ok())
}

/// Whether a Redis server answers `PING` at `address`.
fn redis_answers(address: &str) -> bool {
    let Some(addr) = socket_address(address) else {
        return false;
    };
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let mut answer = [0u8; 5];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut answer).is_ok()
        && &answer == b"+PONG"
}

/// Whether the server a test needs is there: `false` (printed) when it is not and `CI` is not
/// set; panics under `CI=true`.
fn server_up(what: &str, address: &str, test: &str) -> bool {
    if listening(address) {
        return true;
    }
    if ci() {
        panic!("{what} at {address} is required for {test} but does not accept connections");
    }
    common::skipped(&format!(
        "{test}: no {what} at {address}; set CI=true to fail instead"
    ));
    false
}

/// Builds `builder` with the test's connect timeout; the error, its message and how long it
/// took.
fn build_error(builder: RegistryBuilder) -> (Error, String, Duration) {
    let started = Instant::now();
    let outcome = builder
        .prefix(format!("t{}_connerr_", std::process::id()))
        .connect_timeout(CONNECT_TIMEOUT)
        .build();
    let took = started.elapsed();
    match outcome {
        Ok(_) => panic!("build() succeeded against a server that is not the right one"),
        Err(e) => {
            let message = e.to_string();
            println!("after {took:?}: {message}");
            (e, message, took)
        }
    }
}

/// Checks that a permanent failure came back at once and that its message says `expected`
/// (every part, case-insensitive) and names `address`.
fn assert_permanent(message: &str, took: Duration, address: &str, expected: &[&str]) {
    assert!(
        took < AT_ONCE,
        "a permanent failure took {took:?} (connect timeout {CONNECT_TIMEOUT:?}): {message}"
    );
    assert!(
        message.contains(address),
        "the message does not name {address}: {message}"
    );
    let lower = message.to_lowercase();
    for part in expected {
        assert!(
            lower.contains(&part.to_lowercase()),
            "the message does not say {part:?}: {message}"
        );
    }
    assert!(
        !lower.contains("start the server"),
        "the message blames an absent server: {message}"
    );
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;

    fn at(address: &str) -> RegistryBuilder {
        LockRegistry::postgres(format!("postgres://postgres@{address}/test"))
    }

    #[test]
    fn postgres_url_at_mysql_port_is_not_a_postgres_server() {
        let address = mysql_address();
        if !server_up("MariaDB", &address, "postgres_url_at_mysql_port") {
            return;
        }
        let (_, message, took) = build_error(at(&address));
        assert_permanent(
            &message,
            took,
            &address,
            &[
                "is not a PostgreSQL server",
                "answers as a MySQL/MariaDB server",
            ],
        );
    }

    #[test]
    fn postgres_url_at_redis_port_is_not_a_postgres_server() {
        let address = redis_address();
        if !redis_answers(&address) {
            common::skipped(&format!(
                "postgres_url_at_redis_port: no Redis answers PING at {address} \
                 (LEASEHOLD_REDIS_ADDR)"
            ));
            return;
        }
        let (_, message, took) = build_error(at(&address));
        assert_permanent(
            &message,
            took,
            &address,
            &["is not a PostgreSQL server", "answers as a Redis server"],
        );
    }

    #[test]
    fn postgres_unknown_host_fails_at_once() {
        let (_, message, took) = build_error(at(&format!("{UNKNOWN_HOST}:5432")));
        assert_permanent(&message, took, UNKNOWN_HOST, &["cannot resolve"]);
    }

    #[test]
    fn postgres_closed_port_is_retried_until_the_connect_timeout() {
        let limit = Duration::from_secs(2);
        let started = Instant::now();
        let outcome = at("127.0.0.1:1")
            .prefix(format!("t{}_connerr_", std::process::id()))
            .connect_timeout(limit)
            .build();
        let took = started.elapsed();
        let message = outcome
            .expect_err("nothing listens at 127.0.0.1:1")
            .to_string();
        println!("after {took:?}: {message}");
        assert!(
            took >= limit - Duration::from_millis(100),
            "refused after {took:?}, not retried until {limit:?}: {message}"
        );
        assert!(took < limit * 3, "took {took:?}: {message}");
        assert!(
            message.contains("cannot reach PostgreSQL at 127.0.0.1:1"),
            "{message}"
        );
        assert!(message.contains("start the server"), "{message}");
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;

    fn at(address: &str) -> RegistryBuilder {
        LockRegistry::mysql(format!("mysql://root@{address}/test"))
    }

    #[test]
    fn mysql_url_at_postgres_port_is_not_a_mysql_server() {
        let address = postgres_address();
        if !server_up("PostgreSQL", &address, "mysql_url_at_postgres_port") {
            return;
        }
        let (_, message, took) = build_error(at(&address));
        assert_permanent(
            &message,
            took,
            &address,
            &["is not a MySQL server", "answers as a PostgreSQL server"],
        );
    }

    #[test]
    fn mysql_url_at_redis_port_is_not_a_mysql_server() {
        let address = redis_address();
        if !redis_answers(&address) {
            common::skipped(&format!(
                "mysql_url_at_redis_port: no Redis answers PING at {address} \
                 (LEASEHOLD_REDIS_ADDR)"
            ));
            return;
        }
        let (_, message, took) = build_error(at(&address));
        assert_permanent(
            &message,
            took,
            &address,
            &["is not a MySQL server", "answers as a Redis server"],
        );
    }

    #[test]
    fn mysql_unknown_host_fails_at_once() {
        let (_, message, took) = build_error(at(&format!("{UNKNOWN_HOST}:3306")));
        assert_permanent(&message, took, UNKNOWN_HOST, &["cannot resolve"]);
    }

    #[test]
    fn mysql_closed_port_is_retried_until_the_connect_timeout() {
        let limit = Duration::from_secs(2);
        let started = Instant::now();
        let outcome = at("127.0.0.1:1")
            .prefix(format!("t{}_connerr_", std::process::id()))
            .connect_timeout(limit)
            .build();
        let took = started.elapsed();
        let message = outcome
            .expect_err("nothing listens at 127.0.0.1:1")
            .to_string();
        println!("after {took:?}: {message}");
        assert!(
            took >= limit - Duration::from_millis(100),
            "refused after {took:?}, not retried until {limit:?}: {message}"
        );
        assert!(took < limit * 3, "took {took:?}: {message}");
        assert!(
            message.contains("cannot reach MySQL at 127.0.0.1:1"),
            "{message}"
        );
        assert!(message.contains("start the server"), "{message}");
    }
}
