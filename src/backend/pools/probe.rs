//! The first connection of a store and what answers at a server's address: a host name that
//! does not resolve, or a server of another kind, fails `build()` at once.

use crate::backend::{Failure, FailureKind};
use crate::error::{Error, Result, TOO_MANY_CLIENTS};
use std::time::{Duration, Instant};

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
