//! The lock table and its deletion floor: the shipped DDL renamed for the registry's table,
//! and the checks `build()` runs (columns, key, floor), creating what is missing when the
//! registry may.

use super::{Backend, CustomQueries, Path, SqlStore};
use crate::error::{Error, Result};
use std::time::Instant;

/// The columns the lock table must have, in DDL order.
pub(crate) const COLUMNS: [&str; 6] = [
    "LOCK_KEY",
    "REGION",
    "CLIENT_ID",
    "CREATED_DATE",
    "EXPIRED_AFTER",
    "FENCING_TOKEN",
];

/// Where a registry's table lives and who it is.
#[derive(Debug, Clone)]
pub(crate) struct TableSettings {
    pub table: String,
    pub region: String,
    pub client_id: String,
    pub create_table: bool,
    /// `RegistryBuilder::read_only`: SQLite opens the file read-only.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub read_only: bool,
    pub custom: CustomQueries,
    /// `RegistryBuilder::notifications`: whether this registry's releases wake other
    /// instances where that costs a connection of its own (MySQL's named locks).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub notifications: bool,
}

/// What [`Backend::floor`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FloorFound {
    /// The floor table exists and this user may read it: acquire can take it into account.
    pub readable: bool,
    /// The trigger that fills it is on the lock table (as far as this user can see).
    pub trigger: bool,
}

/// The deletion floor's table for lock table `table` (schema-qualified like it).
pub(crate) fn floor_table(table: &str) -> String {
    format!("{table}_FLOOR")
}

/// The name of the trigger that fills the deletion floor of `table`, without any schema.
pub(crate) fn floor_trigger(table: &str) -> String {
    let bare = table.rsplit('.').next().unwrap_or(table);
    format!("{bare}_FLOOR")
}

/// The shipped DDL with `INT_LOCK` renamed to `table`.
pub(crate) fn ddl_for<B: Backend>(table: &str) -> String {
    rename::<B>(B::DDL, table)
}

/// The shipped DDL of the deletion floor with `INT_LOCK` renamed to `table`.
pub(crate) fn floor_ddl_for<B: Backend>(table: &str) -> String {
    rename::<B>(B::FLOOR_DDL, table)
}

/// `ddl` (written for `INT_LOCK`) with `INT_LOCK` renamed to `table`.
pub(super) fn rename<B: Backend>(ddl: &str, table: &str) -> String {
    // A constraint name cannot carry the table's schema: `schema.X_LOCK` names its key X_LOCK_PK.
    let bare = table.rsplit('.').next().unwrap_or(table);
    let mut ddl = ddl.replace("INT_LOCK_PK", &format!("{bare}_PK"));
    if B::TRIGGER_NAMES_PER_TABLE {
        for lead in ["TRIGGER ", "TRIGGER IF EXISTS "] {
            ddl = ddl.replace(
                &format!("{lead}INT_LOCK_FLOOR"),
                &format!("{lead}{}", floor_trigger(table)),
            );
        }
    }
    ddl.replace("INT_LOCK", table)
}

/// The table must have a unique index on exactly (LOCK_KEY, REGION): the acquire statements
/// rely on it to refuse a second row for one lock.
fn check_primary_key(table: &str, unique_columns: &[(String, String)]) -> Result<()> {
    let mut indexes: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for (index, column) in unique_columns {
        indexes.entry(index).or_default().push(column);
    }
    let keyed = indexes.values_mut().any(|columns| {
        columns.sort_unstable();
        columns.as_slice() == ["LOCK_KEY", "REGION"]
    });
    if keyed {
        return Ok(());
    }
    let bare = table.rsplit('.').next().unwrap_or(table);
    Err(Error::KeyMissing {
        table: table.to_string(),
        fix: format!("CREATE UNIQUE INDEX {bare}_PK ON {table} (LOCK_KEY, REGION)"),
    })
}

/// The statement that adds `column` to an existing lock `table` (the Spring 7.0 upgrade adds
/// `EXPIRED_AFTER`; leasehold adds `FENCING_TOKEN`). Key columns cannot be added in place.
fn add_column_sql<B: Backend>(table: &str, column: &str) -> String {
    let definition = match column {
        "EXPIRED_AFTER" | "CREATED_DATE" => format!(
            "{} NOT NULL DEFAULT {}",
            B::TIMESTAMP_TYPE,
            B::RELEASED_TIMESTAMP
        ),
        "FENCING_TOKEN" => "BIGINT NOT NULL DEFAULT 0".to_string(),
        "CLIENT_ID" => "CHAR(36)".to_string(),
        key => {
            return format!(
                "DROP TABLE {table}, then run {}: column {key} is part of the key",
                B::DDL_FILE
            )
        }
    };
    format!("ALTER TABLE {table} ADD COLUMN {column} {definition}")
}

/// The columns every lock table has had, Spring Integration's first ones included: a table
/// without them is not a lock table of any version, whatever its name.
const LOCK_TABLE_MARKS: [&str; 2] = ["LOCK_KEY", "CLIENT_ID"];

fn check_columns<B: Backend>(table: &str, columns: &[String]) -> Result<()> {
    if columns.is_empty() {
        return Err(Error::TableMissing {
            table: table.to_string(),
            ddl_file: B::DDL_FILE,
        });
    }
    let has = |name: &str| columns.iter().any(|c| c.eq_ignore_ascii_case(name));
    if !LOCK_TABLE_MARKS.iter().all(|mark| has(mark)) {
        // Most likely a table of the application's own, named by a mistaken prefix: nothing is
        // offered that would change it.
        let mut shown: Vec<&str> = columns.iter().take(6).map(String::as_str).collect();
        if columns.len() > shown.len() {
            shown.push("…");
        }
        return Err(Error::NotALockTable {
            table: table.to_string(),
            columns: shown.join(", "),
        });
    }
    for column in COLUMNS {
        if !columns.iter().any(|c| c.eq_ignore_ascii_case(column)) {
            return Err(Error::ColumnMissing {
                table: table.to_string(),
                column,
                fix: add_column_sql::<B>(table, column),
            });
        }
    }
    Ok(())
}

/// The optional column that names a row's lock: leasehold's grant fills it,
/// Spring's rows leave it NULL.
pub(crate) const NAME_COLUMN: &str = "LOCK_NAME";

/// The statement that adds [`NAME_COLUMN`] to `table`.
pub(crate) fn add_name_column_sql<B: Backend>(table: &str) -> String {
    format!(
        "ALTER TABLE {table} ADD COLUMN {NAME_COLUMN} {}",
        B::NAME_TYPE
    )
}

impl<B: Backend> SqlStore<B> {
    /// Whether the table has the name column; adds it when missing and the registry may
    /// create tables. A table without it works as before (rows carry no names), and `build()`
    /// says how to add it.
    pub(super) fn check_name_column(
        &self,
        table: &TableSettings,
        deadline: Instant,
    ) -> Result<bool> {
        let has_it = |store: &Self| -> Result<bool> {
            let name = table.table.clone();
            let columns = store.run(Path::Main, "check table", deadline, move |conn| {
                B::columns(conn, &name)
            })?;
            Ok(columns.iter().any(|c| c.eq_ignore_ascii_case(NAME_COLUMN)))
        };
        if has_it(self)? {
            return Ok(true);
        }
        let add = add_name_column_sql::<B>(&table.table);
        if table.create_table {
            let sql = add.clone();
            let added = self.run(Path::Main, "add the name column", deadline, move |conn| {
                B::execute_batch(conn, &sql)
            });
            // Another registry may have added it meanwhile: look again either way.
            if has_it(self)? {
                return Ok(true);
            }
            if let Err(e) = added {
                log::warn!(
                    "could not add the {NAME_COLUMN} column to {}: {e}",
                    table.table
                );
            }
        }
        log::info!(
            "table {} has no {NAME_COLUMN} column, so its rows carry no lock names (listings and \
             `leasehold list` show lock keys); to add it: {add}",
            table.table
        );
        Ok(false)
    }

    /// Creates the table when the registry may (`create_table`), checks its columns and key,
    /// and looks for the deletion floor ([`Self::check_floor`]); returns whether acquire can
    /// read the floor.
    pub(super) fn check_table(&self, table: &TableSettings, deadline: Instant) -> Result<bool> {
        let ddl = table.create_table.then(|| ddl_for::<B>(&table.table));
        self.run(Path::Main, "check table", deadline, move |conn| {
            if let Some(ddl) = &ddl {
                B::execute_batch(conn, ddl)?;
            }
            Ok(())
        })?;
        let name = table.table.clone();
        let columns = self.run(Path::Main, "check table", deadline, move |conn| {
            B::columns(conn, &name)
        })?;
        check_columns::<B>(&table.table, &columns)?;
        let name = table.table.clone();
        let unique = self.run(Path::Main, "check table", deadline, move |conn| {
            B::unique_key_columns(conn, &name)
        })?;
        check_primary_key(&table.table, &unique)?;
        self.check_floor(table, deadline)
    }

    /// Looks for the deletion floor (module docs), runs its DDL when it is missing and the
    /// registry may create tables, and returns whether acquire can read it. A floor that is
    /// missing, or that the DDL could not complete, is logged as a warning: the locks work
    /// without it.
    fn check_floor(&self, table: &TableSettings, deadline: Instant) -> Result<bool> {
        let look = |store: &Self| {
            let name = table.table.clone();
            store.run(Path::Main, "check table", deadline, move |conn| {
                B::floor(conn, &name)
            })
        };
        let mut found = look(self)?;
        let complete = FloorFound {
            readable: true,
            trigger: true,
        };
        if found != complete && table.create_table {
            let ddl = floor_ddl_for::<B>(&table.table);
            let created = self.run(
                Path::Main,
                "create the deletion floor",
                deadline,
                move |conn| B::execute_batch(conn, &ddl),
            );
            if let Err(e) = created {
                log::warn!(
                    "could not create the deletion floor of {} from {}: {e}",
                    table.table,
                    B::FLOOR_DDL_FILE
                );
            }
            found = look(self)?;
        }
        if found != complete {
            let missing = if found.readable {
                format!(
                    "trigger {} was not found on it, or this user cannot see it",
                    floor_trigger(&table.table)
                )
            } else {
                format!(
                    "table {} is missing or this user may not read it",
                    floor_table(&table.table)
                )
            };
            log::warn!(
                "lock table {table}: the deletion floor is incomplete ({missing}). Until {file} \
                 (with INT_ replaced by the prefix) has been run, or a registry has been built \
                 with create_table(true) by a user allowed to create triggers, a key whose row \
                 is deleted (Spring Integration's unlock, manual cleanup) may be granted a \
                 fencing token no greater than before the deletion.",
                table = table.table,
                file = B::FLOOR_DDL_FILE,
            );
        }
        Ok(found.readable)
    }
}

#[cfg(all(test, any(feature = "postgres", feature = "mysql")))]
mod tests {
    /// `ddl` without its comment lines.
    fn statements(ddl: &str) -> String {
        ddl.lines().filter(|line| !line.starts_with("--")).collect()
    }

    /// A PostgreSQL trigger's name cannot carry a schema; a MySQL trigger must be named in its
    /// table's schema; everything else follows the table.
    #[test]
    fn the_floor_ddl_names_its_objects_after_the_table() {
        #[cfg(feature = "postgres")]
        {
            let ddl = super::floor_ddl_for::<crate::backend::postgres::Postgres>("s.APP_LOCK");
            for expected in [
                "CREATE TABLE IF NOT EXISTS s.APP_LOCK_FLOOR (",
                "DROP TRIGGER IF EXISTS APP_LOCK_FLOOR ON s.APP_LOCK;",
                "CREATE OR REPLACE FUNCTION s.APP_LOCK_FLOOR()",
                "INSERT INTO s.APP_LOCK_FLOOR AS kept",
                "CREATE TRIGGER APP_LOCK_FLOOR AFTER DELETE ON s.APP_LOCK",
                "EXECUTE FUNCTION s.APP_LOCK_FLOOR();",
            ] {
                assert!(ddl.contains(expected), "{expected} not in {ddl}");
            }
            assert!(!statements(&ddl).contains("INT_"), "{ddl}");
        }
        #[cfg(feature = "mysql")]
        {
            let ddl = super::floor_ddl_for::<crate::backend::mysql::Mysql>("s.APP_LOCK");
            for expected in [
                "CREATE TABLE IF NOT EXISTS s.APP_LOCK_FLOOR (",
                "DROP TRIGGER IF EXISTS s.APP_LOCK_FLOOR;",
                "CREATE TRIGGER s.APP_LOCK_FLOOR AFTER DELETE ON s.APP_LOCK",
            ] {
                assert!(ddl.contains(expected), "{expected} not in {ddl}");
            }
            assert!(!statements(&ddl).contains("INT_"), "{ddl}");
        }
    }
}
