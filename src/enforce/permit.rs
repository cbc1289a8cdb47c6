//! The sealed permit: the one value that carries a `tools/call` to an
//! upstream, and the traits through which the pipeline reaches one.
//!
//! A [`Permit`] is made by [`issue`], the pipeline's last stage, and by
//! nothing else: its fields are private to this module, and a write's
//! permit holds the ledger ticket of a key that is durably `dispatched`
//! (tickets come only from a reservation). [`ToolConn::call_tool`] takes
//! it by value and hands back what it held with the answer, so the
//! pipeline records the outcome on the same ticket.

use std::future::Future;
use std::time::Duration;

use tokio::sync::mpsc;

use super::flight::{ReadLead, Ticket};
use super::upstream::UpstreamError;
use crate::wire::jsonrpc::Message;
use crate::wire::sse::UpstreamEvent;

/// Leave to send one `tools/call` upstream. Only the pipeline's last stage
/// ([`issue`]) constructs one, after every earlier stage passed: it owns
/// the canonical request (the bytes that were hashed, checked and
/// approved) and the ledger's hold on the key. No other value can carry a
/// `tools/call` to an upstream, so code that skips a stage does not
/// compile.
///
/// Whoever receives a permit can pass it on:
///
/// ```
/// use countersign::enforce::permit::Permit;
/// fn pass_on(p: Permit) -> Permit {
///     p
/// }
/// ```
///
/// but cannot take it apart and rebuild it around another request (its
/// fields are private), nor make one from nothing:
///
/// ```compile_fail
/// use countersign::enforce::permit::Permit;
/// use countersign::wire::jsonrpc::Message;
/// fn forge(p: Permit, other: Message) -> Permit {
///     let Permit { hold, .. } = p;
///     Permit { request: other, hold }
/// }
/// ```
///
/// ```compile_fail
/// // `issue`, the only maker of permits, is private to the enforcement layer.
/// use countersign::enforce::permit::issue;
/// ```
#[derive(Debug)]
pub struct Permit {
    request: Message,
    hold: Hold,
}

/// What a permit holds of the ledger: the ticket of a write whose key is
/// durably `dispatched`, or the lead of a coalesced read.
pub(super) enum Hold {
    Write(Box<Ticket>),
    Read(Box<ReadLead>),
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Hold::Write(_) => "Hold::Write",
            Hold::Read(_) => "Hold::Read",
        })
    }
}

impl Permit {
    /// Spend the permit: the request to write, and the receipt to hand back
    /// with the answer.
    pub fn spend(self) -> (Message, Receipt) {
        (self.request, Receipt { hold: self.hold })
    }
}

/// What a spent permit leaves: handed back with the answer, so the
/// pipeline records it on the ledger. Dropped instead (the call was
/// cancelled mid-flight), a write's key becomes `unknown`.
#[derive(Debug)]
pub struct Receipt {
    hold: Hold,
}

impl Receipt {
    /// The upstream's answer (or failure) to the permitted call.
    pub fn sent(self, answer: Result<Message, UpstreamError>) -> Sent {
        Sent {
            answer,
            hold: self.hold,
            delegated: None,
        }
    }
}

/// A permitted call's answer, with the ledger hold it went out under.
#[derive(Debug)]
pub struct Sent {
    pub(super) answer: Result<Message, UpstreamError>,
    pub(super) hold: Hold,
    /// Delegation: what the audit log records of the token the call went
    /// out with, or was to go out with (issuer, subject, token id, scopes;
    /// never the token).
    pub(super) delegated: Option<serde_json::Value>,
}

impl Sent {
    /// The failure, when the call did not get an answer.
    pub fn failure(&self) -> Option<&UpstreamError> {
        self.answer.as_ref().err()
    }

    /// The call went out (or was to) on the caller's behalf, with a token
    /// `evidence` describes.
    pub fn delegated(mut self, evidence: serde_json::Value) -> Sent {
        self.delegated = Some(evidence);
        self
    }
}

/// The pipeline's last stage: a permit for `request`. The only place a
/// [`Permit`] is made. A write's ticket must be durably
/// `dispatched`; otherwise the hold comes back and nothing is sent.
pub(super) fn issue(request: &Message, hold: Hold) -> Result<Permit, Hold> {
    // INVARIANT: no write leaves without its durable `dispatched` record;
    // a crash after the send then reads as `unknown`, never as free.
    if let Hold::Write(t) = &hold {
        if !t.is_dispatched() {
            return Err(hold);
        }
    }
    Ok(Permit {
        request: request.clone(),
        hold,
    })
}

/// Where the pipeline sends a permitted `tools/call`: one server, reached
/// through a client's session or the server's shared connection.
pub trait Upstream: Send + Sync {
    /// A connection that can carry one call.
    type Conn: ToolConn;

    /// A connection ready for a call, healed first if it was lost. Failing
    /// here means nothing of the call was sent.
    fn ready(&self) -> impl Future<Output = Result<Self::Conn, UpstreamError>> + Send;

    /// One page of the server's `tools/list` (the gateway's own request, for
    /// its catalog): the response message.
    fn list_tools(
        &self,
        cursor: Option<String>,
    ) -> impl Future<Output = Result<Message, UpstreamError>> + Send;

    /// The client profile [`list_tools`](Upstream::list_tools) answers for
    /// (`crate::core::catalog::client_profile` of the capabilities the
    /// connection's client declared): servers list tools by who asks.
    fn client_profile(&self) -> String {
        crate::core::catalog::client_profile(None)
    }
}

/// A live connection that can carry a `tools/call`.
pub trait ToolConn: Send + Sync {
    /// Send the permit's canonical request and wait up to `timeout` for its
    /// answer; server messages related to it go to `events`. The permit is
    /// spent: what it held comes back in the [`Sent`].
    fn call_tool(
        &self,
        permit: Permit,
        events: Option<mpsc::Sender<UpstreamEvent>>,
        timeout: Duration,
    ) -> impl Future<Output = Sent> + Send;
}
