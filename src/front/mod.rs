//! The front ends: where clients and reviewers reach the gateway.
//!
//! - [`http`]: the axum routes `/mcp/{server}` (Streamable HTTP, both wire
//!   eras) and `/healthz`: HTTP framing, origin and token checks, era
//!   detection. HTTP only.
//! - [`mcp`]: one request in, one answer out, for any transport: a
//!   `tools/call` goes to the enforcement pipeline, anything else is relayed.
//! - [`control`]: the reviewer control API `/v1`.
//! - [`bridge`]: `countersign stdio`, the bridge for stdio-only clients.
//! - [`tls`]: TLS on the listener, with the certificate reloaded from disk.

pub mod bridge;
pub mod control;
pub mod http;
pub mod mcp;
pub mod tls;
