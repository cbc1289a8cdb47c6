//! countersign: an approval-binding policy enforcement point for MCP tool calls.
//!
//! # Layout
//!
//! - [`config`]: `countersign.toml`, strict parsing with line-numbered errors.
//! - [`identity`]: bearer tokens (stored as SHA-256) → principal, tenant, groups.
//! - [`jsonrpc`]: JSON-RPC envelopes that keep payloads as raw bytes.
//! - [`canonical`]: strict parse of `tools/call` params, RFC 8785 JCS and the
//!   call digest (pure, no I/O).
//! - [`decision`]: Cedar policies, argument mapping and the two-phase
//!   decision (pure apart from loading the policy folder).
//! - [`ledger`]: idempotency keys, ledger states and what a retry gets (pure).
//! - [`approval`]: proposals, the signed approval statement, reviewer keys
//!   and `reviewers.toml`, request signatures, consumption (pure).
//! - [`control`]: the reviewer control API `/v1`, the approval book (the
//!   service behind holds and decisions) and its signed client.
//! - [`review_cli`]: `countersign keygen|pending|show|approve|deny`.
//! - [`idempotency`]: the ledger as a service — store plus in-process
//!   single-flight, tickets and the dispatch permit.
//! - [`store`]: durable ledger storage (redb by default) behind one trait.
//! - [`annotations`]: effective tool annotations (server hints, MCP defaults,
//!   operator overrides) captured from `tools/list`.
//! - [`relay`]: the gateway's data path — HTTP front, sessions, id
//!   multiplexing, stdio and Streamable HTTP upstreams.
//! - [`reply`]: the one place gateway failures become wire answers.
//! - [`bridge`]: `countersign stdio`, the bridge for stdio-only clients.
//! - [`check`]: `countersign check`, upstream health.
//! - [`policy_cli`]: `countersign policy check|test`.
//! - [`reconcile`]: `countersign reconcile`, settling unknown outcomes.
//! - [`recovery`]: outcome classification, retry backoff, circuit breaker (pure).
//! - [`serve`]: `countersign serve`, the gateway process and its shutdown.
//! - [`lines`]: capped newline-delimited reading for stdio pipes.
//!
//! Dependencies run one way: `jsonrpc`, `config`, `annotations` know nothing
//! of the relay; the relay never sees the CLI.

pub mod annotations;
pub mod approval;
pub mod audit;
pub mod bridge;
pub mod canonical;
pub mod check;
pub mod config;
pub mod control;
pub mod decision;
pub mod idempotency;
pub mod identity;
pub mod jsonrpc;
pub mod ledger;
pub mod lines;
pub mod policy_cli;
pub mod reconcile;
pub mod recovery;
pub mod relay;
pub mod reply;
pub mod review_cli;
pub mod serve;
pub mod store;
