//! The wire layer: JSON-RPC envelopes, MCP eras and headers, SSE and line
//! framing. Pure: nothing here does I/O, and nothing here knows of the
//! gateway's decisions.

pub mod era;
pub mod jsonrpc;
pub mod lines;
pub mod members;
pub mod sse;
pub mod toolcall;
pub mod trace;
