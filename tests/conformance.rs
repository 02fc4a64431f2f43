//! The conformance suite: every behaviour of the registry, against every database.
//!
//! Each function in `suite` takes a [`Fixture`] (its own table on one real database) and is
//! instantiated once per compiled-in backend at the bottom of this file. Waits are bounded
//! generously (seconds) so a broken build fails instead of hanging; no assertion is on elapsed
//! time. The suite must pass on a machine so busy that a thread waits a second or two to run:
//! a lease that has to *survive* lives seconds; a short lease is only ever waited out (its
//! expiry cannot come too late), and a check that it is still held right after it was granted
//! is made only while its holder still counts it as held (see [`refused_while_held`]).
//! `postgres_through_pgbouncer` runs the suite again through a PgBouncer in transaction mode
//! (`common::pgbouncer`), the listeners connecting straight to the server.

mod common;

mod suite {
    use super::turn_limit;
    use crate::common::{Db, Fixture};
    use leasehold::{Error, LossReason};
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};
    use std::thread;
    use std::time::{Duration, Instant};

    const GENEROUS: Duration = Duration::from_secs(20);

    /// Asserts that `other` cannot take `key` while `guard` (a short lease) still holds it. The
    /// check counts only if the holder still counts the lease as held *after* the try: its
    /// deadline is never later than the row's expiry, so the try ran while the row was held. On
    /// a machine too busy to try before the lease ran out, it checks nothing.
    fn refused_while_held(guard: &leasehold::LockGuard, other: &leasehold::Lock) {
        let refused = other.try_lock().unwrap().is_none();
        if guard.is_held() {
            assert!(refused, "another instance took a lease that was still held");
        }
    }

    pub fn lock_renew_and_unlock_round_trip(f: &Fixture) {
        let registry = f.registry();
        let lock = registry.obtain("report").unwrap();
        let guard = lock.lock().unwrap();
        assert!(guard.is_held());
        assert!(lock.is_held_by_current_thread());
        guard.renew().unwrap();
        guard.renew_with_ttl(Duration::from_secs(30)).unwrap();
        assert!(guard.remaining() > Duration::from_secs(20));
        guard.unlock().unwrap();
        assert!(!lock.is_held_by_current_thread());
        let stats = registry.statistics();
        assert_eq!((stats.grants, stats.releases), (1, 1), "{stats:?}");
    }

    /// The bounded wait leaves `b` a place in the key's waiting line, which `b` gives up with
    /// a statement on a thread of its own; dropping `b` waits for it. The try after the
    /// release is another instance's, made when no statement of `b` is in flight: a place
    /// still being deleted (its row locked) refuses any acquire on MariaDB, however free
    /// the key.
    pub fn a_held_lock_is_refused_to_another_instance_until_released(f: &Fixture) {
        let (a, b) = (f.registry(), f.registry());
        let held = a.obtain("job").unwrap().lock().unwrap();
        let other = b.obtain("job").unwrap();
        assert!(other.try_lock().unwrap().is_none());
        assert!(other
            .try_lock_for(Duration::from_millis(100))
            .unwrap()
            .is_none());
        drop((other, b));
        let third = f.registry().obtain("job").unwrap();
        assert!(third.try_lock().unwrap().is_none(), "held until released");
        held.unlock().unwrap();
        let taken = third.try_lock().unwrap().expect("free after release");
        assert!(taken.is_held());
    }

    pub fn mutual_exclusion_holds_across_two_registries_and_many_threads(f: &Fixture) {
        const THREADS_PER_REGISTRY: usize = 4;
        const ROUNDS: usize = 25;
        let registries = [f.registry(), f.registry()];
        let counter = Arc::new(AtomicU64::new(0));
        let inside = Arc::new(AtomicBool::new(false));
        let overlaps = Arc::new(AtomicUsize::new(0));
        let mut workers = Vec::new();
        for registry in &registries {
            for _ in 0..THREADS_PER_REGISTRY {
                let lock = registry.obtain("counter").unwrap();
                let (counter, inside, overlaps) =
                    (counter.clone(), inside.clone(), overlaps.clone());
                workers.push(thread::spawn(move || {
                    for _ in 0..ROUNDS {
                        let guard = lock.try_lock_for(GENEROUS).unwrap().expect("granted");
                        if inside.swap(true, Ordering::SeqCst) {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        let seen = counter.load(Ordering::SeqCst);
                        thread::yield_now();
                        counter.store(seen + 1, Ordering::SeqCst);
                        inside.store(false, Ordering::SeqCst);
                        guard.unlock().unwrap();
                    }
                }));
            }
        }
        for worker in workers {
            worker.join().unwrap();
        }
        assert_eq!(overlaps.load(Ordering::SeqCst), 0);
        let total = (2 * THREADS_PER_REGISTRY * ROUNDS) as u64;
        assert_eq!(counter.load(Ordering::SeqCst), total);
    }

    pub fn expired_lease_is_taken_over_by_another_instance(f: &Fixture) {
        let other = f.registry().obtain("takeover").unwrap();
        let lost_events = Arc::new(AtomicUsize::new(0));
        let counted = lost_events.clone();
        let crashed = f
            .builder()
            .renewal(false)
            .on_lease_lost(move |_| {
                counted.fetch_add(1, Ordering::SeqCst);
            })
            .build()
            .unwrap();
        let stale = crashed
            .obtain("takeover")
            .unwrap()
            .lock_with_ttl(Duration::from_millis(300))
            .unwrap();
        let losses = stale.loss_channel();
        let stale_token = stale.fencing_token();
        refused_while_held(&stale, &other);
        let fresh = other.try_lock_for(GENEROUS).unwrap().expect("taken over");
        assert!(fresh.fencing_token() > stale_token);
        assert!(!stale.is_held());
        let event = losses.recv_timeout(GENEROUS).expect("loss reported");
        assert_eq!(event.fencing_token, stale_token);
        match stale.unlock() {
            Err(Error::LeaseLost { key, .. }) => assert_eq!(key, "takeover"),
            other => panic!("unlock after expiry must report the loss, got {other:?}"),
        }
        // The callback runs on the registry's callback thread, after the loss channel fired.
        let until = Instant::now() + GENEROUS;
        while lost_events.load(Ordering::SeqCst) == 0 && Instant::now() < until {
            thread::sleep(Duration::from_millis(5));
        }
        thread::sleep(Duration::from_millis(100));
        assert_eq!(lost_events.load(Ordering::SeqCst), 1);
        assert!(fresh.is_held());
        fresh.unlock().unwrap();
    }

    pub fn renewal_keeps_a_lease_past_its_time_to_live(f: &Fixture) {
        // Renewed every second, the lease survives a renewal up to two seconds late.
        let ttl = Duration::from_secs(3);
        let holder = f.builder().time_to_live(ttl).build().unwrap();
        let other = f.registry().obtain("long-job").unwrap();
        let guard = holder.obtain("long-job").unwrap().lock().unwrap();
        let until = Instant::now() + ttl + Duration::from_millis(500);
        while Instant::now() < until {
            assert!(other.try_lock().unwrap().is_none(), "taken while renewed");
            thread::sleep(Duration::from_millis(50));
        }
        assert!(guard.is_held());
        assert!(holder.statistics().renewals >= 2);
        guard.unlock().unwrap();
    }

    pub fn a_lease_taken_over_while_renewing_is_reported_lost(f: &Fixture) {
        // The holder's renewals are too slow for its lease; another instance takes it.
        let holder = f
            .builder()
            .time_to_live(Duration::from_millis(200))
            .renew_every(Duration::from_millis(150))
            .renewal(false)
            .build()
            .unwrap();
        let guard = holder.obtain("victim").unwrap().lock().unwrap();
        let other = f.registry().obtain("victim").unwrap();
        let taken = other
            .try_lock_for(GENEROUS)
            .unwrap()
            .expect("expired lease taken");
        match guard.renew() {
            Err(e) => assert!(e.is_lease_lost(), "{e}"),
            Ok(()) => panic!("renewing a lease another instance holds must fail"),
        }
        assert!(!guard.is_held());
        assert!(guard.unlock().unwrap_err().is_lease_lost());
        assert!(taken.is_held());
    }

    pub fn fencing_tokens_increase_across_release_takeover_and_restart(f: &Fixture) {
        let mut tokens = Vec::new();
        for _ in 0..3 {
            let registry = f.registry();
            let guard = registry.obtain("fenced").unwrap().lock().unwrap();
            tokens.push(guard.fencing_token());
            guard.unlock().unwrap();
        }
        let crashed = f.builder().renewal(false).build().unwrap();
        let stale = crashed
            .obtain("fenced")
            .unwrap()
            .lock_with_ttl(Duration::from_millis(100))
            .unwrap();
        tokens.push(stale.fencing_token());
        let next = f
            .registry()
            .obtain("fenced")
            .unwrap()
            .try_lock_for(GENEROUS)
            .unwrap();
        tokens.push(next.expect("taken over").fencing_token());
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
        drop(stale);
    }

    pub fn local_handoff_keeps_the_grant_and_sends_no_statement(f: &Fixture) {
        let registry = f.registry();
        let lock = registry.obtain("handoff").unwrap();
        let first = lock.lock().unwrap();
        let token = first.fencing_token();
        let waiting = Arc::new(Barrier::new(2));
        let waiter = {
            let (lock, waiting) = (lock.clone(), waiting.clone());
            thread::spawn(move || {
                waiting.wait();
                let guard = lock.try_lock_for(GENEROUS).unwrap().expect("handed over");
                let token = guard.fencing_token();
                guard.unlock().unwrap();
                token
            })
        };
        waiting.wait();
        // The waiter parks on the local queue before the release.
        let until = Instant::now() + GENEROUS;
        while lock.queued_threads() == 0 {
            assert!(Instant::now() < until, "the waiter never queued");
            thread::sleep(Duration::from_millis(2));
        }
        let before = registry.statistics();
        first.unlock().unwrap();
        assert_eq!(waiter.join().unwrap(), token, "a handoff keeps the grant");
        // The waiter's unlock found nobody queued: the shared grant lingers, then goes.
        let until = Instant::now() + GENEROUS;
        while registry.statistics().releases == before.releases {
            assert!(
                Instant::now() < until,
                "the lingering grant was never released"
            );
            thread::sleep(Duration::from_millis(2));
        }
        let after = registry.statistics();
        assert_eq!(after.acquires, before.acquires, "{before:?} -> {after:?}");
        assert_eq!(
            after.releases,
            before.releases + 1,
            "only the final release"
        );
    }

    /// Two threads of one registry pass a new key (its row inserted by the grant) after a hold
    /// of 150 ms, longer than `idle_between_tries`: the second gets it as a local handoff of
    /// the same grant, with no statement, and its release ends no turn, as on a key whose row
    /// exists (a turn is as long on either). Checked when both releases came within the
    /// shortest turn the default limit draws (½ × `turn_limit`) of the first `lock()`; a
    /// machine too slow for that checks only that the lock passed.
    pub fn a_new_key_is_handed_off_locally_like_any_other(f: &Fixture) {
        let shortest_turn = leasehold::Tuning::default().turn_limit.unwrap() / 2;
        let registry = f.registry();
        let key = format!("new-{}", uuid::Uuid::new_v4());
        let lock = registry.obtain(&key).unwrap();
        let asked = Instant::now();
        let first = lock.lock().unwrap();
        let token = first.fencing_token();
        let second = {
            let lock = lock.clone();
            thread::spawn(move || {
                let guard = lock.lock().unwrap();
                let token = guard.fencing_token();
                guard.unlock().unwrap();
                (token, Instant::now())
            })
        };
        let until = Instant::now() + GENEROUS;
        while lock.queued_threads() == 0 {
            assert!(Instant::now() < until, "the second thread never queued");
            thread::sleep(Duration::from_millis(2));
        }
        thread::sleep(Duration::from_millis(150));
        let before = registry.statistics();
        first.unlock().unwrap();
        let (second_token, released) = second.join().unwrap();
        let after = registry.statistics();
        if released.duration_since(asked) >= shortest_turn {
            println!(
                "the machine was too slow to check the handoff: both releases took {:?}",
                released.duration_since(asked)
            );
            return;
        }
        assert_eq!(second_token, token, "a local handoff of the grant");
        assert_eq!(
            (after.grants, after.local_handoffs, after.turns_ended),
            (before.grants, before.local_handoffs + 1, before.turns_ended),
            "{before:?} -> {after:?}"
        );
    }

    /// A registry whose threads pass a key around continuously: another instance gets the key
    /// (the turn ends at `turn_limit` and the registry stays away for a while).
    pub fn another_instance_gets_a_turn_under_continuous_local_contention(f: &Fixture) {
        let busy = f
            .builder()
            .tuning(turn_limit(Duration::from_millis(200)))
            .build()
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let mut churners = Vec::new();
        for _ in 0..3 {
            let (lock, stop) = (busy.obtain("hot").unwrap(), stop.clone());
            churners.push(thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let guard = lock.try_lock_for(GENEROUS).unwrap().expect("granted");
                    thread::sleep(Duration::from_millis(2));
                    drop(guard);
                }
            }));
        }
        thread::sleep(Duration::from_millis(100));
        let outsider = f.registry().obtain("hot").unwrap();
        let turn = outsider.try_lock_for(GENEROUS).unwrap();
        stop.store(true, Ordering::SeqCst);
        assert!(turn.is_some(), "the other instance never got the lock");
        drop(turn);
        for churner in churners {
            churner.join().unwrap();
        }
    }

    /// Turns of a registry whose threads pass a key around continuously last a random share of
    /// `turn_limit` (½ to 1 × it), not the limit each time: an instance that polls at a fixed
    /// interval from the start of a turn must not find every turn end at one phase of its
    /// polls. The turns are told apart by the registry's stay away after each (3 ×
    /// `idle_between_tries`, while handoffs within a turn follow at once); their lengths must
    /// spread over a third of the draw's range.
    pub fn turns_last_a_random_share_of_the_turn_limit(f: &Fixture) {
        const TURNS: usize = 16;
        let (limit, idle) = (Duration::from_millis(120), Duration::from_millis(20));
        let busy = f
            .builder()
            .idle_between_tries(idle)
            .tuning(turn_limit(limit))
            .build()
            .unwrap();
        let sections = Arc::new(std::sync::Mutex::new(Vec::<(Instant, Instant)>::new()));
        let give_up = Instant::now() + Duration::from_secs(120);
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let (lock, sections) = (busy.obtain("drawn").unwrap(), Arc::clone(&sections));
                let registry = busy.clone();
                thread::spawn(move || {
                    while registry.statistics().turns_ended <= TURNS as u64
                        && Instant::now() < give_up
                    {
                        let guard = lock.lock().unwrap();
                        let began = Instant::now();
                        thread::sleep(Duration::from_millis(1));
                        sections.lock().unwrap().push((began, Instant::now()));
                        guard.unlock().unwrap();
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().unwrap();
        }
        let mut sections = std::mem::take(&mut *sections.lock().unwrap());
        sections.sort();
        // A turn: sections each beginning within 30 ms of the previous one's end (the stay
        // away is 60 ms). The last, cut short by the end of the run, does not count.
        let mut turns: Vec<(Instant, Instant)> = Vec::new();
        for (began, ended) in sections {
            match turns.last_mut() {
                Some(turn) if began.saturating_duration_since(turn.1) < idle + idle / 2 => {
                    turn.1 = ended
                }
                _ => turns.push((began, ended)),
            }
        }
        turns.pop();
        assert!(turns.len() >= TURNS, "{} turns", turns.len());
        let lengths: Vec<Duration> = turns.iter().map(|(began, ended)| *ended - *began).collect();
        let (shortest, longest) = (lengths.iter().min().unwrap(), lengths.iter().max().unwrap());
        assert!(
            *longest - *shortest >= limit / 6,
            "every turn lasted about as long: {lengths:?}"
        );
    }

    /// A thread that takes `lock`, holds it past `limit` (a turn's limit) and lets go; returns
    /// the token it held.
    fn hold_past(lock: &leasehold::Lock, limit: Duration) -> thread::JoinHandle<u64> {
        let lock = lock.clone();
        thread::spawn(move || {
            let guard = lock.try_lock_for(GENEROUS).unwrap().expect("granted");
            let token = guard.fencing_token();
            thread::sleep(limit + Duration::from_millis(50));
            guard.unlock().unwrap();
            token
        })
    }

    /// Ends a turn of `registry` with `key`: a grant, a local handoff, and the second holder's
    /// release after the turn limit. Returns the grant's token.
    fn end_a_turn(registry: &leasehold::LockRegistry, key: &str, limit: Duration) -> u64 {
        end_a_turn_after(&registry.obtain(key).unwrap(), limit, || {})
    }

    /// [`end_a_turn`] of `lock`, running `meanwhile` once the turn's grant is held.
    fn end_a_turn_after(lock: &leasehold::Lock, limit: Duration, meanwhile: impl FnOnce()) -> u64 {
        let first = lock.lock().unwrap();
        let token = first.fencing_token();
        meanwhile();
        let second = hold_past(lock, limit);
        while lock.queued_threads() == 0 {
            thread::sleep(Duration::from_millis(1));
        }
        first.unlock().unwrap();
        assert_eq!(
            second.join().unwrap(),
            token,
            "a local handoff, no new grant"
        );
        token
    }

    /// The release that ends a turn reserves the row for instances that only poll (Spring's)
    /// for `idle_between_tries`: no leasehold instance takes it meanwhile, and once the
    /// reservation is over the key is free again.
    pub fn a_turn_end_reserves_the_row_for_polling_instances(f: &Fixture) {
        // A limit the handoff comes well within even on a starved machine; if the first holder
        // still overran it, there was no handoff and the turn did not end: the setup asserts it.
        let limit = Duration::from_secs(6);
        let busy = |idle: Duration| {
            f.builder()
                .idle_between_tries(idle)
                .tuning(turn_limit(limit))
                .build()
                .unwrap()
        };
        let outsider = f.registry();
        let long = busy(Duration::from_secs(120));
        end_a_turn(&long, "reserved", limit);
        let before = outsider.statistics().acquires;
        assert!(
            outsider
                .obtain("reserved")
                .unwrap()
                .try_lock()
                .unwrap()
                .is_none(),
            "another instance took the row reserved for pollers"
        );
        assert_eq!(
            outsider.statistics().acquires,
            before + 1,
            "it asked the database"
        );
        assert!(
            long.holder("reserved").unwrap().is_none(),
            "released, not held"
        );

        // A short reservation ends, and the key is granted with a larger token.
        let short = busy(Duration::from_millis(200));
        let token = end_a_turn(&short, "short", limit);
        let guard = outsider
            .obtain("short")
            .unwrap()
            .try_lock_for(GENEROUS)
            .unwrap()
            .expect("granted once the reservation is over");
        assert!(guard.fencing_token() > token);
        guard.unlock().unwrap();
        let again = outsider.obtain("reserved").unwrap();
        assert!(again.try_lock().unwrap().is_none(), "still reserved");
    }

    /// After a turn ends, the reservation keeps every leasehold instance out for 2 ×
    /// `idle_between_tries`; then the waiting line gives the key to another instance that has
    /// waited since before the turn end, ahead of the registry's own thread that comes back
    /// for it at once. On MySQL/MariaDB a place being refreshed at the instant of an acquire
    /// counts as absent for that statement (see the `lock` module docs): there the registry
    /// may come back first when its poll meets the other instance's refresh, so only the
    /// reservation is checked.
    pub fn after_a_turn_end_another_instance_gets_the_key_before_the_registry_comes_back(
        f: &Fixture,
    ) {
        let limit = Duration::from_secs(2);
        let idle = Duration::from_secs(3);
        let ours = f
            .builder()
            .idle_between_tries(idle)
            .tuning(turn_limit(limit))
            .build()
            .unwrap();
        let other = f
            .builder()
            .idle_between_tries(Duration::from_millis(50))
            .build()
            .unwrap();
        let lock = ours.obtain("aside").unwrap();
        let mut other_waits = None;
        end_a_turn_after(&lock, limit, || {
            let other_lock = other.obtain("aside").unwrap();
            other_waits = Some(thread::spawn(move || {
                let guard = other_lock
                    .try_lock_for(2 * idle + GENEROUS)
                    .unwrap()
                    .expect("granted once the reservation is over");
                let at = Instant::now();
                thread::sleep(Duration::from_millis(100));
                guard.unlock().unwrap();
                at
            }));
            while other.statistics().contended_tries == 0 {
                thread::sleep(Duration::from_millis(1));
            }
        });
        let other_waits = other_waits.expect("started while the turn ran");
        let ended = Instant::now();
        let waiter = thread::spawn(move || {
            let guard = lock.lock().unwrap();
            let at = Instant::now();
            guard.unlock().unwrap();
            at
        });
        let granted = other_waits.join().unwrap();
        let back = waiter.join().unwrap();
        assert!(
            granted >= ended + idle - Duration::from_millis(500),
            "the other instance got the key {:?} after the turn end, inside the reservation",
            granted - ended
        );
        assert!(
            back >= ended + idle - Duration::from_millis(500),
            "the registry came back {:?} after its turn end, inside the reservation",
            back - ended
        );
        if f.db != Db::Mysql {
            assert!(
                back > granted,
                "the registry came back {:?} after its turn end, before the other instance's \
                 grant ({:?} after it)",
                back - ended,
                granted - ended
            );
        }
    }

    pub fn waiting_threads_share_one_poller(f: &Fixture) {
        let holder = f.registry();
        let guard = holder.obtain("crowded").unwrap().lock().unwrap();
        // Statements one instance sends while N of its threads wait on the held key, and for
        // how long they waited.
        let polls_with = |threads: usize| {
            let waiting = f.registry();
            let window = Duration::from_millis(600);
            let started = Instant::now();
            let waiters: Vec<_> = (0..threads)
                .map(|_| {
                    let lock = waiting.obtain("crowded").unwrap();
                    thread::spawn(move || lock.try_lock_for(window).unwrap().is_none())
                })
                .collect();
            for waiter in waiters {
                assert!(waiter.join().unwrap(), "nobody may get a held lock");
            }
            (waiting.statistics().acquires, started.elapsed())
        };
        let (one, _) = polls_with(1);
        let (sixteen, waited) = polls_with(16);
        // One poller sleeps 20 ms (the fixture's idle_between_tries) after each refusal: about
        // 30 statements in 600 ms however many threads wait, fewer on a busy machine, never
        // more than one per 20 ms of the time they waited (plus one as each waiter gives up and
        // the next takes over polling). Sixteen pollers would send about 480.
        let one_poller_at_most = (waited.as_millis() / 20) as u64 + 16 + 10;
        assert!(
            sixteen <= one_poller_at_most,
            "16 waiters sent {sixteen} statements in {waited:?} (1 waiter: {one})"
        );
        assert!(one > 0, "the waiter never polled");
        guard.unlock().unwrap();
    }

    pub fn reentrant_acquire_on_one_thread_never_deadlocks(f: &Fixture) {
        let registry = f.registry();
        let lock = registry.obtain("nested").unwrap();
        let outer = lock.lock().unwrap();
        let inner = lock.try_lock().unwrap().expect("reentrant");
        assert_eq!(inner.fencing_token(), outer.fencing_token());
        inner.unlock().unwrap();
        assert!(outer.is_held());
        let other = f.registry().obtain("nested").unwrap();
        assert!(
            other.try_lock().unwrap().is_none(),
            "still held by the outer guard"
        );
        outer.unlock().unwrap();
        assert!(other.try_lock().unwrap().is_some());
    }

    pub fn held_or_waited_handles_survive_cache_eviction(f: &Fixture) {
        let registry = f
            .builder()
            .tuning(leasehold::Tuning {
                cache_capacity: 2,
                ..Default::default()
            })
            .build()
            .unwrap();
        let held = registry.obtain("keep").unwrap().lock().unwrap();
        for i in 0..10 {
            drop(registry.obtain(&format!("filler-{i}")).unwrap());
        }
        assert!(registry.cached_locks() <= 3, "idle handles evicted");
        let again = registry.obtain("keep").unwrap();
        assert!(
            again.is_held_by_current_thread(),
            "same handle as the held one"
        );
        let contender = thread::spawn(move || again.try_lock().unwrap().is_none());
        assert!(
            contender.join().unwrap(),
            "a second handle must not hold it too"
        );
        held.unlock().unwrap();
    }

    pub fn loss_channel_disconnects_on_a_normal_release(f: &Fixture) {
        let registry = f.registry();
        let guard = registry.obtain("quiet").unwrap().lock().unwrap();
        let losses = guard.loss_channel();
        guard.unlock().unwrap();
        assert!(matches!(
            losses.recv_timeout(GENEROUS),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected)
        ));
    }

    pub fn per_call_time_to_live_is_used_for_the_lease(f: &Fixture) {
        let registry = f.builder().renewal(false).build().unwrap();
        let lock = registry.obtain("short").unwrap();
        let guard = lock.lock_with_ttl(Duration::from_millis(200)).unwrap();
        assert!(guard.remaining() <= Duration::from_millis(200));
        thread::sleep(Duration::from_millis(250));
        assert!(!guard.is_held());
        assert!(matches!(
            guard.unlock(),
            Err(Error::LeaseLost {
                reason: LossReason::Expired(_),
                ..
            })
        ));
    }

    pub fn with_lock_runs_the_work_under_the_lock_and_reports_a_lost_lease(f: &Fixture) {
        let registry = f.registry();
        let other = f.registry();
        let lock = registry.obtain("closure").unwrap();
        let seen = lock
            .with_lock(|guard| {
                assert!(guard.is_held());
                let taken = other.obtain("closure").unwrap().try_lock().unwrap();
                (taken.is_none(), guard.fencing_token())
            })
            .unwrap();
        assert!(seen.0, "another instance got the lock during the work");
        assert!(!lock.is_held_by_current_thread(), "unlocked after the work");
        assert!(other
            .obtain("closure")
            .unwrap()
            .try_lock()
            .unwrap()
            .is_some());
        let short = f
            .builder()
            .time_to_live(Duration::from_millis(50))
            .renewal(false)
            .build()
            .unwrap();
        let lost = short
            .obtain("closure-lost")
            .unwrap()
            .with_lock(|_| thread::sleep(Duration::from_millis(120)));
        assert!(lost.unwrap_err().is_lease_lost());
        // The re-exported channel crate selects over a loss and another channel.
        let guard = registry.obtain("select").unwrap().lock().unwrap();
        let (_keep, idle) = leasehold::crossbeam_channel::bounded::<()>(1);
        leasehold::crossbeam_channel::select! {
            recv(guard.loss_channel()) -> lost => panic!("lost: {lost:?}"),
            recv(idle) -> _ => panic!("nothing was sent"),
            default(Duration::from_millis(20)) => {}
        }
        guard.unlock().unwrap();
    }

    pub fn an_empty_prefix_is_refused_where_lock_is_reserved(f: &Fixture) {
        if f.db != Db::Mysql {
            return; // SQLite and PostgreSQL accept a table named LOCK.
        }
        match f.builder().prefix("").create_table(true).build() {
            Err(Error::InvalidSetting { setting, reason }) => {
                assert_eq!(setting, "prefix");
                assert!(reason.contains("reserved"), "{reason}");
            }
            other => panic!("expected a prefix error, got {other:?}"),
        }
    }

    pub fn absurd_durations_are_refused_when_building(f: &Fixture) {
        let setting = |result: leasehold::Result<leasehold::LockRegistry>| match result {
            Err(Error::InvalidSetting { setting, .. }) => setting,
            other => panic!("expected a setting error, got {other:?}"),
        };
        assert_eq!(
            setting(f.builder().operation_timeout(Duration::MAX).build()),
            "operation_timeout"
        );
        assert_eq!(
            setting(f.builder().connect_timeout(Duration::MAX).build()),
            "connect_timeout"
        );
        assert_eq!(
            setting(f.builder().tuning(turn_limit(Duration::MAX)).build()),
            "turn_limit"
        );
        let tuning = |tuning: leasehold::Tuning| setting(f.builder().tuning(tuning).build());
        assert_eq!(
            tuning(leasehold::Tuning {
                linger: Duration::MAX,
                ..Default::default()
            }),
            "linger"
        );
        assert_eq!(
            tuning(leasehold::Tuning {
                renewal_pool_size: 0,
                ..Default::default()
            }),
            "renewal_pool_size"
        );
        assert_eq!(
            tuning(leasehold::Tuning {
                idle_connection_timeout: Duration::MAX,
                ..Default::default()
            }),
            "idle_connection_timeout"
        );
        assert_eq!(setting(f.builder().pool_size(0).build()), "pool_size");
        assert_eq!(
            setting(f.builder().listener_url(" ").build()),
            "listener_url"
        );
        assert_eq!(
            setting(f.builder().pool_size(u32::MAX).build()),
            "pool_size"
        );
        // A renewal period that leaves no time for a second attempt before the lease ends.
        assert_eq!(
            setting(
                f.builder()
                    .time_to_live(Duration::from_secs(10))
                    .renew_every(Duration::from_millis(9900))
                    .build()
            ),
            "time_to_live"
        );
        let registry = f
            .builder()
            .time_to_live(Duration::from_secs(10))
            .renew_every(Duration::from_secs(5))
            .operation_timeout(leasehold::MAX_TIMEOUT)
            .build()
            .unwrap();
        registry
            .obtain("fits")
            .unwrap()
            .lock()
            .unwrap()
            .unlock()
            .unwrap();
    }

    pub fn the_holder_gives_up_before_the_database_by_the_drift_allowance(f: &Fixture) {
        let registry = f.registry();
        let ttl = Duration::from_secs(10);
        let guard = registry
            .obtain("drift")
            .unwrap()
            .lock_with_ttl(ttl)
            .unwrap();
        let allowance = ttl / 100 + Duration::from_millis(2);
        assert!(
            guard.remaining() <= ttl - allowance,
            "{:?} left of a {ttl:?} lease",
            guard.remaining()
        );
        assert!(guard.remaining() > ttl / 2);
        guard.unlock().unwrap();
    }

    pub fn a_nested_acquire_of_a_lost_lease_reports_the_loss(f: &Fixture) {
        let registry = f
            .builder()
            .time_to_live(Duration::from_millis(50))
            .renewal(false)
            .build()
            .unwrap();
        let lock = registry.obtain("nested").unwrap();
        let outer = lock.lock().unwrap();
        thread::sleep(Duration::from_millis(100));
        match lock.try_lock() {
            Err(e) => assert!(e.is_lease_lost(), "{e}"),
            Ok(guard) => panic!(
                "a nested try_lock on a lost lease returned {:?}",
                guard.map(|g| g.is_held())
            ),
        }
        assert!(outer.unlock().unwrap_err().is_lease_lost());
    }

    pub fn without_local_handoff_every_holder_gets_its_own_token(f: &Fixture) {
        let registry = f
            .builder()
            .tuning(leasehold::Tuning {
                local_handoff: false,
                ..Default::default()
            })
            .build()
            .unwrap();
        let lock = registry.obtain("own-token").unwrap();
        let first = lock.lock().unwrap();
        let first_token = first.fencing_token();
        let next = {
            let lock = lock.clone();
            thread::spawn(move || {
                let guard = lock.lock().unwrap();
                let token = guard.fencing_token();
                guard.unlock().unwrap();
                token
            })
        };
        let until = Instant::now() + GENEROUS;
        while lock.queued_threads() == 0 {
            assert!(Instant::now() < until, "the next thread never queued");
            thread::sleep(Duration::from_millis(2));
        }
        first.unlock().unwrap();
        let next_token = next.join().unwrap();
        assert!(next_token > first_token, "{next_token} after {first_token}");
        let stats = registry.statistics();
        assert_eq!((stats.grants, stats.releases), (2, 2), "{stats:?}");
    }

    pub fn a_previous_holders_loss_channel_ends_at_the_handoff(f: &Fixture) {
        // Not renewed: the lease must last until the next thread has queued and been handed
        // it (3 s), then expire in its hands (it shortens it to 100 ms).
        let registry = f
            .builder()
            .time_to_live(Duration::from_secs(3))
            .renewal(false)
            .build()
            .unwrap();
        let lock = registry.obtain("handed").unwrap();
        let first = lock.lock().unwrap();
        let first_losses = first.loss_channel();
        let next = {
            let lock = lock.clone();
            thread::spawn(move || {
                let guard = lock.lock().unwrap();
                let losses = guard.loss_channel();
                guard.renew_with_ttl(Duration::from_millis(100)).unwrap();
                let lost = losses.recv_timeout(GENEROUS).is_ok();
                drop(guard);
                lost
            })
        };
        let until = Instant::now() + GENEROUS;
        while lock.queued_threads() == 0 {
            assert!(Instant::now() < until, "the next thread never queued");
            thread::sleep(Duration::from_millis(2));
        }
        first.unlock().unwrap();
        assert!(next.join().unwrap(), "the next holder's loss was reported");
        assert_eq!(
            first_losses.recv_timeout(GENEROUS),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected),
            "the first holder's channel must end at the handoff, not report the next loss"
        );
    }

    pub fn bad_input_gets_typed_errors(f: &Fixture) {
        let registry = f.registry();
        assert!(matches!(registry.obtain(""), Err(Error::InvalidKey { .. })));
        let long = "x".repeat(leasehold::MAX_KEY_BYTES + 1);
        assert!(matches!(
            registry.obtain(&long),
            Err(Error::InvalidKey { .. })
        ));
        let odd = registry.obtain("nul\0and ключ").unwrap();
        odd.lock().unwrap().unlock().unwrap();
        let lock = registry.obtain("k").unwrap();
        for ttl in [Duration::ZERO, Duration::from_secs(10 * 365 * 24 * 3600)] {
            assert!(matches!(
                lock.try_lock_with_ttl(ttl),
                Err(Error::InvalidSetting {
                    setting: "time_to_live",
                    ..
                })
            ));
        }
        let setting = |result: leasehold::Result<leasehold::LockRegistry>| match result {
            Err(Error::InvalidSetting { setting, .. }) => setting,
            other => panic!("expected a setting error, got {other:?}"),
        };
        assert_eq!(
            setting(f.builder().prefix("INT_; DROP TABLE x").build()),
            "prefix"
        );
        assert_eq!(
            setting(f.builder().region("r".repeat(101)).build()),
            "region"
        );
        assert_eq!(setting(f.builder().region("").build()), "region");
        assert_eq!(
            setting(f.builder().time_to_live(Duration::ZERO).build()),
            "time_to_live"
        );
        assert_eq!(
            setting(f.builder().idle_between_tries(Duration::ZERO).build()),
            "idle_between_tries"
        );
        assert_eq!(
            setting(
                f.builder()
                    .tuning(leasehold::Tuning {
                        cache_capacity: 0,
                        ..Default::default()
                    })
                    .build()
            ),
            "cache_capacity"
        );
        assert_eq!(setting(f.builder().client_id("").build()), "client_id");
        // The table survived all of it.
        assert!(registry.obtain("k").unwrap().try_lock().unwrap().is_some());
    }

    pub fn a_missing_table_is_named_with_the_file_to_run(f: &Fixture) {
        let result = f.builder().prefix(format!("{}absent_", f.prefix)).build();
        match result {
            Err(Error::TableMissing { table, ddl_file }) => {
                assert!(table.ends_with("absent_LOCK"), "{table}");
                let expected = match f.db {
                    Db::Sqlite => "sql/sqlite.sql",
                    Db::Postgres => "sql/postgres.sql",
                    Db::Mysql => "sql/mysql.sql",
                };
                assert_eq!(ddl_file, expected);
            }
            other => panic!("expected TableMissing, got {other:?}"),
        }
    }

    pub fn regions_do_not_conflict(f: &Fixture) {
        let east = f.builder().region("east").build().unwrap();
        let west = f.builder().region("west").build().unwrap();
        let a = east.obtain("shared-name").unwrap().lock().unwrap();
        let b = west.obtain("shared-name").unwrap().try_lock().unwrap();
        assert!(b.is_some(), "same key, different region");
        drop(a);
    }

    pub fn a_full_pool_does_not_starve_renewals(f: &Fixture) {
        let others = f.registry();
        let held_elsewhere: Vec<_> = (0..4)
            .map(|i| {
                others
                    .obtain(&format!("elsewhere-{i}"))
                    .unwrap()
                    .lock()
                    .unwrap()
            })
            .collect();
        // Renewed every second, the lease survives a renewal up to two seconds late; the
        // pollers keep the only main connection busy for longer than the lease lasts.
        let ttl = Duration::from_secs(3);
        // The release at the end may wait for the one main connection while a poller's last
        // attempt (given up at its deadline, so its connection is discarded when it ends)
        // still runs on a statement thread (MySQL); the discarded connection is then replaced
        // for the release (once it was not, and the release waited out its deadline:
        // `failpoints.rs` forces that case). A loaded machine may make the wait seconds long.
        let busy = f
            .builder()
            .pool_size(1)
            .idle_between_tries(Duration::from_millis(1))
            .time_to_live(ttl)
            .operation_timeout(GENEROUS)
            .build()
            .unwrap();
        let guard = busy.obtain("mine").unwrap().lock().unwrap();
        let pollers: Vec<_> = (0..4)
            .map(|i| {
                let lock = busy.obtain(&format!("elsewhere-{i}")).unwrap();
                thread::spawn(move || {
                    lock.try_lock_for(ttl + Duration::from_millis(500))
                        .unwrap()
                        .is_none()
                })
            })
            .collect();
        for poller in pollers {
            assert!(poller.join().unwrap());
        }
        assert!(
            guard.is_held(),
            "the lease expired while pollers held the pool"
        );
        assert!(busy.statistics().renewals >= 2);
        guard.unlock().unwrap();
        drop(held_elsewhere);
    }

    pub fn the_database_clock_is_readable_and_near_ours(f: &Fixture) {
        let registry = f.registry();
        let (at, round_trip) = registry.database_time().unwrap();
        let now = std::time::SystemTime::now();
        let skew = now.duration_since(at).unwrap_or_else(|e| e.duration());
        assert!(
            skew < Duration::from_secs(60),
            "database clock {at:?} vs ours {now:?}"
        );
        assert!(round_trip < GENEROUS);
    }

    pub fn a_custom_statement_that_does_not_fit_is_rejected(f: &Fixture) {
        let result = f
            .builder()
            .custom_sql(leasehold::CustomSql {
                renew: Some(format!("UPDATE {} SET NO_SUCH_COLUMN = 1", f.table())),
                ..Default::default()
            })
            .build();
        assert!(
            matches!(
                result,
                Err(Error::InvalidStatement {
                    statement: "renew",
                    ..
                })
            ),
            "{result:?}"
        );
    }

    pub fn the_default_statements_are_shown_and_work_as_replacements(f: &Fixture) {
        let defaults = f.registry().statements().clone();
        for statement in [&defaults.acquire, &defaults.renew, &defaults.release] {
            assert!(statement.contains(&f.table()), "{statement}");
        }
        // The defaults, passed back as replacements, pass the build check and lock.
        let registry = f
            .builder()
            .custom_sql(leasehold::CustomSql {
                acquire: Some(defaults.acquire.clone()),
                renew: Some(defaults.renew.clone()),
                release: Some(defaults.release.clone()),
            })
            .build()
            .unwrap();
        assert_eq!(registry.statements(), &defaults);
        let guard = registry.obtain("replaced").unwrap().lock().unwrap();
        guard.renew().unwrap();
        guard.unlock().unwrap();
        assert_eq!(registry.statistics().grants, 1);
    }

    /// A sync library called from async code blocks that thread (use `spawn_blocking`), but it
    /// must still work: the PostgreSQL driver cannot start its own runtime inside another.
    pub fn calls_from_inside_an_async_runtime_work(f: &Fixture) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let token = runtime.block_on(async {
            let registry = f.registry();
            let guard = registry.obtain("from-async").unwrap().lock().unwrap();
            guard.renew().unwrap();
            let token = guard.fencing_token();
            guard.unlock().unwrap();
            token
        });
        let again = f.registry().obtain("from-async").unwrap().lock().unwrap();
        assert!(again.fencing_token() > token);
    }
}

/// Default tuning with this turn limit.
fn turn_limit(limit: std::time::Duration) -> leasehold::Tuning {
    leasehold::Tuning {
        turn_limit: Some(limit),
        ..Default::default()
    }
}

macro_rules! conformance {
    ($db:expr) => {
        crate::suite_for!($db;
            lock_renew_and_unlock_round_trip,
            a_held_lock_is_refused_to_another_instance_until_released,
            mutual_exclusion_holds_across_two_registries_and_many_threads,
            expired_lease_is_taken_over_by_another_instance,
            renewal_keeps_a_lease_past_its_time_to_live,
            a_lease_taken_over_while_renewing_is_reported_lost,
            fencing_tokens_increase_across_release_takeover_and_restart,
            local_handoff_keeps_the_grant_and_sends_no_statement,
            another_instance_gets_a_turn_under_continuous_local_contention,
            turns_last_a_random_share_of_the_turn_limit,
            a_new_key_is_handed_off_locally_like_any_other,
            a_turn_end_reserves_the_row_for_polling_instances,
            after_a_turn_end_another_instance_gets_the_key_before_the_registry_comes_back,
            waiting_threads_share_one_poller,
            reentrant_acquire_on_one_thread_never_deadlocks,
            held_or_waited_handles_survive_cache_eviction,
            loss_channel_disconnects_on_a_normal_release,
            per_call_time_to_live_is_used_for_the_lease,
            bad_input_gets_typed_errors,
            absurd_durations_are_refused_when_building,
            an_empty_prefix_is_refused_where_lock_is_reserved,
            with_lock_runs_the_work_under_the_lock_and_reports_a_lost_lease,
            the_holder_gives_up_before_the_database_by_the_drift_allowance,
            a_nested_acquire_of_a_lost_lease_reports_the_loss,
            a_previous_holders_loss_channel_ends_at_the_handoff,
            without_local_handoff_every_holder_gets_its_own_token,
            a_missing_table_is_named_with_the_file_to_run,
            regions_do_not_conflict,
            a_custom_statement_that_does_not_fit_is_rejected,
            the_default_statements_are_shown_and_work_as_replacements,
            calls_from_inside_an_async_runtime_work,
            the_database_clock_is_readable_and_near_ours,
            a_full_pool_does_not_starve_renewals,
        );
    };
}

#[cfg(feature = "sqlite")]
mod sqlite {
    conformance!(crate::common::Db::Sqlite);
}

#[cfg(feature = "postgres")]
mod postgres {
    conformance!(crate::common::Db::Postgres);
}

#[cfg(feature = "mysql")]
mod mysql {
    conformance!(crate::common::Db::Mysql);
}

#[cfg(all(feature = "postgres", unix))]
mod postgres_through_pgbouncer {
    conformance!(crate::common::pgbouncer::through_pgbouncer());
}
