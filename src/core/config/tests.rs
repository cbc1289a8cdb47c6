use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("test.toml"))
}

#[test]
fn webhooks_are_https_named_once_and_ask_for_something() {
    let ok = "[[notify.webhooks]]\nname = \"ops\"\nurl = \"https://hooks.example.com/x\"\n\
                  secret = { env = \"S\" }\n";
    let c = parse(ok).unwrap();
    assert_eq!(
        c.notify.webhooks[0].events.len(),
        6,
        "every kind by default"
    );
    assert_eq!(c.notify.webhooks[0].format, WebhookFormat::Json);
    assert_eq!(c.notify.retry_for, Duration::from_secs(86_400));
    let cases = [
        (
            ok.replace("https://hooks.example.com/x", "http://hooks.example.com/x"),
            "must be https://",
        ),
        (format!("{ok}{ok}"), "used twice"),
        (format!("{ok}events = []\n"), "events is empty"),
        (format!("{ok}redact = [\"card\"]\n"), "redact has no effect"),
        (
            ok.replace("name = \"ops\"", "name = \"o p\""),
            "name may only use",
        ),
        (
            format!("{ok}events = [\"proposal_made\"]\n"),
            "unknown variant",
        ),
        (format!("[notify]\nretry_for = \"0s\"\n{ok}"), "at least 1s"),
    ];
    for (text, says) in cases {
        let e = parse(&text).unwrap_err().to_string();
        assert!(e.contains(says), "{says}: {e}");
    }
}

#[test]
fn issuers_are_https_named_once_with_one_tenant_source() {
    let ok = "[[auth.issuers]]\nname = \"okta\"\nissuer = \"https://idp.example.com\"\ntenant_claim = \"tid\"\n";
    let c = parse(ok).unwrap();
    assert_eq!(c.auth.issuers[0].principal_claim, "sub");
    assert_eq!(c.gateway.public_url(), "http://127.0.0.1:7373");
    let local = ok.replace("https://idp.example.com", "http://127.0.0.1:9000");
    assert!(parse(&local).is_ok(), "a loopback issuer is for tests");
    let cases = [
            (ok.replace("https://idp.example.com", "http://idp.example.com"), "must be https://"),
            (format!("{ok}jwks_uri = \"http://idp.example.com/keys\"\n"), "jwks_uri `http://idp.example.com/keys` must be https://"),
            (ok.replace("tenant_claim = \"tid\"", "tenant_claim = \"tid\"\ntenant = \"acme\""), "exactly one of tenant_claim"),
            (ok.replace("tenant_claim = \"tid\"\n", ""), "exactly one of tenant_claim"),
            (ok.replace("name = \"okta\"", "name = \"ok ta\""), "name may only use"),
            (format!("{ok}{ok}"), "used twice"),
            (format!("{ok}[[identities]]\ntoken_sha256 = \"{}\"\nprincipal = \"okta:alice\"\ntenant = \"t\"\n", "a".repeat(64)), "contains `:`"),
        ];
    for (text, says) in cases {
        let e = parse(&text).unwrap_err().to_string();
        assert!(e.contains(says), "{says}: {e}");
    }
    let public = parse("[gateway]\npublic_url = \"https://gw.example.com/\"\n").unwrap();
    assert_eq!(public.gateway.public_url(), "https://gw.example.com");
}

#[test]
fn header_read_timeout_and_catalog_and_cache_ttl_parse_and_a_zero_timeout_is_refused() {
    let c = parse(
        "[gateway]\nheader_read_timeout = \"3s\"\n[catalog]\nmax_age = \"1m\"\n\
             [servers.s]\ncommand = \"x\"\n[servers.s.tools.t]\ncache_ttl = \"30s\"\n",
    )
    .unwrap();
    assert_eq!(c.gateway.header_read_timeout, Duration::from_secs(3));
    assert_eq!(c.catalog.max_age, Duration::from_secs(60));
    assert_eq!(c.catalog.unknown_tool_interval, Duration::from_secs(1));
    assert_eq!(
        c.servers["s"].tools["t"].cache_ttl,
        Some(Duration::from_secs(30))
    );
    let e = parse("[gateway]\ntls_cert = \"/c.pem\"\n").unwrap_err();
    assert!(e.to_string().contains("go together"), "{e}");
    let t = parse("[gateway]\ntls_cert = \"/c.pem\"\ntls_key = \"/k.pem\"\n").unwrap();
    assert_eq!(t.gateway.tls_key, Some(PathBuf::from("/k.pem")));
    let e = parse("[gateway]\nheader_read_timeout = \"0s\"\n").unwrap_err();
    assert!(e.to_string().contains("header_read_timeout"), "{e}");
}

#[test]
fn defaults_are_loopback() {
    let c = parse("").unwrap();
    assert!(c.gateway.listen.ip().is_loopback());
    assert_eq!(c.limits.max_depth, 64);
}

#[test]
fn approval_settings_are_checked() {
    let err = parse("[approvals]\nprogress_interval = \"0s\"\n").unwrap_err();
    assert!(err.to_string().contains("progress_interval"), "{err}");
    let err = parse("[approvals]\nttl = \"0s\"\n").unwrap_err();
    assert!(err.to_string().contains("approvals.ttl"), "{err}");
    let err = parse("[approvals]\nhold = \"soon\"\n").unwrap_err();
    assert!(err.to_string().contains("not a duration"), "{err}");
    let err = parse(
            "[servers.p]\ncommand = \"x\"\n[servers.p.tools.t]\nversion_probe = { tool = \"r\", arguments = { id = \"account\" }, pointer = \"/v\" }\n",
        )
        .unwrap_err();
    assert!(err.to_string().contains("not a JSON pointer"), "{err}");
    let c = parse("[approvals]\nhold = \"0s\"\nremote_control = true\n").unwrap();
    assert!(c.approvals.hold.is_zero() && c.approvals.remote_control);
    assert_eq!(c.approvals.reviewers, None);
    let c = parse("[approvals]\nreviewers = \".countersign/reviewers.toml\"\n").unwrap();
    assert_eq!(
        c.approvals.reviewers.as_deref(),
        Some(std::path::Path::new(".countersign/reviewers.toml"))
    );
}

#[test]
fn unknown_key_names_its_line() {
    let err = parse("[gateway]\nlisten = \"127.0.0.1:1\"\nlsten = 3\n").unwrap_err();
    let text = err.to_string();
    assert!(text.contains("line 3"), "{text}");
    assert!(text.contains("lsten"), "{text}");
}

#[test]
fn misspelled_tool_override_is_refused() {
    let err = parse("[servers.p]\ncommand = \"x\"\n[servers.p.tools.charge]\nreadonly = true\n")
        .unwrap_err();
    assert!(err.to_string().contains("readonly"), "{err}");
}

#[test]
fn server_needs_exactly_one_transport() {
    assert!(parse("[servers.p]\n")
        .unwrap_err()
        .to_string()
        .contains("needs `command`"));
    let both = parse("[servers.p]\ncommand=\"x\"\nurl=\"http://a\"\n").unwrap_err();
    assert!(both.to_string().contains("both"));
}

#[test]
fn tls_and_credentials_parse_and_misuse_is_named() {
    let ok = parse(
            "[servers.p]\nurl=\"https://a/mcp\"\nheaders = { Authorization = { env = \"T\", prefix = \"Bearer \" } }\n[servers.p.tls]\nca_file=\"/ca.pem\"\nroots=\"system\"\n",
        )
        .unwrap();
    let p = &ok.servers["p"];
    assert_eq!(p.tls.as_ref().unwrap().roots, Some(TlsRoots::System));
    assert_eq!(
        p.headers["Authorization"],
        Credential::Env {
            var: "T".into(),
            prefix: "Bearer ".into()
        }
    );
    let e =
        parse("[servers.p]\nurl=\"http://a\"\n[servers.p.tls]\nca_file=\"/ca.pem\"\n").unwrap_err();
    assert!(e.to_string().contains("is not https://"), "{e}");
    let e = parse("[servers.p]\nurl=\"https://a\"\n[servers.p.tls]\nclient_cert=\"/c.pem\"\n")
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("both `client_cert` and `client_key`"),
        "{e}"
    );
    let e = parse("[servers.p]\nurl=\"https://a\"\n[servers.p.tls]\ninsecure=true\n").unwrap_err();
    assert!(e.to_string().contains("insecure"), "no such switch: {e}");
    let e = parse("[servers.p]\nurl=\"ftp://a\"\n").unwrap_err();
    assert!(e.to_string().contains("https:// or http://"), "{e}");
    let e =
        parse("[servers.p]\nurl=\"http://a\"\nheaders = { A = { env = \"X\", file = \"/f\" } }\n")
            .unwrap_err();
    assert!(e.to_string().contains("exactly one of `env`"), "{e}");
}

#[test]
fn bad_duration_and_hash() {
    let e = parse("[servers.p]\ncommand=\"x\"\ncall_timeout=\"soon\"\n").unwrap_err();
    assert!(e.to_string().contains("not a duration"), "{e}");
    let e =
        parse("[[identities]]\ntoken_sha256=\"abc\"\nprincipal=\"a\"\ntenant=\"t\"\n").unwrap_err();
    assert!(e.to_string().contains("64 hex digits"), "{e}");
}

#[test]
fn full_example_parses() {
    let c = parse(
            r#"
[gateway]
listen = "127.0.0.1:7373"
[[identities]]
token_sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
principal = "agent-7"
tenant = "acme"
groups = ["agents"]
[servers.payments]
command = "python3"
args = ["server.py"]
call_timeout = "30s"
[servers.payments.tools.charge_card]
read_only = false
version_probe = { tool = "get_account", arguments = { id = "/account" }, pointer = "/structuredContent/version" }
"#,
        )
        .unwrap();
    assert_eq!(c.approvals.ttl, Duration::from_secs(900));
    assert_eq!(c.approvals.hold, Duration::from_secs(60));
    let tool = &c.servers["payments"].tools["charge_card"];
    assert_eq!(tool.read_only, Some(false));
    assert_eq!(tool.version_probe.as_ref().unwrap().tool, "get_account");
}
