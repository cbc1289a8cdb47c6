use super::*;
use serde_json::json;

fn policies(text: &str, schema: Option<&str>) -> Result<Policies, Vec<PolicyError>> {
    Policies::from_sources(&PolicySources {
        dir: PathBuf::from("policies"),
        policies: vec![(PathBuf::from("policies/p.cedar"), text.to_owned())],
        schema: schema.map(str::to_owned),
        ..PolicySources::default()
    })
}

const SHIPPED_POLICIES: &str = include_str!("../../../policies/default.cedar");
const SHIPPED_SCHEMA: &str = include_str!("../../../policies/schema.cedarschema");

fn shipped() -> Policies {
    Policies::from_sources(&PolicySources {
        dir: PathBuf::from("policies"),
        policies: vec![(
            PathBuf::from("policies/default.cedar"),
            SHIPPED_POLICIES.to_owned(),
        )],
        schema: Some(SHIPPED_SCHEMA.to_owned()),
        reviewers: Some(include_str!("../../../policies/reviewers.toml").to_owned()),
        ..PolicySources::default()
    })
    .unwrap()
}

fn agent() -> Identity {
    Identity {
        principal: "agent-7".into(),
        tenant: "acme".into(),
        groups: vec!["agents".into()],
        ..Default::default()
    }
}

fn decide(p: &Policies, tool: &str, ann: Annotations, args: Value) -> Decision {
    p.decide(&Call {
        identity: &agent(),
        server: "payments",
        tool,
        annotations: ann,
        definition_changed: false,
        budgets: None,
        arguments: &args,
        digest: "sha256:00",
        resource_version: None,
    })
}

fn read() -> Annotations {
    Annotations {
        read_only: true,
        destructive: false,
        idempotent: true,
        open_world: false,
    }
}

fn write() -> Annotations {
    Annotations {
        read_only: false,
        destructive: false,
        idempotent: false,
        open_world: true,
    }
}

#[test]
fn which_policies_read_a_calls_own_context() {
    for (text, reads) in [
        ("when { context.approved }", false),
        (
            "when { context.tenant == \"acme\" && !context.approved }",
            false,
        ),
        ("when { context.arguments.amount > 3 }", true),
        ("when { context has resourceVersion }", true),
        ("when { context.callDigest == \"x\" }", true),
        ("when { context.approvedBy == \"x\" }", true),
        ("when { context == {} }", true),
        ("when { resource.contextual }", false),
        ("when { resource.readOnly }", false),
    ] {
        assert_eq!(reads_call_context_in(text), reads, "{text}");
    }
}

#[test]
fn quorum_annotations_are_checked_and_the_strictest_applies() {
    let text = r#"
            @id("one")
            permit (principal, action == Action::"call", resource) when { context.approved };
            @id("two")
            @approvals("2")
            @denials("2")
            permit (principal, action == Action::"call", resource == Tool::"payments/transfer")
            when { context.approved };
            @id("pair")
            @approvals_from("finance, leads")
            permit (principal, action == Action::"call", resource == Tool::"payments/transfer")
            when { context.approved };
        "#;
    let p = policies(text, None).unwrap();
    let Decision::Approval { policies: asked } =
        decide(&p, "transfer", Annotations::default(), json!({}))
    else {
        panic!("approval expected");
    };
    let q = p.quorum(&asked);
    assert_eq!(q.approvals, 2);
    assert_eq!(q.from, vec!["finance".to_owned(), "leads".to_owned()]);
    assert_eq!(q.denials, 1, "the fewer denials of the two");
    let Decision::Approval { policies: asked } =
        decide(&p, "refund", Annotations::default(), json!({}))
    else {
        panic!("approval expected");
    };
    assert!(p.quorum(&asked).is_single(), "no annotation: one reviewer");
    for (bad, says) in [
        (r#"@approvals("0")"#, "from 1 to 20"),
        (r#"@approvals("two")"#, "from 1 to 20"),
        (r#"@denials("99")"#, "from 1 to 20"),
        (r#"@approvals_from(" , ")"#, "one to 20 groups"),
    ] {
        let e = policies(
            &format!("@id(\"x\")\n{bad}\npermit (principal, action, resource);"),
            None,
        )
        .unwrap_err();
        assert!(e[0].to_string().contains(says), "{bad}: {}", e[0]);
    }
    let e = policies(
        "@id(\"f\")\n@approvals(\"2\")\nforbid (principal, action, resource);",
        None,
    )
    .unwrap_err();
    assert!(e[0].to_string().contains("not on a `forbid`"), "{}", e[0]);
}

#[test]
fn the_policy_set_digest_follows_the_files_not_the_folder() {
    let at = |dir: &str, text: &str| {
        Policies::from_sources(&PolicySources {
            dir: PathBuf::from(dir),
            policies: vec![(PathBuf::from(format!("{dir}/p.cedar")), text.to_owned())],
            schema: Some(SHIPPED_SCHEMA.to_owned()),
            ..PolicySources::default()
        })
        .unwrap()
        .digest()
        .to_owned()
    };
    let text = "permit (principal, action, resource);";
    let here = at("/etc/countersign/policies", text);
    assert!(here.starts_with("sha256:") && here.len() == 71, "{here}");
    assert_eq!(here, at("/srv/gw-2/policies", text), "two gateways agree");
    assert_ne!(
        here,
        at(
            "/etc/countersign/policies",
            "forbid (principal, action, resource);"
        )
    );
    assert_ne!(here, shipped().digest());
}

/// A slice that reads nothing of a call's own context is decided by
/// Cedar once per (identity, tool, annotations); every input of the
/// entities changes the key; a slice that reads the arguments is asked
/// every time; and a value that does not fit the schema still denies.
#[test]
fn decisions_are_cached_exactly_where_nothing_per_call_is_read() {
    let p = shipped();
    let first = decide(&p, "get_balance", read(), json!({"account": "a"}));
    let asked = p.evaluations();
    assert!(asked >= 1);
    let again = decide(&p, "get_balance", read(), json!({"account": "b"}));
    assert_eq!(again, first);
    assert_eq!(p.evaluations(), asked, "the same inputs: from the cache");
    // Another annotation set (the tool became a write): decided anew.
    let as_write = decide(&p, "get_balance", write(), json!({"account": "a"}));
    assert!(
        matches!(as_write, Decision::Approval { .. }),
        "{as_write:?}"
    );
    assert!(p.evaluations() > asked);
    // Another identity: decided anew.
    let asked = p.evaluations();
    let other = Identity {
        groups: vec![],
        ..agent()
    };
    let args = json!({"account": "a"});
    drop(p.decide(&Call {
        identity: &other,
        server: "payments",
        tool: "get_balance",
        annotations: read(),
        definition_changed: false,
        budgets: None,
        arguments: &args,
        digest: "sha256:00",
        resource_version: None,
    }));
    assert!(p.evaluations() > asked, "another identity is another key");
    // A changed definition: decided anew (it needs approval now).
    let asked = p.evaluations();
    let changed = p.decide(&Call {
        identity: &agent(),
        server: "payments",
        tool: "get_balance",
        annotations: read(),
        definition_changed: true,
        budgets: None,
        arguments: &args,
        digest: "sha256:00",
        resource_version: None,
    });
    assert!(matches!(changed, Decision::Approval { .. }), "{changed:?}");
    assert!(p.evaluations() > asked);
    // charge_card's slice reads the arguments (the ceiling): asked
    // every time, and the amount decides.
    let small = decide(
        &p,
        "charge_card",
        write(),
        json!({"account": "a", "amount": 5}),
    );
    let asked = p.evaluations();
    let big = decide(
        &p,
        "charge_card",
        write(),
        json!({"account": "a", "amount": 5000}),
    );
    assert!(p.evaluations() > asked);
    assert!(matches!(small, Decision::Approval { .. }), "{small:?}");
    assert!(matches!(big, Decision::Deny { .. }), "{big:?}");
}

#[test]
fn a_cached_slice_still_refuses_arguments_that_do_not_fit_the_schema() {
    // The shipped schema types `account` as a String.
    let p = shipped();
    let ok = decide(&p, "get_balance", read(), json!({"account": "a"}));
    assert!(matches!(ok, Decision::Allow { .. }), "{ok:?}");
    let bad = decide(&p, "get_balance", read(), json!({"account": 7}));
    assert!(
        matches!(bad, Decision::Deny { ref errors, .. } if errors.iter().any(|e| e.contains("/account"))),
        "a number is not a String, cache or not: {bad:?}"
    );
}

#[test]
fn shipped_policies_load_and_validate() {
    let p = shipped();
    assert!(p.validated(), "the shipped policies come with a schema");
    assert!(p.len() >= 4);
}

#[test]
fn reads_run_unattended() {
    let d = decide(&shipped(), "get_balance", read(), json!({"account": "a"}));
    assert!(
        matches!(d, Decision::Allow { ref policies } if policies.iter().any(|p| p.contains("read-only"))),
        "{d:?}"
    );
}

#[test]
fn writes_need_approval() {
    let d = decide(&shipped(), "refund", write(), json!({"charge": "ch_1"}));
    assert!(matches!(d, Decision::Approval { .. }), "{d:?}");
    // Default annotations are a write (and destructive): never unattended.
    let d = decide(&shipped(), "transfer", Annotations::default(), json!({}));
    assert!(matches!(d, Decision::Approval { .. }), "{d:?}");
}

#[test]
fn charges_above_the_ceiling_are_denied() {
    let p = shipped();
    assert!(matches!(
        decide(&p, "charge_card", write(), json!({"amount": 120})),
        Decision::Approval { .. }
    ));
    assert!(matches!(
        decide(&p, "charge_card", write(), json!({"amount": 999.99})),
        Decision::Approval { .. }
    ));
    let d = decide(&p, "charge_card", write(), json!({"amount": 5000}));
    assert!(
        matches!(d, Decision::Deny { ref policies, .. } if policies.iter().any(|p| p.contains("charge-ceiling"))),
        "{d:?}"
    );
    // An amount policies cannot compare (too precise for a decimal) denies.
    let d = decide(&p, "charge_card", write(), json!({"amount": 1.23456}));
    assert!(
        matches!(d, Decision::Deny { ref errors, .. } if !errors.is_empty()),
        "{d:?}"
    );
}

#[test]
fn default_deny_and_errors_deny() {
    let empty = policies("", None).unwrap();
    assert!(matches!(
        decide(&empty, "get_balance", read(), json!({})),
        Decision::Deny { .. }
    ));
    // A forbid that errors must not fail open.
    let p = policies(
            r#"permit(principal, action, resource);
               forbid(principal, action, resource) when { context.arguments.amount.greaterThan(decimal("10.0")) };"#,
            None,
        )
        .unwrap();
    let d = decide(&p, "x", read(), json!({"amount": "lots"}));
    assert!(
        matches!(d, Decision::Deny { ref errors, .. } if !errors.is_empty()),
        "{d:?}"
    );
    assert!(matches!(
        decide(&p, "x", read(), json!({"amount": 5})),
        Decision::Allow { .. }
    ));
}

#[test]
fn awkward_arguments_map_deterministically() {
    let p = policies(
            r#"@id("shape") permit(principal, action, resource) when {
                 !(context.arguments has gone) &&
                 context.arguments.f == decimal("4.5") &&
                 context.arguments.i == decimal("7.0") &&
                 context.arguments.big == "100000000000000000000" &&
                 context.arguments.tiny == "1e-7" &&
                 context.arguments.nested.deep.x == true &&
                 context.arguments.mixed.contains("a") && context.arguments.mixed.contains(decimal("1.0")) &&
                 context.arguments["not an-identifier"] == "ok"
               };"#,
            None,
        )
        .unwrap();
    // As canonical arguments hold them: 1e20 is beyond a decimal's range
    // and 1e-7 beyond its precision, so both become strings.
    let args: Value = serde_json::from_str(
            r#"{"gone": null, "f": 4.50, "i": 7, "big": 100000000000000000000, "tiny": 0.0000001,
                "nested": {"deep": {"x": true}}, "mixed": ["a", 1, null, "a"], "not an-identifier": "ok"}"#,
        )
        .unwrap();
    let d = decide(&p, "t", read(), args);
    assert!(matches!(d, Decision::Allow { .. }), "{d:?}");
}

#[test]
fn only_solo_requesters_confirm_and_never_destructive_or_changed_tools() {
    let p = shipped();
    let args = json!({"account": "a", "amount": 5});
    let solo = Identity {
        principal: "dev-1".into(),
        tenant: "acme".into(),
        groups: vec!["solo".into()],
        ..Default::default()
    };
    let agent = agent();
    let call = |who, ann, changed| Call {
        identity: who,
        server: "payments",
        tool: "charge_card",
        annotations: ann,
        definition_changed: changed,
        budgets: None,
        arguments: &args,
        digest: "d",
        resource_version: None,
    };
    let destructive = Annotations {
        destructive: true,
        ..write()
    };
    let allowed = p.may_confirm(&call(&solo, write(), false)).unwrap();
    assert_eq!(allowed, vec!["default/solo-confirms-writes".to_owned()]);
    assert!(p.may_confirm(&call(&solo, destructive, false)).is_err());
    assert!(p.may_confirm(&call(&solo, write(), true)).is_err());
    assert!(p.may_confirm(&call(&agent, write(), false)).is_err());
    // Confirming changes nothing about `approve`: nobody approves their
    // own call as a reviewer.
    assert!(p
        .may_approve("dev-1", &["leads".into()], &call(&solo, write(), false))
        .is_err());
}

#[test]
fn reviewers_approve_leads_for_destructive_and_nobody_their_own() {
    let p = shipped();
    let args = json!({"account": "a"});
    let who = agent();
    let call = |ann| Call {
        identity: &who,
        server: "payments",
        tool: "close_account",
        annotations: ann,
        definition_changed: false,
        budgets: None,
        arguments: &args,
        digest: "d",
        resource_version: None,
    };
    let destructive = Annotations {
        read_only: false,
        destructive: true,
        idempotent: false,
        open_world: true,
    };
    assert!(
        p.may_approve("bob", &["reviewers".into()], &call(write()))
            .is_ok(),
        "any reviewer approves a plain write"
    );
    let refused = p.may_approve("bob", &["reviewers".into()], &call(destructive));
    assert!(refused.is_err(), "a destructive tool needs a lead");
    assert!(p
        .may_approve("carol", &["leads".into()], &call(destructive))
        .is_ok());
    // The requester `agent-7` reviewing its own call, even as a lead.
    let own = p.may_approve("agent-7", &["leads".into()], &call(write()));
    assert!(
        matches!(own, Err(Decision::Deny { ref policies, .. }) if policies.iter().any(|p| p.contains("no-self-approval"))),
        "{own:?}"
    );
}

#[test]
fn slicing_decides_like_the_whole_set() {
    let mut text = SHIPPED_POLICIES.to_owned();
    for i in 0..50 {
        text.push_str(&format!(
                "@id(\"other-{i}\") forbid (principal, action == Action::\"call\", resource == Tool::\"payments/other_{i}\");\n"
            ));
    }
    text.push_str(
        "@id(\"server-wide\") forbid (principal, action, resource in Server::\"vault\");\n",
    );
    let p = policies(&text, None).unwrap();
    let cases = [
        ("payments", "get_balance", read(), json!({})),
        ("payments", "charge_card", write(), json!({"amount": 5000})),
        ("payments", "other_7", read(), json!({})),
        ("vault", "get_secret", read(), json!({})),
        ("payments", "refund", write(), json!({})),
    ];
    for (server, tool, ann, args) in cases {
        let call = Call {
            identity: &agent(),
            server,
            tool,
            annotations: ann,
            definition_changed: false,
            budgets: None,
            arguments: &args,
            digest: "d",
            resource_version: None,
        };
        assert_eq!(p.decide(&call), p.decide_unsliced(&call), "{server}/{tool}");
    }
    let args = json!({});
    let call = Call {
        identity: &agent(),
        server: "payments",
        tool: "other_7",
        annotations: read(),
        definition_changed: false,
        budgets: None,
        arguments: &args,
        digest: "d",
        resource_version: None,
    };
    assert!(
        matches!(p.decide(&call), Decision::Deny { ref policies, .. } if policies == &vec!["p/other-7".to_string()])
    );
    assert!(
        p.slice("payments", "get_balance").set.policies().count() < 10,
        "a slice holds only what can apply"
    );
}

#[test]
fn errors_name_file_line_and_column() {
    let e = policies(
        "permit(principal, action, resource)\nwhen { context.x == };",
        None,
    )
    .unwrap_err();
    assert_eq!(e[0].line, Some(2), "{e:?}");
    assert!(e[0]
        .to_string()
        .starts_with(&format!("{}", e[0].file.display())));
}

#[test]
fn validation_catches_an_attribute_typo() {
    let schema = SHIPPED_SCHEMA.to_owned();
    let ok = policies(
        "permit(principal, action == Action::\"call\", resource) when { resource.readOnly };",
        Some(&schema),
    );
    assert!(ok.is_ok(), "{:?}", ok.err());
    let typo = policies(
        "permit(principal, action == Action::\"call\", resource)\n  when { resource.readOnyl };",
        Some(&schema),
    );
    let errors = typo.expect_err("a typo must not validate");
    assert!(errors[0].to_string().contains("readOnyl"), "{errors:?}");
    assert_eq!(errors[0].line, Some(2), "{errors:?}");
}

#[test]
fn entity_keys_differ_whenever_the_inputs_do() {
    let base = agent();
    let args = json!({});
    let key = |who: &Identity, server: &str, tool: &str, ann: Annotations, changed: bool| {
        cache::entity_key(&Call {
            identity: who,
            server,
            tool,
            annotations: ann,
            definition_changed: changed,
            budgets: None,
            arguments: &args,
            digest: "sha256:00",
            resource_version: None,
        })
    };
    let k = |who: &Identity| key(who, "payments", "pay", read(), false);
    let one_group = Identity {
        groups: vec!["a,b".into()],
        ..base.clone()
    };
    let two_groups = Identity {
        groups: vec!["a".into(), "b".into()],
        ..base.clone()
    };
    let scoped = Identity {
        scopes: vec!["agents".into()],
        groups: vec![],
        ..base.clone()
    };
    let no_client = base.clone();
    let empty_client = Identity {
        client: Some(String::new()),
        ..base.clone()
    };
    let shifted = Identity {
        principal: "agent-7a".into(),
        tenant: "cme".into(),
        ..base.clone()
    };
    let keys = [
        k(&base),
        k(&one_group),
        k(&two_groups),
        k(&scoped),
        k(&empty_client),
        k(&shifted),
        key(&base, "payment", "spay", read(), false),
        key(&base, "payments", "pay", read(), true),
        key(&base, "payments", "pay", Annotations::default(), false),
    ];
    for (i, a) in keys.iter().enumerate() {
        for b in &keys[i + 1..] {
            assert_ne!(a, b);
        }
    }
    assert_eq!(k(&no_client), k(&base));
}
