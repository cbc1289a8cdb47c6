//! countersign: an approval-binding policy enforcement point for MCP tool calls.
//!
//! # Layout
//!
//! Layers, top to bottom; a module imports only from its own layer or the
//! layers below it (`docs/architecture.md` draws the path of one
//! `tools/call` through them).
//!
//! | layer | modules | I/O |
//! |---|---|---|
//! | cli | [`cli`] (`args`, `serve` (parsing and printing around `running`: the gateway's life, `Gateway::start -> Running`, its background tasks in one set under one cancellation, `Running::shutdown` in order; `listen`: the listener and its serving threads; `watch`: the policy folders and a shared store's changes), `check`, `policy`, `reconcile`, `review`, `enrolled`, `console`, `tools`, `store`, `transparency`, `demo`, `client`, `files`, `log`, `out`: what a command prints, ended quietly on a closed pipe, `cases`: the `policy test` file format, `policy_diff`: what a policy change would move, `fuzzing`: the routes in process for the fuzz targets) | yes |
//! | front ends | `front` (`gateway` with `upstreams` (how a connection is opened, the shared 2026-07-28 connection of each server, the sessions held to bridge eras), `route`, `http`, `bounds`, `request`, `mcp`, `tasks`, `task_runner`, `task_state`, `upstream_tasks`, `stream`, `respond`, `ops`, `control`, `bridge`, `tls`; `auth`: who is asking; `issuers`: the identity providers' keys; `refusals`: what the door turns away; `delegation`: calls on a caller's behalf in one room (the rule, the `connections` held for callers, the exchange at dispatch, a 401); `review`, the console: `console`, `session`, `sign_in`, `enrol`, `invite`, `decide`, `pages`, `throttle`, `reply`, `assets`) | yes |
//! | upstream | [`upstream`] (`mux`, `stdio`, `streamable_http`, `credentials`, `tls`, `witness`, `notify`; `provider`: identity providers as the gateway calls them; `delegation`: `exchange` (RFC 8693), `assertion` (`private_key_jwt`), `cache` (exchanged tokens, in memory)) | yes |
//! | enforce | [`enforce`] (`pipeline`, `call` (a call's first stages and its endings, as methods of `Call`), `retry` (the retry loop of a dispatch), `learn`, `judge`, `reads`, `writes`, `gate`, `guards`, `breakers`, `flight`, `book` (the approval rules' I/O: `told`, what it tells the audit log, the webhooks and live clients; `passkey`), `client`, `permit`, `outcome`, `reconcile`, `upstream`, `answer`, `metrics`; `announce`: incidents told to the webhooks; `inputs`: decision inputs; `shadow`: shadow policies) | through traits |
//! | store, audit | [`store`] (one trait per capability: `ledger`, `proposals`, `outbox`, `seen`, `inputs`, `tasks`, `guards`, `console`; `redb_store` with its `journal`, its `writer` thread, `pending` (what redb does not hold yet, and how it is folded in), `apply` (a batch as one transaction) and a room per capability (`ledger`, `proposals` with the indexes by requester and of open ones, `outbox`, `seen`, `inputs`, `tasks`), `postgres` with its `group` commit and its `schema`, `lease`, `notices`, `proposals` and `inputs` rooms, `memory`, `private`, `durable`; the conformance suite in `tests`, run on each store by `on_redb` and `on_postgres`; `redb_store::power` in tests: disks that lose what was not fsynced), [`audit`] (`log`, `writer`, `fields` (an entry's members, kept in canonical order as they are built), `recover`, `outbox`, `segment`, `trail`, `verify`, `export`, `merkle`, `tree`, `note`, `proofs`; `power` in tests: the log cut as a power loss leaves it) | yes |
//! | core | [`telemetry`] (the spans of a call and their W3C context; no export), [`core`] (`canonical` (`strict`: the strict parse; `jcs`: RFC 8785 output), `ledger`, `guard`, `decision` (`entities`: a call as Cedar sees it; `slice`: the policies that can apply to a tool; `cache`: entity sets kept per identity and tool; `load`: located errors, quorum annotations, the sources' digest), `arguments`, `approval` (`words`: its sentence, flags and queue order; `related`: revision or another call), `review` (the approval rules as pure functions: what a held call finds, what a decision, a withdrawal or an answer in the client makes of a proposal), `refusal` (why a call got no answer: the outcomes followers share), `headline`, `reviewers`, `signed_request`, `sha256` (ring's SHA-256 for the hot paths), `confirm`, `task`, `recovery`, `redact`, `annotations`, `catalog`, `identity`, `notify`, `token`, `legible` (agent text made legible for people), `passkey` (WebAuthn reviewer keys), `config` (by section: `gateway` and the rest in `mod`, `audit`, `auth`, `notify`, `telemetry`, `limits`, `guards`, `delegation`, `review`, `tasks`, `tools`), `time`) | no |
//! | wire | [`wire`] (`jsonrpc`, `era`, `sse`, `lines`, `trace`, `members`: an object edited member by member, `toolcall`: what counts as a `tools/call`) | no |
//!
//! - [`wire`]: JSON-RPC envelopes that keep payloads as raw bytes, the two
//!   MCP wire eras and their headers, SSE and line framing.
//! - [`core`]: the rules: canonical form and digest, ledger states,
//!   Cedar decisions, approval statements, reviewer keys, control API
//!   request signatures, failure classes, annotations, tool catalogs and
//!   pins, identities, configuration, time.
//! - [`store`]: durable ledger, proposal and outbox storage behind one
//!   trait: redb for one gateway, PostgreSQL for several, memory for tests.
//! - [`audit`]: the hash-chained audit log (its writer task, the tail it
//!   opens on, the ledger's outbox) and its RFC 6962 Merkle tree, C2SP
//!   signed checkpoints and proofs, a call's trail, verification and
//!   exports.
//! - [`enforce`]: the `tools/call` pipeline as the order of its stages, and
//!   the services it runs a call through (catalog learning, the policy
//!   decision, the read path, the write path, the approval gate, the
//!   breakers, the ledger, the approval book); the sealed permit; the one
//!   module that words outcomes for the wire; the metrics.
//! - [`upstream`]: upstream connections (stdio children, Streamable HTTP,
//!   their TLS and credentials), id multiplexing, the witness client, and the
//!   delivery of webhook notifications.
//! - `front`: the running gateway and its client sessions, the HTTP front
//!   (`/mcp`, `/healthz`, `/metrics`, `/audit/*`), the control API (`/v1`),
//!   the stdio bridge.
//! - [`telemetry`]: OpenTelemetry spans that follow the MCP semantic
//!   conventions, off unless `serve` turns them on (`cli::telemetry` exports
//!   them).
//! - [`cli`]: the `countersign` command.
//!
//! Only what tests, benches, fuzz targets and the TUI use is public: the
//! front ends, the commands and the services inside the pipeline are
//! crate-private (`unreachable_pub` holds the rest to it).

#![warn(unreachable_pub)]

pub mod audit;
pub mod cli;
pub mod core;
pub mod enforce;
pub(crate) mod front;
pub mod store;
pub mod telemetry;
pub mod upstream;
pub mod wire;

/// The map stays true: every module in `src/` is named in the layout above
/// and in docs/architecture.md.
#[cfg(test)]
mod map {
    /// Every file or folder that makes a module under `src/`.
    fn modules(dir: &std::path::Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let stem = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default()
                .to_owned();
            if path.is_dir() && stem == "tests" {
                // A module's unit tests (`x/tests.rs`): the file is not on the
                // map, the rooms it splits into are.
                modules(&path, out);
                continue;
            }
            if path.is_dir() {
                out.push(stem);
                modules(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs")
                && !["lib", "main", "mod", "tests"].contains(&stem.as_str())
            {
                out.push(stem);
            }
        }
    }

    #[test]
    fn every_module_is_named_in_the_layout() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let map = std::fs::read_to_string(root.join("lib.rs")).unwrap();
        let mut all = Vec::new();
        modules(&root, &mut all);
        assert!(all.len() > 100, "{all:?}");
        let missing: Vec<&String> = all
            .iter()
            .filter(|m| !map.contains(&format!("`{m}`")))
            .collect();
        assert!(
            missing.is_empty(),
            "modules the layout in src/lib.rs does not name: {missing:?}"
        );
        // docs/architecture.md names each too (as `name`, or in a path).
        let doc = std::fs::read_to_string(root.join("../docs/architecture.md")).unwrap();
        let missing: Vec<&String> = all
            .iter()
            .filter(|m| {
                ![
                    format!("`{m}`"),
                    format!("{m}.rs"),
                    format!("/{m}`"),
                    format!("/{m}/"),
                    format!("`{m}/"),
                ]
                .iter()
                .any(|form| doc.contains(form.as_str()))
            })
            .collect();
        assert!(
            missing.is_empty(),
            "modules docs/architecture.md does not name: {missing:?}"
        );
    }

    /// Every source file under `dir`, with its text.
    fn sources(dir: &std::path::Path, out: &mut Vec<(std::path::PathBuf, String)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                out.push((path, text));
            }
        }
    }

    /// Every unit test that makes a schema on PostgreSQL has `postgres` in
    /// its path (its name, or a module `on_postgres`): on a machine with
    /// only Rust they say they are skipped, and `--skip postgres` leaves
    /// them out by name (docs/install.md, the quick loop).
    #[test]
    fn every_unit_test_on_postgresql_says_so_in_its_path() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut all = Vec::new();
        sources(&root, &mut all);
        let mut checked = 0;
        for (path, text) in &all {
            let in_module = path.to_string_lossy().contains("postgres");
            let mut test_name = String::new();
            for line in text.lines() {
                let t = line.trim_start();
                if let Some(rest) = t
                    .strip_prefix("async fn ")
                    .or_else(|| t.strip_prefix("fn "))
                {
                    test_name = rest.split('(').next().unwrap_or_default().to_owned();
                }
                if t.contains("PgSchema::new()") && !t.starts_with("pub(crate) async fn") {
                    checked += 1;
                    assert!(
                        in_module || test_name.contains("postgres"),
                        "{}: `{test_name}` uses PostgreSQL but `postgres` is not in its path",
                        path.display()
                    );
                }
            }
        }
        assert!(checked >= 5, "found {checked} uses of PgSchema::new()");
    }
}
