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
//!
//! An unattended read the policies allow is one entry, its `completed`:
//! what was called and by whom, with the arguments as `audit.arguments`
//! says (as any call's `call_received` has them), the decision and its
//! policies, the outcome, and when it was received (`received_at`) and
//! answered (`time`). Each entry
//! is hashed into the chain and into the Merkle tree, so three entries per
//! read (`call_received`, `decision`, `completed`) cost more than the whole
//! relay. A read that ends any other way (denied, held for approval,
//! refused by a breaker) is written as the separate entries every other
//! call has, so nothing about an exception is lost.

use std::sync::{Arc, OnceLock};

use serde_json::{json, Value};

use crate::audit::log::Staged;
use crate::audit::{AuditSink, Entries, Fields};
use crate::core::canonical::CanonicalCall;
use crate::core::decision::Decision;
use crate::core::identity::Identity;

/// The audit trail of one call.
pub(crate) struct Trail<'c> {
    log: Option<Log<'c>>,
    // A std mutex: held for a push or a drain, never across an await.
    pending: parking_lot::Mutex<Pending>,
}

struct Log<'c> {
    sink: Arc<dyn AuditSink>,
    /// The fields every entry carries (but the key).
    base: Fields,
    /// The idempotency key, once the call has one (a read without a key
    /// never derives one).
    key: OnceLock<String>,
    call: &'c CanonicalCall,
}

#[derive(Default)]
struct Pending {
    /// Entries to hand over, with their own fields (the base is added at
    /// hand-over).
    entries: Vec<(&'static str, Fields)>,
    /// An unattended read so far: its `call_received` and `decision`,
    /// not yet written (they go into its `completed` entry).
    read: Option<ReadSoFar>,
    /// Delegation evidence, added to every entry recorded from now on.
    delegated: Option<Value>,
    /// Fields for the `dispatched` entry (the guards' figures).
    at_dispatch: Fields,
}

struct ReadSoFar {
    /// Unix ms (formatted only when written: a read's decision time is
    /// written only when the read ends otherwise than answered).
    received_at: i64,
    /// The allow decision's policies, once decided.
    allowed: Option<Vec<String>>,
    decided_at: Option<i64>,
}

fn now() -> Value {
    at(crate::core::time::now_ms())
}

fn at(ms: i64) -> Value {
    Value::from(crate::core::time::rfc3339(ms))
}

impl<'c> Trail<'c> {
    /// The trail of `call` by `who`, under `client_key` when the call has
    /// one now (see [`Trail::keyed`]).
    pub(crate) fn new(
        audit: Option<&Arc<dyn AuditSink>>,
        who: &Identity,
        server: &str,
        call: &'c CanonicalCall,
        client_key: Option<&str>,
    ) -> Trail<'c> {
        Trail {
            log: audit.map(|a| {
                // Set in key order (each one appended, none searched).
                let mut base = Fields::with_capacity(8);
                base.insert("call_digest", json!(call.digest));
                // The OAuth client the requester's token was issued to.
                if let Some(c) = &who.client {
                    base.insert("client", json!(c));
                }
                base.insert("principal", json!(who.principal));
                base.insert("server", json!(server));
                base.insert("tenant", json!(who.tenant));
                base.insert("tool", json!(call.tool));
                let key = OnceLock::new();
                if let Some(k) = client_key {
                    let _ = key.set(k.to_owned());
                }
                Log {
                    sink: a.clone(),
                    base,
                    key,
                    call,
                }
            }),
            pending: parking_lot::Mutex::new(Pending::default()),
        }
    }

    /// The call's idempotency key, known now (a read that turned out to
    /// need the ledger). Entries handed over from now on carry it.
    pub(crate) fn keyed(&self, client_key: &str) {
        if let Some(log) = &self.log {
            let _ = log.key.set(client_key.to_owned());
        }
    }

    /// Everything pending, each entry with the base fields, a read so far
    /// written as its separate entries.
    fn take(&self) -> Entries {
        let Some(log) = &self.log else {
            return Vec::new();
        };
        let mut p = self.pending.lock();
        p.write_out_read(log);
        std::mem::take(&mut p.entries)
            .into_iter()
            .map(|(kind, extra)| (kind, log.with_base(extra)))
            .collect()
    }

    fn push(&self, kind: &'static str, mut f: Fields) {
        f.insert("time", now());
        self.pending.lock().entries.push((kind, f));
    }

    /// Record an entry: stamped now, handed to the writer with the
    /// dispatch, at a flush, or when the call ends.
    pub(crate) fn record(&self, kind: &'static str, extra: Vec<(&'static str, Value)>) {
        let Some(log) = &self.log else {
            return;
        };
        // Room for what a read's one entry adds to these (its arguments,
        // decision and times): no growing on the way.
        let mut f = Fields::with_capacity(extra.len() + 8);
        for (k, v) in extra {
            f.insert(k, v);
        }
        f.insert("time", now());
        let mut p = self.pending.lock();
        if let Some(d) = &p.delegated {
            f.insert("delegated", d.clone());
        }
        if kind == "completed" {
            if let Some(read) = p.read.take_if(|r| r.allowed.is_some()) {
                p.entries.push(("completed", read.into_entry(log, f)));
                return;
            }
        }
        // Anything else a read meets is written after its `call_received`.
        p.write_out_read(log);
        p.entries.push((kind, f));
    }

    /// The call went out (or was to) on its caller's behalf: the entries
    /// recorded from now on (its outcome) say so, with `evidence` (the
    /// issuer, the subject, the exchanged token's id and scopes; never a
    /// token).
    pub(crate) fn delegated(&self, evidence: Value) {
        if self.log.is_some() {
            self.pending.lock().delegated = Some(evidence);
        }
    }

    /// Fields the call's `dispatched` entry will carry (the figures of the
    /// guards it took: one entry, not one more).
    pub(crate) fn at_dispatch(&self, extra: Vec<(&'static str, Value)>) {
        if self.log.is_some() {
            let mut p = self.pending.lock();
            for (k, v) in extra {
                p.at_dispatch.insert(k.to_owned(), v);
            }
        }
    }

    /// Hand what is pending to the writer now (before entries that others
    /// record, such as a proposal this call creates, so the log keeps
    /// cause before effect).
    pub(crate) fn flush(&self) {
        if let Some(log) = &self.log {
            log.sink.record_all(self.take());
        }
    }

    /// Stage this call's pending entries plus `dispatched` for the ledger's
    /// outbox (one fsync with the `dispatched` record). `None` without an
    /// audit log; `Some(Err(entries))` when the log has no outbox (then the
    /// caller makes them durable itself).
    pub(crate) fn stage_dispatch(&self) -> Option<(Arc<dyn AuditSink>, Result<Staged, Entries>)> {
        let log = self.log.as_ref()?;
        let fields = std::mem::take(&mut self.pending.lock().at_dispatch);
        self.push("dispatched", fields);
        Some((log.sink.clone(), log.sink.stage(self.take())))
    }

    /// `call_received`, with the arguments as `audit.arguments` says. An
    /// unattended read (`read_only` without a key) waits for its decision
    /// and outcome, to be written as one `completed` entry.
    pub(crate) fn received(&self, explicit: bool, read_only: bool) {
        let Some(log) = &self.log else {
            return;
        };
        if read_only && !explicit {
            self.pending.lock().read = Some(ReadSoFar {
                received_at: crate::core::time::now_ms(),
                allowed: None,
                decided_at: None,
            });
            return;
        }
        self.push("call_received", log.received_fields(explicit, read_only));
    }

    /// `decision`, with the determining policy ids.
    pub(crate) fn decision(&self, d: &Decision) {
        if let Decision::Allow { policies } = d {
            let mut p = self.pending.lock();
            if let Some(read) = p.read.as_mut().filter(|r| r.allowed.is_none()) {
                read.allowed = Some(policies.clone());
                read.decided_at = Some(crate::core::time::now_ms());
                return;
            }
        }
        let (decision, policies, errors) = match d {
            Decision::Allow { policies } => ("allow", policies, None),
            Decision::Approval { policies } => ("approval", policies, None),
            Decision::Deny { policies, errors } => ("deny", policies, Some(errors)),
        };
        let mut extra = vec![("decision", json!(decision)), ("policies", json!(policies))];
        if let Some(errors) = errors.filter(|e| !e.is_empty()) {
            extra.push(("errors", json!(errors)));
        }
        // A read that is not allowed outright is written as any call is:
        // its `call_received` first (`record` writes it out).
        self.record("decision", extra);
    }
}

impl Pending {
    /// A read so far, written out as the separate entries of any call,
    /// before what is pending.
    fn write_out_read(&mut self, log: &Log<'_>) {
        if let Some(read) = self.read.take() {
            let mut separate = read.separate(log);
            separate.append(&mut self.entries);
            self.entries = separate;
        }
    }
}

impl Log<'_> {
    fn with_base(&self, extra: Fields) -> Fields {
        self.filled(extra, self.base.clone())
    }

    /// [`Log::with_base`], taking the base fields (the trail's last entry).
    fn taking_base(&mut self, extra: Fields) -> Fields {
        let base = std::mem::take(&mut self.base);
        self.filled(extra, base)
    }

    /// `extra` over `base` and the key.
    fn filled(&self, mut extra: Fields, mut base: Fields) -> Fields {
        if let Some(k) = self.key.get() {
            base.insert("idempotency_key", json!(k));
        }
        extra.fill_from(base);
        extra
    }

    fn received_fields(&self, explicit: bool, read_only: bool) -> Fields {
        let mut f = Fields::new();
        f.insert("explicit_key", json!(explicit));
        f.insert("read_only", json!(read_only));
        self.sink
            .arguments_fields_jcs(&self.call.arguments, &self.call.arguments_jcs, &mut f);
        f
    }
}

impl ReadSoFar {
    /// The read as one entry: the base (with the call's digest, which
    /// covers server, tool and arguments), the arguments as
    /// `audit.arguments` says (who read which record is the evidence of an
    /// access log: a digest alone cannot say it), the decision,
    /// `received_at`, and the outcome's fields in `done`.
    fn into_entry(self, log: &Log<'_>, mut done: Fields) -> Fields {
        log.sink
            .arguments_fields_jcs(&log.call.arguments, &log.call.arguments_jcs, &mut done);
        done.insert("decision", json!("allow"));
        done.insert("policies", json!(self.allowed.unwrap_or_default()));
        done.insert("received_at", at(self.received_at));
        done
    }

    /// The read as the separate entries of any call (it ended otherwise
    /// than answered): `call_received`, and `decision` when it was made.
    fn separate(self, log: &Log<'_>) -> Vec<(&'static str, Fields)> {
        // Only a read without a key is held back (see `received`).
        let mut received = log.received_fields(false, true);
        received.insert("time", at(self.received_at));
        let mut out = vec![("call_received", received)];
        if let (Some(policies), Some(decided)) = (self.allowed, self.decided_at) {
            let mut d = Fields::new();
            d.insert("decision", json!("allow"));
            d.insert("policies", json!(policies));
            d.insert("time", at(decided));
            out.push(("decision", d));
        }
        out
    }
}

impl Drop for Trail<'_> {
    /// The call ended (answered, refused or cancelled): hand its entries to
    /// the writer.
    fn drop(&mut self) {
        let Some(log) = &mut self.log else {
            return;
        };
        let pending = self.pending.get_mut();
        pending.write_out_read(log);
        let extras = std::mem::take(&mut pending.entries);
        if extras.is_empty() {
            return;
        }
        // The last entry takes the base fields instead of a copy of them
        // (a read's only entry copies nothing).
        let last = extras.len() - 1;
        let entries: Entries = extras
            .into_iter()
            .enumerate()
            .map(|(i, (kind, extra))| {
                let fields = if i == last {
                    log.taking_base(extra)
                } else {
                    log.with_base(extra)
                };
                (kind, fields)
            })
            .collect();
        log.sink.record_all(entries);
    }
}
