//! The pooled connection and its manager: each connection's own runtime, calls bounded by
//! the caller's deadline (with a cancel request for a call that runs out of time), and
//! statements sent named or unnamed.

use super::errors::{classify, sql_state};
use super::hosts::connect_on;
use super::pooler;
use super::tls::Tls;
use super::{DEFAULT_CALL_LIMIT, PARAM_TYPES, SERVER_STARTED};
use crate::backend::{Failure, FailureKind, Params, PerStatement};
use crate::error::TOO_MANY_CLIENTS;
use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Config, Row, Socket, Statement};

/// Opens PostgreSQL connections from one parsed configuration.
#[derive(Clone)]
pub(crate) struct PgManager {
    pub(super) config: Config,
    pub(super) tls: Tls,
    /// Whether connections prepare named statements and keep them
    /// (`RegistryBuilder::prepared_statements`): `Some` when the user said, `None` to decide
    /// per connection (see [`PgConn::open`]).
    pub(super) prepared: Option<bool>,
    /// Set once a named statement failed the way it does only behind a transaction-mode
    /// pooler (`26000`, `42P05`): from then on every connection of the registry sends its
    /// statements unnamed.
    pub(super) pooler_found: Arc<AtomicBool>,
    /// Where the release listener connects (`RegistryBuilder::listener_url`), with its TLS;
    /// `None`: where the pools connect.
    pub(super) listener: Option<(Config, Tls)>,
}

/// The half of a connection that reads the socket and dispatches the server's messages to the
/// client's calls; it makes progress only while polled, and is dropped once it finishes (the
/// connection closed), which fails every call still waiting on it at once.
pub(super) type Driver =
    Option<Pin<Box<dyn Future<Output = Result<(), tokio_postgres::Error>> + Send>>>;

/// A pooled connection: the asynchronous client, the runtime its calls block on, its prepared
/// statements, and the flag `mark_broken` sets.
///
/// Every call blocks the calling thread on the connection's own current-thread runtime (as the
/// `postgres` crate does), polling the socket driver and the call together, but gives up at the
/// deadline `set_deadline` gave it: a server that stops answering costs the caller its deadline
/// and this connection, never more. No thread hop sits between the caller and the socket.
pub(crate) struct PgConn {
    pub(super) client: Client,
    pub(super) driver: Driver,
    /// The named statements prepared so far; `None` when statements go unnamed (see
    /// [`PgManager::prepared`]).
    statements: Option<PerStatement<Statement>>,
    /// [`PgManager::pooler_found`], when this connection chose named statements itself.
    pooler_found: Option<Arc<AtomicBool>>,
    pub(super) deadline: Instant,
    pub(super) broken: bool,
    /// The server process serving this connection, when the connection goes straight to it
    /// ([`PgConn::straight_to_the_server`]), and when its server started (µs since the Unix
    /// epoch): the session a given-up statement runs in.
    pub(super) server_process: Option<(i32, i64)>,
    /// The connector, for the cancel request of a call that runs out of time.
    tls: Tls,
    /// Declared last, so dropped after the socket it drives.
    pub(super) runtime: ConnRuntime,
}

/// A connection's runtime, shut down without blocking when dropped: a registry may be dropped
/// on a thread of someone else's asynchronous runtime, where dropping a runtime the usual way
/// panics.
pub(super) struct ConnRuntime(Option<Runtime>);

impl std::ops::Deref for ConnRuntime {
    type Target = Runtime;

    fn deref(&self) -> &Runtime {
        self.0.as_ref().expect("present until dropped")
    }
}

impl Drop for ConnRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

impl PgConn {
    /// Connects; the configuration's connect timeout bounds the whole wait, the startup
    /// handshake included (a server that accepts connections but never answers). Statements
    /// go named or unnamed as `prepared` says; without a say (`None`), named when the
    /// connection goes straight to the server ([`PgConn::straight_to_the_server`]) and no
    /// connection of the registry has found a transaction-mode pooler (`pooler_found`).
    #[cfg_attr(not(feature = "postgres-tls"), allow(clippy::clone_on_copy))]
    pub(super) fn open(
        config: &Config,
        tls: &Tls,
        prepared: Option<bool>,
        pooler_found: &Arc<AtomicBool>,
    ) -> Result<PgConn, PgConnError> {
        let runtime = connection_runtime()?;
        let (client, connection) = connect_on(&runtime, config, tls)?;
        let mut conn = PgConn {
            runtime,
            client,
            driver: Some(Box::pin(connection)),
            statements: None,
            pooler_found: None,
            deadline: Instant::now() + DEFAULT_CALL_LIMIT,
            broken: false,
            server_process: None,
            tls: tls.clone(),
        };
        // Once a registry's connection found a pooler, the others go through it too.
        if !pooler_found.load(Ordering::Relaxed) {
            conn.server_process = conn.straight_to_the_server();
        }
        let named = match prepared {
            Some(forced) => forced,
            None => {
                conn.server_process.is_some() && {
                    conn.pooler_found = Some(Arc::clone(pooler_found));
                    true
                }
            }
        };
        conn.statements = named.then(PerStatement::new);
        Ok(conn)
    }
}

/// The socket half of a connection, before it is boxed as a [`Driver`] (the listener reads
/// its messages itself).
pub(super) type PgConnection =
    tokio_postgres::Connection<Socket, <Tls as MakeTlsConnect<Socket>>::Stream>;

/// The current-thread runtime of a new connection.
pub(super) fn connection_runtime() -> Result<ConnRuntime, PgConnError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map(|runtime| ConnRuntime(Some(runtime)))
        .map_err(PgConnError::Runtime)
}

/// Whether this thread is inside an asynchronous runtime, where a driver cannot block on a
/// runtime of its own.
pub(super) fn on_async_thread() -> bool {
    tokio::runtime::Handle::try_current().is_ok()
}

/// Runs `work` on this thread, or, when this thread is inside an asynchronous runtime (where
/// the drivers cannot start their own), on a short-lived thread of its own.
pub(super) fn outside_async<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    if !on_async_thread() {
        return work();
    }
    std::thread::scope(|scope| match scope.spawn(work).join() {
        Ok(value) => value,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

/// Runs `call` to completion on `runtime`, driving the connection meanwhile; `None` when
/// `deadline` passes first.
pub(super) fn block_on<T>(
    runtime: &Runtime,
    driver: &mut Driver,
    deadline: Instant,
    call: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Option<Result<T, tokio_postgres::Error>> {
    let mut call = pin!(call);
    let both = poll_fn(|cx| {
        if let Some(running) = driver {
            if let Poll::Ready(outcome) = running.as_mut().poll(cx) {
                if let Err(e) = outcome {
                    log::debug!("PostgreSQL connection closed: {e}");
                }
                *driver = None;
            }
        }
        call.as_mut().poll(cx)
    });
    runtime.block_on(async { tokio::time::timeout_at(deadline.into(), both).await.ok() })
}

/// One call on a [`PgConn`], bounded by its deadline: `call!(conn, |client| future)` runs the
/// future built from the connection's client.
macro_rules! call {
    ($conn:expr, |$client:ident| $call:expr) => {{
        let conn: &mut PgConn = $conn;
        let $client = &conn.client;
        match block_on(&conn.runtime, &mut conn.driver, conn.deadline, $call) {
            Some(outcome) => outcome.map_err(classify),
            None => {
                conn.broken = true;
                conn.cancel_in_background();
                Err(no_answer())
            }
        }
    }};
}

/// How long the cancel request of a call that ran out of time may take (connecting included).
const CANCEL_LIMIT: Duration = Duration::from_secs(10);

/// The failure of a call that was still unanswered at its deadline.
pub(super) fn no_answer() -> Failure {
    Failure::new(
        FailureKind::Broken,
        "PostgreSQL did not answer before the deadline: check the server and the network",
        "no answer from PostgreSQL before the deadline",
    )
}

impl PgConn {
    /// The server process serving this connection when the connection goes straight to the
    /// server (see [`pooler`]): its cancel key names that process. One round trip; a
    /// connection that fails it is taken as going through a pooler (and is likely broken
    /// anyway).
    fn straight_to_the_server(&mut self) -> Option<(i32, i64)> {
        let key = pooler::key_process_id(&self.runtime, &self.client.cancel_token());
        let sql = format!("SELECT pg_backend_pid(), {SERVER_STARTED}");
        let found =
            call!(self, |client| client.query_typed_one(sql.as_str(), &[])).and_then(|row| {
                Ok((
                    row.try_get::<_, i32>(0).map_err(classify)?,
                    row.try_get::<_, i64>(1).map_err(classify)?,
                ))
            });
        fail_point!("postgres::straight_to_the_server", |answer| answer
            .filter(|answer| answer == "yes")
            .and(key.zip(found.as_ref().ok().map(|(_, started)| *started))));
        match (key, found) {
            (Some(key), Ok((pid, started))) if pid == key => Some((pid, started)),
            _ => None,
        }
    }

    /// Asks the server, from a short-lived thread and connection of its own, to cancel what
    /// this connection runs: a call given up at its deadline is still running on the server,
    /// and would go on taking its share of a busy server and holding the row locks it took
    /// (which the next renewal of those rows would find locked) until it ends. The connection
    /// itself is discarded anyway.
    #[cfg_attr(not(feature = "postgres-tls"), allow(clippy::clone_on_copy))]
    pub(super) fn cancel_in_background(&self) {
        let token = self.client.cancel_token();
        let tls = self.tls.clone();
        let spawned = std::thread::Builder::new()
            .name("leasehold-cancel".into())
            .spawn(move || {
                let Ok(runtime) = connection_runtime() else {
                    return;
                };
                let cancel =
                    async { tokio::time::timeout(CANCEL_LIMIT, token.cancel_query(tls)).await };
                if let Ok(Err(e)) = runtime.block_on(cancel) {
                    log::debug!("cancelling a PostgreSQL statement that ran out of time: {e}");
                }
            });
        if let Err(e) = spawned {
            log::debug!("no thread to cancel a PostgreSQL statement that ran out of time: {e}");
        }
    }

    /// Runs `sql` with the five parameters and returns its rows: as a named statement,
    /// prepared on first use and kept, or as an unnamed one (parsed, planned and run in one
    /// round trip, nothing left on the server), which a transaction-mode pooler can send to any
    /// server connection.
    pub(super) fn rows(&mut self, sql: &str, params: &Params) -> Result<Vec<Row>, Failure> {
        let values = values(params);
        if let Some(statement) = self.prepared(sql)? {
            match call!(self, |client| client.query(&statement, &values)) {
                Err(failure) if self.behind_a_pooler(&failure) => {}
                outcome => return outcome,
            }
        }
        let typed = typed(&values);
        call!(self, |client| client.query_typed(sql, &typed))
    }

    /// Runs `sql` like [`PgConn::rows`] and returns the number of rows it affected.
    pub(super) fn affected(&mut self, sql: &str, params: &Params) -> Result<u64, Failure> {
        let values = values(params);
        if let Some(statement) = self.prepared(sql)? {
            match call!(self, |client| client.execute(&statement, &values)) {
                Err(failure) if self.behind_a_pooler(&failure) => {}
                outcome => return outcome,
            }
        }
        let typed = typed(&values);
        call!(self, |client| client.execute_typed(sql, &typed))
    }

    /// The named statement for `sql`, prepared on first use; `None` when statements go
    /// unnamed.
    fn prepared(&mut self, sql: &str) -> Result<Option<Statement>, Failure> {
        if self
            .pooler_found
            .as_ref()
            .is_some_and(|found| found.load(Ordering::Relaxed))
        {
            self.statements = None;
        }
        let Some(statements) = &self.statements else {
            return Ok(None);
        };
        if let Some(statement) = statements.get(sql) {
            return Ok(Some(statement.clone()));
        }
        let statement = match call!(self, |client| client.prepare_typed(sql, &PARAM_TYPES)) {
            Err(failure) if self.behind_a_pooler(&failure) => return Ok(None),
            outcome => outcome?,
        };
        let statements = self.statements.as_mut().expect("checked above");
        Ok(Some(statements.insert(sql, statement).clone()))
    }

    /// Whether `failure` of a named statement says that a transaction-mode pooler stands in
    /// between (`26000`: the statement is missing on the server connection the pooler chose;
    /// `42P05`: another client's statement of that name is there), on a connection that chose
    /// named statements itself. Then this connection and every later one of the registry
    /// send their statements unnamed, and the statement, which did not run, is sent again so.
    fn behind_a_pooler(&mut self, failure: &Failure) -> bool {
        let Some(found) = &self.pooler_found else {
            return false;
        };
        if !matches!(sql_state(failure), Some("26000" | "42P05")) {
            return false;
        }
        if !found.swap(true, Ordering::Relaxed) {
            log::warn!(
                "leasehold: PostgreSQL named statements failed as they do behind a \
                 transaction-mode pooler ({}); this registry sends its statements unnamed \
                 from now on",
                failure.source
            );
        }
        self.statements = None;
        self.server_process = None;
        true
    }
}

/// Why a pooled connection could not be opened or checked. A server without a free
/// connection slot is named as such ([`TOO_MANY_CLIENTS`]): the pool keeps only this text, and
/// the registry's errors recognize it there.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PgConnError {
    #[error("{}", connect_failure(.0))]
    Postgres(#[from] tokio_postgres::Error),
    #[error("could not start the connection's runtime: {0}")]
    Runtime(std::io::Error),
    #[error("no answer from PostgreSQL within {0:?}")]
    NoAnswer(Duration),
}

/// The text of a failed connection attempt: the driver's, after [`TOO_MANY_CLIENTS`] when
/// the server said it has no slot left.
fn connect_failure(error: &tokio_postgres::Error) -> String {
    match error.code() {
        Some(code) if code.code() == "53300" => format!("{TOO_MANY_CLIENTS}: {error}"),
        _ => error.to_string(),
    }
}

impl r2d2::ManageConnection for PgManager {
    type Connection = PgConn;
    type Error = PgConnError;

    fn connect(&self) -> Result<PgConn, PgConnError> {
        PgConn::open(&self.config, &self.tls, self.prepared, &self.pooler_found)
    }

    fn is_valid(&self, conn: &mut PgConn) -> Result<(), PgConnError> {
        conn.deadline = Instant::now() + DEFAULT_CALL_LIMIT;
        call!(conn, |client| client.simple_query(""))
            .map(drop)
            .map_err(|_| PgConnError::NoAnswer(DEFAULT_CALL_LIMIT))
    }

    fn has_broken(&self, conn: &mut PgConn) -> bool {
        conn.broken || conn.driver.is_none() || conn.client.is_closed()
    }
}

/// The values of the six parameters, in order (every statement is prepared with all six
/// types, `PARAM_TYPES`, whether it uses them or not; one naming `$7` or more was rejected when
/// it was checked).
fn values<'a>(params: &'a Params) -> [&'a (dyn ToSql + Sync); 6] {
    [
        &params.lock_key,
        &params.region,
        &params.client_id,
        &params.ttl_micros,
        &params.token,
        &params.name,
    ]
}

/// The parameters of an unnamed statement: each value with its declared type.
fn typed<'a>(values: &[&'a (dyn ToSql + Sync); 6]) -> [(&'a (dyn ToSql + Sync), Type); 6] {
    let [a, b, c, d, e, f] = *values;
    let [ta, tb, tc, td, te, tf] = PARAM_TYPES;
    [(a, ta), (b, tb), (c, tc), (d, td), (e, te), (f, tf)]
}
