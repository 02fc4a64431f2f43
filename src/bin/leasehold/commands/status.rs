//! `leasehold status`: who holds a key (exit 0), or that it is not held (exit 1), as lines or
//! as JSON, once or again and again (`--watch`, exit 0 when stopped).
//!
//! A name can be a lock, a counting semaphore and a reader/writer lock at once (they are
//! unrelated rows), so each refresh reads all three: the lock's row, the semaphore's recorded
//! number of permits and its permits' rows, and the reader/writer lock's rows — five read-only
//! statements on a registry that may only read (SQLite opens the file read-only, or reads a
//! snapshot of it, see [`crate::database::inspecting`]), none of which creates a table. The
//! lock's line is shown when the table has a row for it — held, expired or released, in the
//! words and with the fencing token `list` shows for that row — or when the name has nothing at
//! all (`KEY: free`); a semaphore's and a reader/writer lock's lines when the table has any row
//! of them. The exit code is 0 when anything of the name is held.

use crate::args::StatusArgs;
use crate::database::inspect;
use crate::exit::{self, Failure};
use crate::output::{held_line, rounded, status_json};
use crate::watch::{watch, Frame};
use leasehold::{LockRegistry, LockRow, LockState, RwLockStatus, SemaphoreStatus};
use std::time::SystemTime;

/// Everything the table says about one name at one refresh.
pub struct Status {
    /// The lock's row, whatever its state; `None` when the table has none.
    pub lock: Option<LockRow>,
    pub semaphore: SemaphoreStatus,
    pub rw_lock: RwLockStatus,
    /// The database clock at the refresh.
    pub now: SystemTime,
}

impl Status {
    /// The lock's row when it is held.
    pub fn holder(&self) -> Option<&LockRow> {
        self.lock
            .as_ref()
            .filter(|row| row.state == LockState::Held)
    }

    /// Whether anything of the name is held: the lock, a permit, a read or the write row.
    pub fn held(&self) -> bool {
        self.holder().is_some()
            || !self.semaphore.held().is_empty()
            || !self.rw_lock.held_readers().is_empty()
            || self.rw_lock.held_writer().is_some()
    }
}

/// The row of the lock `key` (not of its semaphore or reader/writer lock), whatever its state,
/// with its name: one listing statement over the few lock keys that sort just before it.
pub fn lock_row(registry: &LockRegistry, key: &str) -> leasehold::Result<Option<LockRow>> {
    let lock_key = leasehold::lock_key_for(key);
    // Every lock key is 36 characters; those that share its first 35 sort just before it.
    let before = &lock_key[..lock_key.len() - 1];
    let rows = registry
        .listing()
        .resolving([key])?
        .page(Some(before), 64)?;
    Ok(rows.into_iter().find(|row| row.lock_key == lock_key))
}

pub fn status(args: StatusArgs) -> Result<u8, Failure> {
    let key = &args.key.key;
    let registry = inspect(&args.key.database, args.watch.watch.is_some())?;
    let mut held = false;
    let mut refresh = || -> Result<Frame, Failure> {
        let status = Status {
            lock: lock_row(&registry, key)?,
            semaphore: registry.semaphore_status(key)?,
            rw_lock: registry.rw_lock_status(key)?,
            now: registry.database_time()?.0,
        };
        held = status.held();
        let text = match args.json {
            true => status_json(key, &status),
            false => lines(key, &status),
        };
        Ok(Frame {
            text: text + "\n",
            at: status.now,
        })
    };
    match args.watch.watch {
        None => {
            print!("{}", refresh()?.text);
            Ok(if held { 0 } else { exit::FREE })
        }
        Some(every) => watch(
            every,
            &format!("status {key}"),
            &registry,
            args.json,
            refresh,
        ),
    }
}

/// The status for people: the lock's line, then a line for the semaphore and one for the
/// reader/writer lock where the name has them, each followed by a line per holder.
fn lines(key: &str, status: &Status) -> String {
    let now = status.now;
    let mut lines = Vec::new();
    let (semaphore, rw_lock) = (&status.semaphore, &status.rw_lock);
    match &status.lock {
        Some(row) => lines.push(format!("{key}: {}", lock_line(row, now))),
        None if !semaphore.exists() && !rw_lock.exists() => lines.push(format!("{key}: free")),
        None => {}
    }
    if semaphore.exists() {
        let held = semaphore.held();
        let of = match semaphore.permits {
            Some(1) => "semaphore of 1 permit".to_string(),
            Some(permits) => format!("semaphore of {permits} permits"),
            None => "semaphore (its number of permits is not recorded)".to_string(),
        };
        lines.push(match held.len() {
            0 => format!("{key}: {of}, all free"),
            n => format!("{key}: {of}, {n} held"),
        });
        lines.extend(held.into_iter().map(|row| indented(row, now)));
    }
    if rw_lock.exists() {
        let (readers, writer) = (rw_lock.held_readers(), rw_lock.held_writer());
        let count = match readers.len() {
            1 => "1 reader".to_string(),
            n => format!("{n} readers"),
        };
        lines.push(match (writer.is_some(), readers.is_empty()) {
            (false, true) => format!("{key}: reader/writer lock, free"),
            (false, false) => format!("{key}: reader/writer lock, read by {count}"),
            (true, true) => format!("{key}: reader/writer lock, written"),
            (true, false) => {
                format!("{key}: reader/writer lock, a writer waits for {count} to leave")
            }
        });
        lines.extend(writer.into_iter().map(|row| indented(row, now)));
        lines.extend(readers.into_iter().map(|row| indented(row, now)));
    }
    lines.join("\n")
}

/// `  permit 2: held by …`: one holder of a semaphore or reader/writer lock.
fn indented(row: &LockRow, now: SystemTime) -> String {
    format!(
        "  {}: {}",
        row.part().unwrap_or_default(),
        held_line(row, now)
    )
}

/// The lock's row for people: `held by …`, `expired …` or `released, …`, with its token.
fn lock_line(row: &LockRow, now: SystemTime) -> String {
    let holder = row.client_id.as_deref().unwrap_or("-");
    match row.state {
        LockState::Held => held_line(row, now),
        LockState::Expired => format!(
            "expired {} ago (at {}, database clock, UTC), last held by {holder} since {}, \
             fencing token {}",
            rounded(now.duration_since(row.expires_at).unwrap_or_default()),
            humantime::format_rfc3339_millis(row.expires_at),
            humantime::format_rfc3339_millis(row.acquired),
            row.fencing_token
        ),
        _ => format!("{}, fencing token {}", row.state, row.fencing_token),
    }
}
