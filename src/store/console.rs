//! The review console's state (DESIGN.md section 21): sessions (by their
//! id's SHA-256, never the id), their CSRF tokens, the challenges the
//! console issued, enrolment invitations, failed sign-ins, and each
//! passkey's signature counter. Kept in the store so that several gateways
//! behind one address share it: a reviewer signed in through one is signed
//! in through all, a challenge issued by one is answered at another, an
//! invitation made on one host enrols through any, and a counter never
//! moves backwards wherever the assertion lands.
//!
//! The console names its entries (`session/…`, `challenge/…`, `invite/…`,
//! `failures/…`); the store keeps each as text with the moment it stops
//! counting, and answers every operation in one atomic step (one statement
//! on PostgreSQL), so two gateways given the same challenge cannot both
//! take it and two failures counted at once are both counted.

use super::{StoreError, StoreFuture};

/// What a passkey's counter did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// It moved forwards (or the authenticator keeps none: 0 after 0), and
    /// is recorded.
    Advanced,
    /// It did not move forwards: the authenticator may have been cloned, or
    /// the assertion replayed. `last` is the highest one seen.
    Behind {
        /// The counter recorded before.
        last: u32,
    },
}

/// Whether `counter` may follow `last` (none yet: 0): it must exceed it,
/// unless both are 0 (an authenticator without a counter, as synced
/// passkeys are). W3C WebAuthn 7.2 step 21.
pub fn counter_follows(last: Option<u32>, counter: u32) -> bool {
    let last = last.unwrap_or(0);
    counter > last || (counter == 0 && last == 0)
}

/// The console's entries, shared by every gateway on the store.
pub trait ConsoleState {
    /// Keep `value` under `key` until `until_ms` (replacing what was there).
    fn console_put(&self, key: String, value: String, until_ms: i64) -> StoreFuture<'_, ()> {
        let _ = (key, value, until_ms);
        Box::pin(async { Err(unsupported()) })
    }

    /// The value under `key`, while it counts at `now_ms`.
    fn console_get(&self, key: String, now_ms: i64) -> StoreFuture<'_, Option<String>> {
        let _ = (key, now_ms);
        Box::pin(async { Err(unsupported()) })
    }

    /// Remove `key` and return its value when it still counted: once, for
    /// whichever caller comes first (a challenge answers one response).
    fn console_take(&self, key: String, now_ms: i64) -> StoreFuture<'_, Option<String>> {
        let _ = (key, now_ms);
        Box::pin(async { Err(unsupported()) })
    }

    /// Count one more under `key`, in a window of `window_ms` that starts
    /// with the first count (a count whose window ended starts again at 1).
    /// Returns the count with this one.
    fn console_count(&self, key: String, window_ms: i64, now_ms: i64) -> StoreFuture<'_, u32> {
        let _ = (key, window_ms, now_ms);
        Box::pin(async { Err(unsupported()) })
    }

    /// Record `counter` for the passkey `key` (reviewer and credential) when
    /// it follows the last one ([`counter_follows`]), in one compare-and-set:
    /// two gateways given the same assertion cannot both advance it.
    /// Durable before it returns.
    fn passkey_counter(&self, key: String, counter: u32) -> StoreFuture<'_, Counted> {
        let _ = (key, counter);
        Box::pin(async { Err(unsupported()) })
    }

    /// Forget the entries that stopped counting by `now_ms` (counters never
    /// stop). Returns how many went.
    fn console_gc(&self, now_ms: i64) -> StoreFuture<'_, usize> {
        let _ = now_ms;
        Box::pin(async { Ok(0) })
    }
}

fn unsupported() -> StoreError {
    StoreError::Backend {
        op: "console",
        reason: "this store keeps no review console state".into(),
        cause: None,
    }
}

/// The entry a count leaves under its key: the count with this one, and
/// until when it counts. `current` is what was there (value and until).
pub fn next_count(current: Option<(&str, i64)>, window_ms: i64, now_ms: i64) -> (u32, i64) {
    match current {
        Some((n, until)) if until > now_ms => {
            (n.parse::<u32>().unwrap_or(0).saturating_add(1), until)
        }
        _ => (1, now_ms.saturating_add(window_ms)),
    }
}

/// What a counter's entry says: the last counter (an unreadable entry
/// reads as the highest, so that it refuses rather than lets through).
pub fn last_counter(value: &str) -> u32 {
    value.parse().unwrap_or(u32::MAX)
}

/// A counter's key in the store: per reviewer and credential, so that a
/// copy of one reviewer's credential id under another name never moves the
/// holder's counter. The name's length comes first: no name and id can
/// make another pair's key (and the key is text PostgreSQL accepts).
pub fn counter_key(reviewer: &str, credential_id: &str) -> String {
    format!("counter/{}:{reviewer}/{credential_id}", reviewer.len())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::{counter_follows, counter_key, ConsoleState, Counted};

    #[test]
    fn a_counter_must_move_forwards_unless_the_authenticator_keeps_none() {
        assert!(counter_follows(None, 0));
        assert!(counter_follows(None, 3));
        assert!(counter_follows(Some(0), 0), "no counter: 0 after 0");
        assert!(counter_follows(Some(3), 4));
        assert!(!counter_follows(Some(3), 3), "replayed");
        assert!(!counter_follows(Some(3), 2), "cloned, behind");
        assert!(!counter_follows(Some(3), 0), "a counter cannot drop to 0");
    }

    /// Every store keeps the console's entries the same way.
    pub(crate) async fn console_conformance(store: &dyn ConsoleState) {
        // put, get, expiry.
        store
            .console_put("session/a".into(), "one".into(), 2_000)
            .await
            .unwrap();
        assert_eq!(
            store.console_get("session/a".into(), 1_000).await.unwrap(),
            Some("one".into())
        );
        assert_eq!(
            store.console_get("session/a".into(), 2_000).await.unwrap(),
            None,
            "ended at its until"
        );
        store
            .console_put("session/a".into(), "two".into(), 3_000)
            .await
            .unwrap();
        assert_eq!(
            store.console_get("session/a".into(), 1_000).await.unwrap(),
            Some("two".into()),
            "a put replaces"
        );
        assert_eq!(
            store.console_get("session/b".into(), 1_000).await.unwrap(),
            None
        );
        // take: once.
        store
            .console_put("challenge/c".into(), "sign-in".into(), 5_000)
            .await
            .unwrap();
        assert_eq!(
            store
                .console_take("challenge/c".into(), 1_000)
                .await
                .unwrap(),
            Some("sign-in".into())
        );
        assert_eq!(
            store
                .console_take("challenge/c".into(), 1_000)
                .await
                .unwrap(),
            None,
            "a challenge answers once"
        );
        store
            .console_put("challenge/late".into(), "sign-in".into(), 5_000)
            .await
            .unwrap();
        assert_eq!(
            store
                .console_take("challenge/late".into(), 5_000)
                .await
                .unwrap(),
            None,
            "an expired entry is not taken"
        );
        // counts, in their window.
        for n in 1..=3 {
            assert_eq!(
                store
                    .console_count("failures/x".into(), 1_000, 10_000 + n)
                    .await
                    .unwrap(),
                u32::try_from(n).unwrap()
            );
        }
        assert_eq!(
            store
                .console_get("failures/x".into(), 10_500)
                .await
                .unwrap(),
            Some("3".into()),
            "a count reads as its number"
        );
        assert_eq!(
            store
                .console_count("failures/x".into(), 1_000, 11_001)
                .await
                .unwrap(),
            1,
            "the window ended: counting starts again"
        );
        assert_eq!(
            store
                .console_count("failures/y".into(), 1_000, 11_001)
                .await
                .unwrap(),
            1,
            "another key is counted apart"
        );
        // counters: forwards only, per reviewer and credential.
        let alice = counter_key("alice", "cred");
        let mallory = counter_key("mallory", "cred");
        assert_eq!(
            store.passkey_counter(alice.clone(), 5).await.unwrap(),
            Counted::Advanced
        );
        assert_eq!(
            store.passkey_counter(alice.clone(), 5).await.unwrap(),
            Counted::Behind { last: 5 },
            "replayed"
        );
        assert_eq!(
            store.passkey_counter(alice.clone(), 2).await.unwrap(),
            Counted::Behind { last: 5 }
        );
        assert_eq!(
            store.passkey_counter(alice.clone(), 6).await.unwrap(),
            Counted::Advanced
        );
        assert_eq!(
            store.passkey_counter(mallory.clone(), 1).await.unwrap(),
            Counted::Advanced,
            "another reviewer's copy of the id is counted apart"
        );
        let zero = counter_key("bob", "synced");
        assert_eq!(
            store.passkey_counter(zero.clone(), 0).await.unwrap(),
            Counted::Advanced
        );
        assert_eq!(
            store.passkey_counter(zero.clone(), 0).await.unwrap(),
            Counted::Advanced,
            "an authenticator without a counter"
        );
        // gc: what ended goes; counters stay.
        let gone = store.console_gc(1_000_000).await.unwrap();
        assert!(gone >= 2, "the ended entries went: {gone}");
        assert_eq!(
            store.passkey_counter(alice, 6).await.unwrap(),
            Counted::Behind { last: 6 },
            "a counter outlives every sweep"
        );
    }
}
