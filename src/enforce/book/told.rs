//! What the book tells: the audit log's entries about proposals, the
//! webhooks' notices (queued in the commit that makes each change) and the
//! events of live clients.

use serde_json::Value;

use super::{Book, Event};
use crate::core::approval::{
    Confirmation, Given, Proposal, ProposalState, SignedDecision, Verdict,
};
use crate::core::notify::{self, Notice};
use crate::core::review::decided_kind;
use crate::core::reviewers::Reviewer;
use crate::core::time::{ms, rfc3339};

/// The fields every proposal entry of the audit log carries.
pub(super) fn proposal_fields(p: &Proposal) -> serde_json::Map<String, Value> {
    let mut f = serde_json::Map::new();
    f.insert("proposal_id".into(), Value::from(p.id.clone()));
    f.insert("principal".into(), Value::from(p.requester.clone()));
    f.insert("tenant".into(), Value::from(p.tenant.clone()));
    f.insert("server".into(), Value::from(p.server.clone()));
    f.insert("tool".into(), Value::from(p.tool.clone()));
    f.insert("call_digest".into(), Value::from(p.call_digest.clone()));
    f.insert(
        "resource_version".into(),
        p.resource_version.clone().map_or(Value::Null, Value::from),
    );
    f.insert(
        "tool_definition".into(),
        p.tool_definition.clone().map_or(Value::Null, Value::from),
    );
    f
}

impl Book {
    /// The notices `p`'s change announces (none without webhooks): created,
    /// decided (approved, quorum met, denied, an approval withdrawn), or
    /// expired.
    pub(super) fn announce(
        &self,
        p: &Proposal,
        from: Option<ProposalState>,
        withdrawn: Option<&str>,
    ) -> Vec<Notice> {
        if self.webhooks.is_empty() {
            return Vec::new();
        }
        use crate::core::config::EventKind as K;
        let by = |d: &Option<SignedDecision>| {
            d.as_ref()
                .map(|d| {
                    (
                        format!("reviewer {}", d.statement.reviewer),
                        d.statement.reason.clone(),
                    )
                })
                .unwrap_or_default()
        };
        let (kind, decision) = match (from, p.state, withdrawn) {
            (None, ProposalState::Pending, _) => (K::ProposalCreated, None),
            (Some(ProposalState::Pending), ProposalState::Pending, Some(who)) => (
                K::ProposalDecided,
                Some((
                    "approval withdrawn".to_owned(),
                    format!("reviewer {who}"),
                    String::new(),
                )),
            ),
            (Some(ProposalState::Pending), ProposalState::Approved, _) => {
                let what = if p.quorum.is_single() {
                    "approved"
                } else {
                    "quorum met"
                };
                let (who, reason) = match &p.confirmation {
                    Some(c) => (
                        format!("the person at the client ({})", c.principal),
                        c.reason.clone(),
                    ),
                    None => by(&p.decision),
                };
                (K::ProposalDecided, Some((what.to_owned(), who, reason)))
            }
            (Some(ProposalState::Pending), ProposalState::Denied, _) => {
                let (who, reason) = match &p.confirmation {
                    Some(c) => (
                        format!("the person at the client ({})", c.principal),
                        c.reason.clone(),
                    ),
                    None => by(&p.decision),
                };
                (K::ProposalDecided, Some(("denied".to_owned(), who, reason)))
            }
            (Some(_), ProposalState::Expired, _) => (K::ProposalExpired, None),
            _ => return Vec::new(),
        };
        let decision = decision
            .as_ref()
            .map(|(w, b, r)| (w.as_str(), b.as_str(), r.as_str()));
        let pending_until = p.created_ms.saturating_add(ms(self.config.pending_ttl));
        let mut event = notify::Event::proposal(kind, p, decision, pending_until);
        // Before the event is queued: a value `audit.redact` names is in
        // neither the outbox nor any webhook's body.
        if let Some(arguments) = event.facts.get_mut("arguments") {
            crate::core::redact::redact(arguments, &self.redact);
        }
        if let Some(prefix) = self.review_url.get() {
            event.facts.insert(
                "review_url".into(),
                Value::from(format!("{prefix}{}", p.id)),
            );
        }
        event.notices(&self.webhooks, self.clock.now_ms())
    }

    /// Record a proposal's change in the audit log.
    pub(super) fn audit(&self, kind: &'static str, p: &Proposal, extra: &[(&str, Value)]) {
        if let Some(a) = &self.audit {
            let mut f = proposal_fields(p);
            for (k, v) in extra {
                f.insert((*k).to_owned(), v.clone());
            }
            a.record(kind, f);
        }
    }

    pub(super) fn publish(&self, kind: &'static str, p: &Proposal) {
        // No receivers is fine: nobody is watching.
        let _ = self.events.send(Event {
            kind,
            proposal: p.clone(),
        });
    }

    /// Log and audit a decision just written: for a single reviewer, the
    /// decision; with a quorum, one entry per reviewer's part, and one more
    /// when the quorum is met or the denials end it. The signed statement
    /// goes into the log whole: `audit verify` checks it against
    /// reviewers.toml without trusting the gateway.
    pub(super) fn decided(&self, next: &Proposal, reviewer: &Reviewer, given: &Given) {
        tracing::info!(proposal = %next.id, reviewer = %reviewer.name, state = next.state.as_str(), progress = %next.progress().unwrap_or_default(), "proposal decided");
        let policy_set = given
            .signed
            .statement
            .policy_set
            .clone()
            .map_or(Value::Null, Value::from);
        let expires_at = next
            .expires_ms
            .map_or(Value::Null, |e| Value::from(rfc3339(e)));
        if next.quorum.is_single() {
            self.audit(
                decided_kind(next),
                next,
                &[
                    ("channel", Value::from("reviewer")),
                    ("reviewer", Value::from(reviewer.name.clone())),
                    (
                        "approval",
                        serde_json::to_value(&given.signed).unwrap_or(Value::Null),
                    ),
                    ("policy_set", policy_set),
                    ("expires_at", expires_at),
                ],
            );
            return;
        }
        let kind = match given.signed.statement.decision {
            Verdict::Approve => "approval_partial",
            Verdict::Deny => "denial_partial",
        };
        self.audit(
            kind,
            next,
            &[
                ("channel", Value::from("reviewer")),
                ("reviewer", Value::from(reviewer.name.clone())),
                ("groups", Value::from(given.groups.clone())),
                (
                    "approval",
                    serde_json::to_value(&given.signed).unwrap_or(Value::Null),
                ),
                ("policy_set", policy_set),
                (
                    "quorum",
                    serde_json::to_value(&next.quorum).unwrap_or(Value::Null),
                ),
                ("progress", Value::from(next.progress().unwrap_or_default())),
            ],
        );
        if next.state != ProposalState::Pending {
            let names = |list: &[Given]| -> Value {
                list.iter().map(|g| Value::from(g.reviewer())).collect()
            };
            let (who, field) = match next.state {
                ProposalState::Approved => (names(&next.approvals), "approvers"),
                _ => (names(&next.denials), "deniers"),
            };
            self.audit(
                decided_kind(next),
                next,
                &[
                    ("channel", Value::from("reviewer")),
                    (field, who),
                    (
                        "quorum",
                        serde_json::to_value(&next.quorum).unwrap_or(Value::Null),
                    ),
                    ("expires_at", expires_at),
                ],
            );
        }
    }

    /// An answer from the client that came after another answer won:
    /// recorded, never applied.
    pub fn too_late(&self, p: &Proposal, c: &Confirmation, why: &str) {
        tracing::warn!(proposal = %p.id, principal = %c.principal, "the client's answer came too late: {why}");
        self.audit(
            "confirmation_too_late",
            p,
            &[
                ("channel", Value::from("client")),
                (
                    "confirmation",
                    serde_json::to_value(c).unwrap_or(Value::Null),
                ),
                ("reason", Value::from(why)),
            ],
        );
    }
}
