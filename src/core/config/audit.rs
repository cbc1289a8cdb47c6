//! `[audit]`: the audit log's arguments, redaction, checkpoints, segments and witness (DESIGN.md section 8).

use super::*;

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

impl AuditConfig {
    /// `[audit]`: checkpoints, segments, redaction, origin and witness.
    pub(super) fn check(&self, path: &Path) -> Result<(), ConfigError> {
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
