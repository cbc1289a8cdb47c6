//! `[[budgets]]` and `[[effect_keys]]`: guards on the business effect of
//! writes (DESIGN.md section 25). The rules themselves are in
//! [`crate::core::guard`]; this is their configuration and its checks.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use rust_decimal::Decimal;
use serde::{Deserialize, Deserializer};

use super::{duration, invalid, ConfigError};

/// Whose spending a budget counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Per {
    /// Each requester on its own.
    Principal,
    /// Every requester of a tenant together.
    Tenant,
}

/// What a call past a budget (or repeating an effect) gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Over {
    /// Held for a reviewer; their yes lets that one call through.
    Approval,
    /// Refused.
    Deny,
}

impl Over {
    /// As written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Over::Approval => "approval",
            Over::Deny => "deny",
        }
    }
}

/// `[[budgets]]`: spending a principal or a tenant may do unattended in a
/// rolling window.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetConfig {
    /// Its name (letters, digits, `_`, `-`): in `context.budgets.NAME`,
    /// metrics and `countersign budgets`.
    pub name: String,
    /// The calls it counts, `SERVER/TOOL`.
    pub tools: Vec<String>,
    /// A JSON pointer into the canonical arguments to the amount (a number,
    /// or a string holding a plain decimal); absent: each call counts 1.
    #[serde(default)]
    pub amount: Option<String>,
    /// Whose spending: `principal` or `tenant`.
    pub per: Per,
    /// The rolling window, like `"24h"`.
    #[serde(deserialize_with = "duration")]
    pub window: Duration,
    /// The most spent in a window without a person deciding.
    #[serde(deserialize_with = "decimal")]
    pub limit: Decimal,
    /// What a call that would pass the limit gets.
    #[serde(default = "approval")]
    pub over: Over,
}

/// `[[effect_keys]]`: the same business effect twice within a window is
/// held (or refused), whatever the session or idempotency key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EffectKeyConfig {
    /// Its name (letters, digits, `_`, `-`); `effect-N` (from 1) when
    /// not given.
    #[serde(default)]
    pub name: Option<String>,
    /// The calls it covers, `SERVER/TOOL`.
    pub tools: Vec<String>,
    /// JSON pointers into the canonical arguments: the effect is these
    /// values (a missing one counts as null).
    pub fields: Vec<String>,
    /// How long a dispatched effect stands against a repeat.
    #[serde(deserialize_with = "duration")]
    pub window: Duration,
    /// What a repeat gets.
    #[serde(default = "approval")]
    pub repeat: Over,
}

fn approval() -> Over {
    Over::Approval
}

/// A decimal written as a TOML number or string: `1000`, `99.95`,
/// `"1000.00"`. Read from its text, so never through a float's rounding.
fn decimal<'de, D: Deserializer<'de>>(d: D) -> Result<Decimal, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Text {
        Int(i64),
        Float(f64),
        Str(String),
    }
    let text = match Text::deserialize(d)? {
        Text::Int(i) => return Ok(Decimal::from(i)),
        // TOML's float text is gone by now: its shortest form is the one
        // the operator wrote for any amount a person would write.
        Text::Float(f) => f.to_string(),
        Text::Str(s) => s,
    };
    Decimal::from_str(text.trim())
        .map_err(|e| serde::de::Error::custom(format!("`{text}` is not a decimal amount ({e})")))
}

impl EffectKeyConfig {
    /// Its name, or `effect-N` for the `i`th (from 0).
    pub fn name_at(&self, i: usize) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| format!("effect-{}", i + 1))
    }
}

fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn check_tools(what: &str, tools: &[String], path: &Path) -> Result<(), ConfigError> {
    if tools.is_empty() {
        return Err(invalid(
            path,
            format!("{what}: `tools` is empty; name the calls it guards as \"SERVER/TOOL\""),
        ));
    }
    for t in tools {
        match t.split_once('/') {
            Some((s, tool)) if !s.is_empty() && !tool.is_empty() => {}
            _ => {
                return Err(invalid(
                    path,
                    format!("{what}: tool `{t}` is not \"SERVER/TOOL\""),
                ))
            }
        }
    }
    Ok(())
}

fn check_pointer(what: &str, p: &str, path: &Path) -> Result<(), ConfigError> {
    if !p.is_empty() && !p.starts_with('/') {
        return Err(invalid(
            path,
            format!("{what}: `{p}` is not a JSON pointer (RFC 6901); write it like \"/amount\""),
        ));
    }
    Ok(())
}

/// `[[budgets]]` and `[[effect_keys]]`: plain, distinct names, tools as
/// `SERVER/TOOL`, JSON pointers, a window, a limit that is not negative.
pub(super) fn check(
    budgets: &[BudgetConfig],
    effects: &[EffectKeyConfig],
    path: &Path,
) -> Result<(), ConfigError> {
    let mut names = std::collections::BTreeSet::new();
    for b in budgets {
        let what = format!("budget `{}`", b.name);
        if !plain_name(&b.name) {
            return Err(invalid(path, format!("{what}: a budget's name is letters, digits, `_` and `-` (it is a Cedar attribute and a metric label)")));
        }
        if !names.insert(b.name.clone()) {
            return Err(invalid(path, format!("{what} is listed twice")));
        }
        check_tools(&what, &b.tools, path)?;
        if let Some(p) = &b.amount {
            check_pointer(&what, p, path)?;
        }
        if b.window.is_zero() {
            return Err(invalid(
                path,
                format!("{what}: `window` must be longer than 0s"),
            ));
        }
        if b.limit.is_sign_negative() {
            return Err(invalid(path, format!("{what}: `limit` is negative")));
        }
    }
    let mut names = std::collections::BTreeSet::new();
    for (i, e) in effects.iter().enumerate() {
        let name = e.name_at(i);
        let what = format!("effect key `{name}`");
        if !plain_name(&name) {
            return Err(invalid(
                path,
                format!("{what}: an effect key's name is letters, digits, `_` and `-`"),
            ));
        }
        if !names.insert(name.clone()) {
            return Err(invalid(path, format!("{what} is listed twice")));
        }
        check_tools(&what, &e.tools, path)?;
        if e.fields.is_empty() {
            return Err(invalid(path, format!("{what}: `fields` is empty; name the arguments that make the effect, like [\"/account\", \"/amount\"]")));
        }
        for p in &e.fields {
            check_pointer(&what, p, path)?;
        }
        if e.window.is_zero() {
            return Err(invalid(
                path,
                format!("{what}: `window` must be longer than 0s"),
            ));
        }
    }
    Ok(())
}
