//! Decision cases (the `policy test` file format): a call and an identity,
//! and the decision expected. `policy test` checks them; `policy diff`
//! decides them under two policy folders.

use anyhow::Context as _;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::core::annotations::Annotations;
use crate::core::canonical;
use crate::core::decision::{Call, Decision};
use crate::core::identity::Identity;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Cases {
    case: Vec<Case>,
}

/// One decision case of a `policy test` file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Case {
    pub(crate) name: String,
    principal: String,
    tenant: String,
    #[serde(default)]
    groups: Vec<String>,
    pub(crate) server: String,
    pub(crate) tool: String,
    #[serde(default)]
    annotations: AnnotationCase,
    /// The tool's definition differs from its pin.
    #[serde(default)]
    definition_changed: bool,
    #[serde(default)]
    arguments: Option<Value>,
    pub(crate) expect: Expect,
    /// With `expect = "approval"`: how many distinct reviewers the quorum
    /// asks for in all (default: not checked).
    pub(crate) approvals: Option<u32>,
    /// With `expect = "approval"`: the groups the quorum asks a reviewer of
    /// each for, sorted (default: not checked).
    pub(crate) approvals_from: Option<Vec<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct AnnotationCase {
    read_only: Option<bool>,
    destructive: Option<bool>,
    idempotent: Option<bool>,
    open_world: Option<bool>,
}

/// The decision a case expects.
#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Expect {
    Allow,
    Approval,
    Deny,
}

/// The policies of `dir`, or every load error in one message.
pub(crate) fn load(dir: &Path) -> anyhow::Result<crate::core::decision::Policies> {
    crate::cli::files::load_policies(dir, None).map_err(|errors| {
        anyhow::anyhow!(
            "the policies in `{}` do not load:\n{}",
            dir.display(),
            errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        )
    })
}

/// The cases of a `policy test` file.
pub(crate) fn cases(file: &Path) -> anyhow::Result<Vec<Case>> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read `{}`", file.display()))?;
    let cases: Cases = toml::from_str(&text)
        .map_err(|e| anyhow::anyhow!("invalid case file `{}`:\n{e}", file.display()))?;
    Ok(cases.case)
}

/// Decide case `c` under `policies`.
pub(crate) fn decide(policies: &crate::core::decision::Policies, c: &Case) -> Decision {
    let d = Annotations::default();
    let annotations = Annotations {
        read_only: c.annotations.read_only.unwrap_or(d.read_only),
        destructive: c.annotations.destructive.unwrap_or(d.destructive),
        idempotent: c.annotations.idempotent.unwrap_or(d.idempotent),
        open_world: c.annotations.open_world.unwrap_or(d.open_world),
    };
    let identity = Identity {
        principal: c.principal.clone(),
        tenant: c.tenant.clone(),
        groups: c.groups.clone(),
        ..Default::default()
    };
    let arguments = c
        .arguments
        .clone()
        .unwrap_or(Value::Object(Default::default()));
    let digest = canonical::call_digest(&c.server, &c.tool, &arguments);
    policies.decide(&Call {
        identity: &identity,
        server: &c.server,
        tool: &c.tool,
        annotations,
        definition_changed: c.definition_changed,
        budgets: None,
        arguments: &arguments,
        digest: &digest,
        resource_version: None,
    })
}
