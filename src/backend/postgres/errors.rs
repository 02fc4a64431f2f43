//! How PostgreSQL and driver errors map to failures: transient, broken connection, or fatal
//! with a hint that says what to do.

use crate::backend::{Failure, FailureKind};
use crate::error::{TOO_MANY_CLIENTS, TOO_MANY_CLIENTS_FIX};

/// The SQLSTATE of a failure from the server, if it is one.
pub(super) fn sql_state(failure: &Failure) -> Option<&str> {
    let error = failure.source.downcast_ref::<tokio_postgres::Error>()?;
    error.code().map(|code| code.code())
}

pub(super) fn classify(error: tokio_postgres::Error) -> Failure {
    let (kind, hint) = if let Some(db) = error.as_db_error() {
        let message = db.message();
        match db.code().code() {
            "40001" | "40P01" => (
                FailureKind::Transient,
                format!("PostgreSQL aborted the statement to resolve a conflict: {message}"),
            ),
            "55P03" | "57014" => (
                FailureKind::Transient,
                format!("the lock row is busy or the statement timed out: {message}"),
            ),
            "53300" => (
                FailureKind::Transient,
                format!("{TOO_MANY_CLIENTS} ({message}): {TOO_MANY_CLIENTS_FIX}"),
            ),
            "57P03" => (
                FailureKind::Transient,
                format!("PostgreSQL does not accept connections right now: {message}"),
            ),
            "25006" => (
                FailureKind::Broken,
                "the server is read-only (a standby, or failover in progress): point the URL at \
                 the primary"
                    .to_string(),
            ),
            code if code.starts_with("08") || code.starts_with("57P") => (
                FailureKind::Broken,
                format!("the PostgreSQL connection failed: {message}"),
            ),
            "26000" | "42P05" => (
                FailureKind::Fatal,
                format!(
                    "{message}: named prepared statements do not survive a transaction-mode \
                     pooler (PgBouncer pool_mode = transaction), which runs each statement on \
                     whichever server connection is free: do not set \
                     RegistryBuilder::prepared_statements(true) for such a URL"
                ),
            ),
            "42P01" => (
                FailureKind::Fatal,
                format!(
                    "{message}: create the table with sql/postgres.sql or \
                     RegistryBuilder::create_table(true)"
                ),
            ),
            "42703" => (
                FailureKind::Fatal,
                format!(
                    "{message}: the lock table lacks a column; compare it with sql/postgres.sql"
                ),
            ),
            "28P01" | "28000" => (
                FailureKind::Fatal,
                format!("{message}: check the user and password in the URL and pg_hba.conf"),
            ),
            "3D000" => (
                FailureKind::Fatal,
                format!("{message}: create it or fix the URL"),
            ),
            "42501" => (
                FailureKind::Fatal,
                format!("{message}: grant this user SELECT, INSERT and UPDATE on the lock table"),
            ),
            code => (
                FailureKind::Fatal,
                format!("PostgreSQL refused the statement ({code}): {message}"),
            ),
        }
    } else if error.is_closed() || io_cause(&error).is_some() {
        (
            FailureKind::Broken,
            format!("the connection to PostgreSQL failed: {error}"),
        )
    } else {
        (
            FailureKind::Fatal,
            format!("PostgreSQL client error: {error}"),
        )
    };
    Failure::new(kind, hint, error)
}

pub(super) fn io_cause(error: &tokio_postgres::Error) -> Option<&std::io::Error> {
    std::error::Error::source(error).and_then(|e| e.downcast_ref::<std::io::Error>())
}
