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

/// A registry builder for `database` that does what `tables` allows, once the URL has been
/// checked for what no command can use ([`refuse_unusable`]).
pub fn builder_for(database: &Database, tables: Tables) -> Result<RegistryBuilder, Failure> {
    let builder = builder(database)?;
    refuse_unusable(database)?;
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

/// An SQLite file that `status` and `list` read as a snapshot ([`inspecting`]).
pub struct Snapshot {
    /// The database file, as given.
    pub path: String,
    /// Its directory, in which this user may not create files.
    pub dir: String,
}

/// A registry for `status` and `list` ([`Tables::Read`]), with the [`Snapshot`] it reads when
/// it cannot read the SQLite file live.
///
/// SQLite reads a database in WAL mode through the `-wal` and `-shm` files beside it: a user
/// who may read the three reads them while they are there (while some process has the
/// database open), and otherwise SQLite creates them, which needs write permission on the
/// directory. When they are not both there, the directory may not be written, and no `-wal`
/// file with commits in it is there either — the last process to close the database copied
/// its log into the file and removed it — the file alone holds every commit: it is read as it
/// is (SQLite's `immutable` URI), without locks, and said to be a snapshot, since a process
/// that opens and writes the database meanwhile is not seen. A `-wal` file with commits in it
/// is never left out: that read fails and says what permission it needs.
pub fn inspecting(database: &Database) -> Result<(LockRegistry, Option<Snapshot>), Failure> {
    let checked = builder_for(database, Tables::Read)?;
    let Some(snapshot) = sqlite_path(&database.database).and_then(snapshot_of) else {
        return Ok((checked.build()?, None));
    };
    let uri =
        immutable_uri(&std::fs::canonicalize(&snapshot.path).map_err(|e| {
            Failure::new(exit::ERROR, format!("cannot read {}: {e}", snapshot.path))
        })?);
    let immutable = Database {
        database: format!("sqlite:{uri}"),
        ..database.clone()
    };
    let registry = builder(&immutable)?
        .create_table(false)
        .read_only(true)
        .notifications(false)
        .build()?;
    Ok((registry, Some(snapshot)))
}

/// The registry of `status` or `list` ([`inspecting`]); a snapshot is said on stderr, and
/// refused when `watching`: an immutable read never sees a change.
pub fn inspect(database: &Database, watching: bool) -> Result<LockRegistry, Failure> {
    let (registry, snapshot) = inspecting(database)?;
    if let Some(Snapshot { path, dir }) = snapshot {
        let why = format!(
            "this user may not create {path}-wal and {path}-shm in {dir}, through which SQLite \
             reads a database in WAL mode, and no process has the database open"
        );
        if watching {
            return Err(Failure::new(
                exit::ERROR,
                format!(
                    "--watch needs a live read of {path}: {why}; let this user create files in \
                     {dir}, or watch while a process has the database open"
                ),
            ));
        }
        eprintln!(
            "leasehold: {path} is read as a snapshot: {why}, so the file alone is read, without \
             locks; a process that opens it meanwhile is not seen"
        );
    }
    Ok(registry)
}

/// The SQLite file at `path` when it can be read only as a snapshot (see [`inspecting`]).
fn snapshot_of(path: &str) -> Option<Snapshot> {
    let file = std::path::Path::new(path);
    let (wal, shm) = (beside(file, "-wal"), beside(file, "-shm"));
    let logged = std::fs::metadata(&wal).is_ok_and(|m| m.len() > 0);
    let dir = match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => std::path::Path::new("."),
    };
    let live = wal.exists() && shm.exists();
    if live || logged || !file.is_file() || may_write(dir) {
        return None;
    }
    Some(Snapshot {
        path: path.to_string(),
        dir: dir.display().to_string(),
    })
}

/// `path` with `suffix` appended: the files SQLite keeps beside a database.
fn beside(path: &std::path::Path, suffix: &str) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    name.into()
}

/// The `file:` URI that opens the database at the absolute `path` immutable: bytes other
/// than letters, digits, `/` and `-._~` percent-encoded.
fn immutable_uri(path: &std::path::Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut uri = String::from("file://");
    for byte in path.as_os_str().as_bytes() {
        match byte {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'/' | b'-' | b'.' | b'_' | b'~' => {
                uri.push(char::from(*byte))
            }
            other => uri.push_str(&format!("%{other:02X}")),
        }
    }
    uri.push_str("?immutable=1");
    uri
}

/// Whether this process may create files in `dir` (access(2), by the real user).
#[allow(unsafe_code)]
fn may_write(dir: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(name) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return true;
    };
    // SAFETY: access(2) only reads the NUL-terminated path.
    unsafe { libc::access(name.as_ptr(), libc::W_OK) == 0 }
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

/// Refuses, before anything is connected to, what no command can use: an SQLite database in
/// memory (each connection has its own, and locks in it exclude nothing), an SQLite path that
/// is a directory, a MySQL URL that names no database (without one in --prefix) — exit 64 —
/// and an SQLite path whose directory is missing (exit 70, as for a missing file). Every
/// subcommand but `init --print` says the same of them.
fn refuse_unusable(database: &Database) -> Result<(), Failure> {
    let url = database.database.as_str();
    if let Some(path) = sqlite_path(url) {
        let uri_in_memory = path.starts_with("file:")
            && (path.contains(":memory:") || path.contains("mode=memory"));
        if path == ":memory:" || uri_in_memory {
            return Err(Failure::new(
                exit::USAGE,
                format!(
                    "{url} is a database in memory, which every connection has to itself: locks \
                     in it would exclude nothing; give the path of a file that every process \
                     sharing the locks opens, e.g. sqlite:/var/lib/jobs/locks.db"
                ),
            ));
        }
        let file = std::path::Path::new(path);
        if let Some(directory) = file
            .parent()
            .filter(|parent| !parent.as_os_str().is_empty() && !parent.is_dir())
        {
            return Err(Failure::new(
                exit::ERROR,
                format!(
                    "there is no directory {} for the SQLite database {path}: create it, or \
                     check the path in --database for a typo",
                    directory.display()
                ),
            ));
        }
        if file.is_dir() {
            return Err(Failure::new(
                exit::USAGE,
                format!(
                    "{url} names a directory: give the path of the database file, e.g. \
                     sqlite:{}/locks.db",
                    path.trim_end_matches('/')
                ),
            ));
        }
    }
    if is_mysql(url) && mysql_database(url).is_none() && !database.prefix.contains('.') {
        return Err(Failure::new(
            exit::USAGE,
            format!(
                "the URL {} names no database: add it (mysql://USER@HOST:PORT/DB), or give it \
                 in --prefix (DB.{})",
                without_password(url),
                database.prefix
            ),
        ));
    }
    Ok(())
}

fn is_mysql(url: &str) -> bool {
    url.starts_with("mysql://") || url.starts_with("mariadb://")
}

fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// The parts of a server URL: the hosts (`host:port`, several separated by commas), the path
/// after them (without its `/`) and the options after `?`.
fn url_parts(url: &str) -> (&str, &str, &str) {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let (rest, options) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let hosts = authority
        .rsplit_once('@')
        .map_or(authority, |(_, hosts)| hosts);
    (hosts, path, options)
}

/// The value of option `name` in a URL's options (`a=1&b=2`).
fn url_option<'u>(options: &'u str, name: &str) -> Option<&'u str> {
    options
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// The database a MySQL URL names: its path, or its `db_name` option.
fn mysql_database(url: &str) -> Option<&str> {
    let (_, path, options) = url_parts(url);
    Some(path)
        .filter(|path| !path.is_empty())
        .or_else(|| url_option(options, "db_name").filter(|name| !name.is_empty()))
}

/// `url` with the password of its user, if any, left out.
fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    match rest[..end].rsplit_once('@') {
        Some((user, hosts)) => {
            let name = user.split_once(':').map_or(user, |(name, _)| name);
            format!("{scheme}://{name}@{hosts}{}", &rest[end..])
        }
        None => url.to_string(),
    }
}

/// The default of `--db-timeout`, the library's.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long to try to connect: `--db-timeout`, else the URL's own limit per connection
/// attempt (PostgreSQL's `connect_timeout` in seconds, MySQL's `tcp_connect_timeout_ms`) for
/// each of its hosts, else 5 s.
pub fn connect_timeout(database: &Database) -> Duration {
    if let Some(timeout) = database.db_timeout {
        return timeout;
    }
    let url = database.database.as_str();
    let (hosts, _, options) = url_parts(url);
    let per_host = if is_postgres(url) {
        // As libpq and tokio-postgres read it: whole seconds, 0 or less for none.
        url_option(options, "connect_timeout")
            .and_then(|value| value.trim().parse::<i64>().ok())
            .filter(|seconds| *seconds > 0)
            .map(|seconds| Duration::from_secs(seconds.unsigned_abs()))
    } else if is_mysql(url) {
        url_option(options, "tcp_connect_timeout_ms")
            .and_then(|value| value.parse::<u64>().ok())
            .filter(|millis| *millis > 0)
            .map(Duration::from_millis)
    } else {
        None
    };
    let hosts = hosts.split(',').count() as u32;
    per_host
        .and_then(|limit| limit.checked_mul(hosts))
        .map_or(DEFAULT_TIMEOUT, |limit| limit.min(leasehold::MAX_TIMEOUT))
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
    } else if is_postgres(url) {
        #[cfg(feature = "postgres")]
        {
            LockRegistry::postgres(url)
        }
        #[cfg(not(feature = "postgres"))]
        return Err(without("postgres"));
    } else if is_mysql(url) {
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
    let mut builder = builder
        .prepared_statements(database.prepared_statements)
        .connect_timeout(connect_timeout(database))
        .operation_timeout(database.db_timeout.unwrap_or(DEFAULT_TIMEOUT));
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
