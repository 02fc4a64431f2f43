//! MariaDB's batch renewal reads the rows of its pairs and no others: the session's
//! `Handler_read_*` counters around statement 3 of [`Mysql::renew_batch_sql`] on a table of
//! 2,000 rows, for batches of 1, 2 and 500 pairs. A condition MariaDB cannot turn into ranges
//! of the primary key (a list of one row value is one) reads, and locks, the whole table.
//! Skipped (with a printed reason) without a MariaDB server, unless `CI=true`.

use super::{update_by_pairs, Mysql};
use crate::backend::{pairs_json, Backend, Params};
use mysql::prelude::Queryable;

const ROWS: usize = 2_000;

/// The rows the session's handler read, counted by the server.
fn rows_read(conn: &mut mysql::Conn) -> u64 {
    let counters: Vec<(String, String)> = conn
        .query("SHOW SESSION STATUS LIKE 'Handler_read%'")
        .expect("the handler counters");
    counters
        .iter()
        .filter_map(|(_, value)| value.parse::<u64>().ok())
        .sum()
}

#[test]
fn the_mariadb_batch_renewal_reads_only_its_pairs_rows() {
    let url = std::env::var("LEASEHOLD_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_string());
    let connected = mysql::Opts::from_url(&url)
        .map_err(|e| e.to_string())
        .and_then(|opts| mysql::Conn::new(opts).map_err(|e| e.to_string()));
    let mut conn = match connected {
        Ok(conn) => conn,
        Err(e) => {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
            assert!(!ci, "MySQL/MariaDB is required under CI=true: {e}");
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr().lock(),
                "SKIPPED the MariaDB batch renewal's plan: no server ({e})"
            );
            return;
        }
    };
    let version: String = conn
        .query_first("SELECT VERSION()")
        .expect("the version")
        .unwrap_or_default();
    if !version.contains("MariaDB") {
        println!("SKIPPED: {version} is not MariaDB, which alone runs this statement");
        return;
    }
    let prefix = format!("lh_plan_{}_", std::process::id());
    let table = format!("{prefix}LOCK");
    let client_id = "c0000000-0000-0000-0000-000000000000";
    conn.query_drop(format!("DROP TABLE IF EXISTS {table}"))
        .expect("no table of an earlier run");
    conn.query_drop(Mysql::DDL.replace("INT_", &prefix))
        .expect("the test table");
    let keys: Vec<String> = (0..ROWS)
        .map(|n| format!("{n:08x}-0000-4000-8000-000000000000"))
        .collect();
    for chunk in keys.chunks(500) {
        let rows: Vec<String> = chunk
            .iter()
            .enumerate()
            .map(|(n, key)| {
                format!(
                    "('{key}', 'DEFAULT', '{client_id}', UTC_TIMESTAMP(6), \
                     UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, {})",
                    n + 1
                )
            })
            .collect();
        conn.query_drop(format!(
            "INSERT INTO {table} (LOCK_KEY, REGION, CLIENT_ID, CREATED_DATE, EXPIRED_AFTER, \
             FENCING_TOKEN) VALUES {}",
            rows.join(",")
        ))
        .expect("the test rows");
    }
    let start = &Mysql::renew_batch_sql(&table)[3];
    let mut found = Vec::new();
    for pairs in [1, 2, 500] {
        // Every third row, so that no two pairs are neighbours in the index.
        let chosen: Vec<(&str, i64)> = (0..pairs)
            .map(|n| (keys[n * 3].as_str(), (n * 3 % 500 + 1) as i64))
            .collect();
        let json = pairs_json(chosen.iter().copied());
        let params = Params {
            lock_key: &json,
            region: "DEFAULT",
            client_id,
            ttl_micros: 60_000_000,
            token: 0,
            name: "",
        };
        let update = update_by_pairs(start, &params).expect("plain values");
        let before = rows_read(&mut conn);
        conn.query_drop(&update).expect("the batch renewal");
        let renewed = conn.affected_rows();
        let read = rows_read(&mut conn) - before;
        found.push((pairs, renewed, read));
    }
    let _ = conn.query_drop(format!("DROP TABLE IF EXISTS {table}"));
    println!("pairs, rows renewed, rows read on a table of {ROWS}: {found:?}");
    for (pairs, renewed, read) in found {
        assert_eq!(renewed, pairs as u64, "rows renewed for {pairs} pairs");
        assert!(
            read <= 2 * pairs as u64 + 2,
            "{read} rows read for {pairs} pairs on a table of {ROWS}"
        );
    }
}
