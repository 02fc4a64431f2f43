//! PostgreSQL: a statement given up at its deadline does not go on running on the server.
//!
//! The caller gets its error at the deadline and the connection is discarded; the server,
//! which notices a closed connection only when it next writes to it, is asked to cancel the
//! statement, so that it stops taking its share of the server and gives back the row locks it
//! holds (a batch renewal's, which the next renewal of those rows would find locked).

#![cfg(feature = "postgres")]

mod common;

use common::{postgres_url, Db, Fixture};
use std::time::{Duration, Instant};

/// Statements on the server whose text contains `marker` and that are still running.
fn running(marker: &str) -> i64 {
    let mut admin = postgres::Client::connect(&postgres_url(), postgres::NoTls).unwrap();
    admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' \
             AND pid <> pg_backend_pid() AND strpos(query, $1) > 0",
            &[&marker],
        )
        .unwrap()
        .get(0)
}

/// A manual renewal whose statement takes a minute on the server (a replacement renew
/// statement that sleeps) fails at the operation timeout; the server stops running it within
/// seconds rather than finishing its minute.
#[test]
fn a_statement_given_up_at_its_deadline_is_cancelled_on_the_server() {
    let Some(f) = Fixture::new(Db::Postgres, "pgcancel") else {
        return;
    };
    let marker = format!("lh_cancel_{}", std::process::id());
    let slow_renew = format!(
        "{} AND (SELECT TRUE FROM pg_sleep(60)) /* {marker} */",
        f.registry().statements().renew
    );
    let registry = f
        .builder()
        .time_to_live(Duration::from_secs(120))
        .operation_timeout(Duration::from_secs(1))
        .custom_sql(leasehold::CustomSql {
            renew: Some(slow_renew),
            ..leasehold::CustomSql::default()
        })
        .build()
        .unwrap();
    let guard = registry.obtain("slow").unwrap().lock().unwrap();
    let renewal = guard.renew();
    assert!(renewal.is_err(), "a minute-long renewal did not time out");
    // Seen running while the deadline passed (the error came back), then gone.
    let given_up = Instant::now();
    let mut left = running(&marker);
    while left > 0 && given_up.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(100));
        left = running(&marker);
    }
    assert_eq!(
        left,
        0,
        "the statement given up at its deadline still runs on the server {:?} later",
        given_up.elapsed()
    );
    drop(guard);
}
