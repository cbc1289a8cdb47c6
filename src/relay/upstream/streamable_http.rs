//! A Streamable HTTP upstream. Each message is a POST; a request's answer
//! comes back as JSON or as an SSE stream carrying related messages first.
//! In the handshake era the upstream's `Mcp-Session-Id` (never the client's,
//! which the gateway mints) is kept here, and a standalone GET stream is
//! opened after `notifications/initialized`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use http::{HeaderMap, HeaderName, HeaderValue};
use tokio::task::JoinHandle;

use super::{ExtraHeaders, UpstreamError};
use crate::jsonrpc::{parse_body, Body, Message};
use crate::relay::mux::{Mux, Origin};
use crate::relay::sse;

/// The shared HTTP client for all HTTP upstreams.
#[derive(Clone)]
pub struct HttpClient(reqwest::Client);

impl HttpClient {
    /// A client with connection pooling and no overall timeout (calls carry
    /// their own `call_timeout`).
    pub fn new() -> HttpClient {
        let client = reqwest::Client::builder()
            .pool_idle_timeout(std::time::Duration::from_secs(60))
            // Upstreams are named explicitly in the config; consulting proxy
            // environment variables on every request costs time on the hot path.
            .no_proxy()
            // An upstream that redirects is misconfigured; following it would
            // send the gateway's upstream credentials somewhere else.
            .redirect(reqwest::redirect::Policy::none())
            .tcp_nodelay(true)
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        HttpClient(client)
    }
}

impl Default for HttpClient {
    fn default() -> Self {
        HttpClient::new()
    }
}

/// An error with its causes, `a: b: c` (reqwest's own message is terse).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

pub(super) struct Http {
    server: String,
    /// Parsed once: parsing (with IDNA) on every request showed in profiles.
    url: reqwest::Url,
    client: reqwest::Client,
    headers: HeaderMap,
    max_event: usize,
    session: Mutex<Option<HeaderValue>>,
    protocol: Mutex<Option<HeaderValue>>,
    standalone: Mutex<Option<JoinHandle<()>>>,
}

const SESSION: &str = "mcp-session-id";
const PROTOCOL: &str = "mcp-protocol-version";

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Http {
    pub(super) fn new(
        server: &str,
        url: &str,
        static_headers: &BTreeMap<String, String>,
        client: &super::HttpClient,
        max_event: usize,
    ) -> Result<Http, UpstreamError> {
        let url = reqwest::Url::parse(url).map_err(|e| UpstreamError::Connect {
            server: server.into(),
            reason: format!("url `{url}` is not valid: {e}"),
        })?;
        let mut headers = HeaderMap::new();
        for (k, v) in static_headers {
            let (Ok(name), Ok(value)) = (
                HeaderName::try_from(k.as_str()),
                HeaderValue::try_from(v.as_str()),
            ) else {
                return Err(UpstreamError::Connect {
                    server: server.into(),
                    reason: format!(
                        "header `{k}` in [servers.{server}.headers] is not a valid HTTP header"
                    ),
                });
            };
            headers.insert(name, value);
        }
        Ok(Http {
            server: server.into(),
            url,
            client: client.0.clone(),
            headers,
            max_event,
            session: Mutex::new(None),
            protocol: Mutex::new(None),
            standalone: Mutex::new(None),
        })
    }

    fn request(&self, method: reqwest::Method) -> reqwest::RequestBuilder {
        let mut req = self
            .client
            .request(method, self.url.clone())
            .headers(self.headers.clone());
        if let Some(s) = lock(&self.session).clone() {
            req = req.header(SESSION, s);
        }
        if let Some(p) = lock(&self.protocol).clone() {
            req = req.header(PROTOCOL, p);
        }
        req
    }

    /// Remember what `initialize` negotiated.
    pub(super) fn initialized(&self, resp: &Message) {
        let version = resp
            .result
            .as_ref()
            .and_then(|r| serde_json::from_str::<serde_json::Value>(r.get()).ok())
            .and_then(|v| v.get("protocolVersion")?.as_str().map(str::to_owned));
        if let Some(v) = version.and_then(|v| HeaderValue::try_from(v).ok()) {
            *lock(&self.protocol) = Some(v);
        }
    }

    /// POST one message. For a request (`id` given), related messages and the
    /// response are delivered to the mux as they arrive.
    pub(super) async fn post(
        &self,
        mux: &Mux,
        msg: &Message,
        id: Option<u64>,
        extra: &ExtraHeaders,
    ) -> Result<(), UpstreamError> {
        let mut req = self
            .request(reqwest::Method::POST)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json, text/event-stream")
            .body(msg.to_bytes());
        for (k, v) in extra {
            req = req.header(k, v);
        }
        let resp = req.send().await.map_err(|e| self.send_error(e))?;
        let status = resp.status();
        if msg.method() == "initialize" {
            if let Some(s) = resp.headers().get(SESSION) {
                *lock(&self.session) = Some(s.clone());
            }
        }
        if status == reqwest::StatusCode::NOT_FOUND && lock(&self.session).is_some() {
            return Err(UpstreamError::SessionExpired {
                server: self.server.clone(),
            });
        }
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            return Err(UpstreamError::Refused {
                server: self.server.clone(),
                status: status.as_u16(),
            });
        }
        let Some(id) = id else {
            return if status.is_success() {
                Ok(())
            } else {
                Err(UpstreamError::Refused {
                    server: self.server.clone(),
                    status: status.as_u16(),
                })
            };
        };
        let is_sse = resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let origin = Origin::Stream(id);
        if is_sse {
            let mut decoder = sse::Decoder::new(self.max_event);
            let mut body = resp.bytes_stream();
            while let Some(chunk) = body.next().await {
                let chunk =
                    chunk.map_err(|e| self.lost(format!("the response stream broke: {e}")))?;
                let events = decoder.feed(&chunk).map_err(|e| self.lost(e.to_string()))?;
                for ev in events {
                    if ev.data.is_empty() {
                        continue;
                    }
                    match Message::parse(ev.data.as_bytes()) {
                        Ok(m) => mux.deliver(m, origin),
                        Err(e) => {
                            tracing::warn!(server = %self.server, "upstream SSE event is not JSON-RPC ({e}); ignored")
                        }
                    }
                }
                if mux.client_id(id).is_none() {
                    // Answered: the rest of the stream is not ours to wait for.
                    return Ok(());
                }
            }
        } else {
            let bytes = resp
                .bytes()
                .await
                .map_err(|e| self.lost(format!("reading the response failed: {e}")))?;
            if bytes.len() > self.max_event {
                return Err(self.lost(format!("response larger than {} bytes", self.max_event)));
            }
            match parse_body(&bytes) {
                Ok(Body::Single(m)) => mux.deliver(m, origin),
                Ok(Body::Batch(ms)) => ms
                    .into_iter()
                    .flatten()
                    .for_each(|m| mux.deliver(m, origin)),
                Err(_) if !status.is_success() => {
                    // A non-2xx without a JSON-RPC answer. A 4xx means the server
                    // rejected the request without processing it.
                    return if status.is_client_error() {
                        Err(UpstreamError::Refused {
                            server: self.server.clone(),
                            status: status.as_u16(),
                        })
                    } else {
                        Err(self.lost(format!("HTTP {status} without a JSON-RPC answer")))
                    };
                }
                Err(e) => return Err(self.lost(format!("the answer is not JSON-RPC: {e}"))),
            }
        }
        if mux.client_id(id).is_some() {
            return Err(self.lost("the response ended without an answer".into()));
        }
        Ok(())
    }

    fn send_error(&self, e: reqwest::Error) -> UpstreamError {
        let reason = error_chain(&e);
        if e.is_connect() {
            UpstreamError::Connect {
                server: self.server.clone(),
                reason,
            }
        } else {
            // The request may have been written before the failure.
            self.lost(reason)
        }
    }

    fn lost(&self, reason: String) -> UpstreamError {
        UpstreamError::Lost {
            server: self.server.clone(),
            reason,
        }
    }

    /// Open the standalone GET stream for server-initiated messages.
    pub(super) fn open_standalone_stream(&self, mux: &Arc<Mux>) {
        let req = self
            .request(reqwest::Method::GET)
            .header(http::header::ACCEPT, "text/event-stream");
        let mux = mux.clone();
        let server = self.server.clone();
        let max_event = self.max_event;
        let task = tokio::spawn(async move {
            let resp = match req.send().await {
                Ok(r) if r.status().is_success() => r,
                Ok(r) => {
                    tracing::debug!(%server, status = %r.status(), "upstream offers no standalone stream");
                    return;
                }
                Err(e) => {
                    tracing::debug!(%server, "standalone stream not opened: {e}");
                    return;
                }
            };
            let mut decoder = sse::Decoder::new(max_event);
            let mut body = resp.bytes_stream();
            while let Some(Ok(chunk)) = body.next().await {
                let Ok(events) = decoder.feed(&chunk) else {
                    break;
                };
                for ev in events {
                    if let Ok(m) = Message::parse(ev.data.as_bytes()) {
                        mux.deliver(m, Origin::Standalone);
                    }
                }
            }
        });
        if let Some(old) = lock(&self.standalone).replace(task) {
            old.abort();
        }
    }

    pub(super) async fn shutdown(&self) {
        if let Some(task) = lock(&self.standalone).take() {
            task.abort();
        }
        if lock(&self.session).is_some() {
            let _ = self.request(reqwest::Method::DELETE).send().await;
        }
    }
}
