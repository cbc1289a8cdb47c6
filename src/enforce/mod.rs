//! The enforcement layer: the pipeline of DESIGN.md section 3 as one type,
//! and the services it decides with. It does I/O only through traits (the
//! store, the upstream, the clock) and the optional audit log, and runs
//! without HTTP: `tests/pipeline.rs` drives it with the memory store and an
//! in-process upstream.
//!
//! - [`pipeline`]: [`pipeline::Pipeline::tool_call`] and its stages.
//! - [`outcome`]: [`outcome::CallOutcome`], how a call ended.
//! - [`permit`]: the sealed [`permit::Permit`] and the traits through which
//!   the pipeline reaches an upstream.
//! - [`flight`]: the ledger as a service: lookup, lead, reserve, ticket,
//!   and single-flight of identical calls.
//! - [`book`]: proposals and approvals (create or join, find and
//!   revalidate, decide, expire).
//! - [`client`]: approval in the client: elicitation in a session, and the
//!   signed `requestState` of 2026-07-28.
//! - [`upstream`]: how an upstream call fails.
//! - [`reconcile`]: settling unknown outcomes.
//! - [`answer`]: the one module that words outcomes for the wire.
//! - [`metrics`]: the Prometheus metrics the pipeline keeps.

pub mod answer;
pub mod book;
pub mod client;
pub mod flight;
pub mod metrics;
pub mod outcome;
pub mod permit;
pub mod pipeline;
pub mod reconcile;
pub mod upstream;
