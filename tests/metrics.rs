//! Metrics: the figures reach a real recorder of the `metrics` facade
//! (`metrics-util`'s debugging recorder, installed for this whole test binary) and the
//! extended `Statistics`, with the names, labels and units the README lists. One test, since a
//! process has one global recorder.

#![cfg(all(feature = "metrics", feature = "sqlite"))]

mod common;

use common::{Db, Fixture};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use std::collections::HashMap;
use std::thread;
use std::time::{Duration, Instant};

const GENEROUS: Duration = Duration::from_secs(30);

/// Counter totals and histogram sample counts, by metric name and sorted labels.
#[derive(Default)]
struct Seen {
    counters: HashMap<String, u64>,
    histograms: HashMap<String, Vec<f64>>,
    gauges: HashMap<String, f64>,
}

impl Seen {
    /// Adds a snapshot (the recorder hands each counter increment and sample out once).
    fn take(&mut self, snapshotter: &Snapshotter) {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let key = key.key();
            let mut labels: Vec<String> = key
                .labels()
                .map(|label| format!("{}={}", label.key(), label.value()))
                .collect();
            labels.sort();
            let name = format!("{}{{{}}}", key.name(), labels.join(","));
            match value {
                DebugValue::Counter(n) => *self.counters.entry(name).or_default() += n,
                DebugValue::Histogram(samples) => self
                    .histograms
                    .entry(name)
                    .or_default()
                    .extend(samples.into_iter().map(|s| s.into_inner())),
                DebugValue::Gauge(value) => {
                    self.gauges.insert(name, value.into_inner());
                }
            }
        }
    }

    /// The sum of the counters named `name` whose labels include every one of `labels`.
    fn counter(&self, name: &str, labels: &[&str]) -> u64 {
        self.counters
            .iter()
            .filter(|(key, _)| matches(key, name, labels))
            .map(|(_, n)| n)
            .sum()
    }

    fn samples(&self, name: &str, labels: &[&str]) -> usize {
        self.histograms
            .iter()
            .filter(|(key, _)| matches(key, name, labels))
            .map(|(_, samples)| samples.len())
            .sum()
    }
}

fn matches(key: &str, name: &str, labels: &[&str]) -> bool {
    key.starts_with(&format!("{name}{{")) && labels.iter().all(|label| key.contains(label))
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + GENEROUS;
    while !done() {
        assert!(Instant::now() < until, "timed out waiting until {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn grants_waits_holds_renewals_and_losses_reach_the_recorder_and_the_statistics() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this process");
    let f = Fixture::new(Db::Sqlite, "metrics").unwrap();
    let node = f
        .builder()
        .time_to_live(Duration::from_secs(3))
        .tuning(leasehold::Tuning {
            metrics_key_labels: true,
            ..Default::default()
        })
        .build()
        .unwrap();
    let other = f.registry();
    let table = format!("table={}", f.table());

    // A database grant, a contended try by another instance, a local handoff.
    let lock = node.obtain("report").unwrap();
    let first = lock.lock().unwrap();
    assert!(other
        .obtain("report")
        .unwrap()
        .try_lock()
        .unwrap()
        .is_none());
    let next = {
        let lock = lock.clone();
        thread::spawn(move || {
            let guard = lock.lock().unwrap();
            thread::sleep(Duration::from_millis(20));
            guard.unlock().unwrap();
        })
    };
    wait_until("a second thread queues", || lock.queued_threads() == 1);
    thread::sleep(Duration::from_millis(20));
    first.unlock().unwrap();
    next.join().unwrap();

    // A renewal, then a loss found by a renewal (an operator freed the row) ...
    let renewed = node.obtain("renewed").unwrap().lock().unwrap();
    wait_until("a renewal", || node.statistics().leases_renewed >= 1);
    assert!(other.force_release("renewed").unwrap());
    renewed
        .loss_channel()
        .recv_timeout(GENEROUS)
        .expect("the renewal finds the row freed");
    drop(renewed);
    // ... and a loss at the deadline (renewal off).
    let unrenewed = f.builder().renewal(false).build().unwrap();
    let expiring = unrenewed
        .obtain("expiring")
        .unwrap()
        .lock_with_ttl(Duration::from_millis(300))
        .unwrap();
    expiring.loss_channel().recv_timeout(GENEROUS).unwrap();
    drop(expiring);

    // A turn end: two threads of a registry with a short `local_handoff_limit` hand a key
    // back and forth until a release leaves it to other instances.
    let turner = f
        .builder()
        .tuning(leasehold::Tuning {
            turn_limit: Some(Duration::from_millis(100)),
            ..Default::default()
        })
        .build()
        .unwrap();
    let turned = turner.obtain("turned").unwrap();
    let until = Instant::now() + GENEROUS;
    let players: Vec<_> = (0..2)
        .map(|_| {
            let (turned, turner) = (turned.clone(), turner.clone());
            thread::spawn(move || {
                while turner.statistics().turns_ended == 0 && Instant::now() < until {
                    let guard = turned.lock().unwrap();
                    thread::sleep(Duration::from_millis(10));
                    guard.unlock().unwrap();
                }
            })
        })
        .collect();
    for player in players {
        player.join().unwrap();
    }
    let turns_ended = turner.statistics().turns_ended;
    assert!(turns_ended >= 1, "no turn ended in {GENEROUS:?}");

    let stats = node.statistics();
    assert_eq!(stats.turns_ended, 0, "{stats:?}");
    assert_eq!(stats.local_handoffs, 1, "{stats:?}");
    assert_eq!(stats.grants, 2, "{stats:?}");
    assert_eq!(stats.leases_lost_not_owner, 1, "{stats:?}");
    assert_eq!(stats.leases_lost_expired, 0, "{stats:?}");
    assert!(stats.leases_renewed >= 1, "{stats:?}");
    assert_eq!(stats.held_leases, 0, "{stats:?}");
    assert!(stats.wait_time >= Duration::from_millis(20), "{stats:?}");
    assert!(stats.hold_time >= Duration::from_millis(40), "{stats:?}");
    assert!(stats.longest_renewal > Duration::ZERO, "{stats:?}");
    assert_eq!(other.statistics().contended_tries, 1);
    assert_eq!(unrenewed.statistics().leases_lost_expired, 1);

    let mut seen = Seen::default();
    seen.take(&snapshotter);
    let grants = "leasehold_grants_total";
    assert_eq!(
        seen.counter(grants, &[&table, "via=database", "key=report"]),
        1
    );
    assert_eq!(
        seen.counter(grants, &[&table, "via=local_handoff", "key=report"]),
        1
    );
    // Without key labels (the default), the other registry's series carry none; the turn's
    // threads, back in line during the reservation that ended their turn, count theirs too.
    let contended: u64 = [&node, &other, &unrenewed, &turner]
        .iter()
        .map(|registry| registry.statistics().contended_tries)
        .sum();
    assert_eq!(
        seen.counter("leasehold_contended_tries_total", &[&table]),
        contended
    );
    assert!(seen
        .counters
        .keys()
        .filter(|key| key.starts_with("leasehold_contended_tries_total"))
        .all(|key| !key.contains("key=")));
    assert_eq!(
        seen.counter("leasehold_turns_ended_total", &[&table]),
        turns_ended
    );
    let lost = "leasehold_leases_lost_total";
    assert_eq!(seen.counter(lost, &["reason=not_owner", "key=renewed"]), 1);
    assert_eq!(seen.counter(lost, &["reason=expired"]), 1);
    assert!(seen.counter("leasehold_renewals_total", &[&table]) >= 1);
    assert!(seen.samples("leasehold_wait_seconds", &["key=report"]) >= 2);
    assert!(seen.samples("leasehold_hold_seconds", &["key=report"]) >= 2);
    assert!(seen.samples("leasehold_renewal_seconds", &[&table]) >= 1);
    let waits = &seen.histograms[&seen
        .histograms
        .keys()
        .find(|key| matches(key, "leasehold_wait_seconds", &["key=report"]))
        .unwrap()
        .clone()];
    assert!(
        waits.iter().any(|&seconds| seconds >= 0.02),
        "the handed-over thread waited at least 20 ms, in seconds: {waits:?}"
    );
    assert!(seen
        .gauges
        .iter()
        .any(|(key, value)| key.starts_with("leasehold_held_leases") && *value == 0.0));
}
