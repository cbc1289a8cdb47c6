//! The relay: client sessions, upstream connections and the HTTP front.
//!
//! - [`front`]: the axum routes (`/mcp/{server}`, `/healthz`), auth, origin
//!   checks, era detection and HTTP framing.
//! - [`session`]: handshake-era client sessions, each owning one upstream
//!   connection, and the shared upstream of each server for 2026-07-28.
//! - [`mux`]: request-id mapping and routing of server messages.
//! - [`upstream`]: stdio and Streamable HTTP transports.
//! - [`sse`]: Server-Sent Events framing.

pub mod front;
pub mod mux;
pub mod session;
pub mod sse;
pub mod trail;
pub mod upstream;

/// Protocol versions of the handshake era (`initialize`, `Mcp-Session-Id`).
pub const HANDSHAKE_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26"];
/// Protocol versions of the stateless era (per-request `_meta`).
pub const MODERN_VERSIONS: &[&str] = &["2026-07-28"];
/// `_meta` key carrying a 2026-07-28 request's protocol version.
pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
