//! TLS on the gateway's own listener (`gateway.tls_cert`, `tls_key`), with
//! the certificate taken again from disk when the files change: a renewed
//! certificate needs no restart, and connections already open keep theirs.
//! A new pair that does not load (half written, a key that does not match)
//! is refused with the reason in the log, and the previous one stays in use.

use parking_lot::RwLock;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::upstream::tls::{certificates, private_key, TlsError};

/// The certificate in use, swapped whole on reload.
#[derive(Debug)]
pub(crate) struct Reloading {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Load a certificate chain and its key, checking that they belong together.
fn load(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let chain = certificates(cert, "gateway.tls_cert")?;
    let key = private_key(key, "gateway.tls_key")?;
    let certified =
        CertifiedKey::from_der(chain, key, &provider()).map_err(|cause| TlsError::Refused {
            setting: "gateway.tls_cert and gateway.tls_key".to_owned(),
            cause,
        })?;
    Ok(certified)
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

impl Reloading {
    /// Load the pair now (a failure stops `serve`).
    pub(crate) fn open(cert: &Path, key: &Path) -> Result<Arc<Reloading>, TlsError> {
        let current = load(cert, key)?;
        Ok(Arc::new(Reloading {
            cert: cert.to_owned(),
            key: key.to_owned(),
            current: RwLock::new(Arc::new(current)),
        }))
    }

    /// The server configuration (HTTP/1.1, TLS 1.2 and 1.3).
    pub(crate) fn server_config(self: &Arc<Self>) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|cause| TlsError::Refused {
                setting: "TLS on the listener".to_owned(),
                cause,
            })?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// Watch the two files and take a new pair when either changes.
    pub(crate) async fn watch(self: Arc<Self>, every: Duration) {
        let mut seen = (stamp(&self.cert), stamp(&self.key));
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            let now = (stamp(&self.cert), stamp(&self.key));
            if now == seen {
                continue;
            }
            seen = now;
            match load(&self.cert, &self.key) {
                Ok(new) => {
                    *self.current.write() = Arc::new(new);
                    tracing::info!(cert = %self.cert.display(), "listener certificate reloaded");
                }
                Err(e) => {
                    tracing::error!(
                        "listener certificate not reloaded, the previous one stays in use: {e}"
                    );
                }
            }
        }
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().clone())
    }
}
