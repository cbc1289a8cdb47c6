//! TLS: `https://` upstreams (a private CA, a wrong host name, mutual TLS)
//! against the example server behind a TLS terminator made here, with
//! certificates made in the test (rcgen).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};

use std::sync::Arc;

use common::pki::Pki;
use common::*;
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};

/// A TLS terminator in front of `upstream` (plain TCP), with `cert`; when
/// `client_ca` is given, it requires a client certificate signed by it.
async fn terminator(
    upstream: String,
    cert: &(PathBuf, PathBuf),
    client_ca: Option<&Path>,
) -> String {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert.0)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(&cert.1).unwrap();
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let config = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca).unwrap() {
                roots.add(c.unwrap()).unwrap();
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    }
    .with_single_cert(chain, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut plain) = TcpStream::connect(&upstream).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    addr
}

fn server(name: &str, url: &str, tls: &str) -> String {
    format!("\n[servers.{name}]\nurl = \"{url}\"\ncall_timeout = \"5s\"\n{tls}")
}

fn report_of(gw: &Gateway) -> Value {
    let out = gw.cli(&["check", "--json"]);
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn https_upstreams_check_the_certificate_and_the_name_and_do_mutual_tls() {
    let pki = Pki::new();
    let cert = pki.issue("localhost", &["localhost"]);
    let client = pki.issue("gateway-client", &["countersign-gateway"]);
    let records = tempfile::tempdir().unwrap();
    let record = records.path().join("executions.jsonl");
    let faults = records.path().join("faults.json");
    std::fs::write(&faults, "{}").unwrap();
    let plain = HttpUpstream::start(&record, &faults);
    let tls_port = terminator(plain.addr.clone(), &cert, None)
        .await
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned();
    let mtls_port = terminator(plain.addr.clone(), &cert, Some(&pki.ca_file()))
        .await
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned();
    let ca = pki.ca_file().display().to_string();
    let https = |port: &str, host: &str| format!("https://{host}:{port}/mcp");
    let extra = [
        server(
            "trusted",
            &https(&tls_port, "localhost"),
            &format!("[servers.trusted.tls]\nca_file = \"{ca}\"\n"),
        ),
        server("untrusted", &https(&tls_port, "localhost"), ""),
        server(
            "wrongname",
            &https(&tls_port, "127.0.0.1"),
            &format!("[servers.wrongname.tls]\nca_file = \"{ca}\"\n"),
        ),
        server(
            "mutual",
            &https(&mtls_port, "localhost"),
            &format!(
                "[servers.mutual.tls]\nca_file = \"{ca}\"\nclient_cert = \"{}\"\nclient_key = \"{}\"\n",
                client.0.display(),
                client.1.display()
            ),
        ),
        server(
            "nocert",
            &https(&mtls_port, "localhost"),
            &format!("[servers.nocert.tls]\nca_file = \"{ca}\"\n"),
        ),
    ]
    .concat();
    let gw = Gateway::start_with(Options {
        extra,
        ..Default::default()
    });
    // A call through the private CA, and through mutual TLS.
    for name in ["trusted", "mutual"] {
        let mut c = Client::new(&gw.url(name));
        c.initialize().await;
        let a = c.call(1, "get_balance", json!({"account":"a"})).await;
        assert_eq!(a.last()["result"]["isError"], false, "{name}: {a:?}");
    }
    let executed = std::fs::read_to_string(&record).unwrap();
    assert_eq!(executed.matches("\"executed\"").count(), 2);
    // What check says of each, with the reason when refused.
    let report = report_of(&gw);
    let s = |name: &str| report_server(&report, name);
    assert_eq!(s("trusted")["up"], true, "{report}");
    assert_eq!(s("mutual")["up"], true, "{report}");
    let untrusted = s("untrusted")["error"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(s("untrusted")["up"], false);
    assert!(
        untrusted.contains("UnknownIssuer") && untrusted.contains("ca_file"),
        "a clear refusal without the CA: {untrusted}"
    );
    let wrong = s("wrongname")["error"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(s("wrongname")["up"], false);
    assert!(
        wrong.contains("not valid for name") && wrong.contains("use the name it was issued for"),
        "{wrong}"
    );
    assert_eq!(
        s("nocert")["up"],
        false,
        "a server that wants a client certificate refuses one without: {report}"
    );
}
