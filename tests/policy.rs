//! `countersign policy check` and `countersign policy test` as commands, for
//! CI in a policy repository.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::countersign_bin;

fn policies_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("policies")
}

fn run(args: &[&str]) -> (bool, String) {
    let out = Command::new(countersign_bin()).args(args).output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
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
    assert!(out.contains("5 passed, 0 failed"), "{out}");
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
