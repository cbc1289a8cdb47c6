//! `countersign policy check` and `countersign policy test`, for CI in the
//! policy repository.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::annotations::Annotations;
use crate::canonical;
use crate::decision::{Call, Decision, Policies};
use crate::identity::Identity;

/// Parse and validate the folder; print every error Cedar-style
/// (`file:line:column: message`). Returns whether it is clean.
pub fn check(dir: &Path) -> bool {
    match Policies::load(dir) {
        Ok(p) => {
            let how = if p.validated() {
                "validated against schema.cedarschema"
            } else {
                "no schema.cedarschema: parsed only"
            };
            println!("{}: {} policies, {how}", dir.display(), p.len());
            true
        }
        Err(errors) => {
            for e in &errors {
                println!("{e}");
            }
            println!("{} error(s)", errors.len());
            false
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Cases {
    case: Vec<Case>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    principal: String,
    tenant: String,
    #[serde(default)]
    groups: Vec<String>,
    server: String,
    tool: String,
    #[serde(default)]
    annotations: AnnotationCase,
    #[serde(default)]
    arguments: Option<Value>,
    expect: Expect,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct AnnotationCase {
    read_only: Option<bool>,
    destructive: Option<bool>,
    idempotent: Option<bool>,
    open_world: Option<bool>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "snake_case")]
enum Expect {
    Allow,
    Approval,
    Deny,
}

/// Run the decision cases of `file` against the folder `dir`. Prints one
/// line per case; returns whether all passed.
pub fn test(dir: &Path, file: &Path) -> anyhow::Result<bool> {
    let policies = Policies::load(dir).map_err(|errors| {
        anyhow::anyhow!(
            "the policies do not load:\n{}",
            errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        )
    })?;
    let text = std::fs::read_to_string(file)
        .map_err(|e| anyhow::anyhow!("cannot read `{}`: {e}", file.display()))?;
    let cases: Cases = toml::from_str(&text)
        .map_err(|e| anyhow::anyhow!("invalid case file `{}`:\n{e}", file.display()))?;
    let mut failed = 0;
    for c in &cases.case {
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
        };
        let arguments = c
            .arguments
            .clone()
            .unwrap_or(Value::Object(Default::default()));
        let digest = canonical::call_digest(&c.server, &c.tool, &arguments);
        let decision = policies.decide(&Call {
            identity: &identity,
            server: &c.server,
            tool: &c.tool,
            annotations,
            arguments: &arguments,
            digest: &digest,
            resource_version: None,
        });
        let (got, detail) = match &decision {
            Decision::Allow { policies } => (Expect::Allow, policies.join(", ")),
            Decision::Approval { policies } => (Expect::Approval, policies.join(", ")),
            Decision::Deny { policies, errors } => (
                Expect::Deny,
                [policies.join(", "), errors.join("; ")]
                    .join(" ")
                    .trim()
                    .to_owned(),
            ),
        };
        if got == c.expect {
            println!("ok    {} ({got:?}: {detail})", c.name);
        } else {
            failed += 1;
            println!(
                "FAIL  {}: expected {:?}, got {got:?} ({detail})",
                c.name, c.expect
            );
        }
    }
    println!("{} passed, {failed} failed", cases.case.len() - failed);
    Ok(failed == 0)
}
