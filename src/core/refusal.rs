//! Why a call got no answer from its server: the outcomes a leader shares
//! with the identical calls that follow it, and that the answer module
//! words for the agent (DESIGN.md section 7's codes). Plain data: the
//! approval rules (`core::review`) make them, the pipeline carries them.

/// Why an approval-gated call did not run (DESIGN.md section 7 codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalCode {
    /// `approval_pending`: a reviewer has not decided yet.
    Pending,
    /// `approval_denied`.
    Denied,
    /// `approval_expired`.
    Expired,
    /// `stale_resource_version`.
    Stale,
}

/// The approval side of a refusal: which proposal, and what to tell the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalNote {
    /// The code.
    pub code: ApprovalCode,
    /// The proposal the agent's call waits on (or was refused by).
    pub proposal_id: Option<String>,
    /// The proposal this one revises, if any.
    pub revises: Option<String>,
    /// A reviewer's reason (denials) or the gateway's (stale versions).
    pub reason: Option<String>,
    /// The person at the client decided (not a reviewer).
    pub by_client: bool,
}

/// A non-answer outcome shared with followers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Sent, answer lost.
    Unknown,
    /// Proven not sent; the caller may try again.
    NotDispatched,
    /// The key is bound to another tool.
    Remap,
    /// The key is bound to other arguments.
    Drift,
    /// The policies deny the call.
    Denied,
    /// The call needs (or lost, or was refused) a human approval.
    Approval(ApprovalNote),
    /// 2026-07-28: ask the person at the client (`input_required`). Nothing
    /// ran; the key stays free.
    Ask(Box<Question>),
    /// The client's answer (its `requestState`) is refused. Nothing ran.
    Confirmation(ConfirmRefusal),
    /// A budget or an effect key refuses the call. Nothing ran.
    Guarded(Box<crate::core::guard::Refusal>),
}

/// A question to the person at the client, as a 2026-07-28 `input_required`
/// result carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    /// The proposal it decides.
    pub proposal_id: String,
    /// `elicitation/create` params.
    pub params: serde_json::Value,
    /// The signed `requestState`.
    pub state: String,
}

/// Why a client's answer is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfirmCode {
    /// `confirmation_invalid`: not a state the gateway issued, or altered.
    Invalid,
    /// `confirmation_mismatch`: issued for another call, principal or key.
    Mismatch,
    /// `confirmation_expired`: past its expiry.
    Expired,
    /// `confirmation_used`: its question was already answered and used.
    Used,
}

/// A refused answer: the code and the precise reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfirmRefusal {
    /// The code.
    pub code: ConfirmCode,
    /// What exactly is wrong, for the agent and the log.
    pub reason: String,
}
