//! A signed client of the control API, for the CLI and the reviewer TUI.
//! Every request carries `Authorization: Countersign-Ed25519 ...` made with
//! the reviewer's key; decisions are signed locally, so the private key
//! never leaves the reviewer's machine.

use anyhow::Context as _;
use std::path::Path;

use ed25519_dalek::SigningKey;
use serde_json::{json, Value};

use crate::core::approval::{Proposal, Verdict};
use crate::core::reviewers::KeyFile;
use crate::core::time::{now_ms, rfc3339};

/// A reviewer's connection to a gateway.
pub struct Client {
    base: String,
    name: String,
    key: SigningKey,
    http: reqwest::Client,
}

/// Read a key file, refusing one that others can read: a reviewer key
/// approves real actions.
pub fn load_key(path: &Path) -> anyhow::Result<KeyFile> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read key file `{}`", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)?.permissions().mode();
        if mode & 0o077 != 0 {
            anyhow::bail!(
                "key file `{}` is readable by others (mode {:o}): run `chmod 600 {}`",
                path.display(),
                mode & 0o777,
                path.display()
            );
        }
    }
    KeyFile::parse(&text).with_context(|| format!("key file `{}`", path.display()))
}

impl Client {
    /// A client of the gateway at `base` (e.g. `http://127.0.0.1:7373`).
    pub fn new(base: &str, key: &KeyFile) -> anyhow::Result<Client> {
        Ok(Client {
            base: base.trim_end_matches('/').to_owned(),
            name: key.name.clone(),
            key: key.signing_key()?,
            http: reqwest::Client::new(),
        })
    }

    /// A signed request builder for `path` (with its query).
    pub fn signed(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Vec<u8>,
    ) -> reqwest::RequestBuilder {
        let auth = crate::core::signed_request::authorization(
            &self.key,
            &self.name,
            method.as_str(),
            path,
            &rfc3339(now_ms()),
            &body,
        );
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("authorization", auth);
        if !body.is_empty() {
            req = req.header("content-type", "application/json").body(body);
        }
        req
    }

    /// Send a signed request; the JSON answer, or the gateway's error message.
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<Value> {
        let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        self.send(self.signed(method, path, bytes)).await
    }

    /// Send a request made by [`Client::signed`]; the JSON answer, or the
    /// gateway's error message.
    pub async fn send(&self, request: reqwest::RequestBuilder) -> anyhow::Result<Value> {
        let resp = request
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("cannot reach the gateway at {}: {e} (is `countersign serve` running? set --gateway)", self.base))?;
        let status = resp.status();
        let text = resp.text().await?;
        let value: Value = serde_json::from_str(&text).unwrap_or_else(|_| json!({ "raw": text }));
        if !status.is_success() {
            let msg = value
                .pointer("/error/message")
                .and_then(Value::as_str)
                .unwrap_or(&text);
            anyhow::bail!("the gateway refused ({status}): {msg}");
        }
        Ok(value)
    }

    /// Proposals (optionally only in one state).
    pub async fn proposals(&self, state: Option<&str>) -> anyhow::Result<Vec<Value>> {
        let path = match state {
            Some(s) => format!("/v1/proposals?state={s}"),
            None => "/v1/proposals".into(),
        };
        let v = self.call(reqwest::Method::GET, &path, None).await?;
        Ok(v["proposals"].as_array().cloned().unwrap_or_default())
    }

    /// One proposal, as the API shows it.
    pub async fn proposal(&self, id: &str) -> anyhow::Result<Value> {
        let v = self
            .call(reqwest::Method::GET, &format!("/v1/proposals/{id}"), None)
            .await?;
        Ok(v["proposal"].clone())
    }

    /// Unknown outcomes of the reviewer's tenants.
    pub async fn outcomes(&self) -> anyhow::Result<Vec<Value>> {
        let v = self
            .call(reqwest::Method::GET, "/v1/outcomes", None)
            .await?;
        Ok(v["outcomes"].as_array().cloned().unwrap_or_default())
    }

    /// The newest audit entries of the reviewer's tenants.
    pub async fn audit_tail(&self, limit: usize) -> anyhow::Result<Vec<Value>> {
        let v = self
            .call(
                reqwest::Method::GET,
                &format!("/v1/audit?limit={limit}"),
                None,
            )
            .await?;
        Ok(v["entries"].as_array().cloned().unwrap_or_default())
    }

    /// Take this reviewer's approval of proposal `id` back.
    pub async fn withdraw(&self, id: &str) -> anyhow::Result<Value> {
        let v = self
            .call(
                reqwest::Method::POST,
                &format!("/v1/proposals/{id}/withdraw"),
                Some(&json!({})),
            )
            .await?;
        Ok(v["proposal"].clone())
    }

    /// Settle an unknown outcome: `executed` or `not_executed`, with a note.
    pub async fn reconcile(
        &self,
        tenant: &str,
        principal: &str,
        key: &str,
        executed: bool,
        note: &str,
    ) -> anyhow::Result<Value> {
        let body = json!({
            "tenant": tenant, "principal": principal, "key": key,
            "resolution": if executed { "executed" } else { "not_executed" },
            "note": (!note.is_empty()).then_some(note),
        });
        self.call(reqwest::Method::POST, "/v1/outcomes/reconcile", Some(&body))
            .await
    }

    /// Sign and submit a decision on the proposal exactly as the gateway
    /// shows it. `ttl` (approvals only) bounds the approval's life.
    pub async fn decide(
        &self,
        id: &str,
        verdict: Verdict,
        reason: &str,
        ttl: std::time::Duration,
    ) -> anyhow::Result<Value> {
        let request = self.decision_request(id, verdict, reason, ttl).await?;
        Ok(self.send(request).await?["proposal"].clone())
    }

    /// The signed request of a decision on the proposal exactly as the
    /// gateway shows it, not sent yet.
    pub async fn decision_request(
        &self,
        id: &str,
        verdict: Verdict,
        reason: &str,
        ttl: std::time::Duration,
    ) -> anyhow::Result<reqwest::RequestBuilder> {
        let shown = self.proposal(id).await?;
        let policy_set = shown["policy_set"].as_str().map(str::to_owned);
        let proposal: Proposal = serde_json::from_value(strip_view(shown))
            .context("the gateway's proposal does not parse")?;
        let now = now_ms();
        let expires = now.saturating_add(ttl.as_millis().min(i64::MAX as u128) as i64);
        // The policy set in force as the gateway shows it: the statement
        // names the rules the reviewer approves under.
        let statement = proposal.statement(
            verdict,
            &self.name,
            reason,
            &rfc3339(now),
            &rfc3339(expires),
            policy_set.as_deref(),
        );
        let signature = statement.sign(&self.key)?;
        let body = json!({ "statement": statement, "signature": signature });
        Ok(self.signed(
            reqwest::Method::POST,
            &format!("/v1/proposals/{id}/decision"),
            body.to_string().into_bytes(),
        ))
    }
}

/// A proposal view without the fields the API adds for display.
pub fn strip_view(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        for k in [
            "summary",
            "created_at",
            "updated_at",
            "expires_at",
            "pending_expires_ms",
            "policy_set",
            "progress",
        ] {
            o.remove(k);
        }
    }
    v
}
