//! `countersign policy check` and `countersign policy test` as commands, for
//! CI in a policy repository.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::code;

use std::path::PathBuf;

fn policies_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("policies")
}

fn run(args: &[&str]) -> (bool, String) {
    let (ok, out, err) = common::run_cli(args);
    (ok, format!("{out}{err}"))
}

#[test]
fn shipped_policies_check_and_pass_their_cases() {
    let dir = policies_dir();
    let (ok, out) = run(&["policy", "check", "--dir", dir.to_str().unwrap()]);
    assert!(ok, "{out}");
    assert!(
        out.contains("validated against schema.cedarschema"),
        "{out}"
    );
    let cases = dir.join("tests.toml");
    let (ok, out) = run(&[
        "policy",
        "test",
        cases.to_str().unwrap(),
        "--dir",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{out}");
    assert!(out.contains("9 passed, 0 failed"), "{out}");
}

#[test]
fn check_catches_a_typo_in_an_attribute_with_its_line() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(
        policies_dir().join("schema.cedarschema"),
        tmp.path().join("schema.cedarschema"),
    )
    .unwrap();
    std::fs::write(
        tmp.path().join("mine.cedar"),
        "@id(\"reads\")\npermit (principal, action == Action::\"call\", resource)\nwhen { resource.readOnyl };\n",
    )
    .unwrap();
    let (ok, out) = run(&["policy", "check", "--dir", tmp.path().to_str().unwrap()]);
    assert!(
        !ok,
        "a typo must fail the check (validation skipped?): {out}"
    );
    assert!(out.contains("mine.cedar:3:"), "{out}");
    assert!(out.contains("readOnyl"), "{out}");

    // Without the schema the same file parses: the schema is what catches it.
    std::fs::remove_file(tmp.path().join("schema.cedarschema")).unwrap();
    let (ok, out) = run(&["policy", "check", "--dir", tmp.path().to_str().unwrap()]);
    assert!(ok, "{out}");
    assert!(out.contains("parsed only"), "{out}");
}

#[test]
fn check_reports_syntax_errors_and_test_reports_failures() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("bad.cedar"),
        "permit (principal, action, resource)\nwhen { principal == };\n",
    )
    .unwrap();
    let (ok, out) = run(&["policy", "check", "--dir", tmp.path().to_str().unwrap()]);
    assert!(!ok);
    assert!(out.contains("bad.cedar:2:"), "{out}");

    let cases = tmp.path().join("cases.toml");
    std::fs::write(
        &cases,
        "[[case]]\nname = \"writes run unattended?\"\nprincipal = \"a\"\ntenant = \"t\"\nserver = \"payments\"\ntool = \"refund\"\nexpect = \"allow\"\n",
    )
    .unwrap();
    let dir = policies_dir();
    let (ok, out) = run(&[
        "policy",
        "test",
        cases.to_str().unwrap(),
        "--dir",
        dir.to_str().unwrap(),
    ]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("FAIL  writes run unattended?: expected Allow, got Approval"),
        "{out}"
    );
}

/// A gateway whose policy folder is a copy of the shipped defaults.
fn gateway_with_default_policies() -> (common::Gateway, tempfile::TempDir) {
    let pdir = tempfile::tempdir().unwrap();
    for f in ["schema.cedarschema", "default.cedar"] {
        std::fs::copy(policies_dir().join(f), pdir.path().join(f)).unwrap();
    }
    let gw = common::Gateway::start_with(common::Options {
        policies: Some(pdir.path().to_owned()),
        ..Default::default()
    });
    (gw, pdir)
}

#[tokio::test]
async fn default_policies_decide_every_call_before_it_runs() {
    use serde_json::json;
    let (gw, _pdir) = gateway_with_default_policies();
    let mut c = common::Client::new(&gw.url("payments"));
    c.initialize().await;
    c.post(&json!({"jsonrpc":"2.0","id":0,"method":"tools/list"}))
        .await;
    let read = c.call(1, "get_balance", json!({"account":"a"})).await;
    assert_eq!(
        read.last()["result"]["isError"],
        false,
        "reads run unattended: {read:?}"
    );
    let write = c.call(2, "refund", json!({"charge":"ch_1"})).await;
    assert_eq!(code(&write), "approval_pending", "{write:?}");
    let big = c
        .call(3, "charge_card", json!({"account":"a","amount":5000}))
        .await;
    assert_eq!(code(&big), "policy_denied", "{big:?}");
    assert!(
        !big.text.contains("charge-ceiling"),
        "which policy denied stays in the gateway: {}",
        big.text
    );
    assert_eq!(gw.executions("refund"), 0);
    assert_eq!(gw.executions("charge_card"), 0);
    assert_eq!(gw.executions("get_balance"), 1);
    // The log names the determining policy (read as the gateway writes it:
    // the line may reach the test's reader a moment after the answer).
    gw.wait_for_log("charge-ceiling").await;
}

#[tokio::test]
async fn policy_edits_apply_to_the_next_call_and_broken_edits_are_refused() {
    use serde_json::json;
    let (gw, pdir) = gateway_with_default_policies();
    let mut c = common::Client::new(&gw.url("payments"));
    c.initialize().await;
    c.post(&json!({"jsonrpc":"2.0","id":0,"method":"tools/list"}))
        .await;
    assert_eq!(
        code(&c.call(1, "refund", json!({"charge":"ch_1"})).await),
        "approval_pending"
    );

    // An edit in git: refunds run unattended from now on.
    std::fs::write(
        pdir.path().join("refunds.cedar"),
        "@id(\"refunds-unattended\")\npermit (principal, action == Action::\"call\", resource == Tool::\"payments/refund\");\n",
    )
    .unwrap();
    let mut ran = false;
    for i in 0..40 {
        let a = c
            .call(10 + i, "refund", json!({"charge": format!("ch_{i}")}))
            .await;
        if a.last()["result"]["isError"] == false {
            ran = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(ran, "the edit never took effect");
    assert_eq!(gw.executions("refund"), 1);

    // A broken edit: the previous set stays in force and the error is logged with its line.
    std::fs::write(
        pdir.path().join("broken.cedar"),
        "permit (principal, action, resource)\nwhen { principal == };\n",
    )
    .unwrap();
    let mut logged = false;
    for _ in 0..40 {
        if gw
            .log
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("policy reload refused") && l.contains("broken.cedar:2:"))
        {
            logged = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        logged,
        "the refused reload was not logged with file and line"
    );
    let a = c.call(99, "refund", json!({"charge":"ch_after"})).await;
    assert_eq!(
        a.last()["result"]["isError"],
        false,
        "old behaviour kept: {a:?}"
    );
    assert_eq!(
        code(&c.call(100, "close_account", json!({"account":"z"})).await),
        "approval_pending"
    );
}

#[test]
fn serve_refuses_to_start_with_broken_policies() {
    let pdir = tempfile::tempdir().unwrap();
    std::fs::write(
        pdir.path().join("bad.cedar"),
        "permit (principal, action, resource)\nwhen { nope };\n",
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        format!(
            "[gateway]\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\npolicies = \"{}\"\n",
            dir.path().join("data").display(),
            pdir.path().display()
        ),
    )
    .unwrap();
    let (ok, out) = run(&["serve", "--config", config.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        out.contains("do not load") && out.contains("bad.cedar:2:"),
        "{out}"
    );
}

#[test]
fn policy_schema_types_arguments_from_a_live_tools_list() {
    let gw = common::Gateway::start();
    let (ok, out) = run(&[
        "policy",
        "schema",
        "--server",
        "payments",
        "--config",
        gw.config_path().to_str().unwrap(),
    ]);
    assert!(ok, "{out}");
    assert!(out.contains("amount?: decimal,"), "{out}");
    assert!(out.contains("account?: String,"), "{out}");
    assert!(out.contains("steps?: Long,"), "{out}");
    assert!(
        out.contains("//   charge_card(account, amount, currency)"),
        "{out}"
    );
    // Spliced into the schema, the default policies still validate, and a
    // policy naming a field no tool has is caught.
    let generated: String = out
        .lines()
        .filter(|l| !l.contains("INFO") && !l.contains("WARN"))
        .collect::<Vec<_>>()
        .join("\n");
    let schema = std::fs::read_to_string(policies_dir().join("schema.cedarschema")).unwrap();
    let start = schema.find("type Arguments").unwrap();
    let end = start + schema[start..].find("};").unwrap() + 2;
    let spliced = format!("{}{}{}", &schema[..start], generated, &schema[end..]);
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("schema.cedarschema"), spliced).unwrap();
    std::fs::copy(
        policies_dir().join("default.cedar"),
        tmp.path().join("default.cedar"),
    )
    .unwrap();
    let (ok, out) = run(&["policy", "check", "--dir", tmp.path().to_str().unwrap()]);
    assert!(ok, "{out}");
    std::fs::write(
        tmp.path().join("typo.cedar"),
        "forbid (principal, action == Action::\"call\", resource)\nwhen { context.arguments.amout.greaterThan(decimal(\"1.0\")) };\n",
    )
    .unwrap();
    let (ok, out) = run(&["policy", "check", "--dir", tmp.path().to_str().unwrap()]);
    assert!(!ok, "{out}");
    assert!(out.contains("typo.cedar:2:"), "{out}");
}

#[test]
fn a_schema_typing_amount_long_decides_charges_and_names_a_mismatch() {
    let tmp = tempfile::tempdir().unwrap();
    let schema = std::fs::read_to_string(policies_dir().join("schema.cedarschema"))
        .unwrap()
        .replace("amount?: decimal,", "amount?: Long,");
    assert!(schema.contains("amount?: Long,"));
    std::fs::write(tmp.path().join("schema.cedarschema"), schema).unwrap();
    std::fs::write(
        tmp.path().join("mine.cedar"),
        r#"@id("writes-need-approval")
permit (principal, action == Action::"call", resource) when { context.approved };
@id("ceiling")
forbid (principal, action == Action::"call", resource)
when { context.arguments has amount && context.arguments.amount > 1000 };
"#,
    )
    .unwrap();
    let dir = tmp.path().to_str().unwrap();
    let (ok, out) = run(&["policy", "check", "--dir", dir]);
    assert!(ok, "validator-clean: {out}");
    let case = |name: &str, amount: &str, expect: &str| {
        format!(
            "[[case]]\nname = \"{name}\"\nprincipal = \"agent-7\"\ntenant = \"acme\"\nserver = \"payments\"\ntool = \"charge_card\"\narguments = {{ account = \"a\", amount = {amount} }}\nexpect = \"{expect}\"\n"
        )
    };
    let cases = [
        case("a charge as a Long", "120", "approval"),
        case("above the ceiling", "5000", "deny"),
        case("a string where a Long is declared", "\"120\"", "deny"),
    ]
    .join("\n");
    let file = tmp.path().join("cases.toml");
    std::fs::write(&file, cases).unwrap();
    let (ok, out) = run(&["policy", "test", file.to_str().unwrap(), "--dir", dir]);
    assert!(ok, "{out}");
    assert!(out.contains("3 passed, 0 failed"), "{out}");
    let mismatch = out
        .lines()
        .find(|l| l.contains("a string where a Long"))
        .unwrap();
    assert!(
        mismatch.contains("`/amount` is declared Long"),
        "the reason names the field: {mismatch}"
    );
}

#[test]
fn a_schema_that_does_not_declare_definition_changed_still_validates_and_decides() {
    let tmp = tempfile::tempdir().unwrap();
    let schema = std::fs::read_to_string(policies_dir().join("schema.cedarschema")).unwrap();
    let older = schema.replace("  definitionChanged?: Bool,\n", "");
    assert_ne!(older, schema, "the shipped schema declares it");
    std::fs::write(tmp.path().join("schema.cedarschema"), older).unwrap();
    for f in ["default.cedar", "quorum.cedar"] {
        std::fs::copy(policies_dir().join(f), tmp.path().join(f)).unwrap();
    }
    let dir = tmp.path().to_str().unwrap();
    let (ok, out) = run(&["policy", "check", "--dir", dir]);
    assert!(ok, "{out}");
    let cases = policies_dir().join("tests.toml");
    let (ok, out) = run(&["policy", "test", cases.to_str().unwrap(), "--dir", dir]);
    assert!(ok, "{out}");
    assert!(out.contains("9 passed, 0 failed"), "{out}");
}
