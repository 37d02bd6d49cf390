//! A bounded plan cache, least recently used out: what each stream's GEMM (cuBLASLt
//! plans) and convolution (cuDNN algorithm choices) state keeps per problem key.
//!
//! Unbounded, a run that sees many shapes (variable sequence lengths, a sweep over
//! sizes) would grow these caches for as long as it runs. The bound is the runtime
//! setting `plan_cache` (`Builder::plan_cache`, `RTX_PLAN_CACHE`), read from the stream's
//! settings when the state is created. An evicted plan is only host-side descriptors
//! (cuBLASLt and cuDNN copy what an enqueued call needs), so dropping one is safe while
//! work planned with it is still on the stream; a later use of its key plans again.

use std::collections::HashMap;
use std::hash::Hash;

/// A map of at most `cap` entries; inserting beyond it drops the least recently used.
pub(crate) struct PlanCache<K, V> {
    map: HashMap<K, (V, u64)>,
    /// Use counter: an entry's stamp is the tick of its last use.
    tick: u64,
    cap: usize,
    evicted: u64,
}

impl<K: Hash + Eq + Copy, V> PlanCache<K, V> {
    /// An empty cache of at most `cap` entries (at least 1).
    pub(crate) fn new(cap: usize) -> Self {
        PlanCache {
            map: HashMap::new(),
            tick: 0,
            cap: cap.max(1),
            evicted: 0,
        }
    }

    /// The entry of `key`, made by `make` on a miss (evicting the least recently used
    /// entry first when full); whether it was a hit. A failed `make` inserts nothing.
    pub(crate) fn get_or_try_insert<E>(
        &mut self,
        key: K,
        make: impl FnOnce() -> Result<V, E>,
    ) -> Result<(&mut V, bool), E> {
        let hit = self.map.contains_key(&key);
        if !hit {
            let v = make()?;
            self.insert(key, v);
        }
        let v = self.get(&key).expect("present: found or just inserted");
        Ok((v, hit))
    }

    /// The entry of `key`, recorded as used now.
    pub(crate) fn get(&mut self, key: &K) -> Option<&mut V> {
        self.tick += 1;
        let tick = self.tick;
        self.map.get_mut(key).map(|e| {
            e.1 = tick;
            &mut e.0
        })
    }

    /// The entry of `key`, without recording a use.
    pub(crate) fn peek(&self, key: &K) -> Option<&V> {
        self.map.get(key).map(|e| &e.0)
    }

    /// Inserts (or replaces) `key`'s entry as the most recently used, evicting the
    /// least recently used entry first when full.
    pub(crate) fn insert(&mut self, key: K, v: V) {
        self.tick += 1;
        if !self.map.contains_key(&key) && self.map.len() >= self.cap {
            self.evict_oldest();
        }
        self.map.insert(key, (v, self.tick));
    }

    fn evict_oldest(&mut self) {
        // O(entries), only on a miss of a full cache, which plans anew (a cuBLASLt
        // heuristic or a cuDNN search: far more work than the scan).
        if let Some(k) = self
            .map
            .iter()
            .min_by_key(|(_, (_, t))| *t)
            .map(|(k, _)| *k)
        {
            self.map.remove(&k);
            self.evicted += 1;
        }
    }

    /// Entries held.
    #[allow(dead_code)] // read by the tests (and worth having for diagnosis)
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Entries dropped to make room since the cache was created.
    #[allow(dead_code)] // as `len`
    pub(crate) fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Whether `key` is cached (no use recorded).
    pub(crate) fn contains(&self, key: &K) -> bool {
        self.map.contains_key(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(c: &mut PlanCache<u32, String>, k: u32) -> bool {
        c.get_or_try_insert(k, || Ok::<_, ()>(format!("plan {k}")))
            .map(|(v, hit)| {
                assert_eq!(*v, format!("plan {k}"));
                hit
            })
            .unwrap()
    }

    #[test]
    fn bounded_and_least_recently_used_goes_first() {
        let mut c = PlanCache::new(3);
        assert!(!get(&mut c, 1) && !get(&mut c, 2) && !get(&mut c, 3));
        assert!(get(&mut c, 1), "1 is cached and now the most recent");
        assert!(!get(&mut c, 4), "4 is new: 2 (least recently used) goes");
        assert_eq!(c.len(), 3);
        assert_eq!(c.evicted(), 1);
        assert!(c.contains(&1) && !c.contains(&2) && c.contains(&3) && c.contains(&4));
        // Many shapes: the size stays at the bound.
        for k in 10..1000 {
            get(&mut c, k);
            assert!(c.len() <= 3);
        }
        assert_eq!(c.evicted(), 1 + 990);
        assert!(c.contains(&999) && c.contains(&998) && c.contains(&997));
    }

    #[test]
    fn a_failed_plan_inserts_nothing_and_capacity_is_at_least_one() {
        let mut c: PlanCache<u32, String> = PlanCache::new(0);
        assert!(c.get_or_try_insert(1, || Err::<String, _>("no")).is_err());
        assert_eq!(c.len(), 0);
        assert!(!get(&mut c, 1) && get(&mut c, 1) && !get(&mut c, 2));
        assert_eq!(c.len(), 1);
        assert!(c.contains(&2));
    }

    #[test]
    fn get_and_insert_record_uses_peek_does_not() {
        let mut c = PlanCache::new(2);
        c.insert(1u32, 10u32);
        c.insert(2, 20);
        assert_eq!(c.peek(&1), Some(&10));
        c.insert(3, 30); // 1 is least recently used (peek did not count)
        assert!(!c.contains(&1));
        assert_eq!(c.get(&2).copied(), Some(20));
        c.insert(4, 40); // now 3 is
        assert!(c.contains(&2) && !c.contains(&3) && c.contains(&4));
        c.insert(4, 41); // replacing evicts nothing
        assert_eq!((c.len(), c.peek(&4)), (2, Some(&41)));
    }
}
