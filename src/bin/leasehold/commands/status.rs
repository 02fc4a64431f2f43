//! `leasehold status`: who holds a key (exit 0), or that it is free (exit 1), as a line or
//! as JSON.

use crate::args::StatusArgs;
use crate::database::{registry, Tables};
use crate::exit::{self, Failure};
use crate::output::{rounded, status_json};

pub fn status(args: StatusArgs) -> Result<u8, Failure> {
    let key = &args.key.key;
    let registry = registry(&args.key.database, None, Tables::Existing)?;
    let holder = registry.holder(key)?;
    let (now, _) = registry.database_time()?;
    if args.json {
        println!("{}", status_json(key, holder.as_ref(), now));
    }
    let Some(holder) = holder else {
        if !args.json {
            println!("{key}: free");
        }
        return Ok(exit::FREE);
    };
    if !args.json {
        let left = holder.expires_at.duration_since(now).unwrap_or_default();
        println!(
            "{key}: held by {} since {} (database clock, UTC), expires in {} (at {}), fencing \
             token {}",
            holder.client_id,
            humantime::format_rfc3339_millis(holder.acquired),
            rounded(left),
            humantime::format_rfc3339_millis(holder.expires_at),
            holder.fencing_token
        );
    }
    Ok(0)
}
