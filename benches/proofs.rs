//! Inclusion and consistency proofs from the audit tree file at 10^4, 10^5
//! and 10^6 entries: time per proof and stored hashes read per proof, to
//! show the O(log n) growth. The tree is built through the writer's own
//! `TreeWriter`, proofs are read back through `TreeReader` (one positional
//! read per stored hash), and each proof is checked.
//!
//! `taskset -c 0 cargo bench --bench proofs`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use countersign::audit::merkle::{self, Hash, Stored};
use countersign::audit::tree::{TreeReader, TreeWriter};

/// Counts the stored hashes a proof reads.
struct Counting<'a>(&'a TreeReader, AtomicU64);

impl Stored for Counting<'_> {
    fn stored(&self, index: u64) -> std::io::Result<Hash> {
        self.1.fetch_add(1, Ordering::Relaxed);
        self.0.stored(index)
    }
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let max = 1_000_000u64;
    let start = Instant::now();
    let mut tree = TreeWriter::open(dir.path(), 0, None, |_| Ok(Vec::new())).unwrap();
    let leaves: Vec<Hash> = (0..max)
        .map(|i| merkle::leaf_hash(&i.to_be_bytes()))
        .collect();
    for l in &leaves {
        tree.push(l).unwrap();
    }
    tree.flush().unwrap();
    println!(
        "built a tree of {max} leaves in {:.2} s",
        start.elapsed().as_secs_f64()
    );
    let reader = TreeReader::open(dir.path()).unwrap();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for size in [10_000u64, 100_000, 1_000_000] {
        let counting = Counting(&reader, AtomicU64::new(0));
        let root = merkle::root(&reader, size).unwrap();
        let rounds = 2_000u64;
        let t = Instant::now();
        for _ in 0..rounds {
            let i = next(size);
            let p = merkle::inclusion(&counting, i, size).unwrap();
            merkle::check_inclusion(&p, i, size, &merkle::leaf_hash(&leaves[i as usize]), &root)
                .unwrap();
        }
        let inc = t.elapsed().as_secs_f64() * 1e6 / rounds as f64;
        let inc_reads = counting.1.swap(0, Ordering::Relaxed) as f64 / rounds as f64;
        let t = Instant::now();
        for _ in 0..rounds {
            let old = 1 + next(size - 1);
            let p = merkle::consistency(&counting, old, size).unwrap();
            let old_root = merkle::root(&reader, old).unwrap();
            merkle::check_consistency(&p, old, size, &old_root, &root).unwrap();
        }
        let con = t.elapsed().as_secs_f64() * 1e6 / rounds as f64;
        let con_reads = counting.1.load(Ordering::Relaxed) as f64 / rounds as f64;
        println!(
            "size {size:>9}: inclusion {inc:6.1} µs ({inc_reads:4.1} stored hashes read), consistency {con:6.1} µs incl. the old root ({con_reads:4.1} read for the proof)"
        );
    }
}
