//! Delegation (DESIGN.md section 23): the caller's access token traded at
//! its identity provider for a token meant for one upstream, by OAuth 2.0
//! Token Exchange (RFC 8693), so that the upstream sees the person, with the
//! gateway as the actor, instead of the gateway's one service credential.
//!
//! This module holds the exchange itself ([`exchange::Exchange`]) and the
//! cache of exchanged tokens ([`cache::TokenCache`]). A token is secret
//! material: it never appears in a `Debug` output, an error, a log line,
//! the audit log or a trace; what may be shown of it is
//! [`exchange::Exchanged::evidence`] (its `jti`, or a digest, and its
//! scopes).

pub mod cache;
pub mod exchange;
