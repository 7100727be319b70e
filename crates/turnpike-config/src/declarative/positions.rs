//! Where an entity of one of the config's largest lists stands, by id: what a change to a
//! stored row (`Config::apply_change`) and the data plane's patch of its snapshot look up,
//! instead of comparing the id with each of 100k routes (three such scans were half of a
//! node's CPU per write at 100k routes).
//!
//! A persistent map (shared by the copies of a config, as its lists are) from a 64-bit hash of
//! the id to the position. A removal keeps the list's order (file order breaks ties between
//! routes): the entities after it move down one place, and their entries are not rewritten;
//! a look-up tries the recorded place and up to one place lower per removal since the map was
//! built, which is built again after [`REMOVALS_BEFORE_REBUILD`]. Every answer is checked
//! against the list: a stale or colliding entry falls back to a scan, never to a wrong entity.

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
    /// Removals since the map was built: how far below its recorded place an entity may be.
    removals: usize,
}

/// Removals after which the map is built again (rather than tried that many places down): a
/// look-up compares at most this many ids more, and a rebuild (~30 ms at 100k routes) comes
/// once per this many deletes (at 32, rebuilds were a third of a node's CPU under 25 route
/// creations and deletions a second at 100k routes).
pub const REMOVALS_BEFORE_REBUILD: usize = 256;

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
        if self.len != len || self.removals > REMOVALS_BEFORE_REBUILD {
            self.rebuild(len, &id_at);
        }
        let at = *self.map.get(&hash(id))? as usize;
        let found = (at.saturating_sub(self.removals)..=at)
            .rev()
            .find(|&i| id_at(i).is_some_and(|x| x == id));
        if found.is_some() {
            return found;
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
        self.removals = 0;
    }

    /// `id` now stands at `at`.
    pub fn set(&mut self, id: &str, at: usize) {
        self.map.insert(hash(id), at as u32);
    }

    /// One entity added at the end of the list.
    pub fn pushed(&mut self, id: &str, at: usize) {
        self.set(id, at);
        self.len += 1;
    }

    /// `id` removed from the list, those after it moved down one place.
    pub fn removed(&mut self, id: &str) {
        self.map.remove(&hash(id));
        self.len = self.len.saturating_sub(1);
        self.removals += 1;
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
    fn finds_after_removals_and_survives_a_stale_entry() {
        let mut ids: Vec<String> = (0..1000).map(|i| format!("id-{i}")).collect();
        let mut p = Positions::default();
        fn at(ids: &[String], i: usize) -> Option<&str> {
            ids.get(i).map(|s| s.as_str())
        }
        let view = ids.clone();
        assert_eq!(p.find(view.len(), |i| at(&view, i), "id-537"), Some(537));
        assert_eq!(p.find(view.len(), |i| at(&view, i), "nope"), None);
        // Removals keep the order: those after move down, found below their recorded place.
        for gone in ["id-10", "id-500", "id-20"] {
            let i = ids.iter().position(|x| x == gone).unwrap();
            ids.remove(i);
            p.removed(gone);
        }
        let view = ids.clone();
        assert_eq!(p.find(view.len(), |i| at(&view, i), "id-999"), Some(996));
        assert_eq!(p.find(view.len(), |i| at(&view, i), "id-15"), Some(14));
        assert_eq!(p.find(view.len(), |i| at(&view, i), "id-5"), Some(5));
        assert_eq!(p.find(view.len(), |i| at(&view, i), "id-10"), None);
        assert_eq!(p.removals, 3, "not rebuilt for three removals");
        // An entry that no longer matches its list falls back to a scan.
        let mut swapped = view.clone();
        swapped.swap(1, 2);
        assert_eq!(p.find(swapped.len(), |i| at(&swapped, i), "id-1"), Some(2));
        // Past the budget of removals, built again.
        let mut p2 = Positions::default();
        let mut ids2: Vec<String> = (0..1000).map(|i| format!("y{i}")).collect();
        assert_eq!(p2.find(ids2.len(), |i| at(&ids2, i), "y0"), Some(0));
        for _ in 0..=REMOVALS_BEFORE_REBUILD {
            let gone = ids2.remove(0);
            p2.removed(&gone);
        }
        assert_eq!(
            p2.find(ids2.len(), |i| at(&ids2, i), "y999"),
            Some(ids2.len() - 1)
        );
        assert_eq!(p2.removals, 0);
        // A list filled without it is indexed again.
        let mut q = Positions::default();
        let more: Vec<String> = (0..5).map(|i| format!("x{i}")).collect();
        assert_eq!(q.find(5, |i| at(&more, i), "x4"), Some(4));
        assert_eq!(q.len, 5);
    }
}
