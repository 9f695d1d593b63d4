//! The store's table: a hash table keyed by "namespace/name" that can also be asked where a
//! key's slot probably is without touching it, so that feed can prefetch the entries of the
//! events it will apply next (on a large store every lookup is otherwise a cache miss).

use std::hash::BuildHasher;

use hashbrown::HashTable;
use rustc_hash::FxBuildHasher;

/// Keys up to 24 bytes (most "namespace/name") live inline in the table: no pointer chase
/// (a cache miss on a large store) to compare them.
pub type Key = compact_str::CompactString;

pub struct KeyMap<V> {
    table: HashTable<(Key, V)>,
    hasher: FxBuildHasher,
}

impl<V> Default for KeyMap<V> {
    fn default() -> Self {
        KeyMap {
            table: HashTable::new(),
            hasher: FxBuildHasher,
        }
    }
}

impl<V> KeyMap<V> {
    #[inline]
    pub fn hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key)
    }

    pub fn get(&self, key: &str) -> Option<&V> {
        self.table
            .find(self.hash(key), |(k, _)| k == key)
            .map(|(_, v)| v)
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        let hash = self.hash(key);
        self.table.find_mut(hash, |(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn get_or_insert_with(&mut self, key: &str, f: impl FnOnce() -> V) -> &mut V {
        let hash = self.hash(key);
        let hasher = &self.hasher;
        let slot = self
            .table
            .entry(
                hash,
                |(k, _)| k == key,
                |(k, _)| hasher.hash_one(k.as_str()),
            )
            .or_insert_with(|| (Key::from(key), f()));
        &mut slot.into_mut().1
    }

    pub fn remove(&mut self, key: &str) -> Option<V> {
        let hash = self.hash(key);
        match self.table.find_entry(hash, |(k, _)| k == key) {
            Ok(e) => Some(e.remove().0 .1),
            Err(_) => None,
        }
    }

    /// The value in the first slot whose control byte matches `hash`: usually `hash`'s key,
    /// but it may be another key (or a key about to be removed); only for prefetching. Reads
    /// only the control bytes, which are small enough to stay cached.
    #[inline]
    pub fn probable(&self, hash: u64) -> Option<&(Key, V)> {
        self.table.iter_hash(hash).next()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Key, &V)> {
        self.table.iter().map(|(k, v)| (k, v))
    }

    pub fn keys(&self) -> impl Iterator<Item = &Key> {
        self.table.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.table.iter().map(|(_, v)| v)
    }

    pub fn capacity(&self) -> usize {
        self.table.capacity()
    }
}

/// Asks for the cache lines of `len` bytes at `p` (a hint only: never faults, even if `p` is
/// stale).
#[inline]
pub fn prefetch(p: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let mut off = 0;
        while off < len {
            // SAFETY: prefetch instructions are hints and cannot fault; `wrapping_add` keeps
            // the address computation free of UB whatever `p` is.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off).cast()) };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}
