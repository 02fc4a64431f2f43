//! `leasehold list`: the rows of the table and region (or those of some names, `--key`, or
//! those a holder holds, `--holder`), as a table or as JSON, once or again and again
//! (`--watch`).

use crate::args::ListArgs;
use crate::commands::status::lock_row;
use crate::database::inspect;
use crate::exit::{self, Failure};
use crate::output::{rows_json, rows_table};
use crate::watch::{watch, Frame};
use leasehold::{LockRegistry, LockRow, LockState, MAX_PERMITS, MAX_READERS};

pub fn list(args: ListArgs) -> Result<u8, Failure> {
    if args.holders.iter().any(String::is_empty) {
        return Err(Failure::new(
            exit::USAGE,
            "--holder needs a client id (HOST/PID/RANDOM), or HOST/ or HOST/PID/ for every \
             holder on a host or in a process",
        ));
    }
    let registry = inspect(&args.database, args.watch.watch.is_some())?;
    // A name no lock can have is refused before anything is read.
    registry.listing().resolving(&args.keys)?;
    let refresh = || -> Result<Frame, Failure> {
        let mut rows = Vec::new();
        let every = match args.keys.is_empty() {
            true => registry
                .listing()
                .rows()
                .collect::<leasehold::Result<Vec<_>>>()?,
            false => rows_of(&registry, &args.keys)?,
        };
        for row in every {
            if args.holders.is_empty() || args.holders.iter().any(|id| held_by(&row, id)) {
                rows.push(row);
            }
        }
        let (now, _) = registry.database_time()?;
        let text = if args.json {
            format!("{}\n", rows_json(&rows, now))
        } else if rows.is_empty() {
            let whose = match args.holders.as_slice() {
                [] => String::new(),
                ids => format!(" held by {}", ids.join(" or ")),
            };
            let of = match args.keys.as_slice() {
                [] => String::new(),
                names => format!(" named {}", names.join(" or ")),
            };
            format!(
                "no locks{of}{whose} in table {} (region {})\n",
                registry.table(),
                registry.region()
            )
        } else {
            rows_table(&rows, now)
        };
        Ok(Frame { text, at: now })
    };
    match args.watch.watch {
        None => {
            print!("{}", refresh()?.text);
            Ok(0)
        }
        Some(every) => watch(every, "list", &registry, args.json, refresh),
    }
}

/// The rows of the names `keys`, each with its name, in lock key order: for each, the lock's
/// row, its semaphore's permits and its reader/writer lock's rows (whose lock keys start with
/// the 32 hexadecimal digits of the lock key, then `#` or `@`), a few listing statements per
/// name however large the table.
fn rows_of(registry: &LockRegistry, keys: &[String]) -> leasehold::Result<Vec<LockRow>> {
    let mut rows = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for key in keys {
        if !seen.insert(key.as_str()) {
            continue;
        }
        rows.extend(lock_row(registry, key)?);
        let stem: String = leasehold::lock_key_for(key)
            .chars()
            .filter(|c| *c != '-')
            .collect();
        for (mark, most) in [('#', MAX_PERMITS as usize), ('@', MAX_READERS as usize + 1)] {
            let after = format!("{stem}{mark}");
            for mut row in registry.listing().page(Some(&after), most)? {
                if row.lock_key.starts_with(&after) {
                    row.name = Some(key.clone());
                    rows.push(row);
                }
            }
        }
    }
    rows.sort_by(|a, b| a.lock_key.cmp(&b.lock_key));
    Ok(rows)
}

/// Whether `row` is held now by the client id `id`, or by any client id under it when `id`
/// ends in `/` (a host, or a host and pid).
fn held_by(row: &LockRow, id: &str) -> bool {
    row.state == LockState::Held
        && row
            .client_id
            .as_deref()
            .is_some_and(|holder| holder == id || (id.ends_with('/') && holder.starts_with(id)))
}
