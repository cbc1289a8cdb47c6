//! `[servers.S.tools.T]`: the operator's word on one tool (annotation
//! overrides, a version probe, a read cache, the reviewers' summary), and
//! its checks.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::{invalid, optional_duration, ConfigError};

/// `[servers.S.tools.T]`: the operator's word on a tool, which wins over the
/// server's annotations.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolConfig {
    /// Override of `readOnlyHint`.
    pub read_only: Option<bool>,
    /// Override of `destructiveHint`.
    pub destructive: Option<bool>,
    /// Override of `idempotentHint`.
    pub idempotent: Option<bool>,
    /// Override of `openWorldHint`.
    pub open_world: Option<bool>,
    /// Resource version probe (used by approvals, DESIGN.md section 6).
    pub version_probe: Option<VersionProbe>,
    /// Answer an identical read (same principal and tenant) from memory for
    /// this long. Used only while the tool is read-only; never for writes.
    #[serde(default, deserialize_with = "optional_duration")]
    pub cache_ttl: Option<Duration>,
    /// What a held call of this tool is, in plain words, for reviewers
    /// ([`crate::core::headline`]): `"Charge {currency} {amount} to
    /// {account}"`.
    pub summary: Option<String>,
}

/// A read-only tool whose result carries the version of what a call changes.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VersionProbe {
    /// The probe tool (same server).
    pub tool: String,
    /// Argument template: probe argument name → JSON pointer into the call's
    /// arguments.
    #[serde(default)]
    pub arguments: BTreeMap<String, String>,
    /// JSON pointer into the probe's result.
    pub pointer: String,
}

/// `[servers.NAME.tools.TOOL]`: summaries that parse, version probes
/// that are other tools, with JSON pointers.
pub(super) fn check(
    tools: &BTreeMap<String, ToolConfig>,
    name: &str,
    path: &Path,
) -> Result<(), ConfigError> {
    for (tool, t) in tools {
        if let Some(why) = t
            .summary
            .as_deref()
            .and_then(|s| crate::core::headline::check(s).err())
        {
            return Err(invalid(
                path,
                format!("[servers.{name}.tools.{tool}] summary: {why}"),
            ));
        }
        if let Some(p) = &t.version_probe {
            if p.tool == *tool {
                return Err(invalid(path, format!(
                    "[servers.{name}.tools.{tool}] version_probe names the tool itself: the probe must be a read-only tool"
                )));
            }
            let pointer_name = "pointer".to_owned();
            for (arg, pointer) in p.arguments.iter().chain([(&pointer_name, &p.pointer)]) {
                if !pointer.is_empty() && !pointer.starts_with('/') {
                    return Err(invalid(path, format!(
                        "[servers.{name}.tools.{tool}] version_probe `{arg}` = `{pointer}` is not a JSON pointer (it starts with `/`)"
                    )));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_summary_that_does_not_parse_is_refused_naming_the_tool() {
        let text = |summary: &str| {
            format!(
                "[servers.p]\ncommand = \"x\"\n[servers.p.tools.charge]\nsummary = \"{summary}\"\n"
            )
        };
        let parse = |t: String| super::super::Config::parse(&t, std::path::Path::new("c.toml"));
        let err = parse(text("Charge {amount")).unwrap_err().to_string();
        assert!(
            err.contains("[servers.p.tools.charge] summary") && err.contains("not closed"),
            "{err}"
        );
        let ok = parse(text("Charge {amount}")).unwrap();
        assert_eq!(
            ok.servers["p"].tools["charge"].summary.as_deref(),
            Some("Charge {amount}")
        );
    }
}
