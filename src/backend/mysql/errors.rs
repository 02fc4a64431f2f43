//! How MySQL and driver errors map to failures: transient, broken connection, or fatal with
//! a hint that says what to do.

#[cfg(doc)]
use super::conn::MysqlConn;
use crate::backend::{Failure, FailureKind};

pub(super) fn classify(error: mysql::Error) -> Failure {
    use mysql::DriverError as D;
    let (kind, hint) = match &error {
        mysql::Error::MySqlError(e) => {
            let message = &e.message;
            match e.code {
                1213 => (
                    FailureKind::Transient,
                    format!("the statement was chosen as a deadlock victim: {message}"),
                ),
                1205 => (
                    FailureKind::Transient,
                    format!("the lock row stayed locked by another transaction: {message}"),
                ),
                1040 | 1203 => (
                    FailureKind::Transient,
                    format!("the server refuses more connections: {message}"),
                ),
                1053 | 1927 | 2006 | 2013 | 4031 => (
                    FailureKind::Broken,
                    format!("the MySQL connection failed: {message}"),
                ),
                1047 => (
                    FailureKind::Broken,
                    format!(
                        "the Galera node does not serve statements (it is outside the primary \
                         component, or still joining): list the other nodes in the URL \
                         ({message})"
                    ),
                ),
                1290 | 1792 => (
                    FailureKind::Broken,
                    format!(
                        "the server is read-only (a replica, or failover in progress): point \
                         the URL at the primary ({message})"
                    ),
                ),
                1146 => (
                    FailureKind::Fatal,
                    format!(
                        "{message}: create the table with sql/mysql.sql or \
                         RegistryBuilder::create_table(true)"
                    ),
                ),
                1054 => (
                    FailureKind::Fatal,
                    format!(
                        "{message}: the lock table lacks a column; compare it with sql/mysql.sql"
                    ),
                ),
                1045 | 1698 => (
                    FailureKind::Fatal,
                    format!(
                        "{message}: check the user and password in the URL (an account that \
                         requires TLS, REQUIRE SSL, is refused the same way without it: see \
                         ssl-mode)"
                    ),
                ),
                1049 => (
                    FailureKind::Fatal,
                    format!("{message}: create it or fix the URL"),
                ),
                1046 => (
                    FailureKind::Fatal,
                    format!(
                        "{message}: name the database in the URL (mysql://host/database) or in \
                         the prefix (database.INT_)"
                    ),
                ),
                1044 | 1142 | 1143 => (
                    FailureKind::Fatal,
                    format!(
                        "{message}: grant this user SELECT, INSERT and UPDATE on the lock table"
                    ),
                ),
                code => (
                    FailureKind::Fatal,
                    format!("MySQL refused the statement ({code}): {message}"),
                ),
            }
        }
        mysql::Error::IoError(_) | mysql::Error::CodecError(_) if timed_out(&error) => {
            (
                FailureKind::Broken,
                format!(
                    "no answer from MySQL before the deadline (the socket's timeout ran out; the connection is discarded): {error}"
                ),
            )
        }
        mysql::Error::IoError(_)
        | mysql::Error::CodecError(_)
        | mysql::Error::DriverError(
            D::ConnectTimeout
            | D::CouldNotConnect(_)
            | D::PacketOutOfSync
            | D::UnexpectedPacket
            | D::Timeout,
        ) => (
            FailureKind::Broken,
            format!("the connection to MySQL failed: {error}"),
        ),
        other => (FailureKind::Fatal, format!("MySQL client error: {other}")),
    };
    Failure::new(kind, hint, error)
}

/// Whether `error` is a socket timeout (`EAGAIN` from `SO_RCVTIMEO`/`SO_SNDTIMEO`: see
/// [`MysqlConn::arm`]), as the driver reports it: an I/O error, or one wrapped by its codec.
fn timed_out(error: &mysql::Error) -> bool {
    let io = match error {
        mysql::Error::IoError(e) => Some(e),
        mysql::Error::CodecError(e) => {
            std::error::Error::source(e).and_then(|e| e.downcast_ref::<std::io::Error>())
        }
        _ => None,
    };
    io.is_some_and(|e| {
        matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        )
    })
}
