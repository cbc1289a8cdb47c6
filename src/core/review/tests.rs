//! The approval rules on their own: no store, no clock, no book.

use ed25519_dalek::SigningKey;

use super::*;
use crate::core::approval::tests::proposal;
use crate::core::approval::SignedDecision;

const NOW: i64 = 1_000_000;

fn key(n: u8) -> SigningKey {
    SigningKey::from_bytes(&[n; 32])
}

/// alice (finance) and bob (finance) review for acme; agent-7 asks.
fn reviewers() -> Reviewers {
    let mut text = String::new();
    for (i, name) in ["alice", "bob"].iter().enumerate() {
        let pk = crate::core::reviewers::format_public_key(&key(i as u8 + 1).verifying_key());
        text.push_str(&format!(
            "[[reviewers]]\nname = \"{name}\"\npublic_key = \"{pk}\"\ngroups = [\"finance\"]\ntenants = [\"acme\"]\n"
        ));
    }
    Reviewers::parse(&text).unwrap_or_else(|e| panic!("{e:?}"))
}

fn call<'a>(p: &'a Proposal, quorum: &'a Quorum) -> HeldCall<'a> {
    HeldCall {
        tenant: &p.tenant,
        requester: &p.requester,
        server: &p.server,
        digest: &p.call_digest,
        key: "k-1",
        resource_version: p.resource_version.as_deref(),
        tool_definition: p.tool_definition.as_deref(),
        quorum,
    }
}

/// `who` (1: alice, 2: bob) signs `verdict` over `p`.
fn given(p: &Proposal, who: u8, verdict: Verdict) -> Given {
    let name = ["", "alice", "bob"][who as usize];
    let st = p.statement(
        verdict,
        name,
        "looked at it",
        &rfc3339(NOW),
        &rfc3339(NOW + 600_000),
        Some("sha256:set"),
    );
    let signature = st.sign(&key(who)).expect("signs");
    Given {
        signed: SignedDecision {
            statement: st,
            signature,
            public_key: crate::core::reviewers::format_public_key(&key(who).verifying_key()),
            passkey: None,
        },
        groups: vec!["finance".into()],
        expires_ms: NOW + 600_000,
    }
}

fn approve(p: &Proposal, who: u8) -> Result<Proposal, Refusal> {
    let g = given(p, who, Verdict::Approve);
    let digest = g.signed.statement.digest().expect("digest");
    let r = reviewers();
    let reviewer = r.get(g.reviewer()).expect("registered").clone();
    decided(p, &g, &digest, &reviewer, &r, NOW, |_| Ok(()))
}

#[test]
fn a_first_call_makes_a_proposal_and_a_flood_makes_none() {
    let p = proposal();
    let q = Quorum::default();
    assert_eq!(
        step(&[], &call(&p, &q), &reviewers(), NOW, 10),
        Step::Create
    );
    // Two other calls of the requester wait: a third is refused, and a
    // call that joins one of them is not.
    let mut a = proposal();
    a.id = "p-a".into();
    a.call_digest = "sha256:other-a".into();
    let mut b = a.clone();
    b.id = "p-b".into();
    b.call_digest = "sha256:other-b".into();
    match step(&[a.clone(), b.clone()], &call(&p, &q), &reviewers(), NOW, 2) {
        Step::Flooded(n) => assert!(n.reason.unwrap().starts_with("2 of your proposals")),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        step(&[a.clone(), b], &call(&a, &q), &reviewers(), NOW, 2),
        Step::Join { .. }
    ));
}

#[test]
fn an_approval_is_revalidated_before_it_is_offered() {
    let q = Quorum::default();
    let mut p = approve(&proposal(), 1).expect("approved");
    assert_eq!(p.state, ProposalState::Approved);
    assert_eq!(p.expires_ms, Some(NOW + 600_000));
    assert_eq!(
        step(&[p.clone()], &call(&p, &q), &reviewers(), NOW, 10),
        Step::Usable(p.clone())
    );
    // Past its expiry: expired, and the call refused as expired.
    match step(&[p.clone()], &call(&p, &q), &reviewers(), NOW + 600_000, 10) {
        Step::ExpireThenRefresh { was, expired } => {
            assert_eq!(was, p);
            assert_eq!(expired.state, ProposalState::Expired);
        }
        other => panic!("{other:?}"),
    }
    // Another resource version now: voided, and the call refused as stale.
    let mut now_v2 = call(&p, &q);
    now_v2.resource_version = Some("v2");
    match step(&[p.clone()], &now_v2, &reviewers(), NOW, 10) {
        Step::Replace { reason, code, .. } => {
            assert_eq!(code, Some(ApprovalCode::Stale));
            assert!(reason.contains("from `v1` to `v2`"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // The approving reviewer left the file: voided, and the call waits.
    let only_bob = Reviewers::parse(&format!(
        "[[reviewers]]\nname = \"bob\"\npublic_key = \"{}\"\ntenants = [\"acme\"]\n",
        crate::core::reviewers::format_public_key(&key(2).verifying_key())
    ))
    .expect("parses");
    assert!(!still_valid(&p, &only_bob));
    assert!(matches!(
        step(&[p.clone()], &call(&p, &q), &only_bob, NOW, 10),
        Step::Replace { code: None, .. }
    ));
    // The policies now ask two reviewers: back to pending, the one
    // approval kept.
    let two = Quorum {
        approvals: 2,
        ..Quorum::default()
    };
    match step(&[p.clone()], &call(&p, &two), &reviewers(), NOW, 10) {
        Step::Requorum { next, .. } => {
            assert_eq!(next.state, ProposalState::Pending);
            assert_eq!(next.approvals.len(), 1);
        }
        other => panic!("{other:?}"),
    }
    // Consumed by this call's key: the same consumption; by another: a new
    // proposal.
    p.state = ProposalState::Consumed;
    p.consumed_by = Some("k-1".into());
    assert!(matches!(
        step(&[p.clone()], &call(&p, &q), &reviewers(), NOW, 10),
        Step::Usable(_)
    ));
    p.consumed_by = Some("k-2".into());
    assert_eq!(
        step(&[p.clone()], &call(&p, &q), &reviewers(), NOW, 10),
        Step::Create
    );
}

#[test]
fn a_quorum_counts_each_reviewer_once_and_never_the_requester() {
    let mut p = proposal();
    p.quorum = Quorum {
        approvals: 2,
        ..Quorum::default()
    };
    let one = approve(&p, 1).expect("alice counts");
    assert_eq!(one.state, ProposalState::Pending);
    assert!(
        matches!(approve(&one, 1), Err(Refusal::Refused(why)) if why.contains("already approved"))
    );
    let two = approve(&one, 2).expect("bob counts");
    assert_eq!(two.state, ProposalState::Approved);
    assert_eq!(two.expires_ms, Some(NOW + 600_000));
    // bob asked for this call: his yes is his own.
    let mut own = p.clone();
    own.requester = "bob".into();
    assert!(
        matches!(approve(&own, 2), Err(Refusal::Forbidden(why)) if why.contains("nobody approves their own call"))
    );
    // A decided proposal takes no more decisions.
    assert!(matches!(approve(&two, 1), Err(Refusal::TooLate { .. })));
}

#[test]
fn a_withdrawn_approval_is_never_accepted_again() {
    let mut p = proposal();
    p.quorum = Quorum {
        approvals: 2,
        ..Quorum::default()
    };
    let one = approve(&p, 1).expect("alice counts");
    let (back, gone) = withdrawn(&one, "alice", NOW).expect("withdrawn");
    assert!(back.approvals.is_empty());
    assert_eq!(gone.reviewer(), "alice");
    // The same signed statement, sent again, is refused.
    let digest = gone.signed.statement.digest().expect("digest");
    let r = reviewers();
    let alice = r.get("alice").expect("registered").clone();
    assert!(matches!(
        decided(&back, &gone, &digest, &alice, &r, NOW, |_| Ok(())),
        Err(Refusal::Refused(why)) if why.contains("was withdrawn")
    ));
    assert!(matches!(
        withdrawn(&back, "bob", NOW),
        Err(Refusal::Refused(_))
    ));
}

#[test]
fn a_lapsed_quorum_and_an_overdue_proposal_expire() {
    let mut p = proposal();
    p.quorum = Quorum {
        approvals: 2,
        ..Quorum::default()
    };
    let one = approve(&p, 1).expect("alice counts");
    assert_eq!(lapsed(&one, NOW + 599_999), None);
    let gone = lapsed(&one, NOW + 600_000).expect("lapsed");
    assert_eq!(gone.reason.as_deref(), Some(LAPSED));
    let q = one.quorum.clone();
    assert!(matches!(
        step(
            std::slice::from_ref(&one),
            &call(&one, &q),
            &reviewers(),
            NOW + 600_000,
            10
        ),
        Step::Lapsed { .. }
    ));
    assert_eq!(overdue(&p, 1_000, 1_000), None);
    assert_eq!(
        overdue(&p, 1_001, 1_000).and_then(|e| e.reason),
        Some("nobody decided it in time".into())
    );
}

#[test]
fn a_statement_is_judged_on_its_times() {
    let p = proposal();
    let at = |issued: i64, expires: i64, verdict: Verdict, reason: &str| {
        let st = p.statement(
            verdict,
            "alice",
            reason,
            &rfc3339(issued),
            &rfc3339(expires),
            None,
        );
        timely(&st, NOW, 60_000, 300_000)
    };
    // Capped at the ttl after signing, never extended.
    assert_eq!(
        at(NOW, NOW + 900_000, Verdict::Approve, ""),
        Ok(NOW + 300_000)
    );
    assert_eq!(
        at(NOW, NOW + 100_000, Verdict::Approve, ""),
        Ok(NOW + 100_000)
    );
    assert!(
        matches!(at(NOW - 120_000, NOW + 1, Verdict::Approve, ""), Err(Refusal::Refused(w)) if w.contains("too far"))
    );
    assert!(
        matches!(at(NOW, NOW, Verdict::Approve, ""), Err(Refusal::Refused(w)) if w.contains("already past"))
    );
    assert!(
        matches!(at(NOW, NOW + 1, Verdict::Deny, " "), Err(Refusal::Refused(w)) if w.contains("needs a reason"))
    );
}

#[test]
fn only_the_requester_answers_in_the_client_and_never_for_a_quorum() {
    let p = proposal();
    let c = |who: &str, decision| Confirmation {
        channel: "elicitation".into(),
        principal: who.into(),
        decision,
        reason: String::new(),
        at: rfc3339(NOW),
        via: "session".into(),
        nonce: "n".into(),
    };
    let yes = confirmed(&p, &c("agent-7", Verdict::Approve), NOW, 300_000).expect("yes");
    assert_eq!(yes.state, ProposalState::Approved);
    assert_eq!(yes.expires_ms, Some(NOW + 300_000));
    assert!(still_valid(&yes, &reviewers()));
    assert!(matches!(
        confirmed(&p, &c("mallory", Verdict::Approve), NOW, 300_000),
        Err(Refusal::Refused(w)) if w.contains("cannot answer it")
    ));
    let mut two = p.clone();
    two.quorum.approvals = 2;
    assert!(confirmed(&two, &c("agent-7", Verdict::Approve), NOW, 300_000).is_err());
    assert!(matches!(
        confirmed(&yes, &c("agent-7", Verdict::Deny), NOW, 300_000),
        Err(Refusal::TooLate { .. })
    ));
}
