//! The profiles a seed runs under: which deployment, faults and outside edits are on. Each
//! of the first five makes one of the known holes of issue #31 reachable (the search is still
//! random over seeds); `calm` is the plain life of a cluster, which must always pass.

use super::driver::Faults;
use super::world::{AZURE_FILE, HOSTPATH, Profile};

const NONE: Profile = Profile {
    name: "calm",
    nodes: &[],
    driver: HOSTPATH,
    faults: Faults {
        timeout_created: 0,
        timeout_not_created: 0,
        lost_answer: 0,
        invalid: 0,
        exhausted: 0,
        delete_timeout: 0,
    },
    crash: 0,
    moves: 0,
    claim_deletes: 2,
    claim_creates: 1,
    class_recreates: 0,
    snapshot_deletes: 0,
    claims: 2,
    restores: false,
    bad_class: false,
    in_tree_pv: false,
    secrets: false,
    pause: 0,
    reaps: 6,
    slow_calls: 150,
    consistency: false,
    steps: 200,
};

/// Node mode, WaitForFirstConsumer claims whose pod moves between nodes.
pub fn node_moves() -> Profile {
    Profile {
        name: "node-moves",
        nodes: &["node-a", "node-b"],
        faults: Faults {
            timeout_created: 200,
            timeout_not_created: 50,
            lost_answer: 50,
            exhausted: 50,
            ..NONE.faults
        },
        crash: 1,
        moves: 5,
        claim_deletes: 1,
        claims: 2,
        steps: 250,
        ..NONE
    }
}

/// First-attempt final errors (a bad class, injected INVALID_ARGUMENT and
/// RESOURCE_EXHAUSTED), class re-creations and crashes.
pub fn final_errors() -> Profile {
    Profile {
        name: "final-errors",
        faults: Faults {
            invalid: 150,
            exhausted: 150,
            timeout_created: 30,
            ..NONE.faults
        },
        crash: 4,
        class_recreates: 3,
        bad_class: true,
        claims: 2,
        claim_deletes: 1,
        claim_creates: 1,
        steps: 250,
        ..NONE
    }
}

/// A driver with CSI migration (Azure File) and an in-tree PV of it whose source cannot be
/// translated, with claims deleted while their volume is in flight.
pub fn in_tree() -> Profile {
    Profile {
        name: "in-tree",
        driver: AZURE_FILE,
        faults: Faults {
            timeout_created: 400,
            lost_answer: 100,
            ..NONE.faults
        },
        in_tree_pv: true,
        crash: 0,
        claim_deletes: 8,
        claim_creates: 3,
        claims: 2,
        steps: 200,
        ..NONE
    }
}

/// Several claims restoring from the same snapshot.
pub fn restores() -> Profile {
    Profile {
        name: "restores",
        restores: true,
        faults: Faults {
            timeout_created: 100,
            ..NONE.faults
        },
        claims: 3,
        claim_creates: 1,
        claim_deletes: 1,
        snapshot_deletes: 1,
        steps: 250,
        ..NONE
    }
}

/// Claims deleted while their retries run, with timeouts and lost answers.
pub fn races() -> Profile {
    Profile {
        name: "races",
        faults: Faults {
            timeout_created: 300,
            lost_answer: 100,
            delete_timeout: 50,
            ..NONE.faults
        },
        crash: 0,
        secrets: true,
        slow_calls: 400,
        reaps: 12,
        claim_deletes: 6,
        claim_creates: 3,
        claims: 3,
        steps: 250,
        ..NONE
    }
}

/// Central mode with leader election: the leader pauses, a second replica takes over once the
/// lease expires, the paused one resumes deposed (its fence closed) and exits.
pub fn failover() -> Profile {
    Profile {
        name: "failover",
        faults: Faults {
            timeout_created: 150,
            lost_answer: 50,
            ..NONE.faults
        },
        pause: 4,
        claim_deletes: 2,
        claim_creates: 2,
        claims: 3,
        steps: 250,
        ..NONE
    }
}

pub fn calm() -> Profile {
    NONE
}

pub fn all() -> Vec<Profile> {
    vec![
        calm(),
        failover(),
        node_moves(),
        final_errors(),
        in_tree(),
        restores(),
        races(),
    ]
}
