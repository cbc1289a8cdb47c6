//! `[notify]`: the webhooks and the events they are told (DESIGN.md section 19).

use super::*;

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
    pub(super) fn check(&self, path: &Path) -> Result<(), ConfigError> {
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
