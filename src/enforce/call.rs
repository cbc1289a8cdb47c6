//! One `tools/call` on its way through the stages: who calls
//! ([`Caller`]), the request's context ([`CallCtx`]), the call as the
//! stages see it ([`Call`]), and the outcomes any stage may end it with.
//!
//! The pipeline and the services it runs a call through (the read path,
//! the breakers) take a [`Call`]; this module imports none of them, so
//! nothing runs in a circle through it.

use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::flight::{Lookup, Settled};
use super::outcome::CallOutcome;
use crate::audit::trail::Trail;
use crate::core::annotations::Annotations;
use crate::core::canonical::{self, CanonicalCall};
use crate::core::catalog::ToolView;
use crate::core::config::Config;
use crate::core::identity::Identity;
use crate::core::ledger::{self, Claim};
use crate::core::refusal::Outcome;
use crate::store::StoreError;
use crate::wire::era::Era;
use crate::wire::jsonrpc::Message;

use crate::core::refusal::ApprovalCode;
use crate::wire::sse::UpstreamEvent;

/// Who is calling, for idempotency keys: the identity and the session scope
/// (the bridge's stable scope, the session id, or none when stateless).
#[derive(Debug, Clone)]
pub struct Caller {
    /// The authenticated identity.
    pub identity: Arc<Identity>,
    /// The session scope, if any.
    pub scope: Option<String>,
    /// The caller's own access token, when the server delegates to its
    /// issuer: traded at dispatch, under the permit, and never sent on.
    pub subject: Option<Arc<crate::core::identity::SubjectToken>>,
}

/// One request's context: who calls, which server, which era, where
/// related server messages (progress) go, and the upstream to use.
pub struct CallCtx<'a, U> {
    /// The caller.
    pub caller: &'a Caller,
    /// The configured server name.
    pub server: &'a str,
    /// The wire era of the request.
    pub era: Era,
    /// Where progress notifications and other related messages go, when the
    /// client can receive them.
    pub events: Option<mpsc::Sender<UpstreamEvent>>,
    /// The upstream the call goes to.
    pub upstream: &'a U,
    /// Handshake era: the session's open questions, when its client
    /// declared elicitation (the person at the client can be asked).
    pub asks: Option<Arc<super::client::Asks>>,
    /// The client asked for a task (DESIGN.md section 24): a call that
    /// needs a yes is neither held nor put to the person at the client; it
    /// ends at once as `approval_pending` with its proposal, and the task
    /// waits for the reviewers instead of the request.
    pub task: bool,
}

/// One call on its way through the stages.
pub(crate) struct Call<'a, U> {
    pub(crate) ctx: &'a CallCtx<'a, U>,
    /// The canonical request (params replaced by the JCS form).
    pub(crate) request: &'a Message,
    pub(crate) call: &'a CanonicalCall,
    pub(crate) claim: &'a Claim,
    pub(crate) annotations: Annotations,
    /// The tool as the catalog had it when the call arrived.
    pub(crate) tool: ToolView,
    pub(crate) trail: &'a Trail<'a>,
}

impl<U> Call<'_, U> {
    /// The idempotency key as the client knows it: an unattended read
    /// carries none, and derives it only when an answer must show it.
    pub(crate) fn client_key(&self) -> String {
        if self.claim.client_key.is_empty() {
            let who = &self.ctx.caller.identity;
            ledger::derived_key(
                &who.principal,
                &who.tenant,
                self.ctx.caller.scope.as_deref(),
                &self.call.digest,
            )
        } else {
            self.claim.client_key.clone()
        }
    }

    /// The call as the person at the client is asked about it.
    pub(crate) fn subject(&self) -> super::client::Subject<'_> {
        super::client::Subject {
            identity: &self.ctx.caller.identity,
            server: self.ctx.server,
            tool: &self.call.tool,
            digest: &self.call.digest,
            tool_definition: self.tool.digest.as_deref(),
            key: &self.claim.key,
        }
    }

    /// The ending of a call its server's circuit refused: nothing sent.
    pub(crate) fn open_circuit(&self) -> CallOutcome {
        CallOutcome::CircuitOpen {
            server: self.ctx.server.to_owned(),
        }
    }

    /// The ending of a call refused for `why`, with the audit entry the
    /// ledger's and a stale version's refusals need.
    pub(crate) fn refused(&self, why: Outcome) -> CallOutcome {
        // Audit entries of refusals the ledger or a stale version made (policy
        // and approval refusals have theirs).
        match &why {
            Outcome::Drift => self
                .trail
                .record("rejected", vec![("reason", json!("drift"))]),
            Outcome::Remap => self
                .trail
                .record("rejected", vec![("reason", json!("remap"))]),
            Outcome::Unknown => self
                .trail
                .record("outcome_unknown", vec![("repeat", json!(true))]),
            Outcome::Approval(note) if note.code == ApprovalCode::Stale => self.trail.record(
                "rejected",
                vec![
                    ("reason", json!("stale")),
                    ("detail", json!(note.reason)),
                    ("proposal_id", json!(note.proposal_id)),
                ],
            ),
            _ => {}
        }
        CallOutcome::Refused {
            why,
            key: self.client_key(),
            tool: self.call.tool.clone(),
        }
    }

    /// A replay or a stop the ledger concluded.
    pub(crate) fn concluded(&self, found: Lookup) -> CallOutcome {
        match found {
            Lookup::Replay {
                answer,
                answered_at,
            } => {
                self.trail
                    .record("replayed", vec![("first_answered_at", json!(answered_at))]);
                CallOutcome::Replayed {
                    answer,
                    key: self.client_key(),
                    answered_at,
                }
            }
            Lookup::Stop(why) => self.refused(why),
            // Not produced once the key is bound; fail closed all the same.
            Lookup::Lead(_) | Lookup::Follow(_) | Lookup::Elsewhere => {
                self.refused(Outcome::Unknown)
            }
        }
    }

    /// What a follower gets from its leader: a write's answer as a replay, a
    /// read's as a joined answer, or the leader's verdict.
    pub(crate) fn settled(&self, s: Settled, write: bool) -> CallOutcome {
        match s {
            Settled::Answered {
                answer,
                answered_at,
            } if write => CallOutcome::Replayed {
                answer,
                key: self.client_key(),
                answered_at,
            },
            Settled::Answered { answer, .. } => CallOutcome::Joined(answer),
            Settled::Verdict(why) => CallOutcome::Refused {
                why,
                key: self.client_key(),
                tool: self.call.tool.clone(),
            },
            // Only a write's follower waits for another process; anything else
            // that meets one never runs it again.
            Settled::Elsewhere => CallOutcome::Refused {
                why: Outcome::Unknown,
                key: self.client_key(),
                tool: self.call.tool.clone(),
            },
        }
    }

    /// The ending of a call the ledger could not serve: it does not run.
    pub(crate) fn ledger_unavailable(&self, e: StoreError) -> CallOutcome {
        tracing::error!(tool = %self.call.tool, "refusing a call: {e}");
        CallOutcome::LedgerUnavailable(e)
    }
}

/// Stage 1, strict parse and canonical form: the forwarded `params` are
/// the exact JCS bytes that were hashed, so what is checked (and later
/// approved) is byte-for-byte what the server receives. A refusal is
/// `-32602` and nothing is sent upstream.
#[expect(
    clippy::result_large_err,
    reason = "the Err side is the call's outcome itself, returned once per call"
)]
pub(crate) fn parse(
    config: &Config,
    server: &str,
    mut request: Message,
) -> Result<(Message, CanonicalCall), CallOutcome> {
    let limits = canonical::Limits {
        max_depth: config.limits.max_depth,
        max_arguments_bytes: config.limits.max_arguments_bytes,
    };
    let params = request.params.as_ref().map_or("null", |p| p.get());
    let call = canonical::canonicalize(server, params, limits)
        .map_err(|e| CallOutcome::Invalid(e.to_string()))?;
    tracing::debug!(server, tool = %call.tool, digest = %call.digest, "canonical call");
    let forward = serde_json::value::RawValue::from_string(call.forward_params_text())
        .map_err(|e| CallOutcome::Invalid(format!("canonical form is not JSON: {e}")))?;
    request.params = Some(forward);
    Ok((request, call))
}

/// Stage 2, the idempotency key: explicit, or derived from who calls,
/// in which scope, and the digest. Namespaced by tenant and principal.
#[expect(
    clippy::result_large_err,
    reason = "the Err side is the call's outcome itself, returned once per call"
)]
pub(crate) fn claim(
    caller: &Caller,
    server: &str,
    call: &CanonicalCall,
) -> Result<(Claim, bool), CallOutcome> {
    let explicit = explicit_key(call)?;
    Ok(claim_with(caller, server, call, explicit))
}

/// The key the client sent, if any; a malformed one refuses the call.
#[expect(
    clippy::result_large_err,
    reason = "the Err side is the call's outcome itself, returned once per call"
)]
pub(crate) fn explicit_key(call: &CanonicalCall) -> Result<Option<String>, CallOutcome> {
    ledger::explicit_key(&call.reserved).map_err(|e| CallOutcome::Invalid(e.to_string()))
}

/// The claim of a call whose explicit key (if any) is known.
pub(crate) fn claim_with(
    caller: &Caller,
    server: &str,
    call: &CanonicalCall,
    explicit: Option<String>,
) -> (Claim, bool) {
    let who = &caller.identity;
    let (client_key, explicit) = match explicit {
        Some(k) => (k, true),
        None => (
            ledger::derived_key(
                &who.principal,
                &who.tenant,
                caller.scope.as_deref(),
                &call.digest,
            ),
            false,
        ),
    };
    let claim = Claim {
        key: ledger::storage_key(&who.tenant, &who.principal, &client_key),
        client_key,
        explicit,
        digest: call.digest.clone(),
        server: server.to_owned(),
        tool: call.tool.clone(),
    };
    (claim, explicit)
}

/// The claim of an unattended read that carries no key: it never touches
/// the ledger, so no key is derived (see [`Call::client_key`]); identical
/// reads in flight share one upstream call under `key`, which is the
/// caller's and the digest's and cannot be a ledger key (those are JSON
/// arrays).
/// `read`, then tenant, principal and scope each after its length (so no
/// two callers' fields run into each other), then the digest.
fn read_key(tenant: &str, principal: &str, scope: &str, digest: &str) -> String {
    let mut key =
        String::with_capacity(24 + tenant.len() + principal.len() + scope.len() + digest.len());
    key.push_str("read ");
    for part in [tenant, principal, scope] {
        key.push_str(itoa::Buffer::new().format(part.len()));
        key.push(':');
        key.push_str(part);
    }
    key.push_str(digest);
    key
}

pub(crate) fn read_claim(caller: &Caller, server: &str, call: &CanonicalCall) -> Claim {
    let who = &caller.identity;
    let scope = caller.scope.as_deref().unwrap_or("");
    Claim {
        key: read_key(&who.tenant, &who.principal, scope, &call.digest),
        client_key: String::new(),
        explicit: false,
        digest: call.digest.clone(),
        server: server.to_owned(),
        tool: call.tool.clone(),
    }
}

/// `_meta["dev.countersign/resource-version"]`: a version the client binds
/// explicitly (DESIGN.md section 6).
pub(crate) fn explicit_version(call: &CanonicalCall) -> Option<&str> {
    call.reserved
        .meta
        .get("dev.countersign/resource-version")
        .and_then(Value::as_str)
}
