//! Output for people and programs: the table and JSON of `list`, durations rounded for
//! reading.

use crate::commands::status::Status;
use leasehold::{LockRow, LockState};
use std::time::{Duration, SystemTime};

/// A duration for people: tenths of a second under 10 s, whole seconds above (`1h 5m 3s`).
pub fn rounded(duration: Duration) -> String {
    if duration < Duration::from_secs(10) {
        format!("{:.1}s", duration.as_secs_f64())
    } else {
        humantime::format_duration(Duration::from_secs(duration.as_secs())).to_string()
    }
}

/// How long until `row` expires (or how long ago it did), seen at `now` on the database clock.
fn expires_in(row: &LockRow, now: SystemTime) -> String {
    match row.state {
        LockState::Released => "-".into(),
        _ => match row.expires_at.duration_since(now) {
            Ok(left) => rounded(left),
            Err(past) => format!("{} ago", rounded(past.duration())),
        },
    }
}

/// The rows as a table for people: one line each, columns padded to their widest cell.
pub fn rows_table(rows: &[LockRow], now: SystemTime) -> String {
    let header = [
        "KEY",
        "STATE",
        "HOLDER",
        "ACQUIRED (UTC)",
        "EXPIRES IN",
        "TOKEN",
    ];
    let mut lines: Vec<[String; 6]> = vec![header.map(String::from)];
    for row in rows {
        lines.push([
            match row.part() {
                Some(part) => format!("{} ({part})", row.label()),
                None => row.label().to_string(),
            },
            row.state.to_string(),
            row.client_id.clone().unwrap_or_else(|| "-".into()),
            humantime::format_rfc3339_millis(row.acquired).to_string(),
            expires_in(row, now),
            row.fencing_token.to_string(),
        ]);
    }
    let mut widths = [0; 6];
    for line in &lines {
        for (width, cell) in widths.iter_mut().zip(line) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for line in &lines {
        let cells: Vec<String> = line
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// One row of `list --json`.
#[derive(serde::Serialize)]
struct RowJson<'a> {
    key: Option<&'a str>,
    lock_key: &'a str,
    state: &'a str,
    client_id: Option<&'a str>,
    acquired: String,
    expires_at: Option<String>,
    expires_in_ms: Option<i64>,
    fencing_token: u64,
}

/// Milliseconds from `now` until `at`, negative once `at` has passed.
fn millis_until(at: SystemTime, now: SystemTime) -> i64 {
    match at.duration_since(now) {
        Ok(left) => i64::try_from(left.as_millis()).unwrap_or(i64::MAX),
        Err(past) => i64::try_from(past.duration().as_millis()).map_or(i64::MIN, |ms| -ms),
    }
}

/// The rows as one JSON array: `key` (the name, or null when not resolved), `lock_key`,
/// `state`, `client_id` (null once released), `acquired` and `expires_at` (RFC 3339, UTC, on
/// the database clock; `expires_at` null once released), `expires_in_ms` (negative once
/// expired, null once released) and `fencing_token`.
pub fn rows_json(rows: &[LockRow], now: SystemTime) -> String {
    let objects: Vec<RowJson<'_>> = rows
        .iter()
        .map(|row| {
            let released = row.state == LockState::Released;
            RowJson {
                key: row.name.as_deref(),
                lock_key: &row.lock_key,
                state: row.state.as_str(),
                client_id: row.client_id.as_deref(),
                acquired: humantime::format_rfc3339_millis(row.acquired).to_string(),
                expires_at: (!released)
                    .then(|| humantime::format_rfc3339_millis(row.expires_at).to_string()),
                expires_in_ms: (!released).then(|| millis_until(row.expires_at, now)),
                fencing_token: row.fencing_token,
            }
        })
        .collect();
    serde_json::to_string(&objects).expect("rows serialize to JSON")
}

/// `held by ID since …, expires in … (at …), fencing token N`: a held row for people.
pub fn held_line(row: &LockRow, now: SystemTime) -> String {
    let left = row.expires_at.duration_since(now).unwrap_or_default();
    format!(
        "held by {} since {} (database clock, UTC), expires in {} (at {}), fencing token {}",
        row.client_id.as_deref().unwrap_or("-"),
        humantime::format_rfc3339_millis(row.acquired),
        rounded(left),
        humantime::format_rfc3339_millis(row.expires_at),
        row.fencing_token
    )
}

/// `status --json`.
#[derive(serde::Serialize)]
struct StatusJson<'a> {
    key: &'a str,
    lock_key: String,
    state: &'static str,
    client_id: Option<&'a str>,
    acquired: Option<String>,
    expires_at: Option<String>,
    expires_in_ms: Option<i64>,
    fencing_token: Option<u64>,
    held: bool,
    semaphore: Option<SemaphoreJson<'a>>,
    rw_lock: Option<RwLockJson<'a>>,
}

/// The `semaphore` object of `status --json`.
#[derive(serde::Serialize)]
struct SemaphoreJson<'a> {
    permits: Option<u32>,
    held: usize,
    holders: Vec<HolderJson<'a>>,
}

/// The `rw_lock` object of `status --json`.
#[derive(serde::Serialize)]
struct RwLockJson<'a> {
    state: &'static str,
    readers: usize,
    holders: Vec<HolderJson<'a>>,
}

/// One held permit, read hold or write row in `status --json`.
#[derive(serde::Serialize)]
struct HolderJson<'a> {
    part: String,
    lock_key: &'a str,
    client_id: Option<&'a str>,
    acquired: String,
    expires_at: String,
    expires_in_ms: i64,
    fencing_token: u64,
}

fn holder_json(row: &LockRow, now: SystemTime) -> HolderJson<'_> {
    HolderJson {
        part: row.part().unwrap_or_default(),
        lock_key: &row.lock_key,
        client_id: row.client_id.as_deref(),
        acquired: humantime::format_rfc3339_millis(row.acquired).to_string(),
        expires_at: humantime::format_rfc3339_millis(row.expires_at).to_string(),
        expires_in_ms: millis_until(row.expires_at, now),
        fencing_token: row.fencing_token,
    }
}

/// `key`'s status as one JSON object. The lock: `key`, `lock_key`, `state` ("held",
/// "expired" or "released", as `list` says of its row, or "free" when the table has no row
/// for it), and the row's `client_id` (null once released), `acquired` and `expires_at` (RFC
/// 3339, UTC, on the database clock; `expires_at` null once released), `expires_in_ms`
/// (negative once expired, null once released) and `fencing_token`, as `list --json` shows
/// them; all null when free. `held`: whether anything of the name is held (the exit code).
/// `semaphore` (null when the name has none): `permits` (null when not recorded), `held` and
/// `holders`. `rw_lock` (null when the name has none): `state` ("free", "read", "write", or
/// "writer_waiting" while a writer holds the write row and waits for readers), `readers` and
/// `holders`. A holder: `part` ("permit 2", "read 17", "write"), `lock_key`, `client_id`,
/// `acquired`, `expires_at`, `expires_in_ms`, `fencing_token`.
pub fn status_json(key: &str, status: &Status) -> String {
    let (row, now) = (status.lock.as_ref(), status.now);
    let time = |at: SystemTime| humantime::format_rfc3339_millis(at).to_string();
    let semaphore = status.semaphore.exists().then(|| {
        let held = status.semaphore.held();
        SemaphoreJson {
            permits: status.semaphore.permits,
            held: held.len(),
            holders: held.into_iter().map(|row| holder_json(row, now)).collect(),
        }
    });
    let rw_lock = status.rw_lock.exists().then(|| {
        let (readers, writer) = (status.rw_lock.held_readers(), status.rw_lock.held_writer());
        RwLockJson {
            state: match (writer.is_some(), readers.is_empty()) {
                (false, true) => "free",
                (false, false) => "read",
                (true, true) => "write",
                (true, false) => "writer_waiting",
            },
            readers: readers.len(),
            holders: writer
                .into_iter()
                .chain(readers)
                .map(|row| holder_json(row, now))
                .collect(),
        }
    });
    // A released row's expiry is a marker, not a time.
    let running = row.filter(|row| row.state != LockState::Released);
    let json = StatusJson {
        key,
        lock_key: leasehold::lock_key_for(key),
        state: row.map_or("free", |row| row.state.as_str()),
        client_id: row.and_then(|row| row.client_id.as_deref()),
        acquired: row.map(|row| time(row.acquired)),
        expires_at: running.map(|row| time(row.expires_at)),
        expires_in_ms: running.map(|row| millis_until(row.expires_at, now)),
        fencing_token: row.map(|row| row.fencing_token),
        held: status.held(),
        semaphore,
        rw_lock,
    };
    serde_json::to_string(&json).expect("a status serializes to JSON")
}
