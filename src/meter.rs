//! What a registry measures about its locks: the figures of [`Statistics`](crate::Statistics)
//! beyond statement counts, and — with the `metrics` feature — the same events sent to the
//! [`metrics`](https://docs.rs/metrics) facade, for whatever exporter the application installed
//! (Prometheus, StatsD, …).
//!
//! One [`Meter`] per registry, shared by its locks and leases. Every event is a few relaxed
//! atomic additions; with `metrics` on, also one call into the installed recorder (a no-op when
//! none is installed). Nothing here blocks or runs user code.
//!
//! # Metric names (feature `metrics`)
//!
//! Every metric carries the labels `table` and `region`; with
//! [`RegistryBuilder::metrics_key_labels`](crate::RegistryBuilder::metrics_key_labels) the
//! per-key ones also carry `key` (off by default: one series per lock name can be many).
//!
//! | name | kind | labels | what |
//! |------|------|--------|------|
//! | `leasehold_grants_total` | counter | `via` = `database` / `local_handoff`, key | locks granted to a caller |
//! | `leasehold_contended_tries_total` | counter | key | acquire statements that found the lock held elsewhere |
//! | `leasehold_leases_lost_total` | counter | `reason` = `expired` / `not_owner`, key | leases lost |
//! | `leasehold_renewals_total` | counter | | leases renewed in the background or by hand |
//! | `leasehold_renewals_failed_total` | counter | | renewals whose outcome is unknown (no answer, an error, a row locked by another session) |
//! | `leasehold_wait_seconds` | histogram | key | from a lock call to its grant |
//! | `leasehold_hold_seconds` | histogram | key | from a grant to its release, per holder |
//! | `leasehold_renewal_seconds` | histogram | | one renew statement (a batch counts once) |
//! | `leasehold_held_leases` | gauge | | leases this registry holds now |

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

#[cfg(feature = "metrics")]
#[derive(Default)]
struct Labels {
    table: String,
    region: String,
    per_key: bool,
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
            labels: Labels {
                table: table.to_string(),
                region: region.to_string(),
                per_key,
            },
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
            let via = if handed_over {
                "local_handoff"
            } else {
                "database"
            };
            let mut labels = self.labels(Some(key));
            labels.push(("via", via.to_string()));
            metrics::counter!("leasehold_grants_total", &labels).increment(1);
            labels.pop();
            metrics::histogram!("leasehold_wait_seconds", &labels).record(waited.as_secs_f64());
        }
    }

    /// An acquire statement for `key` found it held elsewhere.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub fn contended(&self, key: &str) {
        self.contended_tries.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        metrics::counter!("leasehold_contended_tries_total", &self.labels(Some(key))).increment(1);
    }

    /// A holder of `key` let go after `held_for`.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub fn released(&self, key: &str, held_for: Duration) {
        self.hold_nanos
            .fetch_add(nanos(held_for), Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        metrics::histogram!("leasehold_hold_seconds", &self.labels(Some(key)))
            .record(held_for.as_secs_f64());
    }

    /// A lease of `key` was lost (reported once per lease).
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub fn lost(&self, key: &str, reason: &LossReason) {
        let (counter, name) = match reason {
            LossReason::NotOwner => (&self.lost_not_owner, "not_owner"),
            _ => (&self.lost_expired, "expired"),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        {
            let mut labels = self.labels(Some(key));
            labels.push(("reason", name.to_string()));
            metrics::counter!("leasehold_leases_lost_total", &labels).increment(1);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = name;
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
            let labels = self.labels(None);
            metrics::counter!("leasehold_renewals_total", &labels).increment(renewed);
            metrics::counter!("leasehold_renewals_failed_total", &labels).increment(failed);
            metrics::histogram!("leasehold_renewal_seconds", &labels).record(latency.as_secs_f64());
        }
    }

    /// A lease began (`+1`) or ended (`-1`: released or lost, once).
    pub fn held(&self, change: i64) {
        let _now = self.held.fetch_add(change, Ordering::Relaxed) + change;
        #[cfg(feature = "metrics")]
        metrics::gauge!("leasehold_held_leases", &self.labels(None)).set(_now.max(0) as f64);
    }

    /// Adds the figures so far to `stats` (which has the statement counts).
    pub fn add_to(&self, stats: &mut Statistics) {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let time = |counter: &AtomicU64| Duration::from_nanos(read(counter));
        stats.local_handoffs = read(&self.local_handoffs);
        stats.contended_tries = read(&self.contended_tries);
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

    #[cfg(feature = "metrics")]
    fn labels(&self, key: Option<&str>) -> Vec<(&'static str, String)> {
        let mut labels = vec![
            ("table", self.labels.table.clone()),
            ("region", self.labels.region.clone()),
        ];
        if let Some(key) = key.filter(|_| self.labels.per_key) {
            labels.push(("key", key.to_string()));
        }
        labels
    }
}
