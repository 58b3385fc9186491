//! The volume name: PV name and CreateVolume `name` (`--volume-name-prefix`,
//! `--volume-name-uuid-length`).
//!
//! Deliberate differences from upstream, which never validates these flags:
//! - `--volume-name-uuid-length` outside -1..=32 is an error instead of a panic.
//! - 0 is rejected too: upstream turns it into `<prefix>-` for *every* claim, so all claims
//!   share one volume name and an idempotent driver hands them the same volume.
//! - The finished name must be a valid PV name (DNS-1123 subdomain). Upstream would call
//!   CreateVolume and only then fail to create the PV, forever.

use thiserror::Error;

use super::validation::dns1123_subdomain_problem;

/// Characters in a UID without its dashes.
const UID_HEX_LEN: i32 = 32;

/// Why no volume name can be made.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum VolumeNameError {
    /// `--volume-name-prefix` is empty.
    #[error("volume name prefix cannot be empty")]
    EmptyPrefix,
    /// `--volume-name-uuid-length` is neither -1 nor in 1..=32.
    #[error("volume name UUID length must be -1 (whole UID) or between 1 and 32, got {0}")]
    UuidLengthOutOfRange(i32),
    /// The claim has no `metadata.uid`.
    #[error("claim has no UID")]
    MissingUid,
    /// The UID is shorter than the configured length once its dashes are removed.
    #[error("claim UID {uid:?} has fewer than {length} characters without dashes")]
    UidTooShort { uid: String, length: i32 },
    /// The result cannot be a PersistentVolume name.
    #[error("volume name {name:?} is not a valid PersistentVolume name: {reason}")]
    InvalidName { name: String, reason: &'static str },
}

/// Validates the two naming flags on their own, so a bad setting can fail at startup.
pub fn check_volume_name_flags(prefix: &str, uuid_length: i32) -> Result<(), VolumeNameError> {
    if prefix.is_empty() {
        return Err(VolumeNameError::EmptyPrefix);
    }
    if uuid_length != -1 && !(1..=UID_HEX_LEN).contains(&uuid_length) {
        return Err(VolumeNameError::UuidLengthOutOfRange(uuid_length));
    }
    Ok(())
}

/// Whether two claims may be given the same volume name: only when it keeps part of the UID
/// (`--volume-name-uuid-length` 1..=31). Then a PV named like a claim's volume may be another
/// claim's, and must be read to tell.
pub fn names_may_collide(uuid_length: i32) -> bool {
    (1..UID_HEX_LEN).contains(&uuid_length)
}

/// `<prefix>-<uid>` with `uuid_length` -1, else `<prefix>-` and the first `uuid_length`
/// characters of the UID without dashes.
pub fn volume_name(
    prefix: &str,
    uuid_length: i32,
    claim_uid: &str,
) -> Result<String, VolumeNameError> {
    check_volume_name_flags(prefix, uuid_length)?;
    if claim_uid.is_empty() {
        return Err(VolumeNameError::MissingUid);
    }
    let suffix = match usize::try_from(uuid_length) {
        // -1: the whole UID, dashes included.
        Err(_) => claim_uid.to_owned(),
        Ok(length) => {
            let hex: String = claim_uid
                .chars()
                .filter(|c| *c != '-')
                .take(length)
                .collect();
            if hex.chars().count() < length {
                return Err(VolumeNameError::UidTooShort {
                    uid: claim_uid.to_owned(),
                    length: uuid_length,
                });
            }
            hex
        }
    };
    let name = format!("{prefix}-{suffix}");
    match dns1123_subdomain_problem(&name) {
        Some(reason) => Err(VolumeNameError::InvalidName { name, reason }),
        None => Ok(name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0b2c9f8e-1d3a-4e5f-8a7b-6c5d4e3f2a1b";

    fn err(prefix: &str, length: i32, uid: &str) -> String {
        match volume_name(prefix, length, uid) {
            Ok(name) => panic!("expected an error, got {name}"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn default_name_is_prefix_and_whole_uid() {
        assert_eq!(
            volume_name("pvc", -1, UID).as_deref(),
            Ok("pvc-0b2c9f8e-1d3a-4e5f-8a7b-6c5d4e3f2a1b")
        );
    }

    #[test]
    fn uuid_length_keeps_the_first_characters_without_dashes() {
        assert_eq!(volume_name("vol", 8, UID).as_deref(), Ok("vol-0b2c9f8e"));
        assert_eq!(volume_name("vol", 10, UID).as_deref(), Ok("vol-0b2c9f8e1d"));
        assert_eq!(
            volume_name("vol", 32, UID).as_deref(),
            Ok("vol-0b2c9f8e1d3a4e5f8a7b6c5d4e3f2a1b")
        );
    }

    #[test]
    fn only_a_part_of_the_uid_lets_names_collide() {
        assert!(!names_may_collide(-1), "the whole UID");
        assert!(!names_may_collide(32), "every hex digit of the UID");
        assert!(names_may_collide(1));
        assert!(names_may_collide(31));
    }

    #[test]
    fn empty_prefix_is_rejected() {
        assert_eq!(err("", -1, UID), "volume name prefix cannot be empty");
    }

    #[test]
    fn uuid_length_zero_is_rejected_because_every_claim_would_share_one_name() {
        assert_eq!(
            err("pvc", 0, UID),
            "volume name UUID length must be -1 (whole UID) or between 1 and 32, got 0"
        );
    }

    #[test]
    fn uuid_length_out_of_bounds_is_rejected_instead_of_panicking() {
        assert_eq!(
            err("pvc", 33, UID),
            "volume name UUID length must be -1 (whole UID) or between 1 and 32, got 33"
        );
        assert_eq!(
            err("pvc", -2, UID),
            "volume name UUID length must be -1 (whole UID) or between 1 and 32, got -2"
        );
        assert!(check_volume_name_flags("pvc", i32::MIN).is_err());
        assert_eq!(check_volume_name_flags("pvc", -1), Ok(()));
    }

    #[test]
    fn missing_or_short_uid_is_rejected() {
        assert_eq!(err("pvc", -1, ""), "claim has no UID");
        assert_eq!(
            err("pvc", 8, "ab-cd"),
            "claim UID \"ab-cd\" has fewer than 8 characters without dashes"
        );
    }

    #[test]
    fn prefix_that_makes_an_invalid_pv_name_is_rejected_before_create_volume() {
        assert_eq!(
            err("PVC", 8, UID),
            "volume name \"PVC-0b2c9f8e\" is not a valid PersistentVolume name: must consist of \
             lower case alphanumeric characters, '-' or '.', and must start and end with an \
             alphanumeric character"
        );
        assert_eq!(
            err(&"p".repeat(250), -1, UID),
            format!(
                "volume name \"{}-{UID}\" is not a valid PersistentVolume name: must be no more \
                 than 253 characters",
                "p".repeat(250)
            )
        );
    }
}
