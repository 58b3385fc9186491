use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use clap::CommandFactory;

use super::*;

fn parse(flags: &[&str]) -> Result<Args, clap::Error> {
    Args::parse_flags_from(std::iter::once("csi-provisioner").chain(flags.iter().copied()))
}

fn ok(flags: &[&str]) -> Args {
    match parse(flags) {
        Ok(a) => a,
        Err(e) => panic!("{flags:?}: {e}"),
    }
}

fn err(flags: &[&str]) -> String {
    match parse(flags) {
        Ok(a) => panic!("{flags:?} parsed: {a:?}"),
        Err(e) => e.to_string(),
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn defaults_equal_upstream() {
    let a = ok(&[]);
    assert_eq!(a.driver.csi_address, "/run/csi/socket");
    assert_eq!(a.driver.timeout, secs(10));
    assert_eq!(a.client.kubeconfig, "");
    assert_eq!(a.client.master, "");
    assert_eq!(a.client.kube_api_qps, 5.0);
    assert_eq!(a.client.kube_api_burst, 10);
    assert!(!a.version);
    assert!(!a.automaxprocs);
    assert_eq!(a.provision.volume_name_prefix, "pvc");
    assert_eq!(a.provision.volume_name_uuid_length, -1);
    assert!(!a.provision.extra_create_metadata);
    assert_eq!(a.provision.default_fstype, "");
    assert!(!a.provision.controller_publish_readonly);
    assert!(a.provision.prevent_volume_mode_conversion);
    assert!(!a.topology.strict_topology);
    assert!(a.topology.immediate_topology);
    assert!(!a.capacity.enable_capacity);
    assert!(!a.capacity.capacity_for_immediate_binding);
    assert_eq!(a.capacity.capacity_poll_interval, secs(60));
    assert_eq!(a.capacity.capacity_ownerref_level, 1);
    assert_eq!(a.capacity.capacity_threads, 1);
    assert_eq!(a.capacity.kube_api_capacity_qps, 1.0);
    assert_eq!(a.capacity.kube_api_capacity_burst, 5);
    assert!(!a.node_deployment.node_deployment);
    assert!(a.node_deployment.node_deployment_immediate_binding);
    assert_eq!(a.node_deployment.node_deployment_base_delay, secs(20));
    assert_eq!(a.node_deployment.node_deployment_max_delay, secs(60));
    assert!(!a.leader.leader_election);
    assert_eq!(a.leader.leader_election_namespace, "");
    assert_eq!(a.leader.leader_election_lease_duration, secs(15));
    assert_eq!(a.leader.leader_election_renew_deadline, secs(10));
    assert_eq!(a.leader.leader_election_retry_period, secs(5));
    assert!(a.leader.labels().is_empty());
    assert_eq!(a.http.http_endpoint, "");
    assert_eq!(a.http.metrics_address, "");
    assert_eq!(a.http.metrics_path, "/metrics");
    assert!(!a.http.enable_pprof);
    assert_eq!(a.controller.retry_interval_start, secs(1));
    assert_eq!(a.controller.retry_interval_max, secs(300));
    assert_eq!(a.controller.worker_threads, 100);
    assert_eq!(a.controller.cloning_protection_threads, 1);
    assert_eq!(a.controller.snapshot_orphan_sweep_interval, secs(300));
    assert_eq!(a.log.logging_format, LoggingFormat::Text);
    assert_eq!(a.log.log_flush_frequency, secs(5));
    assert_eq!(a.log.verbosity, 0);
    assert!(a.log.vmodule_items().is_empty());
    assert_eq!(a.log.log_text_info_buffer_size, 0);
    assert_eq!(a.log.log_json_info_buffer_size, 0);
    assert!(!a.log.log_text_split_stream);
    assert!(!a.log.log_json_split_stream);
    assert_eq!(a.controller.max_concurrent_per_storage_class, 0);
    assert_eq!(
        a.controller.provisioning_consistency_default,
        ConsistencyDefault::Disable
    );
    assert!(!a.controller.drain);
    let g = a.feature_gates();
    assert!(g.enabled(Gate::Topology));
    assert!(!g.enabled(Gate::CrossNamespaceVolumeDataSource));
    assert!(g.enabled(Gate::VolumeAttributesClass));
    assert!(!g.enabled(Gate::ReleaseLeaderElectionOnExit));
    assert_eq!(a.validate(), Ok(()));
}

#[test]
fn every_flag_parses() {
    let argv = [
        "--csi-address=unix:///csi/csi.sock",
        "--timeout=1m30s",
        "--kubeconfig=/k",
        "--master=https://h:6443",
        "--kube-api-qps=20.5",
        "--kube-api-burst=40",
        "--version=false",
        "--automaxprocs",
        "--volume-name-prefix=vol",
        "--volume-name-uuid-length=8",
        "--extra-create-metadata",
        "--default-fstype=ext4",
        "--controller-publish-readonly=true",
        "--prevent-volume-mode-conversion=false",
        "--strict-topology",
        "--immediate-topology=false",
        "--enable-capacity",
        "--capacity-for-immediate-binding",
        "--capacity-poll-interval=2m",
        "--capacity-ownerref-level=-1",
        "--capacity-threads=3",
        "--kube-api-capacity-qps=2.5",
        "--kube-api-capacity-burst=7",
        "--node-deployment",
        "--node-deployment-immediate-binding=false",
        "--node-deployment-base-delay=5s",
        "--node-deployment-max-delay=2m",
        "--leader-election",
        "--leader-election-namespace=kube-system",
        "--leader-election-lease-duration=30s",
        "--leader-election-renew-deadline=20s",
        "--leader-election-retry-period=2s",
        "--leader-election-labels=a:b,c:d",
        "--http-endpoint=:8080",
        "--metrics-path=/m",
        "--enable-pprof",
        "--retry-interval-start=500ms",
        "--retry-interval-max=10m",
        "--worker-threads=7",
        "--cloning-protection-threads=2",
        "--snapshot-orphan-sweep-interval=0",
        "--feature-gates=Topology=false,AllAlpha=true",
        "--logging-format=json",
        "--log-flush-frequency=1s",
        "-v=5",
        "--vmodule=foo=2,bar*=3",
        "--log-text-split-stream",
        "--log-text-info-buffer-size=1Mi",
        "--log-json-split-stream=true",
        "--log-json-info-buffer-size=2Mi",
        "--max-concurrent-per-storage-class=4",
        "--adaptive-call-rate",
        "--audit-volumes-interval=10m",
        "--audit-delete-after=24h",
        "--provisioning-consistency-default=enable",
        "--drain",
        "--copy-claim-labels=team,cost.example.com/*",
        "--extra-create-metadata-claim-annotations=example.com/owner",
        "--extra-create-metadata-namespace-labels=tier",
        "--extra-create-metadata-namespace-annotations=note-*",
    ];
    let a = ok(&argv);
    assert_eq!(a.driver.csi_address, "unix:///csi/csi.sock");
    assert_eq!(a.driver.timeout, secs(90));
    assert_eq!(a.client.kubeconfig, "/k");
    assert_eq!(a.client.master, "https://h:6443");
    assert_eq!(a.client.kube_api_qps, 20.5);
    assert_eq!(a.client.kube_api_burst, 40);
    assert!(!a.version);
    assert!(a.automaxprocs);
    assert_eq!(a.provision.volume_name_prefix, "vol");
    assert_eq!(a.provision.volume_name_uuid_length, 8);
    assert!(a.provision.extra_create_metadata);
    assert_eq!(a.provision.default_fstype, "ext4");
    assert!(a.provision.controller_publish_readonly);
    assert!(!a.provision.prevent_volume_mode_conversion);
    assert!(a.topology.strict_topology);
    assert!(!a.topology.immediate_topology);
    assert!(a.capacity.enable_capacity);
    assert!(a.capacity.capacity_for_immediate_binding);
    assert_eq!(a.capacity.capacity_poll_interval, secs(120));
    assert_eq!(a.capacity.capacity_ownerref_level, -1);
    assert_eq!(a.capacity.capacity_threads, 3);
    assert_eq!(a.capacity.kube_api_capacity_qps, 2.5);
    assert_eq!(a.capacity.kube_api_capacity_burst, 7);
    assert!(a.node_deployment.node_deployment);
    assert!(!a.node_deployment.node_deployment_immediate_binding);
    assert_eq!(a.node_deployment.node_deployment_base_delay, secs(5));
    assert_eq!(a.node_deployment.node_deployment_max_delay, secs(120));
    assert!(a.leader.leader_election);
    assert_eq!(a.leader.leader_election_namespace, "kube-system");
    assert_eq!(a.leader.leader_election_lease_duration, secs(30));
    assert_eq!(a.leader.leader_election_renew_deadline, secs(20));
    assert_eq!(a.leader.leader_election_retry_period, secs(2));
    assert_eq!(
        a.leader.labels(),
        BTreeMap::from([("a".into(), "b".into()), ("c".into(), "d".into())])
    );
    assert_eq!(a.http.http_endpoint, ":8080");
    assert_eq!(a.http.metrics_path, "/m");
    assert!(a.http.enable_pprof);
    assert_eq!(
        a.controller.retry_interval_start,
        Duration::from_millis(500)
    );
    assert_eq!(a.controller.retry_interval_max, secs(600));
    assert_eq!(a.controller.worker_threads, 7);
    assert_eq!(a.controller.cloning_protection_threads, 2);
    assert_eq!(a.controller.snapshot_orphan_sweep_interval, Duration::ZERO);
    let g = a.feature_gates();
    assert!(!g.enabled(Gate::Topology));
    assert!(g.enabled(Gate::CrossNamespaceVolumeDataSource));
    assert!(g.enabled(Gate::ReleaseLeaderElectionOnExit));
    assert!(g.enabled(Gate::VolumeAttributesClass));
    assert!(!g.is_explicit(Gate::VolumeAttributesClass));
    assert_eq!(a.log.logging_format, LoggingFormat::Json);
    assert_eq!(a.log.log_flush_frequency, secs(1));
    assert_eq!(a.log.verbosity, 5);
    assert_eq!(a.log.vmodule, vec![parse_vmodule("foo=2,bar*=3").unwrap()]);
    assert!(a.log.log_text_split_stream);
    assert_eq!(a.log.log_text_info_buffer_size, 1024 * 1024);
    assert!(a.log.log_json_split_stream);
    assert_eq!(a.log.log_json_info_buffer_size, 2 * 1024 * 1024);
    assert_eq!(a.controller.max_concurrent_per_storage_class, 4);
    assert!(a.controller.adaptive_call_rate);
    assert_eq!(a.controller.audit_volumes_interval, secs(600));
    assert_eq!(a.controller.audit_delete_after, secs(86_400));
    assert_eq!(
        a.controller.provisioning_consistency_default,
        ConsistencyDefault::Enable
    );
    assert!(a.controller.drain);
    let lists = a.provision.metadata_allow_lists();
    assert!(lists.claim_labels.allows("team") && lists.claim_labels.allows("cost.example.com/x"));
    assert!(lists.claim_annotations.allows("example.com/owner"));
    assert!(lists.namespace_labels.allows("tier"));
    assert!(lists.namespace_annotations.allows("note-1"));
    // --vmodule is for the text format only (as upstream); everything else is valid.
    assert!(matches!(
        a.validate(),
        Err(ConfigError::Invalid {
            flag: "vmodule",
            ..
        })
    ));
    let mut text = a.clone();
    text.log.logging_format = LoggingFormat::Text;
    assert_eq!(text.validate(), Ok(()));
    // Every flag of the table was given above, except the one excluding --http-endpoint.
    let mut given: BTreeSet<_> = FLAGS.iter().map(|f| f.name.to_owned()).collect();
    given.remove("metrics-address");
    let named: BTreeSet<_> = argv
        .iter()
        .filter_map(|arg| arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')))
        .map(|arg| arg.split('=').next().unwrap_or(arg).to_owned())
        .collect();
    assert_eq!(named, given);
    assert_eq!(
        ok(&["--metrics-address=:9090"]).http.metrics_address,
        ":9090"
    );
}

#[test]
fn command_is_consistent_and_documented() {
    Args::command().debug_assert();
    let help = Args::command().render_long_help().to_string();
    for f in FLAGS {
        assert!(
            help.contains(&format!("--{}", f.name)),
            "--{} missing from help",
            f.name
        );
    }
}

#[test]
fn flag_table_matches_the_parser() {
    let cmd = Args::command();
    let parser: BTreeSet<_> = cmd
        .get_arguments()
        .filter_map(|a| a.get_long())
        .filter(|l| *l != "help")
        .collect();
    let table: BTreeSet<_> = FLAGS.iter().map(|f| f.name).collect();
    assert_eq!(parser, table);
    assert_eq!(table.len(), FLAGS.len(), "duplicate rows in FLAGS");
}

/// docs/flags.md has one row per flag whose status column equals `FLAGS`.
#[test]
fn docs_table_matches_flag_table() {
    let doc = include_str!("../../docs/flags.md");
    for f in FLAGS {
        let prefix = format!("| `--{}` |", f.name);
        let row = doc
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("docs/flags.md has no row for --{}", f.name));
        let cols: Vec<_> = row.split('|').map(str::trim).collect();
        assert_eq!(
            cols.get(4).copied(),
            Some(f.status.label()),
            "status of --{}",
            f.name
        );
    }
}

/// component-base's checks: the alpha logging options need LoggingAlphaOptions (named or
/// through AllAlpha), given at their defaults they need nothing, `--vmodule` is for the text
/// format, the flush period must be positive; `--vmodule` occurrences add up.
#[test]
fn logging_flags_follow_component_base() {
    let invalid = |flags: &[&str]| match ok(flags).validate() {
        Err(ConfigError::Invalid { flag, reason }) => format!("--{flag}: {reason}"),
        other => panic!("{flags:?}: {other:?}"),
    };
    assert_eq!(
        invalid(&["--log-text-split-stream"]),
        "--log-text-split-stream: options.text.splitStream: Forbidden: Feature \
         LoggingAlphaOptions is disabled (enable it with --feature-gates=LoggingAlphaOptions=true)"
    );
    for (flag, option) in [
        (
            "--log-text-info-buffer-size=1Ki",
            "options.text.infoBufferSize",
        ),
        ("--log-json-split-stream", "options.json.splitStream"),
        (
            "--log-json-info-buffer-size=1",
            "options.json.infoBufferSize",
        ),
    ] {
        assert!(invalid(&[flag]).contains(option), "{flag}");
        assert!(
            invalid(&[
                flag,
                "--feature-gates=AllAlpha=true,LoggingAlphaOptions=false"
            ])
            .contains(option),
            "{flag}: the named gate wins over AllAlpha"
        );
        for gate in ["LoggingAlphaOptions=true", "AllAlpha=true"] {
            let a = ok(&[flag, &format!("--feature-gates={gate}")]);
            assert_eq!(a.validate(), Ok(()), "{flag} {gate}");
        }
    }
    for defaults in [
        "--log-text-split-stream=false",
        "--log-json-split-stream=false",
        "--log-text-info-buffer-size=0",
        "--log-json-info-buffer-size=0Ki",
    ] {
        assert_eq!(ok(&[defaults]).validate(), Ok(()), "{defaults}");
    }
    assert_eq!(
        invalid(&["--logging-format=json", "--vmodule=claim=0"]),
        "--vmodule: Forbidden: Only supported for text log format"
    );
    assert_eq!(
        ok(&["--log-flush-frequency=0s"]).validate(),
        Err(ConfigError::OutOfRange {
            flag: "log-flush-frequency",
            value: "0s".into(),
            expected: "greater than 0"
        })
    );
    let a = ok(&["--vmodule=claim=5", "--vmodule=leader=2,", "-vmodule=x*=1"]);
    let items: Vec<_> = a
        .log
        .vmodule_items()
        .into_iter()
        .map(|i| (i.pattern, i.level))
        .collect();
    assert_eq!(
        items,
        [("claim".into(), 5), ("leader".into(), 2), ("x*".into(), 1)]
    );
    assert!(err(&["--vmodule=claim"]).contains("does not have the pattern=N format"));
    assert!(err(&["--log-text-info-buffer-size=1KB"]).contains("is not a quantity"));
    // The flags of the format not chosen are not used.
    let a = ok(&[
        "--log-json-split-stream",
        "--log-json-info-buffer-size=1Ki",
        "--feature-gates=LoggingAlphaOptions=true",
    ]);
    assert!(!a.log.split_stream());
    assert_eq!(a.log.info_buffer_size(), 0);
    let a = ok(&[
        "--logging-format=json",
        "--log-json-split-stream",
        "--log-json-info-buffer-size=3Gi",
    ]);
    assert!(a.log.split_stream());
    assert_eq!(
        a.log.info_buffer_size(),
        2 * 1024 * 1024 * 1024,
        "capped as upstream"
    );
}

/// Every "same" row names tests of its behaviour (`same_evidence`), and they exist.
#[test]
fn every_same_row_names_existing_tests() {
    let same: BTreeSet<_> = FLAGS
        .iter()
        .filter(|f| f.status == FlagStatus::Same)
        .map(|f| f.name)
        .collect();
    let evidenced: BTreeSet<_> = same_evidence::SAME_EVIDENCE
        .iter()
        .map(|(f, _)| *f)
        .collect();
    assert_eq!(
        same, evidenced,
        "FLAGS rows with status same vs same_evidence.rs"
    );
    for (flag, tests) in same_evidence::SAME_EVIDENCE {
        assert!(!tests.is_empty(), "--{flag} names no test");
        for test in *tests {
            if let Err(why) = test_exists(test) {
                panic!("--{flag}: {test}: {why}");
            }
        }
    }
    // The check itself can fail.
    assert!(test_exists("src/config/tests.rs::no_such_test").is_err());
    assert!(
        test_exists("src/config/tests.rs::test_exists").is_err(),
        "not a test"
    );
    assert!(test_exists("src/nowhere.rs::x").is_err());
}

/// Whether `path::function` is a test function (not ignored) under the repository root.
fn test_exists(name: &str) -> Result<(), String> {
    let (path, function) = name.rsplit_once("::").ok_or("not path::function")?;
    let file = crate::work_tree().join(path);
    let source = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    let lines: Vec<_> = source.lines().map(str::trim).collect();
    let signature = |l: &&str| {
        ["fn ", "async fn "]
            .iter()
            .any(|p| l.starts_with(&format!("{p}{function}(")))
    };
    let at = lines.iter().position(signature).ok_or("no such function")?;
    let attributes: Vec<_> = lines[..at]
        .iter()
        .rev()
        .take_while(|l| l.starts_with("#[") || l.starts_with("//"))
        .collect();
    if attributes.iter().any(|l| l.starts_with("#[ignore")) {
        return Err("ignored".into());
    }
    if !attributes
        .iter()
        .any(|l| **l == "#[test]" || l.starts_with("#[tokio::test"))
    {
        return Err("not a #[test]".into());
    }
    Ok(())
}

/// docs/flags.md has one row per gate whose default and stage are the code's, and no row
/// says a gate is not built.
#[test]
fn docs_gate_table_matches_the_gates() {
    let doc = include_str!("../../docs/flags.md");
    for gate in Gate::ALL {
        let prefix = format!("| `{}` |", gate.name());
        let row = doc
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("docs/flags.md has no row for gate {}", gate.name()));
        let cols: Vec<_> = row.split('|').map(str::trim).collect();
        let default = cols.get(2).copied().unwrap_or_default();
        assert!(
            default.starts_with(&gate.default_enabled().to_string()),
            "default of {}: {default}",
            gate.name()
        );
        let ours = cols.get(3).copied().unwrap_or_default();
        assert!(
            !ours.contains("not built") && !ours.contains("refused"),
            "{}: {ours}",
            gate.name()
        );
    }
}

#[test]
fn bools_follow_pflag() {
    assert!(ok(&["--leader-election"]).leader.leader_election);
    assert!(ok(&["--leader-election=true"]).leader.leader_election);
    assert!(ok(&["--leader-election=T"]).leader.leader_election);
    assert!(!ok(&["--leader-election=false"]).leader.leader_election);
    assert!(!ok(&["--leader-election=0"]).leader.leader_election);
    assert!(
        !ok(&["--immediate-topology=false"])
            .topology
            .immediate_topology
    );
    // Last occurrence wins, as in pflag.
    assert!(
        !ok(&["--leader-election", "--leader-election=false"])
            .leader
            .leader_election
    );
    // The value of a bool must be attached with `=`.
    let e = err(&["--leader-election", "false"]);
    assert!(e.contains("false"), "{e}");
    let e = err(&["--leader-election=yes"]);
    assert!(e.contains("--leader-election"), "{e}");
}

#[test]
fn go_single_dash_forms() {
    assert_eq!(ok(&["-v=5"]).log.verbosity, 5);
    assert_eq!(ok(&["-v", "3"]).log.verbosity, 3);
    assert_eq!(ok(&["-v4"]).log.verbosity, 4);
    assert_eq!(ok(&["--v=2"]).log.verbosity, 2);
    let a = ok(&[
        "-csi-address=/csi.sock",
        "-leader-election",
        "-timeout",
        "3s",
    ]);
    assert_eq!(a.driver.csi_address, "/csi.sock");
    assert!(a.leader.leader_election);
    assert_eq!(a.driver.timeout, secs(3));
    // A value that looks like a flag stays a value.
    assert_eq!(
        ok(&["--volume-name-prefix", "-timeout"])
            .provision
            .volume_name_prefix,
        "-timeout"
    );
    assert_eq!(
        ok(&["--volume-name-uuid-length", "-1"])
            .provision
            .volume_name_uuid_length,
        -1
    );
}

#[test]
fn unknown_flags_are_rejected() {
    let e = err(&["--no-such-flag"]);
    assert!(e.contains("--no-such-flag"), "{e}");
    // Legacy klog flags are gone upstream too.
    assert!(err(&["--logtostderr"]).contains("--logtostderr"));
    let e = Args::parse_flags_from(["csi-provisioner", "--bogus"]).map(|_| ());
    assert_eq!(e.map_err(|e| e.exit_code()), Err(2));
}

#[test]
fn bad_values_name_the_flag() {
    for (flags, flag) in [
        (&["--timeout=10"][..], "--timeout"),
        (&["--timeout=-1s"], "--timeout"),
        (&["--retry-interval-max=5x"], "--retry-interval-max"),
        (&["--worker-threads=-1"], "--worker-threads"),
        (&["--kube-api-qps=fast"], "--kube-api-qps"),
        (
            &["--leader-election-labels=a=b"],
            "--leader-election-labels",
        ),
        (
            &["--leader-election-labels=a:b:c"],
            "--leader-election-labels",
        ),
        (&["--feature-gates=NoSuchGate=true"], "--feature-gates"),
        (&["--feature-gates=Topology"], "--feature-gates"),
        (&["--feature-gates=Topology=maybe"], "--feature-gates"),
        (&["--logging-format=xml"], "--logging-format"),
        (&["--vmodule=foo"], "--vmodule"),
        (&["-v=high"], "--v"),
        (
            &["--provisioning-consistency-default=yes"],
            "--provisioning-consistency-default",
        ),
        (&["--copy-claim-labels=a b"], "--copy-claim-labels"),
        (&["--copy-claim-labels=*"], "--copy-claim-labels"),
        (
            &["--extra-create-metadata-claim-annotations=a/b/c"],
            "--extra-create-metadata-claim-annotations",
        ),
        (
            &["--extra-create-metadata-namespace-labels=team,,x"],
            "--extra-create-metadata-namespace-labels",
        ),
        (
            &["--extra-create-metadata-namespace-annotations=-*"],
            "--extra-create-metadata-namespace-annotations",
        ),
    ] {
        let e = err(flags);
        assert!(e.contains(flag), "{flags:?}: {e}");
    }
    assert!(err(&["--feature-gates=NoSuchGate=true"]).contains("unrecognized feature gate"));
}

#[test]
fn validation_errors_name_the_flag() {
    for (flags, flag) in [
        (
            &["--http-endpoint=:8080", "--metrics-address=:8081"][..],
            "--metrics-address",
        ),
        (
            &["--volume-name-uuid-length=33"],
            "--volume-name-uuid-length",
        ),
        (
            &["--volume-name-uuid-length=-2"],
            "--volume-name-uuid-length",
        ),
        (
            &["--volume-name-uuid-length=0"],
            "--volume-name-uuid-length",
        ),
        (&["--volume-name-prefix="], "--volume-name-prefix"),
        (&["--worker-threads=0"], "--worker-threads"),
        (
            &["--cloning-protection-threads=0"],
            "--cloning-protection-threads",
        ),
        (
            &["--enable-capacity", "--capacity-threads=0"],
            "--capacity-threads",
        ),
        (
            &["--enable-capacity", "--capacity-poll-interval=0"],
            "--capacity-poll-interval",
        ),
        (&["--timeout=0"], "--timeout"),
        (&["--retry-interval-start=10m"], "--retry-interval-start"),
        (&["--retry-interval-start=0s"], "--retry-interval-start"),
        (
            &["--node-deployment-base-delay=2m"],
            "--node-deployment-base-delay",
        ),
        (&["--kube-api-qps=NaN"], "--kube-api-qps"),
        (&["--kube-api-burst=-1"], "--kube-api-burst"),
        (&["--metrics-path=metrics"], "--metrics-path"),
        (&["--http-endpoint=localhost"], "--http-endpoint"),
        (
            &[
                "--leader-election",
                "--metrics-path=/healthz/leader-election",
            ],
            "--metrics-path",
        ),
        (
            &["--leader-election", "--leader-election-lease-duration=10s"],
            "--leader-election-lease-duration",
        ),
        (
            &["--leader-election", "--leader-election-retry-period=9s"],
            "--leader-election-renew-deadline",
        ),
        (
            &["--leader-election", "--leader-election-retry-period=500ms"],
            "--leader-election-retry-period",
        ),
    ] {
        let a = ok(flags);
        match a.validate() {
            Ok(()) => panic!("{flags:?} validated"),
            Err(e) => assert!(e.to_string().contains(flag), "{flags:?}: {e}"),
        }
    }
    assert_eq!(
        ok(&["--http-endpoint=:8080", "--metrics-address=:8081"]).validate(),
        Err(ConfigError::EndpointConflict)
    );
    // Bounds are inclusive; 0 (no digit of the UID) is not among them.
    assert_eq!(ok(&["--volume-name-uuid-length=32"]).validate(), Ok(()));
    assert_eq!(ok(&["--volume-name-uuid-length=1"]).validate(), Ok(()));
    // Leader-election timing is only checked when leader election is on.
    assert_eq!(
        ok(&["--leader-election-lease-duration=1s"]).validate(),
        Ok(())
    );
}

#[test]
fn go_durations() {
    let ms = Duration::from_millis;
    for (s, d) in [
        ("0", Duration::ZERO),
        ("-0", Duration::ZERO),
        ("-0s", Duration::ZERO),
        ("+5s", secs(5)),
        ("10s", secs(10)),
        ("5m", secs(300)),
        ("1m30s", secs(90)),
        ("500ms", ms(500)),
        ("1.5h", secs(5400)),
        ("2h45m", secs(9900)),
        (".5s", ms(500)),
        ("1.s", secs(1)),
        ("3us", Duration::from_micros(3)),
        ("3µs", Duration::from_micros(3)),
        ("7ns", Duration::from_nanos(7)),
        ("1.0000000001s", Duration::from_nanos(1_000_000_000)),
    ] {
        assert_eq!(parse_go_duration(s), Ok(d), "{s}");
    }
    for s in [
        "",
        "s",
        "10",
        "1x",
        ".s",
        "1h-5m",
        "-1s",
        "1..5s",
        "9999999999h",
    ] {
        assert!(parse_go_duration(s).is_err(), "{s}");
    }
}

#[test]
fn feature_gate_resolution() {
    let a = ok(&[
        "--feature-gates=Topology=false",
        "--feature-gates= ReleaseLeaderElectionOnExit = true ,LoggingBetaOptions=false",
        "--feature-gates=AllAlpha=true,CrossNamespaceVolumeDataSource=false",
    ]);
    let g = a.feature_gates();
    assert!(!g.enabled(Gate::Topology));
    assert!(g.enabled(Gate::ReleaseLeaderElectionOnExit));
    // Explicit beats AllAlpha regardless of order.
    assert!(!g.enabled(Gate::CrossNamespaceVolumeDataSource));
    assert!(g.is_explicit(Gate::Topology));
    assert!(!g.is_explicit(Gate::VolumeAttributesClass));
    assert!(ok(&["--feature-gates="]).feature_gates() == FeatureGates::default());
}

#[test]
fn labels_accumulate_and_later_keys_win() {
    let a = ok(&[
        "--leader-election-labels=a:1,b:2",
        "--leader-election-labels=b:3",
    ]);
    assert_eq!(
        a.leader.labels(),
        BTreeMap::from([("a".into(), "1".into()), ("b".into(), "3".into())])
    );
    assert!(parse_label_list("").is_err());
}

#[test]
fn metadata_allow_lists_accumulate_and_default_to_nothing() {
    let a = ok(&[
        "--copy-claim-labels=team",
        "--copy-claim-labels=app,env-*",
        "--extra-create-metadata-namespace-labels=",
    ]);
    let lists = a.provision.metadata_allow_lists();
    for key in ["team", "app", "env-prod"] {
        assert!(lists.claim_labels.allows(key), "{key}");
    }
    assert!(lists.namespace_labels.is_empty());
    assert_eq!(
        ok(&[]).provision.metadata_allow_lists(),
        csi_provision::MetadataAllowLists::default()
    );
}

#[test]
fn version_line_is_argv0_and_version() {
    assert_eq!(
        version_line("/csi-provisioner"),
        format!("/csi-provisioner {VERSION}")
    );
    assert!(ok(&["--version"]).version);
}
