//! The database a command names: its URL (`sqlite:PATH`, `postgres://…`, `mysql://…`), the
//! registry builder with the table prefix and region, and the client id that tells operators
//! where a holder runs.

use crate::args::Database;
use crate::exit::{self, Failure};
use leasehold::{LockRegistry, RegistryBuilder};
use std::time::Duration;

/// The URL names a database this build cannot reach.
#[cfg_attr(
    all(feature = "sqlite", feature = "postgres", feature = "mysql"),
    allow(dead_code)
)]
pub fn without(feature: &str) -> Failure {
    Failure::new(
        exit::USAGE,
        format!(
            "this leasehold was built without the `{feature}` feature; install it with \
             `cargo install leasehold --features cli,{feature}`"
        ),
    )
}

/// What a command may do with the database.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Tables {
    /// `run --create`, `lead --create` (and `init` itself): create the SQLite file, the table
    /// and its deletion floor when missing.
    Create,
    /// `run`, `lead`, `release` and `cleanup`: only use an existing table — a typo'd
    /// `--prefix` or `--database` must neither leave a table, a floor table and a trigger
    /// behind nor run the job under a lock nobody else takes — nor create a missing SQLite
    /// file.
    Existing,
    /// `status` and `list`: as [`Tables::Existing`], and SQLite opens the file read-only (a
    /// user who may only read it can look), without the release board.
    Read,
}

/// A registry on the database of `database`.
pub fn registry(
    database: &Database,
    ttl: Option<Duration>,
    tables: Tables,
) -> Result<LockRegistry, Failure> {
    let mut builder = builder_for(database, tables)?;
    if let Some(ttl) = ttl {
        builder = builder.time_to_live(ttl);
    }
    Ok(builder.build()?)
}

/// A registry builder for `database` that does what `tables` allows.
pub fn builder_for(database: &Database, tables: Tables) -> Result<RegistryBuilder, Failure> {
    let builder = builder(database)?;
    if tables == Tables::Create {
        return Ok(builder.create_table(true));
    }
    if let Some(path) = sqlite_path(&database.database) {
        if !std::path::Path::new(path).exists() {
            return Err(Failure::new(
                exit::ERROR,
                format!(
                    "there is no SQLite database {path}: create it and its lock table with \
                     `leasehold init --database sqlite:{path}` (and the same --prefix; `run` \
                     and `lead` create them with --create), or check the path for a typo"
                ),
            ));
        }
    }
    let builder = builder.create_table(false);
    Ok(match tables {
        Tables::Read => builder.read_only(true).notifications(false),
        _ => builder,
    })
}

/// What `run` and `lead` may do: create with `--create`, else only use what exists.
pub fn creating(create: bool) -> Tables {
    if create {
        Tables::Create
    } else {
        Tables::Existing
    }
}

/// The file a `sqlite:` URL names.
fn sqlite_path(url: &str) -> Option<&str> {
    let path = url.strip_prefix("sqlite:")?;
    Some(path.strip_prefix("//").unwrap_or(path))
}

/// A registry builder for the database of `database`, with its prefix, region and client id.
pub fn builder(database: &Database) -> Result<RegistryBuilder, Failure> {
    let url = database.database.as_str();
    let builder = if let Some(path) = sqlite_path(url) {
        if path.is_empty() {
            return Err(Failure::new(
                exit::USAGE,
                "the database URL sqlite: names no file: use sqlite:PATH, e.g. \
                 sqlite:/var/lib/jobs/locks.db",
            ));
        }
        #[cfg(feature = "sqlite")]
        {
            LockRegistry::sqlite(path)
        }
        #[cfg(not(feature = "sqlite"))]
        return Err(without("sqlite"));
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        #[cfg(feature = "postgres")]
        {
            LockRegistry::postgres(url)
        }
        #[cfg(not(feature = "postgres"))]
        return Err(without("postgres"));
    } else if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        #[cfg(feature = "mysql")]
        {
            LockRegistry::mysql(url.replacen("mariadb://", "mysql://", 1))
        }
        #[cfg(not(feature = "mysql"))]
        return Err(without("mysql"));
    } else {
        return Err(Failure::new(
            exit::USAGE,
            format!(
                "unknown database URL {url:?}: use sqlite:PATH, postgres://USER@HOST:PORT/DB or \
                 mysql://USER@HOST:PORT/DB (or set LEASEHOLD_DATABASE_URL)"
            ),
        ));
    };
    let mut builder = builder.prepared_statements(database.prepared_statements);
    if let Some(url) = &database.listener_url {
        builder = builder.listener_url(url.clone());
    }
    Ok(builder
        .client_id(client_id())
        .prefix(database.prefix.clone())
        .region(database.region.clone()))
}

/// `HOST/PID/RANDOM` (at most 36 characters; the library's format, with the host name from
/// `gethostname`), so that `status` tells operators where the holder runs; the random part
/// keeps it unique when a pid is reused.
fn client_id() -> String {
    leasehold::client_id_for_host(&hostname())
}

/// This host's name (gethostname(3), POSIX), or "" if it cannot be read.
#[allow(unsafe_code)]
fn hostname() -> String {
    let mut name = [0u8; 256];
    // SAFETY: gethostname writes at most `name.len()` bytes into the buffer.
    let got = unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) };
    if got != 0 {
        return String::new();
    }
    let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
    String::from_utf8_lossy(&name[..end]).into_owned()
}
