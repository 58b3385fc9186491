//! Per-run certificates, in the shape envtest uses: a serving CA and a serving certificate for
//! localhost/127.0.0.1, a separate client CA signing the admin user (CN=admin,
//! O=system:masters, which RBAC treats as cluster-admin), and a service-account key pair.
//! Everything is ECDSA P-256 and lives only in the run's temporary directory.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::error::Error;

/// Certificates and keys of one run, PEM-encoded.
pub struct Pki {
    serving_ca: String,
    /// DER of the serving CA, for probe clients that trust nothing else.
    serving_ca_der: Vec<u8>,
    serving_cert: String,
    serving_key: String,
    client_ca: String,
    admin_cert: String,
    admin_key: String,
    node_cert: String,
    node_key: String,
    service_account_public: String,
    service_account_private: String,
}

/// Where [`Pki::write`] put each file.
#[derive(Clone, Debug)]
pub struct PkiFiles {
    pub serving_ca: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub client_ca: PathBuf,
    pub admin_cert: PathBuf,
    pub admin_key: PathBuf,
    /// The kubelet's client identity (`system:node:<name>` in `system:nodes`, what the Node
    /// authorizer and NodeRestriction admission expect); used only by a real node.
    pub node_cert: PathBuf,
    pub node_key: PathBuf,
    pub service_account_public: PathBuf,
    pub service_account_private: PathBuf,
}

impl Pki {
    pub fn generate() -> Result<Self, Error> {
        let (serving_ca, serving_ca_key, serving_ca_params) = new_ca("csi-testbed serving CA")?;
        let (client_ca, client_ca_key, client_ca_params) = new_ca("csi-testbed client CA")?;

        let serving_issuer = Issuer::from_params(&serving_ca_params, &serving_ca_key);
        let serving_key = KeyPair::generate()?;
        // In-cluster clients of a real node reach the apiserver as the `kubernetes` Service.
        let mut serving = CertificateParams::new(vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            crate::node_identity::SERVICE_IP.to_owned(),
            "kubernetes".to_owned(),
            "kubernetes.default".to_owned(),
            "kubernetes.default.svc".to_owned(),
            "kubernetes.default.svc.cluster.local".to_owned(),
        ])?;
        serving
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        serving.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_cert = serving.signed_by(&serving_key, &serving_issuer)?;

        let client_issuer = Issuer::from_params(&client_ca_params, &client_ca_key);
        let admin_key = KeyPair::generate()?;
        let mut admin = CertificateParams::new(Vec::<String>::new())?;
        admin.distinguished_name.push(DnType::CommonName, "admin");
        admin
            .distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        admin.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_cert = admin.signed_by(&admin_key, &client_issuer)?;

        let node_key = KeyPair::generate()?;
        let mut node = CertificateParams::new(Vec::<String>::new())?;
        node.distinguished_name.push(
            DnType::CommonName,
            format!("system:node:{}", crate::node_identity::NODE_NAME),
        );
        node.distinguished_name
            .push(DnType::OrganizationName, "system:nodes");
        node.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        node.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let node_cert = node.signed_by(&node_key, &client_issuer)?;

        let service_account = KeyPair::generate()?;

        Ok(Pki {
            serving_ca_der: serving_ca.der().to_vec(),
            serving_ca: serving_ca.pem(),
            serving_cert: serving_cert.pem(),
            serving_key: serving_key.serialize_pem(),
            client_ca: client_ca.pem(),
            admin_cert: admin_cert.pem(),
            admin_key: admin_key.serialize_pem(),
            node_cert: node_cert.pem(),
            node_key: node_key.serialize_pem(),
            service_account_public: service_account.public_key_pem(),
            service_account_private: service_account.serialize_pem(),
        })
    }

    pub fn serving_ca_der(&self) -> &[u8] {
        &self.serving_ca_der
    }

    /// Writes every file under `dir` (created if needed); private keys are 0600.
    pub fn write(&self, dir: &Path) -> Result<PkiFiles, Error> {
        std::fs::create_dir_all(dir).map_err(|source| Error::WriteFile {
            path: dir.to_owned(),
            source,
        })?;
        let files = PkiFiles {
            serving_ca: dir.join("serving-ca.crt"),
            serving_cert: dir.join("serving.crt"),
            serving_key: dir.join("serving.key"),
            client_ca: dir.join("client-ca.crt"),
            admin_cert: dir.join("admin.crt"),
            admin_key: dir.join("admin.key"),
            node_cert: dir.join("node.crt"),
            node_key: dir.join("node.key"),
            service_account_public: dir.join("service-account.pub"),
            service_account_private: dir.join("service-account.key"),
        };
        write_file(&files.serving_ca, &self.serving_ca)?;
        write_file(&files.serving_cert, &self.serving_cert)?;
        write_file(&files.serving_key, &self.serving_key)?;
        write_file(&files.client_ca, &self.client_ca)?;
        write_file(&files.admin_cert, &self.admin_cert)?;
        write_file(&files.admin_key, &self.admin_key)?;
        write_file(&files.node_cert, &self.node_cert)?;
        write_file(&files.node_key, &self.node_key)?;
        write_file(&files.service_account_public, &self.service_account_public)?;
        write_file(
            &files.service_account_private,
            &self.service_account_private,
        )?;
        Ok(files)
    }
}

type Ca = (rcgen::Certificate, KeyPair, CertificateParams);

fn new_ca(common_name: &str) -> Result<Ca, Error> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key)?;
    Ok((cert, key, params))
}

/// Owner-only permissions: these are throwaway credentials, but still credentials.
pub(crate) fn write_file(path: &Path, contents: &str) -> Result<(), Error> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(contents.as_bytes()))
        .map_err(|source| Error::WriteFile {
            path: path.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_pem_files_with_private_keys_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let pki = Pki::generate().expect("generate");
        let files = pki.write(dir.path()).expect("write");
        let ca = std::fs::read_to_string(&files.serving_ca).expect("read ca");
        assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"));
        let key = std::fs::read_to_string(&files.admin_key).expect("read key");
        assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"));
        let public = std::fs::read_to_string(&files.service_account_public).expect("read pub");
        assert!(public.starts_with("-----BEGIN PUBLIC KEY-----"));
        let mode = std::fs::metadata(&files.admin_key)
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
