//! The policy decision as a service: the Cedar policy set in force (swapped
//! whole by a reload), asked with the facts of one call (DESIGN.md section
//! 4). The determining policies go to the log and the audit trail, never
//! to the agent.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::RwLock;

use super::call::{explicit_version, Call};
use super::metrics::Metrics;
use super::shadow::Shadow;
use crate::core::config::Config;
use crate::core::decision::{Decision, Policies};

/// The policies in force, and how long deciding takes (`/metrics`).
pub(crate) struct Judge {
    config: Arc<Config>,
    policies: RwLock<Arc<Policies>>,
    metrics: Arc<Metrics>,
    /// The shadow set decided beside it (`[policy] shadow`).
    shadow: Shadow,
    /// Where decision inputs go (`[policy] inputs`), once started.
    recorder: std::sync::OnceLock<super::inputs::Recorder>,
    /// Keyed calls whose inputs were recorded (a revalidation or a retry of
    /// the same call is not recorded again).
    recorded: parking_lot::Mutex<super::shadow::Seen>,
}

impl Judge {
    /// A judge deciding with `policies`.
    pub(crate) fn new(config: Arc<Config>, policies: Policies, metrics: Arc<Metrics>) -> Judge {
        Judge {
            config,
            policies: RwLock::new(Arc::new(policies)),
            shadow: Shadow::new(metrics.clone()),
            recorder: std::sync::OnceLock::new(),
            recorded: Default::default(),
            metrics,
        }
    }

    /// The policy set in force now.
    pub(crate) fn policies(&self) -> Arc<Policies> {
        self.policies.read().clone()
    }

    /// Put a new policy set in force (a successful reload).
    pub(crate) fn set_policies(&self, policies: Policies) {
        *self.policies.write() = Arc::new(policies);
    }

    /// Record each call's decision inputs with `recorder` from now on.
    pub(crate) fn record_inputs(&self, recorder: super::inputs::Recorder) {
        let _ = self.recorder.set(recorder);
    }

    /// Write the decision inputs recorded so far (a clean stop).
    pub(crate) async fn flush_inputs(&self) {
        if let Some(r) = self.recorder.get() {
            r.flush().await;
        }
    }

    /// The shadow set (`[policy] shadow`).
    pub(crate) fn shadow(&self) -> &Shadow {
        &self.shadow
    }

    /// The policy decision (DESIGN.md section 4) with the policies in force
    /// now; the determining policies go to the log and the audit trail,
    /// never to the agent.
    pub(crate) fn decide<U>(&self, c: &Call<'_, U>) -> Decision {
        self.decide_with(c, None)
    }

    /// [`Judge::decide`] with the budgets the call falls under, as Cedar's
    /// `context.budgets` (DESIGN.md section 25).
    pub(crate) fn decide_with<U>(
        &self,
        c: &Call<'_, U>,
        budgets: Option<&[crate::core::guard::Spending]>,
    ) -> Decision {
        let server = c.ctx.server;
        let who = &c.ctx.caller.identity;
        let span = crate::telemetry::stage!(
            "decision",
            countersign.decision = tracing::field::Empty,
            countersign.policies = tracing::field::Empty,
        );
        let _in_span = span.enter();
        let started = Instant::now();
        let in_force = self.policies();
        let mut facts = facts(c);
        facts.budgets = budgets;
        let decision = in_force.decide(&facts);
        self.metrics.decision(started.elapsed());
        if !span.is_none() {
            let (verdict, policies) = match &decision {
                Decision::Allow { policies } => ("allow", policies),
                Decision::Approval { policies } => ("approval", policies),
                Decision::Deny { policies, .. } => ("deny", policies),
            };
            let policies = policies.join(",");
            span.record("countersign.decision", verdict);
            span.record("countersign.policies", policies);
        }
        match &decision {
            Decision::Allow { policies } => {
                tracing::debug!(%server, tool = %c.call.tool, policies = %policies.join(","), "policy: allow");
            }
            Decision::Approval { policies } => {
                tracing::info!(%server, tool = %c.call.tool, policies = %policies.join(","), principal = %who.principal, "policy: approval required");
            }
            Decision::Deny { .. } => {
                tracing::info!(%server, tool = %c.call.tool, principal = %who.principal, "policy: denied ({decision})");
            }
        }
        c.trail.decision(&decision);
        // After the decision's own entry: the log keeps cause before effect.
        self.shadow.compare(c, &facts, &decision, &in_force);
        if let Some(recorder) = self.recorder.get() {
            // A keyed call once per set of arguments (a resend under its key
            // with other arguments is decided on other inputs); a read
            // without a key per call.
            if c.claim.client_key.is_empty()
                || self
                    .recorded
                    .lock()
                    .first(format!("{}\u{1f}{}", c.claim.key, c.claim.digest))
            {
                recorder.record(super::inputs::Inputs::of(
                    &facts,
                    super::shadow::verdict(&decision),
                    crate::core::time::now_ms(),
                ));
            }
        }
        decision
    }

    /// May the person at the client answer this call's proposal? The
    /// switch `approvals.client`, then `Action::"confirm"` in the policies
    /// in force now.
    pub(crate) fn may_confirm<U>(&self, c: &Call<'_, U>) -> bool {
        if !self.config.approvals.client {
            return false;
        }
        let allowed = self.policies().may_confirm(&facts(c));
        match allowed {
            Ok(policies) => {
                tracing::debug!(tool = %c.call.tool, policies = %policies.join(","), "the client may confirm");
                true
            }
            Err(d) => {
                tracing::debug!(tool = %c.call.tool, "the client may not confirm ({d})");
                false
            }
        }
    }
}

/// The facts of a call the policies decide on (the tool as the catalog had
/// it when the call arrived).
fn facts<'b, U>(c: &'b Call<'b, U>) -> crate::core::decision::Call<'b> {
    crate::core::decision::Call {
        identity: &c.ctx.caller.identity,
        server: c.ctx.server,
        tool: &c.call.tool,
        annotations: c.annotations,
        definition_changed: c.tool.changed,
        budgets: None,
        arguments: &c.call.arguments,
        digest: &c.call.digest,
        resource_version: explicit_version(c.call),
    }
}
