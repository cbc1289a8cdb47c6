//! One call's audit trail: the fields every entry of a `tools/call` carries
//! (call digest, idempotency key, principal, tenant, server, tool), and the
//! entries the pipeline records as it goes (DESIGN.md section 8). Without
//! an audit log (commands other than `serve`) it records nothing and costs
//! nothing.
//!
//! Entries are stamped when they happen and handed to the writer together:
//! with the durable `dispatched` entry (so everything before a dispatch is
//! on disk with it), and when the call ends. One wake-up of the writer
//! thread per call instead of one per entry halved the audit's cost on a
//! relayed read.

use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::audit::log::Staged;
use crate::audit::{AuditSink, Entries};
use crate::core::canonical::CanonicalCall;
use crate::core::decision::Decision;
use crate::core::identity::Identity;

/// The audit trail of one call.
pub(crate) struct Trail {
    log: Option<(Arc<dyn AuditSink>, Map<String, Value>)>,
    // A std mutex: held for a push or a drain, never across an await.
    pending: parking_lot::Mutex<Vec<(&'static str, Map<String, Value>)>>,
}

fn now() -> Value {
    Value::from(crate::core::time::rfc3339(crate::core::time::now_ms()))
}

impl Trail {
    /// The trail of `call` by `who` under `client_key`.
    pub(crate) fn new(
        audit: Option<&Arc<dyn AuditSink>>,
        who: &Identity,
        server: &str,
        call: &CanonicalCall,
        client_key: &str,
    ) -> Trail {
        Trail {
            log: audit.map(|a| {
                let mut base = Map::with_capacity(8);
                base.insert("call_digest".into(), json!(call.digest));
                base.insert("idempotency_key".into(), json!(client_key));
                base.insert("principal".into(), json!(who.principal));
                base.insert("tenant".into(), json!(who.tenant));
                // The OAuth client the requester's token was issued to.
                if let Some(c) = &who.client {
                    base.insert("client".into(), json!(c));
                }
                base.insert("server".into(), json!(server));
                base.insert("tool".into(), json!(call.tool));
                (a.clone(), base)
            }),
            pending: parking_lot::Mutex::new(Vec::new()),
        }
    }

    fn take(&self) -> Vec<(&'static str, Map<String, Value>)> {
        std::mem::take(&mut *self.pending.lock())
    }

    fn push(&self, kind: &'static str, mut f: Map<String, Value>) {
        f.insert("time".into(), now());
        self.pending.lock().push((kind, f));
    }

    fn fields(base: &Map<String, Value>, extra: Vec<(&str, Value)>) -> Map<String, Value> {
        let mut f = base.clone();
        for (k, v) in extra {
            f.insert(k.to_owned(), v);
        }
        f
    }

    /// Record an entry: stamped now, handed to the writer with the
    /// dispatch, at a flush, or when the call ends.
    pub(crate) fn record(&self, kind: &'static str, extra: Vec<(&str, Value)>) {
        if let Some((_, base)) = &self.log {
            self.push(kind, Self::fields(base, extra));
        }
    }

    /// Hand what is pending to the writer now (before entries that others
    /// record, such as a proposal this call creates, so the log keeps
    /// cause before effect).
    pub(crate) fn flush(&self) {
        if let Some((log, _)) = &self.log {
            log.record_all(self.take());
        }
    }

    /// Stage this call's pending entries plus `dispatched` for the ledger's
    /// outbox (one fsync with the `dispatched` record). `None` without an
    /// audit log; `Some(Err(entries))` when the log has no outbox (then the
    /// caller makes them durable itself).
    pub(crate) fn stage_dispatch(&self) -> Option<(Arc<dyn AuditSink>, Result<Staged, Entries>)> {
        let (log, base) = self.log.as_ref()?;
        self.push("dispatched", base.clone());
        Some((log.clone(), log.stage(self.take())))
    }

    /// `call_received`, with the arguments as `audit.arguments` says.
    pub(crate) fn received(&self, call: &CanonicalCall, explicit: bool, read_only: bool) {
        if let Some((log, base)) = &self.log {
            let mut f = base.clone();
            f.insert("explicit_key".into(), json!(explicit));
            f.insert("read_only".into(), json!(read_only));
            log.arguments_fields_jcs(&call.arguments, &call.arguments_jcs, &mut f);
            self.push("call_received", f);
        }
    }

    /// `decision`, with the determining policy ids.
    pub(crate) fn decision(&self, d: &Decision) {
        let (decision, policies, errors) = match d {
            Decision::Allow { policies } => ("allow", policies, None),
            Decision::Approval { policies } => ("approval", policies, None),
            Decision::Deny { policies, errors } => ("deny", policies, Some(errors)),
        };
        let mut extra = vec![("decision", json!(decision)), ("policies", json!(policies))];
        if let Some(errors) = errors.filter(|e| !e.is_empty()) {
            extra.push(("errors", json!(errors)));
        }
        self.record("decision", extra);
    }
}

impl Drop for Trail {
    /// The call ended (answered, refused or cancelled): hand its entries to
    /// the writer.
    fn drop(&mut self) {
        if let Some((log, _)) = &self.log {
            log.record_all(self.take());
        }
    }
}
