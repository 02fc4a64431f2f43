//! PostgreSQL through PgBouncer in transaction pooling mode, and a server without free
//! connection slots.
//!
//! Each test that needs a pooler starts its own PgBouncer (see `common::pgbouncer`: 1.18 as
//! Debian ships it, transaction mode, no `max_prepared_statements`, on a spare port in front of
//! the test server) and stops it when done. Without `pgbouncer` installed the tests fail under
//! `CI=true` (`.ci/run` installs it) and are skipped otherwise. The whole conformance suite
//! runs through PgBouncer too, in `tests/conformance.rs` (`postgres_through_pgbouncer::*`).
//!
//! - wake-ups: through the direct listener, a release wakes a waiter long before its next poll;
//!   without one, the listener finds that `LISTEN` goes through a transaction pooler, says so
//!   once in the log, and waiters poll;
//! - the `leasehold` command through the pooler;
//! - named statements (`prepared_statements(true)`) straight to the server;
//! - a fleet: the stress driver (`examples/stress.rs`), many processes through a few server
//!   connections, with no error, loss or overlap;
//! - a full server (a role with a `CONNECTION LIMIT`, so the shared server keeps its slots):
//!   `build()` names "too many clients" rather than telling to start the server, a grant that
//!   cannot have its renewal connection is given back with that error, and a held lease keeps
//!   being renewed; connections lost while it is full make the acquire that needs a new one
//!   time out naming "too many clients", and the lease is reported lost for that reason.
//!
//! No assertion is on elapsed time except bounds far above what is expected (the wake-up
//! test's waiter would poll only after 60 s; it must be woken well before).

#![cfg(all(feature = "postgres", unix))]

mod common;
#[allow(dead_code)]
#[path = "../examples/stress.rs"]
mod stress;

use common::pgbouncer::PgBouncer;
use common::{postgres_url, warnings, Db, Fixture};
use leasehold::{Error, LockRegistry};
use std::process::Command;
use std::time::{Duration, Instant};

/// Bound on every wait, so that a broken build fails instead of hanging.
const GENEROUS: Duration = Duration::from_secs(60);
/// The environment variable that makes `child_process_entry` run a stress child.
const STRESS_CHILD: &str = "LEASEHOLD_PGBOUNCER_STRESS_CHILD";

/// A fixture on the server of [`postgres_url`] (its table made directly), or `None` to skip.
fn direct_fixture(test: &str) -> Option<Fixture> {
    common::ROUTE.with(|current| *current.borrow_mut() = None);
    Fixture::new(Db::Postgres, test)
}

/// A builder through `bouncer` on `f`'s table.
fn pooled(f: &Fixture, bouncer: &PgBouncer) -> leasehold::RegistryBuilder {
    LockRegistry::postgres(bouncer.url())
        .prefix(f.prefix.clone())
        .idle_between_tries(Duration::from_millis(20))
        .connect_timeout(Duration::from_secs(3))
}

/// How many server connections `LISTEN` on `f`'s table now (asked directly).
fn listening(f: &Fixture) -> i64 {
    let mut client = postgres::Client::connect(&postgres_url(), postgres::NoTls).unwrap();
    let query = format!("LISTEN \"{}\"", f.table().to_ascii_lowercase());
    client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE query = $1",
            &[&query],
        )
        .unwrap()
        .get(0)
}

/// A waiter through PgBouncer whose listener connects straight to the server is woken by a
/// release long before its next poll (a minute away).
#[test]
fn a_release_wakes_a_waiter_through_the_direct_listener() {
    let Some(f) = direct_fixture("wakesdirect") else {
        return;
    };
    let Some(bouncer) = PgBouncer::start(2) else {
        return;
    };
    let holder = pooled(&f, &bouncer).build().unwrap();
    let poll = Duration::from_secs(60);
    let waiter = pooled(&f, &bouncer)
        .idle_between_tries(poll)
        .listener_url(postgres_url())
        .build()
        .unwrap();
    let held = holder.obtain("job").unwrap().lock().unwrap();
    let lock = waiter.obtain("job").unwrap();
    let waiting = std::thread::spawn(move || {
        let guard = lock.try_lock_for(GENEROUS * 2).unwrap().expect("granted");
        (Instant::now(), guard.fencing_token())
    });
    let give_up = Instant::now() + GENEROUS;
    while listening(&f) == 0 {
        assert!(
            Instant::now() < give_up,
            "the waiter's listener never subscribed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Subscribed; the waiter's first try has failed, its next poll is a minute away.
    std::thread::sleep(Duration::from_millis(200));
    let released = Instant::now();
    let token = held.fencing_token();
    held.unlock().unwrap();
    let (granted, new_token) = waiting.join().unwrap();
    assert!(new_token > token);
    let took = granted - released;
    assert!(
        took < poll / 2,
        "the waiter was not woken: granted {took:?} after the release"
    );
    println!("woken through the direct listener {took:?} after the release");
}

/// Without a listener URL the listener finds that its `LISTEN` goes through a transaction
/// pooler: it says so once in the log, and the waiter gets the lock by polling.
#[test]
fn a_listen_through_the_transaction_pooler_is_found_and_waiters_poll() {
    warnings::keep();
    let Some(f) = direct_fixture("deaflisten") else {
        return;
    };
    let Some(bouncer) = PgBouncer::start(2) else {
        return;
    };
    let holder = pooled(&f, &bouncer).build().unwrap();
    let waiter = pooled(&f, &bouncer)
        .idle_between_tries(Duration::from_millis(100))
        .build()
        .unwrap();
    let held = holder.obtain("job").unwrap().lock().unwrap();
    let lock = waiter.obtain("job").unwrap();
    let waiting = std::thread::spawn(move || {
        lock.try_lock_for(GENEROUS * 2)
            .map(|g| g.expect("granted").fencing_token())
    });
    let address = format!("127.0.0.1:{}", bouncer.port);
    let give_up = Instant::now() + GENEROUS;
    while warnings::containing(&address).is_empty() {
        assert!(
            Instant::now() < give_up,
            "no warning about LISTEN through the pooler"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Waiters go on waiting (and polling) after it; the warning is not repeated.
    std::thread::sleep(Duration::from_secs(3));
    let token = held.fencing_token();
    held.unlock().unwrap();
    assert!(waiting.join().unwrap().unwrap() > token);
    let said = warnings::containing(&address);
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].contains("transaction-mode pooler"), "{}", said[0]);
    assert!(said[0].contains("listener_url"), "{}", said[0]);
}

/// The entry point of the fleet's child processes (see `a_fleet_shares_a_few_server_connections`);
/// without the variable it returns at once.
#[test]
fn child_process_entry() {
    let Ok(index) = std::env::var(STRESS_CHILD) else {
        return;
    };
    let config = stress::Config::from_env_and_args(&[]).expect("configuration from the parent");
    stress::child_main(index.parse().unwrap(), &config).expect("stress child");
}

/// Many processes, each a registry with its own pools, through PgBouncer's few server
/// connections (listeners straight to the server): no error, no lost lease, no overlap.
#[test]
fn a_fleet_shares_a_few_server_connections() {
    let Some(f) = direct_fixture("fleet") else {
        return;
    };
    let server_connections = 4;
    let Some(bouncer) = PgBouncer::start(server_connections) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut config = stress::Config::new("postgres", &bouncer.url(), &f.prefix, dir.path());
    config.processes = 12;
    config.threads = 2;
    config.keys = 6;
    config.duration = Duration::from_secs(8);
    config.listener_url = Some(postgres_url());
    let spawn = |index: usize| {
        let mut command = Command::new(std::env::current_exe().expect("the test binary"));
        command
            .args([
                "--exact",
                "child_process_entry",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(STRESS_CHILD, index.to_string());
        command
    };
    let summary = stress::run(&mut config, &spawn).unwrap();
    let line = summary.line(&config);
    println!("{line} server_connections={server_connections}");
    assert!(summary.failures.is_empty(), "{:?}", summary.failures);
    assert_eq!(summary.children.len(), config.processes, "{line}");
    assert!(summary.passed(), "{line}");
    assert!(summary.sections() > 0, "{line}");
}

/// A role allowed `limit` connections, with the rights a registry needs on `f`'s table; it
/// is dropped with the returned guard.
struct LimitedRole {
    name: String,
}

impl LimitedRole {
    fn new(f: &Fixture, limit: u32) -> LimitedRole {
        let name = format!("{}role", f.prefix);
        let mut client = postgres::Client::connect(&postgres_url(), postgres::NoTls).unwrap();
        let table = f.table();
        let setup = format!(
            "DROP ROLE IF EXISTS {name}; \
             CREATE ROLE {name} LOGIN CONNECTION LIMIT {limit}; \
             GRANT USAGE ON SCHEMA public TO {name}; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {name}; \
             GRANT SELECT ON {table}_FLOOR TO {name}"
        );
        // Two tests granting on the schema at once: "tuple concurrently updated" (XX000).
        for attempt in 1.. {
            match client.batch_execute(&setup) {
                Ok(()) => break,
                Err(e)
                    if attempt < 10
                        && e.as_db_error()
                            .is_some_and(|d| d.message().contains("concurrently updated")) =>
                {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("creating role {name}: {e}"),
            }
        }
        LimitedRole { name }
    }

    fn url(&self) -> String {
        let mut url = postgres_url();
        let at = url.find("postgres@").expect("a URL with user postgres");
        url.replace_range(at..at + "postgres@".len(), &format!("{}@", self.name));
        url
    }

    /// Raw connections of this role until the server refuses one with 53300.
    fn fill(&self) -> Vec<postgres::Client> {
        let mut held = Vec::new();
        let give_up = Instant::now() + GENEROUS;
        loop {
            assert!(Instant::now() < give_up, "the role's slots never filled");
            match postgres::Client::connect(&self.url(), postgres::NoTls) {
                Ok(client) => held.push(client),
                Err(e) if e.code().is_some_and(|c| c.code() == "53300") => {
                    // A connection that just closed may still have counted: make sure.
                    std::thread::sleep(Duration::from_millis(300));
                    match postgres::Client::connect(&self.url(), postgres::NoTls) {
                        Ok(client) => held.push(client),
                        Err(_) => return held,
                    }
                }
                Err(e) => panic!("connecting as {}: {e}", self.name),
            }
        }
    }
}

impl Drop for LimitedRole {
    fn drop(&mut self) {
        if let Ok(mut client) = postgres::Client::connect(&postgres_url(), postgres::NoTls) {
            let _ = client.batch_execute(&format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{0}'; \
                 DROP OWNED BY {0}; DROP ROLE IF EXISTS {0}",
                self.name
            ));
        }
    }
}

/// A full server behind `listener_url` does not fail `build()`: wake-ups are an optimisation,
/// so the registry warns and its waiters poll (a fleet of 200 processes, a
/// direct listener each, 100 server slots). Any other fault of the URL still fails the build.
#[test]
fn a_full_server_behind_the_listener_url_leaves_waiters_polling() {
    let Some(f) = direct_fixture("fulllistener") else {
        return;
    };
    let role = LimitedRole::new(&f, 2);
    let filler = role.fill();
    assert!(!filler.is_empty(), "the role had no slot left to fill");
    let builder = || {
        LockRegistry::postgres(postgres_url())
            .prefix(f.prefix.clone())
            .listener_url(role.url())
            .idle_between_tries(Duration::from_millis(50))
            .connect_timeout(Duration::from_secs(2))
    };
    let (a, b) = (builder().build().unwrap(), builder().build().unwrap());
    let guard = a.obtain("polled").unwrap().lock().unwrap();
    let waiter = {
        let lock = b.obtain("polled").unwrap();
        std::thread::spawn(move || {
            lock.try_lock_for(GENEROUS)
                .unwrap()
                .map(|g| g.fencing_token())
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let token = guard.fencing_token();
    guard.unlock().unwrap();
    let taken = waiter
        .join()
        .unwrap()
        .expect("the waiter polled and got the lock");
    assert!(taken > token);

    let broken = LockRegistry::postgres(postgres_url())
        .prefix(f.prefix.clone())
        .listener_url("postgres://postgres@127.0.0.1:1/test")
        .connect_timeout(Duration::from_secs(1))
        .build();
    assert!(
        broken.is_err(),
        "an unreachable listener URL must still fail the build"
    );
    drop(filler);
}

/// A server without a free connection slot for the registry's role: `build()` says "too many
/// clients" (not "start the server"), a grant whose renewal connection cannot be opened is
/// given back with that error, and a lease held before the server filled up keeps being
/// renewed on its renewal connection, opened when it was granted.
#[test]
fn a_full_server_is_named_and_costs_no_held_lease() {
    let Some(f) = direct_fixture("fullserver") else {
        return;
    };
    // Holder: one main and one renewal connection; other: one main connection; filler: one.
    let role = LimitedRole::new(&f, 4);
    let builder = || {
        LockRegistry::postgres(role.url())
            .prefix(f.prefix.clone())
            .notifications(false)
            .connect_timeout(Duration::from_secs(3))
    };
    let holder = builder()
        .time_to_live(Duration::from_millis(1500))
        .build()
        .unwrap();
    let guard = holder.obtain("held").unwrap().lock().unwrap();
    let other = builder().build().unwrap();
    let filler = role.fill();
    assert!(!filler.is_empty(), "the role had no slot left to fill");

    match builder().build() {
        Err(e) => {
            let text = e.to_string();
            assert!(text.contains("too many clients"), "{text}");
            assert!(text.contains("max_connections"), "{text}");
            assert!(!text.contains("start the server"), "{text}");
        }
        Ok(_) => panic!("a registry was built on a full server"),
    }

    match other.obtain("wanted").unwrap().try_lock() {
        Err(Error::Database {
            operation, hint, ..
        }) => {
            assert_eq!(operation, "acquire");
            assert!(hint.contains("too many clients"), "{hint}");
            assert!(hint.contains("given back"), "{hint}");
        }
        other => panic!("expected the grant to be given back, got {other:?}"),
    }
    // Given back: free for anyone else.
    let direct = f.registry();
    assert!(direct
        .obtain("wanted")
        .unwrap()
        .try_lock()
        .unwrap()
        .is_some());

    let renewed = holder.statistics().renewals;
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        guard.is_held(),
        "the held lease was lost to the full server"
    );
    assert!(
        holder.statistics().renewals >= renewed + 3,
        "{:?}",
        holder.statistics()
    );
    assert!(direct.obtain("held").unwrap().try_lock().unwrap().is_none());
    guard.unlock().unwrap();
    drop(filler);
}

/// Connections a registry already had, lost while the server is full: the acquire that needs a
/// new one and the renewals that do both fail naming "too many clients", and the lease is
/// reported lost with that reason.
#[test]
fn acquires_and_renewals_refused_by_a_full_server_say_too_many_clients() {
    let Some(f) = direct_fixture("fullrenewal") else {
        return;
    };
    let role = LimitedRole::new(&f, 3);
    let losses = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = std::sync::Arc::clone(&losses);
    let holder = LockRegistry::postgres(role.url())
        .prefix(f.prefix.clone())
        .notifications(false)
        .time_to_live(Duration::from_secs(2))
        .operation_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(2))
        .on_lease_lost(move |lost| seen.lock().unwrap().push(lost.reason.to_string()))
        .build()
        .unwrap();
    let guard = holder.obtain("held").unwrap().lock().unwrap();
    // Cut the holder's connections, then take every slot of its role.
    let mut admin = postgres::Client::connect(&postgres_url(), postgres::NoTls).unwrap();
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1",
            &[&role.name],
        )
        .unwrap();
    let filler = role.fill();
    assert_eq!(filler.len(), 3, "the holder's connections were not cut");

    match holder.obtain("other").unwrap().try_lock() {
        Err(e @ Error::Timeout { .. }) => {
            let text = e.to_string();
            assert!(text.contains("too many clients"), "{text}");
            assert!(text.contains("max_connections"), "{text}");
        }
        other => panic!("expected a timeout naming the full server, got {other:?}"),
    }
    let lost = guard
        .loss_channel()
        .recv_timeout(GENEROUS)
        .expect("the lease to be lost");
    let reason = lost.reason.to_string();
    assert!(reason.contains("too many clients"), "{reason}");
    assert_eq!(losses.lock().unwrap().len(), 1);
    drop(filler);
}

/// The `leasehold` command through PgBouncer: every subcommand that talks to the table works
/// (with named statements, every statement after `init` fails there).
#[cfg(feature = "cli")]
#[test]
fn the_command_works_through_the_pooler() {
    let Some(f) = direct_fixture("clipooled") else {
        return;
    };
    let Some(bouncer) = PgBouncer::start(2) else {
        return;
    };
    let prefix = format!("{}cli_", f.prefix);
    let run = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args(&args[..1])
            .args(["--database", &bouncer.url(), "--prefix", &prefix])
            .args(&args[1..])
            .env_remove("LEASEHOLD_DATABASE_URL")
            .output()
            .expect("leasehold");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        (output.status.code(), text)
    };
    let steps: [(&[&str], i32); 6] = [
        (&["init"], 0),
        (&["run", "--key", "job", "--", "true"], 0),
        (
            &["run", "--key", "job", "--keep-for", "1h", "--", "true"],
            0,
        ),
        (&["status", "--key", "job"], 0),
        (&["list"], 0),
        (&["release", "--key", "job", "--force"], 0),
    ];
    for (args, expected) in steps {
        let (code, text) = run(args);
        assert_eq!(code, Some(expected), "leasehold {args:?}: {text}");
    }
    let (code, text) = run(&["status", "--key", "job"]);
    assert_eq!(code, Some(1), "freed by release --force: {text}");
    let (code, text) = run(&["cleanup", "--older-than", "0s"]);
    assert_eq!(code, Some(0), "{text}");
    f.drop_tables(&prefix);
}

/// Named statements, for connections straight to the server (`prepared_statements(true)`): the
/// lease statements, a replacement, the administration queries, the clock and batch renewals
/// all work, and a lease passes between a registry with them and one without.
#[test]
fn prepared_statements_work_straight_to_the_server() {
    let Some(f) = direct_fixture("prepareddirect") else {
        return;
    };
    let prepared = f
        .builder()
        .prepared_statements(true)
        .time_to_live(Duration::from_millis(600))
        .build()
        .unwrap();
    let unnamed = f.registry();
    let replacement = f
        .builder()
        .prepared_statements(true)
        .custom_sql(leasehold::CustomSql {
            renew: Some(unnamed.statements().renew.clone()),
            ..Default::default()
        })
        .build()
        .unwrap();
    for round in 0..3 {
        let guards: Vec<_> = (0..3)
            .map(|i| prepared.obtain(&format!("k{i}")).unwrap().lock().unwrap())
            .collect();
        guards[0].renew().unwrap();
        let holder = prepared.holder("k0").unwrap().expect("held");
        assert_eq!(
            holder.fencing_token,
            guards[0].fencing_token(),
            "round {round}"
        );
        assert_eq!(prepared.listing().page(None, 10).unwrap().len(), 3);
        assert!(unnamed.obtain("k1").unwrap().try_lock().unwrap().is_none());
        // Past two renewal periods: the three leases are renewed in batches.
        std::thread::sleep(Duration::from_millis(700));
        for guard in guards {
            assert!(guard.is_held(), "round {round}");
            guard.unlock().unwrap();
        }
        let taken = unnamed
            .obtain("k1")
            .unwrap()
            .try_lock()
            .unwrap()
            .expect("free");
        taken.unlock().unwrap();
        let custom = replacement.obtain("k2").unwrap().lock().unwrap();
        custom.renew().unwrap();
        custom.unlock().unwrap();
    }
    assert!(prepared.database_time().is_ok());
    assert!(
        prepared.statistics().renewals >= 3,
        "{:?}",
        prepared.statistics()
    );
}
