//! Which shard holds each operation. A new operation goes to the shard being filled while it
//! has room, so that while few operations are in flight they all share one shard, and so its
//! writes (group commit): spreading them over every shard would cost one write per shard. The
//! other shards take the overflow, which keeps each object small. A full shard hands over to
//! the next one with room, and stays behind it even when its own operations complete: going
//! back to it for every few operations it frees would cost its own write each time, while the
//! shard being filled is written anyway (a burst of 1,000 claims at the default QPS cost 5
//! such extra writes of 3 or 4 operations each).

use std::collections::HashMap;

/// Operations a shard takes before new ones spill to the next (at ~300–600 bytes each, a
/// full shard is well under 100 KB).
pub const SHARD_CAPACITY: usize = 128;

#[derive(Debug)]
pub struct Placement {
    shard_of: HashMap<String, usize>,
    counts: Vec<usize>,
    /// The shard new operations go to while it has room.
    filling: usize,
}

impl Placement {
    pub fn new(shards: usize) -> Self {
        Self {
            shard_of: HashMap::new(),
            counts: vec![0; shards.max(1)],
            filling: 0,
        }
    }

    /// Where the operation of `volume_name` is, placing it if it is new: the shard being
    /// filled while it is below [`SHARD_CAPACITY`], else the next one below it (which is
    /// filled from then on), else the least loaded.
    pub fn place(&mut self, volume_name: &str) -> usize {
        if let Some(&shard) = self.shard_of.get(volume_name) {
            return shard;
        }
        let shards = self.counts.len();
        let with_room = (0..shards)
            .map(|step| (self.filling + step) % shards)
            .find(|&shard| self.counts[shard] < SHARD_CAPACITY);
        let shard = match with_room {
            Some(shard) => {
                self.filling = shard;
                shard
            }
            None => self.least_loaded(),
        };
        self.put(volume_name, shard);
        shard
    }

    /// Records where a recovered operation was found. Shards this build does not write
    /// (`shard` out of range) count as the last one.
    pub fn restore(&mut self, volume_name: &str, shard: usize) {
        if !self.shard_of.contains_key(volume_name) {
            self.put(volume_name, shard.min(self.counts.len() - 1));
        }
    }

    pub fn locate(&self, volume_name: &str) -> Option<usize> {
        self.shard_of.get(volume_name).copied()
    }

    /// Forgets the operation; returns the shard that held it.
    pub fn release(&mut self, volume_name: &str) -> Option<usize> {
        let shard = self.shard_of.remove(volume_name)?;
        self.counts[shard] = self.counts[shard].saturating_sub(1);
        Some(shard)
    }

    fn put(&mut self, volume_name: &str, shard: usize) {
        self.shard_of.insert(volume_name.to_owned(), shard);
        self.counts[shard] += 1;
    }

    fn least_loaded(&self) -> usize {
        (0..self.counts.len())
            .min_by_key(|&shard| self.counts[shard])
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("pvc-{i}")).collect()
    }

    #[test]
    fn operations_fill_the_first_shard_before_the_next() {
        let mut placement = Placement::new(8);
        let shards: Vec<usize> = names(SHARD_CAPACITY + 2)
            .iter()
            .map(|name| placement.place(name))
            .collect();
        assert!(shards[..SHARD_CAPACITY].iter().all(|&shard| shard == 0));
        assert_eq!(shards[SHARD_CAPACITY..], [1, 1]);
    }

    #[test]
    fn an_operation_stays_where_it_was_placed_until_released() {
        let mut placement = Placement::new(8);
        for name in names(SHARD_CAPACITY) {
            placement.place(&name);
        }
        assert_eq!(placement.place("pvc-late"), 1);
        assert_eq!(placement.place("pvc-late"), 1, "placed once");
        assert_eq!(placement.release("pvc-0"), Some(0));
        assert_eq!(placement.locate("pvc-late"), Some(1), "not moved");
        assert_eq!(placement.release("pvc-0"), None, "released once");
    }

    #[test]
    fn a_full_shard_is_not_reused_before_the_one_being_filled_is_full() {
        let mut placement = Placement::new(3);
        for name in names(SHARD_CAPACITY) {
            placement.place(&name);
        }
        assert_eq!(placement.place("pvc-late"), 1);
        placement.release("pvc-0");
        assert_eq!(
            placement.place("pvc-next"),
            1,
            "shard 1 is being filled; the room freed in shard 0 waits"
        );
        for i in 0..SHARD_CAPACITY - 2 {
            assert_eq!(placement.place(&format!("pvc-fill-{i}")), 1);
        }
        assert_eq!(
            placement.place("pvc-wrap"),
            2,
            "shard 1 is full: the next one with room"
        );
        for i in 0..SHARD_CAPACITY - 1 {
            placement.place(&format!("pvc-third-{i}"));
        }
        assert_eq!(
            placement.place("pvc-around"),
            0,
            "after the last shard, the search goes round to the room in shard 0"
        );
    }

    #[test]
    fn recovered_operations_count_where_they_were_found() {
        let mut placement = Placement::new(2);
        for name in names(SHARD_CAPACITY) {
            placement.restore(&name, 0);
        }
        placement.restore("pvc-elsewhere", 1);
        placement.restore("pvc-old-layout", 9);
        assert_eq!(placement.locate("pvc-old-layout"), Some(1));
        assert_eq!(placement.place("pvc-new"), 1);
    }

    #[test]
    fn when_every_shard_is_full_the_least_loaded_takes_more() {
        let mut placement = Placement::new(2);
        for name in names(2 * SHARD_CAPACITY) {
            placement.place(&name);
        }
        assert_eq!(placement.place("pvc-a"), 0);
        assert_eq!(placement.place("pvc-b"), 1);
        assert_eq!(placement.release("pvc-1"), Some(0));
        assert_eq!(placement.place("pvc-c"), 0, "the least loaded again");
    }
}
