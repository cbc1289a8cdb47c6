//! The enforcement layer: the pipeline of DESIGN.md section 3 as one type,
//! and the services it decides with. It does I/O only through traits (the
//! store, the upstream, the clock) and the optional audit log, and runs
//! without HTTP: `tests/pipeline.rs` drives it with the memory store and an
//! in-process upstream.
//!
//! - [`pipeline`]: [`pipeline::Pipeline::tool_call`]: the order of the
//!   stages.
//! - [`call`]: one call on its way through the stages, and the outcomes
//!   any stage may end it with.
//! - [`learn`]: catalog learning and first-use pins.
//! - [`reads`]: the read path and its cache.
//! - [`judge`]: the policy decision with the policies in force.
//! - [`writes`]: the write path through the ledger, attempt by attempt.
//! - [`gate`]: the approval gate, approval in the client, the version
//!   probe.
//! - [`breakers`]: one circuit breaker per server.
//! - [`outcome`]: [`outcome::CallOutcome`], how a call ended.
//! - [`permit`]: the sealed [`permit::Permit`] and the traits through which
//!   the pipeline reaches an upstream.
//! - [`flight`]: the ledger as a service: lookup, lead, reserve, ticket,
//!   and single-flight of identical calls.
//! - [`book`]: proposals and approvals (create or join, find and
//!   revalidate, decide, expire).
//! - [`client`]: approval in the client: elicitation in a session, and the
//!   signed `requestState` of 2026-07-28.
//! - [`announce`]: incidents told to the webhooks (a lost answer, a
//!   changed tool, an open circuit).
//! - [`upstream`]: how an upstream call fails.
//! - [`reconcile`]: settling unknown outcomes.
//! - [`answer`]: the one module that words outcomes for the wire.
//! - [`metrics`]: the Prometheus metrics the pipeline keeps.

pub(crate) mod announce;
pub mod answer;
pub(crate) mod book;
pub(crate) mod breakers;
pub(crate) mod call;
pub mod client;
pub mod flight;
pub(crate) mod gate;
pub mod guards;
pub mod inputs;
pub(crate) mod judge;
pub(crate) mod learn;
pub(crate) mod metrics;
pub mod outcome;
pub mod permit;
pub mod pipeline;
pub(crate) mod reads;
pub mod reconcile;
pub(crate) mod retry;
pub(crate) mod shadow;
pub mod upstream;
pub(crate) mod writes;

/// What a reviewer's decision is judged under, and what signed it (for callers of
/// [`pipeline::Pipeline::book`]'s `decide`).
pub use book::{Proof, Under};
