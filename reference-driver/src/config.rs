//! Command line of `csi-reference-driver` and the validated [`DriverConfig`] it produces.

use std::path::PathBuf;

use clap::Parser;
use thiserror::Error;

use super::faults::{DelayRule, FaultRule, FaultRules};
use super::socket;
use super::state::{Features, Limits};
use super::topology::{Labels, Segment};

pub const DEFAULT_DRIVER_NAME: &str = "reference.csi.example.com";
pub const DEFAULT_NODE_ID: &str = "csi-reference-node";
/// Default name of the control file inside the state directory.
pub const CONTROL_FILE: &str = "faults.txt";

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("--max-volume-size must be positive")]
    MaxVolumeSize,
    #[error("--state-dir must not be empty")]
    StateDir,
    #[error("--segment {0:?} is given twice")]
    DuplicateSegment(Labels),
}

/// Default mode of the CSI socket: owner only.
pub const DEFAULT_SOCKET_MODE: u32 = 0o600;

/// A CSI driver that keeps fake volumes in a JSON file, for testing CSI sidecars.
#[derive(Debug, Parser)]
#[command(name = "csi-reference-driver", version)]
pub struct Cli {
    /// Unix socket to serve on: a path or a unix:// URI.
    #[arg(long, env = "CSI_ENDPOINT", value_parser = parse_endpoint)]
    pub endpoint: PathBuf,

    /// Name returned by GetPluginInfo (2-63 characters, starts and ends with a letter).
    #[arg(long, default_value = DEFAULT_DRIVER_NAME, value_parser = parse_driver_name)]
    pub driver_name: String,

    /// Node id returned by NodeGetInfo.
    #[arg(long, default_value = DEFAULT_NODE_ID, value_parser = parse_node_id)]
    pub node_id: String,

    /// Directory holding state.json (created if missing) and, by default, the control file.
    #[arg(long)]
    pub state_dir: PathBuf,

    /// The node's own segment, reported by NodeGetInfo, as key=value,key=value. Without
    /// --segment it is also the one segment volumes are created in. Enables
    /// VOLUME_ACCESSIBILITY_CONSTRAINTS.
    #[arg(long, value_name = "KEY=VALUE[,KEY=VALUE...]", value_parser = parse_topology)]
    pub topology: Option<Labels>,

    /// A segment this controller creates volumes in, with its own capacity (default
    /// --capacity). Repeatable; the order is the order of preference. Enables
    /// VOLUME_ACCESSIBILITY_CONSTRAINTS.
    #[arg(
        long = "segment",
        value_name = "KEY=VALUE[,KEY=VALUE...][:CAPACITY]",
        value_parser = parse_segment
    )]
    pub segments: Vec<SegmentFlag>,

    /// Bytes the volumes of one segment may use together (e.g. 1Ti, 500Gi, 1073741824); the
    /// capacity of a --segment that names none, and of the single pool without topology.
    #[arg(long, default_value = "1Ti", value_parser = parse_quantity)]
    pub capacity: i64,

    /// Largest single volume in bytes (e.g. 1Ti).
    #[arg(long, default_value = "1Ti", value_parser = parse_quantity)]
    pub max_volume_size: i64,

    /// METHOD=DURATION: delay matching RPCs (METHOD may be *). Repeatable.
    #[arg(long = "delay", value_name = "METHOD=DURATION")]
    pub delays: Vec<DelayRule>,

    /// METHOD=PHASE:ACTION[:COUNT]: inject a fault (see docs/reference-driver.md). Repeatable.
    #[arg(long = "fault", value_name = "METHOD=PHASE:ACTION[:COUNT]")]
    pub faults: Vec<FaultRule>,

    /// Fault control file, re-read whenever it changes [default: <state-dir>/faults.txt].
    #[arg(long)]
    pub control_file: Option<PathBuf>,

    /// Advertise PUBLISH_UNPUBLISH_VOLUME, as a driver whose volumes are attached to nodes
    /// (ControllerPublish/UnpublishVolume stay UNIMPLEMENTED).
    #[arg(long)]
    pub attach_required: bool,

    /// Append every CreateVolume, CreateSnapshot and DeleteSnapshot request to FILE as one JSON
    /// line (secret values redacted).
    #[arg(long, value_name = "FILE")]
    pub request_log: Option<PathBuf>,

    /// New volumes get the id PREFIX followed by their name, instead of `vol-` and a random
    /// UUID (e.g. `projects/UNSPECIFIED/zones/us-central1-a/disks/` to serve ids in the GCE PD
    /// driver's format, for the provisioner's in-tree migration tests).
    #[arg(long, value_name = "PREFIX")]
    pub volume_id_prefix: Option<String>,

    /// Serve no snapshots: CREATE_DELETE_SNAPSHOT, LIST_SNAPSHOTS and GET_SNAPSHOT are not
    /// advertised, the snapshot RPCs are UNIMPLEMENTED and a CreateVolume from a snapshot is
    /// INVALID_ARGUMENT.
    #[arg(long)]
    pub no_snapshots: bool,

    /// Serve no clones: CLONE_VOLUME is not advertised and a CreateVolume from a volume is
    /// INVALID_ARGUMENT.
    #[arg(long)]
    pub no_clone: bool,

    /// Report no capacity: GET_CAPACITY is not advertised and GetCapacity is UNIMPLEMENTED.
    #[arg(long)]
    pub no_get_capacity: bool,

    /// Advertise MODIFY_VOLUME: CreateVolume accepts `mutable_parameters` and keeps them with
    /// the volume (ControllerModifyVolume stays UNIMPLEMENTED).
    #[arg(long)]
    pub modify_volume: bool,

    /// Permissions of the CSI socket, in octal (e.g. 0660 lets the socket's group connect).
    #[arg(long, value_name = "OCTAL", default_value = "0600", value_parser = parse_socket_mode)]
    pub socket_mode: u32,
}

/// One `--segment` as given; its capacity defaults to `--capacity` once all flags are known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentFlag {
    pub labels: Labels,
    pub capacity_bytes: Option<i64>,
}

/// Everything the driver needs to run; tests build it directly with [`DriverConfig::new`].
#[derive(Clone, Debug)]
pub struct DriverConfig {
    pub endpoint: PathBuf,
    pub driver_name: String,
    pub node_id: String,
    pub state_dir: PathBuf,
    /// The node's own segment, for NodeGetInfo; empty means the node reports no topology.
    pub node_topology: Labels,
    /// The segments the controller creates volumes in, and the largest volume.
    pub limits: Limits,
    pub faults: FaultRules,
    pub control_file: PathBuf,
    /// `--attach-required`.
    pub attach_required: bool,
    /// `--request-log`.
    pub request_log: Option<PathBuf>,
    /// `--volume-id-prefix`.
    pub volume_id_prefix: Option<String>,
    /// `--no-snapshots` and `--no-clone` turn these off.
    pub features: Features,
    /// `--socket-mode`.
    pub socket_mode: u32,
}

impl DriverConfig {
    /// Defaults for everything but the socket and the state directory.
    pub fn new(endpoint: PathBuf, state_dir: PathBuf) -> Self {
        let control_file = state_dir.join(CONTROL_FILE);
        Self {
            endpoint,
            driver_name: DEFAULT_DRIVER_NAME.to_string(),
            node_id: DEFAULT_NODE_ID.to_string(),
            state_dir,
            node_topology: Labels::new(),
            limits: Limits {
                segments: vec![Segment::unlabelled(1 << 40)],
                max_volume_size: 1 << 40,
            },
            faults: FaultRules::default(),
            control_file,
            attach_required: false,
            request_log: None,
            volume_id_prefix: None,
            features: Features::default(),
            socket_mode: DEFAULT_SOCKET_MODE,
        }
    }
}

impl TryFrom<Cli> for DriverConfig {
    type Error = ConfigError;

    fn try_from(cli: Cli) -> Result<Self, Self::Error> {
        if cli.state_dir.as_os_str().is_empty() {
            return Err(ConfigError::StateDir);
        }
        if cli.max_volume_size <= 0 {
            return Err(ConfigError::MaxVolumeSize);
        }
        let control_file = cli
            .control_file
            .unwrap_or_else(|| cli.state_dir.join(CONTROL_FILE));
        let mut segments: Vec<Segment> = Vec::with_capacity(cli.segments.len().max(1));
        for flag in cli.segments {
            if segments.iter().any(|s| s.labels == flag.labels) {
                return Err(ConfigError::DuplicateSegment(flag.labels));
            }
            segments.push(Segment {
                labels: flag.labels,
                capacity_bytes: flag.capacity_bytes.unwrap_or(cli.capacity),
            });
        }
        // Without --topology the node sits in the first segment, so that a single driver
        // process with --segment alone is a consistent node and controller.
        let node_topology = cli
            .topology
            .or_else(|| segments.first().map(|s| s.labels.clone()))
            .unwrap_or_default();
        if segments.is_empty() {
            segments.push(Segment {
                labels: node_topology.clone(),
                capacity_bytes: cli.capacity,
            });
        }
        Ok(Self {
            endpoint: cli.endpoint,
            driver_name: cli.driver_name,
            node_id: cli.node_id,
            state_dir: cli.state_dir,
            node_topology,
            limits: Limits {
                segments,
                max_volume_size: cli.max_volume_size,
            },
            faults: FaultRules {
                delays: cli.delays,
                faults: cli.faults,
            },
            control_file,
            attach_required: cli.attach_required,
            request_log: cli.request_log,
            volume_id_prefix: cli.volume_id_prefix,
            features: Features {
                snapshots: !cli.no_snapshots,
                clone: !cli.no_clone,
                get_capacity: !cli.no_get_capacity,
                modify_volume: cli.modify_volume,
            },
            socket_mode: cli.socket_mode,
        })
    }
}

fn parse_endpoint(s: &str) -> Result<PathBuf, String> {
    socket::parse_endpoint(s).map_err(|e| e.to_string())
}

/// An octal permission mode such as `0660` or `660`, of at most the permission bits.
fn parse_socket_mode(s: &str) -> Result<u32, String> {
    let digits = s.strip_prefix("0o").unwrap_or(s);
    match u32::from_str_radix(digits, 8) {
        Ok(mode) if !digits.is_empty() && mode <= 0o777 => Ok(mode),
        _ => Err(format!(
            "expected an octal mode of at most 0777, such as 0660, got {s:?}"
        )),
    }
}

/// The CSI spec's domain-name rule, narrowed to what csi-sanity accepts (letters at both ends).
fn parse_driver_name(s: &str) -> Result<String, String> {
    let starts_and_ends_with_letter = s.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && s.chars().last().is_some_and(|c| c.is_ascii_alphabetic());
    let valid = (2..=63).contains(&s.len())
        && starts_and_ends_with_letter
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
    if valid {
        Ok(s.to_string())
    } else {
        Err("must be 2-63 characters of letters, digits, '-' and '.', starting and ending with a letter".into())
    }
}

fn parse_node_id(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > 256 {
        Err("must be 1-256 bytes".into())
    } else {
        Ok(s.to_string())
    }
}

/// `key=value,key=value` with non-empty, unique keys and values.
pub fn parse_topology(s: &str) -> Result<Labels, String> {
    let mut labels = Labels::new();
    for pair in s.split(',') {
        let (key, value) = pair
            .split_once('=')
            .map(|(k, v)| (k.trim(), v.trim()))
            .filter(|(k, v)| !k.is_empty() && !v.is_empty())
            .ok_or_else(|| format!("expected key=value, got {pair:?}"))?;
        if labels.insert(key.to_string(), value.to_string()).is_some() {
            return Err(format!("key {key:?} given twice"));
        }
    }
    Ok(labels)
}

/// `key=value[,key=value...][:capacity]`. Topology keys and values never hold a colon
/// (Kubernetes label syntax), so the last colon starts the capacity.
pub fn parse_segment(s: &str) -> Result<SegmentFlag, String> {
    let (labels, capacity) = match s.rsplit_once(':') {
        Some((labels, capacity)) => (labels, Some(parse_quantity(capacity)?)),
        None => (s, None),
    };
    Ok(SegmentFlag {
        labels: parse_topology(labels)?,
        capacity_bytes: capacity,
    })
}

/// A byte count: digits with an optional k/M/G/T/P (powers of 1000) or Ki/Mi/Gi/Ti/Pi (powers
/// of 1024) suffix, fitting in an int64 as CSI sizes must.
pub fn parse_quantity(s: &str) -> Result<i64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, suffix) = s.split_at(split);
    let bad = || format!("invalid size {s:?} (use e.g. 1073741824, 10Gi or 1Ti)");
    let n: i64 = digits.parse().map_err(|_| bad())?;
    let multiplier: i64 = match suffix {
        "" => 1,
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        _ => return Err(bad()),
    };
    n.checked_mul(multiplier)
        .ok_or_else(|| format!("size {s:?} does not fit in 64 bits"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn parse(args: &[&str]) -> Result<DriverConfig, String> {
        let cli = Cli::try_parse_from(
            std::iter::once("csi-reference-driver").chain(args.iter().copied()),
        )
        .map_err(|e| e.to_string())?;
        DriverConfig::try_from(cli).map_err(|e| e.to_string())
    }

    #[test]
    fn parses_a_full_command_line() {
        let c = parse(&[
            "--endpoint=unix:///tmp/x/csi.sock",
            "--state-dir=/tmp/x/state",
            "--driver-name=my.driver.example",
            "--node-id=n1",
            "--topology=zone=a, rack=r1",
            "--capacity=100Gi",
            "--max-volume-size=10G",
            "--delay=*=50ms",
            "--delay",
            "CreateVolume=2s",
            "--fault=CreateVolume=after:deadline-exceeded:3",
        ])
        .unwrap();
        assert_eq!(c.endpoint, PathBuf::from("/tmp/x/csi.sock"));
        assert_eq!(c.driver_name, "my.driver.example");
        assert_eq!(c.node_topology.get("rack").map(String::as_str), Some("r1"));
        assert_eq!(
            c.limits.segments,
            [Segment {
                labels: c.node_topology.clone(),
                capacity_bytes: 100 << 30
            }],
            "--topology alone is the one segment"
        );
        assert_eq!(c.limits.max_volume_size, 10_000_000_000);
        assert_eq!(c.faults.delay_for("CreateVolume"), Duration::from_secs(2));
        assert_eq!(c.faults.delay_for("Probe"), Duration::from_millis(50));
        assert_eq!(c.faults.faults.len(), 1);
        assert_eq!(c.control_file, PathBuf::from("/tmp/x/state/faults.txt"));
    }

    #[test]
    fn defaults_apply() {
        let c = parse(&["--endpoint=/tmp/s.sock", "--state-dir=/tmp/st"]).unwrap();
        assert_eq!(c.driver_name, DEFAULT_DRIVER_NAME);
        assert_eq!(c.node_id, DEFAULT_NODE_ID);
        assert!(c.node_topology.is_empty());
        assert_eq!(c.limits.segments, [Segment::unlabelled(1 << 40)]);
    }

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn segments_carry_their_own_capacity() {
        let c = parse(&[
            "--endpoint=/e",
            "--state-dir=/s",
            "--capacity=5Gi",
            "--segment=zone=a,rack=1:10Gi",
            "--segment",
            "zone=b",
            "--topology=zone=b",
        ])
        .unwrap();
        assert_eq!(
            c.limits.segments,
            [
                Segment {
                    labels: labels(&[("zone", "a"), ("rack", "1")]),
                    capacity_bytes: 10 << 30
                },
                Segment {
                    labels: labels(&[("zone", "b")]),
                    capacity_bytes: 5 << 30
                },
            ]
        );
        assert_eq!(c.node_topology, labels(&[("zone", "b")]));

        let c = parse(&[
            "--endpoint=/e",
            "--state-dir=/s",
            "--segment=zone=a:1Gi",
            "--segment=zone=b:0",
        ])
        .unwrap();
        assert_eq!(
            c.node_topology,
            labels(&[("zone", "a")]),
            "without --topology the node is in the first segment"
        );
        assert_eq!(c.limits.segments[1].capacity_bytes, 0);
    }

    #[test]
    fn attach_required_is_off_unless_asked() {
        let base = ["--endpoint=/tmp/s.sock", "--state-dir=/tmp/st"];
        assert!(!parse(&base).unwrap().attach_required);
        let asked = [&base[..], &["--attach-required"]].concat();
        assert!(parse(&asked).unwrap().attach_required);
    }

    #[test]
    fn snapshots_and_clones_are_on_unless_refused() {
        let base = ["--endpoint=/tmp/s.sock", "--state-dir=/tmp/st"];
        let features = |extra: &[&str]| parse(&[&base[..], extra].concat()).unwrap().features;
        assert_eq!(features(&[]), Features::default());
        assert_eq!(
            features(&["--no-snapshots"]),
            Features {
                snapshots: false,
                clone: true,
                get_capacity: true,
                modify_volume: false,
            }
        );
        assert_eq!(
            features(&["--no-clone", "--no-snapshots"]),
            Features {
                snapshots: false,
                clone: false,
                get_capacity: true,
                modify_volume: false,
            }
        );
        assert!(features(&["--modify-volume"]).modify_volume);
    }

    #[test]
    fn bad_flags_name_the_flag() {
        let cases: &[(&[&str], &str)] = &[
            (&["--state-dir=/s"], "--endpoint"),
            (&["--endpoint=/e"], "--state-dir"),
            (&["--endpoint=tcp://h:1", "--state-dir=/s"], "--endpoint"),
            (
                &["--endpoint=/e", "--state-dir=/s", "--driver-name=csi.v1"],
                "--driver-name",
            ),
            (
                &["--endpoint=/e", "--state-dir=/s", "--driver-name=x"],
                "--driver-name",
            ),
            (
                &["--endpoint=/e", "--state-dir=/s", "--node-id="],
                "--node-id",
            ),
            (
                &["--endpoint=/e", "--state-dir=/s", "--topology=zone"],
                "--topology",
            ),
            (
                &["--endpoint=/e", "--state-dir=/s", "--topology=a=1,a=2"],
                "--topology",
            ),
            (
                &["--endpoint=/e", "--state-dir=/s", "--segment=zone"],
                "--segment",
            ),
            (
                &["--endpoint=/e", "--state-dir=/s", "--segment="],
                "--segment",
            ),
            (
                &["--endpoint=/e", "--state-dir=/s", "--segment=zone=a:"],
                "--segment",
            ),
            (
                &["--endpoint=/e", "--state-dir=/s", "--segment=zone=a:lots"],
                "--segment",
            ),
            (
                &["--endpoint=/e", "--state-dir=/s", "--segment=:1Gi"],
                "--segment",
            ),
            (
                &[
                    "--endpoint=/e",
                    "--state-dir=/s",
                    "--segment=zone=a,zone=b:1Gi",
                ],
                "--segment",
            ),
            (
                &[
                    "--endpoint=/e",
                    "--state-dir=/s",
                    "--segment=zone=a,rack=1",
                    "--segment=rack=1,zone=a:1Gi",
                ],
                "--segment",
            ),
            (
                &["--endpoint=/e", "--state-dir=/s", "--capacity=lots"],
                "--capacity",
            ),
            (
                &["--endpoint=/e", "--state-dir=/s", "--capacity=99999999Pi"],
                "--capacity",
            ),
            (
                &["--endpoint=/e", "--state-dir=/s", "--max-volume-size=0"],
                "--max-volume-size",
            ),
            (
                &["--endpoint=/e", "--state-dir=/s", "--delay=CreateVolume"],
                "--delay",
            ),
            (
                &[
                    "--endpoint=/e",
                    "--state-dir=/s",
                    "--fault=CreateVolume=after:nope",
                ],
                "--fault",
            ),
            (
                &[
                    "--endpoint=/e",
                    "--state-dir=/s",
                    "--fault=Bogus=after:internal",
                ],
                "--fault",
            ),
        ];
        for (args, flag) in cases {
            let err = parse(args).expect_err("should be rejected");
            assert!(
                err.contains(flag),
                "{args:?}: {err:?} should mention {flag}"
            );
        }
    }

    #[test]
    fn socket_mode_is_octal_and_owner_only_by_default() {
        let base = ["--endpoint=/csi/csi.sock", "--state-dir=/s"];
        assert_eq!(parse(&base).unwrap().socket_mode, 0o600);
        let with = |mode: &str| parse(&[&base[..], &[mode]].concat());
        assert_eq!(with("--socket-mode=0660").unwrap().socket_mode, 0o660);
        assert_eq!(with("--socket-mode=640").unwrap().socket_mode, 0o640);
        for extra in ["--socket-mode=0999", "--socket-mode=1777", "--socket-mode="] {
            let err = with(extra).unwrap_err();
            assert!(err.contains("--socket-mode"), "{extra}: {err}");
        }
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("0"), Ok(0));
        assert_eq!(parse_quantity("1Ki"), Ok(1024));
        assert_eq!(parse_quantity("2k"), Ok(2000));
        assert_eq!(parse_quantity("1Pi"), Ok(1 << 50));
        assert!(parse_quantity("").is_err());
        assert!(parse_quantity("1.5Gi").is_err());
        assert!(parse_quantity("-1").is_err());
        assert!(parse_quantity("1Gb").is_err());
    }
}
