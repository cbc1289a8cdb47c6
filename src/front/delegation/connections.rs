//! The upstream connections held for callers under delegation, one per
//! (server, principal, tenant, era): the gateway owns them (it sweeps the
//! idle ones and closes them all when it stops); [`super::Delegate`] opens
//! them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::upstream::UpstreamConn;

/// Whose connection, in which era: (server, principal, tenant, modern).
pub(crate) type Key = (String, String, String, bool);

/// One caller's connection, and when it was last used.
pub(crate) struct Held {
    pub conn: Arc<UpstreamConn>,
    pub used: Instant,
}

/// The delegated connections of every caller.
#[derive(Default)]
pub(crate) struct Delegated {
    pub(crate) slots: Mutex<HashMap<Key, Arc<tokio::sync::Mutex<Option<Held>>>>>,
}

impl Delegated {
    /// Close the connections idle longer than `limit` (none in flight).
    pub(crate) async fn sweep(&self, limit: Duration, grace: Duration) {
        let slots: Vec<_> = self.slots.lock().values().cloned().collect();
        for slot in slots {
            let mut held = slot.lock().await;
            let idle = held
                .as_ref()
                .is_some_and(|h| h.used.elapsed() > limit && h.conn.mux.in_flight() == 0);
            if idle {
                if let Some(h) = held.take() {
                    h.conn.shutdown(grace).await;
                }
            }
        }
        self.slots
            .lock()
            .retain(|_, s| s.try_lock().map_or(true, |held| held.is_some()));
    }

    /// Close every connection (the gateway stops).
    pub(crate) async fn shutdown(&self, grace: Duration) {
        let slots: Vec<_> = self.slots.lock().drain().map(|(_, s)| s).collect();
        for slot in slots {
            if let Some(h) = slot.lock().await.take() {
                h.conn.shutdown(grace).await;
            }
        }
    }
}
