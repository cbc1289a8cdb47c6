//! The front ends: where clients and reviewers reach the gateway.
//!
//! - [`http`]: the axum routes `/mcp/{server}` (Streamable HTTP, both wire
//!   eras) and `/healthz`: HTTP framing, origin and token checks, era
//!   detection; and the door every request comes in by (a tool call's
//!   `POST` straight to its handler, the rest through the router). HTTP
//!   only.
//! - [`ops`]: `/healthz`, `/metrics` and the transparency endpoints
//!   `/audit/*`.
//! - [`stream`]: answers that become SSE streams, and resumable streams.
//! - [`respond`]: JSON and SSE responses, and the status of a rejection.
//! - [`request`]: one request's context (who, which server, which era,
//!   which upstream connection).
//! - [`mcp`]: one request in, one answer out, for any transport: a
//!   `tools/call` goes to the enforcement pipeline, anything else is relayed.
//! - [`control`]: the reviewer control API `/v1`.
//! - [`bridge`]: `countersign stdio`, the bridge for stdio-only clients.
//! - [`gateway`]: the running gateway ([`gateway::Gateway`]): configuration,
//!   identities, the rate limiter, the pipeline, client sessions (bound to
//!   their identity, with SSE replay and open questions) and the shared
//!   2026-07-28 upstream of each server.
//! - [`route`]: where a client's request goes upstream: its session's
//!   connection or the server's shared one; what the pipeline sees as its
//!   upstream.
//! - [`auth`]: who is asking: static tokens and identity providers' JWT
//!   access tokens, the RFC 9728 metadata and the 401/403 challenges.
//! - [`issuers`]: the identity providers' keys over time (JWKS, discovery,
//!   refetch on an unknown `kid`).
//! - [`tls`]: TLS on the listener, with the certificate reloaded from disk.
//! - [`refusals`]: what the fronts turn away, counted and (when it
//!   repeats) audited at a bounded rate.
//! - [`tasks`]: held calls as MCP tasks (both eras, SEP-2848 tool
//!   approval): the `tasks/*` methods; [`task_runner`] runs an approved
//!   call on any live gateway; [`task_state`] is what this gateway knows of
//!   them beyond the store; [`upstream_tasks`] relays a server's own task
//!   as a task of the gateway.
//! - [`review`]: the reviewer web console (`/review/`): passkey enrolment,
//!   sign-in and decisions.

pub(crate) mod auth;
pub(crate) mod bounds;
pub(crate) mod bridge;
pub(crate) mod control;
pub(crate) mod delegation;
pub(crate) mod gateway;
pub(crate) mod http;
pub(crate) mod issuers;
pub(crate) mod mcp;
pub(crate) mod ops;
pub(crate) mod refusals;
pub(crate) mod request;
pub(crate) mod respond;
pub(crate) mod review;
pub(crate) mod route;
pub(crate) mod stream;
pub(crate) mod task_runner;
pub(crate) mod task_state;
pub(crate) mod tasks;
pub(crate) mod tls;
pub(crate) mod upstream_tasks;
