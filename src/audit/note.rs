//! C2SP formats for the audit log's checkpoints (DESIGN.md section 15): the
//! `tlog-checkpoint` body, `signed-note` signatures with the gateway's
//! Ed25519 key, verifier keys (`vkey`), and `tlog-cosignature/v1`
//! cosignatures from witnesses. Pure: text in, text out.
//!
//! A checkpoint note:
//!
//! ```text
//! countersign/0f3a...            <- origin (the key name too)
//! 1234                           <- tree size
//! <base64 root hash>
//!
//! — countersign/0f3a... <base64(key id || Ed25519 signature over the three lines)>
//! — witness.example/w1 <base64(key id || timestamp || signature)>   <- cosignatures, later
//! ```

use base64::Engine;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

use super::merkle::Hash;

/// Signature type of a log's own Ed25519 note signature.
const ED25519: u8 = 0x01;
/// Signature type of a timestamped Ed25519 cosignature.
const COSIGNATURE_V1: u8 = 0x04;
/// The longest note the gateway reads (a checkpoint and a few dozen
/// signatures).
const MAX_NOTE: usize = 16 * 1024;

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

/// Why a note, checkpoint or key is not acceptable. Each message says what
/// is wrong precisely.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoteError {
    /// Not a signed note at all.
    #[error("not a signed note: {0}")]
    Malformed(String),
    /// The text is not a checkpoint.
    #[error("not a tlog checkpoint: {0}")]
    Checkpoint(String),
    /// A verifier key that does not parse.
    #[error("verifier key `{key}`: {why}")]
    Key {
        /// The text.
        key: String,
        /// What is wrong.
        why: String,
    },
    /// No signature by the expected key, or one that does not verify.
    #[error("{0}")]
    Signature(String),
}

/// A checkpoint: the origin, the tree size and the root hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// Which log (the gateway's origin, also its key name).
    pub origin: String,
    /// Leaves covered.
    pub size: u64,
    /// The root of those leaves.
    pub root: Hash,
}

impl Checkpoint {
    /// The note text: three lines, each ending in a newline.
    pub fn body(&self) -> String {
        format!(
            "{}\n{}\n{}\n",
            self.origin,
            self.size,
            b64().encode(self.root)
        )
    }

    /// Parse a checkpoint body (extension lines are refused: the gateway
    /// writes none, so one is a sign of another log).
    pub fn parse(text: &str) -> Result<Checkpoint, NoteError> {
        let bad = |why: &str| NoteError::Checkpoint(why.to_owned());
        let lines: Vec<&str> = text
            .strip_suffix('\n')
            .ok_or_else(|| bad("the text does not end in a newline"))?
            .split('\n')
            .collect();
        let [origin, size, root] = lines.as_slice() else {
            return Err(bad("a checkpoint has three lines: origin, size, root hash"));
        };
        if origin.is_empty() {
            return Err(bad("the origin line is empty"));
        }
        // No leading zeroes, plain decimal, as the spec asks.
        if size.is_empty()
            || (size.len() > 1 && size.starts_with('0'))
            || !size.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(bad("the size line is not a decimal without leading zeroes"));
        }
        let size: u64 = size
            .parse()
            .map_err(|_| bad("the size does not fit in 64 bits"))?;
        let raw = b64()
            .decode(root)
            .map_err(|_| bad("the root hash is not base64"))?;
        let root: Hash = raw
            .try_into()
            .map_err(|_| bad("the root hash is not 32 bytes"))?;
        Ok(Checkpoint {
            origin: (*origin).to_owned(),
            size,
            root,
        })
    }
}

/// Key names may not hold spaces or `+` (signed-note).
pub fn valid_key_name(name: &str) -> bool {
    !name.is_empty() && !name.chars().any(|c| c.is_whitespace() || c == '+')
}

/// The key id: SHA-256(name || 0x0A || type || public key)[:4], big-endian.
pub fn key_id(name: &str, kind: u8, key: &VerifyingKey) -> u32 {
    let mut h = Sha256::new();
    h.update(name.as_bytes());
    h.update([b'\n', kind]);
    h.update(key.as_bytes());
    let d = h.finalize();
    u32::from_be_bytes([d[0], d[1], d[2], d[3]])
}

/// The gateway's verifier key for its notes: `name+hex id+base64(0x01 ||
/// public key)`, as `signed-note` verifiers (and witnesses) take it.
pub fn vkey(name: &str, key: &VerifyingKey) -> String {
    let mut raw = vec![ED25519];
    raw.extend_from_slice(key.as_bytes());
    format!(
        "{name}+{:08x}+{}",
        key_id(name, ED25519, key),
        b64().encode(raw)
    )
}

/// A parsed verifier key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vkey {
    /// The key name.
    pub name: String,
    /// Its id.
    pub id: u32,
    /// Signature type (`0x01` note signatures, `0x04` cosignatures).
    pub kind: u8,
    /// The Ed25519 key.
    pub key: VerifyingKey,
}

/// Parse a verifier key; its id must be the one its name and key give.
pub fn parse_vkey(text: &str) -> Result<Vkey, NoteError> {
    let bad = |why: &str| NoteError::Key {
        key: text.to_owned(),
        why: why.to_owned(),
    };
    let mut parts = text.trim().splitn(3, '+');
    let (Some(name), Some(id), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad("a vkey is NAME+ID+KEY"));
    };
    if !valid_key_name(name) {
        return Err(bad("the name holds a space or `+`"));
    }
    let id = u32::from_str_radix(id, 16).map_err(|_| bad("the id is not 8 hex digits"))?;
    let raw = b64()
        .decode(key)
        .map_err(|_| bad("the key is not base64"))?;
    let (&kind, rest) = raw.split_first().ok_or_else(|| bad("the key is empty"))?;
    if kind != ED25519 && kind != COSIGNATURE_V1 {
        return Err(bad(
            "only Ed25519 keys (type 0x01, or 0x04 for cosignatures) are supported",
        ));
    }
    let bytes: [u8; 32] = rest
        .try_into()
        .map_err(|_| bad("the key is not 32 bytes"))?;
    let key =
        VerifyingKey::from_bytes(&bytes).map_err(|_| bad("the key is not an Ed25519 point"))?;
    if key_id(name, kind, &key) != id {
        return Err(bad("the id does not match the name and key"));
    }
    Ok(Vkey {
        name: name.to_owned(),
        id,
        kind,
        key,
    })
}

/// One signature line of a note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigLine {
    /// The key name.
    pub name: String,
    /// The key id.
    pub id: u32,
    /// The signature bytes after the id.
    pub sig: Vec<u8>,
}

impl SigLine {
    /// `— name base64(id || sig)\n`.
    pub fn render(&self) -> String {
        let mut raw = self.id.to_be_bytes().to_vec();
        raw.extend_from_slice(&self.sig);
        format!("\u{2014} {} {}\n", self.name, b64().encode(raw))
    }

    /// Parse one signature line (without its newline).
    pub fn parse(line: &str) -> Result<SigLine, NoteError> {
        let bad = |why: &str| NoteError::Malformed(why.to_owned());
        let rest = line
            .strip_prefix("\u{2014} ")
            .ok_or_else(|| bad("a signature line starts with an em dash and a space"))?;
        let (name, sig) = rest
            .split_once(' ')
            .ok_or_else(|| bad("a signature line is `— NAME SIGNATURE`"))?;
        if !valid_key_name(name) {
            return Err(bad("a signature's key name holds a space or `+`"));
        }
        let raw = b64()
            .decode(sig)
            .map_err(|_| bad("a signature is not base64"))?;
        if raw.len() < 5 {
            return Err(bad("a signature is shorter than its key id"));
        }
        Ok(SigLine {
            name: name.to_owned(),
            id: u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]),
            sig: raw[4..].to_vec(),
        })
    }
}

/// A signed note taken apart: its text and its signature lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// The text, ending in a newline.
    pub text: String,
    /// Signature lines, in order.
    pub sigs: Vec<SigLine>,
}

impl Note {
    /// Parse a signed note.
    pub fn parse(note: &str) -> Result<Note, NoteError> {
        let bad = |why: &str| NoteError::Malformed(why.to_owned());
        if note.len() > MAX_NOTE {
            return Err(bad("longer than 16 KiB"));
        }
        if note.chars().any(|c| c.is_control() && c != '\n') {
            return Err(bad("it holds control characters"));
        }
        let body = note
            .strip_suffix('\n')
            .ok_or_else(|| bad("it does not end in a newline"))?;
        // The text ends at the last blank line.
        let at = body
            .rfind("\n\n")
            .ok_or_else(|| bad("no blank line between the text and the signatures"))?;
        let text = &body[..at + 1];
        let sigs = body[at + 2..]
            .split('\n')
            .map(SigLine::parse)
            .collect::<Result<Vec<_>, _>>()?;
        if sigs.is_empty() {
            return Err(bad("no signature lines"));
        }
        Ok(Note {
            text: text.to_owned(),
            sigs,
        })
    }

    /// The note as text.
    pub fn render(&self) -> String {
        let mut out = self.text.clone();
        out.push('\n');
        for s in &self.sigs {
            out.push_str(&s.render());
        }
        out
    }

    /// Check the log's own signature with `key` named `name`: there must be
    /// one line of that name and id, and it must verify.
    pub fn verify(&self, name: &str, key: &VerifyingKey) -> Result<(), NoteError> {
        let id = key_id(name, ED25519, key);
        let line = self
            .sigs
            .iter()
            .find(|s| s.name == name && s.id == id)
            .ok_or_else(|| {
                NoteError::Signature(format!(
                    "the note is not signed by `{name}` with the expected key (id {id:08x})"
                ))
            })?;
        let sig = Signature::from_slice(&line.sig)
            .map_err(|_| NoteError::Signature("the log's signature is not 64 bytes".into()))?;
        key.verify_strict(self.text.as_bytes(), &sig).map_err(|_| {
            NoteError::Signature(format!(
                "the signature of `{name}` does not verify: the checkpoint was altered"
            ))
        })
    }

    /// Check a witness's cosignature (tlog-cosignature/v1) with `witness`;
    /// its timestamp when it verifies, `None` when the note has none.
    pub fn cosigned_by(&self, witness: &Vkey) -> Result<Option<u64>, NoteError> {
        let Some(line) = self
            .sigs
            .iter()
            .find(|s| s.name == witness.name && s.id == witness.id)
        else {
            return Ok(None);
        };
        if line.sig.len() != 8 + 64 {
            return Err(NoteError::Signature(format!(
                "the cosignature of `{}` is not a timestamp and an Ed25519 signature",
                witness.name
            )));
        }
        let time = u64::from_be_bytes(line.sig[..8].try_into().unwrap_or_default());
        let sig = Signature::from_slice(&line.sig[8..])
            .map_err(|_| NoteError::Signature("a cosignature is not 64 bytes".into()))?;
        witness
            .key
            .verify_strict(cosigned_message(&self.text, time).as_bytes(), &sig)
            .map_err(|_| {
                NoteError::Signature(format!(
                    "the cosignature of witness `{}` does not verify",
                    witness.name
                ))
            })?;
        Ok(Some(time))
    }
}

/// What a v1 cosignature signs: `cosignature/v1`, `time T`, the note text.
pub fn cosigned_message(text: &str, time: u64) -> String {
    format!("cosignature/v1\ntime {time}\n{text}")
}

/// The gateway's signed note for `checkpoint`, its key named by the origin.
pub fn sign(checkpoint: &Checkpoint, key: &SigningKey) -> Note {
    let text = checkpoint.body();
    let sig = key.sign(text.as_bytes()).to_bytes().to_vec();
    Note {
        sigs: vec![SigLine {
            name: checkpoint.origin.clone(),
            id: key_id(&checkpoint.origin, ED25519, &key.verifying_key()),
            sig,
        }],
        text,
    }
}

/// A witness's cosignature verifier key: `name+id+base64(0x04 || key)`.
pub fn witness_vkey(name: &str, key: &VerifyingKey) -> String {
    let mut raw = vec![COSIGNATURE_V1];
    raw.extend_from_slice(key.as_bytes());
    format!(
        "{name}+{:08x}+{}",
        key_id(name, COSIGNATURE_V1, key),
        b64().encode(raw)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A witness's cosignature line over `text`.
    fn cosign(text: &str, name: &str, key: &SigningKey, time: u64) -> SigLine {
        let mut sig = time.to_be_bytes().to_vec();
        sig.extend_from_slice(&key.sign(cosigned_message(text, time).as_bytes()).to_bytes());
        SigLine {
            name: name.to_owned(),
            id: key_id(name, COSIGNATURE_V1, &key.verifying_key()),
            sig,
        }
    }

    fn cp() -> Checkpoint {
        Checkpoint {
            origin: "countersign/test".into(),
            size: 42,
            root: [7; 32],
        }
    }

    #[test]
    fn a_signed_checkpoint_round_trips_and_verifies_with_its_key_only() {
        let key = SigningKey::from_bytes(&[1; 32]);
        let note = sign(&cp(), &key);
        let text = note.render();
        assert!(text.starts_with("countersign/test\n42\nBwcH"));
        assert!(text.contains("\n\n\u{2014} countersign/test "));
        let back = Note::parse(&text).unwrap();
        assert_eq!(back, note);
        back.verify("countersign/test", &key.verifying_key())
            .unwrap();
        let other = SigningKey::from_bytes(&[2; 32]);
        assert!(back
            .verify("countersign/test", &other.verifying_key())
            .is_err());
        assert_eq!(Checkpoint::parse(&back.text).unwrap(), cp());
        // One character of the text changed.
        let altered = text.replacen("42\n", "43\n", 1);
        let e = Note::parse(&altered)
            .unwrap()
            .verify("countersign/test", &key.verifying_key())
            .unwrap_err();
        assert!(e.to_string().contains("altered"), "{e}");
    }

    #[test]
    fn vkeys_round_trip_and_a_wrong_id_is_refused() {
        let key = SigningKey::from_bytes(&[1; 32]).verifying_key();
        let v = vkey("countersign/test", &key);
        let parsed = parse_vkey(&v).unwrap();
        assert_eq!(
            (parsed.name.as_str(), parsed.kind, parsed.key),
            ("countersign/test", ED25519, key)
        );
        let mut parts: Vec<&str> = v.split('+').collect();
        let bad_id = "00000000".to_owned();
        parts[1] = &bad_id;
        assert!(parse_vkey(&parts.join("+"))
            .unwrap_err()
            .to_string()
            .contains("does not match"));
        assert!(parse_vkey("nope").is_err());
    }

    #[test]
    fn cosignatures_verify_and_bind_the_text_and_time() {
        let key = SigningKey::from_bytes(&[1; 32]);
        let witness = SigningKey::from_bytes(&[3; 32]);
        let mut note = sign(&cp(), &key);
        note.sigs.push(cosign(
            &note.text,
            "witness.example/w1",
            &witness,
            1_700_000_000,
        ));
        let w = parse_vkey(&witness_vkey(
            "witness.example/w1",
            &witness.verifying_key(),
        ))
        .unwrap();
        let back = Note::parse(&note.render()).unwrap();
        assert_eq!(back.cosigned_by(&w).unwrap(), Some(1_700_000_000));
        back.verify("countersign/test", &key.verifying_key())
            .unwrap();
        let mut forged = back.clone();
        forged.sigs[1].sig[0] ^= 1;
        assert!(forged.cosigned_by(&w).is_err(), "another time");
        let other = Note {
            text: Checkpoint { size: 43, ..cp() }.body(),
            sigs: back.sigs.clone(),
        };
        assert!(other.cosigned_by(&w).is_err(), "another checkpoint");
        let stranger = parse_vkey(&witness_vkey(
            "witness.example/w2",
            &witness.verifying_key(),
        ))
        .unwrap();
        assert_eq!(back.cosigned_by(&stranger).unwrap(), None);
    }

    #[test]
    fn malformed_notes_and_checkpoints_say_what_is_wrong() {
        for (text, why) in [
            ("no newline", "newline"),
            ("a\nb\n", "blank line"),
            ("a\n\nnot a sig\n", "em dash"),
            ("a\n\n\u{2014} n !!!\n", "base64"),
        ] {
            let e = Note::parse(text).unwrap_err().to_string();
            assert!(e.contains(why), "{text:?}: {e}");
        }
        for (text, why) in [
            ("o\n01\nAAAA\n", "leading zeroes"),
            ("o\n1\n", "three lines"),
            ("o\n1\nAAAA\n", "32 bytes"),
            ("\n1\nAAAA\n", "origin"),
        ] {
            let e = Checkpoint::parse(text).unwrap_err().to_string();
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }
}
