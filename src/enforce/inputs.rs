//! Decision inputs (`[policy] inputs`, DESIGN.md section 22): what each
//! call's decision needed, kept in the store for a bounded window so that
//! `countersign policy diff BASE HEAD` can decide recent calls again under
//! two policy folders without running anything.
//!
//! A call's inputs are recorded at its first decision (a revalidation after
//! an approval, or a retry with the same idempotency key, is the same call)
//! and handed to a task that writes them in batches, off the call's path.
//! Retention (`inputs_retention`, `inputs_max_rows`) is enforced by the same
//! task on the gateway's clock. The rows hold the arguments: they are
//! exported and erased per tenant (`countersign policy inputs`).

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::core::annotations::Annotations;
use crate::core::decision;
use crate::core::identity::Identity;
use crate::core::time::Clock;
use crate::store::{InputRow, Store};

/// What one decision needed, as kept.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Inputs {
    pub time_ms: i64,
    pub principal: String,
    pub tenant: String,
    #[serde(default)]
    pub groups: Vec<String>,
    pub server: String,
    pub tool: String,
    pub read_only: bool,
    pub destructive: bool,
    pub idempotent: bool,
    pub open_world: bool,
    pub definition_changed: bool,
    /// The canonical arguments, which the decision maps as Cedar sees them.
    pub arguments: Value,
    pub call_digest: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// The decision made then: `allow`, `approval` or `deny`.
    pub decision: String,
    /// The budgets as the decision saw them (`context.budgets`), when it
    /// was given them (a policy reads them): decided again on the same
    /// figures, not on today's spending.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub budgets: Vec<InputBudget>,
}

/// A budget as a decision saw it; amounts as exact decimal text.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct InputBudget {
    pub name: String,
    pub scope: String,
    pub spent: String,
    pub amount: String,
    pub limit: String,
    pub window_ms: i64,
    /// `approval` or `deny`.
    pub over: String,
}

impl InputBudget {
    fn of(s: &crate::core::guard::Spending) -> InputBudget {
        InputBudget {
            name: s.name.clone(),
            scope: s.scope.clone(),
            spent: s.spent.to_string(),
            amount: s.amount.to_string(),
            limit: s.limit.to_string(),
            window_ms: s.window_ms,
            over: s.over.as_str().to_owned(),
        }
    }

    fn spending(&self) -> Result<crate::core::guard::Spending, String> {
        use std::str::FromStr;
        let dec = |what: &str, t: &str| {
            rust_decimal::Decimal::from_str(t)
                .map_err(|e| format!("the recorded budget `{}` has {what} `{t}`: {e}", self.name))
        };
        Ok(crate::core::guard::Spending {
            name: self.name.clone(),
            scope: self.scope.clone(),
            spent: dec("spent", &self.spent)?,
            amount: dec("amount", &self.amount)?,
            limit: dec("limit", &self.limit)?,
            window_ms: self.window_ms,
            over: match self.over.as_str() {
                "approval" => crate::core::config::Over::Approval,
                "deny" => crate::core::config::Over::Deny,
                other => {
                    return Err(format!(
                        "the recorded budget `{}` has over `{other}`",
                        self.name
                    ))
                }
            },
        })
    }
}

impl Inputs {
    /// The inputs of `facts`, decided `decision` at `time_ms`.
    pub fn of(facts: &decision::Call<'_>, decision: &str, time_ms: i64) -> Inputs {
        Inputs {
            time_ms,
            principal: facts.identity.principal.clone(),
            tenant: facts.identity.tenant.clone(),
            groups: facts.identity.groups.clone(),
            server: facts.server.to_owned(),
            tool: facts.tool.to_owned(),
            read_only: facts.annotations.read_only,
            destructive: facts.annotations.destructive,
            idempotent: facts.annotations.idempotent,
            open_world: facts.annotations.open_world,
            definition_changed: facts.definition_changed,
            arguments: facts.arguments.clone(),
            call_digest: facts.digest.to_owned(),
            resource_version: facts.resource_version.map(str::to_owned),
            decision: decision.to_owned(),
            budgets: facts
                .budgets
                .unwrap_or_default()
                .iter()
                .map(InputBudget::of)
                .collect(),
        }
    }

    /// Decide these inputs again under `policies`.
    pub fn decide(&self, policies: &decision::Policies) -> decision::Decision {
        let identity = Identity {
            principal: self.principal.clone(),
            tenant: self.tenant.clone(),
            groups: self.groups.clone(),
            ..Default::default()
        };
        // A recorded budget that does not read back is a deny that says
        // so, never a decision made without it.
        let budgets = match self
            .budgets
            .iter()
            .map(InputBudget::spending)
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(b) => b,
            Err(e) => {
                return decision::Decision::Deny {
                    policies: Vec::new(),
                    errors: vec![e],
                }
            }
        };
        policies.decide(&decision::Call {
            identity: &identity,
            server: &self.server,
            tool: &self.tool,
            annotations: Annotations {
                read_only: self.read_only,
                destructive: self.destructive,
                idempotent: self.idempotent,
                open_world: self.open_world,
            },
            definition_changed: self.definition_changed,
            budgets: Some(&budgets),
            arguments: &self.arguments,
            digest: &self.call_digest,
            resource_version: self.resource_version.as_deref(),
        })
    }
}

/// Rows written at once, at most.
const BATCH: usize = 256;
/// How long a recorded row waits for others to share its write.
const LINGER: Duration = Duration::from_millis(500);
/// How often retention runs.
const COLLECT_EVERY: Duration = Duration::from_secs(60);

/// What the writing task is handed.
enum Msg {
    Row(Box<Inputs>),
    /// Write what waits now, then say so (a clean stop).
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// Hands recorded inputs to the writing task.
pub(crate) struct Recorder {
    tx: mpsc::UnboundedSender<Msg>,
}

impl Recorder {
    /// A recorder writing to `store`, and its task (spawn it).
    pub(crate) fn new(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        retention: Duration,
        max_rows: usize,
    ) -> (Recorder, impl std::future::Future<Output = ()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let recorder = Recorder { tx };
        let salt: u32 = rand::random();
        (recorder, write(rx, store, clock, retention, max_rows, salt))
    }

    /// Keep `inputs` (dropped silently when the task is gone: the gateway is
    /// stopping).
    pub(crate) fn record(&self, inputs: Inputs) {
        let _ = self.tx.send(Msg::Row(Box::new(inputs)));
    }

    /// Write what was recorded so far (a clean stop keeps it).
    pub(crate) async fn flush(&self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.tx.send(Msg::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

/// The row of `inputs`: keyed by time, then a number unique to this
/// gateway process (`salt`) and row.
fn row(inputs: &Inputs, salt: u32, n: u64) -> Option<InputRow> {
    Some(InputRow {
        key: format!("{:020}-{salt:08x}-{n:016x}", inputs.time_ms.max(0)),
        tenant: inputs.tenant.clone(),
        time_ms: inputs.time_ms,
        inputs: serde_json::to_string(inputs).ok()?,
    })
}

/// Collect old rows now and then; write what is recorded in batches.
async fn write(
    mut rx: mpsc::UnboundedReceiver<Msg>,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    retention: Duration,
    max_rows: usize,
    salt: u32,
) {
    let mut n = 0u64;
    let mut collect = tokio::time::interval(COLLECT_EVERY);
    loop {
        tokio::select! {
            first = rx.recv() => {
                let mut batch = Vec::new();
                let mut flushed = None;
                match first {
                    None => return,
                    Some(Msg::Row(i)) => batch.push(i),
                    Some(Msg::Flush(done)) => flushed = Some(done),
                }
                let deadline = tokio::time::sleep(LINGER);
                tokio::pin!(deadline);
                while flushed.is_none() && batch.len() < BATCH {
                    tokio::select! {
                        more = rx.recv() => match more {
                            Some(Msg::Row(i)) => batch.push(i),
                            Some(Msg::Flush(done)) => flushed = Some(done),
                            None => break,
                        },
                        () = &mut deadline => break,
                    }
                }
                let rows: Vec<InputRow> = batch
                    .iter()
                    .filter_map(|i| {
                        n += 1;
                        row(i, salt, n)
                    })
                    .collect();
                if !rows.is_empty() {
                    if let Err(e) = store.inputs_put(rows).await {
                        tracing::warn!("decision inputs not kept: {e}");
                    }
                }
                if let Some(done) = flushed {
                    let _ = done.send(());
                }
            }
            _ = collect.tick() => {
                let before = clock
                    .now_ms()
                    .saturating_sub(i64::try_from(retention.as_millis()).unwrap_or(i64::MAX));
                match store.inputs_gc(before, max_rows).await {
                    Ok(0) => {}
                    Ok(gone) => tracing::debug!(gone, "decision inputs past their retention collected"),
                    Err(e) => tracing::warn!("decision inputs not collected: {e}"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::time::ManualClock;
    use crate::store::MemoryStore;

    fn inputs(tenant: &str, time_ms: i64) -> Inputs {
        Inputs {
            time_ms,
            principal: "agent-7".into(),
            tenant: tenant.into(),
            groups: vec!["agents".into()],
            server: "payments".into(),
            tool: "refund".into(),
            read_only: false,
            destructive: false,
            idempotent: false,
            open_world: true,
            definition_changed: false,
            arguments: serde_json::json!({"charge": "ch_1", "amount": 1.5}),
            call_digest: "sha256:00".into(),
            resource_version: None,
            decision: "approval".into(),
            budgets: Vec::new(),
        }
    }

    /// A call decided on its budget's figures is decided again on the same
    /// figures (not on whatever is spent when `policy diff` runs), and a
    /// recorded figure that does not read back is a deny that says so.
    #[test]
    fn the_budgets_a_decision_saw_are_kept_and_decided_again() {
        let policies = decision::Policies::from_sources(&decision::PolicySources {
            dir: "policies".into(),
            policies: vec![(
                "policies/p.cedar".into(),
                r#"
                @id("all") permit (principal, action, resource);
                @id("twice") forbid (principal, action, resource) when {
                  context has budgets && context.budgets has "card-daily" &&
                  context.budgets["card-daily"].after.greaterThan(decimal("2000.0"))
                };"#
                .into(),
            )],
            ..Default::default()
        })
        .unwrap();
        let spending = [crate::core::guard::Spending {
            name: "card-daily".into(),
            scope: "principal:agent-7".into(),
            spent: rust_decimal::Decimal::from(1500),
            amount: rust_decimal::Decimal::new(60001, 2),
            limit: rust_decimal::Decimal::from(1000),
            window_ms: 86_400_000,
            over: crate::core::config::Over::Approval,
        }];
        let mut kept = inputs("acme", 10);
        let identity = Identity {
            principal: "agent-7".into(),
            tenant: "acme".into(),
            ..Default::default()
        };
        let facts = decision::Call {
            identity: &identity,
            server: "payments",
            tool: "refund",
            annotations: Annotations::default(),
            definition_changed: false,
            budgets: Some(&spending),
            arguments: &kept.arguments,
            digest: "sha256:00",
            resource_version: None,
        };
        let recorded = Inputs::of(&facts, "deny", 10);
        assert_eq!(recorded.budgets[0].amount, "600.01");
        let back: Inputs =
            serde_json::from_value(serde_json::to_value(&recorded).unwrap()).unwrap();
        assert_eq!(back, recorded);
        assert!(
            matches!(back.decide(&policies), decision::Decision::Deny { ref policies, .. } if policies.iter().any(|p| p.contains("twice"))),
            "{:?}",
            back.decide(&policies)
        );
        // Without the budget the same call is allowed: the figures decided it.
        assert!(matches!(
            kept.decide(&policies),
            decision::Decision::Allow { .. }
        ));
        kept.budgets = recorded.budgets.clone();
        kept.budgets[0].spent = "lots".into();
        let decision::Decision::Deny { errors, .. } = kept.decide(&policies) else {
            panic!("a bent figure must deny")
        };
        assert!(
            errors[0].contains("card-daily") && errors[0].contains("lots"),
            "{errors:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn rows_are_written_in_batches_and_retention_follows_the_clock() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let clock = Arc::new(ManualClock::new(10_000_000));
        let (rec, task) = Recorder::new(
            store.clone(),
            clock.clone(),
            Duration::from_secs(3600),
            1000,
        );
        let task = tokio::spawn(task);
        rec.record(inputs("acme", 10_000_000));
        rec.record(inputs("globex", 10_000_001));
        rec.flush().await;
        let rows = store.inputs_since(0, None).await.unwrap();
        assert_eq!(rows.len(), 2);
        let back: Inputs = serde_json::from_str(&rows[0].inputs).unwrap();
        assert_eq!(back, inputs("acme", 10_000_000));
        // Two hours later on the gateway's clock: past the retention.
        clock.advance(Duration::from_secs(2 * 3600));
        tokio::time::sleep(COLLECT_EVERY * 2).await;
        assert!(store.inputs_since(0, None).await.unwrap().is_empty());
        task.abort();
    }
}
