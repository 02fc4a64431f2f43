//! The semaphore table `{table}_SEM`: one row per counting semaphore and region, recording its
//! number of permits (`sql/<database>_semaphore.sql`).
//!
//! The permits themselves are ordinary lease rows of the lock table (see `crate::semaphore`);
//! this table only makes the number of permits part of a semaphore's identity, so that two
//! instances that disagree about it get [`Error::PermitsMismatch`] instead of holding N + M
//! permits between them. Plain locks and Spring Integration never read it.
//!
//! - `build()` with `create_table(true)` runs the DDL; if that fails it logs a warning and the
//!   locks work as before (a semaphore then reports the missing table).
//! - The first `LockRegistry::semaphore` of a name in a registry reads the row
//!   ([`SemaphoreStatements::permits`]) and, when there is none, records its own number
//!   ([`SemaphoreStatements::record`], which never overwrites a row another instance recorded
//!   meanwhile) and reads again. The first time in a registry it also checks that the table
//!   exists, to name the file to run when it does not.
//!
//! - `LockRegistry::semaphore_status` (and so `leasehold status`) reads the row without ever
//!   recording one ([`SqlStore::recorded_permits_of`]): first whether the table exists, since
//!   operators' commands must work on a table made before semaphores existed, and create
//!   nothing.
//!
//! Both statements bind the lease statements' parameters: 1 the semaphore's key (its name
//! mapped as a lock name is), 2 the region, 5 the number of permits.

use super::schema::rename;
use super::{Backend, Path, SqlStore};
use crate::error::{Error, Result};
use std::time::{Duration, Instant};

/// The two statements of the semaphore table.
#[derive(Debug, Clone)]
pub(crate) struct SemaphoreStatements {
    /// Parameters 1, 2, 5. Inserts the row unless one exists for the key and region (then it
    /// does nothing, and never fails for that reason).
    pub record: String,
    /// Parameters 1–2. One row with the recorded permits as an integer, or none.
    pub permits: String,
}

/// The semaphore table of lock table `table` (schema-qualified like it).
pub(crate) fn semaphore_table(table: &str) -> String {
    format!("{table}_SEM")
}

/// The shipped DDL of the semaphore table with `INT_LOCK` renamed to `table`.
pub(crate) fn semaphore_ddl_for<B: Backend>(table: &str) -> String {
    rename::<B>(B::SEMAPHORE_DDL, table)
}

impl<B: Backend> SqlStore<B> {
    /// Runs the semaphore table's DDL at `build()` (with `create_table(true)`); a failure is
    /// logged, not returned: the locks do not need the table.
    pub(super) fn create_semaphore_table(&self, deadline: Instant) {
        let ddl = semaphore_ddl_for::<B>(&self.table.table);
        let created = self.run(
            Path::Main,
            "create the semaphore table",
            deadline,
            move |conn| B::execute_batch(conn, &ddl),
        );
        if let Err(e) = created {
            log::warn!(
                "could not create the semaphore table {} from {}: {e}; semaphores of this \
                 registry will fail until it exists",
                semaphore_table(&self.table.table),
                B::SEMAPHORE_DDL_FILE
            );
        }
    }

    /// The permits recorded for semaphore `sem_key`, recording `permits` when it has none.
    /// With `check_table`, first makes sure the table exists (else [`Error::TableMissing`]).
    pub(super) fn semaphore_permits_of(
        &self,
        sem_key: &str,
        permits: u32,
        check_table: bool,
        deadline: Instant,
    ) -> Result<i64> {
        let table = semaphore_table(&self.table.table);
        let missing = || Error::TableMissing {
            table: table.clone(),
            ddl_file: B::SEMAPHORE_DDL_FILE,
        };
        if check_table {
            let name = table.clone();
            let columns = self.run(Path::Main, "check semaphore table", deadline, move |conn| {
                B::columns(conn, &name)
            })?;
            if columns.is_empty() {
                return Err(missing());
            }
        }
        let statements = B::semaphore_statements(&self.table.table);
        let params = self.params(sem_key, Duration::ZERO, i64::from(permits));
        // Read, record if absent, read again. A row deleted between the recording and the
        // reading (an operator changing the number) makes this record once more.
        for _ in 0..3 {
            let (sql, read) = (statements.permits.clone(), params.clone());
            let recorded = self.run(Path::Main, "read a semaphore", deadline, move |conn| {
                B::read_number(conn, &sql, &read.borrowed())
            })?;
            if let Some(recorded) = recorded {
                return Ok(recorded);
            }
            let (sql, record) = (statements.record.clone(), params.clone());
            self.run(Path::Main, "record a semaphore", deadline, move |conn| {
                B::update(conn, &sql, &record.borrowed())
            })?;
        }
        Err(missing())
    }
}

impl<B: Backend> SqlStore<B> {
    /// The permits recorded for semaphore `sem_key`, recording nothing: `None` when the table
    /// has no row for it, or when there is no semaphore table (checked first, with one
    /// statement, so that a table made before semaphores existed reads as "none recorded").
    pub(super) fn recorded_permits_of(
        &self,
        sem_key: &str,
        deadline: Instant,
    ) -> Result<Option<i64>> {
        let table = semaphore_table(&self.table.table);
        let columns = self.run(Path::Main, "check semaphore table", deadline, move |conn| {
            B::columns(conn, &table)
        })?;
        if columns.is_empty() {
            return Ok(None);
        }
        let sql = B::semaphore_statements(&self.table.table).permits;
        let params = self.params(sem_key, Duration::ZERO, 0);
        self.run(Path::Main, "read a semaphore", deadline, move |conn| {
            B::read_number(conn, &sql, &params.borrowed())
        })
    }
}
