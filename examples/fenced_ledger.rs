//! A ledger kept under a lock with fenced transactions.
//!
//! Every critical section adds one to a ledger row in the database of the lock table: it takes
//! the lock, begins a transaction, fences it with the guard, reads the total, pauses, writes
//! the total + 1 and commits. Run several at once on one file, stop one with `kill -STOP` for
//! longer than the lease (10 s here by default) and resume it with `kill -CONT`: the total
//! stays equal to the number of sections that printed `committed`. The stopped holder either
//! commits before anyone else can take the lock (the others wait for its transaction), or, if
//! it was stopped before its fence, is refused, or, stopped inside its fenced transaction for
//! longer than the lease on PostgreSQL or MySQL, fails: the server ended the idle transaction,
//! which frees the lock for the others.
//!
//! ```text
//! cargo run --example fenced_ledger -- ledger.db                  # SQLite
//! cargo run --example fenced_ledger --features postgres -- postgres://postgres@localhost/test
//! cargo run --example fenced_ledger --features mysql -- mysql://root@localhost/test
//! ```
//!
//! Options: `--sections N` (default 20; 0 runs until `--until FILE` exists), `--mode fenced`
//! (default) or the unprotected `plain` (the same transaction without the fence) and
//! `autocommit` (read and write outside a transaction), `--ttl-ms`, `--pause-ms`, `--prefix`
//! (of the lock table and of the ledger, `INT_LEDGER` by default). Each section prints one line
//! per step: `granted N`, `read N TOTAL`, then `committed N`, `refused N …` (the fence found
//! the lease lost) or `failed N …` (the database refused), and `lost N …` when the unlock finds
//! the lease had run out; `busy N …` when the lock could not be asked for in time.
//!
//! Unprotected, a holder stopped between its read and its write loses the updates made
//! meanwhile on PostgreSQL and MySQL. On SQLite a plain transaction that read before another
//! connection wrote the file (a takeover, but also a renewal) cannot write after it: SQLite
//! refuses a write from a stale snapshot ("database is locked"), so there only `autocommit`
//! shows lost updates.

use leasehold::{LockGuard, LockRegistry};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

type Failure = Box<dyn std::error::Error + Send + Sync>;

/// What `--help` prints, and a command line without a database.
pub const USAGE: &str = "usage: fenced_ledger DATABASE [--mode fenced|plain|autocommit] \
                         [--sections N] [--until FILE] [--ttl-ms MS] [--pause-ms MS] [--prefix P]
DATABASE: an SQLite file, or a postgres:// or mysql:// URL (with --features postgres / mysql).
Each section takes the lock, reads the ledger's total in a transaction fenced with the guard,
pauses --pause-ms (default 200), writes the total + 1 and commits. --sections N (default 20;
0: until --until FILE exists); --mode plain (the transaction without the fence) and
autocommit (no transaction) are the unprotected controls; --ttl-ms the lease (default 10000);
--prefix the lock table's and the ledger's (INT_LEDGER) prefix.";

/// How a section writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// In a transaction fenced with the guard: commits only while the lease holds.
    Fenced,
    /// In a transaction without the fence (unprotected: the control).
    Plain,
    /// Read and write as separate statements, outside a transaction (unprotected).
    Autocommit,
}

/// The command line.
#[derive(Clone, Debug)]
pub struct Options {
    /// A SQLite file, or a `postgres://` or `mysql://` URL.
    pub database: String,
    pub prefix: String,
    pub mode: Mode,
    /// How many sections; 0: until `until` exists.
    pub sections: u64,
    pub until: Option<PathBuf>,
    pub ttl: Duration,
    pub pause: Duration,
}

impl Options {
    pub fn parse(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
        let mut options = Options {
            database: String::new(),
            prefix: "INT_".into(),
            mode: Mode::Fenced,
            sections: 20,
            until: None,
            ttl: Duration::from_secs(10),
            pause: Duration::from_millis(200),
        };
        let millis = |value: Option<String>| -> Result<Duration, String> {
            let value = value.ok_or("a number of milliseconds is missing")?;
            Ok(Duration::from_millis(
                value.parse().map_err(|e| format!("{value}: {e}"))?,
            ))
        };
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--prefix" => options.prefix = args.next().ok_or("--prefix needs a value")?,
                "--sections" => {
                    let n = args.next().ok_or("--sections needs a number")?;
                    options.sections = n.parse().map_err(|e| format!("{n}: {e}"))?;
                }
                "--until" => options.until = args.next().map(PathBuf::from),
                "--ttl-ms" => options.ttl = millis(args.next())?,
                "--pause-ms" => options.pause = millis(args.next())?,
                "--mode" => {
                    options.mode = match args.next().as_deref() {
                        Some("fenced") => Mode::Fenced,
                        Some("plain") => Mode::Plain,
                        Some("autocommit") => Mode::Autocommit,
                        other => {
                            return Err(format!("--mode fenced|plain|autocommit, not {other:?}"))
                        }
                    }
                }
                _ if arg.starts_with("--") => return Err(format!("unknown option {arg}")),
                _ => options.database = arg,
            }
        }
        if options.database.is_empty() {
            return Err(USAGE.into());
        }
        Ok(options)
    }

    /// The ledger's table, beside the lock table.
    pub fn ledger_table(&self) -> String {
        format!("{}LEDGER", self.prefix)
    }
}

/// The application's own connection to the database of the lock table.
pub enum Ledger {
    Sqlite(leasehold::rusqlite::Connection),
    #[cfg(feature = "postgres")]
    Postgres(leasehold::postgres::Client),
    #[cfg(feature = "mysql")]
    Mysql(leasehold::mysql::Conn),
}

impl Ledger {
    pub fn open(database: &str) -> Result<Ledger, Failure> {
        #[cfg(feature = "postgres")]
        if database.starts_with("postgres://") || database.starts_with("postgresql://") {
            let client =
                leasehold::postgres::Client::connect(database, leasehold::postgres::NoTls)?;
            return Ok(Ledger::Postgres(client));
        }
        #[cfg(feature = "mysql")]
        if database.starts_with("mysql://") {
            let opts = leasehold::mysql::Opts::from_url(database)?;
            return Ok(Ledger::Mysql(leasehold::mysql::Conn::new(opts)?));
        }
        let conn = leasehold::rusqlite::Connection::open(database)?;
        // A fenced transaction keeps other writers out until it ends: wait for them.
        conn.busy_timeout(Duration::from_secs(60))?;
        Ok(Ledger::Sqlite(conn))
    }

    /// Creates the ledger table with its one row, unless it exists.
    pub fn create(&mut self, table: &str) -> Result<(), Failure> {
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {table} (ID INTEGER PRIMARY KEY, TOTAL BIGINT NOT NULL)"
        );
        match self {
            Ledger::Sqlite(c) => {
                c.execute_batch(&create)?;
                c.execute(&format!("INSERT OR IGNORE INTO {table} VALUES (1, 0)"), [])?;
            }
            #[cfg(feature = "postgres")]
            Ledger::Postgres(c) => {
                c.batch_execute(&create)?;
                c.execute(
                    &format!("INSERT INTO {table} VALUES (1, 0) ON CONFLICT DO NOTHING"),
                    &[],
                )?;
            }
            #[cfg(feature = "mysql")]
            Ledger::Mysql(c) => {
                use leasehold::mysql::prelude::Queryable;
                c.query_drop(&create)?;
                c.query_drop(format!("INSERT IGNORE INTO {table} VALUES (1, 0)"))?;
            }
        }
        Ok(())
    }

    pub fn total(&mut self, table: &str) -> Result<i64, Failure> {
        let read = format!("SELECT TOTAL FROM {table} WHERE ID = 1");
        Ok(match self {
            Ledger::Sqlite(c) => c.query_row(&read, [], |r| r.get(0))?,
            #[cfg(feature = "postgres")]
            Ledger::Postgres(c) => c.query_one(read.as_str(), &[])?.get(0),
            #[cfg(feature = "mysql")]
            Ledger::Mysql(c) => {
                use leasehold::mysql::prelude::Queryable;
                c.query_first(read)?.ok_or("the ledger row is missing")?
            }
        })
    }

    /// One section's work: read the total, `on_read` (then pause), write the total + 1, in
    /// `mode`. `Err` from the fence (the lease is lost) or the database; nothing of it commits.
    pub fn add_one(
        &mut self,
        table: &str,
        guard: &LockGuard,
        mode: Mode,
        pause: Duration,
        on_read: impl FnOnce(i64),
    ) -> Result<(), Failure> {
        let read = format!("SELECT TOTAL FROM {table} WHERE ID = 1");
        let write = |total: i64| format!("UPDATE {table} SET TOTAL = {} WHERE ID = 1", total + 1);
        let paused = |total: i64| {
            on_read(total);
            std::thread::sleep(pause);
            total
        };
        match self {
            Ledger::Sqlite(c) => {
                if mode == Mode::Autocommit {
                    let total = paused(c.query_row(&read, [], |r| r.get(0))?);
                    c.execute(&write(total), [])?;
                    return Ok(());
                }
                let tx = c.transaction()?;
                if mode == Mode::Plain {
                    let total = paused(tx.query_row(&read, [], |r| r.get(0))?);
                    tx.execute(&write(total), [])?;
                    return Ok(tx.commit()?);
                }
                let tx = guard.fence(tx)?;
                let total = paused(tx.query_row(&read, [], |r| r.get(0))?);
                tx.execute(&write(total), [])?;
                Ok(tx.commit()?)
            }
            #[cfg(feature = "postgres")]
            Ledger::Postgres(c) => {
                if mode == Mode::Autocommit {
                    let total = paused(c.query_one(read.as_str(), &[])?.get(0));
                    c.execute(write(total).as_str(), &[])?;
                    return Ok(());
                }
                let mut tx = c.transaction()?;
                if mode == Mode::Plain {
                    let total = paused(tx.query_one(read.as_str(), &[])?.get(0));
                    tx.execute(write(total).as_str(), &[])?;
                    return Ok(tx.commit()?);
                }
                let mut tx = guard.fence(tx)?;
                let total = paused(tx.query_one(read.as_str(), &[])?.get(0));
                tx.execute(write(total).as_str(), &[])?;
                Ok(tx.commit()?)
            }
            #[cfg(feature = "mysql")]
            Ledger::Mysql(c) => {
                use leasehold::mysql::prelude::Queryable;
                let missing = "the ledger row is missing";
                if mode == Mode::Autocommit {
                    let total = paused(c.query_first(&read)?.ok_or(missing)?);
                    c.query_drop(write(total))?;
                    return Ok(());
                }
                let mut tx = c.start_transaction(Default::default())?;
                if mode == Mode::Plain {
                    let total = paused(tx.query_first(&read)?.ok_or(missing)?);
                    tx.query_drop(write(total))?;
                    return Ok(tx.commit()?);
                }
                let mut tx = guard.fence(tx)?;
                let total = paused(tx.query_first(&read)?.ok_or(missing)?);
                tx.query_drop(write(total))?;
                Ok(tx.commit()?)
            }
        }
    }
}

/// A registry on the lock table of `options.database`.
pub fn registry(options: &Options) -> leasehold::Result<LockRegistry> {
    let database = options.database.as_str();
    let builder = match database {
        #[cfg(feature = "postgres")]
        _ if database.starts_with("postgres://") || database.starts_with("postgresql://") => {
            LockRegistry::postgres(database)
        }
        #[cfg(feature = "mysql")]
        _ if database.starts_with("mysql://") => LockRegistry::mysql(database),
        _ => LockRegistry::sqlite(database),
    };
    builder
        .prefix(options.prefix.clone())
        .time_to_live(options.ttl)
        .idle_between_tries(Duration::from_millis(50))
        .create_table(true)
        .build()
}

fn say(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Runs the sections; returns how many committed.
pub fn run(options: &Options) -> Result<u64, Failure> {
    let registry = registry(options)?;
    let table = options.ledger_table();
    let mut ledger = Ledger::open(&options.database)?;
    ledger.create(&table)?;
    let lock = registry.obtain("ledger")?;
    let mut committed = 0;
    for section in 1.. {
        let done = match &options.until {
            Some(file) => file.exists(),
            None => section > options.sections,
        };
        if done {
            break;
        }
        let guard = match lock.lock() {
            Ok(guard) => guard,
            // SQLite has one writer: while another process's fenced transaction runs, an
            // acquire can find the file busy for longer than the operation timeout.
            Err(e @ leasehold::Error::Timeout { .. }) => {
                say(format_args!("busy {section} {e}"));
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        say(format_args!("granted {section}"));
        let outcome = ledger.add_one(&table, &guard, options.mode, options.pause, |total| {
            say(format_args!("read {section} {total}"))
        });
        match outcome {
            Ok(()) => {
                committed += 1;
                say(format_args!("committed {section}"));
            }
            Err(e) => match e.downcast_ref::<leasehold::Error>() {
                Some(lost) if lost.is_lease_lost() => say(format_args!("refused {section} {e}")),
                _ => say(format_args!("failed {section} {e}")),
            },
        }
        // A holder that was paused past its lease learns it here; its commit above was safe.
        if let Err(e) = guard.unlock() {
            say(format_args!("lost {section} {e}"));
        }
    }
    Ok(committed)
}

fn main() {
    if std::env::args()
        .skip(1)
        .any(|arg| arg == "--help" || arg == "-h")
    {
        println!("{USAGE}");
        return;
    }
    let options = match Options::parse(std::env::args().skip(1)) {
        Ok(options) => options,
        Err(usage) => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    match run(&options) {
        Ok(committed) => {
            let total = Ledger::open(&options.database)
                .and_then(|mut ledger| ledger.total(&options.ledger_table()));
            match total {
                Ok(total) => say(format_args!(
                    "done: {committed} sections committed here, ledger total {total}"
                )),
                Err(e) => say(format_args!(
                    "done: {committed} committed; reading the total failed: {e}"
                )),
            }
        }
        Err(e) => {
            eprintln!("fenced_ledger: {e}");
            std::process::exit(1);
        }
    }
}
