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
/// DDL files of its source tree (which an installed command's user does not have); the MySQL
/// driver's errors without the name of their kind (`DriverError { … }`); durations rounded
/// to what a person reads.
pub fn for_cli(message: &str) -> String {
    const SAID: [(&str, &str); 31] = [
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
        ("invalid setting `prefix`", "invalid --prefix"),
        ("invalid setting `region`", "invalid --region"),
        ("invalid setting `permits`", "invalid --permits"),
        ("invalid setting `time_to_live`", "invalid --ttl"),
        ("invalid setting `idle_between_tries`", "invalid --poll"),
        ("invalid setting `keep`", "invalid --keep-for"),
        ("invalid setting `listener_url`", "invalid --listener-url"),
        ("invalid setting `connect_timeout`", "invalid --db-timeout"),
        (
            "invalid setting `operation_timeout`",
            "invalid --db-timeout",
        ),
        ("invalid setting `sqlite`", "invalid --database"),
        (
            "fewer processes or registries, a smaller pool_size",
            "fewer processes",
        ),
        (
            "Resource temporarily unavailable (os error 11)",
            "no answer in time",
        ),
        (
            "point the registry at another path",
            "give another path in --database",
        ),
        ("do not reach this registry", "do not reach leasehold"),
        (" (every idle_between_tries)", ""),
        ("semaphores of this registry", "--permits"),
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
    rounded_durations(&unwrapped(&out))
}

/// `text` without the kind the MySQL driver names around each of its errors:
/// `DriverError { Could not connect … }` becomes `Could not connect …`, and
/// ``IO error: `…'`` the text inside the quotes.
fn unwrapped(text: &str) -> String {
    const KINDS: [&str; 6] = [
        "DriverError { ",
        "CodecError { ",
        "IoError { ",
        "MySqlError { ",
        "UrlError { ",
        "TlsError { ",
    ];
    let mut text = text.to_string();
    while let Some((at, kind)) = KINDS
        .iter()
        .filter_map(|kind| text.find(kind).map(|at| (at, kind)))
        .min()
    {
        let inside = at + kind.len();
        // The matching `}`: the driver's texts may hold braces of their own.
        let mut depth = 1;
        let close = text[inside..].char_indices().find_map(|(i, c)| {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
            (depth == 0).then_some(inside + i)
        });
        let Some(close) = close else { break };
        let inner = text[inside..close].trim_end().to_string();
        text.replace_range(at..close + 1, &inner);
    }
    while let Some(at) = text.find("IO error: `") {
        let inside = at + "IO error: `".len();
        let Some(end) = text[inside..].find('\'') else {
            break;
        };
        let inner = text[inside..inside + end].to_string();
        text.replace_range(at..inside + end + 1, &inner);
    }
    text
}

/// `text` with the durations Rust's `Debug` writes (`4.949087599s`, `524.241699ms`) rounded:
/// seconds to a tenth (whole seconds from 10 s, milliseconds below 1 s), milliseconds to whole
/// ones.
fn rounded_durations(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        let starts_number = bytes[i].is_ascii_digit()
            && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'.'));
        if !starts_number {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'.') {
            i += 1;
        }
        let number = &text[start..i];
        let unit = ["ms", "s"]
            .into_iter()
            .find(|unit| text[i..].starts_with(unit))
            .filter(|unit| {
                let after = i + unit.len();
                after == bytes.len() || !bytes[after].is_ascii_alphanumeric()
            });
        let (Some(unit), Ok(value)) = (unit, number.parse::<f64>()) else {
            continue;
        };
        if !number.contains('.') {
            continue;
        }
        let shown = match unit {
            "s" if value < 1.0 => format!("{:.0}ms", value * 1000.0),
            "s" if value < 10.0 => {
                let tenths = format!("{value:.1}");
                let whole = tenths.strip_suffix(".0").unwrap_or(&tenths);
                format!("{whole}s")
            }
            unit => format!("{value:.0}{unit}"),
        };
        out.push_str(&text[copied..start]);
        out.push_str(&shown);
        i += unit.len();
        copied = i;
    }
    out.push_str(&text[copied..]);
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
        assert_eq!(
            for_cli(
                "connect failed: cannot reach MySQL at 127.0.0.1:5999 within 5s (DriverError { \
                 Could not connect to address `127.0.0.1:5999': Connection refused (os error \
                 111) }): start the server"
            ),
            "connect failed: cannot reach MySQL at 127.0.0.1:5999 within 5s (Could not connect \
             to address `127.0.0.1:5999': Connection refused (os error 111)): start the server"
        );
        assert_eq!(
            for_cli("(CodecError { IO error: `Resource temporarily unavailable (os error 11)' })"),
            "(no answer in time)"
        );
        assert_eq!(
            for_cli("MySqlError { ERROR 1045 (28000): a {b} c }."),
            "ERROR 1045 (28000): a {b} c."
        );
        assert_eq!(
            for_cli("invalid setting `prefix`: \"a-b\" is not a plain SQL identifier"),
            "invalid --prefix: \"a-b\" is not a plain SQL identifier"
        );
        assert_eq!(
            for_cli("(check the server and RegistryBuilder::renewal_pool_size)"),
            "(check the server)"
        );
    }

    #[test]
    fn the_registry_is_not_named() {
        for message in [
            "the file is not a healthy SQLite database: point the registry at another path",
            "PostgreSQL release notifications do not reach this registry: LISTEN at x did not \
             hear; waiters only poll now (every idle_between_tries). Give the listener a direct \
             connection: RegistryBuilder::listener_url",
            "could not create the semaphore table T from sql/sqlite_semaphore.sql: e; \
             semaphores of this registry will fail until it exists",
        ] {
            let said = for_cli(message);
            assert!(
                !said.contains("registry") && !said.contains("idle_between"),
                "{said}"
            );
        }
    }

    #[test]
    fn durations_are_rounded() {
        assert_eq!(
            for_cli("within 4.949087599s (no answer within 524.241699ms, 12.7s, 0.04s)"),
            "within 4.9s (no answer within 524ms, 13s, 40ms)"
        );
        assert_eq!(
            for_cli("at 127.0.0.1:5432 for 1.000001s, v1.5s and 10s"),
            "at 127.0.0.1:5432 for 1s, v1.5s and 10s"
        );
        assert!(!for_cli(", or use LockRegistry::mysql").contains("LockRegistry"));
    }
}
