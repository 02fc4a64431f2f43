//! Property tests: the key mapping, and input validation that accepts exactly what the docs say
//! and never panics.
//!
//! The oracles here are written from the specifications, not from the library: the MD5 name
//! UUID is computed byte by byte, Java's lenient `UUID.fromString` is modelled from the JDK's
//! documented parsing, and Spring Integration's own test (since 6.2, `UUIDConverter`) is the
//! canonical 8-4-4-4-12 pattern of ASCII hex digits.

use md5::{Digest, Md5};
use proptest::prelude::*;

/// `cases` cases, without writing regression files into the source tree.
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::with_cases(cases)
    }
}

/// `UUID.nameUUIDFromBytes`: MD5, version 3, IETF variant, lower-case hyphenated.
fn md5_name_uuid(text: &str) -> String {
    let mut bytes: [u8; 16] = Md5::digest(text.as_bytes()).into();
    bytes[6] = (bytes[6] & 0x0f) | 0x30;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Spring Integration's `UUIDConverter` test (6.2 and later): exactly 8-4-4-4-12 ASCII hex
/// digits.
fn is_canonical_uuid(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(group, len)| group.len() == len && group.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Whether Java's `UUID.fromString` (JDK 9+) accepts `text`, for text whose only digits are
/// ASCII (Java's `Character.digit` also takes other Unicode digits; the generators below avoid
/// them). At most 36 UTF-16 units, exactly four dashes, five groups each parsed by
/// `Long.parseLong(group, 16)`: an optional sign, at least one hex digit, within `long` range.
fn java_accepts(text: &str) -> bool {
    if text.encode_utf16().count() > 36 {
        return false;
    }
    let groups: Vec<&str> = text.split('-').collect();
    groups.len() == 5 && groups.iter().all(|group| java_parses_hex_long(group))
}

fn java_parses_hex_long(group: &str) -> bool {
    let (negative, digits) = match group.as_bytes().first() {
        Some(b'+') => (false, &group[1..]),
        Some(b'-') => (true, &group[1..]),
        Some(_) => (false, group),
        None => return false,
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return false;
    }
    let significant = digits.trim_start_matches('0');
    let limit = if negative {
        "8000000000000000"
    } else {
        "7fffffffffffffff"
    };
    significant.len() < 16
        || (significant.len() == 16 && significant.to_ascii_lowercase().as_str() <= limit)
}

fn is_lower_case_uuid(text: &str) -> bool {
    text.len() == 36
        && text.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_digit() || ('a'..='f').contains(&c),
        })
}

/// Strings without non-ASCII digits (see [`java_accepts`]).
fn no_unicode_digits(text: &str) -> bool {
    text.chars()
        .all(|c| c.is_ascii() || !(c.is_numeric() || ('\u{ff21}'..='\u{ff5a}').contains(&c)))
}

/// Keys that look like UUIDs to a lenient parser: five dash-separated groups of hex digits,
/// some signed, of any length, in any case.
fn uuid_like() -> impl Strategy<Value = String> {
    let group = ("[+-]?", "[0-9a-fA-F]{0,13}").prop_map(|(sign, digits)| sign + &digits);
    proptest::collection::vec(group, 4..=6).prop_map(|groups| groups.join("-"))
}

/// Canonical UUID strings, in mixed case.
fn canonical() -> impl Strategy<Value = String> {
    "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
}

/// Any key: arbitrary Unicode, short ASCII, dashes and hex, and UUID-like shapes.
fn any_key() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[ -~]{0,40}",
        "[0-9a-fA-F+-]{0,40}",
        "[\\x00é日🔒a-f0-9-]{0,36}",
        uuid_like(),
        canonical(),
    ]
}

proptest! {
    #![proptest_config(config(2000))]

    #[test]
    fn lock_keys_are_deterministic_lower_case_uuids(key in any_key()) {
        let mapped = leasehold::lock_key_for(&key);
        prop_assert!(is_lower_case_uuid(&mapped), "{key:?} -> {mapped:?}");
        prop_assert_eq!(&mapped, &leasehold::lock_key_for(&key));
        prop_assert_eq!(&mapped, &leasehold::lock_key_for(&key.clone()));
    }

    /// The property: a key Java cannot parse as a UUID gets the MD5 name UUID.
    #[test]
    fn keys_java_cannot_parse_map_to_their_md5_name_uuid(
        key in any_key().prop_filter("ASCII digits only", |k| no_unicode_digits(k))
    ) {
        prop_assume!(!java_accepts(&key));
        prop_assert_eq!(leasehold::lock_key_for(&key), md5_name_uuid(&key), "key {:?}", key);
    }

    /// Spring Integration 6.2+ (`UUIDConverter`, the version whose table layout leasehold
    /// uses) parses only canonical UUID strings; every other key — including ones Java's
    /// lenient `UUID.fromString` would accept, such as `1-2-3-4-5` — gets the MD5 name UUID.
    #[test]
    fn keys_that_are_not_canonical_uuids_map_to_their_md5_name_uuid(key in any_key()) {
        prop_assume!(!is_canonical_uuid(&key));
        prop_assert_eq!(leasehold::lock_key_for(&key), md5_name_uuid(&key), "key {:?}", key);
    }

    #[test]
    fn canonical_uuid_keys_map_to_themselves_in_lower_case(key in canonical()) {
        prop_assert_eq!(leasehold::lock_key_for(&key), key.to_ascii_lowercase());
    }
}

/// Values printed by Spring Integration's rule (`UUIDConverter.getUUID`: canonical pattern, then
/// `UUID.fromString`, else `UUID.nameUUIDFromBytes`) on OpenJDK 17.
#[test]
fn non_canonical_uuid_like_keys_match_spring() {
    for (key, spring) in [
        ("1-2-3-4-5", "601bcbd1-2379-33a0-bbcb-ad773954109d"),
        ("+a-b-c-d-e", "3b4e17ad-c53d-3507-87b0-1262bf70772b"),
        ("-1-2-3-4-5", "fabc4ac1-bc32-390f-93da-884bbb495929"),
        (
            "\u{661}-\u{662}-\u{663}-\u{664}-\u{665}",
            "8eb89d8c-4f7f-3b09-839d-c07f4249df0d",
        ),
        (
            "ACBD18DB-4CC2-385C-ADEF-654FCCC4A4D8",
            "acbd18db-4cc2-385c-adef-654fccc4a4d8",
        ),
    ] {
        assert_eq!(leasehold::lock_key_for(key), spring, "key {key:?}");
    }
}

#[test]
fn the_oracles_agree_with_known_values() {
    assert_eq!(md5_name_uuid("foo"), "acbd18db-4cc2-385c-adef-654fccc4a4d8");
    assert!(java_accepts("1-2-3-4-5"));
    assert!(java_accepts("+a-b-c-d-e"));
    assert!(java_accepts("+7fffffffffffffff-0-0-0-0"));
    assert!(java_accepts("00000000000000000001-0-0-0-0"));
    assert!(!java_accepts("+8000000000000000-0-0-0-0"));
    assert!(!java_accepts("-1-2-3-4-5"));
    assert!(!java_accepts("1-2-3-4"));
    assert!(!java_accepts("12345678123456781-2-3-4-5"));
    assert!(is_canonical_uuid("ACBD18DB-4CC2-385C-ADEF-654FCCC4A4D8"));
    assert!(!is_canonical_uuid("1-2-3-4-5"));
    assert!(!no_unicode_digits("\u{661}"));
}

/// Validation through a real registry, on SQLite (no server needed).
#[cfg(feature = "sqlite")]
mod validation {
    use leasehold::{Error, LockRegistry, MAX_KEY_BYTES, MAX_PREFIX_CHARS};
    use proptest::prelude::*;
    use std::sync::OnceLock;
    use std::time::Duration;

    /// One database file and registry for the whole module.
    fn shared() -> &'static (tempfile::TempDir, LockRegistry) {
        static SHARED: OnceLock<(tempfile::TempDir, LockRegistry)> = OnceLock::new();
        SHARED.get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let registry = LockRegistry::sqlite(dir.path().join("locks.db"))
                .create_table(true)
                .tuning(leasehold::Tuning {
                    cache_capacity: 64,
                    ..Default::default()
                })
                .build()
                .unwrap();
            (dir, registry)
        })
    }

    fn path() -> std::path::PathBuf {
        shared().0.path().join("locks.db")
    }

    fn is_setting(result: &Result<LockRegistry, Error>, name: &str) -> bool {
        matches!(result, Err(Error::InvalidSetting { setting, .. }) if *setting == name)
    }

    /// The documented prefix rule: letters, digits and `_`, not starting with a digit,
    /// optionally `schema.` first, at most `MAX_PREFIX_CHARS` characters.
    fn prefix_is_documented_valid(prefix: &str) -> bool {
        let identifier = |part: &str| {
            let mut chars = part.chars();
            chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        };
        let (schema, name) = match prefix.split_once('.') {
            Some((schema, name)) => (Some(schema), name),
            None => (None, prefix),
        };
        prefix.chars().count() <= MAX_PREFIX_CHARS
            && schema.is_none_or(identifier)
            && (name.is_empty() || identifier(name))
    }

    fn prefixes() -> impl Strategy<Value = String> {
        prop_oneof![
            "[A-Za-z_][A-Za-z0-9_]{0,70}",
            "([A-Za-z_][A-Za-z0-9_]{0,8}\\.)?[A-Za-z0-9_;\\- .\"'`]{0,20}",
            "[a-z0-9_.;\\- ]{0,12}",
            any::<String>(),
        ]
    }

    /// Keys around the byte limit, in ASCII and in multi-byte characters.
    fn keys_near_the_limit() -> impl Strategy<Value = String> {
        prop_oneof![
            (0usize..=1100).prop_map(|n| "k".repeat(n)),
            (0usize..=300).prop_map(|n| "日".repeat(n)),
            (1000usize..=1030, any::<char>()).prop_map(|(n, c)| "k".repeat(n) + &c.to_string()),
            any::<String>(),
        ]
    }

    proptest! {
        #![proptest_config(super::config(200))]

        #[test]
        fn keys_of_1_to_1024_bytes_are_accepted_and_others_refused(key in keys_near_the_limit()) {
            let obtained = shared().1.obtain(&key);
            let valid = (1..=MAX_KEY_BYTES).contains(&key.len());
            match obtained {
                Ok(lock) => {
                    prop_assert!(valid, "{} bytes accepted", key.len());
                    prop_assert_eq!(lock.key(), key.as_str());
                }
                Err(Error::InvalidKey { .. }) => prop_assert!(!valid, "{} bytes refused", key.len()),
                Err(other) => prop_assert!(false, "unexpected error {other}"),
            }
        }

        #[test]
        fn prefixes_are_accepted_exactly_when_they_follow_the_documented_rule(
            prefix in prefixes()
        ) {
            let built = LockRegistry::sqlite(path())
                .prefix(prefix.clone())
                .create_table(true)
                .build();
            let valid = prefix_is_documented_valid(&prefix);
            prop_assert_eq!(!is_setting(&built, "prefix"), valid, "{:?}: {:?}", prefix, built.as_ref().err());
            let reserved = prefix.to_ascii_lowercase().starts_with("sqlite_");
            if valid && reserved {
                // SQLite keeps `sqlite_*` names for itself: a typed database error, no panic.
                prop_assert!(matches!(built, Err(Error::Database { .. })), "{:?}", built.err());
            } else if valid && !prefix.contains('.') {
                // SQLite has no schemas to create; every other valid prefix names a usable table.
                let registry = built.unwrap();
                prop_assert_eq!(registry.table(), format!("{prefix}LOCK"));
                let guard = registry.obtain("p").unwrap().try_lock().unwrap();
                prop_assert!(guard.is_some());
            }
        }

        #[test]
        fn regions_of_1_to_100_characters_are_accepted(region in "\\PC{0,110}") {
            let built = LockRegistry::sqlite(path()).region(region.clone()).build();
            let valid = (1..=leasehold::MAX_REGION_CHARS).contains(&region.chars().count());
            prop_assert_eq!(!is_setting(&built, "region"), valid);
            if valid {
                let registry = built.unwrap();
                let key = format!("region-{}", region.len());
                let guard = registry.obtain(&key).unwrap().try_lock().unwrap();
                prop_assert!(guard.is_some(), "held in a fresh region {region:?}");
            }
        }

        #[test]
        fn client_ids_are_1_to_36_printable_ascii(client_id in prop_oneof!["[!-~]{0,40}", "\\PC{0,40}"]) {
            let built = LockRegistry::sqlite(path()).client_id(client_id.clone()).build();
            let valid = (1..=36).contains(&client_id.len())
                && client_id.bytes().all(|b| b.is_ascii_graphic());
            prop_assert_eq!(!is_setting(&built, "client_id"), valid);
            prop_assert_eq!(built.is_ok(), valid, "{:?}", built.err());
        }

        #[test]
        fn time_to_live_is_accepted_within_its_documented_range(
            micros in prop_oneof![0u64..20_000, 0u64..=u64::MAX, 604_799_000_000u64..604_801_000_000]
        ) {
            let ttl = Duration::from_micros(micros);
            let valid = (leasehold::MIN_TIME_TO_LIVE..=leasehold::MAX_TIME_TO_LIVE).contains(&ttl);
            let built = LockRegistry::sqlite(path()).time_to_live(ttl).build();
            prop_assert_eq!(built.is_ok(), valid, "{:?}: {:?}", ttl, built.as_ref().err());
            prop_assert_eq!(!is_setting(&built, "time_to_live"), valid);
            let lock = shared().1.obtain("ttl").unwrap();
            match lock.try_lock_with_ttl(ttl) {
                Ok(Some(guard)) => {
                    prop_assert!(valid, "{ttl:?} accepted per call");
                    prop_assert!(guard.remaining() <= ttl);
                    // A lease of a few milliseconds may run out before unlock() on a busy
                    // machine; that is the lease working, not the setting being refused.
                    match guard.unlock() {
                        Ok(()) => {}
                        Err(lost) if lost.is_lease_lost() && ttl < Duration::from_secs(1) => {}
                        Err(other) => prop_assert!(false, "unlock with {ttl:?}: {other}"),
                    }
                }
                // Likewise a grant of a few milliseconds may arrive after it ran out (or the
                // row of the previous case's lost lease may not have expired yet): not a grant.
                Ok(None) => prop_assert!(ttl < Duration::from_secs(1), "the lock is free"),
                Err(Error::InvalidSetting { .. }) => prop_assert!(!valid, "{ttl:?} refused per call"),
                Err(other) => prop_assert!(false, "unexpected error {other}"),
            }
        }

        #[test]
        fn idle_between_tries_is_accepted_from_1ms_to_an_hour(
            micros in prop_oneof![0u64..2_000, 0u64..=u64::MAX, 3_599_000_000u64..3_601_000_000]
        ) {
            let idle = Duration::from_micros(micros);
            let valid = (Duration::from_millis(1)..=leasehold::MAX_IDLE_BETWEEN_TRIES).contains(&idle);
            let built = LockRegistry::sqlite(path()).idle_between_tries(idle).build();
            prop_assert_eq!(built.is_ok(), valid, "{:?}: {:?}", idle, built.as_ref().err());
        }
    }
}

mod common;

/// Lock tables of the right shape but wrong column types (or no primary key), made from the
/// shipped DDL with one change each: a registry on one either refuses with a typed error, or
/// works and still never grants one lock to two instances. Nothing panics.
mod suite {
    use crate::common::{Db, Fixture};
    use leasehold::LockRegistry;

    /// (what is wrong, the shipped DDL's text, its replacement) for `db`.
    fn variants(db: Db) -> Vec<(&'static str, String, String)> {
        let timestamp = match db {
            Db::Mysql => "DATETIME(6)",
            _ => "TIMESTAMP",
        };
        let expiry = format!("EXPIRED_AFTER {timestamp} NOT NULL");
        let change = |what, from: &str, to: &str| (what, from.to_string(), to.to_string());
        vec![
            change(
                "token as text",
                "FENCING_TOKEN BIGINT NOT NULL DEFAULT 0",
                "FENCING_TOKEN VARCHAR(30) NOT NULL DEFAULT '0'",
            ),
            change(
                "expiry as integer",
                &expiry,
                "EXPIRED_AFTER BIGINT NOT NULL",
            ),
            change(
                "expiry as short text",
                &expiry,
                "EXPIRED_AFTER VARCHAR(10) NOT NULL",
            ),
            change("key as integer", "LOCK_KEY CHAR(36)", "LOCK_KEY BIGINT"),
            change("key too short", "LOCK_KEY CHAR(36)", "LOCK_KEY CHAR(8)"),
            change(
                "client as integer",
                "CLIENT_ID CHAR(36)",
                "CLIENT_ID BIGINT",
            ),
            change(
                "no primary key",
                ",\n    CONSTRAINT INT_LOCK_PK PRIMARY KEY (LOCK_KEY, REGION)",
                "",
            ),
        ]
    }

    fn shipped_ddl(db: Db) -> &'static str {
        match db {
            Db::Sqlite => include_str!("../sql/sqlite.sql"),
            Db::Postgres => include_str!("../sql/postgres.sql"),
            Db::Mysql => include_str!("../sql/mysql.sql"),
        }
    }

    /// Runs DDL on the fixture's database with the driver directly.
    fn execute(f: &Fixture, ddl: &str) {
        match f.db {
            #[cfg(feature = "sqlite")]
            Db::Sqlite => rusqlite::Connection::open(f.sqlite_path())
                .unwrap()
                .execute_batch(ddl)
                .unwrap(),
            #[cfg(feature = "postgres")]
            Db::Postgres => {
                postgres::Client::connect(&crate::common::postgres_url(), postgres::NoTls)
                    .unwrap()
                    .batch_execute(ddl)
                    .unwrap()
            }
            #[cfg(feature = "mysql")]
            Db::Mysql => {
                use mysql::prelude::Queryable;
                let opts = mysql::Opts::from_url(&crate::common::mysql_url()).unwrap();
                mysql::Conn::new(opts).unwrap().query_drop(ddl).unwrap()
            }
            #[allow(unreachable_patterns)]
            other => panic!("{other:?} is not compiled in"),
        }
    }

    /// What one wrong table did; `Err` if two instances held one lock.
    fn exercise(f: &Fixture, prefix: &str) -> Result<String, String> {
        let build = || f.builder().prefix(prefix.to_string()).build();
        let a: LockRegistry = match build() {
            Ok(registry) => registry,
            Err(e) => return Ok(format!("build refused: {e}")),
        };
        let first = match a.obtain("k").unwrap().try_lock() {
            Ok(Some(guard)) => guard,
            Ok(None) => return Ok("a free lock reported held".into()),
            Err(e) => return Ok(format!("lock refused: {e}")),
        };
        let b = build().map_err(|e| format!("second registry: {e}"))?;
        let second = b.obtain("k").unwrap().try_lock();
        if let Ok(Some(_)) = second {
            return Err("two instances hold the same lock".into());
        }
        let other_key = b.obtain("other").unwrap().try_lock();
        let released = first.unlock();
        Ok(format!(
            "works: second try {:?}, other key {:?}, unlock {:?}",
            second.map(|g| g.is_some()),
            other_key.map(|g| g.is_some()),
            released
        ))
    }

    /// A table made before the `LOCK_NAME` column (or by Spring's DDL) works as it
    /// did, its rows without names; `create_table(true)` adds the column, and from then on
    /// leasehold's grants name their rows, while a registry built before goes on working.
    pub fn a_table_without_the_name_column_works_and_create_table_adds_it(f: &Fixture) {
        let prefix = format!("{}n_", f.prefix);
        let ddl: String = shipped_ddl(f.db)
            .lines()
            .filter(|line| !line.trim_start().starts_with("LOCK_NAME"))
            .map(|line| format!("{line}\n"))
            .collect();
        assert!(!ddl.contains("LOCK_NAME ") && ddl.contains("FENCING_TOKEN"));
        execute(f, &ddl.replace("INT_", &prefix));
        let name_of = |registry: &LockRegistry, key: &str| {
            let lock_key = leasehold::lock_key_for(key);
            let rows: Vec<_> = registry.listing().rows().collect::<Result<_, _>>().unwrap();
            rows.into_iter()
                .find(|row| row.lock_key == lock_key)
                .expect("the row")
                .name
        };
        let before = f.builder().prefix(prefix.clone()).build().unwrap();
        before
            .obtain("plain")
            .unwrap()
            .lock()
            .unwrap()
            .unlock()
            .unwrap();
        assert_eq!(name_of(&before, "plain"), None);
        let after = f
            .builder()
            .prefix(prefix.clone())
            .create_table(true)
            .build()
            .unwrap();
        after
            .obtain("named")
            .unwrap()
            .lock()
            .unwrap()
            .unlock()
            .unwrap();
        assert_eq!(name_of(&after, "named").as_deref(), Some("named"));
        // A registry built before the column came keeps working (its statements ignore it).
        let guard = before.obtain("plain").unwrap().lock().unwrap();
        assert!(after.obtain("plain").unwrap().try_lock().unwrap().is_none());
        guard.unlock().unwrap();
        // A takeover by a naming registry names the row.
        after
            .obtain("plain")
            .unwrap()
            .lock()
            .unwrap()
            .unlock()
            .unwrap();
        assert_eq!(name_of(&after, "plain").as_deref(), Some("plain"));
        f.drop_tables(&prefix);
    }

    pub fn a_table_with_wrong_column_types_is_refused_or_still_excludes(f: &Fixture) {
        let mut double_grants = Vec::new();
        for (n, (what, from, to)) in variants(f.db).into_iter().enumerate() {
            let prefix = format!("{}w{n}_", f.prefix);
            let ddl = shipped_ddl(f.db).replacen(&from, &to, 1);
            assert_ne!(ddl, shipped_ddl(f.db), "variant {what:?} changed nothing");
            execute(f, &ddl.replace("INT_", &prefix));
            match exercise(f, &prefix) {
                Ok(outcome) => println!("{:?} {what}: {outcome}", f.db),
                Err(e) => double_grants.push(format!("{what}: {e}")),
            }
        }
        assert!(double_grants.is_empty(), "{double_grants:?}");
    }
}

#[cfg(feature = "sqlite")]
mod sqlite_tables {
    crate::suite_for!(crate::common::Db::Sqlite;
        a_table_with_wrong_column_types_is_refused_or_still_excludes,
        a_table_without_the_name_column_works_and_create_table_adds_it);
}

#[cfg(feature = "postgres")]
mod postgres_tables {
    crate::suite_for!(crate::common::Db::Postgres;
        a_table_with_wrong_column_types_is_refused_or_still_excludes,
        a_table_without_the_name_column_works_and_create_table_adds_it);
}

#[cfg(feature = "mysql")]
mod mysql_tables {
    crate::suite_for!(crate::common::Db::Mysql;
        a_table_with_wrong_column_types_is_refused_or_still_excludes,
        a_table_without_the_name_column_works_and_create_table_adds_it);
}

/// Sequences of operations by two instances on one key — lock with a time-to-live, renew with
/// another, hand over locally to another thread that asks for another, pause, unlock — checked
/// against a model of what the guarantees allow: never two holders that both count themselves
/// as holding, a holder's deadline never past what its last statement or handoff gives, a local
/// handoff and a re-take of a lingering lease keeping the grant's token, strictly increasing
/// tokens across grants, and every loss
/// reported exactly once (by the callback) for a lease whose unlock said it was lost.
/// Time-to-lives are short so that expiries, takeovers and renewals that come too late all
/// happen within a case. Every guard lives on a thread of its own (a local handoff moves the
/// lock to another thread), driven by the test through a channel.
#[cfg(feature = "sqlite")]
mod sequences {
    use leasehold::{Lock, LockGuard, LockRegistry};
    use parking_lot::Mutex;
    use proptest::prelude::*;
    use std::collections::HashMap;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    #[derive(Debug, Clone)]
    enum Op {
        Lock { instance: usize, ttl_ms: u64 },
        Renew { instance: usize, ttl_ms: u64 },
        Handoff { instance: usize, ttl_ms: u64 },
        Pause { ms: u64 },
        Unlock { instance: usize },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..2usize, 20..200u64).prop_map(|(instance, ttl_ms)| Op::Lock { instance, ttl_ms }),
            (0..2usize, 20..200u64).prop_map(|(instance, ttl_ms)| Op::Renew { instance, ttl_ms }),
            (0..2usize, 20..200u64).prop_map(|(instance, ttl_ms)| Op::Handoff { instance, ttl_ms }),
            (0..60u64).prop_map(|ms| Op::Pause { ms }),
            (0..2usize).prop_map(|instance| Op::Unlock { instance }),
        ]
    }

    /// Loss reports per fencing token, from both registries' callbacks.
    type Reports = Arc<Mutex<HashMap<u64, usize>>>;

    fn registry(dir: &tempfile::TempDir, create: bool, reports: &Reports) -> LockRegistry {
        let reports = Arc::clone(reports);
        LockRegistry::sqlite(dir.path().join("locks.db"))
            .create_table(create)
            .idle_between_tries(Duration::from_millis(5))
            .on_lease_lost(move |event| {
                *reports.lock().entry(event.fencing_token).or_default() += 1;
            })
            .build()
            .unwrap()
    }

    type Command = Box<dyn FnOnce(&mut Option<LockGuard>) + Send>;

    /// A thread that takes the lock (`ttl`, waiting or not) and then runs what it is sent on its
    /// guard; it ends when dropped.
    struct Holder {
        commands: crossbeam_channel::Sender<Command>,
        /// The time-to-live the holder last asked for (lock, renewal or handoff).
        ttl: Duration,
    }

    impl Holder {
        /// Starts the thread; `granted` receives the token once the lock call returned.
        fn start(
            lock: Lock,
            ttl: Duration,
            wait: bool,
        ) -> (Holder, crossbeam_channel::Receiver<Option<u64>>) {
            let (commands, inbox) = crossbeam_channel::unbounded::<Command>();
            let (granted_tx, granted) = crossbeam_channel::bounded(1);
            std::thread::spawn(move || {
                // A waiter gives up after a while: the other instance may hold the lock, and
                // the test thread waits for this one.
                let mut guard = match wait {
                    true => lock.try_lock_for_with_ttl(Duration::from_secs(2), ttl),
                    false => lock.try_lock_with_ttl(ttl),
                }
                .unwrap();
                let _ = granted_tx.send(guard.as_ref().map(LockGuard::fencing_token));
                for command in inbox {
                    command(&mut guard);
                }
            });
            (Holder { commands, ttl }, granted)
        }

        fn call<T: Send + 'static>(
            &self,
            work: impl FnOnce(&mut Option<LockGuard>) -> T + Send + 'static,
        ) -> T {
            let (answer_tx, answer) = crossbeam_channel::bounded(1);
            self.commands
                .send(Box::new(move |guard: &mut Option<LockGuard>| {
                    let _ = answer_tx.send(work(guard));
                }))
                .unwrap();
            answer.recv().unwrap()
        }

        /// (`is_held`, `remaining`) of the guard.
        fn view(&self) -> (bool, Duration) {
            self.call(|guard| {
                let guard = guard.as_ref().expect("a holder holds");
                (guard.is_held(), guard.remaining())
            })
        }

        fn token(&self) -> u64 {
            self.call(|guard| guard.as_ref().expect("a holder holds").fencing_token())
        }

        /// Unlocks; `Err(true)` when the unlock reported the lease lost.
        fn unlock(&self) -> Result<(), bool> {
            self.call(|guard| {
                let guard = guard.take().expect("a holder holds");
                guard.unlock().map_err(|e| {
                    assert!(e.is_lease_lost(), "{e}");
                    true
                })
            })
        }
    }

    fn run(ops: &[Op]) -> Result<(), TestCaseError> {
        let dir = tempfile::tempdir().unwrap();
        let reports = Reports::default();
        let instances = [
            registry(&dir, true, &reports),
            registry(&dir, false, &reports),
        ];
        let lock = |instance: usize| instances[instance].obtain("key").unwrap();
        let mut held: [Option<Holder>; 2] = [None, None];
        let mut last_token = 0u64;
        // The instance whose grant carries `last_token`.
        let mut last_granted_to = None;
        // The longest time-to-live asked for since the grant carrying `last_token` (by its
        // lock, renewals and handoffs): its deadline is never further off than that.
        let mut grant_ttl = Duration::ZERO;
        let mut lost_on_unlock = Vec::new();
        for op in ops {
            match *op {
                Op::Lock { instance, ttl_ms } if held[instance].is_none() => {
                    let ttl = Duration::from_millis(ttl_ms);
                    let (holder, granted) = Holder::start(lock(instance), ttl, false);
                    if let Some(token) = granted.recv().unwrap() {
                        let (is_held, remaining) = holder.view();
                        // A loaded machine may outlast a 20 ms lease before the look.
                        prop_assert!(is_held || remaining.is_zero());
                        // A new grant is above every earlier token; taking this instance's
                        // own lingering lease again (see "Linger") keeps its grant and token,
                        // bounded as a handoff is.
                        let retaken = token == last_token && last_granted_to == Some(instance);
                        prop_assert!(token > last_token || retaken, "{token} <= {last_token}");
                        grant_ttl = match retaken {
                            true => grant_ttl.max(ttl),
                            false => ttl,
                        };
                        prop_assert!(remaining < grant_ttl, "{remaining:?} of {grant_ttl:?}");
                        last_token = token;
                        last_granted_to = Some(instance);
                        held[instance] = Some(holder);
                    }
                }
                Op::Lock { .. } => {}
                Op::Renew { instance, ttl_ms } => {
                    if let Some(holder) = &mut held[instance] {
                        let ttl = Duration::from_millis(ttl_ms);
                        let renewed = holder.call(move |guard| {
                            let guard = guard.as_ref().expect("a holder holds");
                            guard.renew_with_ttl(ttl).ok().map(|()| guard.remaining())
                        });
                        if let Some(remaining) = renewed {
                            prop_assert!(remaining < ttl, "{remaining:?} of {ttl:?}");
                        }
                        holder.ttl = ttl;
                        grant_ttl = grant_ttl.max(ttl);
                    }
                }
                Op::Handoff { instance, ttl_ms } => {
                    let Some(previous) = held[instance].take() else {
                        continue;
                    };
                    let ttl = Duration::from_millis(ttl_ms);
                    let token = previous.token();
                    let handle = lock(instance);
                    let (next, granted) = Holder::start(handle.clone(), ttl, true);
                    let until = Instant::now() + Duration::from_secs(10);
                    while handle.queued_threads() == 0 && Instant::now() < until {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    let handed = previous.unlock();
                    match granted.recv().unwrap() {
                        // Handed over: the same grant, bounded by what the database has —
                        // the longer of the two time-to-lives until a renewal carries the new.
                        Some(next_token) if handed.is_ok() && next_token == token => {
                            let (_, remaining) = next.view();
                            let bound = previous.ttl.max(ttl);
                            prop_assert!(remaining < bound, "{remaining:?} of {bound:?}");
                            grant_ttl = grant_ttl.max(ttl);
                            held[instance] = Some(next);
                        }
                        // The lease was lost meanwhile: the waiter got a new grant (or none).
                        Some(next_token) => {
                            if handed.is_err() {
                                lost_on_unlock.push(token);
                            }
                            prop_assert!(next_token > last_token, "{next_token} <= {last_token}");
                            last_token = next_token;
                            last_granted_to = Some(instance);
                            grant_ttl = ttl;
                            held[instance] = Some(next);
                        }
                        None => {
                            if handed.is_err() {
                                lost_on_unlock.push(token);
                            }
                        }
                    }
                }
                Op::Pause { ms } => std::thread::sleep(Duration::from_millis(ms)),
                Op::Unlock { instance } => {
                    if let Some(holder) = held[instance].take() {
                        let token = holder.token();
                        if holder.unlock().is_err() {
                            lost_on_unlock.push(token);
                        }
                    }
                }
            }
            let holding: Vec<usize> = (0..2)
                .filter(|&i| held[i].as_ref().is_some_and(|holder| holder.view().0))
                .collect();
            prop_assert!(holding.len() < 2, "two holders after {op:?}");
            // The model: whoever counts itself as holding excludes the other instance.
            if let [holder] = holding[..] {
                let other = 1 - holder;
                if held[other].is_none() {
                    let taken = lock(other).try_lock().unwrap();
                    let still = held[holder].as_ref().is_some_and(|h| h.view().0);
                    prop_assert!(
                        !(still && taken.is_some()),
                        "granted while held, after {op:?}"
                    );
                }
            }
        }
        for holder in held.iter_mut() {
            if let Some(holder) = holder.take() {
                let token = holder.token();
                if holder.unlock().is_err() {
                    lost_on_unlock.push(token);
                }
            }
        }
        // Callbacks run on each registry's callback thread: the last ones may still be on their
        // way. Wait (generously, for a loaded machine) until every loss unlock saw is reported.
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until
            && !lost_on_unlock
                .iter()
                .all(|token| reports.lock().contains_key(token))
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(50));
        let reports = reports.lock();
        for token in lost_on_unlock {
            prop_assert_eq!(reports.get(&token).copied(), Some(1), "token {}", token);
        }
        prop_assert!(reports.values().all(|&count| count == 1), "{:?}", *reports);
        Ok(())
    }

    /// The shortest sequence with a re-take: the lease handed over lingers after the unlock,
    /// and this instance's next lock takes it again, with its token — also when it asks a
    /// shorter time-to-live than the lingering lease runs with.
    #[test]
    fn a_lingering_lease_taken_again_keeps_its_token() {
        for (instance, first, handed, again) in [(1, 200, 200, 200), (0, 190, 180, 40)] {
            let ops = [
                Op::Lock {
                    instance,
                    ttl_ms: first,
                },
                Op::Handoff {
                    instance,
                    ttl_ms: handed,
                },
                Op::Unlock { instance },
                Op::Lock {
                    instance,
                    ttl_ms: again,
                },
            ];
            run(&ops).unwrap();
        }
    }

    proptest! {
        #![proptest_config(super::config(24))]

        #[test]
        fn operation_sequences_keep_the_guarantees(ops in prop::collection::vec(op(), 1..12)) {
            run(&ops)?;
        }
    }
}
