//! Reading the operator's files: the configuration and the policy folder.
//! The rules that parse them live in the core and read nothing themselves.

use anyhow::Context as _;
use std::path::{Path, PathBuf};

use crate::core::catalog::{ToolLock, LOCK_FILE};
use crate::core::config::{Config, ConfigError};
use crate::core::decision::{Policies, PolicyError, PolicySources, SCHEMA_FILE};
use crate::core::reviewers::REVIEWERS_FILE;

/// Read, parse and check a configuration file.
pub fn load_config(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
        path: path.to_owned(),
        error,
    })?;
    let mut config = Config::parse(&text, path)?;
    example_server_beside_binary(&mut config);
    Ok(config)
}

/// Where the example configuration runs the example server from
/// (`examples/countersign.toml`), relative to the repository.
pub const EXAMPLE_SERVER_PATH: &str = "target/release/examples/payments_server";

/// A server whose command is the example server's default path, when that
/// path is not there (the gateway started outside the repository, or from
/// a debug build), runs the example server next to this binary instead
/// (`examples/payments_server` beside `countersign`, as cargo builds them),
/// when that one exists. Only that exact default path is looked up: any
/// other command runs as written. Every command that reads the
/// configuration does this ([`load_config`]).
fn example_server_beside_binary(config: &mut Config) {
    let Some(beside) = std::env::current_exe()
        .ok()
        .and_then(|exe| {
            exe.parent()
                .map(|d| d.join("examples").join("payments_server"))
        })
        .filter(|p| p.is_file())
    else {
        return;
    };
    for server in config.servers.values_mut() {
        if server.command.as_deref() == Some(EXAMPLE_SERVER_PATH)
            && !Path::new(EXAMPLE_SERVER_PATH).is_file()
        {
            server.command = Some(beside.display().to_string());
        }
    }
}

/// Read a policy folder: `*.cedar` in name order, `schema.cedarschema` and
/// `reviewers.toml` when present (or the reviewers file `reviewers` names
/// instead, `approvals.reviewers`). A file that exists but cannot be read
/// is reported (and refuses the set), never skipped.
pub fn read_policies(
    dir: &Path,
    reviewers: Option<&Path>,
) -> Result<PolicySources, Vec<PolicyError>> {
    let unreadable = |file: &Path, e: std::io::Error| PolicyError {
        file: file.to_owned(),
        line: None,
        column: None,
        message: e.to_string(),
    };
    let entries = std::fs::read_dir(dir).map_err(|e| {
        vec![PolicyError {
            file: dir.to_owned(),
            line: None,
            column: None,
            message: format!("cannot read the policy folder: {e}"),
        }]
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cedar"))
        .collect();
    files.sort();
    let mut src = PolicySources {
        dir: dir.to_owned(),
        ..PolicySources::default()
    };
    for file in files {
        match std::fs::read_to_string(&file) {
            Ok(text) => src.policies.push((file, text)),
            Err(e) => src.unreadable.push(unreadable(&file, e)),
        }
    }
    // A missing schema means no validation; a missing reviewers file means
    // no reviewers (nothing can be approved: fail closed).
    let optional = |path: PathBuf, src: &mut PolicySources| -> Option<String> {
        match std::fs::read_to_string(&path) {
            Ok(text) => Some(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                src.unreadable.push(unreadable(&path, e));
                None
            }
        }
    };
    src.schema = optional(dir.join(SCHEMA_FILE), &mut src);
    let reviewers_path = reviewers.map_or_else(|| dir.join(REVIEWERS_FILE), Path::to_owned);
    src.reviewers = optional(reviewers_path.clone(), &mut src);
    src.reviewers_path = Some(reviewers_path);
    Ok(src)
}

/// Read and parse a policy folder (with the reviewers of `reviewers`, when
/// given, instead of the folder's `reviewers.toml`).
pub fn load_policies(dir: &Path, reviewers: Option<&Path>) -> Result<Policies, Vec<PolicyError>> {
    Policies::from_sources(&read_policies(dir, reviewers)?)
}

/// Read `tools.lock` in the policy folder; none there is an empty lock
/// (every tool is pinned on first use).
pub fn load_tool_lock(dir: &Path) -> anyhow::Result<ToolLock> {
    let path = dir.join(LOCK_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => ToolLock::parse(&text).with_context(|| format!("{}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ToolLock::default()),
        Err(e) => Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
    }
}

/// Write `tools.lock` in the policy folder (whole and durably, through a
/// temporary file renamed over it: a reader never sees half a lock, and a
/// power cut leaves the old lock or the new one).
pub fn save_tool_lock(dir: &Path, lock: &ToolLock) -> anyhow::Result<PathBuf> {
    let path = dir.join(LOCK_FILE);
    crate::store::durable::write(&path, lock.to_text())
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}
