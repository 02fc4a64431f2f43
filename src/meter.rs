//! What a registry measures about its locks: the figures of [`Statistics`]
//! beyond statement counts, and — with the `metrics` feature — the same events sent to the
//! [`metrics`](https://docs.rs/metrics) facade, for whatever exporter the application installed
//! (Prometheus, StatsD, …).
//!
//! One [`Meter`] per registry, shared by its locks and leases. Every event is a few relaxed
//! atomic additions; with `metrics` on, also one call into the installed recorder (a no-op when
//! none is installed) with a metric key built when the registry was (only per-key metrics
//! under `metrics_key_labels` build theirs per event). Nothing here blocks or runs user code.
//!
//! The metric names are listed in the docs of [`Statistics`].

use crate::error::LossReason;
use crate::Statistics;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

/// The measures of one registry (see the module docs).
#[derive(Default)]
pub(crate) struct Meter {
    grants_database: AtomicU64,
    local_handoffs: AtomicU64,
    contended_tries: AtomicU64,
    turns_ended: AtomicU64,
    lost_expired: AtomicU64,
    lost_not_owner: AtomicU64,
    renewed: AtomicU64,
    renewals_failed: AtomicU64,
    held: AtomicI64,
    wait_nanos: AtomicU64,
    hold_nanos: AtomicU64,
    renewal_nanos: AtomicU64,
    renewal_nanos_max: AtomicU64,
    #[cfg(feature = "metrics")]
    labels: Labels,
}

/// The registry's metric keys, built once: an event then hands the recorder a key it already
/// has (no label strings copied, no key hashed), and costs nothing more than the facade's
/// call when no recorder is installed. Only the per-key metrics with
/// `Tuning::metrics_key_labels` on build their key per event.
#[cfg(feature = "metrics")]
struct Labels {
    per_key: bool,
    grants_database: metrics::Key,
    grants_local_handoff: metrics::Key,
    contended_tries: metrics::Key,
    turns_ended: metrics::Key,
    lost_expired: metrics::Key,
    lost_not_owner: metrics::Key,
    renewals: metrics::Key,
    renewals_failed: metrics::Key,
    wait_seconds: metrics::Key,
    hold_seconds: metrics::Key,
    renewal_seconds: metrics::Key,
    held_leases: metrics::Key,
}

/// What the `metrics` macros would pass for a metric registered in this module.
#[cfg(feature = "metrics")]
static METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

#[cfg(feature = "metrics")]
impl Default for Labels {
    fn default() -> Labels {
        Labels::new("", "", false)
    }
}

#[cfg(feature = "metrics")]
impl Labels {
    fn new(table: &str, region: &str, per_key: bool) -> Labels {
        let table = metrics::SharedString::from(std::sync::Arc::<str>::from(table));
        let region = metrics::SharedString::from(std::sync::Arc::<str>::from(region));
        let key = |name: &'static str, extra: Option<(&'static str, &'static str)>| {
            let mut labels = vec![
                metrics::Label::new("table", table.clone()),
                metrics::Label::new("region", region.clone()),
            ];
            if let Some((label, value)) = extra {
                labels.push(metrics::Label::from_static_parts(label, value));
            }
            metrics::Key::from_parts(name, labels)
        };
        Labels {
            grants_database: key("leasehold_grants_total", Some(("via", "database"))),
            grants_local_handoff: key("leasehold_grants_total", Some(("via", "local_handoff"))),
            contended_tries: key("leasehold_contended_tries_total", None),
            turns_ended: key("leasehold_turns_ended_total", None),
            lost_expired: key("leasehold_leases_lost_total", Some(("reason", "expired"))),
            lost_not_owner: key("leasehold_leases_lost_total", Some(("reason", "not_owner"))),
            renewals: key("leasehold_renewals_total", None),
            renewals_failed: key("leasehold_renewals_failed_total", None),
            wait_seconds: key("leasehold_wait_seconds", None),
            hold_seconds: key("leasehold_hold_seconds", None),
            renewal_seconds: key("leasehold_renewal_seconds", None),
            held_leases: key("leasehold_held_leases", None),
            per_key,
        }
    }

    /// `registry_key` (a per-key metric's key without `key`), or with `metrics_key_labels`
    /// the same with the label `key` = `lock_key` (after the others, as before).
    fn per_key<'k>(
        &self,
        registry_key: &'k metrics::Key,
        lock_key: &str,
    ) -> std::borrow::Cow<'k, metrics::Key> {
        if !self.per_key {
            return std::borrow::Cow::Borrowed(registry_key);
        }
        let mut labels: Vec<metrics::Label> = registry_key.labels().cloned().collect();
        labels.push(metrics::Label::new("key", lock_key.to_string()));
        std::borrow::Cow::Owned(metrics::Key::from_parts(
            registry_key.name().to_string(),
            labels,
        ))
    }

    fn counter(key: &metrics::Key, by: u64) {
        metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA)).increment(by);
    }

    fn histogram(key: &metrics::Key, value: f64) {
        metrics::with_recorder(|recorder| recorder.register_histogram(key, &METADATA))
            .record(value);
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

impl Meter {
    /// The meter of a registry on `table` and `region`; `per_key`: label per-key metrics with
    /// the key.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub fn new(table: &str, region: &str, per_key: bool) -> Meter {
        Meter {
            #[cfg(feature = "metrics")]
            labels: Labels::new(table, region, per_key),
            ..Meter::default()
        }
    }

    /// A caller was granted `key` after waiting `waited`, by a statement or a local handoff.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub fn granted(&self, key: &str, handed_over: bool, waited: Duration) {
        let counter = match handed_over {
            true => &self.local_handoffs,
            false => &self.grants_database,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.wait_nanos.fetch_add(nanos(waited), Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        {
            let labels = &self.labels;
            let grants = match handed_over {
                true => &labels.grants_local_handoff,
                false => &labels.grants_database,
            };
            Labels::counter(&labels.per_key(grants, key), 1);
            Labels::histogram(
                &labels.per_key(&labels.wait_seconds, key),
                waited.as_secs_f64(),
            );
        }
    }

    /// An acquire statement for `key` found it held elsewhere.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub fn contended(&self, key: &str) {
        self.contended_tries.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        Labels::counter(&self.labels.per_key(&self.labels.contended_tries, key), 1);
    }

    /// A release of `key` ended a turn (see "Bounded turn" in the `lock` module docs).
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub fn turn_ended(&self, key: &str) {
        self.turns_ended.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        Labels::counter(&self.labels.per_key(&self.labels.turns_ended, key), 1);
    }

    /// A holder of `key` let go after `held_for`.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub fn released(&self, key: &str, held_for: Duration) {
        self.hold_nanos
            .fetch_add(nanos(held_for), Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        Labels::histogram(
            &self.labels.per_key(&self.labels.hold_seconds, key),
            held_for.as_secs_f64(),
        );
    }

    /// A lease of `key` was lost (reported once per lease).
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub fn lost(&self, key: &str, reason: &LossReason) {
        let not_owner = matches!(reason, LossReason::NotOwner);
        let counter = match not_owner {
            true => &self.lost_not_owner,
            false => &self.lost_expired,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        {
            let lost = match not_owner {
                true => &self.labels.lost_not_owner,
                false => &self.labels.lost_expired,
            };
            Labels::counter(&self.labels.per_key(lost, key), 1);
        }
    }

    /// One renew statement took `latency`: `renewed` leases renewed, `failed` with an unknown
    /// outcome.
    pub fn renewal(&self, latency: Duration, renewed: u64, failed: u64) {
        self.renewed.fetch_add(renewed, Ordering::Relaxed);
        self.renewals_failed.fetch_add(failed, Ordering::Relaxed);
        self.renewal_nanos
            .fetch_add(nanos(latency), Ordering::Relaxed);
        self.renewal_nanos_max
            .fetch_max(nanos(latency), Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        {
            let labels = &self.labels;
            Labels::counter(&labels.renewals, renewed);
            Labels::counter(&labels.renewals_failed, failed);
            Labels::histogram(&labels.renewal_seconds, latency.as_secs_f64());
        }
    }

    /// A lease began (`+1`) or ended (`-1`: released or lost, once).
    pub fn held(&self, change: i64) {
        let _now = self.held.fetch_add(change, Ordering::Relaxed) + change;
        #[cfg(feature = "metrics")]
        metrics::with_recorder(|recorder| {
            recorder.register_gauge(&self.labels.held_leases, &METADATA)
        })
        .set(_now.max(0) as f64);
    }

    /// Adds the figures so far to `stats` (which has the statement counts).
    pub fn add_to(&self, stats: &mut Statistics) {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let time = |counter: &AtomicU64| Duration::from_nanos(read(counter));
        stats.local_handoffs = read(&self.local_handoffs);
        stats.contended_tries = read(&self.contended_tries);
        stats.turns_ended = read(&self.turns_ended);
        stats.leases_lost_expired = read(&self.lost_expired);
        stats.leases_lost_not_owner = read(&self.lost_not_owner);
        stats.leases_renewed = read(&self.renewed);
        stats.renewals_failed = read(&self.renewals_failed);
        stats.held_leases = self.held.load(Ordering::Relaxed).max(0) as u64;
        stats.wait_time = time(&self.wait_nanos);
        stats.hold_time = time(&self.hold_nanos);
        stats.renewal_time = time(&self.renewal_nanos);
        stats.longest_renewal = time(&self.renewal_nanos_max);
    }
}
