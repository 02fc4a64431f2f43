//! `leasehold status`: who holds a key (exit 0), or that it is free (exit 1), as lines or as
//! JSON, once or again and again (`--watch`, exit 0 when stopped).
//!
//! A name can be a lock, a counting semaphore and a reader/writer lock at once (they are
//! unrelated rows), so each refresh reads all three: the lock's holder, the semaphore's
//! recorded number of permits and its permits' rows, and the reader/writer lock's rows — five
//! read-only statements, none of which creates a table. The lock's line is shown when it is
//! held, or when the name has neither a semaphore nor a reader/writer lock (`KEY: free`, as
//! before either existed); a semaphore's and a reader/writer lock's lines when the table has
//! any row of them. The exit code is 0 when anything of the name is held.

use crate::args::StatusArgs;
use crate::database::{registry, Tables};
use crate::exit::{self, Failure};
use crate::output::{held_line, rounded, status_json};
use crate::watch::{watch, Frame};
use leasehold::{Holder, LockRow, RwLockStatus, SemaphoreStatus};
use std::time::SystemTime;

/// Everything the table says about one name at one refresh.
pub struct Status {
    pub lock: Option<Holder>,
    pub semaphore: SemaphoreStatus,
    pub rw_lock: RwLockStatus,
    /// The database clock at the refresh.
    pub now: SystemTime,
}

impl Status {
    /// Whether anything of the name is held: the lock, a permit, a read or the write row.
    pub fn held(&self) -> bool {
        self.lock.is_some()
            || !self.semaphore.held().is_empty()
            || !self.rw_lock.held_readers().is_empty()
            || self.rw_lock.held_writer().is_some()
    }
}

pub fn status(args: StatusArgs) -> Result<u8, Failure> {
    let key = &args.key.key;
    let registry = registry(&args.key.database, None, Tables::Existing)?;
    let mut held = false;
    let mut refresh = || -> Result<Frame, Failure> {
        let status = Status {
            lock: registry.holder(key)?,
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
        Some(holder) => {
            let left = holder.expires_at.duration_since(now).unwrap_or_default();
            lines.push(format!(
                "{key}: held by {} since {} (database clock, UTC), expires in {} (at {}), \
                 fencing token {}",
                holder.client_id,
                humantime::format_rfc3339_millis(holder.acquired),
                rounded(left),
                humantime::format_rfc3339_millis(holder.expires_at),
                holder.fencing_token
            ));
        }
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
