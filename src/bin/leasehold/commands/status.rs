//! `leasehold status`: who holds a key (exit 0), or that it is free (exit 1), as a line or
//! as JSON, once or again and again (`--watch`, exit 0 when stopped).

use crate::args::StatusArgs;
use crate::database::{registry, Tables};
use crate::exit::{self, Failure};
use crate::output::{rounded, status_json};
use crate::watch::{watch, Frame};

pub fn status(args: StatusArgs) -> Result<u8, Failure> {
    let key = &args.key.key;
    let registry = registry(&args.key.database, None, Tables::Existing)?;
    let mut held = false;
    let mut refresh = || -> Result<Frame, Failure> {
        let holder = registry.holder(key)?;
        let (now, _) = registry.database_time()?;
        held = holder.is_some();
        let text = match holder {
            _ if args.json => status_json(key, holder.as_ref(), now),
            None => format!("{key}: free"),
            Some(holder) => {
                let left = holder.expires_at.duration_since(now).unwrap_or_default();
                format!(
                    "{key}: held by {} since {} (database clock, UTC), expires in {} (at {}), \
                     fencing token {}",
                    holder.client_id,
                    humantime::format_rfc3339_millis(holder.acquired),
                    rounded(left),
                    humantime::format_rfc3339_millis(holder.expires_at),
                    holder.fencing_token
                )
            }
        };
        Ok(Frame {
            text: text + "\n",
            at: now,
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
