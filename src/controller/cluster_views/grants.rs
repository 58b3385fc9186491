//! The ReferenceGrant watch of the CrossNamespaceVolumeDataSource gate (gateway-api,
//! `gateway.networking.k8s.io/v1beta1`, all namespaces), and the grants a claim with a data
//! source in another namespace is decided with.
//!
//! Upstream starts no controller before this watch has listed, so without the ReferenceGrant
//! CRD (or without RBAC on it) its provisioner stays idle for ever. Here only the claims that
//! need a grant wait for the list, bounded, and are told why it did not come; every other
//! claim is provisioned as usual.

use std::time::Duration;

use futures::Stream;
use futures::future::{BoxFuture, Shared};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use serde::Deserialize;
use thiserror::Error;

use crate::api::{ReferenceGrant, ReferenceGrantSpec};
use crate::controller::runtime::cache::{InitialList, listed, watch};

/// How long a claim waits for the watch's first list, as for the topology watches.
const LIST_WAIT: Duration = Duration::from_secs(10);

/// The ReferenceGrant watch has not listed: whether the claim may use its source is unknown.
#[derive(Debug, Error)]
#[error(
    "the ReferenceGrant watch has not listed yet, so whether this claim may use its data source in namespace {namespace} is unknown: the ReferenceGrant CRD (gateway.networking.k8s.io/v1beta1) may not be installed, or the sidecar's RBAC may lack list and watch on referencegrants"
)]
pub struct GrantsNotListed {
    pub namespace: String,
}

/// A ReferenceGrant as cached: its identity and its `from` and `to` entries; the rest of its
/// metadata (`managedFields`, the last-applied annotation) is skipped unallocated.
#[derive(Clone, Debug, Deserialize, Resource)]
#[resource(inherit = ReferenceGrant)]
#[serde(from = "WireGrant")]
pub struct CachedGrant {
    pub metadata: ObjectMeta,
    spec: ReferenceGrantSpec,
}

#[derive(Deserialize)]
struct WireGrant {
    metadata: WireMeta,
    #[serde(default)]
    spec: ReferenceGrantSpec,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
}

impl From<WireGrant> for CachedGrant {
    fn from(wire: WireGrant) -> Self {
        let WireMeta {
            name,
            namespace,
            uid,
            resource_version,
        } = wire.metadata;
        CachedGrant {
            metadata: ObjectMeta {
                name,
                namespace,
                uid,
                resource_version,
                ..ObjectMeta::default()
            },
            spec: wire.spec,
        }
    }
}

/// The cached ReferenceGrants and whether their watch has listed once.
#[derive(Clone)]
pub struct GrantCache {
    store: Store<CachedGrant>,
    /// Awaited by every reconcile that needs grants, concurrently (see `cache::listed`).
    listed: Shared<BoxFuture<'static, bool>>,
}

impl GrantCache {
    pub fn new(store: Store<CachedGrant>) -> Self {
        GrantCache {
            listed: listed(&store),
            store,
        }
    }

    /// The grants of `namespace`, once the watch has listed; bounded, so that a watch that can
    /// never list (no CRD, no RBAC) is an event on the claim, not a reconcile that hangs.
    pub async fn in_namespace(
        &self,
        namespace: &str,
    ) -> Result<Vec<ReferenceGrantSpec>, GrantsNotListed> {
        let listed = tokio::time::timeout(LIST_WAIT, self.listed.clone()).await;
        if !listed.unwrap_or(false) {
            return Err(GrantsNotListed {
                namespace: namespace.to_owned(),
            });
        }
        Ok(self
            .store
            .state()
            .iter()
            .filter(|grant| grant.metadata.namespace.as_deref() == Some(namespace))
            .map(|grant| grant.spec.clone())
            .collect())
    }
}

/// Starts watching ReferenceGrants: the cache to read and the stream that fills it (it must
/// be polled).
pub fn watch_grants(
    client: &Client,
    initial_list: InitialList,
) -> (
    GrantCache,
    impl Stream<Item = Result<CachedGrant, watcher::Error>> + Send + 'static,
) {
    let (store, stream) = watch(Api::<CachedGrant>::all(client.clone()), initial_list, None);
    (GrantCache::new(store), stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    fn grant(namespace: &str, from_namespace: &str) -> CachedGrant {
        serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1beta1",
            "kind": "ReferenceGrant",
            "metadata": {
                "name": "g", "namespace": namespace, "uid": "u", "resourceVersion": "1",
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
                "managedFields": [{"manager": "kubectl"}],
            },
            "spec": {
                "from": [{"group": "", "kind": "PersistentVolumeClaim", "namespace": from_namespace}],
                "to": [{"group": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot"}],
            },
        }))
        .expect("a ReferenceGrant")
    }

    #[test]
    fn a_cached_grant_keeps_its_identity_and_entries_only() {
        let cached = grant("src", "apps");
        assert_eq!(cached.metadata.name.as_deref(), Some("g"));
        assert_eq!(cached.metadata.namespace.as_deref(), Some("src"));
        assert!(cached.metadata.annotations.is_none() && cached.metadata.managed_fields.is_none());
        assert_eq!(cached.spec.from[0].namespace, "apps");
        assert_eq!(cached.spec.to[0].kind, "VolumeSnapshot");
        assert_eq!(cached.spec.to[0].name, None);
    }

    #[tokio::test]
    async fn only_the_grants_of_the_namespace_are_given() {
        let (store, mut writer) = kube::runtime::reflector::store();
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitApply(grant("src", "apps")));
        writer.apply_watcher_event(&Event::InitApply(grant("elsewhere", "b")));
        writer.apply_watcher_event(&Event::InitDone);
        let grants = GrantCache::new(store).in_namespace("src").await.unwrap();
        assert_eq!(grants.len(), 1);
        assert_eq!(grants[0].from[0].namespace, "apps");
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_that_never_lists_is_an_error_after_the_wait() {
        let (store, _writer) = kube::runtime::reflector::store::<CachedGrant>();
        let error = GrantCache::new(store)
            .in_namespace("src")
            .await
            .unwrap_err();
        assert!(error.to_string().contains("ReferenceGrant CRD"), "{error}");
    }
}
