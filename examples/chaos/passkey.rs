//! A reviewer who decides in the review console with a passkey: a software
//! WebAuthn authenticator (an ES256 key, user presence and verification
//! always reported), signing in and deciding through the console's own
//! endpoints, as the browser's script does.

use std::sync::Mutex;

use base64::Engine;
use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
use serde_json::{json, Value};
use sha2::Digest;

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
}

/// The authenticator: one resident ES256 credential.
pub struct SoftKey {
    pub id: String,
    pair: EcdsaKeyPair,
    cose: Vec<u8>,
}

impl SoftKey {
    /// A new credential.
    pub fn new() -> Result<SoftKey, String> {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng)
            .map_err(|e| e.to_string())?;
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng)
            .map_err(|e| e.to_string())?;
        let point = pair.public_key().as_ref().to_vec();
        // COSE_Key (RFC 9053): {1: 2 (EC2), 3: -7 (ES256), -1: 1 (P-256),
        // -2: x, -3: y}.
        let mut cose = vec![0xa5, 0x01, 0x02, 0x03, 0x26, 0x20, 0x01, 0x21, 0x58, 0x20];
        cose.extend_from_slice(&point[1..33]);
        cose.extend_from_slice(&[0x22, 0x58, 0x20]);
        cose.extend_from_slice(&point[33..65]);
        Ok(SoftKey {
            id: b64().encode(rand::random::<[u8; 16]>()),
            pair,
            cose,
        })
    }

    /// Its `[[reviewers]]` entry, as an enrolment shows it.
    pub fn entry(&self, name: &str, group: &str) -> String {
        format!(
            "[[reviewers]]\nname = \"{name}\"\ngroups = [\"{group}\"]\ntenants = [\"*\"]\npasskeys = [{{ id = \"{}\", public_key = \"{}\", alg = \"ES256\" }}]\n",
            self.id,
            b64().encode(&self.cose)
        )
    }

    /// An assertion over `challenge` (base64url) for `origin` and `rp_id`,
    /// with UP and UV set and no signature counter.
    fn assert(&self, challenge: &str, origin: &str, rp_id: &str) -> Result<Value, String> {
        let client = json!({"type": "webauthn.get", "challenge": challenge, "origin": origin, "crossOrigin": false})
            .to_string();
        let mut data = sha2::Sha256::digest(rp_id.as_bytes()).to_vec();
        data.push(0x05);
        data.extend_from_slice(&[0, 0, 0, 0]);
        let mut signed = data.clone();
        signed.extend_from_slice(&sha2::Sha256::digest(client.as_bytes()));
        let sig = self
            .pair
            .sign(&ring::rand::SystemRandom::new(), &signed)
            .map_err(|e| e.to_string())?;
        Ok(json!({
            "credential_id": self.id,
            "authenticator_data": b64().encode(&data),
            "client_data_json": b64().encode(client.as_bytes()),
            "signature": b64().encode(sig.as_ref()),
        }))
    }
}

/// One gateway's console, signed in (a session per gateway: sessions live
/// in the gateway's memory, and a restarted gateway asks again).
pub struct Console {
    /// `http://127.0.0.1:PORT`.
    base: String,
    /// `http://localhost:PORT`, the console's origin.
    origin: String,
    http: reqwest::Client,
    /// (cookie, CSRF token) once signed in.
    session: Mutex<Option<(String, String)>>,
}

impl Console {
    pub fn new(base: &str) -> Console {
        let port = base.rsplit(':').next().unwrap_or_default();
        Console {
            base: base.to_owned(),
            origin: format!("http://localhost:{port}"),
            http: reqwest::Client::new(),
            session: Mutex::new(None),
        }
    }

    async fn post(&self, path: &str, body: &Value) -> Result<(u16, Value, Option<String>), String> {
        let mut r = self
            .http
            .post(format!("{}{path}", self.base))
            .header("origin", &self.origin)
            .header("content-type", "application/json")
            .timeout(std::time::Duration::from_secs(20))
            .body(body.to_string());
        if let Some((cookie, csrf)) = self.session.lock().map_err(|_| "poisoned")?.clone() {
            r = r.header("cookie", cookie).header("x-csrf-token", csrf);
        }
        let resp = r.send().await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let cookie = resp
            .headers()
            .get("set-cookie")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(str::to_owned);
        let text = resp.text().await.unwrap_or_default();
        let v = serde_json::from_str(&text).unwrap_or(Value::Null);
        Ok((status, v, cookie))
    }

    /// Sign in with `key`.
    async fn sign_in(&self, key: &SoftKey) -> Result<(), String> {
        *self.session.lock().map_err(|_| "poisoned")? = None;
        let (_, options, _) = self.post("/review/sign-in/options", &json!({})).await?;
        let challenge = options["challenge"]
            .as_str()
            .ok_or("no sign-in challenge")?;
        let rp_id = options["rpId"].as_str().unwrap_or("localhost").to_owned();
        let assertion = key.assert(challenge, &self.origin, &rp_id)?;
        let (status, v, cookie) = self.post("/review/sign-in", &assertion).await?;
        match (status, cookie, v["csrf"].as_str()) {
            (200, Some(cookie), Some(csrf)) => {
                *self.session.lock().map_err(|_| "poisoned")? = Some((cookie, csrf.to_owned()));
                Ok(())
            }
            _ => Err(format!("console sign-in refused ({status}): {v}")),
        }
    }

    /// Decide proposal `id` with `key` (`approve` or `deny`), signing in
    /// first when the session is gone.
    pub async fn decide(&self, key: &SoftKey, id: &str, decision: &str) -> Result<(), String> {
        for _ in 0..2 {
            if self.session.lock().map_err(|_| "poisoned")?.is_none() {
                self.sign_in(key).await?;
            }
            let ask = json!({"decision": decision, "reason": "chaos", "ttl": ""});
            let (status, shown, _) = self
                .post(&format!("/review/p/{id}/statement"), &ask)
                .await?;
            if status == 401 {
                // The gateway restarted: its sessions went with it.
                *self.session.lock().map_err(|_| "poisoned")? = None;
                continue;
            }
            let challenge = shown["challenge"]
                .as_str()
                .ok_or_else(|| format!("no statement ({status}): {shown}"))?;
            let rp_id = shown["rpId"].as_str().unwrap_or("localhost").to_owned();
            let assertion = key.assert(challenge, &self.origin, &rp_id)?;
            let body = json!({"statement": shown["statement"], "assertion": assertion});
            let (status, v, _) = self.post(&format!("/review/p/{id}/decide"), &body).await?;
            return match status {
                200 => Ok(()),
                _ => Err(format!("console decision refused ({status}): {v}")),
            };
        }
        Err("the console session could not be kept".into())
    }
}
