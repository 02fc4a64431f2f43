//! A bare lease row per key, the baseline of the contention benches: `UPDATE … SET holder,
//! expires = now + 30 s WHERE k AND expires < now` takes it (one row affected: held), the same
//! `UPDATE` setting `expires` back to the past lets it go, one connection per taker, and a
//! refused taker sleeps [`RAW_POLL`] before it tries again. The durability is the registry's
//! (SQLite `synchronous = NORMAL` in WAL mode; on PostgreSQL the release commits without
//! waiting for the disk, as leasehold's does).
//!
//! A backend is named as the other benches name it: `sqlite|PATH`, `postgres|URL`,
//! `mysql|URL`.

use std::time::Duration;

/// How long a refused taker sleeps before it tries again.
pub const RAW_POLL: Duration = Duration::from_millis(10);

pub enum RawRow {
    Sqlite(rusqlite::Connection),
    #[cfg(feature = "postgres")]
    Postgres {
        client: postgres::Client,
        take: postgres::Statement,
        give: postgres::Statement,
    },
    #[cfg(feature = "mysql")]
    Mysql(mysql::Conn),
}

impl RawRow {
    /// Creates the table `raw_lease` with `keys` free rows (emptying it first), or says why
    /// the server cannot be used.
    pub fn setup(spec: &str, keys: usize) -> Result<(), String> {
        let (kind, location) = spec.split_once('|').expect("kind|location");
        match kind {
            "sqlite" => {
                let conn = rusqlite::Connection::open(location).map_err(|e| e.to_string())?;
                conn.execute_batch(
                    "PRAGMA journal_mode = WAL; \
                     CREATE TABLE IF NOT EXISTS raw_lease (k INTEGER PRIMARY KEY, holder TEXT, \
                     expires TEXT NOT NULL); \
                     DELETE FROM raw_lease;",
                )
                .map_err(|e| e.to_string())?;
                for k in 0..keys {
                    conn.execute(
                        "INSERT INTO raw_lease VALUES (?1, NULL, '1970-01-01 00:00:00.000')",
                        [k as i64],
                    )
                    .map_err(|e| e.to_string())?;
                }
                Ok(())
            }
            #[cfg(feature = "postgres")]
            "postgres" => {
                let mut setup = postgres::Client::connect(location, postgres::NoTls)
                    .map_err(|e| e.to_string())?;
                setup
                    .batch_execute(&format!(
                        "CREATE TABLE IF NOT EXISTS raw_lease (k int PRIMARY KEY, holder text, \
                         expires timestamp NOT NULL); \
                         TRUNCATE raw_lease; \
                         INSERT INTO raw_lease SELECT k, NULL, '1970-01-01' \
                         FROM generate_series(0, {}) k",
                        keys - 1
                    ))
                    .map_err(|e| e.to_string())
            }
            #[cfg(feature = "mysql")]
            "mysql" => {
                use mysql::prelude::Queryable;
                let mut setup = mysql::Opts::from_url(without_parameters(location))
                    .map_err(mysql::Error::from)
                    .and_then(mysql::Conn::new)
                    .map_err(|e| e.to_string())?;
                setup
                    .query_drop(
                        "CREATE TABLE IF NOT EXISTS raw_lease (k int PRIMARY KEY, \
                         holder varchar(64), expires datetime(6) NOT NULL)",
                    )
                    .map_err(|e| e.to_string())?;
                setup
                    .query_drop("DELETE FROM raw_lease")
                    .map_err(|e| e.to_string())?;
                for k in 0..keys {
                    setup
                        .exec_drop(
                            "INSERT INTO raw_lease VALUES (?, NULL, '1970-01-01 00:00:00')",
                            (k as i64,),
                        )
                        .map_err(|e| e.to_string())?;
                }
                Ok(())
            }
            other => Err(format!("unknown backend {other}")),
        }
    }

    /// A taker's own connection.
    pub fn connect(spec: &str) -> RawRow {
        let (kind, location) = spec.split_once('|').expect("kind|location");
        match kind {
            "sqlite" => {
                let conn = rusqlite::Connection::open(location).unwrap();
                conn.busy_timeout(Duration::from_secs(5)).unwrap();
                conn.pragma_update(None, "synchronous", "NORMAL").unwrap();
                RawRow::Sqlite(conn)
            }
            #[cfg(feature = "postgres")]
            "postgres" => {
                let mut client = postgres::Client::connect(location, postgres::NoTls).unwrap();
                let take = client
                    .prepare(
                        "UPDATE raw_lease SET holder = $1, expires = now() + interval '30 seconds' \
                         WHERE k = $2 AND expires < now()",
                    )
                    .unwrap();
                let give = client
                    .prepare(
                        "WITH unsynced AS (SELECT set_config('synchronous_commit', 'off', true)) \
                         UPDATE raw_lease SET expires = '1970-01-01' FROM unsynced \
                         WHERE k = $2 AND holder = $1",
                    )
                    .unwrap();
                RawRow::Postgres { client, take, give }
            }
            #[cfg(feature = "mysql")]
            "mysql" => RawRow::Mysql(
                mysql::Opts::from_url(without_parameters(location))
                    .map_err(mysql::Error::from)
                    .and_then(mysql::Conn::new)
                    .unwrap(),
            ),
            other => panic!("unknown backend {other}"),
        }
    }

    /// One try to take row `k` for `me`: whether it was free.
    pub fn take(&mut self, me: &str, k: usize) -> bool {
        match self {
            RawRow::Sqlite(conn) => {
                let take = "UPDATE raw_lease SET holder = ?1, expires = \
                            strftime('%Y-%m-%d %H:%M:%f', julianday('now') + 30 / 86400.0) \
                            WHERE k = ?2 AND expires < strftime('%Y-%m-%d %H:%M:%f', 'now')";
                let params = rusqlite::params![me, k as i64];
                conn.prepare_cached(take).unwrap().execute(params).unwrap() == 1
            }
            #[cfg(feature = "postgres")]
            RawRow::Postgres { client, take, .. } => {
                client.execute(&*take, &[&me, &(k as i32)]).unwrap() == 1
            }
            #[cfg(feature = "mysql")]
            RawRow::Mysql(conn) => {
                use mysql::prelude::Queryable;
                conn.exec_drop(
                    "UPDATE raw_lease SET holder = ?, expires = UTC_TIMESTAMP(6) + \
                     INTERVAL 30 SECOND WHERE k = ? AND expires < UTC_TIMESTAMP(6)",
                    (me, k as i64),
                )
                .unwrap();
                conn.affected_rows() == 1
            }
        }
    }

    /// Takes row `k` for `me`, trying every [`RAW_POLL`] until it is free.
    pub fn lock(&mut self, me: &str, k: usize) {
        while !self.take(me, k) {
            std::thread::sleep(RAW_POLL);
        }
    }

    /// Lets go of row `k`, which `me` holds.
    pub fn unlock(&mut self, me: &str, k: usize) {
        let given = match self {
            RawRow::Sqlite(conn) => {
                let give = "UPDATE raw_lease SET expires = '1970-01-01 00:00:00.000' \
                            WHERE k = ?2 AND holder = ?1";
                let params = rusqlite::params![me, k as i64];
                conn.prepare_cached(give).unwrap().execute(params).unwrap() as u64
            }
            #[cfg(feature = "postgres")]
            RawRow::Postgres { client, give, .. } => {
                client.execute(&*give, &[&me, &(k as i32)]).unwrap()
            }
            #[cfg(feature = "mysql")]
            RawRow::Mysql(conn) => {
                use mysql::prelude::Queryable;
                conn.exec_drop(
                    "UPDATE raw_lease SET expires = '1970-01-01 00:00:00' \
                     WHERE k = ? AND holder = ?",
                    (k as i64, me),
                )
                .unwrap();
                conn.affected_rows()
            }
        };
        assert_eq!(given, 1, "the raw row was held by {me}");
    }
}

/// A MySQL URL without the registry's own parameters, which the driver does not know (the
/// raw connections do not use TLS).
#[cfg(feature = "mysql")]
fn without_parameters(url: &str) -> &str {
    url.split('?').next().unwrap_or(url)
}
