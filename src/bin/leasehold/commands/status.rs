//! `leasehold status`: who holds a key (exit 0), or that it is free (exit 1).

use crate::args::KeyArgs;
use crate::database::registry;
use crate::exit::{self, Failure};
use crate::output::rounded;

pub fn status(args: KeyArgs) -> Result<u8, Failure> {
    let registry = registry(&args.database, None)?;
    let Some(holder) = registry.holder(&args.key)? else {
        println!("{}: free", args.key);
        return Ok(exit::FREE);
    };
    let (now, _) = registry.database_time()?;
    let left = holder.expires_at.duration_since(now).unwrap_or_default();
    println!(
        "{}: held by {} since {} (database clock, UTC), expires in {}, fencing token {}",
        args.key,
        holder.client_id,
        humantime::format_rfc3339_millis(holder.acquired),
        rounded(left),
        holder.fencing_token
    );
    Ok(0)
}
