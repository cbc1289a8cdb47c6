//! The witness client (`[audit.witness]`, C2SP `tlog-witness`): every
//! checkpoint the audit writer signs is submitted to the witness with a
//! consistency proof from the last size it cosigned; its cosignatures are
//! checked and recorded in the log (`checkpoint_cosigned`), which also puts
//! them beside the checkpoint in the checkpoint file.
//!
//! The witness's state is learnt from it: the first submission after a start
//! says `old 0`, and a `409 Conflict` names the size it holds, from which the
//! proof is made again. A witness that holds a larger tree than the gateway
//! ever signed, or that refuses a proof (`422`), is reported as an error:
//! either one means two histories, or a log restored from an old copy.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

use crate::audit::log::AuditLog;
use crate::audit::note::{Checkpoint, Note, Vkey};
use crate::audit::proofs;
use crate::core::config::WitnessConfig;

/// An error of the exchange with the witness, kept whole as a cause.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The longest witness answer read.
const MAX_ANSWER: usize = 64 * 1024;

/// What a submission led to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Submitted {
    /// Cosigned: the verified cosignature lines.
    Cosigned(Vec<String>),
    /// The witness holds another size: submit again from it.
    Conflict(u64),
}

/// Why a submission failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WitnessError {
    /// Not reachable, or the answer could not be read.
    #[error("the witness at {url} is not reachable: {cause}")]
    Unreachable {
        /// The URL.
        url: String,
        /// What happened (the connection's, TLS's or HTTP's own error).
        #[source]
        cause: BoxError,
    },
    /// It refused the checkpoint.
    #[error("the witness refused checkpoint {size}: {why}")]
    Refused {
        /// The checkpoint's size.
        size: u64,
        /// Its status and words.
        why: String,
    },
}

/// The body of `add-checkpoint`: the old size, the consistency proof from
/// it, a blank line, the checkpoint note.
pub(crate) fn request_body(old: u64, proof: &[String], note: &str) -> String {
    let mut body = format!("old {old}\n");
    for h in proof {
        body.push_str(h);
        body.push('\n');
    }
    body.push('\n');
    body.push_str(note);
    body
}

/// The witness's cosignature lines that verify with its key over the
/// checkpoint note's text (others are ignored, as the spec asks; none at
/// all is an error).
pub(crate) fn cosignatures(
    note: &Note,
    answer: &str,
    witness: &Vkey,
) -> Result<Vec<String>, String> {
    let mut good = Vec::new();
    for line in answer.lines().filter(|l| !l.trim().is_empty()) {
        let sig = crate::audit::note::SigLine::parse(line)
            .map_err(|e| format!("a cosignature line does not parse: {e}"))?;
        let with = Note {
            text: note.text.clone(),
            sigs: vec![sig],
        };
        if with
            .cosigned_by(witness)
            .map_err(|e| e.to_string())?
            .is_some()
        {
            good.push(format!("{line}\n"));
        }
    }
    if good.is_empty() {
        return Err(format!(
            "no cosignature from `{}` with the configured key",
            witness.name
        ));
    }
    Ok(good)
}

/// POST `body` to `url` (http or https); status, content type and body.
async fn post(
    url: &str,
    body: String,
    tls: Option<&crate::core::config::UpstreamTls>,
    timeout: Duration,
) -> Result<(u16, String, String), BoxError> {
    let uri: http::Uri = url.parse()?;
    let https = uri.scheme_str() == Some("https");
    let host = uri.host().ok_or("no host")?.to_owned();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let work = async {
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
        let io: Box<dyn crate::upstream::streamable_http::Io> = if https {
            let config = crate::upstream::tls::store_config(tls)?;
            let name = rustls_pki_types::ServerName::try_from(host.clone())?;
            let stream = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await?;
            Box::new(stream)
        } else {
            Box::new(tcp)
        };
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
        let driver = tokio::spawn(conn);
        let req = http::Request::post(uri.clone())
            .header(
                http::header::HOST,
                uri.authority().map_or(host.clone(), |a| a.to_string()),
            )
            .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
            .body(Full::new(Bytes::from(body)))?;
        let resp = sender.send_request(req).await?;
        let status = resp.status().as_u16();
        let kind = resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let bytes = http_body_util::Limited::new(resp.into_body(), MAX_ANSWER)
            .collect()
            .await?
            .to_bytes();
        driver.abort();
        Ok::<_, BoxError>((status, kind, String::from_utf8_lossy(&bytes).into_owned()))
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| format!("no answer within {}", humantime::format_duration(timeout)))?
}

/// Submit `note` (size `cp.size`) with a proof from `old`.
pub(crate) async fn submit(
    cfg: &WitnessConfig,
    witness: &Vkey,
    dir: &Path,
    note: &str,
    cp: &Checkpoint,
    old: u64,
) -> Result<Submitted, WitnessError> {
    let url = format!("{}/add-checkpoint", cfg.url.trim_end_matches('/'));
    let refused = |why: String| WitnessError::Refused { size: cp.size, why };
    // No proof from an empty tree, or to the same size (spec).
    let proof = if old == 0 || old == cp.size {
        Vec::new()
    } else {
        proofs::consistency(dir, old, Some(cp.size))
            .map_err(|e| refused(format!("no consistency proof from {old}: {e}")))?
            .hashes
    };
    let (status, kind, answer) = post(
        &url,
        request_body(old, &proof, note),
        cfg.tls.as_ref(),
        cfg.timeout,
    )
    .await
    .map_err(|cause| WitnessError::Unreachable {
        url: url.clone(),
        cause,
    })?;
    match status {
        200 => {
            let parsed = Note::parse(note).map_err(|e| refused(e.to_string()))?;
            cosignatures(&parsed, &answer, witness)
                .map(Submitted::Cosigned)
                .map_err(refused)
        }
        409 if kind.starts_with("text/x.tlog.size") => {
            let held: u64 = answer
                .trim()
                .parse()
                .map_err(|_| refused(format!("409 with an unreadable size `{}`", answer.trim())))?;
            if held > cp.size {
                return Err(refused(format!(
                    "the witness holds a tree of {held} entries of this log, larger than any it signed now \
                     ({}): a fork, or this log was restored from an older copy",
                    cp.size
                )));
            }
            if held == old {
                return Err(refused(format!(
                    "409 for size {held} again: the witness holds another checkpoint of that size (a fork)"
                )));
            }
            Ok(Submitted::Conflict(held))
        }
        409 => Err(refused(format!(
            "409: the witness holds another checkpoint of size {}: a fork",
            cp.size
        ))),
        422 => Err(refused(
            "422: it found the consistency proof invalid (two histories, or a bug): keep this log as evidence".into(),
        )),
        403 => Err(refused("403: none of the checkpoint's signatures verify with the key the witness has for this log (give it `countersign audit pubkey --vkey`)".into())),
        404 => Err(refused("404: the witness does not know this log's origin (audit.origin)".into())),
        other => Err(refused(format!("HTTP {other}: {}", answer.trim()))),
    }
}

/// The witness task: follows the log's checkpoints until the log closes.
pub(crate) async fn run(log: Arc<AuditLog>, cfg: WitnessConfig, witness: Vkey) {
    let mut notes = log.checkpoints();
    let dir = log.dir().to_owned();
    // The size the witness last cosigned, as far as this process knows.
    let mut old = 0u64;
    loop {
        if notes.changed().await.is_err() {
            return;
        }
        let Some(note) = notes.borrow_and_update().clone() else {
            continue;
        };
        let Ok(cp) = Note::parse(&note).and_then(|n| Checkpoint::parse(&n.text)) else {
            continue;
        };
        // Twice at most: a conflict names the size to prove from.
        for _ in 0..2 {
            match submit(&cfg, &witness, &dir, &note, &cp, old).await {
                Ok(Submitted::Cosigned(lines)) => {
                    old = cp.size;
                    tracing::info!(size = cp.size, witness = %witness.name, "checkpoint cosigned by the witness");
                    let mut fields = serde_json::Map::new();
                    fields.insert("size".into(), cp.size.into());
                    fields.insert(
                        "root".into(),
                        base64::engine::general_purpose::STANDARD
                            .encode(cp.root)
                            .into(),
                    );
                    fields.insert("witness".into(), witness.name.clone().into());
                    let mut cosigned = note.to_string();
                    for l in &lines {
                        cosigned.push_str(l);
                    }
                    fields.insert("note".into(), cosigned.into());
                    fields.insert(
                        "cosignatures".into(),
                        lines
                            .iter()
                            .map(|l| l.trim_end().to_owned())
                            .collect::<Vec<_>>()
                            .into(),
                    );
                    log.record(crate::audit::COSIGNED, fields);
                    break;
                }
                Ok(Submitted::Conflict(held)) => {
                    tracing::info!(
                        size = cp.size,
                        held,
                        "the witness holds another size: proving from it"
                    );
                    old = held;
                }
                Err(e) => {
                    tracing::error!(witness = %witness.name, "{e}");
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_body_is_the_specs() {
        let body = request_body(3, &["AAAA".into(), "BBBB".into()], "o\n5\nCCCC\n\n— o x\n");
        assert_eq!(body, "old 3\nAAAA\nBBBB\n\no\n5\nCCCC\n\n— o x\n");
        assert_eq!(request_body(0, &[], "n\n"), "old 0\n\nn\n");
    }
}
