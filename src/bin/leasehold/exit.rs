//! The exit codes of `leasehold` itself (those of `sysexits.h` where one fits), and
//! [`Failure`], a failure of leasehold that carries one.

use leasehold::Error;

/// The arguments are wrong, a key or a setting among them (`EX_USAGE`).
pub const USAGE: u8 = 64;
/// `leasehold` failed: the database could not be reached or refused, the table is
/// missing (`EX_SOFTWARE`).
pub const ERROR: u8 = 70;
/// The lease (or leadership, under `lead`) was lost while the command ran (it was stopped)
/// or before it ended: another instance may have run at the same time (`EX_IOERR`).
pub const LOST: u8 = 74;
/// The lock was held elsewhere: `--no-wait`, or `--wait` ran out (`EX_TEMPFAIL`).
pub const BUSY: u8 = 75;
/// The command was found but could not be started (as a shell reports it).
pub const CANNOT_RUN: u8 = 126;
/// The command was not found (as a shell reports it).
pub const NOT_FOUND: u8 = 127;
/// `status`: the key is free.
pub const FREE: u8 = 1;

/// A failure of leasehold itself: one line, and the exit code.
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    pub fn new(code: u8, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Failure {
        if let Error::TableMissing { table, .. } = &error {
            // The library's advice (a DDL file, `create_table`) is for programs; an installed
            // command's user has `init`.
            return Failure::new(
                ERROR,
                format!(
                    "lock table {table} does not exist: create it with `leasehold init` and the \
                     same --database and --prefix (or have a DBA run what `leasehold init \
                     --print` shows); check --prefix for a typo, as every instance must use the \
                     same database, prefix and region"
                ),
            );
        }
        let code = match error {
            Error::LeaseLost { .. } => LOST,
            Error::InvalidKey { .. }
            | Error::InvalidSetting { .. }
            | Error::PermitsMismatch { .. } => USAGE,
            _ => ERROR,
        };
        Failure::new(code, error.to_string())
    }
}
