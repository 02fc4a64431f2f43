//! `leasehold list`: the rows of the table and region, as a table or as JSON.

use crate::args::ListArgs;
use crate::database::{registry, Tables};
use crate::exit::Failure;
use crate::output::{rows_json, rows_table};

pub fn list(args: ListArgs) -> Result<u8, Failure> {
    let registry = registry(&args.database, None, Tables::Existing)?;
    let listing = registry.listing().resolving(&args.keys)?;
    let rows = listing.rows().collect::<leasehold::Result<Vec<_>>>()?;
    let (now, _) = registry.database_time()?;
    if args.json {
        println!("{}", rows_json(&rows, now));
    } else if rows.is_empty() {
        println!(
            "no locks in table {} (region {})",
            registry.table(),
            registry.region()
        );
    } else {
        print!("{}", rows_table(&rows, now));
    }
    Ok(0)
}
