//! Invitations to enrol, named by the SHA-256 of the link's token (the
//! token itself is stored nowhere). `countersign reviewer invite` writes
//! each as a file, `DATA_DIR/review/invites/HASH.json` (renamed `.used`
//! once used and `.expired` once audited as lapsed), and, on a PostgreSQL
//! store, into the store as well (`invite/HASH`), where every gateway
//! sharing it finds it. A gateway that finds only the file copies it into
//! the store when the link is first opened. The `[[reviewers]]` entries
//! finished enrolments made are kept under `DATA_DIR/review/enrolled/`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::core::passkey::{self, PasskeyKey};

/// One invitation, as its file holds it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Invite {
    /// The reviewer's name in `reviewers.toml`.
    pub(crate) name: String,
    /// Their groups.
    pub(crate) groups: Vec<String>,
    /// Their tenants.
    pub(crate) tenants: Vec<String>,
    /// Unix ms: made.
    pub(crate) created_ms: i64,
    /// Unix ms: no longer good after this.
    pub(crate) expires_ms: i64,
    /// Unix ms: used to enrol a passkey (in the store's copy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) used_ms: Option<i64>,
}

/// How long the store keeps an invitation after it expired, so that its
/// link is told "expired" or "used" rather than "not valid".
const KEPT_AFTER: i64 = 7 * 24 * 3_600_000;

impl Invite {
    /// Its key in the store.
    pub(crate) fn key(hash: &str) -> String {
        format!("invite/{hash}")
    }

    /// Until when the store keeps it.
    pub(crate) fn kept_until(&self) -> i64 {
        self.expires_ms.saturating_add(KEPT_AFTER)
    }

    /// Its text in the store.
    pub(crate) fn text(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

pub(crate) fn hash_of(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

pub(crate) fn invites(dir: &Path) -> PathBuf {
    dir.join("invites")
}

/// Where finished enrolments are kept (`countersign reviewer enrolled`).
pub(crate) fn enrolled_dir(dir: &Path) -> PathBuf {
    dir.join("enrolled")
}

/// Write an invitation under `dir` (`DATA_DIR/review`); its token (32
/// random bytes, base64url), which only the link carries, and the
/// invitation.
pub(crate) fn write_invite(
    dir: &Path,
    name: &str,
    groups: &[String],
    tenants: &[String],
    ttl: Duration,
    now_ms: i64,
) -> std::io::Result<(String, Invite)> {
    let token = passkey::b64url().encode(rand::random::<[u8; 32]>());
    let invite = Invite {
        name: name.to_owned(),
        groups: groups.to_vec(),
        tenants: tenants.to_vec(),
        created_ms: now_ms,
        expires_ms: now_ms.saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)),
        used_ms: None,
    };
    let folder = invites(dir);
    crate::store::durable::dir_all(&folder)?;
    let path = folder.join(format!("{}.json", hash_of(&token)));
    let text = serde_json::to_vec_pretty(&invite).map_err(std::io::Error::other)?;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(&path)?;
    std::io::Write::write_all(&mut f, &text)?;
    f.sync_all()?;
    // Its entry in the folder too: a link handed out is not lost to a cut.
    crate::store::durable::created(&path)?;
    Ok((token, invite))
}

/// Why an enrolment link does not work.
#[derive(Debug)]
pub(crate) enum Unusable {
    /// No invitation has this token.
    Unknown,
    /// It was used.
    Used,
    /// It expired.
    Expired(i64),
}

impl std::fmt::Display for Unusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unusable::Unknown => f.write_str("this enrolment link is not valid: ask for a new one (`countersign reviewer invite`)"),
            Unusable::Used => f.write_str("this enrolment link was used already: each link enrols one passkey; ask for a new one"),
            Unusable::Expired(at) => write!(
                f,
                "this enrolment link expired at {}: ask for a new one",
                crate::core::time::rfc3339(*at)
            ),
        }
    }
}

/// Why an invitation cannot be looked up now.
#[derive(Debug)]
pub(crate) enum Lookup {
    /// The link does not work (said to its holder).
    Unusable(Unusable),
    /// The store could not answer: nothing is decided about the link.
    Store(crate::store::StoreError),
}

/// The invitation behind `token`, while it may be used: the store's copy,
/// or this gateway's file (copied into the store, so that every gateway
/// sharing it knows the link from then on).
pub(crate) async fn find(
    store: &dyn crate::store::Store,
    dir: &Path,
    token: &str,
    now_ms: i64,
) -> Result<Invite, Lookup> {
    let hash = hash_of(token);
    let stored = store
        .console_get(Invite::key(&hash), now_ms)
        .await
        .map_err(Lookup::Store)?;
    let invite = match stored {
        Some(text) => serde_json::from_str::<Invite>(&text)
            .map_err(|_| Lookup::Unusable(Unusable::Unknown))?,
        None => {
            let invite = from_file(dir, &hash).map_err(Lookup::Unusable)?;
            store
                .console_put(Invite::key(&hash), invite.text(), invite.kept_until())
                .await
                .map_err(Lookup::Store)?;
            invite
        }
    };
    if invite.used_ms.is_some() {
        return Err(Lookup::Unusable(Unusable::Used));
    }
    if invite.expires_ms <= now_ms {
        return Err(Lookup::Unusable(Unusable::Expired(invite.expires_ms)));
    }
    Ok(invite)
}

/// The invitation file `hash` under `dir`: used ones say so.
fn from_file(dir: &Path, hash: &str) -> Result<Invite, Unusable> {
    let base = invites(dir).join(hash);
    if base.with_extension("used").exists() {
        return Err(Unusable::Used);
    }
    let text = std::fs::read(base.with_extension("json"))
        .or_else(|_| std::fs::read(base.with_extension("expired")))
        .map_err(|_| Unusable::Unknown)?;
    serde_json::from_slice(&text).map_err(|_| Unusable::Unknown)
}

/// The `[[reviewers]]` entry of an enrolment.
pub(crate) fn entry(invite: &Invite, key: &PasskeyKey) -> String {
    let list = |items: &[String]| {
        let quoted: Vec<String> = items
            .iter()
            .map(|i| toml::Value::String(i.clone()).to_string())
            .collect();
        format!("[{}]", quoted.join(", "))
    };
    format!(
        "[[reviewers]]\nname = {}\ngroups = {}\ntenants = {}\npasskeys = [{{ id = \"{}\", public_key = \"{}\", alg = \"{}\" }}]\n",
        toml::Value::String(invite.name.clone()),
        list(&invite.groups),
        list(&invite.tenants),
        key.id,
        key.public_key,
        key.alg.as_str()
    )
}
