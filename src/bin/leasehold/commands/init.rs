//! `leasehold init`: create the lock table, its deletion floor and the semaphore table, or print
//! their DDL.

use crate::args::InitArgs;
use crate::database::{builder, builder_for, Tables};
use crate::exit::{self, Failure};

pub fn init(args: InitArgs) -> Result<u8, Failure> {
    if args.print {
        print!("{}", builder(&args.database)?.table_ddl()?);
        return Ok(0);
    }
    if args.database.no_create_table {
        return Err(Failure::new(
            exit::USAGE,
            "init creates the table: drop --no-create-table (or use --print to see the DDL)",
        ));
    }
    let registry = builder_for(&args.database, Tables::Create)?.build()?;
    println!(
        "table {} is ready on {} (with its deletion floor and semaphore table unless a warning \
         said otherwise)",
        registry.table(),
        registry.backend_name()
    );
    Ok(0)
}
