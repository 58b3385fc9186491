//! The Kubernetes volume snapshot machinery as real peers of a [`ControlPlane`]: the CRDs it
//! serves (VolumeSnapshot, VolumeSnapshotContent, VolumeSnapshotClass, and Gateway API's
//! ReferenceGrant), the common `snapshot-controller`, and one `csi-snapshotter` per CSI driver.
//! `hack/build-snapshotter.sh` builds them ([`crate::workspace::snapshotter`]); see
//! docs/control-plane.md.
//!
//! Each program runs under a [`Supervisor`] of its own, like the control plane's components:
//! started through `setpriv --pdeathsig KILL`, killed when its handle is dropped, and by the
//! reaper when this process dies.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;

use crate::error::{Component, Error};
use crate::process::{self, Supervisor};
use crate::{ControlPlane, args};

/// Our field manager for server-side apply of the CRDs.
const FIELD_MANAGER: &str = "csi-testbed";
/// Establishing a CRD and serving its resource takes a few seconds on 2 shared cores.
const CRD_SERVED_TIMEOUT: Duration = Duration::from_secs(60);
const CRD_POLL: Duration = Duration::from_millis(200);
const FAILURE_LOG_LINES: usize = 30;

/// What `hack/build-snapshotter.sh` built: a directory with `snapshot-controller`,
/// `csi-snapshotter` and `crds/*.yaml`.
#[derive(Clone, Debug)]
pub struct SnapshotBinaries {
    dir: PathBuf,
}

impl SnapshotBinaries {
    pub fn at(dir: &Path) -> Self {
        SnapshotBinaries {
            dir: dir.to_owned(),
        }
    }

    fn program(&self, component: Component) -> PathBuf {
        self.dir.join(component.binary())
    }

    /// Every CRD file the build collected, in name order.
    pub fn crd_files(&self) -> Result<Vec<PathBuf>, Error> {
        let dir = self.dir.join("crds");
        let read_err = |source| Error::ReadCrd {
            path: dir.clone(),
            source,
        };
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(read_err)? {
            let path = entry.map_err(read_err)?.path();
            if path.extension().is_some_and(|ext| ext == "yaml") {
                files.push(path);
            }
        }
        files.sort();
        Ok(files)
    }
}

/// Applies the CRDs of `files` (server-side, so installing them twice is harmless) and waits
/// until each is Established and every version it serves answers a list.
pub async fn install_crds(cp: &ControlPlane, files: &[PathBuf]) -> Result<(), Error> {
    let client = cp.client().await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut applied = Vec::new();
    for path in files {
        let crd = read_crd(path)?;
        let name = crd.metadata.name.clone().unwrap_or_default();
        crds.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&crd),
        )
        .await
        .map_err(|source| Error::ApplyCrd {
            name: name.clone(),
            source,
        })?;
        applied.push(crd);
    }
    for crd in &applied {
        wait_served(&client, &crds, crd).await?;
    }
    Ok(())
}

/// One CRD of a YAML file (which may open with `---`), without a status.
fn read_crd(path: &Path) -> Result<CustomResourceDefinition, Error> {
    let parse_err = |reason: String| Error::ParseCrd {
        path: path.to_owned(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|source| Error::ReadCrd {
        path: path.to_owned(),
        source,
    })?;
    let documents: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text).map_err(|e| parse_err(e.to_string()))?;
    let mut crds = documents.into_iter().filter(|doc| !doc.is_null());
    let (Some(document), None) = (crds.next(), crds.next()) else {
        return Err(parse_err("expected exactly one YAML document".to_owned()));
    };
    let mut crd: CustomResourceDefinition =
        serde_json::from_value(document).map_err(|e| parse_err(e.to_string()))?;
    // The file's status (empty accepted names) is the apiserver's to write.
    crd.status = None;
    Ok(crd)
}

async fn wait_served(
    client: &kube::Client,
    crds: &Api<CustomResourceDefinition>,
    crd: &CustomResourceDefinition,
) -> Result<(), Error> {
    let name = crd.metadata.name.clone().unwrap_or_default();
    let started = Instant::now();
    loop {
        let last_error = match served_check(client, crds, crd, &name).await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if started.elapsed() > CRD_SERVED_TIMEOUT {
            return Err(Error::CrdNotServed {
                name,
                waited: started.elapsed(),
                last_error,
            });
        }
        tokio::time::sleep(CRD_POLL).await;
    }
}

/// `Err` says what is not there yet.
async fn served_check(
    client: &kube::Client,
    crds: &Api<CustomResourceDefinition>,
    crd: &CustomResourceDefinition,
    name: &str,
) -> Result<(), String> {
    let current = crds.get(name).await.map_err(|e| e.to_string())?;
    let established = current
        .status
        .and_then(|status| status.conditions)
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        });
    if !established {
        return Err("not Established".to_owned());
    }
    let spec = &crd.spec;
    for version in spec.versions.iter().filter(|v| v.served) {
        let gvk = GroupVersionKind::gvk(&spec.group, &version.name, &spec.names.kind);
        let resource = ApiResource::from_gvk_with_plural(&gvk, &spec.names.plural);
        Api::<DynamicObject>::all_with(client.clone(), &resource)
            .list(&ListParams::default().limit(1))
            .await
            .map_err(|e| format!("listing {}/{}: {e}", spec.names.plural, version.name))?;
    }
    Ok(())
}

/// Volume snapshots served on `cp`: the CRDs of `binaries` installed, then the common
/// snapshot-controller started (dropping the peer stops it). Drivers bring their own
/// csi-snapshotter ([`SnapshotPeer::start_csi_snapshotter`]).
pub async fn serve(cp: &ControlPlane, binaries: &SnapshotBinaries) -> Result<SnapshotPeer, Error> {
    install_crds(cp, &binaries.crd_files()?).await?;
    SnapshotPeer::start_controller(cp, binaries)
}

/// One snapshot program running against a control plane; dropping it stops the process.
pub struct SnapshotPeer {
    component: Component,
    log: PathBuf,
    supervisor: Supervisor,
}

impl SnapshotPeer {
    /// The common snapshot controller (one per control plane; the CRDs must be installed first:
    /// it exits when they are not served within 30 s). Logs to `snapshot-controller.log` in the
    /// control plane's log directory.
    pub fn start_controller(cp: &ControlPlane, binaries: &SnapshotBinaries) -> Result<Self, Error> {
        let log = cp.dir().join("logs").join("snapshot-controller.log");
        Self::start(
            Component::SnapshotController,
            binaries,
            &args::snapshot_controller(cp.kubeconfig_path()),
            log,
        )
    }

    /// The snapshot sidecar of the CSI driver on `csi_socket` (one per driver). Logs to
    /// `csi-snapshotter-<driver_name>.log` in the control plane's log directory.
    pub fn start_csi_snapshotter(
        cp: &ControlPlane,
        binaries: &SnapshotBinaries,
        driver_name: &str,
        csi_socket: &Path,
    ) -> Result<Self, Error> {
        let log = cp
            .dir()
            .join("logs")
            .join(format!("csi-snapshotter-{driver_name}.log"));
        Self::start(
            Component::CsiSnapshotter,
            binaries,
            &args::csi_snapshotter(cp.kubeconfig_path(), csi_socket),
            log,
        )
    }

    fn start(
        component: Component,
        binaries: &SnapshotBinaries,
        args: &[String],
        log: PathBuf,
    ) -> Result<Self, Error> {
        // The control plane's own reaper removes the directory; this one only kills.
        let log_dir = log.parent().unwrap_or(&log);
        let mut supervisor = Supervisor::new(log_dir, true)?;
        supervisor.spawn(component, &binaries.program(component), args, &log)?;
        Ok(SnapshotPeer {
            component,
            log,
            supervisor,
        })
    }

    /// `Err` with the exit status and the tail of the log once the process has exited: neither
    /// program exits on its own while its control plane and driver are up.
    pub fn check_running(&mut self) -> Result<(), Error> {
        match self.supervisor.exit_status(self.component) {
            None => Ok(()),
            Some(status) => Err(Error::Stopped {
                component: self.component,
                status: status.to_string(),
                log: self.log.clone(),
                log_tail: process::log_tail(&self.log, FAILURE_LOG_LINES),
            }),
        }
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        process::log_tail(&self.log, lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crd_file_with_a_leading_separator_and_a_status_reads_as_one_crd_without_status() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("example.com_widgets.yaml");
        std::fs::write(
            &path,
            "---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n\
             metadata:\n  name: widgets.example.com\nspec:\n  group: example.com\n  names:\n    \
             kind: Widget\n    plural: widgets\n  scope: Namespaced\n  versions:\n  - name: v1\n    \
             served: true\n    storage: true\n    schema:\n      openAPIV3Schema:\n        \
             type: object\nstatus:\n  acceptedNames:\n    kind: \"\"\n    plural: \"\"\n",
        )
        .expect("write");
        let crd = read_crd(&path).expect("one CRD");
        assert_eq!(crd.metadata.name.as_deref(), Some("widgets.example.com"));
        assert_eq!(crd.spec.versions[0].name, "v1");
        assert!(crd.status.is_none());
        assert!(matches!(
            SnapshotBinaries::at(dir.path()).crd_files(),
            Err(Error::ReadCrd { .. })
        ));
    }

    #[test]
    fn two_crds_in_one_file_are_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("two.yaml");
        std::fs::write(&path, "kind: A\n---\nkind: B\n").expect("write");
        let err = read_crd(&path).expect_err("two documents");
        assert!(err.to_string().contains("exactly one"), "{err}");
    }
}
