//! A registry's own acquire and release statements ([`leasehold::Statements`]) run on a raw
//! driver connection with the registry's parameters, protocol and durability: the statements
//! a handoff cannot do without, with nothing of the registry around them. PostgreSQL prepares
//! them once with the registry's parameter types (as its default does on a connection straight
//! to the server); MySQL prepares them once in `?` form and reads the token from the insert
//! id, as the registry's connections do.

#[cfg(feature = "mysql")]
#[path = "mysql_params.rs"]
pub mod mysql_params;

/// The lease's client id and time-to-live (µs).
const CLIENT: &str = "bench-raw-client";
const TTL_MICROS: i64 = 10_000_000;

pub enum RawLease {
    Sqlite {
        conn: rusqlite::Connection,
        statements: leasehold::Statements,
    },
    #[cfg(feature = "postgres")]
    Postgres {
        client: postgres::Client,
        acquire: postgres::Statement,
        release: postgres::Statement,
    },
    #[cfg(feature = "mysql")]
    Mysql {
        conn: mysql::Conn,
        acquire: (mysql::Statement, Vec<usize>),
        release: (mysql::Statement, Vec<usize>),
    },
}

/// PostgreSQL: the registry's parameter types; every statement gets all six, used or not.
#[cfg(feature = "postgres")]
pub const PG_TYPES: [postgres::types::Type; 6] = {
    use postgres::types::Type;
    [
        Type::BPCHAR,
        Type::VARCHAR,
        Type::BPCHAR,
        Type::INT8,
        Type::INT8,
        Type::TEXT,
    ]
};

impl RawLease {
    /// Opens a connection to `spec` (`kind|location`, as the benches pass it) for the
    /// registry statements `statements`.
    pub fn open(spec: &str, statements: &leasehold::Statements) -> RawLease {
        let (kind, location) = spec.split_once('|').expect("kind|location");
        let statements = statements.clone();
        match kind {
            "sqlite" => {
                let conn = rusqlite::Connection::open(location).unwrap();
                conn.busy_timeout(std::time::Duration::from_secs(5))
                    .unwrap();
                // As the registry's connections (the file is in WAL mode already).
                conn.pragma_update(None, "synchronous", "NORMAL").unwrap();
                RawLease::Sqlite { conn, statements }
            }
            #[cfg(feature = "postgres")]
            "postgres" => {
                let mut client = postgres::Client::connect(location, postgres::NoTls).unwrap();
                let acquire = client.prepare_typed(&statements.acquire, &PG_TYPES);
                let release = client.prepare_typed(&statements.release, &PG_TYPES);
                RawLease::Postgres {
                    client,
                    acquire: acquire.unwrap(),
                    release: release.unwrap(),
                }
            }
            #[cfg(feature = "mysql")]
            "mysql" => {
                use mysql::prelude::Queryable;
                let url = location.split('?').next().unwrap_or(location);
                // As the registry's connections: UPDATE reports the rows it matched.
                let opts = mysql::OptsBuilder::from_opts(mysql::Opts::from_url(url).unwrap())
                    .additional_capabilities(mysql::consts::CapabilityFlags::CLIENT_FOUND_ROWS);
                let mut conn = mysql::Conn::new(opts).unwrap();
                let (acquire, acquire_order) = mysql_params::question_marks(&statements.acquire);
                let (release, release_order) = mysql_params::question_marks(&statements.release);
                let acquire = conn.prep(acquire).unwrap();
                let release = conn.prep(release).unwrap();
                RawLease::Mysql {
                    conn,
                    acquire: (acquire, acquire_order),
                    release: (release, release_order),
                }
            }
            other => panic!("unknown backend {other}"),
        }
    }

    /// Runs the acquire statement on `key`: the token when granted.
    pub fn acquire(&mut self, key: &str) -> Option<i64> {
        let lock_key = leasehold::lock_key_for(key);
        match self {
            RawLease::Sqlite { conn, statements } => {
                let mut statement = conn.prepare_cached(&statements.acquire).unwrap();
                let values: [&dyn rusqlite::ToSql; 6] =
                    [&lock_key, &"DEFAULT", &CLIENT, &TTL_MICROS, &0_i64, &key];
                for (index, value) in values.iter().enumerate() {
                    if index < statement.parameter_count() {
                        statement.raw_bind_parameter(index + 1, value).unwrap();
                    }
                }
                let mut rows = statement.raw_query();
                rows.next().unwrap().map(|row| row.get(0).unwrap())
            }
            #[cfg(feature = "postgres")]
            RawLease::Postgres {
                client, acquire, ..
            } => {
                let values: [&(dyn postgres::types::ToSql + Sync); 6] =
                    [&lock_key, &"DEFAULT", &CLIENT, &TTL_MICROS, &0_i64, &key];
                let rows = client.query(&*acquire, &values).unwrap();
                rows.first().map(|row| row.get(0))
            }
            #[cfg(feature = "mysql")]
            RawLease::Mysql {
                conn,
                acquire: (acquire, order),
                ..
            } => {
                use mysql::prelude::Queryable;
                let values = mysql_params::values(&lock_key, CLIENT, TTL_MICROS, 0, key, order);
                conn.exec_drop(&*acquire, values).unwrap();
                let token = conn.last_insert_id() as i64;
                (token != 0).then_some(token)
            }
        }
    }

    /// Runs the release statement of the lease on `key` granted with `token`, as a release
    /// that wakes waiters (it ends no turn).
    pub fn release(&mut self, key: &str, token: i64) {
        let lock_key = leasehold::lock_key_for(key);
        let released = match self {
            RawLease::Sqlite { conn, statements } => {
                let mut statement = conn.prepare_cached(&statements.release).unwrap();
                let values: [&dyn rusqlite::ToSql; 6] =
                    [&lock_key, &"DEFAULT", &CLIENT, &0_i64, &token, &""];
                for (index, value) in values.iter().enumerate() {
                    if index < statement.parameter_count() {
                        statement.raw_bind_parameter(index + 1, value).unwrap();
                    }
                }
                statement.raw_execute().unwrap() as u64
            }
            #[cfg(feature = "postgres")]
            RawLease::Postgres {
                client, release, ..
            } => {
                let values: [&(dyn postgres::types::ToSql + Sync); 6] =
                    [&lock_key, &"DEFAULT", &CLIENT, &0_i64, &token, &""];
                client.execute(&*release, &values).unwrap()
            }
            #[cfg(feature = "mysql")]
            RawLease::Mysql {
                conn,
                release: (release, order),
                ..
            } => {
                use mysql::prelude::Queryable;
                let values = mysql_params::values(&lock_key, CLIENT, 0, token, "", order);
                conn.exec_drop(&*release, values).unwrap();
                conn.affected_rows()
            }
        };
        assert_eq!(released, 1, "the raw lease was held");
    }
}
