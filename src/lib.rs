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
//! | cli | [`cli`] (`args`, `serve`, `check`, `policy`, `reconcile`, `review`, `enrolled`, `console`, `tools`, `store`, `transparency`, `demo`, `client`, `files`, `log`, `fuzzing`: the routes in process for the fuzz targets) | yes |
//! | front ends | `front` (`gateway`, `route`, `http`, `bounds`, `request`, `mcp`, `tasks`, `task_runner`, `task_state`, `upstream_tasks`, `stream`, `respond`, `ops`, `control`, `bridge`, `tls`) | yes |
//! | upstream | [`upstream`] (`mux`, `stdio`, `streamable_http`, `credentials`, `tls`, `witness`, `notify`) | yes |
//! | enforce | [`enforce`] (`pipeline`, `call`, `learn`, `judge`, `reads`, `writes`, `gate`, `guards`, `breakers`, `flight`, `book`, `client`, `permit`, `outcome`, `reconcile`, `upstream`, `answer`, `metrics`) | through traits |
//! | store, audit | [`store`] (`redb_store`, `postgres`, `memory`, `tasks`, `guards`, `console`, `private`, `durable`; `redb_store::power` in tests: disks that lose what was not fsynced), [`audit`] (`log`, `writer`, `recover`, `outbox`, `segment`, `trail`, `verify`, `export`, `merkle`, `tree`, `note`, `proofs`; `power` in tests: the log cut as a power loss leaves it) | yes |
//! | core | [`telemetry`] (the spans of a call and their W3C context; no export), [`core`] (`canonical`, `ledger`, `guard`, `decision`, `arguments`, `approval` (`words`: its sentence, flags and queue order; `related`: revision or another call), `headline`, `reviewers`, `signed_request`, `confirm`, `task`, `recovery`, `redact`, `annotations`, `catalog`, `identity`, `notify`, `token`, `config` (`limits`, `guards`, `delegation`, `review`, `tasks`, `tools`), `time`) | no |
//! | wire | [`wire`] (`jsonrpc`, `era`, `sse`, `lines`, `trace`) | no |
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
