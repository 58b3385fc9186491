//! Kubernetes manifests in the tests: render a kustomization (`kubectl kustomize`) or read a
//! YAML file, move the objects into a test's namespace, apply them to the test binary's control
//! plane, list the permissions their roles grant, and give a process the credentials of their
//! ServiceAccount. tests/rbac.rs holds deploy/ to what the sidecar sends; tests/upgrade.rs
//! deploys a driver with upstream's manifests and switches it to this sidecar.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::{Client, ResourceExt};
use serde_json::Value;

use super::peers::TIMEOUT;

/// (API group, resource, verb) as RBAC sees a request.
pub type Permission = (String, String, String);

pub fn permission(group: &str, resource: &str, verb: &str) -> Permission {
    (group.to_owned(), resource.to_owned(), verb.to_owned())
}

/// kubectl from the control-plane build (the same directory the testbed uses).
pub fn kubectl() -> PathBuf {
    if let Some(dir) = std::env::var_os(csi_testbed::BIN_DIR_ENV) {
        return PathBuf::from(dir).join("kubectl");
    }
    match csi_testbed::workspace::run_build_script("build-control-plane.sh") {
        Ok(dir) => dir.join("kubectl"),
        Err(e) => panic!("{e}"),
    }
}

/// Every object `kubectl kustomize` renders of `dir` (deploy/ or an overlay in it).
pub fn render(dir: &Path) -> Vec<Value> {
    let output = Command::new(kubectl())
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("running kubectl kustomize");
    assert!(
        output.status.success(),
        "kubectl kustomize {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("kustomize prints UTF-8");
    parse(&text, &dir.display().to_string())
}

/// Every object of the YAML file at `path` (a manifest applied as it is, `kubectl apply -f`).
pub fn read(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    parse(&text, &path.display().to_string())
}

/// The objects of a multi-document YAML text (`origin` names it in a failure), without the
/// empty documents a leading `---` makes.
fn parse(text: &str, origin: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap_or_else(|e| panic!("{origin} is not YAML documents: {e}"))
        .into_iter()
        .filter(|object| !object.is_null())
        .collect()
}

pub fn kind(object: &Value) -> &str {
    object["kind"].as_str().unwrap_or_default()
}

/// Moves the rendered objects into namespace `ns`, so tests can run side by side: namespaced
/// objects get `ns`, cluster-scoped ones a `<ns>-` name prefix (and the references to them
/// follow), ServiceAccount subjects point into `ns`. The Namespace object becomes `ns` itself
/// (its labels are applied to the test namespace); the CRD is shared as it is (its name is fixed
/// by its group and plural).
pub fn adapt(objects: &[Value], ns: &str) -> Vec<Value> {
    let cluster_scoped = [
        "ClusterRole",
        "ClusterRoleBinding",
        "StorageClass",
        "CSIDriver",
    ];
    objects
        .iter()
        .cloned()
        .map(|mut object| {
            let prefixed =
                |name: &Value| Value::from(format!("{ns}-{}", name.as_str().unwrap_or_default()));
            match kind(&object) {
                "CustomResourceDefinition" => return object,
                "Namespace" => {
                    object["metadata"]["name"] = Value::from(ns);
                    return object;
                }
                _ => {}
            }
            if cluster_scoped.contains(&kind(&object)) {
                object["metadata"]["name"] = prefixed(&object["metadata"]["name"]);
            } else {
                object["metadata"]["namespace"] = Value::from(ns);
            }
            if object["roleRef"]["kind"] == "ClusterRole" {
                object["roleRef"]["name"] = prefixed(&object["roleRef"]["name"]);
            }
            if let Some(subjects) = object.get_mut("subjects").and_then(Value::as_array_mut) {
                for subject in subjects
                    .iter_mut()
                    .filter(|s| s["kind"] == "ServiceAccount")
                {
                    subject["namespace"] = Value::from(ns);
                }
            }
            object
        })
        .collect()
}

/// Every (group, resource, verb) the roles grant.
pub fn granted(objects: &[Value]) -> BTreeSet<Permission> {
    let strings = |value: &Value| -> Vec<String> {
        value
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|item| item.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut permissions = BTreeSet::new();
    for object in objects
        .iter()
        .filter(|o| ["ClusterRole", "Role"].contains(&kind(o)))
    {
        for rule in object["rules"].as_array().into_iter().flatten() {
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    for verb in strings(&rule["verbs"]) {
                        permissions.insert((group.clone(), resource.clone(), verb));
                    }
                }
            }
        }
    }
    permissions
}

/// Server-side applies every object with strict field validation as `manager`: the kinds in
/// `for_real` for real (waiting until a CRD serves), the rest as a dry run, so the API server
/// checks them against its schemas without running anything. A Deployment's or DaemonSet's pod
/// is also dry-run created, so Pod Security admission judges it under the namespace's
/// enforcement.
pub async fn apply(client: &Client, objects: &[Value], for_real: &[&str], manager: &str) {
    for object in objects {
        let dynamic: DynamicObject =
            serde_json::from_value(object.clone()).expect("a rendered object is a k8s object");
        let types = dynamic
            .types
            .clone()
            .expect("rendered objects carry apiVersion and kind");
        let gvk = GroupVersionKind::try_from(&types).expect("a valid apiVersion");
        let resource = ApiResource::from_gvk(&gvk);
        let api: Api<DynamicObject> = match dynamic.namespace() {
            Some(ns) => Api::namespaced_with(client.clone(), &ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        // Forced: tests/support installs the same CRD at start-up under another manager.
        let mut params = PatchParams::apply(manager).force().validation_strict();
        params.dry_run = !for_real.contains(&types.kind.as_str());
        if let Err(e) = api
            .patch(&dynamic.name_any(), &params, &Patch::Apply(&dynamic))
            .await
        {
            panic!("applying {} {}: {e}", types.kind, dynamic.name_any());
        }
        match types.kind.as_str() {
            "CustomResourceDefinition" => wait_established(client, &dynamic.name_any()).await,
            "Deployment" | "DaemonSet" => dry_run_pod(client, object).await,
            _ => {}
        }
    }
}

/// A pod of the Deployment's or DaemonSet's template, created as a dry run (admission runs,
/// nothing is stored) in the workload's namespace; and, for deploy/'s own workloads, the sidecar
/// container alone (with the pod's security context and the volumes it mounts) in a namespace
/// that enforces the `restricted` Pod Security profile: deploy/'s namespace admits privileged
/// pods for the node plugin, but the sidecar itself must meet `restricted`.
pub async fn dry_run_pod(client: &Client, deployment: &Value) {
    let namespace = deployment["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default();
    let spec = &deployment["spec"]["template"]["spec"];
    dry_run_pod_in(client, namespace, spec.clone(), "a pod of deploy/").await;
    // Only deploy/'s own workloads promise `restricted` (upstream's example, which the upgrade
    // test applies, does not).
    if deployment["metadata"]["labels"]["app.kubernetes.io/part-of"] != "csi-provisioner-rs" {
        return;
    }
    let Some(sidecar) = spec["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == "csi-provisioner"))
    else {
        return;
    };
    let mounted: Vec<&Value> = sidecar["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| &m["name"])
        .collect();
    let mut alone = spec.clone();
    alone["containers"] = Value::Array(vec![sidecar.clone()]);
    // Its ServiceAccount lives in the workload's namespace, not in the restricted one.
    if let Some(fields) = alone.as_object_mut() {
        fields.remove("serviceAccountName");
        fields.remove("automountServiceAccountToken");
    }
    alone["volumes"] = Value::Array(
        spec["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| mounted.contains(&&v["name"]))
            .cloned()
            .collect(),
    );
    let restricted = restricted_namespace(client).await;
    dry_run_pod_in(
        client,
        &restricted,
        alone,
        "the sidecar container of deploy/ under the restricted Pod Security profile",
    )
    .await;
}

async fn dry_run_pod_in(client: &Client, namespace: &str, spec: Value, what: &str) {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "pod-security-check", "namespace": namespace},
        "spec": spec,
    }))
    .expect("the workload's template is a pod spec");
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    if let Err(e) = Api::<Pod>::namespaced(client.clone(), namespace)
        .create(&dry_run, &pod)
        .await
    {
        panic!("{what} is not admitted: {e}");
    }
}

/// A namespace enforcing `restricted`, shared by the tests of a control plane.
async fn restricted_namespace(client: &Client) -> String {
    const NAME: &str = "pod-security-restricted";
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let namespace = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": NAME,
            "labels": {"pod-security.kubernetes.io/enforce": "restricted"},
        },
    }))
    .expect("namespace");
    match namespaces.create(&PostParams::default(), &namespace).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("creating the namespace {NAME}: {e}"),
    }
    NAME.to_owned()
}

pub async fn wait_established(client: &Client, name: &str) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    super::eventually("the CRD to be established", TIMEOUT, || async {
        let crd = crds.get(name).await.map_err(|e| e.to_string())?;
        let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
        conditions
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
            .then_some(())
            .ok_or(format!("{conditions:?}"))
    })
    .await;
}

/// A kubeconfig for the apiserver that authenticates as ServiceAccount `service_account` of
/// namespace `ns` with a bearer token from the TokenRequest API (what the kubelet mounts into a
/// pod, minus the refresh), written into `dir`.
pub async fn service_account_kubeconfig(
    client: &Client,
    ns: &str,
    service_account: &str,
    dir: &Path,
) -> PathBuf {
    let token = Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request(
            service_account,
            &PostParams::default(),
            &TokenRequest::default(),
        )
        .await
        .expect("TokenRequest for the ServiceAccount")
        .status
        .expect("a TokenRequest answer has a status")
        .token;
    let control_plane = super::control_plane();
    let admin = kube::config::Kubeconfig::read_from(control_plane.kubeconfig_path())
        .expect("reading the admin kubeconfig");
    let ca = admin.clusters[0]
        .cluster
        .as_ref()
        .and_then(|cluster| cluster.certificate_authority.clone())
        .expect("the admin kubeconfig names the serving CA");
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {
            "server": control_plane.apiserver_url(),
            "certificate-authority": ca,
        }}],
        "users": [{"name": service_account, "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": service_account}}],
        "current-context": "test",
    });
    let path = dir.join("service-account.kubeconfig");
    std::fs::write(&path, kubeconfig.to_string()).expect("writing the kubeconfig");
    path
}
