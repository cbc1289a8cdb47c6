//! The RFC 6962 Merkle tree over the audit log (DESIGN.md section 15), the
//! pure part: leaf and node hashes, where each stored hash lives, the root
//! of any size, inclusion and consistency proofs and their checks.
//!
//! A leaf is one entry: its data is the 32 bytes of the entry's `hash`
//! (SHA-256 of the JCS of the entry without `hash`, which already commits
//! to `prev`), so `leaf = SHA-256(0x00 || hash)`. Interior nodes are
//! `SHA-256(0x01 || left || right)` (RFC 6962 section 2.1).
//!
//! Stored hashes: every leaf hash and the hash of every complete, aligned
//! subtree, in one append-only sequence in the order they become known (the
//! layout of Go's `golang.org/x/mod/sumdb/tlog`, which `tlog-tiles` derives
//! from): the `n`th hash of level `l` covers leaves `n·2^l .. (n+1)·2^l`.
//! Any other subtree (the right edge of a tree whose size is not a power
//! of two) is computed from O(log n) stored ones.

use crate::core::sha256;

/// A SHA-256 hash.
pub type Hash = [u8; 32];

/// The root of the empty tree: SHA-256 of nothing.
pub fn empty_root() -> Hash {
    sha256::digest(&[])
}

/// A leaf's hash: SHA-256(0x00 || data).
pub fn leaf_hash(data: &[u8]) -> Hash {
    let mut h = sha256::Hasher::new();
    h.update(&[0u8]);
    h.update(data);
    h.finish()
}

/// An interior node's hash: SHA-256(0x01 || left || right).
pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    // One 65-byte message in one call.
    let mut m = [0u8; 65];
    m[0] = 1;
    m[1..33].copy_from_slice(left);
    m[33..].copy_from_slice(right);
    sha256::digest(&m)
}

/// Where the `n`th hash of `level` sits in the stored sequence.
pub fn stored_index(level: u8, n: u64) -> u64 {
    // Level l's nth hash is written right after level l+1's (2n+1)th...
    // worked down to level 0, whose nth hash sits at n + n/2 + n/4 + ...
    let mut n = n;
    for _ in 0..level {
        n = 2 * n + 1;
    }
    let mut i = 0u64;
    let mut m = n;
    while m > 0 {
        i += m;
        m >>= 1;
    }
    i + u64::from(level)
}

/// How many hashes are stored for a tree of `size` leaves.
pub fn stored_count(size: u64) -> u64 {
    if size == 0 {
        return 0;
    }
    let mut count = stored_index(0, size - 1) + 1;
    let mut i = size - 1;
    while i & 1 == 1 {
        count += 1;
        i >>= 1;
    }
    count
}

/// The tree sizes whose stored count is `count`, or the largest below it:
/// how many leaves a stored sequence of `count` hashes holds in full.
pub fn size_for_count(count: u64) -> u64 {
    // stored_count grows by at least 1 per leaf: a binary search.
    let (mut lo, mut hi) = (0u64, count);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if stored_count(mid) <= count {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// Read access to stored hashes.
pub trait Stored {
    /// The stored hash at `index`.
    fn stored(&self, index: u64) -> std::io::Result<Hash>;
}

/// The largest power of two strictly less than `n` (n > 1).
fn split(n: u64) -> u64 {
    1u64 << (63 - (n - 1).leading_zeros())
}

/// The hash of the leaves `lo..hi` (a subtree as RFC 6962's recursion
/// forms it: `lo` is aligned to the largest power of two below `hi - lo`).
pub fn range_hash<S: Stored + ?Sized>(s: &S, lo: u64, hi: u64) -> std::io::Result<Hash> {
    let n = hi - lo;
    if n.is_power_of_two() && lo.is_multiple_of(n) {
        let level = n.trailing_zeros() as u8;
        return s.stored(stored_index(level, lo >> level));
    }
    let k = split(n);
    let left = range_hash(s, lo, lo + k)?;
    let right = range_hash(s, lo + k, hi)?;
    Ok(node_hash(&left, &right))
}

/// The root of the first `size` leaves.
pub fn root<S: Stored + ?Sized>(s: &S, size: u64) -> std::io::Result<Hash> {
    if size == 0 {
        return Ok(empty_root());
    }
    range_hash(s, 0, size)
}

/// Why a proof cannot be made or does not check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    /// The leaf or size is outside the tree.
    #[error("{0}")]
    Range(String),
    /// The proof does not lead to the root.
    #[error(
        "the proof does not lead to the root: the entry, the proof or the checkpoint was changed"
    )]
    Mismatch,
}

/// The inclusion proof of leaf `index` in the tree of `size` leaves
/// (RFC 6962 section 2.1.1, `PATH(m, D[n])`), leaf to root.
pub fn inclusion<S: Stored + ?Sized>(
    s: &S,
    index: u64,
    size: u64,
) -> Result<Vec<Hash>, std::io::Error> {
    let mut out = Vec::new();
    path(s, index, 0, size, &mut out)?;
    Ok(out)
}

fn path<S: Stored + ?Sized>(
    s: &S,
    m: u64,
    lo: u64,
    hi: u64,
    out: &mut Vec<Hash>,
) -> std::io::Result<()> {
    let n = hi - lo;
    if n <= 1 {
        return Ok(());
    }
    let k = split(n);
    if m < k {
        path(s, m, lo, lo + k, out)?;
        out.push(range_hash(s, lo + k, hi)?);
    } else {
        path(s, m - k, lo + k, hi, out)?;
        out.push(range_hash(s, lo, lo + k)?);
    }
    Ok(())
}

/// The consistency proof from the tree of `old` leaves to the tree of
/// `new` leaves (RFC 6962 section 2.1.2, `PROOF(m, D[n])`).
pub fn consistency<S: Stored + ?Sized>(s: &S, old: u64, new: u64) -> std::io::Result<Vec<Hash>> {
    let mut out = Vec::new();
    if old == 0 || old >= new {
        return Ok(out);
    }
    subproof(s, old, 0, new, true, &mut out)?;
    Ok(out)
}

fn subproof<S: Stored + ?Sized>(
    s: &S,
    m: u64,
    lo: u64,
    hi: u64,
    whole: bool,
    out: &mut Vec<Hash>,
) -> std::io::Result<()> {
    let n = hi - lo;
    if m == n {
        if !whole {
            out.push(range_hash(s, lo, hi)?);
        }
        return Ok(());
    }
    let k = split(n);
    if m <= k {
        subproof(s, m, lo, lo + k, whole, out)?;
        out.push(range_hash(s, lo + k, hi)?);
    } else {
        subproof(s, m - k, lo + k, hi, false, out)?;
        out.push(range_hash(s, lo, lo + k)?);
    }
    Ok(())
}

/// Check an inclusion proof: leaf `leaf` at `index` in the tree of `size`
/// leaves whose root is `root` (RFC 9162 section 2.1.3.2).
pub fn check_inclusion(
    proof: &[Hash],
    index: u64,
    size: u64,
    leaf: &Hash,
    root: &Hash,
) -> Result<(), ProofError> {
    if index >= size {
        return Err(ProofError::Range(format!(
            "leaf {index} is not in a tree of {size}"
        )));
    }
    let (mut f, mut s) = (index, size - 1);
    let mut r = *leaf;
    for p in proof {
        if s == 0 {
            return Err(ProofError::Mismatch);
        }
        if f & 1 == 1 || f == s {
            r = node_hash(p, &r);
            while f & 1 == 0 && f != 0 {
                f >>= 1;
                s >>= 1;
            }
        } else {
            r = node_hash(&r, p);
        }
        f >>= 1;
        s >>= 1;
    }
    if s == 0 && r == *root {
        Ok(())
    } else {
        Err(ProofError::Mismatch)
    }
}

/// Check a consistency proof from (`old`, `old_root`) to (`new`,
/// `new_root`) (RFC 9162 section 2.1.4.2).
pub fn check_consistency(
    proof: &[Hash],
    old: u64,
    new: u64,
    old_root: &Hash,
    new_root: &Hash,
) -> Result<(), ProofError> {
    if old > new {
        return Err(ProofError::Range(format!(
            "old size {old} is beyond new size {new}"
        )));
    }
    if old == new {
        return if proof.is_empty() && old_root == new_root {
            Ok(())
        } else {
            Err(ProofError::Mismatch)
        };
    }
    if old == 0 {
        return if proof.is_empty() {
            Ok(())
        } else {
            Err(ProofError::Mismatch)
        };
    }
    let mut path: Vec<Hash> = proof.to_vec();
    if old.is_power_of_two() {
        path.insert(0, *old_root);
    }
    let (mut f, mut s) = (old - 1, new - 1);
    while f & 1 == 1 {
        f >>= 1;
        s >>= 1;
    }
    let Some((first, rest)) = path.split_first() else {
        return Err(ProofError::Mismatch);
    };
    let (mut fr, mut sr) = (*first, *first);
    for c in rest {
        if s == 0 {
            return Err(ProofError::Mismatch);
        }
        if f & 1 == 1 || f == s {
            fr = node_hash(c, &fr);
            sr = node_hash(c, &sr);
            while f & 1 == 0 && f != 0 {
                f >>= 1;
                s >>= 1;
            }
        } else {
            sr = node_hash(&sr, c);
        }
        f >>= 1;
        s >>= 1;
    }
    if fr == *old_root && sr == *new_root && s == 0 {
        Ok(())
    } else {
        Err(ProofError::Mismatch)
    }
}

/// The right edge of a growing tree: the hashes of its complete subtrees,
/// largest first, which is all an append needs. `push` returns the
/// hashes to store, in order (the leaf, then each subtree it completes).
#[derive(Debug, Clone, Default)]
pub struct Frontier {
    size: u64,
    /// (level, hash) of the complete subtrees, left to right.
    edge: Vec<(u8, Hash)>,
}

impl Frontier {
    /// The frontier of a tree of `size` leaves, from its stored hashes.
    pub fn load<S: Stored + ?Sized>(s: &S, size: u64) -> std::io::Result<Frontier> {
        let mut edge = Vec::new();
        let mut lo = 0u64;
        for level in (0..64u8).rev() {
            if size & (1u64 << level) != 0 {
                edge.push((level, s.stored(stored_index(level, lo >> level))?));
                lo += 1u64 << level;
            }
        }
        Ok(Frontier { size, edge })
    }

    /// Leaves so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Append a leaf hash; the hashes to store, in stored order.
    pub fn push(&mut self, leaf: Hash) -> Vec<Hash> {
        let mut out = vec![leaf];
        let mut cur = (0u8, leaf);
        while let Some(&(level, left)) = self.edge.last() {
            if level != cur.0 {
                break;
            }
            self.edge.pop();
            cur = (level + 1, node_hash(&left, &cur.1));
            out.push(cur.1);
        }
        self.edge.push(cur);
        self.size += 1;
        out
    }

    /// The root now.
    pub fn root(&self) -> Hash {
        let mut it = self.edge.iter().rev();
        let Some(&(_, mut acc)) = it.next() else {
            return empty_root();
        };
        for (_, left) in it {
            acc = node_hash(left, &acc);
        }
        acc
    }
}

/// Stored hashes in memory (tests, benches, and a verifier's scratch).
impl Stored for Vec<Hash> {
    fn stored(&self, index: u64) -> std::io::Result<Hash> {
        self.get(index as usize).copied().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("stored hash {index} is beyond the {} stored", self.len()),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 6962's MTH, straight from its definition.
    fn mth(leaves: &[Hash]) -> Hash {
        match leaves.len() {
            0 => empty_root(),
            1 => leaves[0],
            n => {
                let k = split(n as u64) as usize;
                node_hash(&mth(&leaves[..k]), &mth(&leaves[k..]))
            }
        }
    }

    fn grow(n: u64) -> (Vec<Hash>, Vec<Hash>, Frontier) {
        let mut stored = Vec::new();
        let mut leaves = Vec::new();
        let mut f = Frontier::default();
        for i in 0..n {
            let leaf = leaf_hash(&i.to_be_bytes());
            leaves.push(leaf);
            stored.extend(f.push(leaf));
            assert_eq!(
                stored.len() as u64,
                stored_count(i + 1),
                "count at {}",
                i + 1
            );
        }
        (stored, leaves, f)
    }

    #[test]
    fn roots_match_the_rfc_definition_at_every_size() {
        let (stored, leaves, f) = grow(70);
        assert_eq!(f.root(), mth(&leaves));
        for size in 0..=70u64 {
            assert_eq!(
                root(&stored, size).unwrap(),
                mth(&leaves[..size as usize]),
                "size {size}"
            );
            let loaded = Frontier::load(&stored, size).unwrap();
            assert_eq!(loaded.root(), mth(&leaves[..size as usize]));
            assert_eq!(size_for_count(stored_count(size)), size);
        }
    }

    #[test]
    fn every_inclusion_proof_checks_and_a_wrong_one_does_not() {
        let (stored, leaves, _) = grow(37);
        for size in 1..=37u64 {
            let r = root(&stored, size).unwrap();
            for i in 0..size {
                let p = inclusion(&stored, i, size).unwrap();
                check_inclusion(&p, i, size, &leaves[i as usize], &r).unwrap();
                let other = leaves[((i + 1) % 37) as usize];
                if other != leaves[i as usize] {
                    assert!(check_inclusion(&p, i, size, &other, &r).is_err());
                }
            }
        }
        assert!(check_inclusion(&[], 5, 5, &leaves[0], &leaves[0]).is_err());
    }

    #[test]
    fn every_consistency_proof_checks_and_a_fork_does_not() {
        let (stored, _, _) = grow(33);
        for new in 1..=33u64 {
            let nr = root(&stored, new).unwrap();
            for old in 0..=new {
                let or = root(&stored, old).unwrap();
                let p = consistency(&stored, old, new).unwrap();
                check_consistency(&p, old, new, &or, &nr)
                    .unwrap_or_else(|e| panic!("{old}->{new}: {e}"));
                if old > 0 && old < new {
                    let forged = leaf_hash(b"another history");
                    assert!(check_consistency(&p, old, new, &forged, &nr).is_err());
                }
            }
        }
    }

    #[test]
    fn stored_layout_is_go_tlogs() {
        // Values of golang.org/x/mod/sumdb/tlog's StoredHashIndex.
        assert_eq!(stored_index(0, 0), 0);
        assert_eq!(stored_index(0, 1), 1);
        assert_eq!(stored_index(1, 0), 2);
        assert_eq!(stored_index(0, 2), 3);
        assert_eq!(stored_index(0, 3), 4);
        assert_eq!(stored_index(1, 1), 5);
        assert_eq!(stored_index(2, 0), 6);
        assert_eq!(stored_count(4), 7);
    }
}
