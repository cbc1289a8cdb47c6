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
//! | cli | [`cli`] (`serve`, `check`, `policy`, `reconcile`, `review`, `client`, `files`, `transparency`) | yes |
//! | front ends | [`front`] (`http`, `mcp`, `control`, `bridge`) | yes |
//! | upstream | [`upstream`] (`session`, `route`, `mux`, `stdio`, `streamable_http`, `witness`) | yes |
//! | enforce | [`enforce`] (`pipeline`, `flight`, `book`, `client`, `permit`, `outcome`, `reconcile`, `upstream`, `answer`) | through traits |
//! | store, audit | [`store`] (`redb_store`, `memory`), [`audit`] (`log`, `segment`, `trail`, `verify`, `export`, `merkle`, `tree`, `note`, `proofs`) | yes |
//! | core | [`core`] (`canonical`, `ledger`, `decision`, `arguments`, `approval`, `confirm`, `recovery`, `annotations`, `catalog`, `identity`, `config`, `time`) | no |
//! | wire | [`wire`] (`jsonrpc`, `era`, `sse`, `lines`) | no |
//!
//! - [`wire`]: JSON-RPC envelopes that keep payloads as raw bytes, the two
//!   MCP wire eras and their headers, SSE and line framing.
//! - [`core`]: the rules: canonical form and digest, ledger states,
//!   Cedar decisions, approval statements, failure classes, annotations, tool catalogs and pins,
//!   identities, configuration, time.
//! - [`store`]: durable ledger, proposal and outbox storage behind one trait.
//! - [`audit`]: the hash-chained audit log and its RFC 6962 Merkle tree,
//!   C2SP signed checkpoints and proofs, a call's trail, verification and
//!   exports.
//! - [`enforce`]: the `tools/call` pipeline as one type, the ledger
//!   service, the approval book, the sealed permit, and the one module that
//!   words outcomes for the wire.
//! - [`upstream`]: upstream connections (stdio children, Streamable HTTP),
//!   id multiplexing, client sessions and healing.
//! - [`front`]: the HTTP front (`/mcp`), the control API (`/v1`), the stdio
//!   bridge.
//! - [`cli`]: the `countersign` command.

#![warn(unreachable_pub)]

pub mod audit;
pub mod cli;
pub mod core;
pub mod enforce;
pub(crate) mod front;
pub mod store;
pub mod upstream;
pub mod wire;
