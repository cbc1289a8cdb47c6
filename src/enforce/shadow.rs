//! Shadow policies (DESIGN.md section 22): a second policy set, decided
//! beside the one in force on every call with the same entities and context
//! and the same two phases, which never changes what happens. Where the two
//! disagree, the call is counted (`countersign_shadow_disagreements_total`,
//! by server, tool and the direction `from` → `to`) and written to the audit
//! log as `shadow_disagreement`: the call digest and who asked (the trail's
//! base fields), both outcomes, and both sets' determining policies and
//! digests. Arguments are not in it: the call's own entries record them as
//! `audit.arguments` says.
//!
//! The shadow decision is made right after the enforced one, on the
//! answer's path: with the decision cache a Cedar decision costs a few
//! thousand instructions, less than handing its inputs to another task.
//! A shadow set that does not load is logged and ignored (it never stops
//! the gateway), and a shadow evaluation that errors is a shadow deny, as
//! in the set in force: it can never read as an allow.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use serde_json::json;

use super::call::Call;
use super::metrics::{Metrics, UNLISTED_TOOL};
use crate::core::decision::{self, Decision, Policies};

/// Keyed calls whose disagreement was counted, at most this many: a
/// revalidation after an approval, or a retry with the same idempotency key,
/// is the same call and is not counted again.
const SEEN_MAX: usize = 65_536;

/// The shadow set, when one is configured and loads.
pub(crate) struct Shadow {
    policies: RwLock<Option<Arc<Policies>>>,
    seen: Mutex<Seen>,
    metrics: Arc<Metrics>,
}

/// Keys seen lately, at most [`SEEN_MAX`] (the oldest are forgotten first).
#[derive(Default)]
pub(crate) struct Seen {
    set: HashSet<String>,
    order: VecDeque<String>,
}

impl Seen {
    /// Whether `key` is new (and remember it).
    pub(crate) fn first(&mut self, key: String) -> bool {
        if self.set.contains(&key) {
            return false;
        }
        if self.order.len() >= SEEN_MAX {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        self.order.push_back(key.clone());
        self.set.insert(key);
        true
    }
}

/// `allow`, `approval` or `deny`: the label of a decision's outcome.
pub(crate) fn verdict(d: &Decision) -> &'static str {
    match d {
        Decision::Allow { .. } => "allow",
        Decision::Approval { .. } => "approval",
        Decision::Deny { .. } => "deny",
    }
}

fn determining(d: &Decision) -> &[String] {
    match d {
        Decision::Allow { policies }
        | Decision::Approval { policies }
        | Decision::Deny { policies, .. } => policies,
    }
}

impl Shadow {
    /// No shadow set yet.
    pub(crate) fn new(metrics: Arc<Metrics>) -> Shadow {
        Shadow {
            policies: RwLock::new(None),
            seen: Mutex::new(Seen::default()),
            metrics,
        }
    }

    /// Put `policies` in the shadow (a successful load or reload), or take
    /// the shadow away.
    pub(crate) fn set(&self, policies: Option<Policies>) {
        *self.policies.write() = policies.map(Arc::new);
    }

    /// The shadow set, when there is one.
    pub(crate) fn policies(&self) -> Option<Arc<Policies>> {
        self.policies.read().clone()
    }

    /// Decide `facts` under the shadow set too; when the outcome differs
    /// from `enforced` (decided under `in_force`), count it and record it in
    /// `c`'s trail. Changes nothing about the call.
    pub(crate) fn compare<U>(
        &self,
        c: &Call<'_, U>,
        facts: &decision::Call<'_>,
        enforced: &Decision,
        in_force: &Policies,
    ) {
        let Some(shadow) = self.policies() else {
            return;
        };
        // The shadow's own errors deny (default deny), like the set in
        // force: an evaluation error is never a shadow allow.
        let shadowed = shadow.decide(facts);
        let (from, to) = (verdict(enforced), verdict(&shadowed));
        if from == to {
            return;
        }
        // A keyed call (a write, or a read with a key) is counted once per
        // direction, whatever the revalidations and retries; a read without
        // a key is counted per call.
        if !c.claim.client_key.is_empty()
            && !self
                .seen
                .lock()
                .first(format!("{}\u{0}{from}\u{0}{to}", c.claim.key))
        {
            return;
        }
        // Only names the server lists become label values.
        let tool = if c.tool.digest.is_some() {
            c.call.tool.as_str()
        } else {
            UNLISTED_TOOL
        };
        self.metrics
            .shadow_disagreement(c.ctx.server, tool, from, to);
        tracing::info!(server = %c.ctx.server, tool = %c.call.tool, principal = %c.ctx.caller.identity.principal, %from, %to, "shadow policies disagree");
        let mut fields = vec![
            ("from", json!(from)),
            ("to", json!(to)),
            ("policies", json!(determining(enforced))),
            ("shadow_policies", json!(determining(&shadowed))),
            ("policy_set", json!(in_force.digest())),
            ("shadow_policy_set", json!(shadow.digest())),
        ];
        if let Decision::Deny { errors, .. } = &shadowed {
            if !errors.is_empty() {
                fields.push(("shadow_errors", json!(errors)));
            }
        }
        c.trail.record("shadow_disagreement", fields);
    }
}

#[cfg(test)]
mod tests {
    use super::Seen;

    #[test]
    fn a_key_counts_once_and_the_memory_stays_bounded() {
        let mut s = Seen::default();
        assert!(s.first("k".into()));
        assert!(!s.first("k".into()));
        for i in 0..super::SEEN_MAX + 10 {
            s.first(format!("x{i}"));
        }
        assert_eq!(s.set.len(), super::SEEN_MAX);
        assert_eq!(s.order.len(), super::SEEN_MAX);
        // The oldest went first.
        assert!(s.first("k".into()));
    }
}
