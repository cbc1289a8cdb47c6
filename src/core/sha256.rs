//! SHA-256 as the gateway computes it on its hot paths (the audit chain
//! and Merkle tree, the call digest, the arguments' digest, bearer tokens):
//! ring's implementation, already linked for TLS. Its assembly uses the CPU's
//! SHA extensions where there are some and AVX2 or SSSE3 otherwise, where
//! the `sha2` crate falls back to portable code without SHA extensions: on
//! the same machine ring took 38% fewer instructions for a 900-byte entry
//! (docs/performance.md, "Instructions per call"). The digests are the same
//! bytes (FIPS 180-4): the known answers below and the audit log's own
//! verification hold them to it.

/// A SHA-256 digest.
pub type Digest = [u8; 32];

/// SHA-256 of `bytes`.
pub fn digest(bytes: &[u8]) -> Digest {
    finish(ring::digest::digest(&ring::digest::SHA256, bytes))
}

/// SHA-256 over several parts, hashed as one message.
#[derive(Clone)]
pub struct Hasher(ring::digest::Context);

impl Default for Hasher {
    fn default() -> Self {
        Hasher(ring::digest::Context::new(&ring::digest::SHA256))
    }
}

impl Hasher {
    /// A hasher with nothing in it yet.
    pub fn new() -> Hasher {
        Hasher::default()
    }

    /// Add `bytes` to the message.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The digest of everything added.
    pub fn finish(self) -> Digest {
        finish(self.0.finish())
    }
}

fn finish(d: ring::digest::Digest) -> Digest {
    let mut out = [0u8; 32];
    // SHA-256 digests are 32 bytes: the copy takes them all.
    out.copy_from_slice(d.as_ref());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FIPS 180-4's examples (NIST's "SHA256.pdf"): one block, two blocks.
    #[test]
    fn known_answers() {
        assert_eq!(
            hex::encode(digest(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let two = b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
        assert_eq!(
            hex::encode(digest(two)),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
        assert_eq!(
            hex::encode(digest(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    /// Parts hashed as one message give the one-shot digest, at every
    /// split of a message longer than a block.
    #[test]
    fn parts_are_one_message() {
        let msg: Vec<u8> = (0..200u8).collect();
        for cut in [0, 1, 55, 56, 63, 64, 65, 127, 128, 199, 200] {
            let mut h = Hasher::new();
            h.update(&msg[..cut]);
            h.update(&msg[cut..]);
            assert_eq!(h.finish(), digest(&msg), "cut at {cut}");
        }
    }

    /// The same bytes as the `sha2` crate's SHA-256 (an implementation of
    /// its own) at every length across several blocks.
    #[test]
    fn the_same_as_another_implementation() {
        use sha2::Digest as _;
        let msg: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
        for len in 0..msg.len() {
            let other: Digest = sha2::Sha256::digest(&msg[..len]).into();
            assert_eq!(digest(&msg[..len]), other, "length {len}");
        }
    }
}
