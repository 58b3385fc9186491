//! Which shard holds each operation. A new operation goes to the shard being filled while it
//! has room, so that while few operations are in flight they all share one shard, and so its
//! writes (group commit): spreading them over every shard would cost one write per shard. A
//! full shard hands over to the next one with room, and stays behind it even when its own
//! operations complete: going back to it for every few operations it frees would cost its own
//! write each time, while the shard being filled is written anyway (a burst of 1,000 claims at
//! the default QPS cost 5 such extra writes of 3 or 4 operations each). When no shard has room
//! a new one is opened, so however many operations are in flight each shard object stays far
//! below the API server's size limit (about 1.5 MiB per object in etcd): 10,000 operations
//! take about 80 shards of 128.

use std::collections::HashMap;

/// Operations a shard takes before new ones go to the next (at ~300–600 bytes each, a full
/// shard is under 100 KB).
pub const SHARD_CAPACITY: usize = 128;
/// Shards beyond this index are not written: at 128 operations each, 4,096 shards hold half a
/// million operations in flight. Past that the least loaded shard takes more.
pub const MAX_SHARDS: usize = 4096;
/// Bytes of records a shard takes before new ones go to the next, whatever their number:
/// a StorageClass may carry large parameters. One record larger than this still gets a shard
/// of its own.
pub const SHARD_BYTES: usize = 256 * 1024;

#[derive(Debug, Default)]
pub struct Placement {
    shard_of: HashMap<String, Placed>,
    shards: Vec<Load>,
    /// The shard new operations go to while it has room.
    filling: usize,
}

#[derive(Clone, Copy, Debug)]
struct Placed {
    shard: usize,
    bytes: usize,
}

#[derive(Clone, Copy, Debug, Default)]
struct Load {
    operations: usize,
    bytes: usize,
}

impl Load {
    fn has_room_for(self, bytes: usize) -> bool {
        self.operations == 0
            || (self.operations < SHARD_CAPACITY && self.bytes + bytes <= SHARD_BYTES)
    }
}

impl Placement {
    /// Where the operation of `volume_name`, whose record takes `bytes`, is, placing it if it
    /// is new: the shard being filled while it has room, else the next one with room (which
    /// is filled from then on), else a new shard.
    pub fn place(&mut self, volume_name: &str, bytes: usize) -> usize {
        if let Some(placed) = self.shard_of.get(volume_name) {
            return placed.shard;
        }
        let shards = self.shards.len();
        let with_room = (0..shards)
            .map(|step| (self.filling + step) % shards)
            .find(|&shard| self.shards[shard].has_room_for(bytes));
        let shard = match with_room {
            Some(shard) => shard,
            None if shards < MAX_SHARDS => shards,
            None => self.least_loaded(),
        };
        self.filling = shard;
        self.put(volume_name, Placed { shard, bytes });
        shard
    }

    /// Records where a recovered operation was found.
    pub fn restore(&mut self, volume_name: &str, shard: usize, bytes: usize) {
        if !self.shard_of.contains_key(volume_name) {
            self.put(volume_name, Placed { shard, bytes });
        }
    }

    /// How many shards are known (found at start-up or opened).
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    pub fn locate(&self, volume_name: &str) -> Option<usize> {
        self.shard_of.get(volume_name).map(|placed| placed.shard)
    }

    /// Forgets the operation; returns the shard that held it.
    pub fn release(&mut self, volume_name: &str) -> Option<usize> {
        let placed = self.shard_of.remove(volume_name)?;
        let load = &mut self.shards[placed.shard];
        load.operations = load.operations.saturating_sub(1);
        load.bytes = load.bytes.saturating_sub(placed.bytes);
        Some(placed.shard)
    }

    /// Makes room for shards up to `shard` (one found in the API server, or opened).
    pub fn know(&mut self, shard: usize) {
        if self.shards.len() <= shard {
            self.shards.resize(shard + 1, Load::default());
        }
    }

    fn least_loaded(&self) -> usize {
        (0..self.shards.len())
            .min_by_key(|&shard| self.shards[shard].bytes)
            .unwrap_or(0)
    }

    fn put(&mut self, volume_name: &str, placed: Placed) {
        self.know(placed.shard);
        let load = &mut self.shards[placed.shard];
        load.operations += 1;
        load.bytes += placed.bytes;
        self.shard_of.insert(volume_name.to_owned(), placed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A typical record's size.
    const RECORD: usize = 500;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("pvc-{i}")).collect()
    }

    fn place_all(placement: &mut Placement, names: &[String]) -> Vec<usize> {
        names
            .iter()
            .map(|name| placement.place(name, RECORD))
            .collect()
    }

    #[test]
    fn operations_fill_the_first_shard_before_the_next() {
        let mut placement = Placement::default();
        let shards = place_all(&mut placement, &names(SHARD_CAPACITY + 2));
        assert!(shards[..SHARD_CAPACITY].iter().all(|&shard| shard == 0));
        assert_eq!(shards[SHARD_CAPACITY..], [1, 1]);
    }

    #[test]
    fn an_operation_stays_where_it_was_placed_until_released() {
        let mut placement = Placement::default();
        place_all(&mut placement, &names(SHARD_CAPACITY));
        assert_eq!(placement.place("pvc-late", RECORD), 1);
        assert_eq!(placement.place("pvc-late", RECORD), 1, "placed once");
        assert_eq!(placement.release("pvc-0"), Some(0));
        assert_eq!(placement.locate("pvc-late"), Some(1), "not moved");
        assert_eq!(placement.release("pvc-0"), None, "released once");
    }

    #[test]
    fn a_full_shard_is_not_reused_before_the_one_being_filled_is_full() {
        let mut placement = Placement::default();
        place_all(&mut placement, &names(3 * SHARD_CAPACITY));
        placement.release("pvc-0");
        placement.release(&format!("pvc-{SHARD_CAPACITY}"));
        assert_eq!(
            placement.place("pvc-next", RECORD),
            0,
            "shard 2 is full: the search goes round to the room in shard 0"
        );
        assert_eq!(
            placement.place("pvc-after", RECORD),
            1,
            "shard 0 is full again: the room in shard 1, before a new shard"
        );
        assert_eq!(placement.place("pvc-new", RECORD), 3, "a new shard");
        placement.release("pvc-1");
        assert_eq!(
            placement.place("pvc-more", RECORD),
            3,
            "the shard being filled keeps taking operations while it has room"
        );
    }

    #[test]
    fn ten_thousand_operations_keep_every_shard_small() {
        let mut placement = Placement::default();
        place_all(&mut placement, &names(10_000));
        assert_eq!(
            placement.shards.len(),
            10_000_usize.div_ceil(SHARD_CAPACITY)
        );
        let largest = placement.shards.iter().map(|load| load.bytes).max();
        assert_eq!(largest, Some(SHARD_CAPACITY * RECORD));
    }

    #[test]
    fn large_records_fill_a_shard_by_bytes_not_by_count() {
        let mut placement = Placement::default();
        let large = SHARD_BYTES / 3;
        let shards: Vec<usize> = names(4)
            .iter()
            .map(|name| placement.place(name, large))
            .collect();
        assert_eq!(shards, [0, 0, 0, 1]);
        assert_eq!(
            placement.place("pvc-huge", 2 * SHARD_BYTES),
            2,
            "a record larger than the budget gets a shard of its own"
        );
        assert_eq!(placement.place("pvc-small", RECORD), 1);
    }

    #[test]
    fn past_the_last_shard_the_least_loaded_takes_more() {
        let mut placement = Placement::default();
        placement.know(MAX_SHARDS - 1);
        for shard in 0..MAX_SHARDS {
            for index in 0..SHARD_CAPACITY {
                placement.restore(&format!("pvc-{shard}-{index}"), shard, RECORD);
            }
        }
        placement.release("pvc-7-0");
        placement.release("pvc-7-1");
        assert_eq!(
            placement.place("pvc-a", RECORD),
            7,
            "the room freed in shard 7"
        );
        assert_eq!(placement.place("pvc-b", RECORD), 7);
        assert_eq!(
            placement.place("pvc-c", 100),
            0,
            "no room anywhere: the least loaded"
        );
        assert_eq!(placement.shards.len(), MAX_SHARDS);
    }

    #[test]
    fn recovered_operations_count_where_they_were_found() {
        let mut placement = Placement::default();
        for name in names(SHARD_CAPACITY) {
            placement.restore(&name, 0, RECORD);
        }
        placement.restore("pvc-far", 9, RECORD);
        assert_eq!(placement.locate("pvc-far"), Some(9));
        assert_eq!(placement.shards.len(), 10);
        assert_eq!(placement.place("pvc-new", RECORD), 1, "the first with room");
    }
}
