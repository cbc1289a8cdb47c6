//! Traces (DESIGN.md section 18): the spans of one MCP request, named and
//! attributed as the OpenTelemetry MCP semantic conventions ask, and the
//! W3C trace context they continue and pass on.
//!
//! Off unless `serve` turns it on ([`enable`], from `[telemetry]` or the
//! `OTEL_*` variables): every span helper then returns
//! [`tracing::Span::none`], which costs a branch, and no message is touched.
//! On, spans are `tracing` spans of target [`TARGET`], which only the
//! OpenTelemetry layer sees (the log lines keep their form, and gain the
//! `trace_id` and `span_id` of the call they were written in); the export
//! itself (`cli::telemetry`) never waits on a call.
//!
//! Never in a span: argument values or results (unless the operator opts
//! in), idempotency keys (a digest only), tokens, credentials. Only the
//! names and ids listed in docs/operations.md, Tracing, are recorded.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::wire::jsonrpc::Message;
use crate::wire::trace::{TraceContext, TRACEPARENT, TRACESTATE};

/// The `tracing` target of every span made for traces.
pub const TARGET: &str = "countersign::trace";

static ON: AtomicBool = AtomicBool::new(false);
static ARGUMENTS: AtomicBool = AtomicBool::new(false);
static RESULTS: AtomicBool = AtomicBool::new(false);

/// Whether traces are on.
#[inline]
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Turn traces on (once the OpenTelemetry layer is installed), recording
/// tool arguments and results only when the operator opted in.
pub fn enable(arguments: bool, results: bool) {
    ARGUMENTS.store(arguments, Ordering::Relaxed);
    RESULTS.store(results, Ordering::Relaxed);
    ON.store(true, Ordering::Relaxed);
}

/// Whether `gen_ai.tool.call.arguments` is recorded (opt-in).
pub fn records_arguments() -> bool {
    ARGUMENTS.load(Ordering::Relaxed)
}

/// Whether `gen_ai.tool.call.result` is recorded (opt-in).
pub fn records_results() -> bool {
    RESULTS.load(Ordering::Relaxed)
}

/// What became of finished spans: sent to the collector, dropped because
/// the queue was full (the collector slow or down), or lost in an export
/// the collector refused or never answered.
#[derive(Debug, Default)]
pub struct Counts {
    exported: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
}

static COUNTS: Counts = Counts {
    exported: AtomicU64::new(0),
    dropped: AtomicU64::new(0),
    failed: AtomicU64::new(0),
};

/// The process's span counts (`/metrics`: `countersign_trace_spans`).
pub fn counts() -> &'static Counts {
    &COUNTS
}

impl Counts {
    /// `n` spans reached the collector.
    pub fn exported(&self, n: usize) {
        self.exported.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// One span did not fit the queue. True the first time (the one that
    /// is logged).
    pub fn dropped(&self) -> bool {
        self.dropped.fetch_add(1, Ordering::Relaxed) == 0
    }

    /// `n` spans were lost with a failed export.
    pub fn failed(&self, n: usize) {
        self.failed.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// `(exported, dropped, failed)`.
    pub fn read(&self) -> (u64, u64, u64) {
        (
            self.exported.load(Ordering::Relaxed),
            self.dropped.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}

/// A stage of a call, as a span under the current one (`Span::none()` when
/// traces are off): `stage!("decision", countersign.decision = Empty)`.
#[macro_export]
#[doc(hidden)]
macro_rules! stage {
    ($name:literal $(, $($field:tt)*)?) => {
        if $crate::telemetry::on() {
            tracing::info_span!(target: "countersign::trace", $name, otel.kind = "internal" $(, $($field)*)?)
        } else {
            tracing::Span::none()
        }
    };
}
pub use stage;

/// The SERVER span of one MCP request from a client (`Span::none()` when
/// traces are off), named `{mcp.method.name} {target}`: the tool's or the
/// prompt's name, when the request names one.
pub fn server_span(req: &Message, request: &Request<'_>) -> Span {
    if !on() {
        return Span::none();
    }
    let method = req.method();
    let params = req.params_value();
    let Named { tool, prompt, name } = named(method, params.as_ref());
    let id = req.id.as_ref().and_then(|id| match id {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    });
    let span = tracing::info_span!(
        target: "countersign::trace",
        "mcp request",
        otel.name = %name,
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
        mcp.method.name = %method,
        mcp.protocol.version = request.protocol_version.as_deref(),
        mcp.session.id = request.session_id,
        mcp.resource.uri = tracing::field::Empty,
        jsonrpc.request.id = id,
        gen_ai.operation.name = tool.as_ref().map(|_| "execute_tool"),
        gen_ai.tool.name = tool,
        gen_ai.prompt.name = prompt,
        gen_ai.tool.call.arguments = tracing::field::Empty,
        gen_ai.tool.call.result = tracing::field::Empty,
        client.address = request.client.map(|a| a.ip().to_string()),
        client.port = request.client.map(|a| i64::from(a.port())),
        network.transport = "tcp",
        network.protocol.name = "http",
        error.type = tracing::field::Empty,
        rpc.response.status_code = tracing::field::Empty,
        countersign.server = %request.server,
        countersign.outcome = tracing::field::Empty,
        countersign.replayed = tracing::field::Empty,
        countersign.proposal = tracing::field::Empty,
        countersign.task = tracing::field::Empty,
        countersign.key_digest = tracing::field::Empty,
    );
    if method == "resources/read" || method == "resources/subscribe" {
        if let Some(uri) = params
            .as_ref()
            .and_then(|p| p.get("uri")?.as_str().map(str::to_owned))
        {
            span.record("mcp.resource.uri", uri);
        }
    }
    // The context in `params._meta` is the parent (the MCP conventions);
    // the HTTP header's, when it differs, is the transport's: linked.
    let meta = crate::wire::trace::from_meta(params.as_ref());
    let parent = meta.as_ref().or(request.header.as_ref());
    if let Some(cx) = parent.and_then(extract) {
        let _ = span.set_parent(cx);
    }
    if let (Some(_), Some(header)) = (&meta, &request.header) {
        if let Some(cx) = extract(header) {
            span.add_link(cx.span().span_context().clone());
        }
    }
    // The sampler decides now, when the span is built: a request whose
    // trace is dropped makes no other span (they would be built, recorded
    // and dropped too), and its upstream gets the client's context as it
    // came.
    if !span.context().span().span_context().is_sampled() {
        return Span::none();
    }
    span
}

/// The tool or prompt a request names, and its span's name:
/// `{mcp.method.name} {target}`, or the method alone.
struct Named {
    tool: Option<String>,
    prompt: Option<String>,
    name: String,
}

fn named(method: &str, params: Option<&serde_json::Value>) -> Named {
    let name_param = || params.and_then(|p| p.get("name")?.as_str().map(str::to_owned));
    let (tool, prompt) = match method {
        "tools/call" => (name_param(), None),
        "prompts/get" => (None, name_param()),
        _ => (None, None),
    };
    let name = match tool.as_deref().or(prompt.as_deref()) {
        Some(target) => format!("{method} {target}"),
        None => method.to_owned(),
    };
    Named { tool, prompt, name }
}

/// What the front end knows of a request for its span.
#[derive(Debug, Clone, Default)]
pub struct Request<'a> {
    /// The configured server it is for.
    pub server: &'a str,
    /// The peer's socket address.
    pub client: Option<std::net::SocketAddr>,
    /// The HTTP `traceparent`/`tracestate` headers.
    pub header: Option<TraceContext>,
    /// The handshake-era session.
    pub session_id: Option<&'a str>,
    /// The MCP protocol version in use.
    pub protocol_version: Option<String>,
}

/// A CLIENT span for a request to an upstream, under the current span, and
/// the context to send with it. Nothing (and nothing sent) when traces are
/// off or the request belongs to no traced call (the gateway's own health
/// checks start no trace).
pub fn client_span(
    server: &str,
    req: &Message,
    peer: Option<(&str, u16)>,
) -> Option<(Span, TraceContext)> {
    if !on() || Span::current().is_none() {
        return None;
    }
    let method = req.method();
    let Named { tool, name, .. } = named(method, req.params_value().as_ref());
    let span = tracing::info_span!(
        target: "countersign::trace",
        "upstream request",
        otel.name = %name,
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
        mcp.method.name = %method,
        gen_ai.operation.name = tool.as_ref().map(|_| "execute_tool"),
        gen_ai.tool.name = tool,
        server.address = peer.map(|(h, _)| h),
        server.port = peer.map(|(_, p)| i64::from(p)),
        network.transport = if peer.is_some() { "tcp" } else { "pipe" },
        error.type = tracing::field::Empty,
        rpc.response.status_code = tracing::field::Empty,
        countersign.server = %server,
        countersign.delegated = tracing::field::Empty,
    );
    let ctx = traceparent(&span)?;
    Some((span, ctx))
}

/// The W3C context of `span`, to send on (`None` without a valid one).
pub fn traceparent(span: &Span) -> Option<TraceContext> {
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = std::collections::HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    Some(TraceContext {
        traceparent: carrier.remove(TRACEPARENT)?,
        tracestate: carrier.remove(TRACESTATE).filter(|s| !s.is_empty()),
    })
}

/// The trace and span ids of `span` in hex (`None` without a valid one):
/// what a log line written in it carries.
pub fn ids(span: &Span) -> Option<(String, String)> {
    if span.is_none() {
        return None;
    }
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid()
        .then(|| (sc.trace_id().to_string(), sc.span_id().to_string()))
}

/// The context `ctx` names, if it is a valid W3C trace context (an invalid
/// one is ignored: the request starts a trace of its own).
fn extract(ctx: &TraceContext) -> Option<opentelemetry::Context> {
    let mut carrier = std::collections::HashMap::new();
    carrier.insert(TRACEPARENT.to_owned(), ctx.traceparent.clone());
    if let Some(state) = &ctx.tracestate {
        carrier.insert(TRACESTATE.to_owned(), state.clone());
    }
    let cx = TraceContextPropagator::new().extract(&carrier);
    cx.span().span_context().is_valid().then_some(cx)
}

/// Link `span` to the span whose context is `traceparent` (a call retried
/// after its approval, to the call that asked for it).
pub fn link(span: &Span, traceparent: &str) {
    let ctx = TraceContext {
        traceparent: traceparent.to_owned(),
        tracestate: None,
    };
    if let Some(cx) = extract(&ctx) {
        span.add_link(cx.span().span_context().clone());
    }
}

/// Record what an answer says on `span`: `error.type` (the JSON-RPC error
/// code, or `tool_error` for a result with `isError`), the status, and
/// the result when the operator opted in.
pub fn record_answer(span: &Span, answer: &Message) {
    if span.is_none() {
        return;
    }
    if let Some(error) = &answer.error {
        #[derive(serde::Deserialize)]
        struct RpcError {
            code: Option<i64>,
            message: Option<String>,
        }
        let e: Option<RpcError> = serde_json::from_str(error.get()).ok();
        let code = e
            .as_ref()
            .and_then(|e| e.code)
            .map_or_else(|| "_OTHER".to_owned(), |c| c.to_string());
        span.record("error.type", code.as_str());
        span.record("rpc.response.status_code", code.as_str());
        span.record("otel.status_code", "error");
        if let Some(message) = e.and_then(|e| e.message) {
            span.record("otel.status_description", message);
        }
        return;
    }
    if let Some(result) = &answer.result {
        #[derive(serde::Deserialize)]
        struct ToolResult {
            #[serde(rename = "isError", default)]
            is_error: bool,
        }
        let is_error = serde_json::from_str::<ToolResult>(result.get())
            .map(|r| r.is_error)
            .unwrap_or(false);
        if is_error {
            span.record("error.type", "tool_error");
            span.record("otel.status_code", "error");
        }
        if records_results() {
            span.record("gen_ai.tool.call.result", result.get());
        }
    }
}

/// Record a failure without an answer (a timeout, a lost connection) on
/// `span`.
pub fn record_failure(span: &Span, kind: &'static str, description: &str) {
    span.record("error.type", kind);
    span.record("otel.status_code", "error");
    span.record("otel.status_description", description);
}

/// `sha256:` and the hex digest of `key`: an idempotency key in a trace.
pub fn key_digest(key: &str) -> String {
    use sha2::Digest;
    format!(
        "sha256:{}",
        hex::encode(sha2::Sha256::digest(key.as_bytes()))
    )
}
