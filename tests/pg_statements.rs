//! PostgreSQL's named and unnamed statements, as the server sees them.
//!
//! By default a connection straight to the server prepares each statement once, as a named
//! statement, and one through a transaction-mode pooler sends every statement unnamed; the
//! registry finds out by itself. `prepared_statements(false)` forces unnamed statements.
//!
//! What the server sees is recorded by the registry's own acquire statement: a replacement
//! that is the default statement plus a CTE that writes into a table of the test's own how
//! many protocol-level named statements the session that runs it has prepared
//! (`pg_prepared_statements`, which lists a session's own). A session that sends everything
//! unnamed has none; one that prepares the acquire statement has it prepared by the time it
//! runs.

#![cfg(feature = "postgres")]

mod common;

use common::{Db, Fixture};
use std::time::Duration;

/// Held by every test: the fail point of the fallback test is the whole process's.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A fixture straight on the server, or `None` to skip.
fn direct(test: &str) -> Option<Fixture> {
    common::ROUTE.with(|route| *route.borrow_mut() = None);
    Fixture::new(Db::Postgres, test)
}

/// The table where the acquire statement records what its session has prepared.
fn seen_table(f: &Fixture) -> String {
    format!("{}SEEN", f.prefix)
}

fn admin() -> postgres::Client {
    postgres::Client::connect(&common::postgres_url(), postgres::NoTls).expect("PostgreSQL")
}

/// `builder` with an acquire statement that records, on every run, how many named
/// statements its session has prepared (see the module docs).
fn recording(f: &Fixture, builder: leasehold::RegistryBuilder) -> leasehold::RegistryBuilder {
    let table = seen_table(f);
    admin()
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {table} (NAMED BIGINT NOT NULL)"
        ))
        .expect("the record table");
    let default = f.registry().statements().acquire.clone();
    let rest = default
        .strip_prefix("WITH ")
        .expect("the default acquire statement starts with a CTE");
    builder.custom_sql(leasehold::CustomSql {
        acquire: Some(format!(
            "WITH seen AS (INSERT INTO {table} (NAMED) SELECT count(*) FROM \
             pg_prepared_statements WHERE NOT from_sql), {rest}"
        )),
        ..leasehold::CustomSql::default()
    })
}

/// The most named statements any run of the acquire statement saw in its session, and how
/// many runs there were.
fn seen(f: &Fixture) -> (i64, i64) {
    let row = admin()
        .query_one(
            &format!(
                "SELECT COALESCE(max(NAMED), -1), count(*) FROM {}",
                seen_table(f)
            ),
            &[],
        )
        .expect("the record table");
    (row.get(0), row.get(1))
}

/// Takes and gives back a few keys several times, some of them contended by `other`.
fn work(registry: &leasehold::LockRegistry, other: &leasehold::LockRegistry) {
    for round in 0..3 {
        let guards: Vec<_> = (0..3)
            .map(|i| registry.obtain(&format!("k{i}")).unwrap().lock().unwrap())
            .collect();
        assert!(
            other.obtain("k0").unwrap().try_lock().unwrap().is_none(),
            "round {round}: a held key was granted"
        );
        for guard in guards {
            assert!(guard.is_held(), "round {round}");
            guard.unlock().unwrap();
        }
        let taken = other.obtain("k0").unwrap().try_lock().unwrap();
        assert!(taken.is_some(), "round {round}: a free key was refused");
    }
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let _ = admin().batch_execute(&format!("DROP TABLE IF EXISTS {}", seen_table(self.0)));
    }
}

/// Drops the record table with the test.
struct Cleanup<'a>(&'a Fixture);

/// Straight to the server, the defaults prepare named statements: the acquire statement
/// finds itself (at least) prepared in its session.
#[test]
fn a_registry_straight_to_the_server_prepares_named_statements_by_default() {
    let _alone = one_at_a_time();
    let Some(f) = direct("pgnameddefault") else {
        return;
    };
    let _cleanup = Cleanup(&f);
    let registry = recording(&f, f.builder()).build().unwrap();
    work(&registry, &f.registry());
    let (named, runs) = seen(&f);
    assert!(runs >= 3, "{runs} acquire statements recorded");
    assert!(
        named >= 1,
        "the acquire statements ran unnamed by default straight to the server ({named} named \
         statements in their session)"
    );
}

/// `prepared_statements(false)` sends every statement unnamed, straight to the server too.
#[test]
fn prepared_statements_false_sends_every_statement_unnamed() {
    let _alone = one_at_a_time();
    let Some(f) = direct("pgunnamedforced") else {
        return;
    };
    let _cleanup = Cleanup(&f);
    let registry = recording(&f, f.builder().prepared_statements(false))
        .build()
        .unwrap();
    work(&registry, &f.registry());
    let (named, runs) = seen(&f);
    assert!(runs >= 3, "{runs} acquire statements recorded");
    assert_eq!(named, 0, "named statements with prepared_statements(false)");
}

#[cfg(unix)]
mod through_pgbouncer {
    use super::*;
    use crate::common::pgbouncer::PgBouncer;

    fn pooled(f: &Fixture, bouncer: &PgBouncer) -> leasehold::RegistryBuilder {
        leasehold::LockRegistry::postgres(bouncer.url())
            .prefix(f.prefix.clone())
            .idle_between_tries(Duration::from_millis(20))
            .connect_timeout(Duration::from_secs(15))
    }

    /// Through a transaction-mode PgBouncer with the defaults, every statement goes unnamed
    /// (PgBouncer's cancel keys are its own), and registries exclude each other through it
    /// and straight to the server alike.
    #[test]
    fn through_a_transaction_pooler_the_defaults_send_statements_unnamed() {
        let _alone = one_at_a_time();
        let Some(f) = direct("pgbouncerdefault") else {
            return;
        };
        let Some(bouncer) = PgBouncer::start(2) else {
            return;
        };
        let _cleanup = Cleanup(&f);
        let registry = recording(&f, pooled(&f, &bouncer)).build().unwrap();
        let other = pooled(&f, &bouncer).build().unwrap();
        work(&registry, &other);
        work(&registry, &f.registry());
        let (named, runs) = seen(&f);
        assert!(runs >= 6, "{runs} acquire statements recorded");
        assert_eq!(
            named, 0,
            "named statements through a transaction-mode pooler"
        );
    }

    /// A connection that takes the pooler for the server (forced with a fail point: a pooler
    /// that passed the server's cancel keys through) prepares named statements; once the
    /// pooler's server connections are replaced, they are missing there (`26000`). The
    /// statement that finds so runs again unnamed, every later one goes unnamed, and work
    /// goes on without an error.
    #[cfg(feature = "failpoints")]
    #[test]
    fn a_named_statement_missing_behind_a_pooler_switches_the_registry_to_unnamed() {
        let _alone = one_at_a_time();
        let Some(f) = direct("pgbouncerfallback") else {
            return;
        };
        let Some(bouncer) = PgBouncer::start(2) else {
            return;
        };
        let _cleanup = Cleanup(&f);
        let tag = format!("lh_fallback_{}", std::process::id());
        let url = format!("{}?application_name={tag}", bouncer.url());
        // Both registries tagged, so that the pooler's server connections carry the tag
        // whichever client used them last.
        let builder = || {
            leasehold::LockRegistry::postgres(url.clone())
                .prefix(f.prefix.clone())
                .idle_between_tries(Duration::from_millis(20))
                .connect_timeout(Duration::from_secs(15))
        };
        let _fail_point = ClearOnDrop("postgres::straight_to_the_server");
        fail::cfg("postgres::straight_to_the_server", "return(yes)").unwrap();
        let registry = recording(&f, builder()).build().unwrap();
        let other = builder().build().unwrap();
        work(&registry, &other);
        let (named, _) = seen(&f);
        assert!(named >= 1, "the fail point did not make named statements");
        // New server connections behind the pooler: the named statements are gone.
        let mut admin = admin();
        let ended: i64 = admin
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE application_name = $1 AND pid <> pg_backend_pid()",
                &[&tag],
            )
            .unwrap()
            .get(0);
        assert!(ended >= 1, "no server connection of the pooler found");
        admin
            .batch_execute(&format!("DELETE FROM {}", seen_table(&f)))
            .unwrap();
        work(&registry, &other);
        let (named, runs) = seen(&f);
        assert!(runs >= 3, "{runs} acquire statements recorded");
        assert_eq!(named, 0, "named statements after the pooler was found");
    }

    /// Removes a fail point when dropped, however the test ends.
    #[cfg(feature = "failpoints")]
    struct ClearOnDrop(&'static str);

    #[cfg(feature = "failpoints")]
    impl Drop for ClearOnDrop {
        fn drop(&mut self) {
            fail::remove(self.0);
        }
    }
}
