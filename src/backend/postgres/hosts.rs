//! Hosts and connecting: the connect timeout, one host at a time from a list, the fallback
//! from TLS under `sslmode=prefer`, the URL's settings, and the connection checked when the
//! registry is built.

use super::conn::{outside_async, PgConn, PgConnError, PgConnection};
use super::errors::{classify, io_cause};
use super::tls::{connector, split_postgres, tls_problem, PgTls, Tls};
use super::{Postgres, DEFAULT_CALL_LIMIT};
use crate::backend::pools::Finding;
use crate::backend::{Backend, Failure, FailureKind};
use crate::error::Error;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;
use tokio_postgres::config::{Host, LoadBalanceHosts, SslMode};
use tokio_postgres::{Client, Config};

/// What bounds opening a connection: the configuration's connect timeout (the registry's
/// `connect_timeout` unless the URL sets one).
pub(super) fn connect_limit(config: &Config) -> Duration {
    config
        .get_connect_timeout()
        .copied()
        .unwrap_or(DEFAULT_CALL_LIMIT)
}

/// Connects on `runtime`; [`connect_limit`] bounds the whole wait, the startup handshake
/// included (a server that accepts connections but never answers). With `sslmode=prefer` a
/// TLS attempt that fails (the handshake, or the server refusing the encrypted connection) is
/// made again without TLS, as libpq does; if that fails too, the first error is returned.
///
/// Several hosts (`host=a,b`, `postgres://a:1,b:2/…`) are tried in order, each within its own
/// [`connect_limit`], as libpq does; the error of a server that answered is preferred, else the
/// last one's. (tokio-postgres alone bounds only the TCP connection per host, so a host that
/// accepts connections and never answers — a frozen primary — would take the whole wait.)
#[cfg_attr(not(feature = "postgres-tls"), allow(clippy::clone_on_copy))]
pub(super) fn connect_on(
    runtime: &Runtime,
    config: &Config,
    tls: &Tls,
) -> Result<(Client, PgConnection), PgConnError> {
    let hosts = config.get_hosts().len().max(config.get_hostaddrs().len());
    if hosts > 1 && config.get_load_balance_hosts() == LoadBalanceHosts::Disable {
        let mut failed: Option<PgConnError> = None;
        for i in 0..hosts {
            match connect_on(runtime, &one_host(config, i), tls) {
                Ok(connected) => return Ok(connected),
                Err(error) => {
                    if !failed.as_ref().is_some_and(answered) || answered(&error) {
                        failed = Some(error);
                    }
                }
            }
        }
        return Err(failed.expect("at least two hosts were tried"));
    }
    let limit = connect_limit(config);
    let attempts = async {
        let first = config.connect(tls.clone()).await;
        match first {
            Err(error) if falls_back(config, &error) => {
                let mut plain = config.clone();
                plain.ssl_mode(SslMode::Disable);
                plain.connect(tls.clone()).await.or(Err(error))
            }
            other => other,
        }
    };
    // The timer must be made inside the runtime, which owns the clock it registers with.
    let connecting = async { tokio::time::timeout(limit, attempts).await };
    Ok(runtime
        .block_on(connecting)
        .map_err(|_| PgConnError::NoAnswer(limit))??)
}

/// Whether a failed connection attempt reached a server that answered (with an error).
fn answered(error: &PgConnError) -> bool {
    matches!(error, PgConnError::Postgres(error) if error.as_db_error().is_some())
}

/// `config`'s settings with its `i`-th host (and `hostaddr`, and port) alone.
fn one_host(config: &Config, i: usize) -> Config {
    let mut one = Config::new();
    if let Some(user) = config.get_user() {
        one.user(user);
    }
    if let Some(password) = config.get_password() {
        one.password(password);
    }
    if let Some(dbname) = config.get_dbname() {
        one.dbname(dbname);
    }
    if let Some(options) = config.get_options() {
        one.options(options);
    }
    if let Some(name) = config.get_application_name() {
        one.application_name(name);
    }
    match config.get_hosts().get(i) {
        Some(Host::Tcp(name)) => {
            one.host(name);
        }
        #[cfg(unix)]
        Some(Host::Unix(path)) => {
            one.host_path(path);
        }
        None => {}
    }
    if let Some(address) = config.get_hostaddrs().get(i) {
        one.hostaddr(*address);
    }
    let ports = config.get_ports();
    if let Some(port) = ports.get(i).or(ports.first()) {
        one.port(*port);
    }
    if let Some(timeout) = config.get_connect_timeout() {
        one.connect_timeout(*timeout);
    }
    if let Some(timeout) = config.get_tcp_user_timeout() {
        one.tcp_user_timeout(*timeout);
    }
    one.keepalives(config.get_keepalives())
        .keepalives_idle(config.get_keepalives_idle());
    if let Some(interval) = config.get_keepalives_interval() {
        one.keepalives_interval(interval);
    }
    if let Some(retries) = config.get_keepalives_retries() {
        one.keepalives_retries(retries);
    }
    one.ssl_mode(config.get_ssl_mode())
        .ssl_negotiation(config.get_ssl_negotiation())
        .target_session_attrs(config.get_target_session_attrs())
        .channel_binding(config.get_channel_binding());
    one
}

/// Whether a failed connection attempt is made again without TLS (`sslmode=prefer`).
fn falls_back(config: &Config, error: &tokio_postgres::Error) -> bool {
    #[cfg(feature = "postgres-tls")]
    {
        config.get_ssl_mode() == SslMode::Prefer
            && (error.as_db_error().is_some() || crate::backend::tls::find_rustls(error).is_some())
    }
    #[cfg(not(feature = "postgres-tls"))]
    {
        // Nothing was encrypted: there is nothing to fall back from.
        let _ = (config, error);
        false
    }
}

/// Where `config` connects, for messages: `host:port` for each host.
pub(super) fn address(config: &Config) -> String {
    let ports = config.get_ports();
    let port = |i: usize| ports.get(i).or(ports.first()).copied().unwrap_or(5432);
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| match host {
            Host::Tcp(name) => format!("{name}:{}", port(i)),
            #[cfg(unix)]
            Host::Unix(path) => format!("{}/.s.PGSQL.{}", path.display(), port(i)),
        })
        .collect();
    if hosts.is_empty() {
        "(no host given)".to_string()
    } else {
        hosts.join(", ")
    }
}

/// One direct connection, retried while the server is unreachable or starting, so that a wrong
/// password or database comes back as what it is rather than as a pool timeout.
/// A failure caused by TLS is reported as [`Error::Tls`] at once, and so are the permanent
/// ones: a host name that does not resolve, and a server that is not PostgreSQL (found by
/// [`crate::backend::pools::look_at`] when an attempt reached a server that did not answer as
/// PostgreSQL does).
pub(super) fn check_connect(
    config: &Config,
    tls: &Tls,
    settings: &PgTls,
    timeout: Duration,
) -> crate::Result<()> {
    let server = address(config);
    crate::backend::first_connection(Postgres::NAME, &server, timeout, |limit, deadline| {
        let mut attempt = config.clone();
        attempt.connect_timeout(connect_limit(config).min(limit));
        let unnamed = Some(false);
        let Err(error) = outside_async(|| {
            PgConn::open(&attempt, tls, unnamed, &Arc::new(AtomicBool::new(false)))
        }) else {
            return Ok(());
        };
        // Reached a server (not refused, not unresolved) that did not answer as PostgreSQL.
        let odd = match &error {
            PgConnError::Postgres(error) => {
                error.as_db_error().is_none()
                    && !error.to_string().starts_with("error connecting to server")
            }
            PgConnError::NoAnswer(_) => true,
            PgConnError::Runtime(_) => false,
        };
        let (mut failure, mut detail) = match error {
            PgConnError::Postgres(error) => {
                let detail =
                    io_cause(&error).map_or_else(|| error.to_string(), ToString::to_string);
                if let Some((problem, hint)) = tls_problem(&error, config, settings) {
                    let failure =
                        crate::backend::tls::TlsFailure::new(problem, hint.clone(), error);
                    return Err((Failure::new(FailureKind::Fatal, hint, failure), detail));
                }
                (classify(error), detail)
            }
            other => {
                let detail = other.to_string();
                let kind = match other {
                    PgConnError::NoAnswer(_) => FailureKind::Broken,
                    _ => FailureKind::Fatal,
                };
                let hint = format!("cannot open a PostgreSQL connection: {detail}");
                (Failure::new(kind, hint, other), detail)
            }
        };
        let retried = failure.kind != FailureKind::Fatal;
        match permanent_cause(config, retried, odd.then_some(deadline)) {
            Finding::Permanent(hint) => {
                failure = Failure::new(FailureKind::Fatal, hint, failure.source);
            }
            Finding::Speechless(note) => detail = format!("{detail}; {note}"),
            Finding::Nothing => {}
        }
        Err((failure, detail))
    })
    .map_err(|e| crate::backend::tls::surface(e, &server))
}

/// Why connecting to `config`'s servers cannot succeed, if it is for good: a host name that
/// does not resolve (checked when `resolve`), or (when `probe`, by its deadline) a server that
/// answers as something other than PostgreSQL; or, as a note, a server that accepts
/// connections without answering.
fn permanent_cause(config: &Config, resolve: bool, probe: Option<Instant>) -> Finding {
    let ports = config.get_ports();
    let port = |i: usize| ports.get(i).or(ports.first()).copied().unwrap_or(5432);
    let hostaddrs = config.get_hostaddrs();
    let tcp = config
        .get_hosts()
        .iter()
        .enumerate()
        .filter_map(|(i, host)| match host {
            Host::Tcp(name) => Some((i, name)),
            #[cfg(unix)]
            Host::Unix(_) => None,
        });
    let mut note = Finding::Nothing;
    for (i, name) in tcp {
        // With `hostaddr`, the name is not looked up.
        let host = hostaddrs
            .get(i)
            .map_or_else(|| name.clone(), ToString::to_string);
        if resolve {
            if let Some(hint) = crate::backend::pools::unknown_host(&host, port(i)) {
                return Finding::Permanent(hint);
            }
        }
        if let Some(deadline) = probe {
            let at = format!("{host}:{}", port(i));
            match crate::backend::pools::look_at(&host, port(i), &at, Postgres::NAME, deadline) {
                Finding::Nothing => {}
                Finding::Speechless(text) => note = Finding::Speechless(text),
                permanent => return permanent,
            }
        }
    }
    note
}

/// The connection settings of a URL or `key=value` string (`what`, in messages), with the
/// registry's connect timeout and application name unless it sets its own, and its TLS.
pub(super) fn parse_url(
    url: &str,
    pool: &crate::backend::PoolSettings,
    what: &str,
) -> crate::Result<(Config, Tls, PgTls)> {
    let (url, settings) = split_postgres(url)?;
    let mut config: Config = url.parse().map_err(|e| Error::Database {
        operation: "connect",
        hint: format!(
            "{what} does not parse: use postgres://user:password@host:port/database or \
             key=value pairs"
        ),
        source: Box::new(e),
    })?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(pool.connect_timeout);
    }
    if config.get_application_name().is_none() {
        config.application_name("leasehold");
    }
    let tls = connector(&settings, &mut config)?;
    Ok((config, tls, settings))
}
