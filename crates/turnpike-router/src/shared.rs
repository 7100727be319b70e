//! Collections that successive snapshots share: a copy shares every part with the original,
//! and a change copies only the part it touches (a chunk of a list, a shard of a map). A
//! change to one route of 100k then costs a few hundred element copies instead of 100k, and
//! freeing the previous snapshot frees only what it did not share.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHasher};

/// Elements per chunk of a [`ChunkedVec`].
const CHUNK: usize = 256;

/// A list split into shared chunks.
#[derive(Debug)]
pub struct ChunkedVec<T> {
    chunks: Vec<Arc<Vec<T>>>,
    len: usize,
}

impl<T> Default for ChunkedVec<T> {
    fn default() -> Self {
        ChunkedVec {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Clone for ChunkedVec<T> {
    /// Shares every chunk.
    fn clone(&self) -> Self {
        ChunkedVec {
            chunks: self.chunks.clone(),
            len: self.len,
        }
    }
}

impl<T: Clone> ChunkedVec<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    pub fn get(&self, i: usize) -> Option<&T> {
        self.chunks.get(i / CHUNK)?.get(i % CHUNK)
    }

    /// The element, its chunk copied first when another list shares it.
    pub fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        Arc::make_mut(self.chunks.get_mut(i / CHUNK)?).get_mut(i % CHUNK)
    }

    pub fn push(&mut self, v: T) {
        if self.len.is_multiple_of(CHUNK) {
            self.chunks.push(Arc::new(Vec::with_capacity(CHUNK)));
        }
        let last = self.chunks.last_mut().expect("a chunk with room");
        Arc::make_mut(last).push(v);
        self.len += 1;
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flat_map(|c| c.iter())
    }
}

impl<T: Clone> std::ops::Index<usize> for ChunkedVec<T> {
    type Output = T;

    #[inline]
    fn index(&self, i: usize) -> &T {
        &self.chunks[i / CHUNK][i % CHUNK]
    }
}

impl<T: Clone> FromIterator<T> for ChunkedVec<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut v = ChunkedVec::default();
        for x in iter {
            v.push(x);
        }
        v
    }
}

/// A map from strings kept whole while small and split into shared shards once large.
#[derive(Debug)]
pub struct ShardedMap<V> {
    shards: Vec<Arc<FxHashMap<Arc<str>, V>>>,
    len: usize,
}

/// Entries at which a map splits into shards, and how many.
const SPLIT_AT: usize = 1024;
const SHARDS: usize = 64;

impl<V> Default for ShardedMap<V> {
    fn default() -> Self {
        ShardedMap {
            shards: Vec::new(),
            len: 0,
        }
    }
}

impl<V> Clone for ShardedMap<V> {
    /// Shares every shard.
    fn clone(&self) -> Self {
        ShardedMap {
            shards: self.shards.clone(),
            len: self.len,
        }
    }
}

#[inline]
fn shard_of(key: &str, shards: usize) -> usize {
    if shards <= 1 {
        return 0;
    }
    let mut h = FxHasher::default();
    key.hash(&mut h);
    // The high bits: FxHash mixes them best.
    (h.finish() >> 58) as usize % shards
}

impl<V: Clone> ShardedMap<V> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    pub fn get(&self, key: &str) -> Option<&V> {
        self.shards.get(shard_of(key, self.shards.len()))?.get(key)
    }

    /// The value, its shard copied first when another map shares it.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        let i = shard_of(key, self.shards.len());
        let shard = self.shards.get_mut(i)?;
        if !shard.contains_key(key) {
            return None;
        }
        Arc::make_mut(shard).get_mut(key)
    }

    /// The value for `key`, inserted as `V::default()` when missing.
    pub fn get_or_default(&mut self, key: &Arc<str>) -> &mut V
    where
        V: Default,
    {
        if self.shards.is_empty() {
            self.shards.push(Arc::default());
        }
        if self.shards.len() == 1 && self.len >= SPLIT_AT && !self.shards[0].contains_key(&**key) {
            self.split();
        }
        let i = shard_of(key, self.shards.len());
        let shard = Arc::make_mut(&mut self.shards[i]);
        if !shard.contains_key(&**key) {
            self.len += 1;
        }
        shard.entry(key.clone()).or_default()
    }

    pub fn remove(&mut self, key: &str) -> Option<V> {
        let i = shard_of(key, self.shards.len());
        let shard = self.shards.get_mut(i)?;
        if !shard.contains_key(key) {
            return None;
        }
        let v = Arc::make_mut(shard).remove(key);
        self.len -= 1;
        v
    }

    fn split(&mut self) {
        let whole = std::mem::take(&mut self.shards);
        let mut shards: Vec<FxHashMap<Arc<str>, V>> = vec![FxHashMap::default(); SHARDS];
        for map in whole {
            for (k, v) in map.iter() {
                shards[shard_of(k, SHARDS)].insert(k.clone(), v.clone());
            }
        }
        self.shards = shards.into_iter().map(Arc::new).collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunked_copy_shares_all_but_the_changed_chunk() {
        let mut a: ChunkedVec<u32> = (0..1000).collect();
        let mut b = a.clone();
        *b.get_mut(700).unwrap() = 7;
        b.push(1000);
        assert_eq!((a[700], b[700], a.len(), b.len()), (700, 7, 1000, 1001));
        assert!(Arc::ptr_eq(&a.chunks[0], &b.chunks[0]));
        assert!(!Arc::ptr_eq(&a.chunks[700 / CHUNK], &b.chunks[700 / CHUNK]));
        a.push(5);
        assert_eq!((a[1000], b[1000]), (5, 1000));
        assert_eq!(
            b.iter().copied().sum::<u32>(),
            (0..=1000).sum::<u32>() - 700 + 7
        );
    }

    #[test]
    fn a_sharded_map_splits_when_large_and_copies_one_shard_per_change() {
        let mut a: ShardedMap<u32> = ShardedMap::default();
        let keys: Vec<Arc<str>> = (0..5000).map(|i| Arc::from(format!("/k{i}"))).collect();
        for (i, k) in keys.iter().enumerate() {
            *a.get_or_default(k) = i as u32;
        }
        assert_eq!((a.len(), a.shards.len()), (5000, SHARDS));
        let mut b = a.clone();
        *b.get_mut("/k42").unwrap() = 1;
        assert_eq!(b.remove("/k43"), Some(43));
        assert_eq!(b.remove("/k43"), None);
        assert_eq!((a.get("/k42"), b.get("/k42")), (Some(&42), Some(&1)));
        assert_eq!((a.get("/k43"), b.get("/k43")), (Some(&43), None));
        assert_eq!((a.len(), b.len()), (5000, 4999));
        let shared = a
            .shards
            .iter()
            .zip(&b.shards)
            .filter(|(x, y)| Arc::ptr_eq(x, y))
            .count();
        assert!(shared >= SHARDS - 2, "{shared} shards shared");
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(a.get(k), Some(&(i as u32)));
        }
    }
}
