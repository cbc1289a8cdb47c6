//! Delivering reviewer notifications (DESIGN.md section 19): a worker takes
//! the notices the store queued with what they announce, POSTs each to its
//! webhook signed with HMAC-SHA256, and records how the attempt ended:
//! delivered, tried again later (the backoff doubles to `notify.max_backoff`,
//! with jitter), or given up once `notify.retry_for` has passed.
//!
//! At least once, never silently dropped: a notice leaves the queue only
//! when its receiver answered 2xx, and a crash between the answer and the
//! record means it is sent again, with the same event id
//! (`X-Countersign-Event`), which the receiver uses to drop duplicates. On
//! PostgreSQL each notice is leased to one gateway while it is sent; a
//! gateway that dies mid-delivery lets its lease lapse, and another takes
//! the notice over.
//!
//! The worker runs on its own tasks: a receiver that hangs delays only its
//! own notices (each request has a time limit), never a call.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::audit::AuditSink;
use crate::core::config::{NotifyConfig, WebhookConfig};
use crate::core::notify::{self, Notice};
use crate::core::time::Clock;
use crate::store::{Settle, Store};

/// How many notices one round takes.
const BATCH: usize = 32;
/// How often the queue is looked at when nothing wakes the worker (other
/// gateways' notices, retries coming due).
const POLL: Duration = Duration::from_millis(500);

/// The delivery worker's parts.
pub(crate) struct Deliverer {
    store: Arc<dyn Store>,
    config: NotifyConfig,
    hooks: HashMap<String, (WebhookConfig, Result<reqwest::Client, String>)>,
    /// This process, as a lease owner.
    owner: String,
    audit: Option<Arc<dyn AuditSink>>,
    clock: Arc<dyn Clock>,
}

/// The HTTP client for one webhook: its TLS settings, a time limit, no
/// redirects (a redirect could carry a signed event elsewhere). Kept as its
/// words: `serve` built it once at start and stopped with the whole chain
/// (`tls::check_all`); here it is what a failed delivery's record says.
fn client(w: &WebhookConfig, timeout: Duration) -> Result<reqwest::Client, String> {
    let tls =
        crate::upstream::tls::webhook_config(&w.name, w.tls.as_ref()).map_err(|e| e.to_string())?;
    crate::upstream::tls::http_client(tls, timeout, &format!("webhook `{}`", w.name))
        .map_err(|e| e.to_string())
}

impl Deliverer {
    /// A worker for `config`'s webhooks over `store`.
    pub(crate) fn new(
        store: Arc<dyn Store>,
        config: &NotifyConfig,
        audit: Option<Arc<dyn AuditSink>>,
        clock: Arc<dyn Clock>,
    ) -> Deliverer {
        let hooks = config
            .webhooks
            .iter()
            .map(|w| (w.name.clone(), (w.clone(), client(w, config.timeout))))
            .collect();
        Deliverer {
            store,
            config: config.clone(),
            hooks,
            owner: format!("gw-{:016x}", rand::random::<u64>()),
            audit,
            clock,
        }
    }

    /// Deliver until the task is aborted: a round whenever `wake` is
    /// signalled (a proposal queued notices here) or every [`POLL`].
    pub(crate) async fn run(self, wake: Arc<tokio::sync::Notify>) {
        let this = Arc::new(self);
        let mut complained = false;
        loop {
            let now = this.clock.now_ms();
            // Leased for three request times: a live sender settles well
            // before it lapses; a dead one's notices are taken over then.
            let lease = i64::try_from(this.config.timeout.as_millis().saturating_mul(3))
                .unwrap_or(i64::MAX);
            match this
                .store
                .notices_claim(&this.owner, now, lease, BATCH)
                .await
            {
                Ok(batch) => {
                    complained = false;
                    let full = batch.len() == BATCH;
                    // Each notice on its own: one slow receiver does not
                    // hold the others back.
                    let sends: Vec<_> = batch
                        .into_iter()
                        .map(|n| {
                            let this = Arc::clone(&this);
                            tokio::spawn(async move { this.deliver(n).await })
                        })
                        .collect();
                    for s in sends {
                        let _ = s.await;
                    }
                    if full {
                        continue;
                    }
                }
                Err(e) => {
                    // Said once per outage, not every round.
                    if !complained {
                        tracing::warn!("notification queue unavailable, retrying: {e}");
                        complained = true;
                    }
                }
            }
            tokio::select! {
                () = wake.notified() => {}
                () = tokio::time::sleep(POLL) => {}
            }
        }
    }

    /// One attempt at `n`, and its record.
    async fn deliver(&self, n: Notice) {
        let attempt = n.attempts.saturating_add(1);
        let result = match self.hooks.get(&n.webhook) {
            None => Err(format!("webhook `{}` is no longer configured", n.webhook)),
            Some((w, http)) => match http {
                Err(e) => Err(e.clone()),
                Ok(http) => self.send(w, http, &n).await,
            },
        };
        let now = self.clock.now_ms();
        let kind = n.event["kind"].as_str().unwrap_or("").to_owned();
        let (settle, entry) = match result {
            Ok(status) => {
                tracing::info!(event = %n.id, webhook = %n.webhook, %kind, status, attempt, "notification delivered");
                (
                    Settle::Delivered(now),
                    ("notification_delivered", json!(status)),
                )
            }
            Err(error) => {
                let window = i64::try_from(self.config.retry_for.as_millis()).unwrap_or(i64::MAX);
                let gone = !self.hooks.contains_key(&n.webhook);
                let retry_ms = (!gone && now.saturating_sub(n.created_ms) < window).then(|| {
                    let max =
                        i64::try_from(self.config.max_backoff.as_millis()).unwrap_or(i64::MAX);
                    now.saturating_add(notify::backoff_ms(n.attempts, max, rand::random::<f64>()))
                });
                match retry_ms {
                    Some(_) => {
                        tracing::warn!(event = %n.id, webhook = %n.webhook, %kind, attempt, "notification not delivered, will retry: {error}");
                    }
                    None => {
                        tracing::error!(event = %n.id, webhook = %n.webhook, %kind, attempt, "notification given up: {error}");
                    }
                }
                let entry = if retry_ms.is_some() {
                    "notification_failed"
                } else {
                    "notification_gave_up"
                };
                (
                    Settle::Failed {
                        at_ms: now,
                        error: error.clone(),
                        retry_ms,
                    },
                    (entry, json!(error)),
                )
            }
        };
        // The audit log says what happened to each event, never its body.
        if let Some(a) = &self.audit {
            let mut f = serde_json::Map::new();
            f.insert("event_id".into(), json!(n.id));
            f.insert("webhook".into(), json!(n.webhook));
            f.insert("event_kind".into(), json!(kind));
            f.insert("attempt".into(), json!(attempt));
            f.insert("status".into(), entry.1.clone());
            if let Some(t) = n.event.get("tenant").filter(|t| !t.is_null()) {
                f.insert("tenant".into(), t.clone());
            }
            a.record(entry.0, f);
        }
        if let Err(e) = self.store.notice_settle(n, settle).await {
            // Not recorded: the lease lapses and the notice is sent again,
            // with the same id.
            tracing::warn!("notification outcome not recorded (it will be sent again): {e}");
        }
    }

    /// POST the event to `w`; the status on 2xx, else why not.
    async fn send(
        &self,
        w: &WebhookConfig,
        http: &reqwest::Client,
        n: &Notice,
    ) -> Result<u16, String> {
        let secret = crate::upstream::credentials::resolve(
            &w.secret,
            &format!("secret of webhook `{}`", w.name),
        )?;
        let body = notify::body(&n.event, w, secret.as_bytes());
        let timestamp = self.clock.now_ms() / 1000;
        let signature = notify::signature(secret.as_bytes(), timestamp, &body);
        let response = http
            .post(&w.url)
            .header("content-type", "application/json")
            .header(
                "user-agent",
                concat!("countersign/", env!("CARGO_PKG_VERSION")),
            )
            .header("x-countersign-event", &n.id)
            .header("x-countersign-timestamp", timestamp.to_string())
            .header("x-countersign-signature", signature)
            .body(body)
            .send()
            .await
            // Without the url: a chat webhook's url is its secret.
            .map_err(|e| super::error_chain(&e.without_url()))?;
        let status = response.status();
        if status.is_success() {
            Ok(status.as_u16())
        } else {
            Err(format!("HTTP {}", status.as_u16()))
        }
    }
}

/// What `check` shows of each configured webhook: its last success and
/// failure, and its counts.
pub(crate) async fn status(store: &dyn Store, config: &NotifyConfig) -> Vec<Value> {
    let (known, _) = store.notify_status().await.unwrap_or_default();
    config
        .webhooks
        .iter()
        .map(|w| {
            let st = known.get(&w.name).cloned().unwrap_or_default();
            let at =
                |ms: Option<i64>| ms.map_or(Value::Null, |m| json!(crate::core::time::rfc3339(m)));
            json!({
                "webhook": w.name,
                "last_success": at(st.last_success_ms),
                "last_failure": at(st.last_failure_ms),
                "last_error": st.last_error,
                "delivered": st.delivered,
                "retried": st.retried,
                "gave_up": st.gave_up,
            })
        })
        .collect()
}
