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
                    "table {table} does not exist: create it with `leasehold init` and the same \
                     --database and --prefix (or have a DBA run what `leasehold init --print` \
                     shows; `run` and `lead` create it with --create); check --prefix for a \
                     typo, as every instance must use the same database, prefix and region"
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
        Failure::new(code, for_cli(&error.to_string()))
    }
}

/// A message of the library as the command's user reads it: the command's options and
/// `leasehold init` where the library names its builder's settings, its constructors and the
/// DDL files of its source tree (which an installed command's user does not have).
pub fn for_cli(message: &str) -> String {
    const SAID: [(&str, &str); 15] = [
        (" and RegistryBuilder::renewal_pool_size", ""),
        (" and RegistryBuilder::pool_size", ""),
        (" (with INT_ replaced by the prefix)", ""),
        (" (with INT_ replaced by your prefix)", ""),
        (
            "a registry has been built with create_table(true)",
            "`leasehold init` has been run",
        ),
        (
            "leave RegistryBuilder::prepared_statements off",
            "leave out --prepared-statements",
        ),
        (
            "RegistryBuilder::prepared_statements",
            "--prepared-statements",
        ),
        ("RegistryBuilder::listener_url", "--listener-url"),
        ("RegistryBuilder::create_table(true)", "`leasehold init`"),
        ("create_table(true)", "`leasehold init`"),
        ("LockRegistry::postgres", "a postgres:// URL"),
        ("LockRegistry::mysql", "a mysql:// URL"),
        ("LockRegistry::sqlite", "a sqlite: URL"),
        (
            "check the prefix (the lock table is the prefix",
            "check --prefix (the lock table is the prefix",
        ),
        ("check the prefix", "check --prefix"),
    ];
    let mut text = message.to_string();
    for (library, command) in SAID {
        text = text.replace(library, command);
    }
    // `sql/postgres.sql`, `sql/mysql_floor.sql`, …: what `init --print` prints.
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(at) = rest.find("sql/") {
        let after = &rest[at + 4..];
        let stem = after
            .bytes()
            .take_while(|b| b.is_ascii_lowercase() || *b == b'_')
            .count();
        if stem > 0 && after[stem..].starts_with(".sql") {
            out.push_str(&rest[..at]);
            out.push_str("what `leasehold init --print` shows");
            rest = &after[stem + 4..];
        } else {
            out.push_str(&rest[..at + 4]);
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::for_cli;

    #[test]
    fn library_advice_becomes_the_commands() {
        assert_eq!(
            for_cli("no such table: X: create the table with sql/sqlite.sql or RegistryBuilder::create_table(true)"),
            "no such table: X: create the table with what `leasehold init --print` shows or \
             `leasehold init`"
        );
        assert_eq!(
            for_cli(
                "DROP TABLE T_LOCK, then run sql/postgres.sql: column REGION is part of the key"
            ),
            "DROP TABLE T_LOCK, then run what `leasehold init --print` shows: column REGION is \
             part of the key"
        );
        let floor = for_cli(
            "Until sql/mysql_floor.sql (with INT_ replaced by the prefix) has been run, or a \
             registry has been built with create_table(true) by a user",
        );
        assert_eq!(
            floor,
            "Until what `leasehold init --print` shows has been run, or `leasehold init` has been \
             run by a user"
        );
        assert_eq!(for_cli("see sql/ and x.sql"), "see sql/ and x.sql");
        assert!(!for_cli(", or use LockRegistry::mysql").contains("LockRegistry"));
    }
}
