//! The watch of the journal's shards: tells each shard writer what happened to its shard, so
//! that a shard deleted behind the sidecar's back is written again whole at once, and records
//! someone else wrote (another leader, an admin) are taken in without a restart. The watch
//! costs no `--kube-api-qps` token once started; the echo of the writers' own writes costs
//! nothing more, anything else one read of the shard.

use std::collections::HashSet;

use futures::StreamExt;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tracing::{debug, warn};

use super::record::ProvisioningJournal;
use super::writer::{Observed, Writers};

pub(super) async fn watch_shards(
    api: Api<ProvisioningJournal>,
    selector: String,
    writers: std::sync::Arc<Writers>,
) {
    let config = watcher::Config::default().labels(&selector).any_semantic();
    let events = watcher(api, config).default_backoff();
    futures::pin_mut!(events);
    // Shards a fresh list had: after it, the writers of the others learn their shard is gone.
    let mut listed: HashSet<usize> = HashSet::new();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => listed.clear(),
            Ok(watcher::Event::InitApply(shard)) => {
                if let Some(index) = writers.index_of(&shard.name_any()) {
                    listed.insert(index);
                    writers.observe(index, version(&shard));
                }
            }
            Ok(watcher::Event::InitDone) => {
                for index in writers.started() {
                    if !listed.contains(&index) {
                        writers.observe(index, Observed::Missing);
                    }
                }
            }
            Ok(watcher::Event::Apply(shard)) => {
                if let Some(index) = writers.index_of(&shard.name_any()) {
                    writers.observe(index, version(&shard));
                }
            }
            Ok(watcher::Event::Delete(shard)) => {
                if let Some(index) = writers.index_of(&shard.name_any()) {
                    debug!(shard = shard.name_any(), "journal shard deleted");
                    writers.observe(index, Observed::Missing);
                }
            }
            // The watcher retries with a backoff; the writers still find any change at their
            // next conflicting write.
            Err(error) => warn!(%error, "watch of the journal shards failed"),
        }
    }
}

fn version(shard: &ProvisioningJournal) -> Observed {
    match shard.resource_version() {
        Some(version) => Observed::Version(version),
        None => Observed::Missing,
    }
}
