//! Prometheus metrics of the enforcement layer (DESIGN.md section 16),
//! kept with `prometheus-client` and written in the OpenMetrics text format
//! (which Prometheus scrapes).
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `countersign_tool_calls_total` | counter | `server`, `tool`, `outcome` |
//! | `countersign_decision_duration_seconds` | histogram | |
//! | `countersign_store_duration_seconds` | histogram | `op` (`lookup`, `reserve`, `dispatched`, `complete`) |
//! | `countersign_pending_proposals` | gauge | |
//! | `countersign_unknown_outcomes` | gauge | |
//! | `countersign_circuit_state` | gauge (1 for the current state) | `server`, `state` |
//! | `countersign_audit_lag_entries` | gauge | |
//! | `countersign_ledger_unflushed` | gauge (1 or 0) | |
//! | `countersign_ledger_writes_refused` | gauge (1 or 0) | |
//! | `countersign_notifications` | gauge (a count the store keeps) | `webhook`, `result` (`delivered`, `retried`, `gave_up`) |
//! | `countersign_notifications_queued` | gauge | |
//! | `countersign_trace_spans` | gauge (a count since start) | `result` (`exported`, `dropped`, `failed`) |
//! | `countersign_runtime_tasks` | gauge | |
//! | `countersign_shadow_disagreements_total` | counter | `server`, `tool`, `from`, `to` (`allow`, `approval`, `deny`) |
//! | `countersign_guard_stops_total` | counter | `guard` (`budget/NAME`, `effect_key/NAME`), `result` (`held`, `refused`) |
//! | `countersign_budget_spent_total` | counter (amounts, exact to a float) | `budget` |
//! | `countersign_budget_limit` | gauge | `budget` |
//! | `countersign_refusals_total` | counter | `what` (`tool_call_without_id`, `tool_call_lookalike`, `notification_method`, `malformed`, `origin`, `token`, `control`, `control_replay`, `rate_limited`, `body_timeout`, ...) |
//!
//! `outcome` is `ok` (the server's answer relayed), `replayed`, `joined`,
//! `cached`, `invalid_params`, or the code the agent got (`approval_pending`,
//! `policy_denied`, `outcome_unknown`, `upstream_unavailable`, ...). The
//! gauges are read when scraped.

use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::outcome::CallOutcome;

type CallLabels = [(&'static str, String); 3];
type OpLabels = [(&'static str, &'static str); 1];
type CircuitLabels = [(&'static str, String); 2];
type ShadowLabels = [(&'static str, String); 4];

/// The label of a tool the server does not list: client-chosen names never
/// become label values, so a client cannot grow the metrics without bound.
pub(crate) const UNLISTED_TOOL: &str = "(unlisted)";

fn latency() -> Histogram {
    // 10 µs to about 5 s.
    Histogram::new(exponential_buckets(0.000_01, 2.5, 15))
}

/// The registry and its metrics.
pub struct Metrics {
    registry: Registry,
    calls: Family<CallLabels, Counter>,
    decision: Histogram,
    store: Family<OpLabels, Histogram, fn() -> Histogram>,
    pending: Gauge,
    unknown: Gauge,
    circuit: Family<CircuitLabels, Gauge>,
    audit_lag: Gauge,
    ledger_unflushed: Gauge,
    ledger_refusing: Gauge,
    notifications: Family<CircuitLabels, Gauge>,
    notifications_queued: Gauge,
    trace_spans: Family<OpLabels, Gauge>,
    refusals: Family<OpLabels, Counter>,
    shadow: Family<ShadowLabels, Counter>,
    tasks: Gauge,
    mcp_tasks: Family<OpLabels, Counter>,
    guard_stops: Family<CircuitLabels, Counter>,
    budget_spent: Family<NameLabel, Counter<f64, std::sync::atomic::AtomicU64>>,
    budget_limit: Family<NameLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// Each budget's two series, once made: a guarded write updates them
    /// without making a label (names come from the config, not from
    /// clients: foldhash serves).
    budget_series: parking_lot::RwLock<crate::core::FastMap<String, BudgetSeries>>,
    /// Each `tool_calls` series, once made, by server, tool and outcome: a
    /// call counts itself without making three label strings. The names
    /// are configured servers and tools a server listed (or
    /// [`UNLISTED_TOOL`]), never a client's text: foldhash serves.
    call_series: parking_lot::RwLock<CallSeries>,
}

type CallSeries =
    crate::core::FastMap<String, crate::core::FastMap<String, Vec<(&'static str, Counter)>>>;

type BudgetSeries = (
    Counter<f64, std::sync::atomic::AtomicU64>,
    Gauge<f64, std::sync::atomic::AtomicU64>,
);

type NameLabel = [(&'static str, String); 1];

/// What the scrape reads at the time of the scrape.
pub struct Sampled {
    /// Proposals waiting for a decision.
    pub pending: i64,
    /// `unknown` outcomes waiting to be reconciled.
    pub unknown: i64,
    /// Each upstream's circuit breaker: `closed`, `open` or `half-open`.
    pub circuits: Vec<(String, &'static str)>,
    /// Audit entries handed to the writer and not yet in the log file.
    pub audit_lag: i64,
    /// Whether ledger commits wait for their fsync (the store's `unflushed`).
    pub ledger_unflushed: bool,
    /// Whether the ledger refuses writes (the store's `refusing_writes`).
    pub ledger_refusing: bool,
    /// Each webhook's delivery counts, as the store keeps them (on
    /// PostgreSQL, those of every gateway).
    pub notifications: Vec<(String, crate::core::notify::WebhookStatus)>,
    /// Notifications waiting for delivery.
    pub notifications_queued: i64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Every metric, registered.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("countersign");
        let calls = Family::<CallLabels, Counter>::default();
        registry.register(
            "tool_calls",
            "tools/call requests by server, tool and how they ended",
            calls.clone(),
        );
        let decision = latency();
        // The unit is in the name, without a `# UNIT` line: some parsers
        // refuse units on histograms.
        registry.register(
            "decision_duration_seconds",
            "Time to decide a call against the policies",
            decision.clone(),
        );
        let store = Family::<OpLabels, Histogram, fn() -> Histogram>::new_with_constructor(latency);
        registry.register(
            "store_duration_seconds",
            "Time of the ledger operations on a call's path",
            store.clone(),
        );
        let pending = Gauge::default();
        registry.register(
            "pending_proposals",
            "Proposals waiting for a reviewer",
            pending.clone(),
        );
        let unknown = Gauge::default();
        registry.register(
            "unknown_outcomes",
            "Calls sent whose answer was lost, waiting to be reconciled",
            unknown.clone(),
        );
        let circuit = Family::<CircuitLabels, Gauge>::default();
        registry.register(
            "circuit_state",
            "Each upstream's circuit breaker: 1 for its current state",
            circuit.clone(),
        );
        let audit_lag = Gauge::default();
        registry.register(
            "audit_lag_entries",
            "Audit entries handed to the writer and not yet written to the log file",
            audit_lag.clone(),
        );
        let ledger_unflushed = Gauge::default();
        registry.register(
            "ledger_unflushed",
            "1 while ledger commits made without an fsync of their own wait for the next one",
            ledger_unflushed.clone(),
        );
        let ledger_refusing = Gauge::default();
        registry.register(
            "ledger_writes_refused",
            "1 while the ledger refuses writes because it cannot make them durable (reads go on)",
            ledger_refusing.clone(),
        );
        let notifications = Family::<CircuitLabels, Gauge>::default();
        registry.register(
            "notifications",
            "Webhook notifications by webhook and result (delivered, retried, gave_up), as the store counts them",
            notifications.clone(),
        );
        let notifications_queued = Gauge::default();
        registry.register(
            "notifications_queued",
            "Webhook notifications waiting for delivery",
            notifications_queued.clone(),
        );
        let trace_spans = Family::<OpLabels, Gauge>::default();
        registry.register(
            "trace_spans",
            "Finished trace spans since start: exported, dropped (the export queue was full) or failed (the collector refused or did not answer)",
            trace_spans.clone(),
        );
        let refusals = Family::<OpLabels, Counter>::default();
        registry.register(
            "refusals",
            "Requests refused at the door before anything ran, by what was refused",
            refusals.clone(),
        );
        let shadow = Family::<ShadowLabels, Counter>::default();
        registry.register(
            "shadow_disagreements",
            "Calls the shadow policy set would decide otherwise than the set in force, by server, tool and direction",
            shadow.clone(),
        );
        let tasks = Gauge::default();
        registry.register(
            "runtime_tasks",
            "Tasks alive in the gateway's async runtime (a leak shows as growth)",
            tasks.clone(),
        );
        let mcp_tasks = Family::<OpLabels, Counter>::default();
        registry.register(
            "mcp_tasks",
            "MCP tasks, by event: created, joined, claimed, cancelled, relayed (a server's own task), and how each held call's task ended (approved-executed, denied-not-executed, execution-error, outcome-unknown)",
            mcp_tasks.clone(),
        );
        let guard_stops = Family::<CircuitLabels, Counter>::default();
        registry.register(
            "guard_stops",
            "Calls a budget or an effect key stopped: held for a reviewer, or refused",
            guard_stops.clone(),
        );
        let budget_spent =
            Family::<NameLabel, Counter<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "budget_spent",
            "Amounts counted against each budget by this gateway since it started (`countersign budgets` reads the windows)",
            budget_spent.clone(),
        );
        let budget_limit = Family::<NameLabel, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "budget_limit",
            "Each budget's limit per window",
            budget_limit.clone(),
        );
        Metrics {
            guard_stops,
            budget_spent,
            budget_limit,
            budget_series: Default::default(),
            call_series: Default::default(),
            tasks,
            mcp_tasks,
            shadow,
            refusals,
            registry,
            calls,
            decision,
            store,
            pending,
            unknown,
            circuit,
            audit_lag,
            ledger_unflushed,
            ledger_refusing,
            notifications,
            notifications_queued,
            trace_spans,
        }
    }

    /// A call ended. `tool` must be a name the server lists, or
    /// [`UNLISTED_TOOL`].
    pub fn call(&self, server: &str, tool: &str, outcome: &CallOutcome) {
        let label = outcome_label(outcome);
        let known = self.call_series.read().get(server).and_then(|tools| {
            let series = tools.get(tool)?;
            series
                .iter()
                .find(|(l, _)| *l == label)
                .map(|(_, c)| c.inc())
        });
        if known.is_some() {
            return;
        }
        let counter = self
            .calls
            .get_or_create(&[
                ("server", server.to_owned()),
                ("tool", tool.to_owned()),
                ("outcome", label.to_owned()),
            ])
            .clone();
        counter.inc();
        let mut made = self.call_series.write();
        let series = made
            .entry(server.to_owned())
            .or_default()
            .entry(tool.to_owned())
            .or_default();
        // Another call may have made it in between: the same series.
        if !series.iter().any(|(l, _)| *l == label) {
            series.push((label, counter));
        }
    }

    /// An MCP task of a held call: `event` is one of a fixed set of labels.
    pub fn task(&self, event: &'static str) {
        self.mcp_tasks.get_or_create(&[("event", event)]).inc();
    }

    /// Guard `guard` stopped a call: `held` or `refused`.
    pub fn guard_stop(&self, guard: &str, result: &'static str) {
        self.guard_stops
            .get_or_create(&[("guard", guard.to_owned()), ("result", result.to_owned())])
            .inc();
    }

    /// A call counted `amount` against budget `name` (limit `limit`).
    pub fn budget_counted(&self, name: &str, amount: f64, limit: f64) {
        if let Some((spent, lim)) = self.budget_series.read().get(name) {
            spent.inc_by(amount);
            lim.set(limit);
            return;
        }
        let label = [("budget", name.to_owned())];
        let spent = self.budget_spent.get_or_create(&label).clone();
        let lim = self.budget_limit.get_or_create(&label).clone();
        spent.inc_by(amount);
        lim.set(limit);
        self.budget_series
            .write()
            .insert(name.to_owned(), (spent, lim));
    }

    /// A front refused something before it reached the pipeline or an
    /// upstream (`what` is one of a fixed set of labels).
    pub fn refused(&self, what: &'static str) {
        self.refusals.get_or_create(&[("what", what)]).inc();
    }

    /// The shadow set would decide a call `to` where the set in force
    /// decided `from`. `tool` must be a listed name or [`UNLISTED_TOOL`].
    pub fn shadow_disagreement(&self, server: &str, tool: &str, from: &str, to: &str) {
        self.shadow
            .get_or_create(&[
                ("server", server.to_owned()),
                ("tool", tool.to_owned()),
                ("from", from.to_owned()),
                ("to", to.to_owned()),
            ])
            .inc();
    }

    /// A decision took `d`.
    pub fn decision(&self, d: Duration) {
        self.decision.observe(d.as_secs_f64());
    }

    /// A ledger operation took `d`.
    pub fn store(&self, op: &'static str, d: Duration) {
        self.store
            .get_or_create(&[("op", op)])
            .observe(d.as_secs_f64());
    }

    /// The exposition, with the gauges set from `now`.
    pub fn render(&self, now: &Sampled) -> String {
        self.pending.set(now.pending);
        self.unknown.set(now.unknown);
        self.audit_lag.set(now.audit_lag);
        self.ledger_unflushed.set(i64::from(now.ledger_unflushed));
        self.ledger_refusing.set(i64::from(now.ledger_refusing));
        for (server, state) in &now.circuits {
            for s in ["closed", "open", "half-open"] {
                self.circuit
                    .get_or_create(&[("server", server.clone()), ("state", s.to_owned())])
                    .set(i64::from(s == *state));
            }
        }
        self.notifications_queued.set(now.notifications_queued);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            self.tasks
                .set(i64::try_from(rt.metrics().num_alive_tasks()).unwrap_or(i64::MAX));
        }
        for (hook, st) in &now.notifications {
            for (result, n) in [
                ("delivered", st.delivered),
                ("retried", st.retried),
                ("gave_up", st.gave_up),
            ] {
                self.notifications
                    .get_or_create(&[("webhook", hook.clone()), ("result", result.to_owned())])
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
        let (exported, dropped, failed) = crate::telemetry::counts().read();
        for (result, n) in [
            ("exported", exported),
            ("dropped", dropped),
            ("failed", failed),
        ] {
            self.trace_spans
                .get_or_create(&[("result", result)])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// The `outcome` label of a call: the code the agent got when countersign
/// answered it itself (the same one the audit trail records).
pub(crate) fn outcome_label(outcome: &CallOutcome) -> &'static str {
    if let Some(code) = super::answer::code_of(outcome) {
        return code;
    }
    match outcome {
        CallOutcome::Replayed { .. } => "replayed",
        CallOutcome::Joined(_) => "joined",
        CallOutcome::Cached { .. } => "cached",
        CallOutcome::Invalid(_) => "invalid_params",
        _ => "ok",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::refusal::Outcome;

    fn sampled() -> Sampled {
        Sampled {
            pending: 0,
            unknown: 0,
            circuits: Vec::new(),
            audit_lag: 0,
            ledger_unflushed: false,
            ledger_refusing: false,
            notifications: Vec::new(),
            notifications_queued: 0,
        }
    }

    #[test]
    fn each_call_counts_once_in_its_own_series() {
        let m = Metrics::new();
        let refused = |tool: &str, why: Outcome| CallOutcome::Refused {
            why,
            key: String::new(),
            tool: tool.to_owned(),
        };
        let not_sent = refused("charge", Outcome::NotDispatched);
        let drift = refused("charge", Outcome::Drift);
        let (a, b) = (outcome_label(&not_sent), outcome_label(&drift));
        assert_ne!(a, b);
        for _ in 0..3 {
            m.call("pay", "charge", &not_sent);
        }
        // The same tool with another outcome is a series of its own.
        m.call("pay", "charge", &drift);
        m.call("pay", "refund", &refused("refund", Outcome::NotDispatched));
        m.call("read", "charge", &not_sent);
        let text = m.render(&sampled());
        let count = |server: &str, tool: &str, outcome: &str| {
            text.lines()
                .find(|l| {
                    l.starts_with("countersign_tool_calls_total{")
                        && l.contains(&format!("server=\"{server}\""))
                        && l.contains(&format!("tool=\"{tool}\""))
                        && l.contains(&format!("outcome=\"{outcome}\""))
                })
                .and_then(|l| l.rsplit(' ').next())
                .map(str::to_owned)
        };
        assert_eq!(count("pay", "charge", a).as_deref(), Some("3"), "{text}");
        assert_eq!(count("pay", "charge", b).as_deref(), Some("1"), "{text}");
        assert_eq!(count("pay", "refund", a).as_deref(), Some("1"), "{text}");
        assert_eq!(count("read", "charge", a).as_deref(), Some("1"), "{text}");
    }
}
