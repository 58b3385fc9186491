//! Topology: the segments this driver creates volumes in (each with its own capacity), how a
//! CreateVolume's accessibility requirements choose one, and how much room a segment has left.
//! Pure decisions; `state` feeds them the bytes in use and turns their errors into CSI codes.

use std::collections::BTreeMap;

use thiserror::Error;

/// Topology labels (key to value), as in a CSI `Topology`; ordered so the state file and
/// comparisons are deterministic.
pub type Labels = BTreeMap<String, String>;

/// A place volumes can be created in, such as one node's disk or one zone's pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Empty only for the one unlabelled segment of a driver without topology.
    pub labels: Labels,
    pub capacity_bytes: i64,
}

impl Segment {
    /// The single segment of a driver without topology.
    pub fn unlabelled(capacity_bytes: i64) -> Self {
        Self {
            labels: Labels::new(),
            capacity_bytes,
        }
    }
}

/// True when the driver has topology at all; without it, accessibility requirements are ignored
/// (the CO sends none to a driver that does not advertise VOLUME_ACCESSIBILITY_CONSTRAINTS).
pub fn is_labelled(segments: &[Segment]) -> bool {
    segments.iter().any(|s| !s.labels.is_empty())
}

/// A CreateVolume's `accessibility_requirements`, terms in the order the CO gave them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Requirements {
    pub requisite: Vec<Labels>,
    pub preferred: Vec<Labels>,
}

/// A term matches labels when every key of the term has the same value in the labels. A term
/// with fewer keys therefore matches every segment that agrees on the keys it names (`zone=a`
/// matches `zone=a,rack=1` and `zone=a,rack=2`); a term naming a key the labels lack does not
/// match.
pub fn term_matches(term: &Labels, labels: &Labels) -> bool {
    term.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// True when a volume with `labels` satisfies `requisite`: some term matches. No requisite, or
/// a volume without topology, allows anything.
pub fn allowed_by(labels: &Labels, requisite: &[Labels]) -> bool {
    labels.is_empty() || requisite.is_empty() || requisite.iter().any(|t| term_matches(t, labels))
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum PlacementError {
    #[error("no segment this driver serves matches the requisite topology {requisite:?}")]
    NoMatchingSegment { requisite: Vec<Labels> },
    #[error("{size} bytes do not fit in any allowed segment: {free}")]
    Full { size: i64, free: String },
}

/// Bytes in use per segment labels. A volume counts against the segment whose labels equal its
/// stored topology; a volume whose topology no configured segment has counts against none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage(BTreeMap<Labels, i64>);

impl Usage {
    pub fn tally<'a>(volumes: impl IntoIterator<Item = (&'a Labels, i64)>) -> Self {
        let mut used = BTreeMap::<Labels, i64>::new();
        for (labels, bytes) in volumes {
            let sum = used.entry(labels.clone()).or_default();
            *sum = sum.saturating_add(bytes);
        }
        Self(used)
    }

    /// Capacity left in `segment`, never negative (a smaller capacity after a restart can leave
    /// a segment over-full).
    pub fn free_bytes(&self, segment: &Segment) -> i64 {
        let used = self.0.get(&segment.labels).copied().unwrap_or(0);
        segment.capacity_bytes.saturating_sub(used).max(0)
    }
}

/// The segments a new volume may go to, best first: segments matching the preferred terms in
/// the order given, then those matching the requisite terms; without either, every segment in
/// configured order. With a requisite, only segments it allows are candidates (preferred terms
/// outside it are ignored); with only preferred terms, every other segment follows them, as the
/// spec lets the SP choose among all topologies then. Each segment appears once.
///
/// An empty list means no segment can ever satisfy the request.
pub fn candidates<'a>(segments: &'a [Segment], wanted: &Requirements) -> Vec<&'a Segment> {
    if !is_labelled(segments) {
        return segments.iter().collect();
    }
    let any = Labels::new();
    let fallback = if wanted.requisite.is_empty() {
        std::slice::from_ref(&any)
    } else {
        &wanted.requisite[..]
    };
    let mut ordered: Vec<&Segment> = Vec::new();
    for term in wanted.preferred.iter().chain(fallback) {
        for segment in segments {
            let fits = term_matches(term, &segment.labels)
                && allowed_by(&segment.labels, &wanted.requisite);
            if fits && !ordered.iter().any(|s| s.labels == segment.labels) {
                ordered.push(segment);
            }
        }
    }
    ordered
}

/// Moves the candidate whose labels are `labels` (a restore's or clone's source segment) to the
/// front, so the new volume lands next to its source when that segment is allowed and has room;
/// the others keep their order. Nothing moves when no candidate has those labels.
pub fn try_first(candidates: &mut Vec<&Segment>, labels: &Labels) {
    if let Some(at) = candidates.iter().position(|s| &s.labels == labels) {
        let segment = candidates.remove(at);
        candidates.insert(0, segment);
    }
}

/// The first candidate with room for `size` bytes.
pub fn choose<'a>(
    candidates: &[&'a Segment],
    usage: &Usage,
    size: i64,
    requisite: &[Labels],
) -> Result<&'a Segment, PlacementError> {
    if candidates.is_empty() {
        return Err(PlacementError::NoMatchingSegment {
            requisite: requisite.to_vec(),
        });
    }
    candidates
        .iter()
        .copied()
        .find(|s| usage.free_bytes(s) >= size)
        .ok_or_else(|| PlacementError::Full {
            size,
            free: candidates
                .iter()
                .map(|s| format!("{:?} has {} bytes left", s.labels, usage.free_bytes(s)))
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// GetCapacity: the bytes left in every segment `term` matches (all segments when there is no
/// term, or when the driver has no topology), and the largest volume one of them still fits.
pub fn capacity(
    segments: &[Segment],
    usage: &Usage,
    term: Option<&Labels>,
    max_volume_size: i64,
) -> (i64, i64) {
    let labelled = is_labelled(segments);
    let (available, largest) = segments
        .iter()
        .filter(|s| !labelled || term.is_none_or(|t| term_matches(t, &s.labels)))
        .map(|s| usage.free_bytes(s))
        .fold((0i64, 0i64), |(sum, largest), free| {
            (sum.saturating_add(free), largest.max(free))
        });
    (available, largest.min(max_volume_size))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: i64 = 1 << 30;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn zone(z: &str) -> Labels {
        labels(&[("zone", z)])
    }

    fn segment(z: &str, capacity_bytes: i64) -> Segment {
        Segment {
            labels: zone(z),
            capacity_bytes,
        }
    }

    fn zones_of(c: &[&Segment]) -> Vec<String> {
        c.iter().map(|s| s.labels["zone"].clone()).collect()
    }

    fn wanted(requisite: &[&str], preferred: &[&str]) -> Requirements {
        Requirements {
            requisite: requisite.iter().map(|z| zone(z)).collect(),
            preferred: preferred.iter().map(|z| zone(z)).collect(),
        }
    }

    #[test]
    fn a_term_matches_on_the_keys_it_names() {
        let node = labels(&[("zone", "a"), ("rack", "1")]);
        assert!(term_matches(&zone("a"), &node));
        assert!(term_matches(&node, &node));
        assert!(term_matches(&Labels::new(), &node));
        assert!(!term_matches(&zone("b"), &node));
        assert!(!term_matches(
            &labels(&[("zone", "a"), ("host", "x")]),
            &node
        ));
        assert!(allowed_by(&node, &[]));
        assert!(allowed_by(&node, &[zone("b"), zone("a")]));
        assert!(!allowed_by(&node, &[zone("b")]));
        assert!(allowed_by(&Labels::new(), &[zone("b")]));
    }

    #[test]
    fn preferred_terms_come_first_then_requisite_ones() {
        let segments = [segment("a", GI), segment("b", GI), segment("c", GI)];
        assert_eq!(
            zones_of(&candidates(&segments, &wanted(&[], &[]))),
            ["a", "b", "c"]
        );
        assert_eq!(
            zones_of(&candidates(&segments, &wanted(&["a", "c", "b"], &["c"]))),
            ["c", "a", "b"]
        );
        assert_eq!(
            zones_of(&candidates(&segments, &wanted(&["b", "c"], &[]))),
            ["b", "c"]
        );
        // Preferred terms outside the requisite are ignored.
        assert_eq!(
            zones_of(&candidates(&segments, &wanted(&["b"], &["a", "b"]))),
            ["b"]
        );
        // Preferred only: every other segment follows.
        assert_eq!(
            zones_of(&candidates(&segments, &wanted(&[], &["c"]))),
            ["c", "a", "b"]
        );
        assert!(candidates(&segments, &wanted(&["x"], &[])).is_empty());
    }

    #[test]
    fn a_shorter_term_matches_every_segment_that_agrees() {
        let segments = [
            Segment {
                labels: labels(&[("zone", "a"), ("rack", "1")]),
                capacity_bytes: GI,
            },
            Segment {
                labels: labels(&[("zone", "b"), ("rack", "1")]),
                capacity_bytes: GI,
            },
            Segment {
                labels: labels(&[("zone", "a"), ("rack", "2")]),
                capacity_bytes: GI,
            },
        ];
        let picked = candidates(&segments, &wanted(&["a"], &[]));
        assert_eq!(picked, [&segments[0], &segments[2]]);
    }

    #[test]
    fn without_topology_requirements_are_ignored() {
        let segments = [Segment::unlabelled(GI)];
        assert_eq!(
            candidates(&segments, &wanted(&["x"], &["y"])),
            [&segments[0]]
        );
    }

    #[test]
    fn the_first_candidate_with_room_wins() {
        let segments = [segment("a", 2 * GI), segment("b", 4 * GI)];
        let zone_a = zone("a");
        let usage = Usage::tally([(&zone_a, GI)]);
        let all = candidates(&segments, &Requirements::default());
        assert_eq!(choose(&all, &usage, GI, &[]), Ok(&segments[0]));
        assert_eq!(choose(&all, &usage, 2 * GI, &[]), Ok(&segments[1]));
        let full = choose(&all, &usage, 5 * GI, &[]);
        assert!(matches!(full, Err(PlacementError::Full { .. })), "{full:?}");
        let only_a = candidates(&segments, &wanted(&["a"], &[]));
        assert!(matches!(
            choose(&only_a, &usage, 2 * GI, &[zone("a")]),
            Err(PlacementError::Full { .. })
        ));
        assert!(matches!(
            choose(&[], &usage, GI, &[zone("x")]),
            Err(PlacementError::NoMatchingSegment { .. })
        ));
    }

    #[test]
    fn the_source_segment_is_tried_first_if_it_is_a_candidate() {
        let segments = [segment("a", GI), segment("b", GI), segment("c", GI)];
        let mut all = candidates(&segments, &Requirements::default());
        try_first(&mut all, &zone("c"));
        assert_eq!(zones_of(&all), ["c", "a", "b"]);
        let mut not_c = candidates(&segments, &wanted(&["a", "b"], &[]));
        try_first(&mut not_c, &zone("c"));
        assert_eq!(zones_of(&not_c), ["a", "b"], "the requisite rules");
        try_first(&mut not_c, &Labels::new());
        assert_eq!(zones_of(&not_c), ["a", "b"], "a source without topology");
    }

    #[test]
    fn capacity_is_counted_per_segment() {
        let segments = [segment("a", 2 * GI), segment("b", 4 * GI)];
        let (zone_a, gone) = (zone("a"), zone("gone"));
        let usage = Usage::tally([(&zone_a, GI), (&zone_a, 2 * GI), (&gone, GI)]);
        assert_eq!(usage.free_bytes(&segments[0]), 0, "over-full is 0");
        assert_eq!(usage.free_bytes(&segments[1]), 4 * GI);
        assert_eq!(capacity(&segments, &usage, None, 10 * GI), (4 * GI, 4 * GI));
        assert_eq!(
            capacity(&segments, &usage, Some(&zone("b")), 3 * GI),
            (4 * GI, 3 * GI)
        );
        assert_eq!(capacity(&segments, &usage, Some(&zone("a")), GI), (0, 0));
        assert_eq!(capacity(&segments, &usage, Some(&zone("x")), GI), (0, 0));

        let plain = [Segment::unlabelled(10 * GI)];
        let none = Labels::new();
        let usage = Usage::tally([(&none, 3 * GI)]);
        assert_eq!(
            capacity(&plain, &usage, Some(&zone("x")), 5 * GI),
            (7 * GI, 5 * GI)
        );
    }
}
