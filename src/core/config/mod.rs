//! `countersign.toml`: the gateway's configuration (DESIGN.md section 10).
//!
//! Parsing is strict: unknown keys are rejected (a misspelled `read_only`
//! silently ignored would turn a guarded write into an unguarded one), and
//! every error carries the file, line and column that `toml` reports.

mod audit;
mod auth;
mod delegation;
mod guards;
mod limits;
mod notify;
mod review;
mod tasks;
mod telemetry;
mod tools;
pub use audit::{ArgumentMode, AuditConfig, WitnessConfig};
pub use auth::{https_or_loopback, AuthConfig, IssuerConfig};
pub use delegation::{mode, DelegationConfig, Fallback, Grant, Mode, Unavailable};
pub use guards::{BudgetConfig, EffectKeyConfig, Over, Per};
pub use limits::Limits;
pub use notify::{EventKind, NotifyConfig, WebhookConfig, WebhookFormat};
pub use review::{console_of, console_origin, ReviewConfig};
pub use tasks::TasksConfig;
pub use telemetry::{TelemetryConfig, SAMPLERS};
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
mod tests;
