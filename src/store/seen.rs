//! What is kept the first time it is seen: tool definitions pinned on
//! first use, and nonces used once.

use super::StoreFuture;

/// First-use pins and single-use nonces.
pub trait Seen: Send + Sync {
    /// Record tool definitions pinned on first use (DESIGN.md section 12),
    /// each `(key, value)` unless one is recorded under its key already:
    /// the first one stays. One durable commit for all, before it returns.
    /// Returns how many it wrote.
    fn pin_first_use(&self, pins: Vec<(String, String)>) -> StoreFuture<'_, usize>;

    /// Every pin recorded on first use.
    fn first_use_pins(&self) -> StoreFuture<'_, Vec<String>>;

    /// Use `nonce` once: record it until `expires_ms` unless it is recorded
    /// already and has not expired at `now_ms`. `true` when this call
    /// recorded it, `false` when it was seen before (a replay). Committed
    /// durably before it returns: a request replayed after a restart, or
    /// at another gateway sharing the store, finds it. Nonces past their
    /// expiry may be dropped.
    fn use_nonce(&self, nonce: String, expires_ms: i64, now_ms: i64) -> StoreFuture<'_, bool>;
}
