//! Incidents told to the webhooks (DESIGN.md section 19): events of no
//! proposal, queued durably on their own as they happen: a write whose
//! answer was lost (`outcome_unknown`), a tool whose definition changed
//! (`tools_changed`), a circuit that opened (`circuit_open`). Proposal
//! events are queued by the book, in the commit of the change itself.
//!
//! Queuing happens on a task of its own: a call never waits for it.

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::core::config::{EventKind, WebhookConfig};
use crate::core::notify::{Event, Notice};
use crate::core::time::Clock;
use crate::store::Store;

/// Queues incident events for the webhooks that want them.
pub(crate) struct Announcer {
    store: Arc<dyn Store>,
    webhooks: Vec<WebhookConfig>,
    clock: Arc<dyn Clock>,
    /// Wakes the delivery worker.
    wake: Arc<tokio::sync::Notify>,
}

impl Announcer {
    /// An announcer for `webhooks` over `store`, waking `wake`.
    pub(crate) fn new(
        store: Arc<dyn Store>,
        webhooks: Vec<WebhookConfig>,
        clock: Arc<dyn Clock>,
        wake: Arc<tokio::sync::Notify>,
    ) -> Announcer {
        Announcer {
            store,
            webhooks,
            clock,
            wake,
        }
    }

    /// The notices of an event of `kind` (of `tenant`, if any) with
    /// `facts`, for the caller to queue in the commit of what it announces
    /// (then [`Announcer::queued`]).
    pub(crate) fn notices(
        &self,
        kind: EventKind,
        tenant: Option<&str>,
        facts: Map<String, Value>,
    ) -> Vec<Notice> {
        if self.webhooks.is_empty() {
            return Vec::new();
        }
        Event::incident(kind, tenant, facts).notices(&self.webhooks, self.clock.now_ms())
    }

    /// Notices were queued: wake the delivery worker.
    pub(crate) fn queued(&self) {
        self.wake.notify_one();
    }

    /// Queue an event of `kind` (of `tenant`, if any) with `facts` on its
    /// own (an event of no store change): durable once queued, delivered at
    /// least once from then on.
    pub(crate) fn incident(
        &self,
        kind: EventKind,
        tenant: Option<&str>,
        facts: Map<String, Value>,
    ) {
        let notices = self.notices(kind, tenant, facts);
        if notices.is_empty() {
            return;
        }
        let (store, wake) = (self.store.clone(), self.wake.clone());
        tokio::spawn(async move {
            match store.notices_enqueue(notices).await {
                Ok(()) => wake.notify_one(),
                Err(e) => tracing::error!(kind = kind.as_str(), "notification not queued: {e}"),
            }
        });
    }
}
