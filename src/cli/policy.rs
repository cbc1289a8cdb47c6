//! `countersign policy check` and `countersign policy test`, for CI in the
//! policy repository.

use crate::cli::args::PolicyCommand;
use std::path::Path;
use std::process::ExitCode;

use serde::Deserialize;
use serde_json::Value;

use crate::core::annotations::Annotations;
use crate::core::canonical;
use crate::core::decision::{Call, Decision};
use crate::core::identity::Identity;

/// Parse and validate the folder; print every error Cedar-style
/// (`file:line:column: message`). Returns whether it is clean.
pub(crate) fn check(dir: &Path) -> bool {
    match crate::cli::files::load_policies(dir, None) {
        Ok(p) => {
            let how = if p.validated() {
                "validated against schema.cedarschema"
            } else {
                "no schema.cedarschema: parsed only"
            };
            println!(
                "{}: {} policies, {how}; {} reviewers in {}",
                dir.display(),
                p.len(),
                p.reviewers().len(),
                crate::core::reviewers::REVIEWERS_FILE
            );
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
    expect: Expect,
    /// With `expect = "approval"`: how many distinct reviewers the quorum
    /// asks for in all (default: not checked).
    approvals: Option<u32>,
    /// With `expect = "approval"`: the groups the quorum asks a reviewer of
    /// each for, sorted (default: not checked).
    approvals_from: Option<Vec<String>>,
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
        .map_err(|e| anyhow::anyhow!("cannot read `{}`: {e}", file.display()))?;
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
        arguments: &arguments,
        digest: &digest,
        resource_version: None,
    })
}

/// Run the decision cases of `file` against the folder `dir`. Prints one
/// line per case; returns whether all passed.
pub(crate) fn test(dir: &Path, file: &Path) -> anyhow::Result<bool> {
    let policies = load(dir)?;
    let cases = cases(file)?;
    let mut failed = 0;
    for c in &cases {
        let decision = decide(&policies, c);
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
        // The quorum the approving policies ask for, when the case says.
        let quorum = match &decision {
            Decision::Approval { policies: asked } => Some(policies.quorum(asked)),
            _ => None,
        };
        let quorum_wrong = quorum.as_ref().and_then(|q| {
            let mut from = q.from.clone();
            from.sort();
            let count_wrong = c.approvals.is_some_and(|n| n != q.needed());
            let from_wrong = c.approvals_from.as_ref().is_some_and(|want| {
                let mut want = want.clone();
                want.sort();
                want != from
            });
            (count_wrong || from_wrong).then(|| {
                format!(
                    "expected {} approvals from [{}], the policies ask for {} from [{}]",
                    c.approvals.map_or("any".to_owned(), |n| n.to_string()),
                    c.approvals_from
                        .as_ref()
                        .map_or("any".to_owned(), |f| f.join(", ")),
                    q.needed(),
                    from.join(", ")
                )
            })
        });
        let detail = match &quorum {
            Some(q) if !q.is_single() => format!("{detail}; {} approvals", q.needed()),
            _ => detail,
        };
        if let Some(why) = quorum_wrong.filter(|_| got == c.expect) {
            failed += 1;
            println!("FAIL  {}: {why} ({detail})", c.name);
        } else if got == c.expect {
            println!("ok    {} ({got:?}: {detail})", c.name);
        } else {
            failed += 1;
            println!(
                "FAIL  {}: expected {:?}, got {got:?} ({detail})",
                c.name, c.expect
            );
        }
    }
    println!("{} passed, {failed} failed", cases.len() - failed);
    Ok(failed == 0)
}

/// `countersign policy schema --server S`: the `Arguments` type of the policy
/// schema, written from the server's live `tools/list`. One context type
/// serves every tool (Cedar types an action's context, not a resource's), so
/// the fields of all tools are merged, all optional; a field two tools type
/// differently is left out, with a comment. JSON Schema types map as the
/// decision maps values: `string` → `String`, `number`/`integer` → `decimal`,
/// `boolean` → `Bool`, `object` with `properties` → a record, `array` of a
/// simple type → `Set<…>`.
pub(crate) fn arguments_schema(server: &str, tools: &Value) -> String {
    use std::collections::BTreeMap;
    let mut fields: BTreeMap<String, Option<String>> = BTreeMap::new();
    let mut lines = vec![format!(
        "// Generated by `countersign policy schema --server {server}` from its tools/list."
    )];
    for tool in tools.as_array().into_iter().flatten() {
        let name = tool.get("name").and_then(Value::as_str).unwrap_or("?");
        let props = tool
            .pointer("/inputSchema/properties")
            .and_then(Value::as_object);
        let names: Vec<&str> = props
            .map(|p| p.keys().map(String::as_str).collect())
            .unwrap_or_default();
        lines.push(format!("//   {name}({})", names.join(", ")));
        for (field, schema) in props.into_iter().flatten() {
            let ty = cedar_type(schema, 0);
            match fields.get(field) {
                None => {
                    fields.insert(field.clone(), ty);
                }
                Some(existing) if *existing == ty => {}
                Some(_) => {
                    fields.insert(field.clone(), None);
                }
            }
        }
    }
    let mut body = Vec::new();
    for (field, ty) in &fields {
        let key = cedar_key(field);
        match ty {
            Some(t) => body.push(format!("  {key}?: {t},")),
            None => lines.push(format!(
                "// left out: `{field}` (types differ between tools, or no Cedar type fits)"
            )),
        }
    }
    format!(
        "{}\ntype Arguments = {{\n{}\n}};\n",
        lines.join("\n"),
        body.join("\n")
    )
}

fn cedar_key(name: &str) -> String {
    let ident = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ident {
        name.to_owned()
    } else {
        Value::String(name.to_owned()).to_string()
    }
}

fn cedar_type(schema: &Value, depth: usize) -> Option<String> {
    if depth > 8 {
        return None;
    }
    match schema.get("type")?.as_str()? {
        "string" => Some("String".into()),
        // The gateway builds the context with these types: an integer
        // field is a Long, any other number a decimal.
        "integer" => Some("Long".into()),
        "number" => Some("decimal".into()),
        "boolean" => Some("Bool".into()),
        "array" => Some(format!(
            "Set<{}>",
            cedar_type(schema.get("items")?, depth + 1)?
        )),
        "object" => {
            let props = schema.get("properties")?.as_object()?;
            let inner: Vec<String> = props
                .iter()
                .filter_map(|(k, v)| {
                    Some(format!("{}?: {}", cedar_key(k), cedar_type(v, depth + 1)?))
                })
                .collect();
            Some(format!("{{ {} }}", inner.join(", ")))
        }
        _ => None,
    }
}

/// `countersign policy check|test|schema`.
pub(crate) async fn command(command: PolicyCommand) -> anyhow::Result<ExitCode> {
    let ok = match command {
        PolicyCommand::Check { dir } => crate::cli::policy::check(&dir),
        PolicyCommand::Test { file, dir } => crate::cli::policy::test(&dir, &file)?,
        PolicyCommand::Diff {
            base,
            head,
            shadow,
            since,
            dir,
            config,
            cases,
            inputs,
            format,
            fail_on,
        } => {
            use crate::cli::policy_diff as diff;
            let since_ms = crate::core::time::now_ms()
                .saturating_sub(i64::try_from(since.as_millis()).unwrap_or(i64::MAX));
            let report = match (shadow, base, head) {
                (true, _, _) => {
                    let dirs = if dir.is_empty() {
                        vec![crate::cli::files::load_config(&config)?.audit_dir()]
                    } else {
                        dir
                    };
                    diff::from_audit(&dirs, since_ms, since)?
                }
                (false, Some(base), Some(head)) => match (cases, inputs) {
                    (Some(cases), _) => diff::from_cases(&base, &head, &cases)?,
                    (None, Some(file)) => {
                        let text = std::fs::read_to_string(&file).map_err(|e| {
                            anyhow::anyhow!("cannot read `{}`: {e}", file.display())
                        })?;
                        let rows = diff::parse_inputs(&text)?;
                        diff::from_inputs(&base, &head, &rows, &file.display().to_string())?
                    }
                    (None, None) => {
                        let kept = config
                            .exists()
                            .then(|| crate::cli::files::load_config(&config))
                            .transpose()?;
                        let Some(kept) = kept.filter(|c| c.policy.inputs) else {
                            anyhow::bail!(
                                "policy diff BASE HEAD needs calls to decide, and no decision inputs are kept: \
                                 turn on `[policy] inputs = true` in the gateway's configuration ({}) to keep them, \
                                 or give --cases FILE (the `policy test` format, e.g. {}/tests.toml)",
                                config.display(),
                                base.display()
                            );
                        };
                        let (store, _) = crate::cli::store::open(&kept).await?;
                        let rows = store
                            .inputs_since(since_ms, None)
                            .await
                            .map_err(|e| anyhow::anyhow!("{e}"))?;
                        let rows = rows
                            .iter()
                            .map(|r| diff::parse_inputs(&r.inputs).map(|mut v| v.remove(0)))
                            .collect::<anyhow::Result<Vec<_>>>()?;
                        diff::from_inputs(
                            &base,
                            &head,
                            &rows,
                            &format!(
                                "the decision inputs of the last {}",
                                humantime::format_duration(since)
                            ),
                        )?
                    }
                },
                _ => anyhow::bail!("policy diff needs BASE and HEAD folders, or --shadow"),
            };
            print!("{}", report.render(format)?);
            !report.fails(fail_on)
        }
        PolicyCommand::Inputs { command } => {
            use crate::cli::args::InputsCommand;
            match command {
                InputsCommand::Export {
                    tenant,
                    since,
                    config,
                } => {
                    let config = crate::cli::files::load_config(&config)?;
                    let (store, _) = crate::cli::store::open(&config).await?;
                    let since_ms = since.map_or(0, |s| {
                        crate::core::time::now_ms()
                            .saturating_sub(i64::try_from(s.as_millis()).unwrap_or(i64::MAX))
                    });
                    let rows = store
                        .inputs_since(since_ms, tenant)
                        .await
                        .map_err(|e| anyhow::anyhow!("{e}"))?;
                    for r in rows {
                        println!("{}", r.inputs);
                    }
                }
                InputsCommand::Erase { tenant, config } => {
                    let config = crate::cli::files::load_config(&config)?;
                    let (store, _) = crate::cli::store::open(&config).await?;
                    let n = store
                        .inputs_erase(tenant.clone())
                        .await
                        .map_err(|e| anyhow::anyhow!("{e}"))?;
                    eprintln!("countersign: erased {n} decision inputs of tenant {tenant}");
                }
            }
            true
        }
        PolicyCommand::Schema { server, config } => {
            let config = crate::cli::files::load_config(&config)?;
            anyhow::ensure!(
                config.servers.contains_key(&server),
                "unknown server `{server}`: configured servers are {}",
                config
                    .servers
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            let gw = crate::cli::check::offline(config);
            let tools = crate::cli::check::list_tools(&gw, &server)
                .await
                .map_err(|e| anyhow::anyhow!(e))?;
            print!("{}", crate::cli::policy::arguments_schema(&server, &tools));
            true
        }
    };
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
