//! MySQL/MariaDB: triggers on the lock table. An `AFTER INSERT`/`AFTER UPDATE` trigger that
//! writes an audit row into an `AUTO_INCREMENT` table hides the insert id through which the
//! acquire statement reports its token; every grant was reported refused while its row was
//! written. Grants must be recognised from the row written, with the row's token.

#![cfg(feature = "mysql")]

mod common;

use common::{Db, Fixture};
use leasehold::LockRegistry;
use mysql::prelude::Queryable;

/// The test's table with an audit table and audit triggers beside it (dropped at the end).
struct Audited {
    f: Fixture,
    conn: mysql::Conn,
}

impl Audited {
    fn new(test: &str) -> Option<Audited> {
        let f = Fixture::new(Db::Mysql, test)?;
        let conn = mysql::Conn::new(mysql::Opts::from_url(&common::mysql_url()).unwrap()).unwrap();
        let mut audited = Audited { f, conn };
        let audit = audited.audit_table();
        audited
            .conn
            .query_drop(format!(
                "CREATE TABLE {audit} (ID BIGINT AUTO_INCREMENT PRIMARY KEY, \
                 WHAT VARCHAR(10) NOT NULL, LOCK_KEY CHAR(36), CLIENT_ID CHAR(36), \
                 FENCING_TOKEN BIGINT) ENGINE = InnoDB"
            ))
            .unwrap();
        Some(audited)
    }

    fn audit_table(&self) -> String {
        format!("{}AUDIT", self.f.prefix)
    }

    /// Creates the audit triggers on the lock table.
    fn add_triggers(&mut self) {
        let (table, audit) = (self.f.table(), self.audit_table());
        for (event, what) in [("INSERT", "insert"), ("UPDATE", "update")] {
            self.conn
                .query_drop(format!(
                    "CREATE TRIGGER {table}_AUDIT_{event} AFTER {event} ON {table} \
                     FOR EACH ROW INSERT INTO {audit} (WHAT, LOCK_KEY, CLIENT_ID, FENCING_TOKEN) \
                     VALUES ('{what}', NEW.LOCK_KEY, NEW.CLIENT_ID, NEW.FENCING_TOKEN)"
                ))
                .unwrap();
        }
    }

    /// Creates triggers that set `LAST_INSERT_ID` themselves: if their value leaked out of
    /// them, a held lock would look granted.
    fn add_id_setting_triggers(&mut self) {
        let table = self.f.table();
        for event in ["INSERT", "UPDATE"] {
            self.conn
                .query_drop(format!(
                    "CREATE TRIGGER {table}_SETS_ID_{event} AFTER {event} ON {table} \
                     FOR EACH ROW SET @leasehold_test = LAST_INSERT_ID(42)"
                ))
                .unwrap();
        }
    }

    /// `CLIENT_ID` and `FENCING_TOKEN` of `key`'s row.
    fn row(&mut self, key: &str) -> (Option<String>, i64) {
        self.conn
            .exec_first(
                format!(
                    "SELECT CLIENT_ID, FENCING_TOKEN FROM {} WHERE LOCK_KEY = ?",
                    self.f.table()
                ),
                (leasehold::lock_key_for(key),),
            )
            .unwrap()
            .expect("the row exists")
    }

    /// Makes `key`'s row held by someone else whose lease has expired.
    fn expire_to_stranger(&mut self, key: &str) {
        self.conn
            .exec_drop(
                format!(
                    "UPDATE {} SET CLIENT_ID = 'a-stranger', \
                     EXPIRED_AFTER = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE LOCK_KEY = ?",
                    self.f.table()
                ),
                (leasehold::lock_key_for(key),),
            )
            .unwrap();
    }

    /// Audit rows written so far: (inserts, updates).
    fn audited(&mut self) -> (i64, i64) {
        self.conn
            .query_first(format!(
                "SELECT CAST(COALESCE(SUM(WHAT = 'insert'), 0) AS SIGNED), \
                 CAST(COALESCE(SUM(WHAT = 'update'), 0) AS SIGNED) FROM {}",
                self.audit_table()
            ))
            .unwrap()
            .unwrap()
    }

    /// Takes `key` in `registry`: asserts that it is granted, with the row's token, and the row
    /// names the registry. Returns the guard and the token.
    fn granted(
        &mut self,
        registry: &LockRegistry,
        key: &str,
        what: &str,
    ) -> (leasehold::LockGuard, i64) {
        let guard = registry
            .obtain(key)
            .unwrap()
            .try_lock()
            .unwrap()
            .unwrap_or_else(|| panic!("{what}: reported not granted"));
        let token = i64::try_from(guard.fencing_token()).unwrap();
        let (client, row_token) = self.row(key);
        assert_eq!(row_token, token, "{what}: the row's token is the guard's");
        assert_eq!(
            client.as_deref(),
            Some(registry.client_id()),
            "{what}: the row names the holder"
        );
        (guard, token)
    }
}

impl Drop for Audited {
    fn drop(&mut self) {
        let _ = self
            .conn
            .query_drop(format!("DROP TABLE IF EXISTS {}", self.audit_table()));
    }
}

#[test]
fn under_audit_triggers_every_grant_is_recognised_with_the_rows_token() {
    let Some(mut t) = Audited::new("audit_grants") else {
        return;
    };
    t.add_triggers();
    t.add_id_setting_triggers();
    let (a, b) = (t.f.registry(), t.f.registry());
    let (guard, first) = t.granted(&a, "job", "the first insert");
    assert!(
        b.obtain("job").unwrap().try_lock().unwrap().is_none(),
        "a second registry is refused while the lock is held"
    );
    assert_eq!(t.row("job"), (Some(a.client_id().to_string()), first));
    guard.unlock().unwrap();
    let (guard, again) = t.granted(&b, "job", "a grant after the release");
    assert!(again > first, "tokens rise: {first} then {again}");
    assert!(
        a.obtain("job").unwrap().try_lock().unwrap().is_none(),
        "the first registry is refused while the second holds"
    );
    guard.unlock().unwrap();
    t.expire_to_stranger("job");
    let (guard, taken) = t.granted(&a, "job", "a takeover after expiry");
    assert!(taken > again, "tokens rise: {again} then {taken}");
    guard.unlock().unwrap();
    let (inserts, updates) = t.audited();
    assert_eq!(inserts, 1, "the trigger saw the insert");
    assert!(updates >= 3, "the trigger saw {updates} updates");
}

#[test]
fn a_trigger_created_after_build_is_noticed_at_the_first_takeover() {
    let Some(mut t) = Audited::new("audit_later") else {
        return;
    };
    let a = t.f.registry();
    let (guard, first) = t.granted(&a, "job", "the first insert, before any trigger");
    guard.unlock().unwrap();
    t.add_triggers();
    t.expire_to_stranger("job");
    let (guard, taken) = t.granted(&a, "job", "a takeover under the new trigger");
    assert!(taken > first, "tokens rise: {first} then {taken}");
    guard.unlock().unwrap();
    // Noticed: now an insert under the trigger is recognised too.
    let (guard, _) = t.granted(&a, "another", "an insert after the takeover");
    guard.unlock().unwrap();
    assert_eq!(t.audited().0, 1, "the trigger saw the insert");
}

/// A registry that has not seen a trigger looks at the table's triggers again, at most every
/// 5 s, when an acquire reports no id: an insert under a trigger created while it runs is
/// recognised once that look is due, without waiting for a takeover.
#[test]
fn a_trigger_created_after_build_is_found_by_a_later_look() {
    let Some(mut t) = Audited::new("audit_look") else {
        return;
    };
    let a = t.f.registry();
    t.add_triggers();
    // The look made by build() is older than 5 s.
    std::thread::sleep(std::time::Duration::from_millis(5_500));
    let (guard, _) = t.granted(&a, "job", "an insert under a trigger created after build");
    guard.unlock().unwrap();
    assert_eq!(t.audited().0, 1, "the trigger saw the insert");
}
