//! TLS to `https://` upstreams (rustls, ring provider). Hostname
//! verification and SNI are always on: there is no setting that turns
//! certificate checks off, so a misconfigured upstream fails closed with a
//! message that says what to set.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

use crate::core::config::{TlsRoots, UpstreamTls};

/// Why a TLS configuration (or the HTTP client built on one) could not be
/// made. Each says which setting to look at; the library's own error stays
/// its source, so the CLI prints it as the cause and a log line (which has
/// only `Display`) still ends with its words.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsError {
    /// A PEM file that does not read or parse.
    #[error("{setting} `{}`: {cause}", path.display())]
    Pem {
        setting: String,
        path: PathBuf,
        #[source]
        cause: rustls::pki_types::pem::Error,
    },
    /// A certificate file with no certificate in it.
    #[error("{setting} `{}` holds no PEM certificate", path.display())]
    NoCertificate { setting: String, path: PathBuf },
    /// `roots = "system"` on a host whose store gave nothing.
    #[error("{setting}: the host's certificate store is empty or unreadable")]
    NoSystemRoots { setting: String },
    /// A CA certificate rustls does not take as a root.
    #[error("{setting} `{}`: {cause}", path.display())]
    BadRoot {
        setting: String,
        path: PathBuf,
        #[source]
        cause: rustls::Error,
    },
    /// No root at all: nothing to check the peer's certificate with.
    #[error("{setting}: no root certificate to check {peer} with; set ca_file")]
    NoRoots { setting: String, peer: String },
    /// rustls refused the configuration (protocol versions, a client
    /// certificate and key that do not belong together).
    #[error("{setting}: {cause}")]
    Refused {
        setting: String,
        #[source]
        cause: rustls::Error,
    },
    /// The HTTP client on this configuration could not be built.
    #[error("no HTTP client for {peer}: {cause}")]
    Client {
        peer: String,
        #[source]
        cause: reqwest::Error,
    },
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// PEM certificates of `path`, at least one.
pub(crate) fn certificates(
    path: &Path,
    what: &str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = |cause| TlsError::Pem {
        setting: what.to_owned(),
        path: path.to_owned(),
        cause,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(pem)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            setting: what.to_owned(),
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// The PEM private key of `path`.
pub(crate) fn private_key(path: &Path, what: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|cause| TlsError::Pem {
        setting: what.to_owned(),
        path: path.to_owned(),
        cause,
    })
}

/// An HTTP client for `peer` on `tls`: a time limit, and no redirects (a
/// redirect could carry a token, a signed event or spans to a host nobody
/// configured, or lead a key fetch off the provider's host).
pub(crate) fn http_client(
    tls: ClientConfig,
    timeout: Duration,
    peer: &str,
) -> Result<reqwest::Client, TlsError> {
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|cause| TlsError::Client {
            peer: peer.to_owned(),
            cause,
        })
}

/// The client configuration for `server`'s upstream.
pub(crate) fn client_config(
    server: &str,
    tls: Option<&UpstreamTls>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let default = UpstreamTls::default();
    let mut config = config_at(
        &format!("[servers.{server}.tls]"),
        &format!("upstream `{server}`"),
        tls.unwrap_or(&default),
    )?;
    // HTTP/1.1 only, like the plain connections.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The client configuration for the PostgreSQL store (`[store.tls]`):
/// the same roots, CA file and client certificate settings as an upstream.
pub(crate) fn store_config(tls: Option<&UpstreamTls>) -> Result<Arc<ClientConfig>, TlsError> {
    let default = UpstreamTls::default();
    Ok(Arc::new(config_at(
        "[store.tls]",
        "the store",
        tls.unwrap_or(&default),
    )?))
}

/// The client configuration for the identity provider `name`'s metadata
/// and keys (`[[auth.issuers]]`, its `tls`): Mozilla's roots unless it says
/// otherwise.
pub(crate) fn issuer_config(
    name: &str,
    tls: Option<&UpstreamTls>,
) -> Result<ClientConfig, TlsError> {
    let default = UpstreamTls::default();
    config_at(
        &format!("[[auth.issuers]] `{name}` tls:"),
        &format!("identity provider `{name}`"),
        tls.unwrap_or(&default),
    )
}

/// A client configuration from `tls`; `table` names its settings in
/// errors, `peer` what it connects to.
fn config_at(table: &str, peer: &str, tls: &UpstreamTls) -> Result<ClientConfig, TlsError> {
    let at = |field: &str| format!("{table} {field}");
    let mut roots = RootCertStore::empty();
    let which = tls.roots.unwrap_or(if tls.ca_file.is_some() {
        TlsRoots::None
    } else {
        TlsRoots::Webpki
    });
    match which {
        TlsRoots::Webpki => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        TlsRoots::System => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                // A certificate the store holds but rustls cannot parse is
                // skipped, like the platform verifiers do.
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(TlsError::NoSystemRoots {
                    setting: at("roots = \"system\""),
                });
            }
        }
        TlsRoots::None => {}
    }
    if let Some(ca) = &tls.ca_file {
        for cert in certificates(ca, &at("ca_file"))? {
            roots.add(cert).map_err(|cause| TlsError::BadRoot {
                setting: at("ca_file"),
                path: ca.clone(),
                cause,
            })?;
        }
    }
    if roots.is_empty() {
        return Err(TlsError::NoRoots {
            setting: at("roots = \"none\""),
            peer: peer.to_owned(),
        });
    }
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|cause| TlsError::Refused {
            setting: format!("TLS for {peer}"),
            cause,
        })?
        .with_root_certificates(roots);
    match (&tls.client_cert, &tls.client_key) {
        (Some(cert), Some(key)) => builder
            .with_client_auth_cert(
                certificates(cert, &at("client_cert"))?,
                private_key(key, &at("client_key"))?,
            )
            .map_err(|cause| TlsError::Refused {
                setting: at("client_cert/client_key"),
                cause,
            }),
        _ => Ok(builder.with_no_client_auth()),
    }
}

/// The client configuration for the trace collector (`[telemetry]`, its
/// `tls`): Mozilla's roots unless it says otherwise.
pub(crate) fn collector_config(tls: Option<&UpstreamTls>) -> Result<ClientConfig, TlsError> {
    let default = UpstreamTls::default();
    config_at(
        "[telemetry.tls]",
        "the trace collector",
        tls.unwrap_or(&default),
    )
}

/// The client configuration for webhook `name` (`[[notify.webhooks]]`,
/// its `tls`): Mozilla's roots unless it says otherwise.
pub(crate) fn webhook_config(
    name: &str,
    tls: Option<&UpstreamTls>,
) -> Result<ClientConfig, TlsError> {
    let default = UpstreamTls::default();
    config_at(
        &format!("[[notify.webhooks]] `{name}` tls:"),
        &format!("webhook `{name}`"),
        tls.unwrap_or(&default),
    )
}

/// Build the TLS configuration of every `https://` upstream and identity
/// provider once (at start): an unreadable `ca_file` or client key stops
/// `serve` with the reason, rather than failing the first call.
pub(crate) fn check_all(config: &crate::core::config::Config) -> Result<(), TlsError> {
    for (name, s) in &config.servers {
        if s.url.as_deref().is_some_and(|u| u.starts_with("https://")) {
            client_config(name, s.tls.as_ref())?;
        }
    }
    for i in &config.auth.issuers {
        issuer_config(&i.name, i.tls.as_ref())?;
    }
    for w in &config.notify.webhooks {
        webhook_config(&w.name, w.tls.as_ref())?;
    }
    if config.telemetry.tls.is_some() {
        collector_config(config.telemetry.tls.as_ref())?;
    }
    Ok(())
}

/// A handshake failure, worded with what to do about it.
pub(crate) fn handshake_error(server: &str, e: &std::io::Error) -> String {
    let text = e.to_string();
    let hint = if text.contains("UnknownIssuer") {
        format!(
            " (the upstream's certificate is not signed by a trusted CA: set [servers.{server}.tls] ca_file to the CA that signed it)"
        )
    } else if text.contains("NotValidForName") || text.contains("not valid for name") {
        " (the certificate is not valid for the host name in the url: use the name it was issued for)".to_owned()
    } else if text.contains("Expired") || text.contains("NotValidYet") {
        " (the certificate is outside its validity period)".to_owned()
    } else if text.contains("CertificateRequired") || text.contains("certificate required") {
        format!(" (the upstream wants a client certificate: set [servers.{server}.tls] client_cert and client_key)")
    } else {
        String::new()
    };
    format!("TLS handshake failed: {text}{hint}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_build_and_bad_files_are_named() {
        assert!(client_config("s", None).is_ok(), "webpki roots by default");
        let missing = UpstreamTls {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..UpstreamTls::default()
        };
        let e = client_config("s", Some(&missing)).unwrap_err();
        assert!(
            e.to_string()
                .contains("[servers.s.tls] ca_file `/nonexistent/ca.pem`"),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let e = client_config(
            "s",
            Some(&UpstreamTls {
                ca_file: Some(empty),
                ..UpstreamTls::default()
            }),
        )
        .unwrap_err();
        assert!(e.to_string().contains("holds no PEM certificate"), "{e}");
    }

    #[test]
    fn an_issuers_tls_settings_are_checked_at_start_and_named() {
        let mut config = crate::core::config::Config::parse(
            "[[auth.issuers]]\nname = \"corp\"\nissuer = \"https://idp.example.com\"\n\
             tenant = \"acme\"\ntls = { ca_file = \"/nonexistent/corp-ca.pem\" }\n",
            Path::new("test.toml"),
        )
        .unwrap();
        let e = check_all(&config).unwrap_err();
        assert!(
            e.to_string()
                .contains("[[auth.issuers]] `corp` tls: ca_file `/nonexistent/corp-ca.pem`"),
            "{e}"
        );
        config.auth.issuers[0].tls = None;
        assert!(check_all(&config).is_ok(), "Mozilla's roots by default");
    }

    #[test]
    fn the_collectors_tls_settings_are_checked_at_start_and_named() {
        let mut config = crate::core::config::Config::parse(
            "[telemetry]\nendpoint = \"https://collector.example.com:4318\"\n\
             tls = { ca_file = \"/nonexistent/collector-ca.pem\" }\n",
            Path::new("test.toml"),
        )
        .unwrap();
        let e = check_all(&config).unwrap_err();
        assert!(
            e.to_string()
                .contains("[telemetry.tls] ca_file `/nonexistent/collector-ca.pem`"),
            "{e}"
        );
        config.telemetry.tls = None;
        assert!(check_all(&config).is_ok(), "Mozilla's roots by default");
    }
}
