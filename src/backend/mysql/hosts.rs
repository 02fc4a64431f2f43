//! Host lists and connecting: one URL per listed host, the first host that accepts writes,
//! and the connection checked when the registry is built.

use super::errors::classify;
#[cfg(doc)]
use super::open;
use super::tls::{tls_problem, with_tls, MysqlTls};
use super::Mysql;
use crate::backend::pools::Finding;
use crate::backend::{Backend, Failure, FailureKind};
use crate::error::Error;
use mysql::consts::CapabilityFlags;
use mysql::{Opts, OptsBuilder, SslOpts};
use std::time::Duration;

/// Where `opts` connects, for messages.
fn address(opts: &Opts) -> String {
    match opts.get_socket() {
        Some(socket) => socket.to_string(),
        None => format!("{}:{}", opts.get_ip_or_hostname(), opts.get_tcp_port()),
    }
}

/// Opens a connection; with `prefer_tls`, a server that does not offer TLS is connected to
/// without it.
fn open_conn(opts: &Opts, prefer_tls: bool) -> Result<mysql::Conn, mysql::Error> {
    match mysql::Conn::new(opts.clone()) {
        Err(mysql::Error::DriverError(mysql::DriverError::TlsNotSupported)) if prefer_tls => {
            mysql::Conn::new(OptsBuilder::from_opts(opts.clone()).ssl_opts(None::<SslOpts>))
        }
        other => other,
    }
}

/// Opens a connection to the first of `hosts` that answers and, when there are several,
/// accepts writes ([`writable`]); else the error of the last host that answered (a refusal
/// says more than a refused connection), or of the last host.
pub(super) fn open_writable(hosts: &[Opts], prefer_tls: bool) -> Result<mysql::Conn, mysql::Error> {
    let mut failed: Option<mysql::Error> = None;
    for opts in hosts {
        let error = match open_conn(opts, prefer_tls) {
            Ok(conn) if hosts.len() == 1 => return Ok(conn),
            Ok(mut conn) => match writable(&mut conn, opts) {
                Ok(()) => return Ok(conn),
                Err(e) => e,
            },
            Err(e) => e,
        };
        if !failed.as_ref().is_some_and(answered) || answered(&error) {
            failed = Some(error);
        }
    }
    Err(failed.expect("a URL names at least one host"))
}

/// Whether `error` came from a server (as opposed to no connection at all).
fn answered(error: &mysql::Error) -> bool {
    matches!(error, mysql::Error::MySqlError(_))
}

/// Whether the server behind `conn` accepts writes: not `read_only` (a replica), and, on
/// Galera, a node of the primary component (`wsrep_ready`). The refusal is a 1290 error, which
/// [`classify`] takes for a broken connection.
fn writable(conn: &mut mysql::Conn, opts: &Opts) -> Result<(), mysql::Error> {
    use mysql::prelude::Queryable;
    let read_only: Option<i64> = conn.query_first("SELECT @@global.read_only")?;
    let ready: Option<(String, String)> = conn.query_first("SHOW STATUS LIKE 'wsrep_ready'")?;
    let why = if read_only.unwrap_or(0) != 0 {
        "is read-only"
    } else if ready.is_some_and(|(_, value)| !value.eq_ignore_ascii_case("ON")) {
        "is a Galera node that is not ready (wsrep_ready is OFF)"
    } else {
        return Ok(());
    };
    Err(mysql::Error::MySqlError(mysql::MySqlError {
        state: "HY000".to_string(),
        code: 1290,
        message: format!("the server at {} {why}", address(opts)),
    }))
}

/// One URL per host of a URL that lists several (`mysql://u@a:1,b:2/db?…`): the same user,
/// database and options with each host; the URL itself when it names one.
pub(super) fn host_urls(url: &str) -> Vec<String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return vec![url.to_string()];
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, hosts) = match authority.rfind('@') {
        Some(at) => authority.split_at(at + 1),
        None => ("", authority),
    };
    if !hosts.contains(',') {
        return vec![url.to_string()];
    }
    hosts
        .split(',')
        .map(|host| format!("{scheme}://{user}{}{tail}", host.trim()))
        .collect()
}

/// One direct connection, retried while the server is unreachable, so that a wrong password or
/// database comes back as what it is rather than as a pool timeout. A failure caused by TLS is
/// reported as [`Error::Tls`] at once, and so are the permanent ones: a host name that does not
/// resolve, and a server that is not MySQL (found by [`crate::backend::pools::look_at`] when an
/// attempt reached a server that sent no MySQL greeting).
pub(super) fn check_connect(
    hosts: &[Opts],
    prefer_tls: bool,
    settings: &MysqlTls,
    timeout: Duration,
) -> crate::Result<()> {
    let server = hosts.iter().map(address).collect::<Vec<_>>().join(", ");
    crate::backend::first_connection(Mysql::NAME, &server, timeout, |limit, deadline| {
        let mut failed: Option<(Failure, String)> = None;
        let from_server = |(failure, _): &(Failure, String)| {
            failure
                .source
                .downcast_ref::<mysql::Error>()
                .is_some_and(answered)
        };
        for opts in hosts {
            match check_host(hosts.len() > 1, opts, prefer_tls, settings, limit, deadline) {
                Ok(()) => return Ok(()),
                // A permanent failure (TLS, an unknown host, not MySQL) is reported at once.
                Err(failure) if failure.0.kind == FailureKind::Fatal => return Err(failure),
                // Else the last server's refusal, or the last host's failure.
                Err(failure) => {
                    if !failed.as_ref().is_some_and(from_server) || from_server(&failure) {
                        failed = Some(failure);
                    }
                }
            }
        }
        Err(failed.expect("a URL names at least one host"))
    })
    .map_err(|e| crate::backend::tls::surface(e, &server))
}

/// One attempt of [`check_connect`] on one host (checked for writes when `several`), with
/// socket timeouts of at most `limit`: the classified failure and a short detail.
fn check_host(
    several: bool,
    opts: &Opts,
    prefer_tls: bool,
    settings: &MysqlTls,
    limit: Duration,
    deadline: std::time::Instant,
) -> Result<(), (Failure, String)> {
    let server = address(opts);
    {
        // This attempt's socket timeouts: the shorter of the configured ones and `limit`.
        let within =
            |configured: Option<Duration>| Some(configured.map_or(limit, |c| c.min(limit)));
        let attempt: Opts = OptsBuilder::from_opts(opts.clone())
            .tcp_connect_timeout(within(opts.get_tcp_connect_timeout()))
            .read_timeout(within(opts.get_read_timeout().copied()))
            .write_timeout(within(opts.get_write_timeout().copied()))
            .into();
        let opened = match open_conn(&attempt, prefer_tls) {
            Ok(mut conn) if several => writable(&mut conn, opts),
            Ok(_) => Ok(()),
            Err(error) => Err(error),
        };
        opened.map_err(|error| {
            if let Some((problem, hint)) = tls_problem(&error, opts, settings) {
                let failure = crate::backend::tls::TlsFailure::new(problem, hint.clone(), error);
                return (
                    Failure::new(FailureKind::Fatal, hint.clone(), failure),
                    hint,
                );
            }
            // Reached a server (not refused, not unresolved) that sent no MySQL packet, or
            // not one the driver understood.
            let odd = matches!(
                &error,
                mysql::Error::IoError(_)
                    | mysql::Error::CodecError(_)
                    | mysql::Error::DriverError(
                        mysql::DriverError::PacketOutOfSync
                            | mysql::DriverError::UnexpectedPacket
                            | mysql::DriverError::Timeout
                    )
            );
            let mut failure = classify(error);
            let mut detail = failure.source.to_string();
            if opts.get_socket().is_none() {
                let (host, port) = (opts.get_ip_or_hostname(), opts.get_tcp_port());
                let unknown = (failure.kind != FailureKind::Fatal)
                    .then(|| crate::backend::pools::unknown_host(&host, port))
                    .flatten();
                let finding = match unknown {
                    Some(hint) => Finding::Permanent(hint),
                    None if odd => {
                        crate::backend::pools::look_at(&host, port, &server, Mysql::NAME, deadline)
                    }
                    None => Finding::Nothing,
                };
                match finding {
                    Finding::Permanent(hint) => {
                        failure = Failure::new(FailureKind::Fatal, hint, failure.source);
                    }
                    Finding::Speechless(note) => detail = format!("{detail}; {note}"),
                    Finding::Nothing => {}
                }
            }
            (failure, detail)
        })
    }
}

/// The options for one host's URL: for the connection checked at build, for pooled ones, and
/// whether `ssl-mode=PREFERRED` (see [`open`]).
pub(super) fn host_opts(
    url: &str,
    settings: &MysqlTls,
    pool: &crate::backend::PoolSettings,
) -> crate::Result<(Opts, Opts, bool)> {
    let opts = Opts::from_url(url).map_err(|e| Error::Database {
        operation: "connect",
        hint: "the MySQL URL does not parse: use mysql://user:password@host:port/database"
            .to_string(),
        source: Box::new(e),
    })?;
    let (opts, prefer_tls) = with_tls(opts, settings)?;
    let connect_timeout = opts
        .get_tcp_connect_timeout()
        .unwrap_or(pool.connect_timeout);
    let capabilities = opts.get_additional_capabilities() | CapabilityFlags::CLIENT_FOUND_ROWS;
    let opts = OptsBuilder::from_opts(opts)
        .additional_capabilities(capabilities)
        .tcp_connect_timeout(Some(connect_timeout));
    // The driver has no per-call timeout: socket timeouts are what stop a server that accepts
    // connections but never answers from holding a connection attempt forever; statements
    // set them to their caller's deadline (`MysqlConn::arm`), within these. The
    // first connection is bounded by the connect timeout (each of its attempts by what is left
    // of it, the first by 2 s at most: see `first_connection`), pooled ones by the longer of it
    // and the operation timeout. Timeouts given in the URL win, within those bounds for the
    // first connection.
    let with_socket_timeout = |limit: Duration| -> Opts {
        let opts: Opts = opts.clone().into();
        let read = opts.get_read_timeout().copied().unwrap_or(limit);
        let write = opts.get_write_timeout().copied().unwrap_or(limit);
        OptsBuilder::from_opts(opts)
            .read_timeout(Some(read))
            .write_timeout(Some(write))
            .into()
    };
    Ok((
        with_socket_timeout(connect_timeout),
        with_socket_timeout(connect_timeout.max(pool.operation_timeout)),
        prefer_tls,
    ))
}
