//! `countersign.toml`: the gateway's configuration (DESIGN.md section 10).
//!
//! Parsing is strict: unknown keys are rejected (a misspelled `read_only`
//! silently ignored would turn a guarded write into an unguarded one), and
//! every error carries the file, line and column that `toml` reports.

mod delegation;
mod guards;
mod limits;
mod review;
mod tasks;
mod tools;
pub use delegation::{mode, DelegationConfig, Fallback, Grant, Mode, Unavailable};
pub use guards::{BudgetConfig, EffectKeyConfig, Over, Per};
pub use limits::Limits;
pub use review::{console_of, console_origin, ReviewConfig};
pub use tasks::TasksConfig;
pub use tools::{ToolConfig, VersionProbe};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};

fn read_hint(e: &std::io::Error) -> &'static str {
    if e.kind() == std::io::ErrorKind::NotFound {
        " (pass --config FILE; examples/countersign.toml is a start)"
    } else {
        ""
    }
}

/// Why a configuration file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read. The I/O error is in the message only
    /// (not a `source`), so a report of the error chain says it once.
    #[error("cannot read config file `{path}`: {error}{}", read_hint(error))]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// The file is not valid TOML or does not match the schema.
    #[error("invalid config file `{path}`:\n{message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// `toml`'s message, which names line and column and shows the line.
        message: String,
    },
    /// The file parses but a value is not acceptable.
    #[error("invalid config file `{path}`: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong and what to do.
        message: String,
    },
}

/// The whole configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The `[gateway]` table.
    #[serde(default)]
    pub gateway: GatewayConfig,
    /// `[[identities]]`: bearer tokens (as SHA-256) and who they stand for.
    #[serde(default)]
    pub identities: Vec<IdentityConfig>,
    /// `[servers.NAME]`: the upstream MCP servers.
    #[serde(default)]
    pub servers: BTreeMap<String, ServerConfig>,
    /// `[limits]`: input size limits.
    #[serde(default)]
    pub limits: Limits,
    /// `[idempotency]`: how long ledger answers are kept.
    #[serde(default)]
    pub idempotency: IdempotencyConfig,
    /// `[retry]`: retries of read-only calls.
    #[serde(default)]
    pub retry: RetryConfig,
    /// `[circuit]`: the per-upstream circuit breaker.
    #[serde(default)]
    pub circuit: CircuitConfig,
    /// `[catalog]`: the gateway's own view of each upstream's tools.
    #[serde(default)]
    pub catalog: CatalogConfig,
    /// `[approvals]`: proposals, holding and the control API.
    #[serde(default)]
    pub approvals: ApprovalsConfig,
    /// `[audit]`: the tamper-evident audit log.
    #[serde(default)]
    pub audit: AuditConfig,
    /// `[store]`: where the ledger, proposals and outbox live.
    #[serde(default)]
    pub store: StoreConfig,
    /// `[metrics]`: `/metrics` for Prometheus.
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// `[auth]`: OAuth 2.1 access tokens from identity providers.
    #[serde(default)]
    pub auth: AuthConfig,
    /// `[notify]`: reviewer notifications to webhooks and chat.
    #[serde(default)]
    pub notify: NotifyConfig,
    /// `[telemetry]`: OpenTelemetry traces.
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// `[review]`: the reviewer web console.
    #[serde(default)]
    pub review: ReviewConfig,
    /// `[policy]`: a shadow policy set.
    #[serde(default)]
    pub policy: PolicyConfig,
    /// `[tasks]`: held calls as MCP tasks.
    #[serde(default)]
    pub tasks: TasksConfig,
    /// `[[budgets]]`: spending allowed unattended per window.
    #[serde(default)]
    pub budgets: Vec<BudgetConfig>,
    /// `[[effect_keys]]`: the same business effect twice is held.
    #[serde(default)]
    pub effect_keys: Vec<EffectKeyConfig>,
}

/// `[policy]` (DESIGN.md section 22).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// A second policy folder decided beside `gateway.policies` on every
    /// call and never enforced: its disagreements are counted and audited.
    pub shadow: Option<PathBuf>,
    /// Keep what each call's decision needed (principal, groups, tenant,
    /// tool, annotations, definition-changed, the arguments as Cedar saw
    /// them) in the store, for `policy diff BASE HEAD`. Off by default.
    pub inputs: bool,
    /// How long decision inputs are kept.
    #[serde(deserialize_with = "duration")]
    pub inputs_retention: Duration,
    /// Most decision inputs kept; the oldest go first.
    pub inputs_max_rows: usize,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            shadow: None,
            inputs: false,
            inputs_retention: Duration::from_secs(7 * 24 * 3600),
            inputs_max_rows: 100_000,
        }
    }
}

/// `[telemetry]` (DESIGN.md section 18): OpenTelemetry traces over
/// OTLP/HTTP (protobuf). Off unless an endpoint is given, here or in the
/// standard `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`)
/// variable; what is set here wins over the variables.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// `false` keeps traces off even when an `OTEL_*` endpoint is set.
    pub enabled: Option<bool>,
    /// The collector's base url (`http://collector:4318`); spans go to its
    /// `/v1/traces`, as with `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub endpoint: Option<String>,
    /// `service.name` (default: `OTEL_SERVICE_NAME`, else `countersign`).
    pub service_name: Option<String>,
    /// The sampler, named as `OTEL_TRACES_SAMPLER` names it (default: that
    /// variable, else `parentbased_always_on`).
    pub sampler: Option<String>,
    /// The ratio of the `traceidratio` samplers (as `OTEL_TRACES_SAMPLER_ARG`).
    pub sampler_arg: Option<f64>,
    /// Record each call's arguments (`gen_ai.tool.call.arguments`). Off:
    /// they may hold personal data or secrets.
    pub arguments: bool,
    /// Record each tool result (`gen_ai.tool.call.result`). Off, as above.
    pub results: bool,
    /// Finished spans waiting for export at most; more are dropped and
    /// counted (`countersign_trace_spans{result="dropped"}`).
    pub max_queue: usize,
    /// Spans per export request at most.
    pub max_batch: usize,
    /// How long finished spans wait to fill a batch.
    #[serde(deserialize_with = "duration")]
    pub export_interval: Duration,
    /// How long one export request may take.
    #[serde(deserialize_with = "duration")]
    pub timeout: Duration,
    /// TLS to an https collector (as `[servers.NAME.tls]`).
    pub tls: Option<UpstreamTls>,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            enabled: None,
            endpoint: None,
            service_name: None,
            sampler: None,
            sampler_arg: None,
            arguments: false,
            results: false,
            max_queue: 2048,
            max_batch: 512,
            export_interval: Duration::from_secs(2),
            timeout: Duration::from_secs(10),
            tls: None,
        }
    }
}

/// The sampler names of `OTEL_TRACES_SAMPLER` that countersign takes.
pub const SAMPLERS: [&str; 6] = [
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
];

impl TelemetryConfig {
    /// `[telemetry]`: an http(s) endpoint, a known sampler with a ratio in
    /// [0, 1], a queue and a batch of at least one span.
    fn check(&self, path: &Path) -> Result<(), ConfigError> {
        if let Some(url) = &self.endpoint {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(invalid(
                    path,
                    format!("telemetry.endpoint `{url}` must be an http:// or https:// url"),
                ));
            }
        }
        if let Some(s) = &self.sampler {
            if !SAMPLERS.contains(&s.as_str()) {
                return Err(invalid(
                    path,
                    format!(
                        "telemetry.sampler `{s}` is not one of {}",
                        SAMPLERS.join(", ")
                    ),
                ));
            }
        }
        if let Some(r) = self.sampler_arg {
            if !(0.0..=1.0).contains(&r) {
                return Err(invalid(
                    path,
                    format!("telemetry.sampler_arg {r} must be between 0 and 1"),
                ));
            }
        }
        if self.max_queue == 0 || self.max_batch == 0 {
            return Err(invalid(
                path,
                "telemetry.max_queue and telemetry.max_batch must be at least 1".into(),
            ));
        }
        if self.timeout.is_zero() || self.export_interval.is_zero() {
            return Err(invalid(
                path,
                "telemetry.timeout and telemetry.export_interval must be more than 0".into(),
            ));
        }
        Ok(())
    }
}

/// `[notify]` (DESIGN.md section 19): webhooks told of proposals and
/// incidents, durably and at least once, each event with a stable id.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NotifyConfig {
    /// `[[notify.webhooks]]`.
    pub webhooks: Vec<WebhookConfig>,
    /// How long an event is retried before it is given up (and that is
    /// recorded).
    #[serde(deserialize_with = "duration")]
    pub retry_for: Duration,
    /// The longest wait between two attempts (the backoff doubles up to it,
    /// with jitter).
    #[serde(deserialize_with = "duration")]
    pub max_backoff: Duration,
    /// How long one request may take. A gateway leases a notice it sends
    /// for three times this; another takes it over once that lapses.
    #[serde(deserialize_with = "duration")]
    pub timeout: Duration,
}

impl Default for NotifyConfig {
    fn default() -> Self {
        NotifyConfig {
            webhooks: Vec::new(),
            retry_for: Duration::from_secs(24 * 3600),
            max_backoff: Duration::from_secs(300),
            timeout: Duration::from_secs(10),
        }
    }
}

/// What a webhook is told of.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, serde::Serialize,
)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A call waits for approval.
    ProposalCreated,
    /// Approved (or a quorum met), denied, or an approval withdrawn.
    ProposalDecided,
    /// A proposal or its approval expired.
    ProposalExpired,
    /// A write's answer was lost: it waits for `reconcile`.
    OutcomeUnknown,
    /// A tool's definition changed, and its calls are held.
    ToolsChanged,
    /// An upstream's circuit opened.
    CircuitOpen,
}

impl EventKind {
    /// Every kind, in order.
    pub const ALL: [EventKind; 6] = [
        EventKind::ProposalCreated,
        EventKind::ProposalDecided,
        EventKind::ProposalExpired,
        EventKind::OutcomeUnknown,
        EventKind::ToolsChanged,
        EventKind::CircuitOpen,
    ];

    /// Its wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::ProposalCreated => "proposal_created",
            EventKind::ProposalDecided => "proposal_decided",
            EventKind::ProposalExpired => "proposal_expired",
            EventKind::OutcomeUnknown => "outcome_unknown",
            EventKind::ToolsChanged => "tools_changed",
            EventKind::CircuitOpen => "circuit_open",
        }
    }
}

/// How a webhook's body is written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WebhookFormat {
    /// The event as JSON.
    #[default]
    Json,
    /// A Slack-compatible incoming-webhook message (`text` and Block Kit
    /// `blocks`; Mattermost and others accept it too).
    Slack,
}

/// One `[[notify.webhooks]]` entry. Its `Debug` form leaves out the url:
/// a chat webhook's url is its secret.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// A short name (metrics, `check`, the audit log).
    pub name: String,
    /// Where events are POSTed: `https://`, or `http://` on a loopback host.
    pub url: String,
    /// The kinds it wants (default: all).
    #[serde(default = "all_event_kinds")]
    pub events: Vec<EventKind>,
    /// Only events of these tenants (default: every tenant). Events of no
    /// tenant (a circuit, a tool change) go to every webhook that wants them.
    #[serde(default)]
    pub tenants: Vec<String>,
    /// `json` (default) or `slack`.
    #[serde(default)]
    pub format: WebhookFormat,
    /// The HMAC-SHA256 signing secret, given as a credential
    /// (`{ env = "VAR" }`, `{ file = "PATH" }`).
    pub secret: Credential,
    /// Put the call's arguments in the event (default: only their digest).
    #[serde(default)]
    pub include_arguments: bool,
    /// With `include_arguments`: argument names whose values are replaced
    /// by their digest.
    #[serde(default)]
    pub redact: Vec<String>,
    /// How the receiver's certificate is checked (as `[servers.S.tls]`).
    pub tls: Option<UpstreamTls>,
}

impl std::fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("name", &self.name)
            .field("url", &"(not shown)")
            .field("events", &self.events)
            .field("tenants", &self.tenants)
            .field("format", &self.format)
            .field("secret", &self.secret)
            .field("include_arguments", &self.include_arguments)
            .field("redact", &self.redact)
            .finish_non_exhaustive()
    }
}

fn all_event_kinds() -> Vec<EventKind> {
    EventKind::ALL.to_vec()
}

impl NotifyConfig {
    /// `[notify]`: plain, distinct names; https (or loopback) urls; at
    /// least one event each; a retry window of at least a second.
    fn check(&self, path: &Path) -> Result<(), ConfigError> {
        let mut names = std::collections::BTreeSet::new();
        for (i, w) in self.webhooks.iter().enumerate() {
            let at = format!("notify.webhooks[{i}] (`{}`)", w.name);
            plain_new_name(&mut names, &w.name, &at, path)?;
            // A proposal's facts sent in clear to afar would be anyone's.
            if !https_or_loopback(&w.url) {
                return Err(invalid(
                    path,
                    format!(
                        "{at}: url `{}` must be https:// (http:// only on a loopback host)",
                        w.url
                    ),
                ));
            }
            if w.events.is_empty() {
                return Err(invalid(path, format!("{at}: events is empty")));
            }
            if !w.redact.is_empty() && !w.include_arguments {
                return Err(invalid(
                    path,
                    format!("{at}: redact has no effect without include_arguments = true"),
                ));
            }
        }
        if self.retry_for < Duration::from_secs(1)
            || self.max_backoff < Duration::from_secs(1)
            || self.timeout < Duration::from_secs(1)
        {
            return Err(invalid(
                path,
                "notify.retry_for, notify.max_backoff and notify.timeout must be at least 1s"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// `[auth]`: the gateway as an OAuth 2.1 resource server (DESIGN.md section
/// 17). Each `[[auth.issuers]]` is an identity provider whose JWT access
/// tokens are accepted beside the static `[[identities]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// The identity providers.
    pub issuers: Vec<IssuerConfig>,
    /// How far `exp` and `nbf` may be off (clock skew between the provider
    /// and the gateway).
    #[serde(deserialize_with = "duration")]
    pub leeway: Duration,
    /// The least time between two fetches of one issuer's keys: a token
    /// naming an unknown `kid` fetches them again at most this often, so a
    /// flood of forged `kid`s cannot turn the gateway against the provider.
    #[serde(deserialize_with = "duration")]
    pub refetch_interval: Duration,
    /// Keys older than this are fetched again on the next token (the cached
    /// ones stay in use while the provider cannot be reached).
    #[serde(deserialize_with = "duration")]
    pub keys_max_age: Duration,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            issuers: Vec::new(),
            leeway: Duration::from_secs(30),
            refetch_interval: Duration::from_secs(30),
            keys_max_age: Duration::from_secs(3600),
        }
    }
}

/// One `[[auth.issuers]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssuerConfig {
    /// A short name: principals from this issuer are `NAME:SUBJECT`.
    pub name: String,
    /// The issuer identifier, compared with `iss` exactly. `https://`, or
    /// `http://` on a loopback host (a local provider in tests).
    pub issuer: String,
    /// The issuer's keys from a file (a JWKS document) instead of discovery.
    pub jwks_file: Option<PathBuf>,
    /// The JWKS URL instead of discovery (`/.well-known/openid-configuration`,
    /// then `/.well-known/oauth-authorization-server`).
    pub jwks_uri: Option<String>,
    /// The audiences accepted; default: the gateway's public URL and the
    /// server's resource URL (`{public_url}/mcp/{server}`).
    #[serde(default)]
    pub audience: Vec<String>,
    /// The claim naming the principal.
    #[serde(default = "default_principal_claim")]
    pub principal_claim: String,
    /// The claim naming the tenant (`tenant`, `org_id`, `tid`, ...).
    pub tenant_claim: Option<String>,
    /// A fixed tenant for every token of this issuer (a single-tenant
    /// provider), instead of `tenant_claim`.
    pub tenant: Option<String>,
    /// The tenants this issuer may speak for (empty: any). A token naming
    /// another tenant is refused (401): one provider cannot mint tokens for
    /// a tenant another provider serves.
    #[serde(default)]
    pub tenants: Vec<String>,
    /// The claim listing the principal's groups (`groups`, `roles`).
    pub groups_claim: Option<String>,
    /// Scopes a server requires of this issuer's tokens, by server name
    /// (`"*"`: every server without an entry of its own).
    #[serde(default)]
    pub scopes: BTreeMap<String, Vec<String>>,
    /// Accept `typ: JWT` (or none) as well as `at+jwt`: for providers that
    /// do not yet mark access tokens as RFC 9068 asks.
    #[serde(default)]
    pub accept_plain_jwt: bool,
    /// How the provider's certificate is checked when its metadata and keys
    /// are fetched (`ca_file` for a provider behind a private CA, `roots`,
    /// a client certificate); the same settings as `[servers.S.tls]`.
    pub tls: Option<UpstreamTls>,
}

fn default_principal_claim() -> String {
    "sub".into()
}

/// Whether `url` is `https://`, or `http://` on a loopback host.
pub fn https_or_loopback(url: &str) -> bool {
    if url.starts_with("https://") {
        return true;
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = match host.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
        _ => host,
    };
    matches!(host, "localhost" | "127.0.0.1" | "[::1]")
}

/// `[metrics]`: `/metrics` on the gateway's listener, for a scraper that
/// presents its own bearer token (not an agent's: the metrics name servers
/// and tools, and an agent has no business reading them).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// SHA-256 (hex) of the scraper's bearer token. Without it `/metrics`
    /// answers 404.
    pub token_sha256: Option<String>,
}

/// How arguments are recorded (`audit.arguments`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArgumentMode {
    /// The canonical arguments as sent.
    Full,
    /// Only their digest.
    Digest,
    /// The arguments with the values at `audit.redact` pointers replaced by
    /// their digest.
    Redact,
}

/// `[audit]` (DESIGN.md section 8).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// Where the log lives (default `gateway.data_dir/audit`).
    pub dir: Option<PathBuf>,
    /// `full`, `digest` or `redact`: how `tools/call` arguments are
    /// recorded. Their digest is always recorded.
    pub arguments: ArgumentMode,
    /// With `redact`: JSON pointers into the arguments whose values are
    /// replaced by their digest.
    pub redact: Vec<String>,
    /// A signed checkpoint after this many entries.
    pub checkpoint_every: u64,
    /// A signed checkpoint after this long with unsigned entries.
    #[serde(deserialize_with = "duration")]
    pub checkpoint_interval: Duration,
    /// A new segment file once the current one reaches this size.
    pub segment_bytes: u64,
    /// The origin line of the log's checkpoints and the name of its key
    /// (a schema-less URL is recommended; default `countersign/` and the
    /// gateway id).
    pub origin: Option<String>,
    /// A witness that cosigns each checkpoint (C2SP tlog-witness).
    pub witness: Option<WitnessConfig>,
}

/// `[audit.witness]`: where checkpoints are submitted, and the witness's
/// cosignature key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WitnessConfig {
    /// The submission prefix: `add-checkpoint` is posted below it.
    pub url: String,
    /// The witness's verifier key (`name+id+base64(0x04 || key)`).
    pub key: String,
    /// How long one submission may take.
    #[serde(deserialize_with = "duration", default = "witness_timeout")]
    pub timeout: Duration,
    /// For an `https://` url: the same keys as an upstream's `tls` table.
    #[serde(default)]
    pub tls: Option<UpstreamTls>,
}

fn witness_timeout() -> Duration {
    Duration::from_secs(10)
}

impl AuditConfig {
    /// The pointers whose argument values are kept out of every record
    /// (none unless `arguments = "redact"`; see [`crate::core::redact`]).
    pub fn redaction(&self) -> &[String] {
        match self.arguments {
            ArgumentMode::Redact => &self.redact,
            _ => &[],
        }
    }
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            dir: None,
            arguments: ArgumentMode::Full,
            redact: Vec::new(),
            checkpoint_every: 1000,
            checkpoint_interval: Duration::from_secs(60),
            segment_bytes: 64 << 20,
            origin: None,
            witness: None,
        }
    }
}

impl Config {
    /// The audit log's directory.
    pub fn audit_dir(&self) -> PathBuf {
        self.audit
            .dir
            .clone()
            .unwrap_or_else(|| self.gateway.data_dir.join("audit"))
    }
}

/// `[approvals]` (DESIGN.md section 6).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApprovalsConfig {
    /// Longest life of an approval; a reviewer may choose shorter (`--ttl`).
    #[serde(deserialize_with = "duration")]
    pub ttl: Duration,
    /// How long a call that needs approval is held waiting for a decision
    /// before it answers `approval_pending` (`"0s"`: answer at once).
    #[serde(deserialize_with = "duration")]
    pub hold: Duration,
    /// Progress notifications to a held call that sent a `progressToken`.
    #[serde(deserialize_with = "duration")]
    pub progress_interval: Duration,
    /// A new proposal that differs from one of the same requester and tool
    /// made within this window is flagged as its revision.
    #[serde(deserialize_with = "duration")]
    pub revision_window: Duration,
    /// A proposal nobody decides expires after this.
    #[serde(deserialize_with = "duration")]
    pub pending_ttl: Duration,
    /// Serve `/v1` to non-loopback peers too. Off by default: reviewers reach
    /// the control API from the gateway's host (or through an SSH tunnel).
    pub remote_control: bool,
    /// How far a signed control request's time may be from the gateway's
    /// clock (bounds the replay of a captured request).
    #[serde(deserialize_with = "duration")]
    pub clock_skew: Duration,
    /// Most proposals one requester may have waiting; beyond it a call that
    /// would make a new one is refused (flooding reviewers is a denial of
    /// service).
    pub max_pending: usize,
    /// The reviewers file, when it is not `reviewers.toml` in the policy
    /// folder: for example under the data dir, out of git, on a machine
    /// where the policies are a checkout. Hot-reloaded with the policies; a
    /// missing file means no reviewers (nothing can be approved).
    pub reviewers: Option<PathBuf>,
    /// Ask the person at the client (MCP elicitation, or a 2026-07-28
    /// `input_required` result) when the policies permit
    /// `Action::"confirm"` for the call and the client declared
    /// elicitation. `false`: only reviewers approve, whatever the policies
    /// say about `confirm`.
    pub client: bool,
    /// How long a question to the client stays answerable: the life of an
    /// `elicitation/create` the gateway sent, and the expiry signed into a
    /// `requestState`.
    #[serde(deserialize_with = "duration")]
    pub client_ttl: Duration,
}

impl Default for ApprovalsConfig {
    fn default() -> Self {
        ApprovalsConfig {
            ttl: Duration::from_secs(15 * 60),
            hold: Duration::from_secs(60),
            progress_interval: Duration::from_secs(5),
            revision_window: Duration::from_secs(3600),
            pending_ttl: Duration::from_secs(24 * 3600),
            remote_control: false,
            clock_skew: Duration::from_secs(120),
            max_pending: 20,
            reviewers: None,
            client: true,
            client_ttl: Duration::from_secs(5 * 60),
        }
    }
}

/// `[retry]`: read-only tools are retried after transport failures and
/// transient errors; writes never are once dispatched.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// Backoff before the first retry (doubles, with full jitter).
    #[serde(deserialize_with = "duration")]
    pub base_delay: Duration,
    /// Largest backoff.
    #[serde(deserialize_with = "duration")]
    pub max_delay: Duration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_attempts: 3,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
        }
    }
}

/// `[catalog]`: how fresh the gateway keeps each upstream's tool list.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CatalogConfig {
    /// A call finding its server's list older than this fetches it again
    /// first (one fetch at a time per server).
    #[serde(deserialize_with = "duration")]
    pub max_age: Duration,
    /// A call naming a tool the list lacks fetches it again, but not more
    /// often than this per server (a client naming random tools must not
    /// turn every call into a `tools/list`).
    #[serde(deserialize_with = "duration")]
    pub unknown_tool_interval: Duration,
}

impl Default for CatalogConfig {
    fn default() -> Self {
        CatalogConfig {
            max_age: Duration::from_secs(5 * 60),
            unknown_tool_interval: Duration::from_secs(1),
        }
    }
}

/// `[circuit]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CircuitConfig {
    /// Consecutive upstream failures that open the circuit.
    pub failure_threshold: u32,
    /// How long it stays open before one trial call.
    #[serde(deserialize_with = "duration")]
    pub cooldown: Duration,
}

impl Default for CircuitConfig {
    fn default() -> Self {
        CircuitConfig {
            failure_threshold: 5,
            cooldown: Duration::from_secs(30),
        }
    }
}

/// `[idempotency]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdempotencyConfig {
    /// How long answers to explicit keys are kept (a promise).
    #[serde(deserialize_with = "duration")]
    pub retention: Duration,
    /// How long answers to derived keys are kept: an identical write from the
    /// same principal in the same scope within this time is a retry.
    #[serde(deserialize_with = "duration")]
    pub derived_ttl: Duration,
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        IdempotencyConfig {
            retention: Duration::from_secs(24 * 3600),
            derived_ttl: Duration::from_secs(300),
        }
    }
}

/// `[store]`: without `url`, redb in `gateway.data_dir` (one gateway); with
/// `url = "postgres://…"`, PostgreSQL, shared by several gateways.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `postgres://USER@HOST:PORT/DATABASE` (no password here).
    pub url: Option<String>,
    /// The database password, from the environment or a file (a
    /// [`Credential`]); never written in the config itself.
    pub password: Option<Credential>,
    /// Connections in the pool.
    pub pool_size: usize,
    /// This gateway's lease in the database: renewed every third of it; a
    /// gateway that could not renew it for this long dispatches nothing, and
    /// other gateways settle its calls in flight as `unknown`.
    #[serde(deserialize_with = "duration")]
    pub lease: Duration,
    /// `[store.tls]`: how the database's certificate is checked (and the
    /// client certificate shown) when `url` says `sslmode=require`.
    pub tls: Option<UpstreamTls>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            url: None,
            password: None,
            pool_size: 16,
            lease: Duration::from_secs(10),
            tls: None,
        }
    }
}

/// `[gateway]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatewayConfig {
    /// Listen address (loopback by default).
    pub listen: SocketAddr,
    /// Where durable state lives.
    pub data_dir: PathBuf,
    /// Folder of Cedar policies.
    pub policies: PathBuf,
    /// Extra `Origin` values accepted besides loopback origins (DNS-rebinding
    /// defence: browsers send `Origin`, and a page from another origin must not
    /// reach a gateway on localhost).
    pub allowed_origins: Vec<String>,
    /// How long a stopping upstream child gets after stdin closes and after
    /// SIGTERM before it is killed.
    #[serde(deserialize_with = "duration")]
    pub shutdown_grace: Duration,
    /// A client session with no request for this long is closed and its
    /// upstream shut down.
    #[serde(deserialize_with = "duration")]
    pub session_idle_timeout: Duration,
    /// A client must send a request's whole header within this time, or
    /// its connection is closed (a client that trickles a header in byte by
    /// byte would otherwise hold a connection open forever).
    #[serde(deserialize_with = "duration")]
    pub header_read_timeout: Duration,
    /// A client must send a request's whole body within this time once its
    /// header is in, or it is answered 408 and nothing runs (a body trickled
    /// in at a byte a second would otherwise hold a connection and a
    /// request slot for as long as it likes).
    #[serde(deserialize_with = "duration")]
    pub body_read_timeout: Duration,
    /// SSE polling (the 2025-11-25 transport): a handshake-era answer
    /// stream still open after this long is closed after the events sent so
    /// far (the first of them an id and a `retry`); the client resumes it
    /// with a GET and `Last-Event-ID` and gets the rest, the answer
    /// included. Frees connections held by long calls. Off by default.
    #[serde(default, deserialize_with = "optional_duration")]
    pub sse_poll_after: Option<Duration>,
    /// PEM certificate chain for TLS on the listener (with `tls_key`); the
    /// files are watched and a new pair is taken without a restart.
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// The URL clients reach the gateway at (`https://gw.example.com`):
    /// the resource in RFC 9728 metadata and the default token audience.
    /// Default: `http://` (or `https://` with `tls_cert`) and `listen`.
    pub public_url: Option<String>,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7373)),
            data_dir: PathBuf::from(".countersign"),
            policies: PathBuf::from("policies"),
            allowed_origins: Vec::new(),
            shutdown_grace: Duration::from_secs(2),
            session_idle_timeout: Duration::from_secs(30 * 60),
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(10),
            sse_poll_after: None,
            tls_cert: None,
            tls_key: None,
            public_url: None,
        }
    }
}

impl GatewayConfig {
    /// The URL clients reach the gateway at, without a trailing `/`.
    pub fn public_url(&self) -> String {
        match &self.public_url {
            Some(u) => u.trim_end_matches('/').to_owned(),
            None => {
                let scheme = if self.tls_cert.is_some() {
                    "https"
                } else {
                    "http"
                };
                format!("{scheme}://{}", self.listen)
            }
        }
    }
}

/// One `[[identities]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentityConfig {
    /// Hex SHA-256 of the bearer token (the token itself is never stored).
    pub token_sha256: String,
    /// Who the token stands for.
    pub principal: String,
    /// The principal's tenant.
    pub tenant: String,
    /// Groups, for policies.
    #[serde(default)]
    pub groups: Vec<String>,
}

/// One `[servers.NAME]` table: exactly one of `command` and `url`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Program to spawn for a stdio upstream.
    pub command: Option<String>,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment variables for the child (each a [`Credential`]:
    /// written here, or read from the gateway's environment or a file).
    #[serde(default)]
    pub env: BTreeMap<String, Credential>,
    /// Working directory of the child.
    pub cwd: Option<PathBuf>,
    /// Streamable HTTP endpoint of an HTTP upstream.
    pub url: Option<String>,
    /// Static headers sent to an HTTP upstream (the gateway's own credentials
    /// for it; the client's token is never forwarded). Each a [`Credential`].
    #[serde(default)]
    pub headers: BTreeMap<String, Credential>,
    /// TLS to an `https://` upstream (roots, private CA, client certificate).
    pub tls: Option<UpstreamTls>,
    /// How long one call may take upstream.
    #[serde(default = "default_call_timeout", deserialize_with = "duration")]
    pub call_timeout: Duration,
    /// Per-tool operator overrides.
    #[serde(default)]
    pub tools: BTreeMap<String, ToolConfig>,
    /// Bridge the wire eras (default true): 2026-07-28 clients of a server
    /// that speaks only the handshake era go through a handshake-era session
    /// the gateway holds for them, and handshake-era clients of a server
    /// that speaks only 2026-07-28 go over its 2026-07-28 connection. Off:
    /// such clients get the standard version error, or the server's refusal
    /// of `initialize`.
    #[serde(default = "yes")]
    pub bridge_eras: bool,
    /// Tool calls reach this HTTP server as the person who asked, with a
    /// token exchanged at their identity provider (RFC 8693), not with
    /// `headers`.
    pub delegation: Option<DelegationConfig>,
}

fn yes() -> bool {
    true
}

/// `[servers.S.tls]`: how the gateway checks an `https://` upstream, and the
/// certificate it shows it. Hostname verification and SNI are always on;
/// there is no switch to turn verification off.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTls {
    /// PEM file of the CA certificate(s) that sign the upstream's
    /// certificate (a private CA).
    pub ca_file: Option<PathBuf>,
    /// Which public roots to trust besides `ca_file`: `webpki` (Mozilla's,
    /// built in), `system` (the host's store) or `none`. Default: `webpki`
    /// without a `ca_file`, `none` with one.
    pub roots: Option<TlsRoots>,
    /// PEM certificate chain for mutual TLS.
    pub client_cert: Option<PathBuf>,
    /// PEM private key for `client_cert` (keep it readable by the gateway's
    /// user only).
    pub client_key: Option<PathBuf>,
}

/// Public root certificates an upstream's certificate may chain to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TlsRoots {
    /// Mozilla's roots, built into the binary.
    Webpki,
    /// The host's certificate store.
    System,
    /// None: only `ca_file`.
    None,
}

/// A value the gateway gives an upstream (a header, a child's environment
/// variable), usually a credential: written in the config, or read when a
/// connection is made from the gateway's environment or from a file, so that
/// the secret itself stays out of the config file.
///
/// ```toml
/// headers = { Authorization = { env = "GITHUB_TOKEN", prefix = "Bearer " } }
/// headers = { "X-Api-Key" = { file = "/run/secrets/stripe" } }
/// headers = { "X-Team" = "payments" }
/// ```
///
/// Its `Debug` form never shows a value, so it cannot reach a log by way of
/// a printed configuration.
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    /// Written in the config.
    Literal(String),
    /// The gateway's environment variable `var`, after `prefix`.
    Env {
        /// The variable.
        var: String,
        /// Put before the value (`"Bearer "`).
        prefix: String,
    },
    /// The contents of `path` (trailing newlines removed), after `prefix`.
    File {
        /// The file.
        path: PathBuf,
        /// Put before the value.
        prefix: String,
    },
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::Literal(_) => f.write_str("Credential::Literal(<redacted>)"),
            Credential::Env { var, .. } => write!(f, "Credential::Env({var})"),
            Credential::File { path, .. } => write!(f, "Credential::File({})", path.display()),
        }
    }
}

impl<'de> Deserialize<'de> for Credential {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Table(BTreeMap<String, String>),
        }
        use serde::de::Error;
        let table = match Raw::deserialize(d).map_err(|_| {
            D::Error::custom(
                "expected a string, or a table { env = \"VAR\" } or { file = \"PATH\" } with an optional prefix",
            )
        })? {
            Raw::Text(t) => return Ok(Credential::Literal(t)),
            Raw::Table(t) => t,
        };
        if let Some(k) = table
            .keys()
            .find(|k| !["env", "file", "prefix"].contains(&k.as_str()))
        {
            return Err(D::Error::custom(format!(
                "unknown key `{k}` (expected `env` or `file`, and optionally `prefix`)"
            )));
        }
        let prefix = table.get("prefix").cloned().unwrap_or_default();
        match (table.get("env"), table.get("file")) {
            (Some(var), None) if !var.is_empty() => Ok(Credential::Env {
                var: var.clone(),
                prefix,
            }),
            (None, Some(path)) if !path.is_empty() => Ok(Credential::File {
                path: PathBuf::from(path),
                prefix,
            }),
            _ => Err(D::Error::custom(
                "give exactly one of `env` (a variable name) and `file` (a path)",
            )),
        }
    }
}

fn default_call_timeout() -> Duration {
    Duration::from_secs(30)
}

fn optional_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    humantime::parse_duration(&text).map_err(|e| {
        serde::de::Error::custom(format!(
            "`{text}` is not a duration ({e}); write it like \"30s\", \"5m\" or \"250ms\""
        ))
    })
}

impl Config {
    /// The upstream `call_timeout` of `server` (30 s for a server that is
    /// not configured, which no call reaches).
    pub fn call_timeout(&self, server: &str) -> std::time::Duration {
        self.servers
            .get(server)
            .map_or(std::time::Duration::from_secs(30), |c| c.call_timeout)
    }

    /// Parse and check configuration text; `path` is used in messages and
    /// to resolve relative paths of stdio children.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        config.check(path)?;
        Ok(config)
    }

    /// Every section's checks, in the order their errors are reported.
    fn check(&self, path: &Path) -> Result<(), ConfigError> {
        self.store.check(path)?;
        self.gateway.check(path)?;
        for (name, server) in &self.servers {
            server.check(name, path)?;
        }
        self.metrics.check(&self.identities, path)?;
        for (i, id) in self.identities.iter().enumerate() {
            id.check(i, path)?;
        }
        self.retry.check(path)?;
        self.limits.check(path)?;
        self.audit.check(path)?;
        self.approvals.check(path)?;
        for (name, server) in &self.servers {
            tools::check(&server.tools, name, path)?;
        }
        self.auth.check(&self.identities, path)?;
        for (name, server) in &self.servers {
            if let Some(d) = &server.delegation {
                d.check(name, server.url.is_some(), &self.auth.issuers, path)?;
            }
        }
        self.notify.check(path)?;
        self.telemetry.check(path)?;
        self.review.check(path)?;
        self.tasks.check(path)?;
        guards::check(&self.budgets, &self.effect_keys, path)?;
        Ok(())
    }
}

impl AuthConfig {
    /// `[auth]`: issuers with plain, distinct names, https (or loopback),
    /// one source of keys at most, a tenant from a claim or fixed, and
    /// static principals that cannot be mistaken for an issuer's.
    fn check(&self, identities: &[IdentityConfig], path: &Path) -> Result<(), ConfigError> {
        let mut names = std::collections::BTreeSet::new();
        for (i, iss) in self.issuers.iter().enumerate() {
            let at = format!("auth.issuers[{i}] (`{}`)", iss.name);
            plain_new_name(&mut names, &iss.name, &at, path)?;
            // Keys fetched over plain HTTP from afar could be anyone's.
            let urls = [
                Some(("issuer", &iss.issuer)),
                iss.jwks_uri.as_ref().map(|u| ("jwks_uri", u)),
            ];
            if let Some((field, url)) = urls
                .into_iter()
                .flatten()
                .find(|(_, u)| !https_or_loopback(u))
            {
                return Err(invalid(
                    path,
                    format!(
                        "{at}: {field} `{url}` must be https:// (http:// only on a loopback host)"
                    ),
                ));
            }
            if iss.jwks_uri.is_some() && iss.jwks_file.is_some() {
                return Err(invalid(
                    path,
                    format!("{at}: set jwks_uri or jwks_file, not both"),
                ));
            }
            if iss.tenant_claim.is_some() == iss.tenant.is_some() {
                return Err(invalid(
                    path,
                    format!("{at}: set exactly one of tenant_claim (the claim naming the tenant) and tenant (one tenant for every token)"),
                ));
            }
            if iss.principal_claim.is_empty() {
                return Err(invalid(
                    path,
                    format!("{at}: principal_claim may not be empty"),
                ));
            }
        }
        if !self.issuers.is_empty() {
            // `NAME:SUBJECT` is an issuer's principal: a static one with a
            // `:` could pass for it.
            if let Some(id) = identities.iter().find(|i| i.principal.contains(':')) {
                return Err(invalid(
                    path,
                    format!(
                        "identities: principal `{}` contains `:`, which names an issuer's principals (NAME:SUBJECT) once [[auth.issuers]] are configured",
                        id.principal
                    ),
                ));
            }
        }
        if self.refetch_interval < Duration::from_secs(1) {
            return Err(invalid(
                path,
                "auth.refetch_interval must be at least 1s".into(),
            ));
        }
        if self.leeway > Duration::from_secs(300) {
            return Err(invalid(path, "auth.leeway must be at most 5m".into()));
        }
        Ok(())
    }
}

/// A non-empty name of letters, digits, `-` and `_` only.
fn is_plain(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// `name` (of the entry `at`) uses only letters, digits, `-` and `_`, and
/// no earlier entry of its list has it: names go into principals, labels
/// and log lines.
fn plain_new_name(
    names: &mut std::collections::BTreeSet<String>,
    name: &str,
    at: &str,
    path: &Path,
) -> Result<(), ConfigError> {
    if !is_plain(name) {
        return Err(invalid(
            path,
            format!("{at}: name may only use letters, digits, `-` and `_`"),
        ));
    }
    if !names.insert(name.to_owned()) {
        return Err(invalid(path, format!("{at}: the name is used twice")));
    }
    Ok(())
}

/// A value of `path` that is not acceptable: what is wrong and what to do.
fn invalid(path: &Path, message: String) -> ConfigError {
    ConfigError::Invalid {
        path: path.to_owned(),
        message,
    }
}

impl StoreConfig {
    /// `[store]`: a PostgreSQL url without a password in it, a lease and a pool.
    fn check(&self, path: &Path) -> Result<(), ConfigError> {
        let Some(url) = &self.url else {
            return Ok(());
        };
        if !url.starts_with("postgres://") && !url.starts_with("postgresql://") {
            return Err(invalid(
                path,
                format!("store.url `{url}` must start with postgres://"),
            ));
        }
        // A password in the url would sit in the config file and in logs.
        let authority = url
            .split("://")
            .nth(1)
            .and_then(|r| r.split('/').next())
            .unwrap_or_default();
        if authority.contains(':') && authority.contains('@') {
            let userinfo = authority.split('@').next().unwrap_or_default();
            if userinfo.contains(':') {
                return Err(invalid(path, "store.url holds a password: give it with store.password = { env = \"VAR\" } or { file = \"PATH\" }"
                        .into(),));
            }
        }
        if self.lease < Duration::from_millis(300) {
            return Err(invalid(
                path,
                "store.lease must be at least 300ms (it is renewed every third of it)".into(),
            ));
        }
        if self.pool_size == 0 {
            return Err(invalid(path, "store.pool_size must be at least 1".into()));
        }
        Ok(())
    }
}

impl GatewayConfig {
    /// `[gateway]`: TLS files in pairs, a header timeout.
    fn check(&self, path: &Path) -> Result<(), ConfigError> {
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(invalid(
                path,
                "gateway.tls_cert and gateway.tls_key go together: set both, or neither".into(),
            ));
        }
        if self.header_read_timeout.is_zero() {
            return Err(invalid(path, "gateway.header_read_timeout must be more than 0s (a header that never ends holds its connection)"
                    .into(),));
        }
        if self.body_read_timeout.is_zero() {
            return Err(invalid(
                path,
                "gateway.body_read_timeout must be more than 0s (a body that never ends holds its connection)".into(),
            ));
        }
        Ok(())
    }
}

impl ServerConfig {
    /// `[servers.NAME]`: a plain name, one transport, TLS only for https.
    fn check(&self, name: &str, path: &Path) -> Result<(), ConfigError> {
        // Server names become URL path segments (`/mcp/{name}`) and Cedar
        // entity ids: keep them to a plain alphabet.
        if !is_plain(name) {
            return Err(invalid(
                path,
                format!("server name `{name}` may only use letters, digits, `-` and `_`"),
            ));
        }
        match (&self.command, &self.url) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    path,
                    format!("[servers.{name}] sets both `command` and `url`; keep one"),
                ))
            }
            (None, None) => {
                return Err(invalid(
                    path,
                    format!(
                        "[servers.{name}] needs `command` (stdio child) or `url` (Streamable HTTP)"
                    ),
                ))
            }
            (None, Some(url)) => {
                let https = url.starts_with("https://");
                if !https && !url.starts_with("http://") {
                    return Err(invalid(
                        path,
                        format!("[servers.{name}] url `{url}` must start with https:// or http://"),
                    ));
                }
                if !https && self.tls.is_some() {
                    return Err(invalid(
                        path,
                        format!(
                        "[servers.{name}] has a [tls] table but its url `{url}` is not https://"
                    ),
                    ));
                }
            }
            (Some(_), None) => {
                if self.tls.is_some() {
                    return Err(invalid(
                        path,
                        format!(
                        "[servers.{name}] is a stdio server: [tls] applies to https:// urls only"
                    ),
                    ));
                }
            }
        }
        if let Some(tls) = &self.tls {
            if tls.client_cert.is_some() != tls.client_key.is_some() {
                return Err(invalid(
                    path,
                    format!(
                    "[servers.{name}.tls] needs both `client_cert` and `client_key`, or neither"
                ),
                ));
            }
        }
        if self.call_timeout.is_zero() {
            return Err(invalid(
                path,
                format!("[servers.{name}] call_timeout must be more than zero"),
            ));
        }
        Ok(())
    }
}

impl MetricsConfig {
    /// `[metrics]`: a token hash of its own.
    fn check(&self, identities: &[IdentityConfig], path: &Path) -> Result<(), ConfigError> {
        let Some(t) = &self.token_sha256 else {
            return Ok(());
        };
        if t.len() != 64 || !t.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(invalid(path, "metrics.token_sha256 must be 64 hex digits; compute it with `printf %s \"$TOKEN\" | sha256sum`"
                    .into(),));
        }
        if identities
            .iter()
            .any(|i| i.token_sha256.eq_ignore_ascii_case(t))
        {
            return Err(invalid(path, "metrics.token_sha256 is also an identity's token: give the scraper a token of its own".into(),));
        }
        Ok(())
    }
}

impl IdentityConfig {
    /// `[[identities]]` entry `i`: a token hash, a principal and a tenant.
    fn check(&self, i: usize, path: &Path) -> Result<(), ConfigError> {
        let hex_ok = self.token_sha256.len() == 64
            && self.token_sha256.chars().all(|c| c.is_ascii_hexdigit());
        if !hex_ok {
            return Err(invalid(
                path,
                format!(
                    "identities[{i}] (principal `{}`): token_sha256 must be 64 hex digits; \
                 compute it with `printf %s \"$TOKEN\" | sha256sum`",
                    self.principal
                ),
            ));
        }
        if self.principal.is_empty() || self.tenant.is_empty() {
            return Err(invalid(
                path,
                format!("identities[{i}]: principal and tenant must not be empty"),
            ));
        }
        Ok(())
    }
}

impl RetryConfig {
    /// `[retry]`: at least one attempt.
    fn check(&self, path: &Path) -> Result<(), ConfigError> {
        if self.max_attempts == 0 {
            return Err(invalid(
                path,
                "retry.max_attempts counts the first attempt too: it must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

impl AuditConfig {
    /// `[audit]`: checkpoints, segments, redaction, origin and witness.
    fn check(&self, path: &Path) -> Result<(), ConfigError> {
        let au = self;
        if au.checkpoint_every == 0 || au.checkpoint_interval.is_zero() {
            return Err(invalid(
                path,
                "audit.checkpoint_every and audit.checkpoint_interval must be more than zero"
                    .into(),
            ));
        }
        if au.segment_bytes < 4096 {
            return Err(invalid(
                path,
                "audit.segment_bytes must be at least 4096".into(),
            ));
        }
        if let Some(p) = au.redact.iter().find(|p| !p.starts_with('/')) {
            return Err(invalid(
                path,
                format!("audit.redact `{p}` is not a JSON pointer (it starts with `/`)"),
            ));
        }
        if let Some(o) = &au.origin {
            // C2SP signed-note key names: no spaces, no `+`.
            if o.is_empty() || o.chars().any(|c| c.is_whitespace() || c == '+') {
                return Err(invalid(path, format!("audit.origin `{o}` may not be empty or hold spaces or `+` (it names the checkpoints' key)")));
            }
        }
        if let Some(w) = &au.witness {
            if !(w.url.starts_with("http://") || w.url.starts_with("https://")) {
                return Err(invalid(
                    path,
                    format!(
                        "audit.witness.url `{}` must be an http:// or https:// URL",
                        w.url
                    ),
                ));
            }
            // The key itself is parsed when the gateway starts (`serve`).
        }
        if !au.redact.is_empty() && au.arguments != ArgumentMode::Redact {
            return Err(invalid(path, "audit.redact is set but audit.arguments is not \"redact\": set arguments = \"redact\" (or drop the pointers)".into()));
        }
        Ok(())
    }
}

impl ApprovalsConfig {
    /// `[approvals]`: expiries and intervals within their bounds.
    fn check(&self, path: &Path) -> Result<(), ConfigError> {
        let a = self;
        if a.ttl.is_zero() {
            return Err(invalid(path, "approvals.ttl must be more than zero (an approval that is born expired approves nothing)".into()));
        }
        // A zero interval would turn a held call into a busy loop of
        // progress notifications.
        if a.progress_interval < Duration::from_millis(100) {
            return Err(invalid(
                path,
                "approvals.progress_interval must be at least 100ms".into(),
            ));
        }
        if a.max_pending == 0 {
            return Err(invalid(
                path,
                "approvals.max_pending must be at least 1".into(),
            ));
        }
        // A question that expires before a person can read it approves
        // nothing; one that lives for hours is a long replay window.
        if a.client_ttl < Duration::from_secs(10) || a.client_ttl > Duration::from_secs(3600) {
            return Err(invalid(path, "approvals.client_ttl must be between 10s and 1h: it is how long a question to the person at the client stays answerable".into()));
        }
        if a.clock_skew < Duration::from_secs(1) || a.clock_skew > Duration::from_secs(600) {
            return Err(invalid(path, "approvals.clock_skew must be between 1s and 10m: it bounds how long a captured control request can be replayed".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("test.toml"))
    }

    #[test]
    fn webhooks_are_https_named_once_and_ask_for_something() {
        let ok = "[[notify.webhooks]]\nname = \"ops\"\nurl = \"https://hooks.example.com/x\"\n\
                  secret = { env = \"S\" }\n";
        let c = parse(ok).unwrap();
        assert_eq!(
            c.notify.webhooks[0].events.len(),
            6,
            "every kind by default"
        );
        assert_eq!(c.notify.webhooks[0].format, WebhookFormat::Json);
        assert_eq!(c.notify.retry_for, Duration::from_secs(86_400));
        let cases = [
            (
                ok.replace("https://hooks.example.com/x", "http://hooks.example.com/x"),
                "must be https://",
            ),
            (format!("{ok}{ok}"), "used twice"),
            (format!("{ok}events = []\n"), "events is empty"),
            (format!("{ok}redact = [\"card\"]\n"), "redact has no effect"),
            (
                ok.replace("name = \"ops\"", "name = \"o p\""),
                "name may only use",
            ),
            (
                format!("{ok}events = [\"proposal_made\"]\n"),
                "unknown variant",
            ),
            (format!("[notify]\nretry_for = \"0s\"\n{ok}"), "at least 1s"),
        ];
        for (text, says) in cases {
            let e = parse(&text).unwrap_err().to_string();
            assert!(e.contains(says), "{says}: {e}");
        }
    }

    #[test]
    fn issuers_are_https_named_once_with_one_tenant_source() {
        let ok = "[[auth.issuers]]\nname = \"okta\"\nissuer = \"https://idp.example.com\"\ntenant_claim = \"tid\"\n";
        let c = parse(ok).unwrap();
        assert_eq!(c.auth.issuers[0].principal_claim, "sub");
        assert_eq!(c.gateway.public_url(), "http://127.0.0.1:7373");
        let local = ok.replace("https://idp.example.com", "http://127.0.0.1:9000");
        assert!(parse(&local).is_ok(), "a loopback issuer is for tests");
        let cases = [
            (ok.replace("https://idp.example.com", "http://idp.example.com"), "must be https://"),
            (format!("{ok}jwks_uri = \"http://idp.example.com/keys\"\n"), "jwks_uri `http://idp.example.com/keys` must be https://"),
            (ok.replace("tenant_claim = \"tid\"", "tenant_claim = \"tid\"\ntenant = \"acme\""), "exactly one of tenant_claim"),
            (ok.replace("tenant_claim = \"tid\"\n", ""), "exactly one of tenant_claim"),
            (ok.replace("name = \"okta\"", "name = \"ok ta\""), "name may only use"),
            (format!("{ok}{ok}"), "used twice"),
            (format!("{ok}[[identities]]\ntoken_sha256 = \"{}\"\nprincipal = \"okta:alice\"\ntenant = \"t\"\n", "a".repeat(64)), "contains `:`"),
        ];
        for (text, says) in cases {
            let e = parse(&text).unwrap_err().to_string();
            assert!(e.contains(says), "{says}: {e}");
        }
        let public = parse("[gateway]\npublic_url = \"https://gw.example.com/\"\n").unwrap();
        assert_eq!(public.gateway.public_url(), "https://gw.example.com");
    }

    #[test]
    fn header_read_timeout_and_catalog_and_cache_ttl_parse_and_a_zero_timeout_is_refused() {
        let c = parse(
            "[gateway]\nheader_read_timeout = \"3s\"\n[catalog]\nmax_age = \"1m\"\n\
             [servers.s]\ncommand = \"x\"\n[servers.s.tools.t]\ncache_ttl = \"30s\"\n",
        )
        .unwrap();
        assert_eq!(c.gateway.header_read_timeout, Duration::from_secs(3));
        assert_eq!(c.catalog.max_age, Duration::from_secs(60));
        assert_eq!(c.catalog.unknown_tool_interval, Duration::from_secs(1));
        assert_eq!(
            c.servers["s"].tools["t"].cache_ttl,
            Some(Duration::from_secs(30))
        );
        let e = parse("[gateway]\ntls_cert = \"/c.pem\"\n").unwrap_err();
        assert!(e.to_string().contains("go together"), "{e}");
        let t = parse("[gateway]\ntls_cert = \"/c.pem\"\ntls_key = \"/k.pem\"\n").unwrap();
        assert_eq!(t.gateway.tls_key, Some(PathBuf::from("/k.pem")));
        let e = parse("[gateway]\nheader_read_timeout = \"0s\"\n").unwrap_err();
        assert!(e.to_string().contains("header_read_timeout"), "{e}");
    }

    #[test]
    fn defaults_are_loopback() {
        let c = parse("").unwrap();
        assert!(c.gateway.listen.ip().is_loopback());
        assert_eq!(c.limits.max_depth, 64);
    }

    #[test]
    fn approval_settings_are_checked() {
        let err = parse("[approvals]\nprogress_interval = \"0s\"\n").unwrap_err();
        assert!(err.to_string().contains("progress_interval"), "{err}");
        let err = parse("[approvals]\nttl = \"0s\"\n").unwrap_err();
        assert!(err.to_string().contains("approvals.ttl"), "{err}");
        let err = parse("[approvals]\nhold = \"soon\"\n").unwrap_err();
        assert!(err.to_string().contains("not a duration"), "{err}");
        let err = parse(
            "[servers.p]\ncommand = \"x\"\n[servers.p.tools.t]\nversion_probe = { tool = \"r\", arguments = { id = \"account\" }, pointer = \"/v\" }\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("not a JSON pointer"), "{err}");
        let c = parse("[approvals]\nhold = \"0s\"\nremote_control = true\n").unwrap();
        assert!(c.approvals.hold.is_zero() && c.approvals.remote_control);
        assert_eq!(c.approvals.reviewers, None);
        let c = parse("[approvals]\nreviewers = \".countersign/reviewers.toml\"\n").unwrap();
        assert_eq!(
            c.approvals.reviewers.as_deref(),
            Some(std::path::Path::new(".countersign/reviewers.toml"))
        );
    }

    #[test]
    fn unknown_key_names_its_line() {
        let err = parse("[gateway]\nlisten = \"127.0.0.1:1\"\nlsten = 3\n").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("line 3"), "{text}");
        assert!(text.contains("lsten"), "{text}");
    }

    #[test]
    fn misspelled_tool_override_is_refused() {
        let err =
            parse("[servers.p]\ncommand = \"x\"\n[servers.p.tools.charge]\nreadonly = true\n")
                .unwrap_err();
        assert!(err.to_string().contains("readonly"), "{err}");
    }

    #[test]
    fn server_needs_exactly_one_transport() {
        assert!(parse("[servers.p]\n")
            .unwrap_err()
            .to_string()
            .contains("needs `command`"));
        let both = parse("[servers.p]\ncommand=\"x\"\nurl=\"http://a\"\n").unwrap_err();
        assert!(both.to_string().contains("both"));
    }

    #[test]
    fn tls_and_credentials_parse_and_misuse_is_named() {
        let ok = parse(
            "[servers.p]\nurl=\"https://a/mcp\"\nheaders = { Authorization = { env = \"T\", prefix = \"Bearer \" } }\n[servers.p.tls]\nca_file=\"/ca.pem\"\nroots=\"system\"\n",
        )
        .unwrap();
        let p = &ok.servers["p"];
        assert_eq!(p.tls.as_ref().unwrap().roots, Some(TlsRoots::System));
        assert_eq!(
            p.headers["Authorization"],
            Credential::Env {
                var: "T".into(),
                prefix: "Bearer ".into()
            }
        );
        let e = parse("[servers.p]\nurl=\"http://a\"\n[servers.p.tls]\nca_file=\"/ca.pem\"\n")
            .unwrap_err();
        assert!(e.to_string().contains("is not https://"), "{e}");
        let e = parse("[servers.p]\nurl=\"https://a\"\n[servers.p.tls]\nclient_cert=\"/c.pem\"\n")
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("both `client_cert` and `client_key`"),
            "{e}"
        );
        let e =
            parse("[servers.p]\nurl=\"https://a\"\n[servers.p.tls]\ninsecure=true\n").unwrap_err();
        assert!(e.to_string().contains("insecure"), "no such switch: {e}");
        let e = parse("[servers.p]\nurl=\"ftp://a\"\n").unwrap_err();
        assert!(e.to_string().contains("https:// or http://"), "{e}");
        let e = parse(
            "[servers.p]\nurl=\"http://a\"\nheaders = { A = { env = \"X\", file = \"/f\" } }\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("exactly one of `env`"), "{e}");
    }

    #[test]
    fn bad_duration_and_hash() {
        let e = parse("[servers.p]\ncommand=\"x\"\ncall_timeout=\"soon\"\n").unwrap_err();
        assert!(e.to_string().contains("not a duration"), "{e}");
        let e = parse("[[identities]]\ntoken_sha256=\"abc\"\nprincipal=\"a\"\ntenant=\"t\"\n")
            .unwrap_err();
        assert!(e.to_string().contains("64 hex digits"), "{e}");
    }

    #[test]
    fn full_example_parses() {
        let c = parse(
            r#"
[gateway]
listen = "127.0.0.1:7373"
[[identities]]
token_sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
principal = "agent-7"
tenant = "acme"
groups = ["agents"]
[servers.payments]
command = "python3"
args = ["server.py"]
call_timeout = "30s"
[servers.payments.tools.charge_card]
read_only = false
version_probe = { tool = "get_account", arguments = { id = "/account" }, pointer = "/structuredContent/version" }
"#,
        )
        .unwrap();
        assert_eq!(c.approvals.ttl, Duration::from_secs(900));
        assert_eq!(c.approvals.hold, Duration::from_secs(60));
        let tool = &c.servers["payments"].tools["charge_card"];
        assert_eq!(tool.read_only, Some(false));
        assert_eq!(tool.version_probe.as_ref().unwrap().tool, "get_account");
    }
}
