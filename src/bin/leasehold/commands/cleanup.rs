//! `leasehold cleanup`: delete rows released or expired long ago.

use crate::args::CleanupArgs;
use crate::database::{registry, Tables};
use crate::exit::Failure;

pub fn cleanup(args: CleanupArgs) -> Result<u8, Failure> {
    let registry = registry(&args.database, None, Tables::Existing)?;
    let deleted = registry.delete_released_and_expired(args.older_than)?;
    println!("deleted {deleted} rows");
    Ok(0)
}
