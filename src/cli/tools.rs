//! `countersign tools list|diff|pin|accept`: the pinned tool definitions in
//! `policies/tools.lock` against what each server lists now (DESIGN.md
//! section 12).
//!
//! Each command opens a connection of its own to the servers (as `check`
//! does) and reads every page of `tools/list`. The running gateway reloads
//! `tools.lock` when it changes, like the policies.

use crate::cli::args::ToolsCommand;
use crate::cli::out::outln;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

use serde::Serialize;
use serde_json::Value;

use crate::cli::files::{load_tool_lock, save_tool_lock};
use crate::core::catalog::{diff, Change, Definition, ToolLock};
use crate::front::gateway::Gateway;

/// How a listed tool stands against the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Standing {
    /// The lock pins this very definition.
    Pinned,
    /// The lock pins another definition.
    Changed,
    /// Not in the lock: the gateway pins it on first use.
    Unpinned,
    /// In the lock, not listed by the server.
    Vanished,
}

/// One tool of one server.
#[derive(Debug, Serialize)]
pub(crate) struct ToolState {
    /// Server.
    pub server: String,
    /// Tool.
    pub tool: String,
    /// How it stands.
    pub standing: Standing,
    /// The listed digest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// The pinned digest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinned: Option<String>,
    /// What differs from the pinned definition.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<Change>,
}

/// What each server lists now: server → tool → definition.
pub(crate) type Listed = BTreeMap<String, BTreeMap<String, Definition>>;

/// List `servers` (all configured when empty), every page.
pub(crate) async fn fetch(gw: &Gateway, only: Option<&str>) -> anyhow::Result<Listed> {
    let mut out = Listed::new();
    for server in gw.config().servers.keys() {
        if only.is_some_and(|o| o != server) {
            continue;
        }
        let tools = crate::cli::check::list_tools(gw, server)
            .await
            .map_err(|e| anyhow::anyhow!("server `{server}`: {e}"))?;
        let defs = out.entry(server.clone()).or_default();
        for d in tools
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Definition::of)
        {
            defs.insert(d.name().to_owned(), d);
        }
    }
    if let Some(o) = only {
        anyhow::ensure!(
            out.contains_key(o),
            "unknown server `{o}`: configured servers are {}",
            gw.config()
                .servers
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(out)
}

/// Compare what is listed with the lock.
pub(crate) fn compare(listed: &Listed, lock: &ToolLock) -> Vec<ToolState> {
    let mut out = Vec::new();
    for (server, tools) in listed {
        for (tool, def) in tools {
            let pin = lock.get(server, tool);
            let (standing, changes) = match pin {
                None => (Standing::Unpinned, Vec::new()),
                Some(p) if p.digest == def.digest => (Standing::Pinned, Vec::new()),
                Some(p) => (Standing::Changed, diff(&p.definition, &def.definition)),
            };
            out.push(ToolState {
                server: server.clone(),
                tool: tool.clone(),
                standing,
                digest: Some(def.digest.clone()),
                pinned: pin.map(|p| p.digest.clone()),
                changes,
            });
        }
        for (tool, pin) in lock.servers.get(server).into_iter().flatten() {
            if !tools.contains_key(tool) {
                out.push(ToolState {
                    server: server.clone(),
                    tool: tool.clone(),
                    standing: Standing::Vanished,
                    digest: None,
                    pinned: Some(pin.digest.clone()),
                    changes: Vec::new(),
                });
            }
        }
    }
    out
}

/// One line per change (as `countersign show` prints them).
pub(crate) fn describe(changes: &[Change]) -> String {
    crate::cli::review::describe_changes(&serde_json::to_value(changes).unwrap_or(Value::Null))
}

/// `tools pin`: the lock gets every listed definition of `listed`'s servers
/// (replacing those servers' entries whole; other servers stay).
pub(crate) fn pin(lock: &mut ToolLock, listed: &Listed) -> usize {
    let mut n = 0;
    for (server, tools) in listed {
        lock.servers.remove(server);
        for def in tools.values() {
            lock.set(server, def.clone());
            n += 1;
        }
    }
    lock.version = 1;
    n
}

/// `tools accept S/tool`: pin the definition listed now, after checking it
/// is the one the operator looked at (`digest`, when given). A tool the
/// server no longer lists leaves the lock.
pub(crate) fn accept(
    lock: &mut ToolLock,
    listed: &Listed,
    server: &str,
    tool: &str,
    digest: Option<&str>,
) -> anyhow::Result<String> {
    let def = listed.get(server).and_then(|t| t.get(tool));
    match (def, digest) {
        (Some(d), Some(want)) if d.digest != want => anyhow::bail!(
            "{server}/{tool} is listed as {} now, not {want}: look at `countersign tools diff {server}/{tool}` again",
            d.digest
        ),
        (Some(d), _) => {
            lock.set(server, d.clone());
            Ok(format!("accepted {server}/{tool} as {}", d.digest))
        }
        (None, _) => {
            let removed = lock
                .servers
                .get_mut(server)
                .and_then(|t| t.remove(tool))
                .is_some();
            anyhow::ensure!(
                removed,
                "{server}/{tool} is neither listed by the server nor pinned"
            );
            Ok(format!(
                "removed {server}/{tool} from the lock (the server no longer lists it; calls to it stay refused while it does not)"
            ))
        }
    }
}

/// Split `S/tool` (the tool name may itself hold `/`).
pub(crate) fn split(name: &str) -> anyhow::Result<(&str, &str)> {
    name.split_once('/')
        .filter(|(s, t)| !s.is_empty() && !t.is_empty())
        .ok_or_else(|| anyhow::anyhow!("`{name}` is not SERVER/TOOL"))
}

/// Load the lock of the config's policy folder.
pub(crate) fn lock_of(gw: &Gateway) -> anyhow::Result<ToolLock> {
    load_tool_lock(&gw.config().gateway.policies)
}

/// Save the lock in the config's policy folder; returns the path.
pub(crate) fn save(gw: &Gateway, lock: &ToolLock) -> anyhow::Result<std::path::PathBuf> {
    save_tool_lock(&gw.config().gateway.policies, lock)
}

/// `countersign tools list|diff|pin|accept`.
pub(crate) async fn command(command: ToolsCommand, config: &Path) -> anyhow::Result<ExitCode> {
    let gw = &crate::cli::check::offline(crate::cli::files::load_config(config)?);
    let mut lock = lock_of(gw)?;
    match command {
        ToolsCommand::List { server, json } => {
            let listed = fetch(gw, server.as_deref()).await?;
            let states = compare(&listed, &lock);
            if json {
                outln!("{}", serde_json::to_string_pretty(&states)?);
            } else {
                for s in &states {
                    let digest = s.digest.as_deref().or(s.pinned.as_deref()).unwrap_or("");
                    let standing = serde_json::to_value(s.standing)?;
                    outln!(
                        "{:<32} {:<9} {digest}",
                        format!("{}/{}", s.server, s.tool),
                        standing.as_str().unwrap_or_default()
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        ToolsCommand::Diff { tool } => {
            let only = tool.as_deref().map(split).transpose()?;
            let listed = fetch(gw, only.map(|o| o.0)).await?;
            let mut differs = false;
            for s in compare(&listed, &lock) {
                if only.is_some_and(|(_, t)| t != s.tool) {
                    continue;
                }
                let name = format!("{}/{}", s.server, s.tool);
                match s.standing {
                    Standing::Pinned | Standing::Unpinned => continue,
                    Standing::Changed => outln!(
                        "{name}: pinned {} → listed {}\n{}",
                        s.pinned.unwrap_or_default(),
                        s.digest.unwrap_or_default(),
                        describe(&s.changes)
                    ),
                    Standing::Vanished => {
                        outln!(
                            "{name}: pinned {}, no longer listed",
                            s.pinned.unwrap_or_default()
                        );
                    }
                }
                differs = true;
            }
            Ok(if differs {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
        ToolsCommand::Pin { server } => {
            let listed = fetch(gw, server.as_deref()).await?;
            let n = pin(&mut lock, &listed);
            let path = save(gw, &lock)?;
            outln!("pinned {n} tools in {}", path.display());
            Ok(ExitCode::SUCCESS)
        }
        ToolsCommand::Accept { tool, digest } => {
            let (server, name) = split(&tool)?;
            let listed = fetch(gw, Some(server)).await?;
            let said = accept(&mut lock, &listed, server, name, digest.as_deref())?;
            let path = save(gw, &lock)?;
            outln!("{said} in {}", path.display());
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn listed(description: &str) -> Listed {
        let d = Definition::of(&json!({"name": "pay", "description": description})).unwrap();
        Listed::from([("s".to_owned(), BTreeMap::from([("pay".to_owned(), d)]))])
    }

    #[test]
    fn pin_compare_accept() {
        let mut lock = ToolLock::default();
        assert_eq!(compare(&listed("a"), &lock)[0].standing, Standing::Unpinned);
        assert_eq!(pin(&mut lock, &listed("a")), 1);
        assert_eq!(compare(&listed("a"), &lock)[0].standing, Standing::Pinned);
        let now = compare(&listed("b"), &lock);
        assert_eq!(now[0].standing, Standing::Changed);
        assert!(describe(&now[0].changes).contains("/description"));
        assert!(describe(&now[0].changes).contains("\"a\" -> \"b\""));
        let wrong = "sha256:0";
        assert!(accept(&mut lock, &listed("b"), "s", "pay", Some(wrong)).is_err());
        let digest = now[0].digest.clone().unwrap();
        accept(&mut lock, &listed("b"), "s", "pay", Some(&digest)).unwrap();
        assert_eq!(compare(&listed("b"), &lock)[0].standing, Standing::Pinned);
        let gone = Listed::from([("s".to_owned(), BTreeMap::new())]);
        assert_eq!(compare(&gone, &lock)[0].standing, Standing::Vanished);
        accept(&mut lock, &gone, "s", "pay", None).unwrap();
        assert!(lock.get("s", "pay").is_none());
        assert!(accept(&mut lock, &gone, "s", "pay", None).is_err());
        assert!(split("s/a/b").unwrap() == ("s", "a/b"));
        assert!(split("nope").is_err());
    }
}
