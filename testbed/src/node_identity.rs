//! The real node's fixed name and addresses, which the certificates ([`crate::pki`]), the
//! apiserver's flags ([`crate::args`]) and the node itself ([`crate::node`]) all name. A leaf:
//! it imports nothing of the crate, so those three need not import each other for it.

/// The Node's name (and the kubelet's `--hostname-override`).
pub const NODE_NAME: &str = "csi-testbed-node";
/// The `kubernetes` Service's ClusterIP (first address of `--service-cluster-ip-range`), which
/// the kubelet gives pods as `KUBERNETES_SERVICE_HOST`. The testbed puts it on loopback and the
/// apiserver listens on it, port [`APISERVER_PORT`]: pods on the bridge reach it through the
/// host without a kube-proxy. It is also the node's InternalIP.
pub const SERVICE_IP: &str = "10.0.0.1";
/// The `kubernetes` Service's port, which pods are told (`KUBERNETES_SERVICE_PORT`).
pub const APISERVER_PORT: u16 = 443;
