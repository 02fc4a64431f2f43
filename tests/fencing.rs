//! Fencing tokens strictly increase per key on every backend, also when the key's row is
//! deleted between grants — as Spring Integration's `JdbcLockRegistry` does on every unlock,
//! and as operators do by hand — and whatever the database clock's resolution.
//!
//! Each function in `suite` takes a [`Fixture`] (its own table on one real database) and is
//! instantiated once per compiled-in backend at the bottom. Rows are deleted with the driver
//! directly, beside the registry.

mod common;

mod suite {
    use crate::common::raw::Raw;
    use crate::common::{Db, Fixture};
    use leasehold::LockRegistry;

    /// Spring's region, the registry's default.
    const REGION: &str = "DEFAULT";
    /// The `CLIENT_ID` the Spring side writes.
    const SPRING: &str = "spring-instance";

    impl Raw {
        /// Operator cleanup: deletes the key's row whoever holds it.
        fn delete(&mut self, table: &str, lock_key: &str) -> u64 {
            self.execute(&format!(
                "DELETE FROM {table} WHERE LOCK_KEY = '{lock_key}' AND REGION = '{REGION}'"
            ))
        }

        /// Spring's delete on unlock: only the row of the client that holds it.
        fn spring_delete(&mut self, table: &str, lock_key: &str, client_id: &str) -> u64 {
            self.execute(&format!(
                "DELETE FROM {table} WHERE REGION = '{REGION}' AND LOCK_KEY = '{lock_key}' \
                 AND CLIENT_ID = '{client_id}'"
            ))
        }

        /// Spring's lock and unlock of a free (released or expired) row: its `UPDATE` takes
        /// the row without touching `FENCING_TOKEN`, its unlock deletes it.
        fn spring_cycle(&mut self, table: &str, lock_key: &str) {
            let taken = self.execute(&format!(
                "UPDATE {table} SET CLIENT_ID = '{SPRING}', EXPIRED_AFTER = '2999-01-01 00:00:00' \
                 WHERE REGION = '{REGION}' AND LOCK_KEY = '{lock_key}' \
                 AND (CLIENT_ID = '{SPRING}' OR EXPIRED_AFTER < '2000-01-01 00:00:00')"
            ));
            assert_eq!(taken, 1, "Spring takes the released row");
            assert_eq!(self.spring_delete(table, lock_key, SPRING), 1);
        }
    }

    /// What happened to the token after each delete, as the issue counted it.
    #[derive(Debug, Default)]
    struct Outcomes {
        smaller: u32,
        equal: u32,
        greater: u32,
    }

    impl Outcomes {
        fn record(&mut self, before: u64, after: u64) {
            match after.cmp(&before) {
                std::cmp::Ordering::Less => self.smaller += 1,
                std::cmp::Ordering::Equal => self.equal += 1,
                std::cmp::Ordering::Greater => self.greater += 1,
            }
        }
    }

    /// The case: lock, unlock, lock, unlock (the second grant takes the kept row: its
    /// token is the previous + 1 when the clock has not moved on), delete the row (as an
    /// operator, or as Spring taking the released row and deleting it on its unlock), lock
    /// again — many times, quickly. SQLite's clock counts milliseconds, so most rounds land in
    /// the tick of the previous grant.
    pub fn tokens_rise_across_deletes_done_quickly(f: &Fixture) {
        let rounds = match f.db {
            Db::Sqlite => 2_000,
            _ => 500,
        };
        let registry = f.registry();
        let lock = registry.obtain("deleted-again-and-again").unwrap();
        let (table, lock_key) = (f.table(), lock.lock_key().to_string());
        let mut raw = Raw::open(f);
        let mut outcomes = Outcomes::default();
        let mut last = lock.lock().unwrap().unlock_token();
        for round in 0..rounds {
            let again = lock.lock().unwrap().unlock_token();
            assert!(again > last, "a kept row counts up: {again} after {last}");
            last = again;
            if round % 2 == 0 {
                assert_eq!(raw.delete(&table, &lock_key), 1, "round {round}");
            } else {
                raw.spring_cycle(&table, &lock_key);
            }
            let token = lock.lock().unwrap().unlock_token();
            outcomes.record(last, token);
            last = token;
        }
        assert_eq!(
            (outcomes.smaller, outcomes.equal),
            (0, 0),
            "{:?}: after a delete the next token was smaller in {} and equal in {} of {rounds} \
             rounds",
            f.db,
            outcomes.smaller,
            outcomes.equal
        );
    }

    /// A token ahead of the database clock (several grants within one clock tick, or a clock
    /// that was set back), then the row deleted right after the grant: the next grant still
    /// gets a greater token, whether Spring deleted the row after taking it or an operator
    /// deleted it under the holder.
    fn a_token_ahead_of_the_clock_survives_a_delete(f: &Fixture, registry: &LockRegistry) {
        const AN_HOUR_MICROS: u64 = 3_600_000_000;
        let lock = registry.obtain("ahead-of-the-clock").unwrap();
        let (table, lock_key) = (registry.table().to_string(), lock.lock_key().to_string());
        let mut raw = Raw::open(f);
        let first = lock.lock().unwrap().unlock_token();
        let pushed = raw.execute(&format!(
            "UPDATE {table} SET FENCING_TOKEN = FENCING_TOKEN + {AN_HOUR_MICROS} \
             WHERE LOCK_KEY = '{lock_key}'"
        ));
        assert_eq!(pushed, 1);
        // prev + 1: the clock is an hour behind the row.
        let ahead = lock.lock().unwrap().unlock_token();
        assert_eq!(ahead, first + AN_HOUR_MICROS + 1);

        // Spring takes the released row and deletes it on its unlock.
        raw.spring_cycle(&table, &lock_key);
        let guard = lock.lock().unwrap();
        let after_spring = guard.fencing_token();
        assert!(
            after_spring > ahead,
            "{:?}: {after_spring} after Spring deleted the row of {ahead}",
            f.db
        );

        // An operator deletes the row right under the holder.
        assert_eq!(
            raw.spring_delete(&table, &lock_key, registry.client_id()),
            1
        );
        assert!(guard.unlock().unwrap_err().is_lease_lost());
        let after_delete = lock.lock().unwrap().unlock_token();
        assert!(
            after_delete > after_spring,
            "{:?}: {after_delete} after the held row of {after_spring} was deleted",
            f.db
        );
    }

    pub fn a_delete_right_after_a_grant_ahead_of_the_clock_keeps_tokens_rising(f: &Fixture) {
        a_token_ahead_of_the_clock_survives_a_delete(f, &f.registry());
    }

    /// A deletion raises the floor of its own region only: the same key in another region
    /// still starts from the clock.
    pub fn the_floor_is_kept_per_region(f: &Fixture) {
        const AHEAD: u64 = 3_600_000_000_000;
        let east = f.builder().region("east").build().unwrap();
        let west = f.builder().region("west").build().unwrap();
        let mut raw = Raw::open(f);
        let lock = east.obtain("regional").unwrap();
        let first = lock.lock().unwrap().unlock_token();
        let condition = format!("LOCK_KEY = '{}' AND REGION = 'east'", lock.lock_key());
        let table = f.table();
        raw.execute(&format!(
            "UPDATE {table} SET FENCING_TOKEN = FENCING_TOKEN + {AHEAD} WHERE {condition}"
        ));
        raw.execute(&format!("DELETE FROM {table} WHERE {condition}"));
        let again = lock.lock().unwrap().unlock_token();
        assert!(again > first + AHEAD, "east's floor: {again}");
        let elsewhere = west.obtain("regional").unwrap().lock().unwrap();
        assert!(
            elsewhere.fencing_token() < first + AHEAD,
            "west starts from the clock: {}",
            elsewhere.fencing_token()
        );
    }

    /// A lock table made before the floor existed (the table alone, as earlier versions of the
    /// shipped DDL made it, or as Spring users create it by hand): `create_table(false)` still
    /// builds and locks; `create_table(true)` adds the floor, and from then on deletes are
    /// covered.
    pub fn create_table_adds_the_floor_to_an_existing_table(f: &Fixture) {
        let prefix = format!("{}old_", f.prefix);
        let table = format!("{prefix}LOCK");
        let timestamp = match f.db {
            Db::Mysql => "DATETIME(6)",
            _ => "TIMESTAMP",
        };
        let mut raw = Raw::open(f);
        raw.execute(&format!(
            "CREATE TABLE {table} (LOCK_KEY CHAR(36) NOT NULL, REGION VARCHAR(100) NOT NULL, \
             CLIENT_ID CHAR(36), CREATED_DATE {timestamp} NOT NULL, \
             EXPIRED_AFTER {timestamp} NOT NULL, FENCING_TOKEN BIGINT NOT NULL DEFAULT 0, \
             CONSTRAINT {table}_PK PRIMARY KEY (LOCK_KEY, REGION))"
        ));
        let without = f.builder().prefix(prefix.clone()).build().unwrap();
        let floor = format!("{table}_FLOOR");
        assert!(
            !without.statements().acquire.contains(&floor),
            "no floor table to read: {}",
            without.statements().acquire
        );
        let guard = without.obtain("old-table").unwrap().lock().unwrap();
        assert!(guard.fencing_token() > 0);
        guard.unlock().unwrap();

        let with = f
            .builder()
            .prefix(prefix.clone())
            .create_table(true)
            .build()
            .unwrap();
        assert!(
            with.statements().acquire.contains(&floor),
            "{}",
            with.statements().acquire
        );
        a_token_ahead_of_the_clock_survives_a_delete(f, &with);
        // Once there, the floor is found without creating anything.
        let checked = f.builder().prefix(prefix).build().unwrap();
        assert_eq!(checked.statements(), with.statements());
    }

    /// The longest prefix accepted makes names (`{prefix}LOCK_FLOOR`, for the floor's table,
    /// trigger and PostgreSQL function) that every database takes as they are.
    pub fn the_longest_prefix_fits_every_name(f: &Fixture) {
        let prefix = format!(
            "{}{}",
            f.prefix,
            "x".repeat(leasehold::MAX_PREFIX_CHARS - f.prefix.len())
        );
        assert_eq!(prefix.len(), leasehold::MAX_PREFIX_CHARS);
        let registry = f
            .builder()
            .prefix(prefix.clone())
            .create_table(true)
            .build()
            .unwrap();
        let floor = format!("{prefix}LOCK_FLOOR");
        assert!(
            registry.statements().acquire.contains(&floor),
            "{}",
            registry.statements().acquire
        );
        a_token_ahead_of_the_clock_survives_a_delete(f, &registry);
    }

    /// Unlocks a guard and returns its token.
    trait UnlockToken {
        fn unlock_token(self) -> u64;
    }

    impl UnlockToken for leasehold::LockGuard {
        fn unlock_token(self) -> u64 {
            let token = self.fencing_token();
            self.unlock().unwrap();
            token
        }
    }
}

macro_rules! fencing {
    ($db:expr) => {
        crate::suite_for!($db;
            tokens_rise_across_deletes_done_quickly,
            a_delete_right_after_a_grant_ahead_of_the_clock_keeps_tokens_rising,
            the_floor_is_kept_per_region,
            create_table_adds_the_floor_to_an_existing_table,
            the_longest_prefix_fits_every_name,
        );
    };
}

#[cfg(feature = "sqlite")]
mod sqlite {
    fencing!(crate::common::Db::Sqlite);
}

#[cfg(feature = "postgres")]
mod postgres {
    fencing!(crate::common::Db::Postgres);
}

#[cfg(feature = "mysql")]
mod mysql {
    fencing!(crate::common::Db::Mysql);
}
