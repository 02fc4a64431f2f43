//! A plain connection of a test's own to the fixture's database, beside the registries: for
//! what an operator, a migration or Spring Integration does to the table.

use super::{Db, Fixture};

/// One driver connection to the fixture's database.
#[allow(clippy::large_enum_variant)] // one per test, never moved about
pub enum Raw {
    #[cfg(feature = "sqlite")]
    Sqlite(rusqlite::Connection),
    #[cfg(feature = "postgres")]
    Postgres(postgres::Client),
    #[cfg(feature = "mysql")]
    Mysql(mysql::Conn),
}

impl Raw {
    /// Connects to `f`'s database (SQLite waits up to 10 s for a busy file).
    pub fn open(f: &Fixture) -> Raw {
        match f.db {
            #[cfg(feature = "sqlite")]
            Db::Sqlite => {
                let conn = rusqlite::Connection::open(f.sqlite_path()).expect("open SQLite");
                conn.busy_timeout(std::time::Duration::from_secs(10))
                    .expect("busy timeout");
                Raw::Sqlite(conn)
            }
            #[cfg(feature = "postgres")]
            Db::Postgres => Raw::Postgres(
                postgres::Client::connect(&super::postgres_url(), postgres::NoTls)
                    .expect("connect to PostgreSQL"),
            ),
            #[cfg(feature = "mysql")]
            Db::Mysql => {
                let opts = mysql::Opts::from_url(&super::mysql_url()).expect("url");
                Raw::Mysql(mysql::Conn::new(opts).expect("connect to MySQL"))
            }
            #[allow(unreachable_patterns)]
            other => panic!("{other:?} support is not compiled in"),
        }
    }

    /// Runs one statement and returns the rows it affected.
    pub fn execute(&mut self, sql: &str) -> u64 {
        match self {
            #[cfg(feature = "sqlite")]
            Raw::Sqlite(conn) => conn.execute(sql, []).expect(sql) as u64,
            #[cfg(feature = "postgres")]
            Raw::Postgres(client) => client.execute(sql, &[]).expect(sql),
            #[cfg(feature = "mysql")]
            Raw::Mysql(conn) => {
                use mysql::prelude::Queryable;
                conn.query_drop(sql).expect(sql);
                conn.affected_rows()
            }
        }
    }

    /// Runs `sql`, several statements separated by `;`.
    pub fn execute_batch(&mut self, sql: &str) {
        match self {
            #[cfg(feature = "sqlite")]
            Raw::Sqlite(conn) => conn.execute_batch(sql).expect(sql),
            #[cfg(feature = "postgres")]
            Raw::Postgres(client) => client.batch_execute(sql).expect(sql),
            #[cfg(feature = "mysql")]
            Raw::Mysql(conn) => {
                use mysql::prelude::Queryable;
                conn.query_drop(sql).expect(sql);
            }
        }
    }

    /// Runs a query and returns the one BIGINT of its first row.
    pub fn number(&mut self, sql: &str) -> i64 {
        match self {
            #[cfg(feature = "sqlite")]
            Raw::Sqlite(conn) => conn.query_row(sql, [], |row| row.get(0)).expect(sql),
            #[cfg(feature = "postgres")]
            Raw::Postgres(client) => client.query_one(sql, &[]).expect(sql).get(0),
            #[cfg(feature = "mysql")]
            Raw::Mysql(conn) => {
                use mysql::prelude::Queryable;
                conn.query_first::<i64, _>(sql)
                    .expect(sql)
                    .expect("one row")
            }
        }
    }
}
