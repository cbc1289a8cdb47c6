//! A proposal in a reviewer's words: the sentence (or the operator's
//! headline) that leads every surface, the flags beside it in a list, and
//! the queue's order.

use super::*;

/// One plain sentence of what an approval lets happen, for reviewers, built
/// from the gateway's canonical copy (never from text the agent supplied):
/// "agent-7 of acme wants payments/charge_card (a write) with account acct-1,
/// amount 120, currency EUR".
///
/// Every part an agent chose (keys, values, the tool's name, the OAuth
/// client's name) goes through [`crate::core::legible`]: a key or a value
/// built to erase or reorder the sentence on a terminal shows as what it is.
pub fn summary(p: &Proposal) -> String {
    use crate::core::legible;
    if let Some(h) = &p.headline {
        return h.clone();
    }
    let risk = match p.risk {
        Risk::Read => "a read",
        Risk::Write => "a write",
        Risk::Destructive => "possibly destructive",
    };
    let args: Vec<String> = match &p.arguments {
        Value::Object(m) if !m.is_empty() => m
            .iter()
            .map(|(k, v)| {
                let k = legible::key(k);
                match v {
                    // A string that would break the sentence (a newline,
                    // a tab, anything that does not display itself) is
                    // shown quoted and escaped, so a reviewer sees exactly
                    // what is there.
                    Value::String(s) if legible::text(s) != s.as_str() => {
                        format!("{k} {}", legible::value(v))
                    }
                    // A value that could pass for another is said so.
                    Value::String(s) => format!("{k} {}", legible::marked(s.clone(), v)),
                    other => format!("{k} {}", legible::value(other)),
                }
            })
            .collect(),
        Value::Object(_) => vec!["no arguments".into()],
        other => vec![legible::value(other)],
    };
    let mut text = args.join(", ");
    if text.chars().count() > 160 {
        text = format!(
            "{}… (see the arguments)",
            text.chars().take(150).collect::<String>()
        );
    }
    let via = p
        .client
        .as_deref()
        .map(|c| format!(" via {}", legible::text(c)))
        .unwrap_or_default();
    let alike = p
        .looks_like
        .as_deref()
        .map(|l| {
            format!(
                ", a tool whose name only looks like `{}`,",
                legible::text(l)
            )
        })
        .unwrap_or_default();
    // The budgets' and effect keys' figures, wherever the summary goes
    // (notifications, the console, the question in the client).
    let guards: String = p
        .guards
        .iter()
        .map(|g| format!("; {}", legible::text(g)))
        .collect();
    format!(
        "{}{via} of {} wants {}/{}{alike} ({risk}) with {text}{}{guards}",
        legible::text(&p.requester),
        legible::text(&p.tenant),
        legible::text(&p.server),
        legible::text(&p.tool),
        p.resource_version
            .as_deref()
            .map(|v| format!(", against resource version {}", legible::text(v)))
            .unwrap_or_default()
    )
}

/// The order of the queue of pending proposals everywhere a reviewer reads
/// it (`countersign pending`, the TUI, the console), from a proposal's `/v1`
/// JSON: the one that expires undecided first comes first (then the older,
/// then by id), so the call closest to being dropped is in front.
pub fn queue_key(p: &Value) -> (i64, i64, String) {
    queue_order(
        p["pending_expires_ms"].as_i64().unwrap_or(i64::MAX),
        p["created_ms"].as_i64().unwrap_or(0),
        p["id"].as_str().unwrap_or(""),
    )
}

/// [`queue_key`] of a proposal's undecided expiry, creation and id.
pub fn queue_order(pending_expires_ms: i64, created_ms: i64, id: &str) -> (i64, i64, String) {
    (pending_expires_ms, created_ms, id.to_owned())
}

/// The flags a reviewer sees beside a proposal in a list, from its `/v1`
/// JSON: the same words in `countersign pending` and in the TUI's FLAGS
/// column, so that the two never disagree about what a proposal is.
/// Names the proposal's own text carries are made legible (no terminal
/// escapes).
pub fn flags(p: &Value) -> Vec<String> {
    let mut flags = Vec::new();
    if let Some(r) = p.pointer("/revises/proposal_id").and_then(Value::as_str) {
        flags.push(format!("revises {}", crate::core::legible::text(r)));
    }
    if let Some(r) = p.pointer("/beside/proposal_id").and_then(Value::as_str) {
        flags.push(format!(
            "another call beside {}",
            crate::core::legible::text(r)
        ));
    }
    if p.get("definition_change").is_some_and(|d| !d.is_null()) {
        flags.push("tool definition changed".to_owned());
    }
    if let Some(l) = p["looks_like"].as_str() {
        flags.push(format!("name looks like {}", crate::core::legible::text(l)));
    }
    for g in p["guards"].as_array().into_iter().flatten() {
        flags.push(crate::core::legible::text(g.as_str().unwrap_or("?")).into_owned());
    }
    if let Some(progress) = p["progress"].as_str() {
        flags.push(crate::core::legible::text(progress).into_owned());
    }
    match p["joined"].as_u64().unwrap_or(0) {
        0 => {}
        1 => flags.push("1 retry joined".to_owned()),
        n => flags.push(format!("{n} retries joined")),
    }
    // Values that could pass for others (the first three), beside the
    // keys that `legible::key` marks.
    let odd = crate::core::legible::lookalikes(&p["arguments"]);
    for (at, mark) in odd.iter().take(3) {
        flags.push(format!("{} {mark}", crate::core::legible::text(at)));
    }
    if odd.len() > 3 {
        flags.push(format!("{} more odd values", odd.len() - 3));
    }
    match p["tasks_waiting"].as_u64().unwrap_or(0) {
        0 => {}
        1 => flags.push("a task waits".to_owned()),
        n => flags.push(format!("{n} tasks wait")),
    }
    flags
}

#[cfg(test)]
mod flag_tests {
    use super::flags;
    use serde_json::json;

    #[test]
    fn flags_count_retries_in_the_right_number_and_name_what_changed() {
        assert!(flags(&json!({"joined": 0})).is_empty());
        assert_eq!(flags(&json!({"joined": 1})), vec!["1 retry joined"]);
        assert_eq!(flags(&json!({"tasks_waiting": 1})), vec!["a task waits"]);
        assert_eq!(flags(&json!({"tasks_waiting": 3})), vec!["3 tasks wait"]);
        assert!(flags(&json!({"tasks_waiting": 0})).is_empty());
        assert_eq!(flags(&json!({"joined": 3})), vec!["3 retries joined"]);
        assert_eq!(
            flags(&json!({
                "revises": {"proposal_id": "p-1"},
                "beside": {"proposal_id": "p-0"},
                "definition_change": {"before": "a"},
                "looks_like": "charge_card",
                "progress": "1 of 2 approvals",
                "joined": 2
            })),
            vec![
                "revises p-1",
                "another call beside p-0",
                "tool definition changed",
                "name looks like charge_card",
                "1 of 2 approvals",
                "2 retries joined"
            ]
        );
    }
}
