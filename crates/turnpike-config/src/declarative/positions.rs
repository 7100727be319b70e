//! Where an entity of one of the config's largest lists stands, by id: what a change to a
//! stored row (`Config::apply_change`) and the data plane's patch of its snapshot look up,
//! instead of comparing the id with each of 100k routes (three such scans were half of a
//! node's CPU per write at 100k routes).
//!
//! A persistent map (shared by the copies of a config, as its lists are) from a 64-bit hash of
//! the id to the position. Every answer is checked against the list: a stale or colliding
//! entry falls back to a scan, never to a wrong entity.

use std::hash::BuildHasher;

/// The ids' hash: fixed, so that copies of a config agree.
fn hash(id: &str) -> u64 {
    foldhash::fast::FixedState::with_seed(0x7475_726e_7069_6b65).hash_one(id)
}

/// Positions by id of one list (see the module's doc).
#[derive(Debug, Clone, Default)]
pub struct Positions {
    map: imbl::HashMap<u64, u32>,
    /// Entries in `map`: differs from the list's length when the list was filled without it
    /// (a loaded config), and the map is rebuilt then.
    len: usize,
}

/// Look-ups one scan is worth: a list not indexed yet is scanned for up to this many ids and
/// indexed for more (building the index costs a few scans; a reload of a whole file with one
/// changed route keeps a scan, a database node's stream of writes indexes once).
pub const SCANS_BEFORE_INDEXING: usize = 8;

impl Positions {
    /// Whether the positions cover a list of `len` entities (no rebuild before a look-up).
    pub fn covers(&self, len: usize) -> bool {
        self.len == len
    }

    /// The position of `id` in a list of `len` entities whose ids `id_at` gives.
    pub fn find<'l>(
        &mut self,
        len: usize,
        id_at: impl Fn(usize) -> Option<&'l str>,
        id: &str,
    ) -> Option<usize> {
        if self.len != len {
            self.rebuild(len, &id_at);
        }
        let at = *self.map.get(&hash(id))? as usize;
        if id_at(at).is_some_and(|x| x == id) {
            return Some(at);
        }
        // A collision (or an entry gone stale): the long way.
        (0..len).find(|&i| id_at(i).is_some_and(|x| x == id))
    }

    /// Every position again.
    pub fn rebuild<'l>(&mut self, len: usize, id_at: &impl Fn(usize) -> Option<&'l str>) {
        let mut map = imbl::HashMap::new();
        for i in 0..len {
            if let Some(id) = id_at(i) {
                // The first of colliding ids keeps the entry; `find` scans for the others.
                map.entry(hash(id)).or_insert(i as u32);
            }
        }
        self.map = map;
        self.len = len;
    }

    /// `id` now stands at `at` (added, or moved there).
    pub fn set(&mut self, id: &str, at: usize) {
        self.map.insert(hash(id), at as u32);
    }

    /// One entity added at the end of the list.
    pub fn pushed(&mut self, id: &str, at: usize) {
        self.set(id, at);
        self.len += 1;
    }

    /// `id` removed from the list.
    pub fn removed(&mut self, id: &str) {
        self.map.remove(&hash(id));
        self.len = self.len.saturating_sub(1);
    }

    /// `id` no longer in the list, whose length stays (its place left vacant).
    pub fn forget(&mut self, id: &str) {
        self.map.remove(&hash(id));
    }

    /// The list grew to `len` places (vacant ones, or ones set after).
    pub fn grew_to(&mut self, len: usize) {
        self.len = self.len.max(len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_moves_and_survives_a_stale_entry() {
        let mut ids: Vec<String> = (0..1000).map(|i| format!("id-{i}")).collect();
        let mut p = Positions::default();
        fn at(ids: &[String], i: usize) -> Option<&str> {
            ids.get(i).map(|s| s.as_str())
        }
        let view = ids.clone();
        assert_eq!(p.find(view.len(), |i| at(&view, i), "id-537"), Some(537));
        assert_eq!(p.find(view.len(), |i| at(&view, i), "nope"), None);
        // The last moved into a removed one's place.
        let last = ids.pop().unwrap();
        ids[10] = last.clone();
        p.removed("id-10");
        p.set(&last, 10);
        p.len = ids.len();
        let view = ids.clone();
        assert_eq!(p.find(view.len(), |i| at(&view, i), "id-999"), Some(10));
        assert_eq!(p.find(view.len(), |i| at(&view, i), "id-10"), None);
        // An entry that no longer matches its list falls back to a scan.
        let mut swapped = view.clone();
        swapped.swap(1, 2);
        assert_eq!(p.find(swapped.len(), |i| at(&swapped, i), "id-1"), Some(2));
        // A list filled without it is indexed again.
        let mut q = Positions::default();
        let more: Vec<String> = (0..5).map(|i| format!("x{i}")).collect();
        assert_eq!(q.find(5, |i| at(&more, i), "x4"), Some(4));
        assert_eq!(q.len, 5);
    }
}
