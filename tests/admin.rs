//! The administration API against every database: `holder`, `listing`, `force_release`,
//! `delete_released_and_expired`, and `LockGuard::unlock_keeping_for`.
//!
//! Time is compared on the database clock (the `Holder` timestamps) where a test needs an
//! order of events; waits are bounded generously so a broken build fails instead of hanging.

mod common;

mod suite {
    use crate::common::{Db, Fixture};
    use leasehold::{Error, LossReason};
    use std::thread;
    use std::time::{Duration, SystemTime};

    const GENEROUS: Duration = Duration::from_secs(20);

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

    /// Moves the token of `key`'s row an hour ahead of the clock, with a plain connection, so
    /// that only the deletion floor can keep the next token above it.
    fn push_token_ahead(f: &Fixture, key: &str) {
        let sql = format!(
            "UPDATE {} SET FENCING_TOKEN = FENCING_TOKEN + 3600000000 WHERE LOCK_KEY = '{}'",
            f.table(),
            leasehold::lock_key_for(key)
        );
        match f.db {
            #[cfg(feature = "sqlite")]
            Db::Sqlite => {
                let conn = rusqlite::Connection::open(f.sqlite_path()).unwrap();
                conn.busy_timeout(Duration::from_secs(10)).unwrap();
                assert_eq!(conn.execute(&sql, []).unwrap(), 1);
            }
            #[cfg(feature = "postgres")]
            Db::Postgres => {
                let mut client =
                    postgres::Client::connect(&crate::common::postgres_url(), postgres::NoTls)
                        .unwrap();
                assert_eq!(client.execute(&sql, &[]).unwrap(), 1);
            }
            #[cfg(feature = "mysql")]
            Db::Mysql => {
                use mysql::prelude::Queryable;
                let opts = mysql::Opts::from_url(&crate::common::mysql_url()).unwrap();
                let mut conn = mysql::Conn::new(opts).unwrap();
                conn.query_drop(&sql).unwrap();
                assert_eq!(conn.affected_rows(), 1);
            }
            #[allow(unreachable_patterns)]
            other => panic!("{other:?} support is not compiled in"),
        }
    }

    fn span(from: SystemTime, to: SystemTime) -> Duration {
        to.duration_since(from).expect("ordered instants")
    }

    pub fn holder_names_the_holder_and_none_when_free(f: &Fixture) {
        let (a, b) = (f.registry(), f.registry());
        assert_eq!(b.holder("report").unwrap(), None, "no row yet");
        let guard = a
            .obtain("report")
            .unwrap()
            .lock_with_ttl(Duration::from_secs(30))
            .unwrap();
        let holder = b.holder("report").unwrap().expect("held");
        assert_eq!(holder.client_id, a.client_id());
        assert_eq!(holder.fencing_token, guard.fencing_token());
        let ttl = span(holder.acquired, holder.expires_at);
        assert!(
            ttl > Duration::from_secs(29) && ttl <= Duration::from_secs(31),
            "{ttl:?}"
        );
        let (now, _) = b.database_time().unwrap();
        assert!(holder.acquired <= now + Duration::from_millis(1));
        assert!(holder.expires_at > now);
        guard.unlock().unwrap();
        assert_eq!(b.holder("report").unwrap(), None, "released row");

        // An expired lease is not a holder, though its row still names the client.
        let stale = f.builder().renewal(false).build().unwrap();
        let expiring = stale
            .obtain("report")
            .unwrap()
            .lock_with_ttl(Duration::from_secs(2))
            .unwrap();
        // Held while its holder still counts it (a busy machine may outlast a short lease).
        let seen = b.holder("report").unwrap();
        assert!(seen.is_some() || !expiring.is_held());
        while expiring.is_held() {
            thread::sleep(Duration::from_millis(20));
        }
        // The row outlives the holder's deadline by the drift allowance and the grant's trip.
        thread::sleep(Duration::from_millis(800));
        assert_eq!(b.holder("report").unwrap(), None, "expired row");
        assert!(expiring.unlock().is_err());
        assert!(matches!(b.holder(""), Err(Error::InvalidKey { .. })));
    }

    pub fn listing_shows_held_expired_and_released_rows_of_the_region_by_page(f: &Fixture) {
        use leasehold::LockState;
        let (a, b) = (f.registry(), f.registry());
        assert!(b.listing().rows().next().is_none(), "an empty table");
        let held = a
            .obtain("held")
            .unwrap()
            .lock_with_ttl(Duration::from_secs(30))
            .unwrap();
        a.obtain("released")
            .unwrap()
            .lock()
            .unwrap()
            .unlock()
            .unwrap();
        let stale = f.builder().renewal(false).build().unwrap();
        let expiring = stale
            .obtain("expired")
            .unwrap()
            .lock_with_ttl(Duration::from_millis(100))
            .unwrap();
        for n in 0..5 {
            a.obtain(&format!("unnamed-{n}"))
                .unwrap()
                .lock()
                .unwrap()
                .unlock()
                .unwrap();
        }
        let elsewhere = f.builder().region("elsewhere").build().unwrap();
        let other_region = elsewhere.obtain("held").unwrap().lock().unwrap();
        thread::sleep(Duration::from_millis(300));

        let listing = b
            .listing()
            .resolving(["held", "released", "expired", "never-locked"])
            .unwrap();
        let rows: Vec<_> = listing.rows().map(Result::unwrap).collect();
        assert_eq!(rows.len(), 8, "this region's rows only: {rows:?}");
        let keys: Vec<&str> = rows.iter().map(|r| r.lock_key.as_str()).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "byte order: {keys:?}");
        let find = |name: &str| {
            rows.iter()
                .find(|r| r.name.as_deref() == Some(name))
                .unwrap_or_else(|| panic!("{name} in {rows:?}"))
        };
        let row = find("held");
        assert_eq!(row.state, LockState::Held);
        assert_eq!(row.lock_key, leasehold::lock_key_for("held"));
        assert_eq!(row.client_id.as_deref(), Some(a.client_id()));
        assert_eq!(row.fencing_token, held.fencing_token());
        let (now, _) = b.database_time().unwrap();
        assert!(row.expires_at > now && row.acquired <= now + Duration::from_millis(1));
        let row = find("expired");
        assert_eq!(row.state, LockState::Expired);
        assert_eq!(row.client_id.as_deref(), Some(stale.client_id()));
        assert!(row.expires_at < now);
        let row = find("released");
        assert_eq!(
            (row.state, row.client_id.as_deref()),
            (LockState::Released, None)
        );
        assert!(row.fencing_token > 0);
        // Names not given to `resolving` come from the table's LOCK_NAME column.
        let others: Vec<_> = rows
            .iter()
            .filter(|r| r.name.as_deref().is_some_and(|n| n.starts_with("unnamed-")))
            .collect();
        assert_eq!(others.len(), 5);
        for row in others {
            assert_eq!(row.label(), row.name.as_deref().unwrap());
            assert_eq!(
                row.lock_key,
                leasehold::lock_key_for(row.name.as_deref().unwrap())
            );
            assert_eq!(row.state, LockState::Released);
        }

        // Pages of three give the same rows in the same order.
        let mut paged = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = listing.page(after.as_deref(), 3).unwrap();
            assert!(page.len() <= 3);
            after = page.last().map(|r| r.lock_key.clone());
            let last = page.len() < 3;
            paged.extend(page);
            if last {
                break;
            }
        }
        assert_eq!(paged, rows);
        assert!(listing.page(Some(&rows[7].lock_key), 3).unwrap().is_empty());

        // A lease ending shows at the next query.
        held.unlock().unwrap();
        let row = listing
            .rows()
            .map(Result::unwrap)
            .find(|r| r.name.as_deref() == Some("held"))
            .unwrap();
        assert_eq!(row.state, LockState::Released);

        assert!(matches!(
            listing.page(None, 0),
            Err(Error::InvalidSetting {
                setting: "limit",
                ..
            })
        ));
        assert!(matches!(
            listing.page(None, leasehold::MAX_PAGE_ROWS + 1),
            Err(Error::InvalidSetting { .. })
        ));
        assert!(matches!(
            b.listing().resolving([""]),
            Err(Error::InvalidKey { .. })
        ));
        assert!(expiring.unlock().is_err());
        other_region.unlock().unwrap();
    }

    pub fn listing_rows_go_on_past_one_query(f: &Fixture) {
        // The iterator reads 500 rows a query: 501 rows take two.
        let registry = f.registry();
        let names: Vec<String> = (0..501).map(|n| format!("job-{n}")).collect();
        for name in &names {
            registry
                .obtain(name)
                .unwrap()
                .lock()
                .unwrap()
                .unlock()
                .unwrap();
        }
        let listing = registry.listing().resolving(&names).unwrap();
        let rows: Vec<_> = listing.rows().map(Result::unwrap).collect();
        assert_eq!(rows.len(), 501);
        let mut seen: Vec<&str> = rows.iter().map(|r| r.name.as_deref().unwrap()).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 501, "every row once");
        assert_eq!(listing.page(None, 500).unwrap(), rows[..500]);
    }

    pub fn force_release_frees_the_key_and_the_holder_learns_at_its_next_renewal(f: &Fixture) {
        let (worker, operator, other) = (f.registry(), f.registry(), f.registry());
        let guard = worker
            .obtain("stuck")
            .unwrap()
            .lock_with_ttl(Duration::from_secs(3))
            .unwrap();
        let losses = guard.loss_channel();
        assert!(operator.force_release("stuck").unwrap());
        assert!(!operator.force_release("stuck").unwrap(), "free already");
        assert_eq!(operator.holder("stuck").unwrap(), None);
        let taken = other
            .obtain("stuck")
            .unwrap()
            .try_lock()
            .unwrap()
            .expect("free");
        assert!(taken.fencing_token() > guard.fencing_token());
        // The background renewal (a third of 3 s) finds another holder.
        let lost = losses.recv_timeout(GENEROUS).expect("loss reported");
        assert_eq!(lost.reason, LossReason::NotOwner);
        assert!(!guard.is_held());
        assert!(matches!(guard.unlock(), Err(Error::LeaseLost { .. })));
        assert!(taken.is_held());
        taken.unlock().unwrap();
        assert!(!operator.force_release("never-locked").unwrap());
    }

    pub fn delete_released_and_expired_keeps_held_rows_and_tokens_keep_increasing(f: &Fixture) {
        let registry = f.registry();
        let held = registry.obtain("held").unwrap().lock().unwrap();
        registry
            .obtain("released")
            .unwrap()
            .lock()
            .unwrap()
            .unlock()
            .unwrap();
        push_token_ahead(f, "released");
        let released_token = registry
            .obtain("released")
            .unwrap()
            .lock()
            .unwrap()
            .unlock_token();
        let stale = f.builder().renewal(false).build().unwrap();
        let expired = stale
            .obtain("expired")
            .unwrap()
            .lock_with_ttl(Duration::from_millis(50))
            .unwrap();
        let expired_token = expired.fencing_token();
        let elsewhere = f.builder().region("elsewhere").build().unwrap();
        elsewhere
            .obtain("released")
            .unwrap()
            .lock()
            .unwrap()
            .unlock()
            .unwrap();
        thread::sleep(Duration::from_millis(200));
        assert!(expired.unlock().is_err());

        assert_eq!(
            registry
                .delete_released_and_expired(Duration::from_secs(3600))
                .unwrap(),
            0,
            "nothing is an hour old"
        );
        assert_eq!(
            registry
                .delete_released_and_expired(Duration::ZERO)
                .unwrap(),
            2,
            "the released and the expired row of this region"
        );
        assert_eq!(
            registry
                .delete_released_and_expired(Duration::ZERO)
                .unwrap(),
            0
        );
        assert!(held.is_held());
        assert!(registry.holder("held").unwrap().is_some());
        held.renew().unwrap();
        assert_eq!(
            elsewhere
                .delete_released_and_expired(Duration::ZERO)
                .unwrap(),
            1,
            "the other region's row was kept"
        );

        // The deletion floor keeps tokens increasing over the deleted rows, even the one an
        // hour ahead of the clock.
        for (key, before) in [("released", released_token), ("expired", expired_token)] {
            let again = registry.obtain(key).unwrap().lock().unwrap();
            assert!(
                again.fencing_token() > before,
                "{key}: {} after {before}",
                again.fencing_token()
            );
            again.unlock().unwrap();
        }
        held.unlock().unwrap();
    }

    pub fn unlock_keeping_for_keeps_the_row_held_until_the_period_ends(f: &Fixture) {
        let keep = Duration::from_millis(1500);
        let (host_a, host_b) = (f.registry(), f.registry());
        let guard = host_a.obtain("daily").unwrap().lock().unwrap();
        let token = guard.fencing_token();
        guard.unlock_keeping_for(keep).unwrap();
        let kept = host_b.holder("daily").unwrap().expect("still held");
        assert_eq!(kept.client_id, host_a.client_id());
        // One above the grant's: no renewal of the finished lease matches the kept row.
        assert_eq!(kept.fencing_token, token + 1);
        let until = span(kept.acquired, kept.expires_at);
        assert!(
            until >= keep - Duration::from_millis(1) && until <= keep + Duration::from_millis(1),
            "{until:?}"
        );
        assert!(host_b
            .obtain("daily")
            .unwrap()
            .try_lock()
            .unwrap()
            .is_none());
        // Not even a thread of the same registry takes it before the period ends.
        let same = host_a.obtain("daily").unwrap();
        assert!(same.try_lock().unwrap().is_none());

        let next = host_b
            .obtain("daily")
            .unwrap()
            .try_lock_for(GENEROUS)
            .unwrap()
            .expect("taken after the period");
        let next_holder = host_b.holder("daily").unwrap().expect("held");
        assert!(
            next_holder.acquired >= kept.expires_at,
            "{next_holder:?} {kept:?}"
        );
        assert!(next.fencing_token() > token);
        next.unlock().unwrap();

        // A period already over releases outright.
        let guard = host_a.obtain("daily").unwrap().lock().unwrap();
        thread::sleep(Duration::from_millis(50));
        guard.unlock_keeping_for(Duration::from_millis(10)).unwrap();
        assert_eq!(host_b.holder("daily").unwrap(), None);
        assert!(host_b
            .obtain("daily")
            .unwrap()
            .try_lock()
            .unwrap()
            .is_some());
    }

    pub fn unlock_keeping_for_skips_the_local_handoff_and_reports_a_lost_lease(f: &Fixture) {
        let registry = f.registry();
        let lock = registry.obtain("weekly").unwrap();
        let guard = lock.lock().unwrap();
        // A thread of this registry queues for the lock; keep-for does not hand it over.
        let waiter = {
            let lock = lock.clone();
            thread::spawn(move || {
                lock.try_lock_for(Duration::from_millis(600))
                    .unwrap()
                    .is_some()
            })
        };
        while lock.queued_threads() == 0 {
            thread::sleep(Duration::from_millis(5));
        }
        guard.unlock_keeping_for(Duration::from_secs(60)).unwrap();
        assert!(!waiter.join().unwrap(), "the queued thread got the lock");
        assert!(registry.force_release("weekly").unwrap());

        // A lease lost before keep-for is reported, as by unlock.
        let guard = lock.lock().unwrap();
        assert!(registry.force_release("weekly").unwrap());
        match guard.unlock_keeping_for(Duration::from_secs(60)) {
            Err(Error::LeaseLost { reason, .. }) => assert_eq!(reason, LossReason::NotOwner),
            other => panic!("expected the loss, got {other:?}"),
        }
        assert_eq!(registry.holder("weekly").unwrap(), None);
        // An absurd period is refused, and the lock released as by unlock.
        let guard = lock.lock().unwrap();
        assert!(matches!(
            guard.unlock_keeping_for(Duration::from_secs(365 * 24 * 3600)),
            Err(Error::InvalidSetting { .. })
        ));
        assert_eq!(registry.holder("weekly").unwrap(), None);
    }

    /// A node finds what it holds by its client id, which names its host and
    /// process by default; rows of keys it has handles for carry their names.
    pub fn a_registry_lists_what_it_holds_by_its_default_client_id(f: &Fixture) {
        let (node, other) = (f.registry(), f.registry());
        let pid = std::process::id().to_string();
        assert_eq!(node.client_id().split('/').nth(1), Some(pid.as_str()));
        assert_ne!(node.client_id(), other.client_id());
        let mine = node.obtain("nightly-export").unwrap().lock().unwrap();
        let kept = node.obtain("weekly").unwrap().lock().unwrap();
        let theirs = other.obtain("hourly-sync").unwrap().lock().unwrap();
        node.obtain("released")
            .unwrap()
            .lock()
            .unwrap()
            .unlock()
            .unwrap();
        let mut held = node.held_by_this_registry().unwrap();
        held.sort_by(|a, b| a.name.cmp(&b.name));
        let names: Vec<Option<&str>> = held.iter().map(|row| row.name.as_deref()).collect();
        assert_eq!(names, [Some("nightly-export"), Some("weekly")]);
        assert!(held
            .iter()
            .all(|row| row.client_id.as_deref() == Some(node.client_id())));
        let tokens: Vec<u64> = held.iter().map(|row| row.fencing_token).collect();
        assert_eq!(tokens, [mine.fencing_token(), kept.fencing_token()]);
        assert_eq!(other.held_by_this_registry().unwrap().len(), 1);
        mine.unlock().unwrap();
        kept.unlock().unwrap();
        assert!(node.held_by_this_registry().unwrap().is_empty());
        theirs.unlock().unwrap();
    }
}

macro_rules! admin {
    ($db:expr) => {
        crate::suite_for!($db;
            holder_names_the_holder_and_none_when_free,
            listing_shows_held_expired_and_released_rows_of_the_region_by_page,
            listing_rows_go_on_past_one_query,
            force_release_frees_the_key_and_the_holder_learns_at_its_next_renewal,
            delete_released_and_expired_keeps_held_rows_and_tokens_keep_increasing,
            unlock_keeping_for_keeps_the_row_held_until_the_period_ends,
            unlock_keeping_for_skips_the_local_handoff_and_reports_a_lost_lease,
            a_registry_lists_what_it_holds_by_its_default_client_id,
        );
    };
}

#[cfg(feature = "sqlite")]
mod sqlite {
    admin!(crate::common::Db::Sqlite);
}

#[cfg(feature = "postgres")]
mod postgres {
    admin!(crate::common::Db::Postgres);
}

#[cfg(feature = "mysql")]
mod mysql {
    admin!(crate::common::Db::Mysql);
}
