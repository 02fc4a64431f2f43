//! `leasehold release --force`: free a key whoever holds it.

use crate::args::ReleaseArgs;
use crate::database::{registry, Tables};
use crate::exit::{self, Failure};

pub fn release(args: ReleaseArgs) -> Result<u8, Failure> {
    if !args.force {
        return Err(Failure::new(
            exit::USAGE,
            "release frees the lock whoever holds it: add --force to do that (the holder \
             learns at its next renewal, and may act until then)",
        ));
    }
    let registry = registry(&args.key.database, None, Tables::Existing)?;
    let holder = registry.holder(&args.key.key)?;
    if registry.force_release(&args.key.key)? {
        let by = holder.map_or_else(String::new, |h| format!(" from {}", h.client_id));
        println!("{}: released{by}", args.key.key);
    } else {
        println!("{}: was free", args.key.key);
    }
    Ok(0)
}
