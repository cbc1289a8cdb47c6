//! Reading a policy folder: errors located at their file, line and column,
//! the quorum a permit's annotations ask for, and the digest of the
//! sources a decision is made under.
use super::*;

pub(super) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rfind('\n')
        .map_or(before.len(), |i| before.len() - i - 1)
        + 1;
    (line, column)
}

/// The first source offset a Cedar diagnostic points at.
pub(super) fn first_offset(d: &dyn miette::Diagnostic) -> Option<usize> {
    d.labels().and_then(|mut l| l.next()).map(|l| l.offset())
}

pub(super) fn located(
    file: &Path,
    text: &str,
    d: &dyn miette::Diagnostic,
    message: String,
) -> PolicyError {
    let (line, column) = match first_offset(d) {
        Some(o) => {
            let (l, c) = line_col(text, o);
            (Some(l), Some(c))
        }
        None => (None, None),
    };
    PolicyError {
        file: file.to_owned(),
        line,
        column,
        message,
    }
}

/// The quorum annotations of a policy (DESIGN.md section 20), checked:
/// `@approvals("N")` distinct reviewers, `@approvals_from("g1, g2")` one
/// reviewer of each group listed, `@denials("N")` denials to end it. Only
/// on a `permit`: a `forbid` never asks for approval, so the annotation
/// would silently do nothing there.
pub(super) fn quorum_of(
    p: &cedar_policy::Policy,
) -> Result<Option<crate::core::approval::Quorum>, String> {
    let count = |name: &str| -> Result<Option<u32>, String> {
        match p.annotation(name) {
            None => Ok(None),
            Some(v) => match v.trim().parse::<u32>() {
                Ok(n) if (1..=20).contains(&n) => Ok(Some(n)),
                _ => Err(format!(
                    "@{name}(\"{v}\") must be a whole number from 1 to 20"
                )),
            },
        }
    };
    let approvals = count("approvals")?;
    let denials = count("denials")?;
    let from = match p.annotation("approvals_from") {
        None => None,
        Some(v) => {
            let groups: Vec<String> = v
                .split(',')
                .map(|g| g.trim().to_owned())
                .filter(|g| !g.is_empty())
                .collect();
            if groups.is_empty() || groups.len() > 20 {
                return Err(format!(
                    "@approvals_from(\"{v}\") must list one to 20 groups, separated by commas"
                ));
            }
            if let Some(bad) = groups.iter().find(|g| uid("Group", g).is_err()) {
                return Err(format!(
                    "@approvals_from names `{bad}`, which is not a group name"
                ));
            }
            Some(groups)
        }
    };
    if approvals.is_none() && denials.is_none() && from.is_none() {
        return Ok(None);
    }
    if p.effect() == cedar_policy::Effect::Forbid {
        return Err(
            "@approvals, @approvals_from and @denials belong on a `permit` that asks for approval (one that reads `context.approved`), not on a `forbid`"
                .into(),
        );
    }
    Ok(Some(crate::core::approval::Quorum {
        approvals: approvals.unwrap_or(1),
        from: from.unwrap_or_default(),
        denials: denials.unwrap_or(1),
    }))
}

/// `sha256:` of a policy folder's text, by file name (see
/// [`Policies::digest`]).
pub(super) fn sources_digest(src: &PolicySources) -> String {
    use sha2::{Digest, Sha256};
    let hash = |t: &str| format!("sha256:{}", hex::encode(Sha256::digest(t.as_bytes())));
    let files: serde_json::Map<String, Value> = src
        .policies
        .iter()
        .map(|(path, text)| {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            (name, Value::from(hash(text)))
        })
        .collect();
    let all = serde_json::json!({
        "policies": files,
        "schema": src.schema.as_deref().map(hash),
        "reviewers": src.reviewers.as_deref().map(hash),
    });
    let mut bytes = Vec::new();
    crate::core::canonical::jcs_into(&all, &mut bytes);
    format!("sha256:{}", hex::encode(Sha256::digest(&bytes)))
}
