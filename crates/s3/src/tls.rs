//! HTTPS: the server's certificate chain and private key from PEM files, reloadable while serving (on
//! SIGHUP), so that a renewed certificate takes effect for new connections without dropping open ones.
//! TLS is rustls with AWS-LC as the crypto provider (hardware AES-GCM), TLS 1.2 and 1.3, HTTP/1.1 by ALPN.

use parking_lot::RwLock;
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Largest certificate or key file read: a chain of a few certificates is a few KiB.
pub const MAX_PEM_FILE_BYTES: u64 = 1 << 20;
/// Most certificates in a chain (leaf and intermediates).
pub const MAX_CHAIN_CERTS: usize = 16;

/// The certificate a server presents, with the files it came from. New handshakes take the current one;
/// `reload` swaps it only when the new files are complete and match, so a half-written renewal never
/// leaves the server without a certificate.
#[derive(Debug)]
pub struct Certificates {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
}

impl Certificates {
    /// Reads the chain (PEM, leaf first) and its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Arc<Self>, String> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let current = load_certified_key(&provider, cert_path, key_path)?;
        Ok(Arc::new(Certificates {
            cert_path: cert_path.to_path_buf(),
            key_path: key_path.to_path_buf(),
            provider,
            current: RwLock::new(Arc::new(current)),
        }))
    }

    /// Reads the files again and serves the new certificate to new connections; on an error the old one
    /// stays.
    pub fn reload(&self) -> Result<(), String> {
        let fresh = load_certified_key(&self.provider, &self.cert_path, &self.key_path)?;
        *self.current.write() = Arc::new(fresh);
        Ok(())
    }

    /// The DER of the leaf certificate served now.
    pub fn leaf_der(&self) -> Vec<u8> {
        let current = self.current.read();
        debug_assert!(!current.cert.is_empty(), "a loaded chain has a leaf");
        current.cert.first().map(|c| c.as_ref().to_vec()).unwrap_or_default()
    }

    /// A TLS acceptor that serves whatever certificate is current at each handshake.
    pub fn acceptor(self: &Arc<Self>) -> Result<tokio_rustls::TlsAcceptor, String> {
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS configuration: {e}"))?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().clone())
    }
}

fn load_certified_key(provider: &CryptoProvider, cert_path: &Path, key_path: &Path) -> Result<CertifiedKey, String> {
    let cert_pem = read_bounded(cert_path)?;
    let key_pem = read_bounded(key_path)?;
    let chain = parse_chain(&cert_pem).map_err(|e| format!("{}: {e}", cert_path.display()))?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| format!("{}: no private key in PEM ({e})", key_path.display()))?;
    let certified = CertifiedKey::from_der(chain, key, provider).map_err(|e| {
        format!("{} and {}: the key does not fit the certificate ({e})", cert_path.display(), key_path.display())
    })?;
    assert!(!certified.cert.is_empty(), "a certified key has its leaf");
    Ok(certified)
}

/// The certificates of a PEM chain, leaf first; at least one, at most MAX_CHAIN_CERTS.
fn parse_chain(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let mut chain = Vec::new();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| format!("not a PEM certificate chain ({e})"))?;
        if chain.len() == MAX_CHAIN_CERTS {
            return Err(format!("more than {MAX_CHAIN_CERTS} certificates in the chain"));
        }
        chain.push(cert);
    }
    if chain.is_empty() {
        return Err("no CERTIFICATE in PEM".into());
    }
    Ok(chain)
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_PEM_FILE_BYTES {
        return Err(format!("{}: larger than {MAX_PEM_FILE_BYTES} bytes", path.display()));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_are_bounded_and_need_a_certificate() {
        assert!(parse_chain(b"").unwrap_err().contains("no CERTIFICATE"));
        assert!(parse_chain(b"not pem at all").unwrap_err().contains("no CERTIFICATE"));
        let one = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert_eq!(parse_chain(one.as_bytes()).unwrap().len(), 1);
        let full = one.repeat(MAX_CHAIN_CERTS);
        assert_eq!(parse_chain(full.as_bytes()).unwrap().len(), MAX_CHAIN_CERTS);
        let over = one.repeat(MAX_CHAIN_CERTS + 1);
        assert!(parse_chain(over.as_bytes()).unwrap_err().contains("more than"));
    }

    #[test]
    fn files_past_the_limit_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().join("at.pem");
        std::fs::write(&at, vec![b'x'; MAX_PEM_FILE_BYTES as usize]).unwrap();
        assert_eq!(read_bounded(&at).unwrap().len() as u64, MAX_PEM_FILE_BYTES);
        let past = dir.path().join("past.pem");
        std::fs::write(&past, vec![b'x'; MAX_PEM_FILE_BYTES as usize + 1]).unwrap();
        assert!(read_bounded(&past).unwrap_err().contains("larger than"));
        assert!(read_bounded(&dir.path().join("missing.pem")).unwrap_err().contains("cannot read"));
    }
}
