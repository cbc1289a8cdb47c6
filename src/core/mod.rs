//! The core layer: the rules, with no I/O: files are read by the `cli`
//! layer (`cli::files`) and handed in as text, and the enforcement layer
//! reads the time of day through [`time::Clock`] (the system clock in the
//! gateway, a hand-moved one in tests). Tested without a runtime.
//!
//! - [`canonical`]: strict parse of `tools/call` params, RFC 8785 JCS and
//!   the call digest.
//! - [`ledger`]: idempotency keys, ledger states and what a retry gets.
//! - [`decision`]: Cedar policies, argument mapping and the two-phase
//!   decision.
//! - [`arguments`]: tool arguments as Cedar values, typed by the policy
//!   schema where it declares them.
//! - [`approval`]: proposals, the signed approval statement, consumption,
//!   argument diffs.
//! - [`reviewers`]: reviewer keys, key files and `reviewers.toml`.
//! - [`passkey`]: passkeys (WebAuthn) as reviewer keys: the relying party's
//!   checks of an assertion and a registration, pure.
//! - [`signed_request`]: the signatures of control API requests.
//! - [`confirm`]: approval in the client: the question, the answer, and
//!   the signed `requestState` of the 2026-07-28 era.
//! - [`recovery`]: failure classes, response classes, retry backoff and the
//!   circuit breaker.
//! - [`annotations`]: effective tool annotations (server hints, MCP
//!   defaults, operator overrides).
//! - [`catalog`]: each server's tool definitions, their digests, pins
//!   (`tools.lock` and first use), changes and field-level diffs.
//! - [`identity`]: bearer tokens (stored as SHA-256) → principal, tenant,
//!   groups.
//! - [`config`]: `countersign.toml`, strict parsing with line-numbered
//!   errors.
//! - [`token`]: OAuth access tokens (JWT, RFC 9068): what is checked, and
//!   the identity they stand for.
//! - [`task`]: a held call as an MCP task: its record, lifecycle, owner
//!   and wire shapes in both eras.
//! - [`time`]: unix milliseconds, RFC 3339, and the pipeline's clock.
//! - [`redact`]: the values `audit.redact` names, taken out of every
//!   record that leaves the store (log, diffs, webhooks, traces, exports).
//! - [`legible`]: agent text as people may see it (terminal, chat, logs,
//!   the console): escapes, unusual keys, lookalike tool names.

pub mod annotations;
pub mod approval;
pub mod arguments;
pub mod canonical;
pub mod catalog;
pub mod config;
pub mod confirm;
pub mod decision;
pub mod guard;
pub mod headline;
pub mod identity;

/// A map for keys no client chooses (configured server names, tool names
/// an upstream listed, token digests of configured identities), hashed
/// with foldhash instead of SipHash: a lookup on every call costs a fraction.
/// Maps whose keys a client can choose (the ledger's single-flight keys,
/// sessions, caches by principal) keep std's DoS-resistant SipHash.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
pub mod ledger;
pub mod legible;
pub mod notify;
pub mod passkey;
pub(crate) mod recovery;
pub mod redact;
pub mod refusal;
pub mod review;
pub mod reviewers;
pub mod sha256;
pub mod signed_request;
pub mod task;
pub mod time;
pub mod token;
