use super::*;
use serde_json::json;

#[test]
fn a_summary_escapes_what_would_break_its_sentence() {
    let mut p = proposal();
    p.arguments = json!({"note": "first line\n", "memo": "tab\there", "plain": "ok"});
    let s = summary(&p);
    assert!(!s.contains('\n') && !s.contains('\t'), "{s}");
    assert!(s.contains(r#"note "first line\n""#), "{s}");
    assert!(s.contains(r#"memo "tab\there""#), "{s}");
    assert!(s.contains("plain ok"), "{s}");
}

/// The guards' figures reach every surface that words a proposal: the
/// summary (notifications, the console, the question in the client) and the
/// flags (`pending`, the TUI), escaped like any text from the store.
#[test]
fn the_guards_figures_are_in_the_summary_and_the_flags() {
    let mut p = proposal();
    p.guards = vec![
        "budget card-daily (principal:agent-7): spent 800 of 1,000 in 1d; this call 400; after it 1,200 (over the limit)".into(),
        "repeats an earlier call (effect key x\u{1b}[2J): dispatched at 2026-12-06T10:42:00Z".into(),
    ];
    let s = summary(&p);
    assert!(s.ends_with("; budget card-daily (principal:agent-7): spent 800 of 1,000 in 1d; this call 400; after it 1,200 (over the limit); repeats an earlier call (effect key x\\u{1b}[2J): dispatched at 2026-12-06T10:42:00Z"), "{s}");
    let f = flags(&serde_json::to_value(&p).unwrap());
    assert!(f.iter().any(|f| f.contains("after it 1,200")), "{f:?}");
    assert!(f.iter().all(|f| !f.contains('\u{1b}')), "{f:?}");
}

pub(crate) fn proposal() -> Proposal {
    Proposal {
        resource_version: Some("v1".into()),
        tool_definition: Some("sha256:d1".into()),
        risk: Risk::Destructive,
        ..Proposal::pending(
            "p-0123456789abcdef".into(),
            "acme".into(),
            "agent-7".into(),
            "payments".into(),
            "charge_card".into(),
            json!({"account": "acct-1", "amount": 10}),
            "sha256:aa".into(),
        )
    }
}

fn key(n: u8) -> SigningKey {
    SigningKey::from_bytes(&[n; 32])
}

#[test]
fn statement_signs_its_jcs_and_verifies() {
    let p = proposal();
    let st = p.statement(
        Verdict::Approve,
        "alice",
        "ok",
        "2026-11-30T10:00:00Z",
        "2026-11-30T10:15:00Z",
        Some("sha256:ps"),
    );
    let bytes = st.signing_bytes().unwrap();
    // The signed bytes are what an independent RFC 8785 writer makes of
    // the statement: a reviewer's tool that signs with serde_jcs agrees.
    assert_eq!(bytes, serde_jcs::to_vec(&st).unwrap());
    // JCS: keys sorted, no whitespace, `type` included, null kept.
    let text = String::from_utf8(bytes).unwrap();
    assert!(
        text.starts_with(r#"{"call_digest":"sha256:aa","decision":"approve","expires_at":"#),
        "{text}"
    );
    assert!(text.contains(r#""tool_definition":"sha256:d1""#));
    assert!(text.contains(r#""type":"countersign.approval.v3""#));
    assert!(text.contains(r#""policy_set":"sha256:ps""#));
    let sig = st.sign(&key(1)).unwrap();
    st.verify(&key(1).verifying_key(), &sig).unwrap();
    // Another key, or any changed field, fails.
    assert!(st.verify(&key(2).verifying_key(), &sig).is_err());
    let mut tampered = st.clone();
    tampered.call_digest = "sha256:bb".into();
    assert!(tampered.verify(&key(1).verifying_key(), &sig).is_err());
    let mut flipped = st.clone();
    flipped.decision = Verdict::Deny;
    assert!(flipped.verify(&key(1).verifying_key(), &sig).is_err());
    assert!(st.verify(&key(1).verifying_key(), "not base64!").is_err());
    assert!(st.verify(&key(1).verifying_key(), "AAAA").is_err());
}

#[test]
fn binding_compares_every_field() {
    let p = proposal();
    let st = p.statement(Verdict::Approve, "alice", "", "t", "t", Some("sha256:ps"));
    st.check_binding(&p.binding()).unwrap();
    let mut other = p.clone();
    other.tool = "refund".into();
    assert!(st
        .check_binding(&other.binding())
        .unwrap_err()
        .to_string()
        .contains("`tool`"));
    let mut other = p.clone();
    other.resource_version = None;
    assert!(st
        .check_binding(&other.binding())
        .unwrap_err()
        .to_string()
        .contains("`resource_version`"));
    let mut other = p.clone();
    other.requester = "agent-8".into();
    assert!(st.check_binding(&other.binding()).is_err());
    let mut other = p.clone();
    other.tenant = "globex".into();
    assert!(st.check_binding(&other.binding()).is_err());
    let mut wrong_type = st.clone();
    wrong_type.kind = "countersign.approval.v0".into();
    assert!(wrong_type.check_binding(&p.binding()).is_err());
    let mut other = p.clone();
    other.tool_definition = Some("sha256:d2".into());
    assert!(st
        .check_binding(&other.binding())
        .unwrap_err()
        .to_string()
        .contains("`tool_definition`"));
}

#[test]
fn version_1_statements_still_verify() {
    let p = proposal();
    // A statement as a version-1 signer wrote it: no tool_definition.
    let mut st = p.statement(Verdict::Approve, "alice", "", "t", "t", None);
    st.kind = STATEMENT_TYPE_V1.into();
    st.tool_definition = None;
    let text = String::from_utf8(st.signing_bytes().unwrap()).unwrap();
    assert!(!text.contains("tool_definition"), "{text}");
    let sig = st.sign(&key(1)).unwrap();
    st.verify(&key(1).verifying_key(), &sig).unwrap();
    st.check_binding(&p.binding()).unwrap();
    // Version 1 cannot carry a definition: that would be a v2 field
    // under a v1 name.
    let mut mixed = st.clone();
    mixed.tool_definition = Some("sha256:d1".into());
    assert!(mixed.check_binding(&p.binding()).is_err());
}

#[test]
fn version_3_binds_the_policy_set_and_version_2_still_verifies() {
    let p = proposal();
    let st = p.statement(Verdict::Approve, "alice", "", "t", "t", Some("sha256:ps"));
    let mut now = p.binding();
    now.policy_set = Some("sha256:ps");
    st.check_binding(&now).unwrap();
    now.policy_set = Some("sha256:other");
    let e = st.check_binding(&now).unwrap_err().to_string();
    assert!(e.contains("the policies changed since you looked"), "{e}");
    // Offline (no policy set in force to compare with): the rest binds.
    st.check_binding(&p.binding()).unwrap();
    // A version-2 statement, as signed before: no policy set, verifies.
    let v2 = p.statement(Verdict::Approve, "alice", "", "t", "t", None);
    assert_eq!(v2.kind, STATEMENT_TYPE_V2);
    let text = String::from_utf8(v2.signing_bytes().unwrap()).unwrap();
    assert!(!text.contains("policy_set"), "{text}");
    let sig = v2.sign(&key(1)).unwrap();
    v2.verify(&key(1).verifying_key(), &sig).unwrap();
    v2.check_binding(&now).unwrap();
    // A policy set under the version-2 name is refused, and so is a
    // version-3 statement without one.
    let mut mixed = v2.clone();
    mixed.policy_set = Some("sha256:ps".into());
    assert!(mixed.check_binding(&now).is_err());
    let mut bare = st.clone();
    bare.policy_set = None;
    assert!(bare.check_binding(&now).is_err());
}

fn groups(g: &[&str]) -> Vec<String> {
    g.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn a_quorum_counts_distinct_reviewers_and_matches_groups() {
    let two = Quorum {
        approvals: 2,
        ..Quorum::default()
    };
    let leads = groups(&["leads"]);
    let finance = groups(&["finance"]);
    let both = groups(&["finance", "leads"]);
    let m = two.missing(&[("alice", &leads)]).unwrap();
    assert_eq!(m.to_string(), "needs one more");
    assert!(two.missing(&[("alice", &leads), ("bob", &[])]).is_none());
    let four_eyes = Quorum {
        approvals: 1,
        from: groups(&["finance", "leads"]),
        denials: 1,
    };
    assert_eq!(four_eyes.needed(), 2);
    // Two leads are not a finance and a lead.
    let m = four_eyes
        .missing(&[("alice", &leads), ("carol", &leads)])
        .unwrap();
    assert_eq!(m.to_string(), "needs one more from finance");
    assert!(four_eyes
        .missing(&[("alice", &leads), ("dave", &finance)])
        .is_none());
    // One person in both groups covers one of them, not both; a second
    // person in either group completes it (the matching reassigns).
    let m = four_eyes.missing(&[("erin", &both)]).unwrap();
    assert_eq!(m.more, 1);
    assert!(four_eyes
        .missing(&[("erin", &both), ("carol", &leads)])
        .is_none());
    assert!(four_eyes
        .missing(&[("carol", &leads), ("erin", &both)])
        .is_none());
    let none = four_eyes.missing(&[]).unwrap();
    assert_eq!(none.to_string(), "needs 2 more, from finance and leads");
    assert!(Quorum::default().is_single() && !four_eyes.is_single());
    assert!(Quorum::default().missing(&[("a", &[])]).is_none());
}

#[test]
fn the_strictest_quorum_wins() {
    let a = Quorum {
        approvals: 2,
        from: groups(&["finance"]),
        denials: 2,
    };
    let b = Quorum {
        approvals: 1,
        from: groups(&["finance", "finance", "leads"]),
        denials: 1,
    };
    let s = a.strictest(&b);
    assert_eq!(s.approvals, 2);
    assert_eq!(s.from, groups(&["finance", "finance", "leads"]));
    assert_eq!(s.denials, 1);
    assert_eq!(s.needed(), 3);
    assert_eq!(
        Quorum::default().strictest(&a),
        a.strictest(&Quorum::default())
    );
}

#[test]
fn progress_says_who_approved_and_what_is_missing() {
    let mut p = proposal();
    assert_eq!(p.progress(), None);
    p.quorum = Quorum {
        approvals: 1,
        from: groups(&["finance", "leads"]),
        denials: 1,
    };
    let st = p.statement(Verdict::Approve, "alice", "", "t", "t", Some("sha256:ps"));
    p.approvals.push(Given {
        signed: SignedDecision {
            statement: st,
            signature: String::new(),
            public_key: String::new(),
            passkey: None,
        },
        groups: groups(&["leads"]),
        expires_ms: 10,
    });
    assert_eq!(
        p.progress().unwrap(),
        "1 of 2 approvals: alice (leads); needs one more from finance"
    );
    assert_eq!(p.earliest_expiry(), Some(10));
}

#[test]
fn statement_refuses_unknown_fields() {
    let p = proposal();
    let mut v =
        serde_json::to_value(p.statement(Verdict::Approve, "a", "", "t", "t", Some("sha256:ps")))
            .unwrap();
    v["extra"] = json!(1);
    assert!(serde_json::from_value::<Statement>(v).is_err());
}

#[test]
fn diff_names_changed_added_and_removed_fields() {
    let d = diff(
        &json!({"amount": 10, "account": "a", "meta": {"x": 1, "a/b": 2}}),
        &json!({"amount": 12, "account": "a", "meta": {"x": 1}, "note": "n"}),
    );
    assert_eq!(
        d,
        vec![
            Change {
                pointer: "/amount".into(),
                before: Some(json!(10)),
                after: Some(json!(12))
            },
            Change {
                pointer: "/meta/a~1b".into(),
                before: Some(json!(2)),
                after: None
            },
            Change {
                pointer: "/note".into(),
                before: None,
                after: Some(json!("n"))
            },
        ]
    );
    assert!(diff(&json!({"a": [1]}), &json!({"a": [1]})).is_empty());
}

proptest::proptest! {
    /// Whatever order calls with different keys, times and digests try
    /// to consume one approval in, at most one key ever gets it, never
    /// after expiry, never for another call.
    #[test]
    fn one_approval_serves_at_most_one_key(
        attempts in proptest::collection::vec((0u8..4, 0i64..200, proptest::bool::ANY), 1..40)
    ) {
        let mut p = proposal();
        p.state = ProposalState::Approved;
        p.expires_ms = Some(100);
        let mut winner: Option<String> = None;
        for (key, now, same_digest) in attempts {
            let key = format!("k{key}");
            let digest = if same_digest { "sha256:aa" } else { "sha256:bb" };
            if let Ok(next) = consume(&p, &key, "payments", digest, now) {
                proptest::prop_assert!(same_digest);
                if let Some(next) = next {
                    proptest::prop_assert!(now < 100, "consumed after expiry");
                    proptest::prop_assert!(winner.is_none());
                    p = next;
                }
                match &winner {
                    Some(w) => proptest::prop_assert_eq!(w, &key),
                    None => winner = Some(key),
                }
            }
        }
    }
}

#[test]
fn the_queue_puts_the_proposal_that_expires_first_in_front() {
    let p = |id: &str, created: i64, expires: i64| serde_json::json!({"id": id, "created_ms": created, "pending_expires_ms": expires});
    // b was made later but expires first (a shorter pending_ttl then).
    let mut list = [p("a", 100, 9_000), p("b", 200, 5_000), p("c", 50, 9_000)];
    list.sort_by_key(super::queue_key);
    let ids: Vec<&str> = list.iter().map(|v| v["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["b", "c", "a"]);
}

#[test]
fn a_proposal_revises_only_its_own_keys_and_stands_beside_another_calls() {
    let made = |id: &str, key: &str, amount: i64, at: i64| {
        let mut p = proposal();
        (p.id, p.call_key, p.created_ms) = (id.into(), Some(key.into()), at);
        p.call_digest = format!("sha256:{amount}");
        p.arguments = json!({"account": "acct-1", "amount": amount});
        p
    };
    let mine = [made("p-a", "k1", 10, 0), made("p-b", "k2", 20, 100)];
    // The same key, another amount: a revision, with the difference.
    let mut resent = made("p-c", "k1", 11, 200);
    resent.relate(&mine, 1_000, None);
    assert_eq!(resent.revises.as_ref().unwrap().proposal_id, "p-a");
    assert_eq!(
        resent.revises.as_ref().unwrap().changes[0].pointer,
        "/amount"
    );
    assert!(resent.beside.is_none());
    // A key of its own: the newest other call beside it, no revision.
    let mut other = made("p-d", "k3", 30, 200);
    other.relate(&mine, 1_000, None);
    assert!(other.revises.is_none());
    assert_eq!(other.beside.unwrap().proposal_id, "p-b");
    // Out of the window: nothing.
    let mut late = made("p-e", "k1", 12, 5_000);
    late.relate(&mine, 1_000, None);
    assert!(late.revises.is_none() && late.beside.is_none());
    // A key of its own, but the agent says it replaces p-a: a revision.
    let mut linked = made("p-f", "k4", 15, 300);
    linked.relate(&mine, 1_000, Some("p-a"));
    assert_eq!(linked.revises.as_ref().unwrap().proposal_id, "p-a");
    assert!(linked.beside.is_none());
    // A link to a proposal that is not the requester's (not in `mine`), or
    // of another tool, is not followed.
    let mut stray = made("p-g", "k5", 16, 300);
    stray.relate(&mine, 1_000, Some("p-someone-elses"));
    assert!(stray.revises.is_none());
    assert_eq!(stray.beside.unwrap().proposal_id, "p-b");
    let mut other_tool = made("p-h", "k6", 17, 300);
    other_tool.tool = "refund".into();
    other_tool.relate(&mine, 1_000, Some("p-a"));
    assert!(other_tool.revises.is_none() && other_tool.beside.is_none());
}
