//! A CSI client for tests: a tonic channel over the driver's unix socket, and ListVolumes.
//! Also included on its own by reference-driver/tests/reference_driver.rs, which needs no control plane.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use csi_spec::ListVolumesRequest;
use csi_spec::controller_client::ControllerClient;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};

pub async fn channel(socket: &Path) -> Channel {
    let socket: PathBuf = socket.to_path_buf();
    Endpoint::from_static("http://reference-driver.invalid")
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?)) }
        }))
        .await
        .expect("connects over the unix socket")
}

/// Every volume id the driver reports through ListVolumes, all pages.
pub async fn list_volume_ids(socket: &Path) -> BTreeSet<String> {
    let mut controller = ControllerClient::new(channel(socket).await);
    let mut ids = BTreeSet::new();
    let mut starting_token = String::new();
    loop {
        let page = controller
            .list_volumes(ListVolumesRequest {
                max_entries: 500,
                starting_token,
            })
            .await
            .expect("ListVolumes")
            .into_inner();
        ids.extend(
            page.entries
                .into_iter()
                .filter_map(|entry| entry.volume.map(|v| v.volume_id)),
        );
        if page.next_token.is_empty() {
            return ids;
        }
        starting_token = page.next_token;
    }
}
