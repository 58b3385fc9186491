//! The admin kubeconfig of a run, and client configurations built from it. The kubeconfig refers to the PEM
//! files by path (they live next to it), so it works for kube-rs, kubectl and the controller
//! manager alike. JSON is valid YAML, so serde_json writes it.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::error::Error;
use crate::pki::PkiFiles;

const NAME: &str = "csi-testbed";

/// Pure: the kubeconfig text for the admin user against `server`.
pub fn render(server: &str, pki: &PkiFiles) -> String {
    render_user(server, pki, "admin", &pki.admin_cert, &pki.admin_key)
}

/// Pure: the kubelet's kubeconfig (its `system:node:` identity) against `server`.
pub fn render_node(server: &str, pki: &PkiFiles) -> String {
    render_user(server, pki, "node", &pki.node_cert, &pki.node_key)
}

fn render_user(server: &str, pki: &PkiFiles, user: &str, cert: &Path, key: &Path) -> String {
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": NAME,
            "cluster": {
                "server": server,
                "certificate-authority": pki.serving_ca,
            },
        }],
        "users": [{
            "name": user,
            "user": {
                "client-certificate": cert,
                "client-key": key,
            },
        }],
        "contexts": [{
            "name": NAME,
            "context": { "cluster": NAME, "user": user, "namespace": "default" },
        }],
        "current-context": NAME,
    });
    format!("{doc:#}\n")
}

pub async fn config(path: &Path) -> Result<kube::Config, Error> {
    let as_error = |source| Error::Kubeconfig {
        path: path.to_owned(),
        source,
    };
    let kubeconfig = Kubeconfig::read_from(path).map_err(as_error)?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(as_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn kube_rs_parses_what_we_render() {
        let p = |n: &str| PathBuf::from("/run/pki").join(n);
        let pki = PkiFiles {
            serving_ca: p("serving-ca.crt"),
            serving_cert: p("serving.crt"),
            serving_key: p("serving.key"),
            client_ca: p("client-ca.crt"),
            admin_cert: p("admin.crt"),
            admin_key: p("admin.key"),
            node_cert: p("node.crt"),
            node_key: p("node.key"),
            service_account_public: p("sa.pub"),
            service_account_private: p("sa.key"),
        };
        let parsed = Kubeconfig::from_yaml(&render("https://127.0.0.1:6443", &pki)).expect("parse");
        assert_eq!(parsed.current_context.as_deref(), Some(NAME));
        let cluster = parsed.clusters[0].cluster.as_ref().expect("cluster");
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        assert_eq!(
            cluster.certificate_authority.as_deref(),
            Some("/run/pki/serving-ca.crt")
        );
        let user = parsed.auth_infos[0].auth_info.as_ref().expect("user");
        assert_eq!(
            user.client_certificate.as_deref(),
            Some("/run/pki/admin.crt")
        );
    }
}
