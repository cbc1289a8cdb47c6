//! Approvals (DESIGN.md section 6), the pure part: proposals, what an
//! approval binds, the signed statement, and argument diffs for revisions
//! (reviewer keys are in [`super::reviewers`], control API request
//! signatures in [`super::signed_request`]). No I/O here; the service over the store is the approval book
//! of the enforcement layer (`enforce::book`).
//!
//! Why signatures and not a shared reviewer token: an approval is evidence.
//! The statement a reviewer signs names the exact call (digest), requester,
//! tenant, resource version and expiry, so the signed bytes alone prove what
//! was approved, by whom, even to someone who trusts neither the gateway's
//! database nor its operator (the audit log embeds them, issue 6/7).

use base64::Engine;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `type` of an approval statement: version 3 binds the digest of the
/// policy set in force when the reviewer signed (`policy_set`), besides the
/// tool's definition digest (`tool_definition`, from version 2).
pub const STATEMENT_TYPE: &str = "countersign.approval.v3";
/// `type` of a version-2 statement (no `policy_set`): still verified.
pub const STATEMENT_TYPE_V2: &str = "countersign.approval.v2";
/// `type` of a version-1 statement (no `tool_definition`): still verified,
/// and bound to the definition through its proposal.
pub const STATEMENT_TYPE_V1: &str = "countersign.approval.v1";

/// Why a statement, signature, key or authorization is not acceptable.
/// Each message says what to do next.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApprovalError {
    /// The statement cannot be put in canonical form.
    #[error("cannot canonicalize: {0}")]
    Canonical(String),
    /// The statement is of another type.
    #[error("statement type `{0}` is not `{STATEMENT_TYPE}` (or `{STATEMENT_TYPE_V2}`, which has no `policy_set`, or `{STATEMENT_TYPE_V1}`, which has no `tool_definition` either)")]
    StatementType(String),
    /// A bound field differs from the proposal's.
    #[error("the statement's `{field}` ({got}) is not the proposal's ({want}): sign the proposal as the gateway shows it")]
    Binding {
        /// The field.
        field: &'static str,
        /// The statement's value.
        got: String,
        /// The proposal's value.
        want: String,
    },
    /// The policy set changed between the reviewer's look and the signature.
    #[error("the statement was signed under policy set {got}, but {want} is in force now: the policies changed since you looked; look at the proposal again")]
    PolicySet {
        /// The statement's.
        got: String,
        /// In force.
        want: String,
    },
    /// The signature is not base64.
    #[error("the signature is not base64: {0}")]
    SignatureEncoding(String),
    /// The signature has the wrong length.
    #[error("the signature is not 64 bytes of ed25519")]
    SignatureLength,
    /// The signature does not verify.
    #[error("the signature does not verify for this reviewer's key")]
    BadSignature,
    /// A public key that is not `ed25519:BASE64` of 32 bytes on the curve.
    #[error("public key `{text}` {problem}")]
    PublicKey {
        /// The text given.
        text: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A key file's `secret_key` is unusable.
    #[error("`secret_key` {0}")]
    SecretKey(String),
    /// Not a key file.
    #[error("not a countersign key file ({0}): make one with `countersign keygen --out FILE`")]
    KeyFile(String),
    /// A reviewer name outside the allowed alphabet.
    #[error(
        "reviewer name `{0}` may only use letters, digits, `-`, `_`, `.` and `@` (at most 64)"
    )]
    ReviewerName(String),
    /// A control API authorization that does not parse.
    #[error("{0}")]
    Authorization(String),
}

/// Where a proposal stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProposalState {
    /// Waiting for a reviewer.
    Pending,
    /// A reviewer said yes; not used yet.
    Approved,
    /// A reviewer said no.
    Denied,
    /// Used by one execution (bound to its idempotency key).
    Consumed,
    /// Approved, but not used before its expiry (or left pending too long).
    Expired,
    /// Void: the resource changed, the reviewer was removed, or a newer
    /// proposal of the same call replaced it.
    Invalidated,
}

impl ProposalState {
    /// The state's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ProposalState::Pending => "pending",
            ProposalState::Approved => "approved",
            ProposalState::Denied => "denied",
            ProposalState::Consumed => "consumed",
            ProposalState::Expired => "expired",
            ProposalState::Invalidated => "invalidated",
        }
    }
}

/// How risky the proposed call is, from its effective annotations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Risk {
    /// Read-only.
    Read,
    /// Changes something, not marked destructive.
    Write,
    /// May destroy or overwrite (`destructiveHint`, the MCP default).
    Destructive,
}

impl Risk {
    /// `read`, `write` or `destructive`.
    pub fn as_str(self) -> &'static str {
        match self {
            Risk::Read => "read",
            Risk::Write => "write",
            Risk::Destructive => "destructive",
        }
    }
}

/// One difference between two JSON values (see [`diff`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    /// JSON pointer to the changed value.
    pub pointer: String,
    /// The value in the earlier proposal (absent: added).
    pub before: Option<Value>,
    /// The value now (absent: removed).
    pub after: Option<Value>,
}

/// A tool definition that is not the pinned one, as a reviewer sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DefinitionChange {
    /// The pinned digest.
    pub pinned: String,
    /// What differs from the pinned definition.
    pub changes: Vec<Change>,
}

/// A proposal beside a recent one of the same requester and tool with other
/// arguments: the one it revises (the same call, resent with changes), or
/// another call shown for comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Revision {
    /// The other proposal.
    pub proposal_id: String,
    /// What changed in the arguments.
    pub changes: Vec<Change>,
}

/// One reviewer's part of a quorum: their signed decision, their groups
/// when the gateway accepted it, and when it stops counting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Given {
    /// The signed statement.
    #[serde(flatten)]
    pub signed: SignedDecision,
    /// The reviewer's groups when it was accepted (for reviewers' eyes; a
    /// quorum is judged on the reviewers file in force).
    #[serde(default)]
    pub groups: Vec<String>,
    /// Unix ms: the statement's `expires_at`, capped at `approvals.ttl`
    /// after signing.
    pub expires_ms: i64,
}

impl Given {
    /// The reviewer's name.
    pub fn reviewer(&self) -> &str {
        &self.signed.statement.reviewer
    }
}

/// What the policies ask of the reviewers of one call (DESIGN.md section
/// 20): `approvals` distinct reviewers, among them one per entry of `from`
/// (a group named twice needs two of its members), and `denials` distinct
/// denials end the proposal. The default, one and one, is a single
/// reviewer's yes or no.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quorum {
    /// Distinct reviewers whose yes it takes (at least 1).
    pub approvals: u32,
    /// Groups each needing a reviewer of their own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from: Vec<String>,
    /// Distinct denials that end the proposal (at least 1).
    pub denials: u32,
}

impl Default for Quorum {
    fn default() -> Self {
        Quorum {
            approvals: 1,
            from: Vec::new(),
            denials: 1,
        }
    }
}

impl Quorum {
    /// One reviewer decides, as without quorum policies.
    pub fn is_single(&self) -> bool {
        self.needed() <= 1 && self.denials <= 1
    }

    /// How many distinct reviewers it takes in all.
    pub fn needed(&self) -> u32 {
        self.approvals
            .max(u32::try_from(self.from.len()).unwrap_or(u32::MAX))
            .max(1)
    }

    /// The stricter of two: the larger count, each group as often as either
    /// names it, the fewer denials. Several policies that ask for approval
    /// each raise the bar; none lowers another's.
    pub fn strictest(&self, other: &Quorum) -> Quorum {
        let mut from = self.from.clone();
        let mut theirs = other.from.clone();
        theirs.sort();
        for g in dedup_sorted(&theirs) {
            let mine = self.from.iter().filter(|x| *x == g).count();
            let wanted = other.from.iter().filter(|x| *x == g).count();
            from.extend(std::iter::repeat_n(g.clone(), wanted.saturating_sub(mine)));
        }
        from.sort();
        Quorum {
            approvals: self.approvals.max(other.approvals),
            from,
            denials: self.denials.min(other.denials).max(1),
        }
    }

    /// What the approvers (distinct names, with their groups) still lack;
    /// `None` once they satisfy it. Groups are matched so that each group
    /// entry has a reviewer of its own (a reviewer in two groups covers
    /// one of them).
    pub fn missing(&self, approvers: &[(&str, &[String])]) -> Option<Missing> {
        let unmatched = unmatched_groups(&self.from, approvers);
        let have = u32::try_from(approvers.len()).unwrap_or(u32::MAX);
        let more = self
            .needed()
            .saturating_sub(have)
            .max(u32::try_from(unmatched.len()).unwrap_or(u32::MAX));
        (more > 0).then_some(Missing {
            more,
            from: unmatched,
        })
    }
}

fn dedup_sorted(v: &[String]) -> Vec<&String> {
    let mut out: Vec<&String> = Vec::new();
    for x in v {
        if out.last() != Some(&x) {
            out.push(x);
        }
    }
    out
}

/// The entries of `from` that no approver can be matched to, under a
/// maximum matching (each approver covers at most one entry, and only of a
/// group they are in): Kuhn's augmenting paths, fine for a handful.
fn unmatched_groups(from: &[String], approvers: &[(&str, &[String])]) -> Vec<String> {
    fn augment(
        slot: usize,
        from: &[String],
        approvers: &[(&str, &[String])],
        seen: &mut [bool],
        owner: &mut [Option<usize>],
    ) -> bool {
        for (a, (_, groups)) in approvers.iter().enumerate() {
            if seen[a] || !groups.contains(&from[slot]) {
                continue;
            }
            seen[a] = true;
            let free = match owner[a] {
                None => true,
                Some(other) => augment(other, from, approvers, seen, owner),
            };
            if free {
                owner[a] = Some(slot);
                return true;
            }
        }
        false
    }
    let mut owner: Vec<Option<usize>> = vec![None; approvers.len()];
    let mut left = Vec::new();
    for slot in 0..from.len() {
        let mut seen = vec![false; approvers.len()];
        if !augment(slot, from, approvers, &mut seen, &mut owner) {
            left.push(from[slot].clone());
        }
    }
    left
}

/// What a quorum still lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    /// How many more distinct reviewers.
    pub more: u32,
    /// Groups among them that still need a reviewer of their own.
    pub from: Vec<String>,
}

/// Spelled out for reviewers: "one more", "2 more".
fn how_many(n: u32) -> String {
    if n == 1 {
        "one more".into()
    } else {
        format!("{n} more")
    }
}

impl std::fmt::Display for Missing {
    /// "needs one more from finance", "needs 2 more, from finance and
    /// leads", "needs one more".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let more = how_many(self.more);
        let groups = match self.from.as_slice() {
            [] => String::new(),
            [one] => one.clone(),
            [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
        };
        match (self.from.is_empty(), self.more as usize == self.from.len()) {
            (true, _) => write!(f, "needs {more}"),
            (false, true) if self.more == 1 => write!(f, "needs {more} from {groups}"),
            (false, true) => write!(f, "needs {more}, from {groups}"),
            (false, false) => write!(f, "needs {more}, among them from {groups}"),
        }
    }
}

/// A reviewer's signed decision, as accepted by the gateway.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SignedDecision {
    /// The statement, exactly as signed (its JCS is what the signature covers).
    pub statement: Statement,
    /// Base64 ed25519 signature over the statement's JCS (empty when a
    /// passkey signed: see `passkey`).
    pub signature: String,
    /// The reviewer's public key at the time (`ed25519:...`, or
    /// `passkey:CREDENTIAL_ID`), so the signature stays verifiable after the
    /// reviewer is removed.
    pub public_key: String,
    /// When a passkey signed: the WebAuthn assertion whose challenge is the
    /// statement's digest, and what it was made for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passkey: Option<PasskeyProof>,
}

impl SignedDecision {
    /// `ed25519` or `passkey`: which kind of key signed.
    pub fn key_kind(&self) -> &'static str {
        if self.passkey.is_some() {
            "passkey"
        } else {
            "ed25519"
        }
    }
}

/// A decision signed with a passkey: the assertion's four fields, the
/// credential's public key (a COSE_Key, base64url) and algorithm as
/// `reviewers.toml` listed them when it was accepted, and the origin and
/// relying party id the assertion was checked for. Enough to check it
/// again offline (`core::passkey::verify_assertion`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PasskeyProof {
    /// What the browser returned.
    #[serde(flatten)]
    pub assertion: crate::core::passkey::Assertion,
    /// The credential's public key, a COSE_Key, base64url.
    pub credential_public_key: String,
    /// Its algorithm.
    pub alg: crate::core::passkey::Alg,
    /// The console's origin.
    pub origin: String,
    /// The relying party id.
    pub rp_id: String,
}

/// A call waiting for (or holding) a human decision. The arguments are the
/// gateway's own canonical copy: reviewers see exactly what would be sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    /// `p-` and 16 hex digits.
    pub id: String,
    /// Where it stands.
    pub state: ProposalState,
    /// Unix ms of creation.
    pub created_ms: i64,
    /// Unix ms of the last change.
    pub updated_ms: i64,
    /// Server.
    pub server: String,
    /// Tool.
    pub tool: String,
    /// The canonical arguments (JCS form, parsed).
    pub arguments: Value,
    /// `sha256:...` of the canonical call.
    pub call_digest: String,
    /// Who asked.
    pub requester: String,
    /// Other names of who asked (their token's `sub` and `email`): no
    /// reviewer known by one of them approves it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requester_aka: Vec<String>,
    /// The OAuth client their access token was issued to, when it named one
    /// (shown beside the requester: "alice via claude-code").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    /// Their tenant.
    pub tenant: String,
    /// The resource version the reviewer sees (probe or explicit).
    pub resource_version: Option<String>,
    /// The tool's definition digest when the proposal was made (`None`:
    /// the server did not list the tool). An approval runs the call only
    /// under this definition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_definition: Option<String>,
    /// When the definition differed from the pinned one: the pinned digest
    /// and the field-level difference, for the reviewer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub definition_change: Option<DefinitionChange>,
    /// From the effective annotations.
    pub risk: Risk,
    /// The policies that asked for approval.
    pub policies: Vec<String>,
    /// Set when this proposal revises a recent one: the same call (its
    /// idempotency key) resent with other arguments.
    pub revises: Option<Revision>,
    /// A recent proposal of another call (its own key) by the same
    /// requester for the same tool: shown beside it for comparison, never
    /// as a change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beside: Option<Revision>,
    /// The ledger key of the call that asked (a resend under it with other
    /// arguments is a revision).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_key: Option<String>,
    /// Identical calls that joined it while pending (retries).
    pub joined: u32,
    /// The decision that settled it: the approval that completed the
    /// quorum, or the denial that ended it.
    pub decision: Option<SignedDecision>,
    /// How many distinct reviewers must approve, from which groups, and how
    /// many denials end it (from the policies that asked for approval).
    #[serde(default, skip_serializing_if = "Quorum::is_single")]
    pub quorum: Quorum,
    /// Every reviewer's approval gathered so far, one per reviewer, in the
    /// order they came (the last one completes the quorum).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<Given>,
    /// Denials gathered while more than one is needed to end it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub denials: Vec<Given>,
    /// Bumped by every write: stores write a proposal only over the
    /// revision it was read at (compare and set), so two reviewers
    /// approving at once through two gateways never lose an approval.
    #[serde(default)]
    pub revision: u64,
    /// Unix ms after which an approval can no longer be used.
    pub expires_ms: Option<i64>,
    /// The ledger key whose execution used the approval.
    pub consumed_by: Option<String>,
    /// Why it was invalidated or expired.
    pub reason: Option<String>,
    /// The answer of the person at the client (DESIGN.md section 14), when
    /// they, not a reviewer, decided it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation: Option<Confirmation>,
    /// Public keys (`ed25519:...`) of the gateways that put this proposal to
    /// the client as a signed `requestState`: any gateway sharing the store
    /// verifies the state against them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub asked_by: Vec<String>,
    /// The W3C `traceparent` of the request that created it, when traces
    /// were on: a later call under it links its span to that one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
    /// The digests ([`Statement::digest`]) of approvals withdrawn from it.
    /// Such a statement is never accepted again: sent once more, it would
    /// undo the withdrawal. A reviewer who changes their mind again signs a
    /// new statement.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub withdrawn: Vec<String>,
    /// Another tool of the server whose name this one's looks like (the
    /// same UTS #39 skeleton), shown to reviewers beside the tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub looks_like: Option<String>,
    /// The call in plain words, from the operator's template for the tool
    /// when it was made ([`crate::core::headline`]); the reviewer's
    /// sentence leads with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headline: Option<String>,
    /// The figures of the budgets and effect keys the call falls under
    /// when it was held ("budget card-daily (principal:agent-7): spent 800
    /// of 1,000 in 1d; this call 400; after it 1,200 (over the limit)",
    /// "repeats an earlier call ..."), for the reviewer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub guards: Vec<String>,
}

/// The person at the client answered a proposal (MCP elicitation, or a
/// 2026-07-28 `input_required` retry). No reviewer key signs it: it is
/// worth what the requester's authentication is worth, which is why the
/// policies must permit `Action::"confirm"` for the call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confirmation {
    /// Always `client`.
    pub channel: String,
    /// The authenticated principal who answered (the requester).
    pub principal: String,
    /// Yes or no.
    pub decision: Verdict,
    /// Their reason, if any.
    pub reason: String,
    /// RFC 3339: when the gateway received the answer.
    pub at: String,
    /// `elicitation/create` (handshake era) or `input_required` (2026-07-28).
    pub via: String,
    /// The question answered (elicitation request id or the state's nonce).
    pub nonce: String,
}

/// What an approval is for (DESIGN.md section 6), less `expires_at`, which
/// the reviewer chooses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding<'a> {
    /// The proposal.
    pub proposal_id: &'a str,
    /// Server.
    pub server: &'a str,
    /// Tool.
    pub tool: &'a str,
    /// Canonical call digest.
    pub call_digest: &'a str,
    /// Requester.
    pub requester: &'a str,
    /// Tenant.
    pub tenant: &'a str,
    /// Resource version seen.
    pub resource_version: Option<&'a str>,
    /// The tool's definition digest.
    pub tool_definition: Option<&'a str>,
    /// The digest of the policy set in force when the gateway accepts the
    /// statement (`None`: not compared, as when verifying offline).
    pub policy_set: Option<&'a str>,
}

impl Proposal {
    /// A new pending proposal of `requester` in `tenant` for the call of
    /// `tool` on `server` with `arguments` (digest `call_digest`): nothing
    /// decided, one reviewer's yes asked for, made at time 0, every other
    /// field empty. The approval book fills in the rest of what it knows of
    /// the call; tests and benches start from it.
    pub fn pending(
        id: String,
        tenant: String,
        requester: String,
        server: String,
        tool: String,
        arguments: serde_json::Value,
        call_digest: String,
    ) -> Proposal {
        Proposal {
            id,
            state: ProposalState::Pending,
            created_ms: 0,
            updated_ms: 0,
            server,
            tool,
            arguments,
            call_digest,
            requester,
            requester_aka: Vec::new(),
            client: None,
            tenant,
            resource_version: None,
            tool_definition: None,
            definition_change: None,
            risk: Risk::Write,
            policies: Vec::new(),
            revises: None,
            beside: None,
            call_key: None,
            headline: None,
            joined: 0,
            decision: None,
            quorum: Quorum::default(),
            approvals: Vec::new(),
            denials: Vec::new(),
            revision: 0,
            expires_ms: None,
            consumed_by: None,
            reason: None,
            confirmation: None,
            asked_by: Vec::new(),
            trace: None,
            withdrawn: Vec::new(),
            looks_like: None,
            guards: Vec::new(),
        }
    }

    /// The binding an approval of this proposal must carry.
    pub fn binding(&self) -> Binding<'_> {
        Binding {
            policy_set: None,
            proposal_id: &self.id,
            server: &self.server,
            tool: &self.tool,
            call_digest: &self.call_digest,
            requester: &self.requester,
            tenant: &self.tenant,
            resource_version: self.resource_version.as_deref(),
            tool_definition: self.tool_definition.as_deref(),
        }
    }

    /// Whether this proposal is for exactly this call by this requester.
    pub fn same_call(&self, tenant: &str, requester: &str, server: &str, digest: &str) -> bool {
        self.tenant == tenant
            && self.requester == requester
            && self.server == server
            && self.call_digest == digest
    }

    /// The reviewers who approved so far, with the groups they had.
    pub fn approvers(&self) -> Vec<(&str, &[String])> {
        self.approvals
            .iter()
            .map(|g| (g.reviewer(), g.groups.as_slice()))
            .collect()
    }

    /// Where the quorum stands, for reviewers: "1 of 2 approvals: alice
    /// (leads); needs one more from finance". `None` for a proposal one
    /// reviewer decides.
    pub fn progress(&self) -> Option<String> {
        if self.quorum.is_single() {
            return None;
        }
        let who: Vec<String> = self
            .approvals
            .iter()
            .map(|g| {
                if g.groups.is_empty() {
                    g.reviewer().to_owned()
                } else {
                    format!("{} ({})", g.reviewer(), g.groups.join(", "))
                }
            })
            .collect();
        let mut text = format!(
            "{} of {} approvals",
            self.approvals.len(),
            self.quorum.needed()
        );
        if !who.is_empty() {
            text.push_str(&format!(": {}", who.join(", ")));
        }
        if self.state == ProposalState::Pending {
            if let Some(m) = self.quorum.missing(&self.approvers()) {
                text.push_str(&format!("; {m}"));
            }
        }
        if !self.denials.is_empty() {
            let names: Vec<&str> = self.denials.iter().map(Given::reviewer).collect();
            text.push_str(&format!(
                "; {} of {} denials to end it: {}",
                self.denials.len(),
                self.quorum.denials,
                names.join(", ")
            ));
        }
        Some(text)
    }

    /// The earliest expiry among the approvals gathered (the quorum's).
    pub fn earliest_expiry(&self) -> Option<i64> {
        self.approvals.iter().map(|g| g.expires_ms).min()
    }

    /// The statement a reviewer signs for this proposal, naming the policy
    /// set in force (`policy_set`, as the gateway shows it; without one,
    /// a version-2 statement).
    pub fn statement(
        &self,
        decision: Verdict,
        reviewer: &str,
        reason: &str,
        issued_at: &str,
        expires_at: &str,
        policy_set: Option<&str>,
    ) -> Statement {
        Statement {
            kind: if policy_set.is_some() {
                STATEMENT_TYPE
            } else {
                STATEMENT_TYPE_V2
            }
            .into(),
            policy_set: policy_set.map(str::to_owned),
            proposal_id: self.id.clone(),
            server: self.server.clone(),
            tool: self.tool.clone(),
            call_digest: self.call_digest.clone(),
            requester: self.requester.clone(),
            tenant: self.tenant.clone(),
            resource_version: self.resource_version.clone(),
            tool_definition: self.tool_definition.clone(),
            expires_at: expires_at.into(),
            decision,
            reviewer: reviewer.into(),
            reason: reason.into(),
            issued_at: issued_at.into(),
        }
    }
}

/// A reviewer's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Yes.
    Approve,
    /// No.
    Deny,
}

/// The signed statement of DESIGN.md section 6. Unknown fields are refused:
/// a field the gateway does not check must not ride along under a
/// signature that seems to cover it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Statement {
    /// Always [`STATEMENT_TYPE`].
    #[serde(rename = "type")]
    pub kind: String,
    /// The proposal decided.
    pub proposal_id: String,
    /// Server.
    pub server: String,
    /// Tool.
    pub tool: String,
    /// Canonical call digest.
    pub call_digest: String,
    /// Requester.
    pub requester: String,
    /// Tenant.
    pub tenant: String,
    /// Resource version seen (`null` when none).
    pub resource_version: Option<String>,
    /// The tool's definition digest (version 2; absent when the server did
    /// not list the tool, and in version 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_definition: Option<String>,
    /// RFC 3339: the approval is void after this.
    pub expires_at: String,
    /// The digest of the policy set in force when the reviewer signed
    /// (version 3): the evidence of which rules they approved under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_set: Option<String>,
    /// Approve or deny.
    pub decision: Verdict,
    /// The reviewer's name in `reviewers.toml`.
    pub reviewer: String,
    /// Why (required for a denial).
    pub reason: String,
    /// RFC 3339: when the reviewer signed.
    pub issued_at: String,
}

impl Statement {
    /// The bytes that are signed: RFC 8785 JCS of the statement.
    pub fn signing_bytes(&self) -> Result<Vec<u8>, ApprovalError> {
        let value =
            serde_json::to_value(self).map_err(|e| ApprovalError::Canonical(e.to_string()))?;
        let mut bytes = Vec::with_capacity(256);
        crate::core::canonical::jcs_into(&value, &mut bytes);
        Ok(bytes)
    }

    /// `sha256:` and the hex SHA-256 of [`Statement::signing_bytes`]: what
    /// names this very statement.
    pub fn digest(&self) -> Result<String, ApprovalError> {
        Ok(format!("sha256:{}", hex::encode(self.digest_bytes()?)))
    }

    /// The SHA-256 of [`Statement::signing_bytes`]: a passkey's challenge.
    pub fn digest_bytes(&self) -> Result<[u8; 32], ApprovalError> {
        use sha2::Digest as _;
        Ok(sha2::Sha256::digest(self.signing_bytes()?).into())
    }

    /// Sign with a reviewer key; returns base64 of the signature.
    pub fn sign(&self, key: &SigningKey) -> Result<String, ApprovalError> {
        let sig = key.sign(&self.signing_bytes()?);
        Ok(b64().encode(sig.to_bytes()))
    }

    /// Check the signature against `key`.
    pub fn verify(&self, key: &VerifyingKey, signature_b64: &str) -> Result<(), ApprovalError> {
        verify_bytes(key, &self.signing_bytes()?, signature_b64)
    }

    /// Refuse a statement that does not describe exactly this proposal.
    /// Every binding field is compared: a signature over a different call,
    /// requester, tenant or resource version never approves this one.
    pub fn check_binding(&self, p: &Binding<'_>) -> Result<(), ApprovalError> {
        // Version 1 names no definition; the proposal it signs still binds
        // one, and execution start compares that with the tool's now.
        // Versions before 3 name no policy set; a field of a later version
        // under an earlier name is refused.
        let (v1, v3) = match self.kind.as_str() {
            STATEMENT_TYPE if self.policy_set.is_some() => (false, true),
            STATEMENT_TYPE_V2 if self.policy_set.is_none() => (false, false),
            STATEMENT_TYPE_V1 if self.tool_definition.is_none() && self.policy_set.is_none() => {
                (true, false)
            }
            _ => return Err(ApprovalError::StatementType(self.kind.clone())),
        };
        if let (true, Some(want)) = (v3, p.policy_set) {
            let got = self.policy_set.as_deref().unwrap_or("null");
            if got != want {
                return Err(ApprovalError::PolicySet {
                    got: got.to_owned(),
                    want: want.to_owned(),
                });
            }
        }
        let definition = if v1 {
            p.tool_definition
        } else {
            self.tool_definition.as_deref()
        };
        let pairs: [(&'static str, Option<&str>, Option<&str>); 8] = [
            ("proposal_id", Some(&self.proposal_id), Some(p.proposal_id)),
            ("server", Some(&self.server), Some(p.server)),
            ("tool", Some(&self.tool), Some(p.tool)),
            ("call_digest", Some(&self.call_digest), Some(p.call_digest)),
            ("requester", Some(&self.requester), Some(p.requester)),
            ("tenant", Some(&self.tenant), Some(p.tenant)),
            (
                "resource_version",
                self.resource_version.as_deref(),
                p.resource_version,
            ),
            ("tool_definition", definition, p.tool_definition),
        ];
        for (field, got, want) in pairs {
            if got != want {
                return Err(ApprovalError::Binding {
                    field,
                    got: got.unwrap_or("null").to_owned(),
                    want: want.unwrap_or("null").to_owned(),
                });
            }
        }
        Ok(())
    }
}

pub(crate) fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

/// Verify an Ed25519 signature (base64) of `bytes`, strictly.
pub(crate) fn verify_bytes(
    key: &VerifyingKey,
    bytes: &[u8],
    signature_b64: &str,
) -> Result<(), ApprovalError> {
    let raw = b64()
        .decode(signature_b64.trim())
        .map_err(|e| ApprovalError::SignatureEncoding(e.to_string()))?;
    let sig = Signature::from_slice(&raw).map_err(|_| ApprovalError::SignatureLength)?;
    // `verify_strict` rejects weak keys and non-canonical encodings, so one
    // statement has exactly one valid signature per key.
    key.verify_strict(bytes, &sig)
        .map_err(|_| ApprovalError::BadSignature)
}

/// The differences between two JSON values (a proposal's arguments, or a
/// tool's definitions), by JSON pointer. Objects are compared key by key;
/// anything else (arrays included) is compared whole.
pub fn diff(before: &Value, after: &Value) -> Vec<Change> {
    let mut out = Vec::new();
    diff_at("", before, after, &mut out);
    out
}

fn diff_at(path: &str, before: &Value, after: &Value, out: &mut Vec<Change>) {
    match (before, after) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let p = format!("{path}/{}", crate::core::canonical::pointer_token(k));
                match (a.get(k), b.get(k)) {
                    (Some(x), Some(y)) => diff_at(&p, x, y, out),
                    (x, y) => out.push(Change {
                        pointer: p,
                        before: x.cloned(),
                        after: y.cloned(),
                    }),
                }
            }
        }
        (a, b) if a == b => {}
        (a, b) => out.push(Change {
            pointer: path.to_owned(),
            before: Some(a.clone()),
            after: Some(b.clone()),
        }),
    }
}

/// The consumption step (DESIGN.md section 6), decided on the proposal as
/// stored, inside the same store transaction that reserves the ledger key.
/// `Ok(Some(p))`: write `p` (now `consumed`, bound to `key`). `Ok(None)`:
/// already consumed by this very key (a retry after a failure proven before
/// dispatch), nothing to write. `Err(state)`: unusable, nothing written;
/// `Expired` also stands for an approval past its expiry.
///
/// INVARIANT: an approval moves `approved → consumed` once, and a consumed
/// approval serves only the key that consumed it; the ledger lets that key
/// dispatch at most once. Together: one yes, at most one execution.
pub fn consume(
    p: &Proposal,
    key: &str,
    server: &str,
    digest: &str,
    now_ms: i64,
) -> Result<Option<Proposal>, ProposalState> {
    // The store re-checks the binding: the proposal id came from a lookup
    // made before this transaction, and must still be for this call.
    if p.server != server || p.call_digest != digest {
        return Err(ProposalState::Invalidated);
    }
    match p.state {
        ProposalState::Approved if p.expires_ms.is_some_and(|e| e > now_ms) => {
            let mut next = p.clone();
            next.state = ProposalState::Consumed;
            next.consumed_by = Some(key.to_owned());
            next.updated_ms = now_ms;
            next.revision = p.revision.wrapping_add(1);
            Ok(Some(next))
        }
        ProposalState::Approved => Err(ProposalState::Expired),
        ProposalState::Consumed if p.consumed_by.as_deref() == Some(key) => Ok(None),
        other => Err(other),
    }
}

mod related;
mod words;
pub use words::{flags, queue_key, queue_order, summary};

#[cfg(test)]
pub(crate) mod tests;
