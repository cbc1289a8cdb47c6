//! One call's audit trail: the fields every entry of a `tools/call` carries
//! (call digest, idempotency key, principal, tenant, server, tool), and the
//! entries the pipeline records as it goes (DESIGN.md section 8). Without
//! an audit log (commands other than `serve`) it records nothing and costs
//! nothing.

use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::audit::log::AuditLog;
use crate::canonical::CanonicalCall;
use crate::decision::Decision;
use crate::identity::Identity;

/// The audit trail of one call.
pub struct Trail {
    log: Option<(Arc<AuditLog>, Map<String, Value>)>,
}

impl Trail {
    /// The trail of `call` by `who` under `client_key`.
    pub fn new(
        audit: Option<&Arc<AuditLog>>,
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
                base.insert("server".into(), json!(server));
                base.insert("tool".into(), json!(call.tool));
                (a.clone(), base)
            }),
        }
    }

    fn fields(base: &Map<String, Value>, extra: Vec<(&str, Value)>) -> Map<String, Value> {
        let mut f = base.clone();
        for (k, v) in extra {
            f.insert(k.to_owned(), v);
        }
        f
    }

    /// Record an entry (buffered).
    pub fn record(&self, kind: &'static str, extra: Vec<(&str, Value)>) {
        if let Some((log, base)) = &self.log {
            log.record(kind, Self::fields(base, extra));
        }
    }

    /// Record an entry and wait until it is on disk.
    pub async fn durable(
        &self,
        kind: &'static str,
        extra: Vec<(&str, Value)>,
    ) -> Result<(), String> {
        match &self.log {
            Some((log, base)) => log.record_durable(kind, Self::fields(base, extra)).await,
            None => Ok(()),
        }
    }

    /// `call_received`, with the arguments as `audit.arguments` says.
    pub fn received(&self, call: &CanonicalCall, explicit: bool, read_only: bool) {
        if let Some((log, base)) = &self.log {
            let mut f = base.clone();
            f.insert("explicit_key".into(), json!(explicit));
            f.insert("read_only".into(), json!(read_only));
            log.arguments_fields(&call.arguments, &mut f);
            log.record("call_received", f);
        }
    }

    /// `decision`, with the determining policy ids.
    pub fn decision(&self, d: &Decision) {
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
