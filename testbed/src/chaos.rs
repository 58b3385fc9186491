//! Pieces of the chaos plans of the chaos test (tests/chaos.rs) and the benchmark's chaos
//! scenario (`testbed bench --only chaos`), which uses the driver rules only.

use crate::Rng;

/// One set of the reference driver's fault rules (docs/reference-driver.md syntax): CreateVolume
/// delayed by `usual_delay`, sometimes by 4 s (beyond the sidecars' 3 s `--timeout`, so their
/// own deadline expires and the driver abandons the call); now and then CreateVolume answering
/// DEADLINE_EXCEEDED after creating the volume, never answering after creating it (a lost
/// reply), or UNAVAILABLE before doing anything; and DeleteVolume answering DEADLINE_EXCEEDED
/// after deleting.
pub fn driver_fault_rules(rng: &mut Rng, usual_delay: &str) -> String {
    let delay = if rng.chance(15) { "4s" } else { usual_delay };
    let mut rules = format!("delay CreateVolume={delay}\n");
    if rng.chance(50) {
        let n = rng.between(1, 6);
        rules.push_str(&format!("fault CreateVolume=after:deadline-exceeded:{n}\n"));
    }
    if rng.chance(20) {
        let n = rng.between(1, 3);
        rules.push_str(&format!("fault CreateVolume=before:unavailable:{n}\n"));
    }
    if rng.chance(25) {
        let n = rng.between(1, 4);
        rules.push_str(&format!("fault CreateVolume=after:hang:{n}\n"));
    }
    if rng.chance(30) {
        let n = rng.between(1, 4);
        rules.push_str(&format!("fault DeleteVolume=after:deadline-exceeded:{n}\n"));
    }
    rules
}

/// The two rule sets of a "final error after a timeout" episode, to apply one after the other
/// (issue #15, first case): first every CreateVolume creates its volume and answers
/// DEADLINE_EXCEEDED, so the caller cannot know whether the volume exists; then every
/// CreateVolume fails before doing anything with a code the sidecar treats as final (INTERNAL or
/// ALREADY_EXISTS), which is what the retries of those calls meet. Both keep CreateVolume
/// delayed by `usual_delay`.
pub fn final_error_after_timeout_rules(rng: &mut Rng, usual_delay: &str) -> [String; 2] {
    let code = if rng.chance(50) {
        "internal"
    } else {
        "already-exists"
    };
    [
        format!("delay CreateVolume={usual_delay}\nfault CreateVolume=after:deadline-exceeded\n"),
        format!("delay CreateVolume={usual_delay}\nfault CreateVolume=before:{code}\n"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_always_set_the_delay_and_only_use_known_faults() {
        let mut rng = Rng::new(9);
        for _ in 0..200 {
            let rules = driver_fault_rules(&mut rng, "300ms");
            let mut lines = rules.lines();
            let delay = lines.next().unwrap();
            assert!(
                ["delay CreateVolume=300ms", "delay CreateVolume=4s"].contains(&delay),
                "{delay}"
            );
            for line in lines {
                assert!(
                    line.starts_with("fault CreateVolume=after:deadline-exceeded:")
                        || line.starts_with("fault CreateVolume=before:unavailable:")
                        || line.starts_with("fault CreateVolume=after:hang:")
                        || line.starts_with("fault DeleteVolume=after:deadline-exceeded:"),
                    "{line}"
                );
            }
        }
    }

    #[test]
    fn a_final_error_episode_times_out_first_then_fails_every_call_finally() {
        let mut rng = Rng::new(9);
        let mut codes = std::collections::BTreeSet::new();
        for _ in 0..50 {
            let [timeout, final_error] = final_error_after_timeout_rules(&mut rng, "300ms");
            assert_eq!(
                timeout,
                "delay CreateVolume=300ms\nfault CreateVolume=after:deadline-exceeded\n"
            );
            let code = final_error
                .strip_prefix("delay CreateVolume=300ms\nfault CreateVolume=before:")
                .and_then(|rest| rest.strip_suffix('\n'))
                .unwrap_or_else(|| panic!("{final_error}"));
            codes.insert(code.to_owned());
        }
        assert_eq!(
            codes,
            ["already-exists", "internal"].map(String::from).into()
        );
    }
}
