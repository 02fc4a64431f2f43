//! The one error type of the crate.
//!
//! Contention is not an error: a `try_lock*` that finds the lock held elsewhere returns
//! `Ok(None)`. Every variant here means "something is wrong and you have to act": fix an input,
//! run a DDL file, look at the database, or treat work done under a lost lease as unprotected.
//! Each message says which.

use std::fmt;
use std::time::Duration;

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A database driver's own error, kept as the `source()` of an [`Error`].
pub type DatabaseError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a lease ended without its holder releasing it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// A renewal or the release found that the database records another holder or none while
    /// this holder's deadline still ran: the row was freed or taken over by someone else (an
    /// operator's `force_release`, a foreign client, a manual `UPDATE`), or the clocks
    /// disagree. A statement that finds another holder after the deadline passed reports
    /// [`Expired`](Self::Expired) instead: the lease had ended by then, and the other grant was
    /// a normal one.
    NotOwner,
    /// The lease reached its deadline (time the last acquire or renew was sent + time-to-live)
    /// without a successful renewal; the text is the last renewal error, if any.
    Expired(Option<String>),
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossReason::NotOwner => f.write_str("the database records another holder or none"),
            LossReason::Expired(None) => f.write_str("its time-to-live ran out without a renewal"),
            LossReason::Expired(Some(last)) => write!(
                f,
                "its time-to-live ran out because renewals failed (last error: {last})"
            ),
        }
    }
}

/// Everything that can go wrong, each with what to do about it.
///
/// ```
/// # fn main() -> leasehold::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let registry = leasehold::LockRegistry::sqlite(dir.path().join("l.db")).create_table(true).build()?;
/// match registry.obtain("") {
///     Err(leasehold::Error::InvalidKey { reason }) => assert!(reason.contains("empty")),
///     other => panic!("{other:?}"),
/// }
/// let guard = registry.obtain("job")?.lock()?;
/// match guard.unlock() {
///     Ok(()) => {}                                   // held throughout
///     Err(e) if e.is_lease_lost() => eprintln!("work may be unprotected: {e}"),
///     Err(e) => return Err(e),                      // the database failed: retry later
/// }
/// # Ok(()) }
/// ```
///
/// Its `Debug` form — what `unwrap()` and a `main` returning `Result<(), Box<dyn Error>>`
/// print — is the message followed by its causes, so that what to do reaches the terminal:
///
/// ```text
/// Error: lock table NC5_LOCK does not exist: create it by running sql/postgres.sql (...)
/// ```
///
/// The fields are there to match on. A function that also meets other errors can return
/// `Box<dyn std::error::Error + Send + Sync>` (or `anyhow::Result`): `?` converts a
/// `leasehold::Error` into either, keeping its message and causes.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock key is empty or longer than [`MAX_KEY_BYTES`](crate::MAX_KEY_BYTES).
    #[error("invalid lock key: {reason}")]
    InvalidKey {
        /// What is wrong with the key and what is allowed.
        reason: String,
    },

    /// A builder setting or per-call argument is out of range or malformed.
    #[error("invalid setting `{setting}`: {reason}")]
    InvalidSetting {
        /// The setter or argument name, e.g. `time_to_live`.
        setting: &'static str,
        /// What is allowed.
        reason: String,
    },

    /// The lock table does not exist.
    #[error(
        "lock table {table} does not exist: build the registry with \
         RegistryBuilder::create_table(true), run `leasehold init`, or run all that `leasehold \
         init --print` (RegistryBuilder::table_ddl) prints: {ddl_file} and the files beside it, \
         with INT_ replaced by your prefix"
    )]
    TableMissing {
        /// The table that was looked for.
        table: String,
        /// The shipped DDL file for this database.
        ddl_file: &'static str,
    },

    /// The table the prefix names exists, but it is not a lock table of any version (it lacks
    /// the `LOCK_KEY` and `CLIENT_ID` columns every lock table has): most likely a table of
    /// the application's own, met through a mistaken prefix. Nothing is changed in it.
    #[error(
        "table {table} is not a lock table (its columns: {columns}): check the prefix (the lock \
         table is the prefix followed by LOCK) and the database; nothing was changed in it"
    )]
    NotALockTable {
        /// The table that was checked.
        table: String,
        /// The first of its columns, for recognising it.
        columns: String,
    },

    /// The lock table exists but lacks a column this crate needs.
    #[error("lock table {table} has no column {column}: run `{fix}`")]
    ColumnMissing {
        /// The table that was checked.
        table: String,
        /// The missing column.
        column: &'static str,
        /// The statement that adds it.
        fix: String,
    },

    /// The lock table has no unique key on exactly (`LOCK_KEY`, `REGION`): without it two
    /// instances could both insert a row for one lock.
    #[error(
        "lock table {table} has no primary key or unique index on (LOCK_KEY, REGION): run `{fix}`"
    )]
    KeyMissing {
        /// The table that was checked.
        table: String,
        /// The statement that adds the key.
        fix: String,
    },

    /// A replacement SQL statement given to the builder does not fit the table or parameters.
    #[error("custom {statement} statement rejected: {reason}")]
    InvalidStatement {
        /// Which statement: `acquire`, `renew` or `release`.
        statement: &'static str,
        /// What the database said when it was checked.
        reason: String,
    },

    /// The lock is held and the caller asked not to wait for it (leader election with
    /// `fail_if_locked`).
    #[error(
        "{key:?} is already held by {}; this call was told not to stand by (fail_if_locked)",
        if *by_this_instance { "this instance" } else { "another instance" }
    )]
    AlreadyHeld {
        /// The lock key (for leader election: the group).
        key: String,
        /// `true` when the holder is this very instance (another handle of it).
        by_this_instance: bool,
    },

    /// The lease ended before its holder released it: another instance may have held the lock
    /// in between, so work done under it was not protected. Fencing tokens exist for this case.
    #[error(
        "the lease on {key:?} was lost ({reason}); another instance may have held the lock since: \
         treat work done under it as unprotected"
    )]
    LeaseLost {
        /// The user's key.
        key: String,
        /// Why the lease ended.
        reason: LossReason,
    },

    /// The database did not complete an operation before the caller's deadline (or, for calls
    /// without a deadline, before `RegistryBuilder::operation_timeout`). Transient failures are
    /// retried until then; the last one is kept as the source. The message names the pool
    /// setting that bounds the operation's connections.
    /// When the server refused connections because it has no slot left ("too many clients",
    /// PostgreSQL's SQLSTATE 53300), the message says so and what to do.
    #[error(
        "{operation} did not complete within {waited:?}: {}",
        timeout_cause(operation, source.as_deref())
    )]
    Timeout {
        /// What was being done: `acquire`, `renew` (a manual renewal), `background renewal`,
        /// `release`, `connect`.
        operation: &'static str,
        /// How long it was tried.
        waited: Duration,
        /// The last failure seen, if any.
        #[source]
        source: Option<DatabaseError>,
    },

    /// The registry was closed ([`LockRegistry::close`](crate::LockRegistry::close)): a wait
    /// that was under way ended, and nothing new is granted. Locks held when it was closed stay
    /// held until their guards go.
    #[error("the registry was closed: no lock is granted any more")]
    Closed,

    /// The database refused an operation in a way retrying will not fix.
    #[error("{operation} failed: {hint}")]
    Database {
        /// What was being done.
        operation: &'static str,
        /// What to check.
        hint: String,
        /// The driver's error.
        #[source]
        source: DatabaseError,
    },

    /// A semaphore was asked for with another number of permits than the one recorded for its
    /// name in the semaphore table (by the instance that used it first), or than a handle of
    /// it in this registry has. Instances that disagree would otherwise hold more permits
    /// between them than either allows.
    #[error(
        "semaphore {name:?} has {recorded} permits recorded in {table}, not {permits}: every \
         instance must ask for the same number; to change it, stop every instance using it and \
         run `{fix}`"
    )]
    PermitsMismatch {
        /// The semaphore's name.
        name: String,
        /// The number this call asked for.
        permits: u32,
        /// The number recorded.
        recorded: i64,
        /// The semaphore table.
        table: String,
        /// The statement that forgets the recorded number (the next use records its own).
        fix: String,
    },

    /// A connection failed because of TLS: the server's certificate did not pass the
    /// verification the URL asked for, the handshake failed, or one side requires TLS and the
    /// other has it off. Returned by `build()`, which opens a connection first; `hint` names
    /// the URL setting to change.
    #[error("TLS connection to {server} failed ({problem}): {hint}")]
    Tls {
        /// What went wrong.
        problem: TlsProblem,
        /// The server, `host:port`.
        server: String,
        /// What to change.
        hint: String,
        /// The driver's or the TLS library's error.
        #[source]
        source: Option<DatabaseError>,
    },
}

impl fmt::Debug for Error {
    /// The message, then each cause on a line of its own (as `anyhow` prints an error).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")?;
        let mut cause = std::error::Error::source(self);
        if cause.is_some() {
            f.write_str("\n\nCaused by:")?;
        }
        let mut number = 0;
        while let Some(error) = cause {
            write!(f, "\n    {number}: {error}")?;
            number += 1;
            cause = error.source();
        }
        Ok(())
    }
}

/// What went wrong in a TLS connection ([`Error::Tls`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TlsProblem {
    /// The certificate chain is trusted but does not name the host the URL connects to
    /// (PostgreSQL `sslmode=verify-full`, MySQL `ssl-mode=VERIFY_IDENTITY`).
    HostName,
    /// The certificate chain does not lead to a trusted CA: the CA file given in the URL
    /// (`sslrootcert`, `ssl-ca`), or, without one, Mozilla's root certificates as compiled
    /// into the `webpki-roots` crate (the system's store is not read).
    UnknownIssuer,
    /// The certificate is expired, not yet valid, or otherwise unusable.
    InvalidCertificate,
    /// The handshake failed for another reason, e.g. the server refused the client
    /// certificate or shares no protocol version with the client.
    Handshake,
    /// The server requires TLS for this user or database, and the URL turned TLS off.
    Required,
    /// The URL requires TLS and the server does not offer it.
    NotOffered,
}

impl fmt::Display for TlsProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TlsProblem::HostName => "the certificate does not name the host",
            TlsProblem::UnknownIssuer => "the certificate is not signed by a trusted CA",
            TlsProblem::InvalidCertificate => "the certificate is not valid",
            TlsProblem::Handshake => "the TLS handshake failed",
            TlsProblem::Required => "the server requires TLS",
            TlsProblem::NotOffered => "the server does not offer TLS",
        })
    }
}

/// What a message about a server without a free connection slot (PostgreSQL's SQLSTATE
/// 53300) says, wherever it comes from, so that a pool's error text can be recognized.
pub(crate) const TOO_MANY_CLIENTS: &str =
    "the server has no connection slot left (too many clients, SQLSTATE 53300)";

/// What to do about [`TOO_MANY_CLIENTS`].
pub(crate) const TOO_MANY_CLIENTS_FIX: &str =
    "put a pooler such as PgBouncer (transaction mode) in front of the server, raise its \
     max_connections (or the role's CONNECTION LIMIT), or open fewer connections: fewer \
     processes or registries, a smaller pool_size";

/// Why an operation timed out, for [`Error::Timeout`]'s message: a full server by name, else
/// the usual suspects.
fn timeout_cause(
    operation: &str,
    source: Option<&(dyn std::error::Error + Send + Sync)>,
) -> String {
    let text = source.map(|e| e.to_string()).unwrap_or_default();
    if text.contains(TOO_MANY_CLIENTS) {
        return format!("{TOO_MANY_CLIENTS}: {TOO_MANY_CLIENTS_FIX}");
    }
    // MySQL's 1205, a renewal that skipped a locked row, SQLite's busy file: another session
    // held what the statement needed.
    if text.contains("Lock wait timeout exceeded") || text.contains("stayed locked by another") {
        return "a row of the lock table stayed locked by another session until then (an open \
                fenced transaction, a long transaction or a `SELECT ... FOR UPDATE` on the \
                table): end that transaction"
            .to_string();
    }
    if text.contains("database is locked") {
        return "another connection kept the SQLite file's write lock until then (an open \
                fenced transaction, a long write transaction, or a process frozen inside one): \
                end that transaction"
            .to_string();
    }
    // A statement was sent and its answer had not come when the time ran out: with a short
    // wait that is the wait, not the database.
    if text.contains("no answer from") {
        return format!(
            "a statement was sent but not answered in that time; a wait shorter than the \
             database takes to answer (a disk sync, a busy server) ends this way, so allow more \
             time, else the database is unreachable or overloaded (check the server and \
             RegistryBuilder::{})",
            pool_setting(operation)
        );
    }
    format!(
        "the database is unreachable, overloaded or every connection is busy (check the server \
         and RegistryBuilder::{})",
        pool_setting(operation)
    )
}

/// The builder setting that bounds the connections `operation` draws from: background
/// renewals have a pool of their own.
fn pool_setting(operation: &str) -> &'static str {
    match operation {
        "background renewal" => "renewal_pool_size",
        _ => "pool_size",
    }
}

impl Error {
    /// `true` when this is [`Error::LeaseLost`].
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, Error::LeaseLost { .. })
    }

    pub(crate) fn setting(setting: &'static str, reason: impl Into<String>) -> Error {
        Error::InvalidSetting {
            setting,
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_missing_message_names_the_file_to_run() {
        let e = Error::TableMissing {
            table: "APP_LOCK".into(),
            ddl_file: "sql/sqlite.sql",
        };
        let text = e.to_string();
        assert!(
            text.contains("APP_LOCK") && text.contains("sql/sqlite.sql"),
            "{text}"
        );
    }

    #[test]
    fn debug_leads_with_the_message_and_lists_the_causes() {
        let e = Error::Database {
            operation: "connect",
            hint: "is the server running?".into(),
            source: Box::new(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "connection refused",
            )),
        };
        let debug = format!("{e:?}");
        assert!(debug.starts_with(&e.to_string()), "{debug}");
        assert!(
            debug.ends_with("Caused by:\n    0: connection refused"),
            "{debug}"
        );
        let plain = format!("{:?}", Error::Closed);
        assert_eq!(plain, Error::Closed.to_string());
    }

    #[test]
    fn a_statement_unanswered_at_the_deadline_says_the_wait_may_be_too_short() {
        let e = Error::Timeout {
            operation: "acquire",
            waited: Duration::from_millis(3),
            source: Some("no answer from PostgreSQL before the deadline".into()),
        };
        let text = e.to_string();
        assert!(
            text.contains("allow more time") && !text.contains("every connection is busy"),
            "{text}"
        );
    }

    #[test]
    fn a_timeout_behind_a_locked_row_names_the_row_lock() {
        let e = Error::Timeout {
            operation: "release",
            waited: Duration::from_secs(5),
            source: Some("Lock wait timeout exceeded; try restarting transaction".into()),
        };
        let text = e.to_string();
        assert!(
            text.contains("locked by another session") && !text.contains("unreachable"),
            "{text}"
        );
    }
}
