//! The registry's bounded LRU cache of lock handles.
//!
//! The cache exists so that every thread asking for one key in one registry shares one local
//! queue (and so one database poller and the instant handoff). An entry may be evicted only
//! when nobody can be using it: the cache holds the only reference (no [`Lock`](crate::Lock)
//! handle, no guard, no waiter) and the key is idle (no owner, lease, waiter or statement in
//! flight). A key in use therefore always maps to one shared entry, so two handles of one key in
//! one registry can never both hold it.
//!
//! When every entry is in use the cache grows past its capacity rather than failing
//! `obtain()` (Spring fails instead); it shrinks back as entries become idle. Lookups and
//! insertions are O(log n); an eviction scans from the least recently used end and skips
//! entries in use.

use crate::lock::LockInner;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

pub(crate) struct HandleCache {
    capacity: usize,
    entries: HashMap<Arc<str>, (Arc<LockInner>, u64)>,
    order: BTreeMap<u64, Arc<str>>,
    next_stamp: u64,
}

impl HandleCache {
    pub fn new(capacity: usize) -> Self {
        HandleCache {
            capacity,
            entries: HashMap::new(),
            order: BTreeMap::new(),
            next_stamp: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The names of the keys whose handles the cache holds.
    pub fn names(&self) -> Vec<String> {
        self.entries.keys().map(|name| name.to_string()).collect()
    }

    /// The entry for `key`, created with `make` if absent; marks it most recently used.
    pub fn get_or_insert(
        &mut self,
        key: &str,
        make: impl FnOnce() -> Arc<LockInner>,
    ) -> Arc<LockInner> {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        if let Some((inner, old_stamp)) = self.entries.get_mut(key) {
            let shared_key = self
                .order
                .remove(old_stamp)
                .expect("every entry has an order stamp");
            *old_stamp = stamp;
            self.order.insert(stamp, shared_key);
            return Arc::clone(inner);
        }
        let inner = make();
        let shared_key: Arc<str> = key.into();
        self.entries
            .insert(Arc::clone(&shared_key), (Arc::clone(&inner), stamp));
        self.order.insert(stamp, shared_key);
        self.evict_idle();
        inner
    }

    /// Drops least recently used idle entries until the cache is within capacity or only
    /// entries in use remain.
    fn evict_idle(&mut self) {
        let mut excess = self.entries.len().saturating_sub(self.capacity);
        if excess == 0 {
            return;
        }
        let mut victims = Vec::new();
        for (stamp, key) in &self.order {
            if excess == 0 {
                break;
            }
            let (inner, _) = &self.entries[key];
            if Arc::strong_count(inner) == 1 && inner.is_idle() {
                victims.push((*stamp, Arc::clone(key)));
                excess -= 1;
            }
        }
        for (stamp, key) in victims {
            self.order.remove(&stamp);
            self.entries.remove(&key);
        }
    }
}
