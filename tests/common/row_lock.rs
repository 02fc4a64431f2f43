//! Row locks held by a session of the test's own, as a migration or an operator's
//! `SELECT … FOR UPDATE` holds them: the registries' statements meet rows they cannot lock.

// With SQLite alone there are no row locks to hold: `hold` only answers `None`.
#![cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(unused))]

use super::{Db, Fixture};

/// An open transaction holding `FOR UPDATE` locks on some rows of a fixture's table; rolled
/// back when dropped.
pub enum RowLock {
    #[cfg(feature = "postgres")]
    Postgres(Box<postgres::Client>),
    #[cfg(feature = "mysql")]
    Mysql(mysql::Conn),
}

impl RowLock {
    /// Locks the rows of `lock_keys` (which must exist) in `f`'s table; `None` on SQLite, which
    /// has no row locks.
    pub fn hold(f: &Fixture, lock_keys: &[String]) -> Option<RowLock> {
        let list = lock_keys
            .iter()
            .map(|key| format!("'{key}'"))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "SELECT LOCK_KEY FROM {} WHERE LOCK_KEY IN ({list}) FOR UPDATE",
            f.table()
        );
        match f.db {
            #[cfg(feature = "postgres")]
            Db::Postgres => {
                let mut client = postgres::Client::connect(&super::postgres_url(), postgres::NoTls)
                    .expect("connect to PostgreSQL");
                client.batch_execute("BEGIN").expect("BEGIN");
                let rows = client.query(&sql, &[]).expect("SELECT … FOR UPDATE");
                assert_eq!(rows.len(), lock_keys.len(), "every row to lock exists");
                Some(RowLock::Postgres(Box::new(client)))
            }
            #[cfg(feature = "mysql")]
            Db::Mysql => {
                use mysql::prelude::Queryable;
                let opts = mysql::Opts::from_url(&super::mysql_url()).expect("url");
                let mut conn = mysql::Conn::new(opts).expect("connect to MySQL");
                conn.query_drop("START TRANSACTION")
                    .expect("START TRANSACTION");
                let rows: Vec<String> = conn.query(&sql).expect("SELECT … FOR UPDATE");
                assert_eq!(rows.len(), lock_keys.len(), "every row to lock exists");
                Some(RowLock::Mysql(conn))
            }
            _ => None,
        }
    }
}

impl Drop for RowLock {
    fn drop(&mut self) {
        match self {
            #[cfg(feature = "postgres")]
            RowLock::Postgres(client) => {
                let _ = client.batch_execute("ROLLBACK");
            }
            #[cfg(feature = "mysql")]
            RowLock::Mysql(conn) => {
                use mysql::prelude::Queryable;
                let _ = conn.query_drop("ROLLBACK");
            }
            #[allow(unreachable_patterns)]
            _ => {}
        }
    }
}
