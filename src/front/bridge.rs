//! `countersign stdio --server S`: a bridge for clients that can only spawn
//! stdio servers. It relays newline-delimited JSON-RPC between its own
//! stdin/stdout and the gateway's `/mcp/S` endpoint, and makes no decisions.
//!
//! - One stable session scope (random, for the bridge's whole life) is sent
//!   on every request, so idempotency keys derived from the session survive a
//!   gateway restart.
//! - The client's `initialize` is kept; when the gateway answers 404 for the
//!   session (it restarted), the bridge re-initializes with it and resends
//!   the message, invisibly to the client.
//! - A request is resent only when it provably never reached the gateway
//!   (connection refused). If the connection breaks mid-call, the client is
//!   told the outcome is unknown; the bridge never re-sends a call that may
//!   have run.
//! - Logs go to stderr only: stdout is the protocol.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::enforce::answer::{self, Rejection};
use crate::front::http::SCOPE_HEADER;
use crate::wire::era::Era;
use crate::wire::era::{declared_version, encode_header_value};
use crate::wire::jsonrpc::{parse_body, parse_client_body, Body, Kind, Message};
use crate::wire::lines::{read_line, Line};
use crate::wire::sse;

/// How the bridge reaches the gateway.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// Gateway base URL, e.g. `http://127.0.0.1:7373`.
    pub gateway: String,
    /// Upstream server name (`/mcp/{server}`).
    pub server: String,
    /// Where the bearer token comes from.
    pub token: TokenSource,
    /// Longest stdin line accepted.
    pub max_line: usize,
    /// How long to keep retrying while the gateway refuses connections.
    pub reconnect_for: Duration,
}

/// Where the bridge's bearer token comes from. A token from a file or a
/// command is read again when the gateway answers 401 (an access token of
/// an identity provider expires), and the refused request is sent once
/// more: a 401 means nothing ran.
#[derive(Debug, Clone)]
pub(crate) enum TokenSource {
    /// `COUNTERSIGN_TOKEN`, read once.
    Fixed(String),
    /// A file holding the token (trailing whitespace removed).
    File(std::path::PathBuf),
    /// A command that prints the token (an identity provider's CLI), run
    /// with `sh -c`.
    Command(String),
}

impl TokenSource {
    /// The token now.
    pub(crate) async fn read(&self) -> anyhow::Result<String> {
        let token = match self {
            TokenSource::Fixed(t) => t.clone(),
            TokenSource::File(path) => tokio::fs::read_to_string(path)
                .await
                .with_context(|| format!("cannot read the token file {}", path.display()))?,
            TokenSource::Command(cmd) => {
                let out = tokio::process::Command::new("sh")
                    .arg("-c")
                    .arg(cmd)
                    .stdin(std::process::Stdio::null())
                    .stderr(std::process::Stdio::inherit())
                    .output()
                    .await
                    .with_context(|| format!("cannot run the token command `{cmd}`"))?;
                anyhow::ensure!(
                    out.status.success(),
                    "the token command `{cmd}` failed ({})",
                    out.status
                );
                String::from_utf8(out.stdout).context("the token command printed no text")?
            }
        };
        let token = token.trim().to_owned();
        anyhow::ensure!(!token.is_empty(), "the bearer token is empty");
        Ok(token)
    }

    /// Whether reading again can give another token.
    fn refreshes(&self) -> bool {
        !matches!(self, TokenSource::Fixed(_))
    }
}

struct State {
    opts: Options,
    /// The bearer token in use (read again after a 401).
    token: Mutex<String>,
    url: String,
    scope: String,
    http: reqwest::Client,
    out: mpsc::Sender<Vec<u8>>,
    session: Mutex<Option<String>>,
    protocol: Mutex<Option<String>>,
    init: Mutex<Option<Message>>,
    standalone: Mutex<Option<JoinHandle<()>>>,
    /// 2026-07-28 requests in flight, by client id: a client's
    /// `notifications/cancelled` closes the request's stream, which is how
    /// that era cancels over HTTP.
    in_flight: Mutex<HashMap<String, tokio::task::AbortHandle>>,
    reinit: tokio::sync::Mutex<()>,
}

/// Run the bridge until stdin closes.
pub(crate) async fn run(opts: Options) -> anyhow::Result<()> {
    let url = format!("{}/mcp/{}", opts.gateway.trim_end_matches('/'), opts.server);
    let scope = hex::encode(rand::random::<[u8; 16]>());
    let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(256);
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(mut line) = out_rx.recv().await {
            line.push(b'\n');
            if stdout.write_all(&line).await.is_err() || stdout.flush().await.is_err() {
                break;
            }
        }
    });
    let http = reqwest::Client::builder()
        .tcp_nodelay(true)
        .build()
        .context("cannot build the HTTP client")?;
    let token = opts.token.read().await?;
    let state = Arc::new(State {
        opts: opts.clone(),
        token: Mutex::new(token),
        url,
        scope,
        http,
        out: out_tx,
        session: Mutex::new(None),
        protocol: Mutex::new(None),
        init: Mutex::new(None),
        standalone: Mutex::new(None),
        in_flight: Mutex::new(HashMap::new()),
        reinit: tokio::sync::Mutex::new(()),
    });
    tracing::info!(server = %opts.server, gateway = %opts.gateway, scope = %state.scope, "stdio bridge started");

    let mut stdin = BufReader::new(tokio::io::stdin());
    let mut buf = Vec::new();
    let mut tasks = Vec::new();
    loop {
        match read_line(&mut stdin, &mut buf, opts.max_line).await? {
            Line::Eof => break,
            Line::TooLong => {
                let refusal = Rejection::LineTooLong {
                    limit: opts.max_line,
                };
                state.emit(&refusal.message(Value::Null)).await;
                continue;
            }
            Line::Line => {}
        }
        if buf.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let body = match parse_client_body(&buf) {
            Ok(b) => b,
            Err(e) => {
                // Answer and keep the pipe: one bad line must not end the session.
                state.emit(&Rejection::Parse(e).message(Value::Null)).await;
                continue;
            }
        };
        tasks.retain(|t: &JoinHandle<()>| !t.is_finished());
        if let Body::Single(msg) = &body {
            if state.cancels_modern(msg) {
                continue;
            }
        }
        let bytes = buf.clone();
        let st = state.clone();
        let task = tokio::spawn(async move { st.forward(body, bytes).await });
        tasks.push(task);
    }
    // stdin closed: let calls in flight finish (bounded), then end the session.
    let _ = tokio::time::timeout(
        Duration::from_secs(10),
        futures_util::future::join_all(tasks),
    )
    .await;
    if let Some(t) = state.standalone.lock().take() {
        t.abort();
    }
    let session = state.session.lock().clone();
    if let Some(sid) = session {
        let _ = state
            .request(reqwest::Method::DELETE)
            .header("mcp-session-id", sid)
            .send()
            .await;
    }
    drop(state);
    let _ = writer.await;
    Ok(())
}

enum Failure {
    /// The request never reached the gateway.
    Unreachable(String),
    /// It may have reached the gateway; the answer is lost.
    Broken(String),
}

impl State {
    async fn emit(&self, msg: &Message) {
        let _ = self.out.send(msg.to_bytes()).await;
    }

    fn request(&self, method: reqwest::Method) -> reqwest::RequestBuilder {
        self.http
            .request(method, &self.url)
            .bearer_auth(self.token.lock().clone())
            .header(SCOPE_HEADER, &self.scope)
    }

    /// A 2026-07-28 client cancels over stdio with a notification; towards
    /// the gateway that is closing the request's stream.
    fn cancels_modern(&self, msg: &Message) -> bool {
        if msg.method() != "notifications/cancelled" || self.session.lock().is_some() {
            return false;
        }
        let Some(id) = msg.params_value().and_then(|p| p.get("requestId").cloned()) else {
            return false;
        };
        if let Some(handle) = self.in_flight.lock().remove(&id.to_string()) {
            handle.abort();
            return true;
        }
        false
    }

    async fn forward(self: Arc<Self>, body: Body, bytes: Vec<u8>) {
        let single = match &body {
            Body::Single(m) => Some(m.clone()),
            Body::Batch(_) => None,
        };
        let modern = single
            .as_ref()
            .and_then(|m| declared_version(m.params_value().as_ref()));
        if let (Some(m), Some(_)) = (&single, &modern) {
            if m.kind() == Kind::Request {
                if let Some(id) = &m.id {
                    // Run as its own task, registered so that the client's
                    // cancellation can abort it (closing the stream).
                    let st = self.clone();
                    let m2 = m.clone();
                    let key = id.to_string();
                    let task = tokio::spawn(async move {
                        st.post_and_answer(&m2, bytes, modern.as_deref()).await
                    });
                    self.in_flight
                        .lock()
                        .insert(key.clone(), task.abort_handle());
                    let aborted = task.await.is_err();
                    self.in_flight.lock().remove(&key);
                    if aborted {
                        tracing::debug!(id = %key, "request cancelled by the client");
                    }
                    return;
                }
            }
        }
        match single {
            Some(m) => self.post_and_answer(&m, bytes, modern.as_deref()).await,
            None => {
                // Batches are relayed whole; the gateway answers each member.
                if let Err(Failure::Unreachable(e) | Failure::Broken(e)) =
                    self.post(bytes, None, None).await
                {
                    self.emit(&Rejection::BatchNotRelayed(e).message(Value::Null))
                        .await;
                }
            }
        }
    }

    async fn post_and_answer(&self, msg: &Message, bytes: Vec<u8>, modern: Option<&str>) {
        if msg.method() == "initialize" {
            *self.init.lock() = Some(msg.clone());
        }
        let result = self.post(bytes, Some(msg), modern).await;
        if msg.method() == "notifications/initialized" && result.is_ok() {
            self.open_standalone();
        }
        let Err(failure) = result else { return };
        let Some(id) = msg.id.clone() else {
            tracing::warn!(
                method = msg.method(),
                "a notification did not reach the gateway"
            );
            return;
        };
        let era = if modern.is_some() {
            Era::Modern
        } else {
            Era::Handshake
        };
        let answer = match failure {
            Failure::Unreachable(e) => answer::gateway_unreachable(id, msg.method(), &e, era),
            Failure::Broken(e) => answer::gateway_lost(id, msg.method(), &e, era),
        };
        self.emit(&answer).await;
    }

    /// POST one body and copy every message of the answer to stdout.
    async fn post(
        &self,
        bytes: Vec<u8>,
        msg: Option<&Message>,
        modern: Option<&str>,
    ) -> Result<(), Failure> {
        let mut reinitialized = false;
        let mut token_read_again = false;
        let deadline = tokio::time::Instant::now() + self.opts.reconnect_for;
        let mut backoff = Duration::from_millis(100);
        loop {
            let mut req = self
                .request(reqwest::Method::POST)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .body(bytes.clone());
            match (modern, msg) {
                (Some(version), Some(m)) => {
                    req = req
                        .header("mcp-protocol-version", version)
                        .header("mcp-method", m.method());
                    let field = match m.method() {
                        "tools/call" | "prompts/get" => Some("name"),
                        "resources/read" => Some("uri"),
                        _ => None,
                    };
                    if let Some(name) = field
                        .and_then(|f| m.params_value()?.get(f)?.as_str().map(encode_header_value))
                    {
                        req = req.header("mcp-name", name);
                    }
                }
                _ => {
                    if let Some(s) = self.session.lock().clone() {
                        req = req.header("mcp-session-id", s);
                    }
                    if let Some(p) = self.protocol.lock().clone() {
                        req = req.header("mcp-protocol-version", p);
                    }
                }
            }
            let resp = match req.send().await {
                Ok(r) => r,
                Err(e) if e.is_connect() => {
                    // Never reached the gateway: waiting and resending is safe.
                    let why = root_cause(&e);
                    if tokio::time::Instant::now() >= deadline {
                        return Err(Failure::Unreachable(format!(
                            "{}: {why}; gave up after --reconnect-for {}",
                            self.opts.gateway,
                            humantime::format_duration(self.opts.reconnect_for)
                        )));
                    }
                    tracing::warn!(
                        "the gateway at {} is not reachable ({why}); retrying for up to {} (--reconnect-for)",
                        self.opts.gateway,
                        humantime::format_duration(self.opts.reconnect_for)
                    );
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                    continue;
                }
                Err(e) => return Err(Failure::Broken(root_cause(&e))),
            };
            let status = resp.status();
            if status == reqwest::StatusCode::UNAUTHORIZED
                && self.opts.token.refreshes()
                && !token_read_again
            {
                // Refused before anything ran: read the token again (it may
                // have expired) and send the request once more.
                token_read_again = true;
                match self.opts.token.read().await {
                    Ok(t) => {
                        tracing::info!("the gateway refused the token: read it again");
                        *self.token.lock() = t;
                        continue;
                    }
                    Err(e) => tracing::warn!("the token could not be read again: {e:#}"),
                }
            }
            let had_session = self.session.lock().is_some();
            if status == reqwest::StatusCode::NOT_FOUND
                && had_session
                && modern.is_none()
                && !reinitialized
            {
                // The gateway no longer knows the session (it restarted): the
                // request was refused unprocessed, so re-initialize and resend.
                reinitialized = true;
                self.reinitialize().await?;
                continue;
            }
            if msg.is_some_and(|m| m.method() == "initialize") && status.is_success() {
                if let Some(s) = resp
                    .headers()
                    .get("mcp-session-id")
                    .and_then(|v| v.to_str().ok())
                {
                    *self.session.lock() = Some(s.to_owned());
                }
            }
            return self.copy_answer(resp, msg).await;
        }
    }

    async fn copy_answer(
        &self,
        resp: reqwest::Response,
        msg: Option<&Message>,
    ) -> Result<(), Failure> {
        let status = resp.status();
        if status == reqwest::StatusCode::ACCEPTED {
            return Ok(());
        }
        let is_sse = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if is_sse {
            let mut decoder = sse::Decoder::new(self.opts.max_line);
            let mut stream = resp.bytes_stream();
            let mut answered = false;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| Failure::Broken(e.to_string()))?;
                for ev in decoder
                    .feed(&chunk)
                    .map_err(|e| Failure::Broken(e.to_string()))?
                {
                    if let Ok(m) = Message::parse(ev.data.as_bytes()) {
                        answered |= m.kind() == Kind::Response;
                        self.observe(&m);
                        self.emit(&m).await;
                    }
                }
            }
            if !answered && msg.is_some_and(|m| m.kind() == Kind::Request) {
                return Err(Failure::Broken(
                    "the response stream ended without an answer".into(),
                ));
            }
            return Ok(());
        }
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| Failure::Broken(e.to_string()))?;
        match parse_body(&bytes) {
            // A notification gets no answer over stdio (JSON-RPC): the
            // gateway's refusal of one (a `tools/call` without an id, say)
            // goes to the log.
            Ok(Body::Single(m)) if msg.is_some_and(|r| r.kind() == Kind::Notification) => {
                let why = m
                    .error
                    .as_ref()
                    .and_then(|e| serde_json::from_str::<Value>(e.get()).ok())
                    .and_then(|e| e.get("message")?.as_str().map(str::to_owned))
                    .unwrap_or_default();
                tracing::warn!(
                    method = %crate::core::legible::text(msg.map_or("", |r| r.method())),
                    "the gateway refused a notification (HTTP {status}): {why}"
                );
                Ok(())
            }
            Ok(Body::Single(mut m)) => {
                // The gateway answers some refusals (401, 400) with id null; give
                // the client its own id back so it can match the answer.
                if m.id == Some(Value::Null) {
                    if let Some(id) = msg.and_then(|r| r.id.clone()) {
                        m.id = Some(id);
                    }
                }
                self.observe(&m);
                self.emit(&m).await;
                Ok(())
            }
            Ok(Body::Batch(ms)) => {
                for m in ms.into_iter().flatten() {
                    self.emit(&m).await;
                }
                Ok(())
            }
            Err(_) => {
                let id = msg.and_then(|m| m.id.clone()).unwrap_or(Value::Null);
                let refusal = Rejection::NoMessage {
                    status: status.as_u16(),
                };
                self.emit(&refusal.message(id)).await;
                Ok(())
            }
        }
    }

    /// Learn the negotiated version from an `initialize` answer.
    fn observe(&self, m: &Message) {
        let pending_init = self.init.lock().as_ref().and_then(|i| i.id.clone());
        if m.kind() == Kind::Response && m.id.is_some() && m.id == pending_init {
            let version = m
                .result
                .as_ref()
                .and_then(|r| serde_json::from_str::<Value>(r.get()).ok())
                .and_then(|v| v.get("protocolVersion")?.as_str().map(str::to_owned));
            if let Some(v) = version {
                *self.protocol.lock() = Some(v);
            }
        }
    }

    /// Re-run the client's `initialize` after a gateway restart; the answer
    /// stays inside the bridge (the client already has one).
    async fn reinitialize(&self) -> Result<(), Failure> {
        let stale = self.session.lock().clone();
        let _guard = self.reinit.lock().await;
        if *self.session.lock() != stale {
            return Ok(()); // another task already re-initialized
        }
        let Some(mut init) = self.init.lock().clone() else {
            return Err(Failure::Unreachable(
                "the session is gone and no initialize was seen to redo".into(),
            ));
        };
        init.id = Some(json!(format!("countersign-reinit-{}", self.scope)));
        *self.session.lock() = None;
        let resp = self
            .request(reqwest::Method::POST)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(init.to_bytes())
            .send()
            .await
            .map_err(|e| Failure::Unreachable(e.to_string()))?;
        let sid = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let Some(sid) = sid else {
            return Err(Failure::Unreachable(format!(
                "re-initialize failed with HTTP {}",
                resp.status()
            )));
        };
        *self.session.lock() = Some(sid.clone());
        let done = Message::notification("notifications/initialized", None);
        let mut req = self
            .request(reqwest::Method::POST)
            .header("content-type", "application/json")
            .header("mcp-session-id", sid)
            .body(done.to_bytes());
        if let Some(p) = self.protocol.lock().clone() {
            req = req.header("mcp-protocol-version", p);
        }
        req.send()
            .await
            .map_err(|e| Failure::Unreachable(e.to_string()))?;
        tracing::info!("gateway session re-established");
        self.open_standalone();
        Ok(())
    }

    /// Keep a standalone GET stream open for server-initiated messages.
    fn open_standalone(self: &State) {
        let Some(sid) = self.session.lock().clone() else {
            return;
        };
        let req = self
            .request(reqwest::Method::GET)
            .header("accept", "text/event-stream")
            .header("mcp-session-id", sid);
        let req = match self.protocol.lock().clone() {
            Some(p) => req.header("mcp-protocol-version", p),
            None => req,
        };
        let out = self.out.clone();
        let max = self.opts.max_line;
        let task = tokio::spawn(async move {
            let Ok(resp) = req.send().await else { return };
            if !resp.status().is_success() {
                return;
            }
            let mut decoder = sse::Decoder::new(max);
            let mut stream = resp.bytes_stream();
            while let Some(Ok(chunk)) = stream.next().await {
                let Ok(events) = decoder.feed(&chunk) else {
                    return;
                };
                for ev in events {
                    if Message::parse(ev.data.as_bytes()).is_ok() {
                        let _ = out.send(ev.data.into_bytes()).await;
                    }
                }
            }
        });
        if let Some(old) = self.standalone.lock().replace(task) {
            old.abort();
        }
    }
}

/// The innermost cause of an error, which names what happened ("Connection
/// refused (os error 111)") where reqwest's own text only says "error
/// sending request for url".
fn root_cause(e: &dyn std::error::Error) -> String {
    let mut cause: &dyn std::error::Error = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}
