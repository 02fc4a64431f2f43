//! The batch renewal's plan, measured on the server: `EXPLAIN ANALYZE` of one batch of 500
//! pairs on a table of 2,000 rows that has no statistics yet (a table just made, before
//! autovacuum analyzes it: the planner's guesses are at their worst), counting every row each
//! plan node produced or filtered out, over all its loops. A batch that joins two lists the
//! planner cannot size as a nested loop compares every pair with every other (250,000 rows
//! filtered for 500 pairs); the statement must stay within a small multiple of its pairs
//! plus one pass over the table. Skipped (with a printed reason) without a server, unless
//! `CI=true`.

use super::Postgres;
use crate::backend::{pairs_json, Backend};

const PAIRS: usize = 500;
const ROWS: usize = 2_000;

/// Rows produced and filtered out by every node of a text-format `EXPLAIN (ANALYZE, COSTS
/// OFF, TIMING OFF)`, each times its loops.
fn rows_touched(plan: &[String]) -> u64 {
    let mut total = 0;
    let mut loops = 1;
    for line in plan {
        if let Some(at) = line.find("(actual rows=") {
            let numbers = &line[at + "(actual rows=".len()..];
            let (rows, rest) = numbers.split_once(" loops=").expect("rows and loops");
            let rows: f64 = rows.parse().expect("a row count");
            loops = rest.trim_end_matches(')').parse().expect("a loop count");
            total += (rows * loops as f64) as u64;
        } else if let Some((_, removed)) = line.split_once("Rows Removed by ") {
            let (_, count) = removed.split_once(": ").expect("a count");
            total += count.trim().parse::<u64>().expect("a count") * loops;
        }
    }
    total
}

#[test]
fn a_batch_renewal_touches_rows_in_proportion_to_its_pairs() {
    let url = std::env::var("LEASEHOLD_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string());
    let mut client = match postgres::Client::connect(&url, postgres::NoTls) {
        Ok(client) => client,
        Err(e) => {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
            assert!(!ci, "PostgreSQL is required under CI=true: {e}");
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr().lock(),
                "SKIPPED the batch renewal's plan: no PostgreSQL server ({e})"
            );
            return;
        }
    };
    let prefix = format!("lh_plan_{}_", std::process::id());
    let table = format!("{prefix}LOCK");
    let client_id = "c0000000-0000-0000-0000-000000000000";
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {table}; {ddl}; \
             ALTER TABLE {table} SET (autovacuum_enabled = false); \
             INSERT INTO {table} (LOCK_KEY, REGION, CLIENT_ID, CREATED_DATE, EXPIRED_AFTER, \
             FENCING_TOKEN) SELECT md5(g::text) || '0000', 'DEFAULT', '{client_id}', \
             now() AT TIME ZONE 'UTC', now() AT TIME ZONE 'UTC' + INTERVAL '1 hour', g \
             FROM generate_series(1, {ROWS}) AS g",
            ddl = Postgres::DDL.replace("INT_", &prefix)
        ))
        .expect("the test table");
    let pairs: Vec<(String, i64)> = client
        .query(
            &format!("SELECT CAST(LOCK_KEY AS TEXT), FENCING_TOKEN FROM {table} LIMIT {PAIRS}"),
            &[],
        )
        .expect("the pairs")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let json = pairs_json(pairs.iter().map(|(key, token)| (key.as_str(), *token)));
    let sql = &Postgres::renew_batch_sql(&table)[0];
    let explained = client.batch_execute(&format!(
        "PREPARE batch (CHAR, VARCHAR, CHAR, BIGINT, BIGINT, TEXT) AS {sql}"
    ));
    let plan: Vec<String> = explained
        .and_then(|()| {
            client.query(
                &format!(
                    "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) EXECUTE batch('{json}', \
                     'DEFAULT', '{client_id}', 60000000, 0, '')"
                ),
                &[],
            )
        })
        .map(|rows| rows.iter().map(|row| row.get(0)).collect())
        .unwrap_or_else(|e| {
            let _ = client.batch_execute(&format!("DROP TABLE IF EXISTS {table}"));
            panic!("EXPLAIN of the batch renewal: {e}");
        });
    let renewed: i64 = client
        .query_one(
            &format!(
                "SELECT count(*) FROM {table} \
                 WHERE EXPIRED_AFTER < now() AT TIME ZONE 'UTC' + INTERVAL '2 minutes'"
            ),
            &[],
        )
        .expect("the renewed rows")
        .get(0);
    let _ = client.batch_execute(&format!("DROP TABLE IF EXISTS {table}"));
    let touched = rows_touched(&plan);
    let plan = plan.join("\n");
    println!("{touched} rows touched for {PAIRS} pairs on a table of {ROWS}:\n{plan}");
    assert_eq!(renewed, PAIRS as i64, "rows renewed\n{plan}");
    assert!(
        touched <= (20 * PAIRS + 2 * ROWS) as u64,
        "{touched} rows touched for {PAIRS} pairs on a table of {ROWS}:\n{plan}"
    );
}
