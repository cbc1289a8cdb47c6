//! Which policies can apply to one tool: the call policies indexed by the
//! resource scope they name (Cedar's authorizer evaluates every policy it
//! is given), and whether any of them reads what differs from call to call
//! (then a decision cannot be cached).
use super::*;

/// The policies that can apply to one tool.
#[derive(Debug)]
pub(super) struct Slice {
    pub(super) set: PolicySet,
    /// Whether a policy may read what differs from call to call of one
    /// identity and tool (the arguments, the call digest, the resource
    /// version, or the context as a whole). `context.approved` (both
    /// values are asked by every decision) and `context.tenant` (the
    /// identity's) do not.
    pub(super) reads_call_context: bool,
}

/// Whether a policy's text reads a call's own context: any `context` that
/// is not `context.approved` or `context.tenant`. Conservative: a
/// `context` in a string or an annotation counts too, and only costs the
/// cache.
pub(super) fn reads_call_context_in(text: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    text.match_indices("context").any(|(i, word)| {
        let after = &text[i + word.len()..];
        if text[..i].chars().next_back().is_some_and(ident)
            || after.chars().next().is_some_and(ident)
        {
            // Part of another name (`contextual`), not the context.
            return false;
        }
        !["approved", "tenant"].iter().any(|a| {
            after
                .strip_prefix('.')
                .and_then(|x| x.strip_prefix(a))
                .is_some_and(|x| !x.chars().next().is_some_and(ident))
        })
    })
}

/// Call policies by resource scope. Cedar's authorizer evaluates every policy
/// it is given, so a call is decided against only those whose scope can
/// match its tool: the cost follows the policies that can apply, not all.
#[derive(Debug, Default)]
pub(super) struct Index {
    /// Unscoped (or scoped by type only).
    pub(super) global: Vec<cedar_policy::Policy>,
    /// `resource == Tool::"S/t"` (or `in` it), by tool uid text.
    pub(super) by_tool: HashMap<String, Vec<cedar_policy::Policy>>,
    /// `resource in Server::"S"`, by server uid text.
    pub(super) by_server: HashMap<String, Vec<cedar_policy::Policy>>,
}

impl Index {
    pub(super) fn build(set: &PolicySet) -> Index {
        use cedar_policy::{ActionConstraint, ResourceConstraint};
        let call = EntityUid::from_str(r#"Action::"call""#).ok();
        let mut index = Index::default();
        for p in set.policies() {
            let for_call = match p.action_constraint() {
                ActionConstraint::Any => true,
                ActionConstraint::Eq(a) => Some(&a) == call.as_ref(),
                ActionConstraint::In(list) => list.iter().any(|a| Some(a) == call.as_ref()),
            };
            if !for_call {
                continue;
            }
            let bucket = match p.resource_constraint() {
                ResourceConstraint::Eq(uid)
                | ResourceConstraint::In(uid)
                | ResourceConstraint::IsIn(_, uid) => match uid.type_name().to_string().as_str() {
                    "Tool" => Some((&mut index.by_tool, uid.to_string())),
                    "Server" => Some((&mut index.by_server, uid.to_string())),
                    _ => None,
                },
                ResourceConstraint::Any | ResourceConstraint::Is(_) => None,
            };
            match bucket {
                Some((map, key)) => map.entry(key).or_default().push(p.clone()),
                None => index.global.push(p.clone()),
            }
        }
        index
    }
}
