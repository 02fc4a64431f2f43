//! `leasehold list`: the rows of the table and region (or those a holder holds), as a table or
//! as JSON, once or again and again (`--watch`).

use crate::args::ListArgs;
use crate::database::{registry, Tables};
use crate::exit::{self, Failure};
use crate::output::{rows_json, rows_table};
use crate::watch::{watch, Frame};
use leasehold::{LockRow, LockState};

pub fn list(args: ListArgs) -> Result<u8, Failure> {
    if args.holders.iter().any(String::is_empty) {
        return Err(Failure::new(
            exit::USAGE,
            "--holder needs a client id (HOST/PID/RANDOM), or HOST/ or HOST/PID/ for every \
             holder on a host or in a process",
        ));
    }
    let registry = registry(&args.database, None, Tables::Existing)?;
    let listing = registry.listing().resolving(&args.keys)?;
    let refresh = || -> Result<Frame, Failure> {
        let mut rows = Vec::new();
        for row in listing.rows() {
            let row = row?;
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
            format!(
                "no locks{whose} in table {} (region {})\n",
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

/// Whether `row` is held now by the client id `id`, or by any client id under it when `id`
/// ends in `/` (a host, or a host and pid).
fn held_by(row: &LockRow, id: &str) -> bool {
    row.state == LockState::Held
        && row
            .client_id
            .as_deref()
            .is_some_and(|holder| holder == id || (id.ends_with('/') && holder.starts_with(id)))
}
