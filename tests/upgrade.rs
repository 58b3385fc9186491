//! Upgrading a driver from upstream external-provisioner v6.3.0 to this sidecar, exactly as
//! docs/deploy.md ("Upgrade from upstream") tells an operator, on the real control plane.
//!
//! The driver starts out deployed with upstream's manifests: upstream's own RBAC example
//! (deploy/kubernetes/rbac.yaml, read from upstream's source tree, hack/upstream-source.sh) and
//! the reference driver's Deployment with upstream's image (tests/fixtures/upstream-v6.3.0/).
//! Both are moved into the test's namespace as an operator moves them into theirs (the same
//! `adapt` for every file, support::manifests). A "pod" of the Deployment is the sidecar
//! container as a process: the binary of its image (upstream's, built by
//! hack/build-upstream-provisioner.sh, or ours), its args with `$(VAR)` expanded from its env,
//! and a token of its ServiceAccount. Only the socket, the metrics port, the hostname (the
//! leader-election identity, a pod name) and POD_NAMESPACE (standing in for the
//! service-account namespace file the kubelet mounts, which both sidecars fall back to) are the
//! test's own.
//!
//! The documented steps are [`STEPS`]; `the_documented_steps_are_the_tests` holds the doc to
//! them, and [`perform`] runs each.

use csi_test_support as support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, PersistentVolumeClaim};
use kube::Client;
use kube::api::Api;
use nix::sys::signal::Signal;
use serde_json::Value;

use support::cluster::{
    Cluster, create_class, driver_pvs, journal_operations, lease_holder, pv_name, storage_class,
    wait_bound,
};
use support::manifests::{
    Permission, adapt, apply, granted, kubectl, permission, read, render,
    service_account_kubeconfig,
};
use support::peers::{Driver, Sidecar, SidecarOptions, TIMEOUT, describe};

/// The work tree under test (found at run time: `csi_testbed::workspace::root`).
fn root() -> PathBuf {
    csi_testbed::workspace::root()
}
/// The reference driver's Deployment with upstream's image and args.
const UPSTREAM_DEPLOYMENT: &str = "tests/fixtures/upstream-v6.3.0/deployment.yaml";
/// Upstream's RBAC example, inside upstream's source tree.
const UPSTREAM_RBAC: &str = "deploy/kubernetes/rbac.yaml";
const UPSTREAM_IMAGE: &str = "registry.k8s.io/sig-storage/csi-provisioner:v6.3.0";
/// The image deploy/base names (docs/deploy.md, "Build the image").
const OUR_IMAGE: &str = "csi-provisioner-rs:0.1.0";
/// The ServiceAccount of upstream's example, which the Deployment runs as.
const SERVICE_ACCOUNT: &str = "csi-provisioner";
/// The sidecar's container in the Deployment.
const SIDECAR_CONTAINER: &str = "csi-provisioner";

/// The steps of docs/deploy.md, "Upgrade from upstream", in its words, with upstream's example
/// namespace (`default`), which [`perform`] replaces by the test's.
const STEPS: [&str; 3] = [
    "kubectl apply -f deploy/base/crd.yaml",
    "kubectl apply -f deploy/upgrade/rbac.yaml",
    "kubectl -n default set image deployment/csi-provisioner csi-provisioner=csi-provisioner-rs:0.1.0",
];

/// Every CreateVolume takes 5 s, creates the volume and answers DEADLINE_EXCEEDED: a backend
/// slower than the sidecar's patience, so upstream keeps each claim in flight, retrying, with
/// its volume on the backend and no PV.
const SLOW_BACKEND: &str = "delay CreateVolume=5s\nfault CreateVolume=after:deadline-exceeded\n";
/// The last claim's CreateVolume must still be running when upstream stops, which comes after a
/// `kubectl set image` and a new pod: long enough for a loaded machine, short enough for the
/// volume to be made (and found by ours) within the test's waits.
const SLOWER_BACKEND: &str = "delay CreateVolume=20s\nfault CreateVolume=after:deadline-exceeded\n";

// ---------------------------------------------------------------------------------------------
// The deployment, the steps, the pods.

fn upstream_source() -> PathBuf {
    csi_testbed::workspace::upstream_source()
        .unwrap_or_else(|e| panic!("finding upstream's source tree: {e}"))
}

/// Upstream's RBAC example and the Deployment, in namespace `ns`, as an operator has them.
async fn deploy_upstream(client: &Client, ns: &str) {
    let mut objects = read(&upstream_source().join(UPSTREAM_RBAC));
    objects.extend(read(&root().join(UPSTREAM_DEPLOYMENT)));
    apply_for_real(client, &adapt(&objects, ns)).await;
}

async fn apply_for_real(client: &Client, objects: &[Value]) {
    let kinds: Vec<&str> = objects
        .iter()
        .filter_map(|object| object["kind"].as_str())
        .collect();
    apply(client, objects, &kinds, "upgrade-test").await;
}

/// Runs one documented step against namespace `ns`: `kubectl apply -f FILE` applies FILE moved
/// into `ns` (as the operator edits it, see deploy/upgrade/rbac.yaml; the CRD is cluster-wide
/// and stays as it is), `kubectl -n default ...` runs with `-n <ns>`.
async fn perform(step: &str, client: &Client, ns: &str) {
    let words: Vec<&str> = step.split_whitespace().collect();
    match words.as_slice() {
        ["kubectl", "apply", "-f", file] => {
            apply_for_real(client, &adapt(&read(&root().join(file)), ns)).await;
        }
        ["kubectl", "-n", "default", rest @ ..] => {
            let kubeconfig = support::control_plane().kubeconfig_path();
            let output = Command::new(kubectl())
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .args(["-n", ns])
                .args(rest)
                .output()
                .expect("running kubectl");
            assert!(
                output.status.success(),
                "{step}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        _ => panic!("a documented step this test cannot run: {step}"),
    }
}

/// The sidecar container of the Deployment as the API server holds it now.
async fn sidecar_container(client: &Client, ns: &str) -> Container {
    let deployment = Api::<Deployment>::namespaced(client.clone(), ns)
        .get("csi-provisioner")
        .await
        .expect("reading the Deployment");
    deployment
        .spec
        .and_then(|spec| spec.template.spec)
        .into_iter()
        .flat_map(|pod| pod.containers)
        .find(|container| container.name == SIDECAR_CONTAINER)
        .expect("the Deployment has a csi-provisioner container")
}

/// The container's args as the kubelet passes them (`$(NAME)` expanded from its env), less the
/// socket and the metrics port, which are the test's own.
fn pod_args(container: &Container) -> Vec<String> {
    let env: Vec<(String, String)> = container
        .env
        .iter()
        .flatten()
        .filter_map(|var| Some((format!("$({})", var.name), var.value.clone()?)))
        .collect();
    container
        .args
        .iter()
        .flatten()
        .map(|arg| {
            env.iter()
                .fold(arg.clone(), |arg, (name, value)| arg.replace(name, value))
        })
        .filter(|arg| !arg.starts_with("--csi-address") && !arg.starts_with("--http-endpoint"))
        .collect()
}

/// A pod named `pod` running `container` (of the Deployment's template): the binary of its image
/// with its args and `extra`, as the ServiceAccount (`kubeconfig`).
fn start_container(
    container: &Container,
    ns: &str,
    driver: &Driver,
    kubeconfig: &Path,
    pod: &str,
    extra: &[&str],
) -> Sidecar {
    let mut args = pod_args(container);
    args.push(format!("--kubeconfig={}", kubeconfig.display()));
    args.extend(extra.iter().map(|arg| (*arg).to_owned()));
    let options = SidecarOptions {
        args,
        metrics: true,
        hostname: Some(pod.to_owned()),
        env: vec![("POD_NAMESPACE", ns.to_owned())],
    };
    match container.image.as_deref() {
        Some(UPSTREAM_IMAGE) => Sidecar::start_upstream(driver, options),
        Some(OUR_IMAGE) => Sidecar::start_with(driver, options),
        other => panic!("no binary for image {other:?}"),
    }
}

/// A driver deployed with upstream's manifests and a class of the driver.
struct UpstreamDeployment {
    cluster: Cluster,
    driver: Driver,
    kubeconfig: PathBuf,
    class: String,
    _dir: tempfile::TempDir,
}

impl UpstreamDeployment {
    /// The deployment and upstream's sidecar running as its pod `old-0`.
    async fn start(prefix: &str) -> (UpstreamDeployment, Sidecar) {
        let cluster = Cluster::new(prefix).await;
        let ns = cluster.ns().to_owned();
        deploy_upstream(&cluster.client, &ns).await;
        let dir = tempfile::Builder::new()
            .prefix("csi-upgrade-")
            .tempdir()
            .expect("creating a temp dir");
        let kubeconfig =
            service_account_kubeconfig(&cluster.client, &ns, SERVICE_ACCOUNT, dir.path()).await;
        let driver = Driver::start(&[]).await;
        let class = format!("{ns}-class");
        create_class(
            &cluster.client,
            &storage_class(&class, &driver, "Delete", &[]),
        )
        .await;
        let deployment = UpstreamDeployment {
            cluster,
            driver,
            kubeconfig,
            class,
            _dir: dir,
        };
        let upstream = deployment.start_pod("old-0").await;
        (deployment, upstream)
    }

    /// A pod of the Deployment's current template.
    async fn start_pod(&self, pod: &str) -> Sidecar {
        let container = self.sidecar_container().await;
        self.start_container(&container, pod, &[])
    }

    /// The sidecar container of the Deployment's current template.
    async fn sidecar_container(&self) -> Container {
        sidecar_container(&self.cluster.client, self.cluster.ns()).await
    }

    /// A pod running `container` with `extra` args.
    fn start_container(&self, container: &Container, pod: &str, extra: &[&str]) -> Sidecar {
        start_container(
            container,
            self.cluster.ns(),
            &self.driver,
            &self.kubeconfig,
            pod,
            extra,
        )
    }

    async fn perform(&self, step: &str) {
        perform(step, &self.cluster.client, self.cluster.ns()).await;
    }

    /// The name of the volume the sidecars give claim `name` (`pvc-<uid>`).
    async fn volume_of(&self, name: &str) -> String {
        let claim = self
            .cluster
            .get_claim(name)
            .await
            .unwrap_or_else(|| panic!("claim {name} is gone"));
        pv_name(&claim)
    }
}

/// Fails at once (rather than at a wait's timeout) when the API server refused a request.
fn assert_not_refused(sidecar: &Sidecar) {
    let log = sidecar.log();
    let refused: Vec<&str> = log.lines().filter(|l| l.contains("forbidden")).collect();
    assert!(
        refused.is_empty(),
        "the API server refused the sidecar a request:\n{}",
        refused.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// Tests.

/// Upstream provisions two claims; then the backend slows down and four more claims are in
/// flight (each volume created, no PV), a fifth with its CreateVolume still running. The CRD
/// and the extra RBAC are applied while upstream runs, then the image is switched: the rollout
/// starts a pod of the new template (ours, a standby while upstream leads) and SIGTERMs the old
/// one. A claim asking for provisioning consistency (a claim patch: the extra RBAC) comes while
/// the Lease changes hands, and an old pod restarting mid-rollout stays a standby beside our
/// leader. Every claim ends Bound to the one volume made for it, the driver
/// holds exactly the PVs' volumes, the journal empties, nothing is refused, and deleting the
/// claims deletes every PV and volume, upstream's included.
#[tokio::test]
async fn an_upgrade_from_upstream_with_claims_in_flight_loses_nothing() {
    let (deployment, mut upstream) = UpstreamDeployment::start("upgrade").await;
    let (cluster, driver) = (&deployment.cluster, &deployment.driver);
    let class = deployment.class.as_str();

    let mut names = cluster.claims_named("before", class, 2).await;
    for name in &names {
        wait_bound(&cluster.claims, name).await;
    }

    driver.set_faults(SLOW_BACKEND);
    let in_flight = cluster.claims_named("flight", class, 4).await;
    for name in &in_flight {
        driver.wait_holds(&deployment.volume_of(name).await).await;
    }
    names.extend(in_flight);
    deployment.perform(STEPS[0]).await;
    deployment.perform(STEPS[1]).await;
    driver.set_faults(SLOWER_BACKEND);
    cluster.claim("last", class).await;
    names.push("last".to_owned());
    let last = deployment.volume_of("last").await;
    driver.wait_create_received(&last).await;

    let old_container = deployment.sidecar_container().await;
    deployment.perform(STEPS[2]).await;
    let mut ours = deployment.start_pod("new-0").await;
    assert!(
        !driver.volumes().iter().any(|volume| volume.name == last),
        "the last claim's CreateVolume finished before upstream stopped"
    );
    upstream.signal(Signal::SIGTERM);
    // Upstream has no SIGTERM handler: it dies of the signal and leaves its Lease to expire.
    let status = upstream.wait_exit(TIMEOUT).await;
    eprintln!("upstream ended with {}", describe(status));
    // The backend answers in time again.
    driver.clear_faults();
    cluster.consistent_claim("gap", class, "enable").await;
    names.push("gap".to_owned());

    support::eventually("the new pod to hold upstream's Lease", TIMEOUT, || async {
        assert_not_refused(&ours);
        let holder = lease_holder(&cluster.client, cluster.ns(), driver).await?;
        (holder == "new-0").then_some(()).ok_or(holder)
    })
    .await;
    // An old pod's container restarting mid-rollout (a liveness probe, an OOM kill): upstream
    // as a standby beside our leader, with client-go's leader-election log (-v=4).
    let mut restarted = deployment.start_container(&old_container, "old-1", &["-v=4"]);
    for name in &names {
        let claim = wait_bound(&cluster.claims, name).await;
        assert_bound_to_its_own_volume(&claim);
    }
    support::eventually(
        "one volume per claim, each referenced by a PV",
        TIMEOUT,
        || async {
            assert_not_refused(&ours);
            let handles: BTreeSet<String> = driver_pvs(&cluster.client, driver)
                .await?
                .into_iter()
                .filter_map(|pv| Some(pv.spec?.csi?.volume_handle))
                .collect();
            let volumes: BTreeSet<String> = driver.volumes().into_iter().map(|v| v.id).collect();
            (handles == volumes && volumes.len() == names.len())
                .then_some(())
                .ok_or(format!(
                    "driver volumes {volumes:?}, PV handles {handles:?}, {} claims",
                    names.len()
                ))
        },
    )
    .await;
    support::eventually("an empty journal", TIMEOUT, || async {
        let left = journal_operations(&cluster.client, cluster.ns(), driver).await?;
        left.is_empty().then_some(()).ok_or(format!("{left:?}"))
    })
    .await;

    for name in &names {
        cluster.delete_claim(name).await;
    }
    support::eventually("every PV and volume deleted", TIMEOUT, || async {
        assert_not_refused(&ours);
        let pvs = driver_pvs(&cluster.client, driver).await?.len();
        let volumes = driver.volume_count();
        (pvs == 0 && volumes == 0)
            .then_some(())
            .ok_or(format!("{pvs} PVs, {volumes} volumes"))
    })
    .await;

    upstream_stays_standby(&mut restarted).await;
    restarted.signal(Signal::SIGTERM);
    restarted.wait_exit(TIMEOUT).await;

    ours.signal(Signal::SIGTERM);
    let status = ours.wait_exit(TIMEOUT).await;
    assert!(
        status.success(),
        "our sidecar ended with {}",
        describe(status)
    );
    assert_not_refused(&ours);
}

/// Upstream's standby reads the Lease our leader renews as held, for longer than the lease
/// duration (15 s; client-go tries every 5 to 10 s and logs each refusal at -v=4), and never
/// takes it: the two sidecars agree on who leads while the rollout mixes them.
async fn upstream_stays_standby(upstream: &mut Sidecar) {
    support::eventually(
        "upstream's standby to see our Lease held past a lease duration",
        TIMEOUT,
        || async {
            let log = upstream.log();
            assert!(
                !log.to_lowercase().contains("successfully acquired lease"),
                "upstream took the Lease from our leader:\n{log}"
            );
            let refused = log
                .lines()
                .filter(|line| line.contains("has not yet expired"))
                .filter(|line| line.contains(r#"holder="new-0""#))
                .count();
            (refused >= 5).then_some(()).ok_or(format!(
                "{refused} attempts refused, the Lease held by new-0"
            ))
        },
    )
    .await;
    upstream.assert_running();
}

/// The claim is bound to the PV named after it, and that PV to the claim (by UID).
fn assert_bound_to_its_own_volume(claim: &PersistentVolumeClaim) {
    let expected = pv_name(claim);
    let bound = claim
        .spec
        .as_ref()
        .and_then(|spec| spec.volume_name.as_deref());
    assert_eq!(
        bound,
        Some(expected.as_str()),
        "claim {:?}",
        claim.metadata.name
    );
}

/// The image switched without the CRD and RBAC steps: our sidecar, with only what upstream's
/// example grants, exits at start-up with a message naming what it may not do and where, and
/// never calls CreateVolume for the claim waiting meanwhile. (The journal CRD is installed in
/// every test cluster, so what is missing here is the RBAC.)
#[tokio::test]
async fn with_only_upstreams_rbac_our_sidecar_exits_naming_what_is_missing() {
    let (deployment, mut upstream) = UpstreamDeployment::start("upgrade-rbac-only").await;
    let (cluster, driver) = (&deployment.cluster, &deployment.driver);
    upstream.signal(Signal::SIGTERM);
    upstream.wait_exit(TIMEOUT).await;
    cluster.claim("waiting", &deployment.class).await;

    deployment.perform(STEPS[2]).await;
    let mut ours = deployment.start_pod("new-0").await;
    let status = ours.wait_exit(TIMEOUT).await;
    let log = ours.log();
    assert_eq!(
        status.code(),
        Some(1),
        "our sidecar with upstream's RBAC alone ended with {}",
        describe(status)
    );
    let ns = cluster.ns();
    for needed in [
        "provisioningjournals",
        ns,
        "forbidden",
        "deploy/upgrade/rbac.yaml",
    ] {
        assert!(
            log.contains(needed),
            "the exit message lacks {needed:?}:\n{log}"
        );
    }
    assert!(
        driver.requests("CreateVolume").is_empty(),
        "CreateVolume sent without a journal"
    );
}

/// deploy/upgrade/rbac.yaml grants exactly what deploy/base/ grants and upstream's example does
/// not, less the rules upstream's example leaves commented out for the drivers that need them
/// (which ours needs under the same conditions), and less the rules only flags of ours need (a
/// deployment upgraded from upstream sets none of them).
#[test]
fn the_upgrade_rbac_is_what_upstreams_example_lacks() {
    let commented_out_upstream: BTreeSet<Permission> = [
        permission("", "secrets", "get"),
        permission("gateway.networking.k8s.io", "referencegrants", "list"),
        permission("gateway.networking.k8s.io", "referencegrants", "watch"),
        // --extra-create-metadata-namespace-labels/-annotations (upstream's PR #1531, unreleased).
        permission("", "namespaces", "get"),
        // --audit-volumes-interval's report ConfigMap (ours).
        permission("", "configmaps", "create"),
        permission("", "configmaps", "patch"),
    ]
    .into();
    let ours = granted(&render(&root().join("deploy/base")));
    let upstream = granted(&read(&upstream_source().join(UPSTREAM_RBAC)));
    let lacking: BTreeSet<Permission> = ours
        .difference(&upstream)
        .filter(|p| !commented_out_upstream.contains(*p))
        .cloned()
        .collect();
    let extra = granted(&read(&root().join("deploy/upgrade/rbac.yaml")));
    assert_eq!(extra, lacking);
}

/// The steps docs/deploy.md gives are [`STEPS`], in order, and nothing else.
#[test]
fn the_documented_steps_are_the_tests() {
    let doc =
        std::fs::read_to_string(root().join("docs/deploy.md")).expect("reading docs/deploy.md");
    let section = doc
        .split("### Upgrade from upstream")
        .nth(1)
        .and_then(|rest| rest.split("\n#").next())
        .expect("docs/deploy.md has a section \"Upgrade from upstream\"");
    let commands: Vec<&str> = section
        .split("```")
        .skip(1)
        .step_by(2)
        .flat_map(|block| block.lines().skip(1))
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .collect();
    assert_eq!(commands, STEPS);
}
