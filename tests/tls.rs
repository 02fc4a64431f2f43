//! TLS against the real servers, set up by `.ci/run`: a test CA and a server certificate for
//! `localhost` only (in `LEASEHOLD_TLS_DIR`, default `/var/lib/leasehold-tls`), TLS on in
//! PostgreSQL (127.0.0.1:5432) and MariaDB (127.0.0.1:3306), and users that may connect only
//! over TLS: `leasehold_tls` (password `leasehold_tls`; PostgreSQL `hostssl` +
//! `hostnossl … reject`, MariaDB `REQUIRE SSL`) and `leasehold_cert` (a client certificate,
//! `client.crt`/`client.key`; PostgreSQL `cert` authentication, MariaDB `REQUIRE SUBJECT`).
//! `other-ca.crt` is a CA that signed nothing the servers present.
//!
//! Without that setup a test fails under `CI=true` and is skipped otherwise, with a printed
//! reason. Every test makes its own tables (prefix `t<pid>_tls…_`) and drops them at the end.

#![cfg(any(feature = "postgres-tls", feature = "mysql-tls"))]

mod common;

use leasehold::{Error, LockRegistry, RegistryBuilder, TlsProblem};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(dead_code)] // one of them when only one database's TLS is built
enum Db {
    Postgres,
    Mysql,
}

/// The connect timeout of these registries: TLS failures must come back well before it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

static NEXT: AtomicU32 = AtomicU32::new(0);

/// One test's setup: the certificate directory, and a table prefix whose tables are dropped
/// when the test ends.
struct Tls {
    db: Db,
    dir: PathBuf,
    prefix: String,
}

impl Tls {
    /// The setup, after checking that the TLS-only user connects with full verification;
    /// `None` (printed) when it does not and `CI` is not set. Panics under `CI=true`.
    fn new(db: Db, test: &str) -> Option<Tls> {
        let dir = PathBuf::from(
            std::env::var("LEASEHOLD_TLS_DIR").unwrap_or_else(|_| "/var/lib/leasehold-tls".into()),
        );
        let tls = Tls {
            db,
            prefix: format!(
                "t{}_tls{}_",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ),
            dir,
        };
        let problem = if !tls.dir.join("ca.crt").is_file() {
            Some(format!(
                "no {} (run .ci/run, or set LEASEHOLD_TLS_DIR)",
                tls.dir.join("ca.crt").display()
            ))
        } else {
            match tls
                .builder(&tls.verified_url("localhost"))
                .create_table(true)
                .build()
            {
                Ok(_) => None,
                Err(e) => Some(format!(
                    "the TLS-only user cannot connect ({e}); .ci/run sets the servers up"
                )),
            }
        };
        match problem {
            None => Some(tls),
            Some(reason) => {
                common::skip_or_fail(&format!("{test} on {db:?} needs TLS but {reason}"));
                None
            }
        }
    }

    fn file(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// The TLS-only user's URL for `host`, with `params` (`&`-joined).
    fn url(&self, host: &str, params: &str) -> String {
        match self.db {
            Db::Postgres => {
                format!("postgres://leasehold_tls:leasehold_tls@{host}:5432/test?{params}")
            }
            Db::Mysql => format!("mysql://leasehold_tls:leasehold_tls@{host}:3306/test?{params}"),
        }
    }

    /// The TLS-only user's URL for `host` with full verification against the test CA.
    fn verified_url(&self, host: &str) -> String {
        let ca = self.file("ca.crt");
        match self.db {
            Db::Postgres => self.url(host, &format!("sslmode=verify-full&sslrootcert={ca}")),
            Db::Mysql => self.url(host, &format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}")),
        }
    }

    fn builder(&self, url: &str) -> RegistryBuilder {
        let builder = match self.db {
            #[cfg(feature = "postgres-tls")]
            Db::Postgres => LockRegistry::postgres(url),
            #[cfg(feature = "mysql-tls")]
            Db::Mysql => LockRegistry::mysql(url),
            #[allow(unreachable_patterns)]
            other => panic!("{other:?} TLS is not compiled in"),
        };
        builder
            .prefix(self.prefix.clone())
            .idle_between_tries(Duration::from_millis(20))
            .connect_timeout(CONNECT_TIMEOUT)
    }

    /// Builds a registry on `url` that must fail with a TLS error: its problem and message,
    /// after checking that it came back at once (TLS failures are not retried).
    fn refused(&self, url: &str) -> (TlsProblem, String) {
        let started = Instant::now();
        let built = self.builder(url).build();
        let took = started.elapsed();
        match built {
            Err(e @ Error::Tls { .. }) => {
                assert!(
                    took < CONNECT_TIMEOUT / 2,
                    "a TLS failure was retried: {took:?} for {e}"
                );
                let Error::Tls { problem, .. } = e else {
                    unreachable!()
                };
                println!("{url}\n  -> {e}");
                (problem, e.to_string())
            }
            Err(other) => panic!("expected Error::Tls for {url}, got {other} ({other:?})"),
            Ok(_) => panic!("expected Error::Tls for {url}, but the registry was built"),
        }
    }

    /// A lock taken and released on a registry built from `builder`.
    fn lock_and_unlock(&self, builder: RegistryBuilder) {
        let registry = builder.build().expect("registry over TLS");
        let lock = registry.obtain("tls-job").expect("lock");
        let guard = lock
            .try_lock_for(Duration::from_secs(5))
            .expect("acquire over TLS")
            .expect("the lock is free");
        assert!(guard.fencing_token() > 0);
        guard.unlock().expect("release over TLS");
    }
}

impl Drop for Tls {
    /// Drops this test's tables (and PostgreSQL's trigger functions) as the administrator.
    fn drop(&mut self) {
        let prefix = self.prefix.to_ascii_lowercase();
        match self.db {
            #[cfg(feature = "postgres-tls")]
            Db::Postgres => {
                let url = std::env::var("LEASEHOLD_POSTGRES_URL")
                    .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
                let Ok(mut client) = postgres::Client::connect(&url, postgres::NoTls) else {
                    return;
                };
                let sql = "SELECT format('DROP TABLE IF EXISTS %I.%I CASCADE', schemaname, \
                           tablename) FROM pg_tables WHERE left(tablename, length($1)) = $1 \
                           UNION ALL SELECT format('DROP FUNCTION IF EXISTS %s() CASCADE', \
                           oid::regproc) FROM pg_proc WHERE left(proname, length($1)) = $1";
                if let Ok(rows) = client.query(sql, &[&prefix]) {
                    for row in rows {
                        let _ = client.batch_execute(row.get::<_, &str>(0));
                    }
                }
            }
            #[cfg(feature = "mysql-tls")]
            Db::Mysql => {
                use mysql::prelude::Queryable;
                let url = std::env::var("LEASEHOLD_MYSQL_URL")
                    .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
                let Ok(mut conn) = mysql::Conn::new(mysql::Opts::from_url(&url).unwrap()) else {
                    return;
                };
                let tables: Vec<String> = conn
                    .exec(
                        "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = \
                         'test' AND LOWER(LEFT(TABLE_NAME, CHAR_LENGTH(?))) = ?",
                        (&prefix, &prefix),
                    )
                    .unwrap_or_default();
                for table in tables {
                    let _ = conn.query_drop(format!("DROP TABLE IF EXISTS test.`{table}`"));
                }
            }
            #[allow(unreachable_patterns)]
            _ => {}
        }
    }
}

/// One `#[test]` per check of module `$checks`, on database `$db`.
macro_rules! tls_tests {
    ($feature:literal, $db:ident, $checks:ident: $($name:ident),* $(,)?) => {
        $(
            #[cfg(feature = $feature)]
            #[test]
            fn $name() {
                if let Some(tls) = Tls::new(Db::$db, stringify!($name)) {
                    $checks::$name(&tls);
                }
            }
        )*
    };
}

tls_tests!("postgres-tls", Postgres, postgres_checks:
    postgres_tls_only_user_locks_with_verify_full,
    postgres_listener_connects_over_tls,
    postgres_wrong_host_name_is_refused,
    postgres_unknown_ca_is_refused,
    postgres_sslmode_disable_is_refused_for_tls_only_user,
    postgres_other_modes_connect,
    postgres_client_certificate,
);

tls_tests!("mysql-tls", Mysql, mysql_checks:
    mysql_tls_only_user_locks_with_verify_identity,
    mysql_wrong_host_name_is_refused,
    mysql_unknown_ca_is_refused,
    mysql_ssl_mode_disabled_is_refused_for_tls_only_user,
    mysql_other_modes_connect,
    mysql_client_certificate,
);

#[cfg(feature = "postgres-tls")]
mod postgres_checks {
    use super::*;

    /// The TLS-only user connects with `verify-full` (URL and key=value forms) and locks.
    pub(super) fn postgres_tls_only_user_locks_with_verify_full(tls: &Tls) {
        tls.lock_and_unlock(tls.builder(&tls.verified_url("localhost")));
        let key_value = format!(
            "host=localhost port=5432 dbname=test user=leasehold_tls password=leasehold_tls \
             sslmode=verify-full sslrootcert='{}'",
            tls.file("ca.crt")
        );
        tls.lock_and_unlock(tls.builder(&key_value));
    }

    /// The release listener's connection is encrypted like the pools' (the TLS-only user could not
    /// open it otherwise): a release by one registry wakes a waiter of another at once, although
    /// that waiter would poll only every 30 s.
    pub(super) fn postgres_listener_connects_over_tls(tls: &Tls) {
        let url = tls.verified_url("localhost");
        let holder = tls.builder(&url).build().expect("holder");
        let waiter = tls
            .builder(&url)
            .idle_between_tries(Duration::from_secs(30))
            .build()
            .expect("waiter");
        let guard = holder
            .obtain("handoff")
            .unwrap()
            .try_lock_for(Duration::from_secs(5))
            .unwrap()
            .expect("free");
        let waiting = std::thread::spawn(move || {
            let lock = waiter.obtain("handoff").unwrap();
            let started = Instant::now();
            let granted = lock.try_lock_for(Duration::from_secs(20)).unwrap();
            let took = started.elapsed();
            drop(granted.expect("granted after the release"));
            took
        });
        std::thread::sleep(Duration::from_millis(1500));
        guard.unlock().unwrap();
        let took = waiting.join().unwrap();
        assert!(
            took < Duration::from_secs(10),
            "the waiter took {took:?}: it was not woken by a notification (listener over TLS)"
        );
    }

    /// `verify-full` against 127.0.0.1, which the certificate (for `localhost`) does not name.
    pub(super) fn postgres_wrong_host_name_is_refused(tls: &Tls) {
        let (problem, message) = tls.refused(&tls.verified_url("127.0.0.1"));
        assert_eq!(problem, TlsProblem::HostName, "{message}");
        for part in ["127.0.0.1", "localhost", "sslmode=verify-ca"] {
            assert!(message.contains(part), "{part} missing from: {message}");
        }
    }

    /// A CA that did not sign the server's certificate, given or built in.
    pub(super) fn postgres_unknown_ca_is_refused(tls: &Tls) {
        let other = tls.file("other-ca.crt");
        let url = tls.url(
            "localhost",
            &format!("sslmode=verify-full&sslrootcert={other}"),
        );
        let (problem, message) = tls.refused(&url);
        assert_eq!(problem, TlsProblem::UnknownIssuer, "{message}");
        assert!(
            message.contains("sslrootcert") && message.contains(&other),
            "{message}"
        );
        // Without sslrootcert: the built-in Mozilla roots, which do not hold the test CA.
        let (problem, message) = tls.refused(&tls.url("localhost", "sslmode=verify-full"));
        assert_eq!(problem, TlsProblem::UnknownIssuer, "{message}");
        assert!(message.contains("webpki-roots"), "{message}");
    }

    /// `sslmode=disable` for a user that `pg_hba.conf` admits only over TLS.
    pub(super) fn postgres_sslmode_disable_is_refused_for_tls_only_user(tls: &Tls) {
        let (problem, message) = tls.refused(&tls.url("localhost", "sslmode=disable"));
        assert_eq!(problem, TlsProblem::Required, "{message}");
        assert!(
            message.contains("only over TLS") && message.contains("sslmode=verify-full"),
            "{message}"
        );
    }

    /// `verify-ca` skips the host name; `require` and `prefer` (the default) encrypt without
    /// verifying; a user admitted without TLS still connects with `sslmode=disable`.
    pub(super) fn postgres_other_modes_connect(tls: &Tls) {
        let ca = tls.file("ca.crt");
        for url in [
            tls.url("127.0.0.1", &format!("sslmode=verify-ca&sslrootcert={ca}")),
            tls.url("127.0.0.1", "sslmode=require"),
            tls.url("127.0.0.1", "application_name=leasehold-tls-test"),
        ] {
            tls.builder(&url)
                .build()
                .unwrap_or_else(|e| panic!("{url}: {e}"));
        }
        let plain = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable";
        tls.builder(plain)
            .create_table(true)
            .build()
            .unwrap_or_else(|e| panic!("{plain}: {e}"));
        // Settings that cannot work are named before anything connects.
        for (url, setting) in [
            (tls.url("localhost", "sslmode=verify"), "sslmode"),
            (
                tls.url(
                    "localhost",
                    "sslmode=verify-full&sslrootcert=/nonexistent/ca.crt",
                ),
                "sslrootcert",
            ),
            (tls.url("localhost", "sslcrl=/crl.pem"), "sslcrl"),
        ] {
            match tls.builder(&url).build() {
                Err(e @ Error::InvalidSetting { .. }) => {
                    assert!(e.to_string().contains(setting), "{e}")
                }
                other => panic!("{url}: expected InvalidSetting, got {:?}", other.err()),
            }
        }
    }

    /// The certificate-only user connects with `sslcert`/`sslkey` (key=value form), and is
    /// refused without them.
    pub(super) fn postgres_client_certificate(tls: &Tls) {
        let (ca, cert, key) = (
            tls.file("ca.crt"),
            tls.file("client.crt"),
            tls.file("client.key"),
        );
        let with_cert = format!(
            "host=localhost port=5432 dbname=test user=leasehold_cert sslmode=verify-full \
             sslrootcert={ca} sslcert={cert} sslkey={key}"
        );
        // A table of its own: the one Tls::new made belongs to leasehold_tls.
        let own = format!("{}cert_", tls.prefix);
        tls.lock_and_unlock(tls.builder(&with_cert).prefix(own).create_table(true));
        let without = format!(
            "host=localhost port=5432 dbname=test user=leasehold_cert sslmode=verify-full \
             sslrootcert={ca}"
        );
        let (problem, message) = tls.refused(&without);
        assert_eq!(problem, TlsProblem::Handshake, "{message}");
        assert!(message.contains("sslcert"), "{message}");
    }
}

#[cfg(feature = "mysql-tls")]
mod mysql_checks {
    use super::*;

    /// The TLS-only user connects with `VERIFY_IDENTITY` (and `require_ssl=true`) and locks.
    pub(super) fn mysql_tls_only_user_locks_with_verify_identity(tls: &Tls) {
        tls.lock_and_unlock(tls.builder(&tls.verified_url("localhost")));
        let ca = tls.file("ca.crt");
        tls.lock_and_unlock(
            tls.builder(&tls.url("localhost", &format!("require_ssl=true&ssl_ca={ca}"))),
        );
    }

    /// `VERIFY_IDENTITY` against 127.0.0.1, which the certificate (for `localhost`) does not name.
    pub(super) fn mysql_wrong_host_name_is_refused(tls: &Tls) {
        let (problem, message) = tls.refused(&tls.verified_url("127.0.0.1"));
        assert_eq!(problem, TlsProblem::HostName, "{message}");
        for part in ["127.0.0.1", "localhost", "ssl-mode=VERIFY_CA"] {
            assert!(message.contains(part), "{part} missing from: {message}");
        }
    }

    /// A CA that did not sign the server's certificate.
    pub(super) fn mysql_unknown_ca_is_refused(tls: &Tls) {
        let other = tls.file("other-ca.crt");
        let url = tls.url(
            "localhost",
            &format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={other}"),
        );
        let (problem, message) = tls.refused(&url);
        assert_eq!(problem, TlsProblem::UnknownIssuer, "{message}");
        assert!(
            message.contains("ssl-ca") && message.contains(&other),
            "{message}"
        );
    }

    /// `ssl-mode=DISABLED` for an account created `REQUIRE SSL`.
    pub(super) fn mysql_ssl_mode_disabled_is_refused_for_tls_only_user(tls: &Tls) {
        let (problem, message) = tls.refused(&tls.url("127.0.0.1", "ssl-mode=DISABLED"));
        assert_eq!(problem, TlsProblem::Required, "{message}");
        assert!(
            message.contains("only over TLS") && message.contains("ssl-mode=VERIFY_IDENTITY"),
            "{message}"
        );
        // A wrong password is still reported as one, not as a TLS problem.
        let wrong = "mysql://leasehold_tls:wrong@127.0.0.1:3306/test?ssl-mode=DISABLED";
        match tls.builder(wrong).build() {
            Err(e @ Error::Database { .. }) => assert!(e.to_string().contains("password"), "{e}"),
            other => panic!("expected Error::Database, got {:?}", other.err()),
        }
    }

    /// `VERIFY_CA` skips the host name; `REQUIRED` and `PREFERRED` (the default) encrypt without
    /// verifying; root, admitted without TLS, still connects with `ssl-mode=DISABLED`.
    pub(super) fn mysql_other_modes_connect(tls: &Tls) {
        let ca = tls.file("ca.crt");
        for url in [
            tls.url("127.0.0.1", &format!("ssl-mode=VERIFY_CA&ssl-ca={ca}")),
            tls.url("127.0.0.1", "ssl-mode=REQUIRED"),
            tls.url("127.0.0.1", "stmt_cache_size=16"),
        ] {
            tls.builder(&url)
                .build()
                .unwrap_or_else(|e| panic!("{url}: {e}"));
        }
        let plain = "mysql://root@127.0.0.1:3306/test?ssl-mode=DISABLED";
        tls.builder(plain)
            .create_table(true)
            .build()
            .unwrap_or_else(|e| panic!("{plain}: {e}"));
        for (url, setting) in [
            (tls.url("localhost", "ssl-mode=SOMETIMES"), "ssl-mode"),
            (
                tls.url("localhost", "ssl-mode=VERIFY_CA&ssl-ca=/nonexistent/ca.crt"),
                "ssl-ca",
            ),
        ] {
            match tls.builder(&url).build() {
                Err(e @ Error::InvalidSetting { .. }) => {
                    assert!(e.to_string().contains(setting), "{e}")
                }
                other => panic!("{url}: expected InvalidSetting, got {:?}", other.err()),
            }
        }
    }

    /// The certificate-only account (`REQUIRE SUBJECT`) connects with `ssl-cert`/`ssl-key`.
    pub(super) fn mysql_client_certificate(tls: &Tls) {
        let (ca, cert, key) = (
            tls.file("ca.crt"),
            tls.file("client.crt"),
            tls.file("client.key"),
        );
        let url = format!(
            "mysql://leasehold_cert@localhost:3306/test?ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}\
             &ssl-cert={cert}&ssl-key={key}"
        );
        tls.lock_and_unlock(tls.builder(&url).create_table(true));
        let without = format!(
            "mysql://leasehold_cert@localhost:3306/test?ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}"
        );
        assert!(tls.builder(&without).build().is_err());
    }
}
