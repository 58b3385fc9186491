//! The kubelet's plugin registration API (`pluginregistration.Registration`), served by the
//! driver itself on a socket in the kubelet's plugins_registry directory, so the kubelet finds
//! the node plugin without a node-driver-registrar sidecar.

use tonic::{Request, Response, Status};

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod proto {
    tonic::include_proto!("pluginregistration");
}

/// The plugin type the kubelet's CSI plugin handler registers.
pub const CSI_PLUGIN_TYPE: &str = "CSIPlugin";
/// The CSI versions this driver reports to the kubelet.
pub const SUPPORTED_VERSIONS: &[&str] = &["1.0.0"];

/// Answers the kubelet: who we are and where the CSI socket is.
#[derive(Clone, Debug)]
pub struct Registration {
    driver_name: String,
    /// The CSI socket path as the kubelet sees it on the host.
    kubelet_endpoint: String,
}

impl Registration {
    pub fn new(driver_name: String, kubelet_endpoint: String) -> Self {
        Self {
            driver_name,
            kubelet_endpoint,
        }
    }

    pub fn info(&self) -> proto::PluginInfo {
        proto::PluginInfo {
            r#type: CSI_PLUGIN_TYPE.to_string(),
            name: self.driver_name.clone(),
            endpoint: self.kubelet_endpoint.clone(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect(),
        }
    }
}

#[tonic::async_trait]
impl proto::registration_server::Registration for Registration {
    async fn get_info(
        &self,
        _request: Request<proto::InfoRequest>,
    ) -> Result<Response<proto::PluginInfo>, Status> {
        tracing::info!(
            driver = %self.driver_name,
            endpoint = %self.kubelet_endpoint,
            "kubelet asked for the plugin info"
        );
        Ok(Response::new(self.info()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<proto::RegistrationStatus>,
    ) -> Result<Response<proto::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(driver = %self.driver_name, "registered with the kubelet");
        } else {
            tracing::error!(
                driver = %self.driver_name,
                error = %status.error,
                "the kubelet refused the registration"
            );
        }
        Ok(Response::new(proto::RegistrationStatusResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use hyper_util::rt::TokioIo;
    use tokio::net::UnixStream;
    use tokio_stream::wrappers::UnixListenerStream;
    use tonic::transport::Endpoint;

    use super::proto::registration_client::RegistrationClient;
    use super::proto::registration_server::RegistrationServer;
    use super::*;

    #[tokio::test]
    async fn get_info_and_notify_over_a_unix_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("reference.csi.example.com-reg.sock");
        let (listener, _) = crate::socket::bind_replacing(&path, 0o600).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(Registration::new(
                    "reference.csi.example.com".into(),
                    "/var/lib/kubelet/plugins/reference.csi.example.com/csi.sock".into(),
                )))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stopped.await;
                }),
        );
        let socket: PathBuf = path.clone();
        let channel =
            Endpoint::from_static("http://registration.invalid")
                .connect_with_connector(tower::service_fn(move |_| {
                    let socket = socket.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?))
                    }
                }))
                .await
                .unwrap();
        let mut client = RegistrationClient::new(channel);
        let info = client
            .get_info(proto::InfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            info,
            proto::PluginInfo {
                r#type: "CSIPlugin".into(),
                name: "reference.csi.example.com".into(),
                endpoint: "/var/lib/kubelet/plugins/reference.csi.example.com/csi.sock".into(),
                supported_versions: vec!["1.0.0".into()],
            }
        );
        for (registered, error) in [(true, ""), (false, "driver name taken")] {
            client
                .notify_registration_status(proto::RegistrationStatus {
                    plugin_registered: registered,
                    error: error.into(),
                })
                .await
                .unwrap();
        }
        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }
}
