//! Guards on redb (DESIGN.md section 25). One process owns a redb file, so
//! the guards' rows live in memory ([`Memory`]), loaded at open: a take is
//! one compare-and-set under its lock ([`crate::store::guards::take_in`]),
//! and what it changed waits there for its call's dispatch. The writer puts
//! those changes into the journal frame of the call's `dispatched` record
//! (one fsync, the one the dispatch pays anyway), and folds them into the
//! `guards` table at its next checkpoint, one table entry per guard group
//! and checkpoint (not one per call: a busy daily budget would otherwise
//! cost a B-tree insert per call); a reopen after a crash replays them. A call that is not dispatched releases its share in memory and its
//! changes are dropped: after a crash, only what was dispatched counts.
//! Rows the windows leave behind are not journaled: they leave the table at
//! the next checkpoint (a crash before it brings them back, ended, and the
//! next take or sweep prunes them again).

use std::collections::{HashMap, HashSet};

use redb::{Database, ReadableTable, TableDefinition};

use super::{blocking, decode_json, err, RedbStore};
use crate::core::guard::Claim;
use crate::store::guards::{
    gc_in, look_in, release_in, rows_in, take_in, Change, GuardRow, Standing, TakeLog, Taken,
};
use crate::store::{StoreError, StoreFuture};

/// The guards' rows of dispatched calls, as of the last checkpoint: entries
/// `b UNTIL ROWKEY` (the rows of one group folded at one checkpoint, UNTIL
/// when the last of them ends, ROWKEY the first one's key) and, from an
/// earlier release, single rows `g GROUP AT KEY` (see `store::guards`).
/// Sums and the index by ledger key are made again in memory at open.
pub(super) const GUARDS: TableDefinition<&str, &[u8]> = TableDefinition::new("guards");

/// The guards' rows in memory, and the changes of calls not dispatched yet.
pub(crate) struct Memory {
    rows: crate::store::guards::Rows,
    /// Per ledger key: the rows its take made, journaled at its dispatch.
    unsent: HashMap<String, Vec<Change>>,
    /// Table keys of rows pruned since the last checkpoint.
    pruned: Vec<String>,
    /// Table keys of single rows (an earlier release's), which leave the
    /// table one by one.
    single: HashSet<String>,
}

/// Rows pruned since the last checkpoint, for the next: all of them (a row
/// made and pruned in between is never written) and the single rows among
/// them (removed from the table).
#[derive(Default)]
pub(super) struct Pruned {
    all: Vec<String>,
    single: Vec<String>,
}

impl Memory {
    /// The rows of the `guards` table, with their sums and index.
    pub(super) fn load(db: &Database) -> Result<Memory, StoreError> {
        let txn = db.begin_read().map_err(|e| err("begin read")(e.into()))?;
        let table = txn
            .open_table(GUARDS)
            .map_err(|e| err("open table")(e.into()))?;
        let mut rows = crate::store::guards::Rows::default();
        let mut single = HashSet::new();
        for item in table.iter().map_err(|e| err("scan")(e.into()))? {
            let (k, v) = item.map_err(|e| err("scan")(e.into()))?;
            if k.value().starts_with('b') {
                let (group, entry) = decode_entry(v.value())?;
                for row in entry {
                    rows.insert(&group, std::sync::Arc::new(row))?;
                }
            } else {
                rows.insert_keyed(k.value(), std::sync::Arc::new(decode_row(v.value())?))?;
                single.insert(k.value().to_owned());
            }
        }
        Ok(Memory {
            rows,
            unsent: HashMap::new(),
            pruned: Vec::new(),
            single,
        })
    }

    /// The changes the call under `key` made, for its dispatch (taken: a
    /// dispatch happens once).
    pub(super) fn unsent(&mut self, key: &str) -> Option<Vec<Change>> {
        self.unsent.remove(key).filter(|c| !c.is_empty())
    }

    /// The rows pruned since the last checkpoint, for the next.
    pub(super) fn take_pruned(&mut self) -> Pruned {
        let all = std::mem::take(&mut self.pruned);
        let single = if self.single.is_empty() {
            Vec::new()
        } else {
            all.iter()
                .filter(|k| self.single.remove(k.as_str()))
                .cloned()
                .collect()
        };
        Pruned { all, single }
    }
}

/// The first byte of the guards' binary encoding (an earlier release wrote
/// JSON, which starts with `[` or `{`; both are still read).
const BINARY: u8 = 1;

/// Changes as a journal frame carries them: a compact binary form (each
/// string length-prefixed), read back by [`decode`]. A call's rows are
/// encoded on the write path, so JSON's escaping is not paid there.
pub(super) fn encode(changes: &[Change]) -> Result<Vec<u8>, StoreError> {
    let mut out = Vec::with_capacity(1 + changes.len() * 256);
    out.push(BINARY);
    for c in changes {
        match c {
            Change::Insert(k, r) => {
                out.push(b'I');
                put_str(&mut out, k)?;
                put_row(&mut out, r)?;
            }
            Change::Remove(k) => {
                out.push(b'R');
                put_str(&mut out, k)?;
            }
        }
    }
    Ok(out)
}

/// Changes read back from a journal frame (binary, or an earlier release's
/// JSON).
pub(super) fn decode(bytes: &[u8]) -> Result<Vec<Change>, StoreError> {
    if bytes.first() != Some(&BINARY) {
        return decode_json("guard changes", bytes);
    }
    let mut r = Reader(&bytes[1..]);
    let mut out = Vec::new();
    while let Some(tag) = r.byte() {
        out.push(match tag {
            b'I' => Change::Insert(r.string()?, std::sync::Arc::new(r.row()?)),
            b'R' => Change::Remove(r.string()?),
            other => return Err(corrupt(format!("unknown change tag {other}"))),
        });
    }
    Ok(out)
}

/// A single row of the `guards` table (an earlier release's, in JSON).
fn decode_row(bytes: &[u8]) -> Result<GuardRow, StoreError> {
    decode_json("guard row", bytes)
}

/// The first byte of a table entry whose rows share their guard's parts
/// (kind, name, tenant, scope), written once after the group.
const SHARED: u8 = 2;

/// A table entry `b…`: one group's rows folded at one checkpoint. The rows
/// of one group share their guard's parts, which are written once; each row
/// then holds its ledger key, amount and times.
fn encode_entry(group: &str, rows: &[&GuardRow]) -> Result<Vec<u8>, StoreError> {
    let mut out = Vec::with_capacity(64 + group.len() + rows.len() * 64);
    let Some(first) = rows.first() else {
        out.push(BINARY);
        put_str(&mut out, group)?;
        return Ok(out);
    };
    let shared = |r: &&GuardRow| {
        r.kind == first.kind
            && r.name == first.name
            && r.tenant == first.tenant
            && r.scope == first.scope
    };
    if !rows.iter().all(shared) {
        // Never made (a group is its guard's parts), but written whole
        // rather than wrongly if it were.
        out.push(BINARY);
        put_str(&mut out, group)?;
        for r in rows {
            put_row(&mut out, r)?;
        }
        return Ok(out);
    }
    out.push(SHARED);
    put_str(&mut out, group)?;
    for s in [&first.kind, &first.name, &first.tenant, &first.scope] {
        put_str(&mut out, s)?;
    }
    for r in rows {
        put_str(&mut out, &r.key)?;
        put_str(&mut out, &r.amount)?;
        out.extend_from_slice(&r.at_ms.to_le_bytes());
        out.extend_from_slice(&r.until_ms.to_le_bytes());
    }
    Ok(out)
}

fn decode_entry(bytes: &[u8]) -> Result<(String, Vec<GuardRow>), StoreError> {
    let (form, rest) = bytes
        .split_first()
        .ok_or_else(|| corrupt("an empty guards entry".into()))?;
    let mut r = Reader(rest);
    let group = r.string()?;
    let mut rows = Vec::new();
    match *form {
        BINARY => {
            while !r.0.is_empty() {
                rows.push(r.row()?);
            }
        }
        SHARED => {
            let (kind, name, tenant, scope) = (r.string()?, r.string()?, r.string()?, r.string()?);
            while !r.0.is_empty() {
                rows.push(GuardRow {
                    kind: kind.clone(),
                    name: name.clone(),
                    tenant: tenant.clone(),
                    scope: scope.clone(),
                    key: r.string()?,
                    amount: r.string()?,
                    at_ms: i64::from_le_bytes(r.bytes::<8>()?),
                    until_ms: i64::from_le_bytes(r.bytes::<8>()?),
                });
            }
        }
        _ => return Err(corrupt("a guards entry of an unknown form".into())),
    }
    Ok((group, rows))
}

/// The table key of an entry whose last row ends at `until_ms` and whose
/// first row has table key `first`: entries sort by when they end, so the
/// sweep removes ended ones with one range.
fn entry_key(until_ms: i64, first: &str) -> String {
    let mut out = String::with_capacity(21 + first.len());
    out.push('b');
    out.push_str(&format!("{:020}", until_ms.max(0)));
    out.push_str(first);
    out
}

fn put_str(out: &mut Vec<u8>, s: &str) -> Result<(), StoreError> {
    let len = u32::try_from(s.len()).map_err(|_| StoreError::Encode {
        what: "guard row",
        reason: format!("a text of {} bytes", s.len()),
        cause: None,
    })?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

fn put_row(out: &mut Vec<u8>, r: &GuardRow) -> Result<(), StoreError> {
    for s in [&r.kind, &r.name, &r.tenant, &r.scope, &r.key, &r.amount] {
        put_str(out, s)?;
    }
    out.extend_from_slice(&r.at_ms.to_le_bytes());
    out.extend_from_slice(&r.until_ms.to_le_bytes());
    Ok(())
}

fn corrupt(reason: String) -> StoreError {
    StoreError::Corrupt {
        what: "guards",
        reason,
        cause: None,
    }
}

/// Reads the binary form; a short or malformed input is `Corrupt`, never a
/// panic.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*b)
    }

    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], StoreError> {
        let (head, rest) = self
            .0
            .split_first_chunk::<N>()
            .ok_or_else(|| corrupt("a guard row ends early".into()))?;
        self.0 = rest;
        Ok(*head)
    }

    fn string(&mut self) -> Result<String, StoreError> {
        let len = u32::from_le_bytes(self.bytes::<4>()?) as usize;
        if len > self.0.len() {
            return Err(corrupt("a guard row's text ends early".into()));
        }
        let (text, rest) = self.0.split_at(len);
        self.0 = rest;
        String::from_utf8(text.to_vec()).map_err(|e| corrupt(format!("a guard row's text: {e}")))
    }

    fn row(&mut self) -> Result<GuardRow, StoreError> {
        Ok(GuardRow {
            kind: self.string()?,
            name: self.string()?,
            tenant: self.string()?,
            scope: self.string()?,
            key: self.string()?,
            amount: self.string()?,
            at_ms: i64::from_le_bytes(self.bytes::<8>()?),
            until_ms: i64::from_le_bytes(self.bytes::<8>()?),
        })
    }
}

/// Fold dispatched calls' rows, in order, and the rows pruned since the
/// last checkpoint into the `guards` table: a row made and pruned in between
/// (a short window) is never written; the rest are written as one entry per
/// group. Pruned rows of entries stay until their entry ends (a reopen loads
/// them ended, and the next take or sweep prunes them again); an earlier
/// release's single rows are removed.
pub(super) fn fold(
    txn: &redb::WriteTransaction,
    batches: &[Vec<Change>],
    pruned: &Pruned,
) -> Result<(), StoreError> {
    if batches.is_empty() && pruned.all.is_empty() {
        return Ok(());
    }
    // Row key -> what it is after the changes (None: gone), in key order:
    // sorted once (stable: a key's later change stays after its earlier
    // one, and wins), then the rows pruned since are left out in one walk
    // beside them (a map built change by change cost more per call).
    let mut changes: Vec<(&str, Option<&GuardRow>)> = batches
        .iter()
        .flatten()
        .map(|c| match c {
            Change::Insert(k, r) => (k.as_str(), Some(&**r)),
            Change::Remove(k) => (k.as_str(), None),
        })
        .collect();
    changes.sort_by(|a, b| a.0.cmp(b.0));
    let mut gone: Vec<&str> = pruned.all.iter().map(String::as_str).collect();
    gone.sort_unstable();
    let mut gone = gone.into_iter().peekable();
    let mut net: Vec<(&str, Option<&GuardRow>)> = Vec::with_capacity(changes.len());
    for (k, row) in changes {
        if let Some(last) = net.last_mut().filter(|(l, _)| *l == k) {
            last.1 = row;
            continue;
        }
        net.push((k, row));
    }
    net.retain(|(k, _)| {
        while gone.next_if(|g| g < k).is_some() {}
        gone.peek() != Some(k)
    });
    let mut table = txn
        .open_table(GUARDS)
        .map_err(|e| err("open table")(e.into()))?;
    // Per group: its first row's key and its rows (row keys sort by group).
    let mut groups: Vec<(&str, &str, Vec<&GuardRow>)> = Vec::new();
    for (k, row) in net {
        match row {
            Some(r) => {
                let group = crate::store::guards::group_of_row_key(k)
                    .ok_or_else(|| corrupt(format!("`{k}` is not a guard row's key")))?;
                match groups.last_mut() {
                    Some((g, _, rows)) if *g == group => rows.push(r),
                    _ => groups.push((group, k, vec![r])),
                }
            }
            // A Remove of an earlier release's journal.
            None => {
                table.remove(k).map_err(|e| err("write")(e.into()))?;
            }
        }
    }
    for (group, first, rows) in groups {
        let until = rows.iter().map(|r| r.until_ms).max().unwrap_or(0);
        table
            .insert(
                entry_key(until, first).as_str(),
                encode_entry(group, &rows)?.as_slice(),
            )
            .map_err(|e| err("write")(e.into()))?;
    }
    for k in &pruned.single {
        table
            .remove(k.as_str())
            .map_err(|e| err("write")(e.into()))?;
    }
    Ok(())
}

impl crate::store::guards::Guards for RedbStore {
    fn guards_look<'a>(
        &'a self,
        key: &'a str,
        claims: &'a [Claim],
        now_ms: i64,
    ) -> StoreFuture<'a, Standing> {
        let out = look_in(&self.guards.lock().rows, key, claims, now_ms);
        Box::pin(async move { out })
    }

    fn guards_take<'a>(
        &'a self,
        key: &'a str,
        claims: &'a [Claim],
        force: bool,
        now_ms: i64,
    ) -> StoreFuture<'a, Taken> {
        let mut mem = self.guards.lock();
        let Memory {
            rows,
            unsent,
            pruned,
            ..
        } = &mut *mem;
        let mut log = TakeLog::default();
        let out = take_in(rows, key, claims, force, now_ms, Some(&mut log));
        if !log.made.is_empty() {
            unsent.entry(key.to_owned()).or_default().extend(log.made);
        }
        pruned.extend(log.pruned);
        drop(mem);
        Box::pin(async move { out })
    }

    fn guards_release<'a>(&'a self, key: &'a str) -> StoreFuture<'a, usize> {
        let mut mem = self.guards.lock();
        // Never journaled: the call was not dispatched.
        mem.unsent.remove(key);
        let out = release_in(&mut mem.rows, key);
        drop(mem);
        Box::pin(async move { out })
    }

    fn guards_gc(&self, now_ms: i64) -> StoreFuture<'_, usize> {
        let (gone, single) = {
            let mut mem = self.guards.lock();
            let gone = gc_in(&mut mem.rows, now_ms);
            let single: Vec<String> = match &gone {
                Ok(gone) if !mem.single.is_empty() => gone
                    .iter()
                    .filter(|k| mem.single.remove(k.as_str()))
                    .cloned()
                    .collect(),
                _ => Vec::new(),
            };
            (gone, single)
        };
        let db = self.db.clone();
        Box::pin(async move {
            let n = gone?.len();
            // Gone from the table too: the entries whose rows all ended (a take
            // may have pruned them from memory long before), and single rows,
            // in a commit of its own (not fsynced: what a crash brings back has
            // ended anyway, and the next sweep takes it again).
            blocking(move || {
                let ended = entry_key(now_ms.saturating_add(1), "");
                let entries: Vec<String> = {
                    let txn = db.begin_read().map_err(|e| err("begin read")(e.into()))?;
                    let table = txn
                        .open_table(GUARDS)
                        .map_err(|e| err("open table")(e.into()))?;
                    let range = table
                        .range("b"..ended.as_str())
                        .map_err(|e| err("scan")(e.into()))?;
                    let mut keys = Vec::new();
                    for item in range {
                        keys.push(
                            item.map_err(|e| err("scan")(e.into()))?
                                .0
                                .value()
                                .to_owned(),
                        );
                    }
                    keys
                };
                if entries.is_empty() && single.is_empty() {
                    return Ok(());
                }
                let mut txn = db.begin_write().map_err(|e| err("begin")(e.into()))?;
                txn.set_durability(redb::Durability::None);
                {
                    let mut table = txn
                        .open_table(GUARDS)
                        .map_err(|e| err("open table")(e.into()))?;
                    for k in entries.iter().chain(&single) {
                        table
                            .remove(k.as_str())
                            .map_err(|e| err("write")(e.into()))?;
                    }
                }
                txn.commit().map_err(|e| err("commit")(e.into()))
            })
            .await?;
            Ok(n)
        })
    }

    fn guards_rows(&self, since_ms: i64) -> StoreFuture<'_, Vec<GuardRow>> {
        let out = rows_in(&self.guards.lock().rows, since_ms);
        Box::pin(async move { out })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str) -> GuardRow {
        GuardRow {
            kind: "budget".into(),
            name: "card-daily".into(),
            tenant: "acme".into(),
            scope: "principal:agent-7".into(),
            key: key.into(),
            amount: "12.50".into(),
            at_ms: 1_700_000_000_000,
            until_ms: 1_700_086_400_000,
        }
    }

    #[test]
    fn changes_and_rows_read_back_as_written_and_an_earlier_releases_json_still_reads() {
        let changes = vec![
            Change::Insert("g…1".into(), std::sync::Arc::new(row("k1"))),
            Change::Remove("g…0".into()),
        ];
        assert_eq!(decode(&encode(&changes).unwrap()).unwrap(), changes);
        assert_eq!(
            decode(&serde_json::to_vec(&changes).unwrap()).unwrap(),
            changes
        );
        let r = row("k2");
        assert_eq!(decode_row(&serde_json::to_vec(&r).unwrap()).unwrap(), r);
        let entry = encode_entry("3:g", &[&r, &row("k3")]).unwrap();
        assert_eq!(entry[0], SHARED, "a group's parts written once");
        assert_eq!(
            decode_entry(&entry).unwrap(),
            ("3:g".to_owned(), vec![r.clone(), row("k3")])
        );
        // An entry of the earlier form (each row whole) still reads.
        let mut whole = vec![BINARY];
        put_str(&mut whole, "3:g").unwrap();
        for x in [&r, &row("k3")] {
            put_row(&mut whole, x).unwrap();
        }
        assert_eq!(
            decode_entry(&whole).unwrap(),
            ("3:g".to_owned(), vec![r.clone(), row("k3")])
        );
        // Rows that do not share their parts are written whole.
        let other = GuardRow {
            name: "other".into(),
            ..row("k4")
        };
        let mixed = encode_entry("3:g", &[&r, &other]).unwrap();
        assert_eq!(mixed[0], BINARY);
        assert_eq!(decode_entry(&mixed).unwrap().1, vec![r, other]);
    }

    #[test]
    fn a_cut_or_bent_encoding_is_corrupt_not_a_panic() {
        let bytes = encode(&[Change::Insert("g1".into(), std::sync::Arc::new(row("k1")))]).unwrap();
        for cut in 2..bytes.len() {
            assert!(
                matches!(decode(&bytes[..cut]), Err(StoreError::Corrupt { .. })),
                "cut at {cut}"
            );
        }
        let mut bent = bytes.clone();
        bent[1] = b'X';
        assert!(matches!(decode(&bent), Err(StoreError::Corrupt { .. })));
        let entry = encode_entry("g", &[&row("k1")]).unwrap();
        let mut long = entry.clone();
        long.push(0);
        assert!(matches!(
            decode_entry(&long),
            Err(StoreError::Corrupt { .. })
        ));
        // A cut inside a text or a row is corrupt; a cut between rows reads
        // the rows before it (never a row that was not written).
        for cut in 0..entry.len() {
            match decode_entry(&entry[..cut]) {
                Err(StoreError::Corrupt { .. }) => {}
                Ok((g, rows)) => assert!(g == "g" && rows.is_empty(), "cut at {cut}"),
                Err(e) => panic!("cut at {cut}: {e}"),
            }
        }
    }
}
