//! Writing a set. Staging cuts whole stripes into k data shards, computes m parity shards and stages each
//! shard on its drive, all drives at once. A commit turns the logical transaction into one transaction per
//! drive: the same collections and names, shard offsets for staged stripes, the tail (bytes past the last
//! whole stripe) written whole on its holders, the object's layout and attributes on every drive. It holds
//! the objects' locks, submits to every drive at once, and succeeds when a write quorum committed every
//! object it touched; otherwise the drives that committed are put back (the undo log) and it fails.

use crate::codec::{Codec, CodecId, codec_by_id};
use crate::layout::{ObjectLayout, SetGeometry, split_into_shards};
use crate::read::{DriveState, Verdict, decide, drive_states};
use crate::undo::{UNDO_ATTR, UNDO_ENTRY_MAX_BYTES, UndoAction, UndoEntry, entry_name, queue_cleanup, undo_on_drive};
use crate::{LAYOUT_ATTR, SetColl, SetInner, SetStaged};
use futures::future::join_all;
use mosaic_store::{AlignedBuf, ErrorKind, Op, Outcome, Snapshot, Store, StoreError, StoreResult, Txn};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Cuts whole stripes into shards and stages each on its drive.
pub(crate) async fn stage<S: Store>(
    set: &SetInner<S>,
    buf: AlignedBuf,
    len_bytes: usize,
    hint: &[u8],
) -> StoreResult<(SetStaged<S::Staged>, AlignedBuf)> {
    let g = *set.geometry();
    let stripe = g.stripe_bytes() as usize;
    if len_bytes == 0 || len_bytes > buf.len() || !len_bytes.is_multiple_of(stripe) {
        return Err(StoreError::new(ErrorKind::InvalidArgument, "staged bytes must be whole stripes of the buffer"));
    }
    stage_at(set, buf, len_bytes, g.rotation_for(hint), set.cfg.write_codec(), hint).await
}

/// Stages whole stripes with shard 0 on drive `rotation`.
async fn stage_at<S: Store>(
    set: &SetInner<S>,
    buf: AlignedBuf,
    len_bytes: usize,
    rotation: usize,
    codec: CodecId,
    hint: &[u8],
) -> StoreResult<(SetStaged<S::Staged>, AlignedBuf)> {
    let g = *set.geometry();
    let code = codec_by_id(codec, g.data, g.parity).ok_or_else(|| {
        StoreError::new(
            ErrorKind::InvalidArgument,
            format!("erasure code {codec} is unknown to this build or this CPU for {}+{}", g.data, g.parity),
        )
    })?;
    // Splitting and encoding are CPU work: off the async threads, in the request's CPU class.
    let (buf, shards) =
        mosaic_store::spawn_blocking_in(mosaic_store::io_share(), move || encode_stripes(g, &*code, buf, len_bytes))
            .await
            .map_err(|e| StoreError::internal(format!("an encoding worker failed: {e}")))??;
    let shard_len = len_bytes / g.data;
    let mut by_drive: Vec<Option<AlignedBuf>> = (0..g.drives()).map(|_| None).collect();
    let mut data_buf = Some(buf);
    let mut returned = None;
    for (j, shard) in shards.into_iter().enumerate() {
        let d = g.drive_of_shard(rotation, j);
        by_drive[d] = match shard {
            Some(s) => Some(s),
            // With one data shard, the caller's buffer is that shard.
            None => data_buf.take(),
        };
    }
    let staged = join_all(by_drive.into_iter().enumerate().map(|(d, shard)| {
        let member = set.member(d);
        async move {
            let (Some(store), Some(shard)) = (member, shard) else { return (None, None) };
            match store.stage(shard, shard_len, hint).await {
                Ok((st, b)) => (Some(st), Some(b)),
                Err(e) => {
                    tracing::warn!(drive = d, error = %e, "a drive failed to stage its shard");
                    (None, None)
                }
            }
        }
    }))
    .await;
    let mut out = Vec::with_capacity(g.drives());
    for (d, (st, b)) in staged.into_iter().enumerate() {
        if g.data == 1 && g.shard_on_drive(rotation, d) == 0 {
            returned = b;
        }
        out.push(st);
    }
    let buf = returned.or(data_buf).unwrap_or_else(|| AlignedBuf::zeroed(len_bytes));
    Ok((SetStaged { rotation, codec, len_bytes: len_bytes as u64, shards: out }, buf))
}

/// The k + m shards of whole stripes (None for shard 0 when k is 1: the buffer itself is that shard).
fn encode_stripes(
    g: SetGeometry,
    codec: &dyn Codec,
    buf: AlignedBuf,
    len: usize,
) -> StoreResult<(AlignedBuf, Vec<Option<AlignedBuf>>)> {
    let shard_len = len / g.data;
    let mut shards: Vec<Option<AlignedBuf>> = (0..g.drives()).map(|_| None).collect();
    if g.data > 1 {
        let mut data: Vec<AlignedBuf> = (0..g.data).map(|_| AlignedBuf::zeroed(shard_len)).collect();
        let mut refs: Vec<&mut [u8]> = data.iter_mut().map(|b| &mut b.as_mut_slice()[..shard_len]).collect();
        split_into_shards(&buf.as_slice()[..len], g.data, &mut refs);
        for (j, d) in data.into_iter().enumerate() {
            shards[j] = Some(d);
        }
    }
    if g.parity > 0 {
        let mut parity: Vec<AlignedBuf> = (0..g.parity).map(|_| AlignedBuf::zeroed(shard_len)).collect();
        {
            let data: Vec<&[u8]> = if g.data == 1 {
                vec![&buf.as_slice()[..len]]
            } else {
                shards[..g.data].iter().map(|s| &s.as_ref().expect("split").as_slice()[..shard_len]).collect()
            };
            let mut prefs: Vec<&mut [u8]> = parity.iter_mut().map(|b| &mut b.as_mut_slice()[..shard_len]).collect();
            debug_assert!(codec.data_shards() == g.data && codec.parity_shards() == g.parity);
            codec.encode(&data, &mut prefs).map_err(|e| StoreError::internal(format!("encoding failed: {e}")))?;
        }
        for (i, p) in parity.into_iter().enumerate() {
            shards[g.data + i] = Some(p);
        }
    }
    Ok((buf, shards))
}

type SetTxn<S> = Txn<SetColl<<S as Store>::Coll>, SetStaged<<S as Store>::Staged>>;
type DriveOp<S> = Op<<S as Store>::Coll, <S as Store>::Staged>;
type SetOp<S> = Op<SetColl<<S as Store>::Coll>, SetStaged<<S as Store>::Staged>>;

/// What the planner knows of one object the transaction touches.
struct ObjWork {
    coll: Arc<str>,
    name: Vec<u8>,
    /// Its version before the transaction (None: absent on a quorum).
    before: Option<ObjectLayout>,
    /// Drives holding that version.
    holders: u16,
    /// Drives holding the object in any version (they must move it aside before replacing it).
    present_on: u16,
    /// Its state as the operations so far left it.
    now: Option<ObjectLayout>,
    /// Drives taking part in this object's changes: every drive for a replacement, the holders for a
    /// change in place.
    participants: u16,
    /// Whether the transaction changes it (set by `finish_object`): then a write quorum of its
    /// participants must commit, even when failed drives left it none.
    changed: bool,
    /// Whether the transaction replaced it (so a change in place needs no revert entry).
    replaced: bool,
    /// Attributes, listing tag and priority changed in place (what a revert entry must restore).
    changed_attrs: BTreeSet<Vec<u8>>,
    changed_tag: bool,
    changed_priority: bool,
    /// Its undo entry per drive once saved: (entry index, how the drive kept the old object).
    saved: HashMap<usize, (u32, Saved)>,
    /// Its priority before the transaction (what a revert restores).
    before_priority: bool,
    /// Tail bytes this transaction appended (with the tail before it, what encoding the tail needs).
    appended_tail: Vec<u8>,
    /// The object this one was renamed to (its index), if the transaction renamed it.
    renamed_to: Option<usize>,
    /// Whether the transaction renamed another object onto this one (it then takes no other operation:
    /// undoing the rename moves it back whole, so nothing else may have changed it).
    renamed_onto: bool,
}

/// How a drive kept an object's old state for its undo entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Saved {
    /// Moved aside (renamed into the undo log) before it was replaced.
    Moved,
    /// It was not on the drive: the entry removes what the write created.
    Created,
    /// Cloned into the undo log (its blocks shared, nothing copied) before bytes of it were overwritten in
    /// place, which a revert to the old size could not put back.
    Copied,
    /// Renamed to another name of its collection: the entry (an object of its own) renames it back.
    RenamedAway,
    /// Another object was renamed onto it where it was absent: that object's entry undoes both.
    RenamedOnto,
}

struct Planner<'a, S: Store> {
    set: &'a Arc<SetInner<S>>,
    g: SetGeometry,
    write_id: [u8; 16],
    now_ns: u64,
    /// Whether drives keep an undo log for this transaction (not for a set of one drive, whose
    /// transaction is atomic by itself).
    logged: bool,
    objects: Vec<ObjWork>,
    index: HashMap<(Arc<str>, Vec<u8>), usize>,
    /// Collection handles by name.
    colls: HashMap<Arc<str>, SetColl<S::Coll>>,
    /// Per drive: (object it belongs to, op); None for ops that belong to no object (collections).
    ops: Vec<Vec<(Option<usize>, DriveOp<S>)>>,
    /// Drives that must commit for the transaction's collection operations.
    coll_participants: Vec<(String, u16)>,
    next_entry: u32,
    /// Whether an operation renamed an object (later operations are checked against its destination).
    renamed_any: bool,
    outcome: Outcome,
}

/// The object an operation changes on the drives holding its version only (their participants are its
/// holders), if it is such an operation: a rename's source, or a change of attributes, tag or priority.
fn changed_on_holders<C, St>(op: &Op<C, St>) -> Option<(&C, &[u8])> {
    match op {
        Op::Rename { coll, from: name, .. }
        | Op::SetAttr { coll, name, .. }
        | Op::RemoveAttr { coll, name, .. }
        | Op::SetNameTag { coll, name, .. }
        | Op::SetPriority { coll, name, .. } => Some((coll, name)),
        _ => None,
    }
}

/// The objects whose first operation in `ops`, asserts aside, is one only their holders take
/// (`changed_on_holders`), in order: those `Planner::rebuild_if_short` checks before the operations are
/// planned. A versioned overwrite asserts the key's version before it renames it, so the assert does not
/// count; an object the transaction first replaces (reset, create, write, removal) is not among them, as
/// its holders do not matter then. Each of them is looked up by its own operation anyway: no extra lookup.
fn holders_only_objects<C: Clone, St>(ops: &[Op<SetColl<C>, St>]) -> Vec<(SetColl<C>, Vec<u8>)> {
    let mut touched_before: HashSet<(Arc<str>, Vec<u8>)> = HashSet::new();
    let mut out = Vec::new();
    for op in ops {
        if matches!(op, Op::AssertAttr { .. } | Op::AssertExists { .. }) {
            continue;
        }
        if let Some((coll, name)) = changed_on_holders(op)
            && !touched_before.contains(&(coll.name.clone(), name.to_vec()))
        {
            out.push((coll.clone(), name.to_vec()));
        }
        touched_before.extend(touched(op));
    }
    out
}

fn bad(op: usize, why: impl Into<String>) -> StoreError {
    StoreError::new(ErrorKind::InvalidArgument, why).in_op(op)
}

fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// A new write's id: its start time in nanoseconds (big-endian, strictly increasing within the process),
/// then 8 random bytes. Ids sort in the order writes began, and writes of one name begin one after the
/// other (under its lock): recovery settles undecided writes newest first in that order (undo.rs).
fn new_write_id(now_ns: u64) -> [u8; 16] {
    static LAST_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let order = std::sync::atomic::Ordering::SeqCst;
    let prev = LAST_NS.fetch_update(order, order, |last| Some(now_ns.max(last + 1))).unwrap_or_else(|last| last);
    let t = now_ns.max(prev + 1);
    debug_assert!(t > prev);
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&t.to_be_bytes());
    id[8..].copy_from_slice(&rand::random::<[u8; 8]>());
    id
}

fn mask_iter(mask: u16) -> impl Iterator<Item = usize> {
    (0..16).filter(move |d| mask & (1 << d) != 0)
}

impl<'a, S: Store> Planner<'a, S> {
    fn new(set: &'a Arc<SetInner<S>>) -> Self {
        let g = *set.geometry();
        let now_ns = now_ns();
        Planner {
            set,
            g,
            write_id: new_write_id(now_ns),
            now_ns,
            logged: g.drives() > 1,
            objects: Vec::new(),
            index: HashMap::new(),
            colls: HashMap::new(),
            ops: (0..g.drives()).map(|_| Vec::new()).collect(),
            coll_participants: Vec::new(),
            next_entry: 0,
            renamed_any: false,
            outcome: Outcome::default(),
        }
    }

    /// A fresh, empty layout for an object named `name`.
    fn empty_layout(&self, name: &[u8]) -> ObjectLayout {
        ObjectLayout {
            codec: self.set.cfg.write_codec(),
            data: self.g.data as u8,
            parity: self.g.parity as u8,
            rotation: self.g.rotation_for(name) as u8,
            write_id: self.write_id,
            size_bytes: 0,
            encoded_bytes: 0,
            tail_holders: 0,
            mtime_ns: self.now_ns,
        }
    }

    /// Drives where collection `coll` exists (they can take this object's operations).
    fn coll_drives(coll: &SetColl<S::Coll>) -> u16 {
        coll.members.iter().enumerate().filter(|(_, c)| c.is_some()).fold(0, |m, (d, _)| m | 1 << d)
    }

    /// The object `(coll, name)`, read from every drive on first use.
    async fn object(&mut self, coll: &SetColl<S::Coll>, name: &[u8]) -> StoreResult<usize> {
        if let Some(i) = self.index.get(&(coll.name.clone(), name.to_vec())) {
            return Ok(*i);
        }
        let coll = self.current_coll(coll).await?;
        let states = drive_states(self.set, &coll, name).await;
        let present_on = states
            .iter()
            .enumerate()
            .filter(|(_, s)| matches!(s, DriveState::Present { .. }))
            .fold(0u16, |m, (d, _)| m | 1 << d);
        let (before, holders, before_priority) = match decide(states, self.g.read_quorum(), self.g.write_quorum()) {
            Verdict::Found(r) => {
                let holders =
                    r.holders.iter().enumerate().filter(|(_, h)| h.is_some()).fold(0u16, |m, (d, _)| m | 1 << d);
                (Some(r.layout), holders, r.high_priority)
            }
            Verdict::Absent => (None, 0, false),
            Verdict::NoQuorum { answered, agreeing } => {
                return Err(StoreError::unavailable(format!(
                    "{answered} drives answered and at most {agreeing} agree on object {}; {} are needed",
                    name.escape_ascii(),
                    self.g.read_quorum()
                )));
            }
        };
        Ok(self.add_object(&coll, name, before, holders, present_on, before_priority))
    }

    /// The object `(coll, name)` that the transaction's first operation on it replaces whole (a reset). A
    /// set without an undo log (one drive) never needs what was there: the drive's reset drops it, nothing
    /// is logged to put it back, and no later operation reads it (an assertion or a rename must come
    /// before any change to its object). So the drive is not read, which spares an overwrite its lookup.
    async fn object_to_replace(&mut self, coll: &SetColl<S::Coll>, name: &[u8]) -> StoreResult<usize> {
        if self.logged || self.index.contains_key(&(coll.name.clone(), name.to_vec())) {
            return self.object(coll, name).await;
        }
        let coll = self.current_coll(coll).await?;
        Ok(self.add_object(&coll, name, None, 0, 0, false))
    }

    /// The collection's handles as this transaction uses them, taken on first use.
    async fn current_coll(&mut self, coll: &SetColl<S::Coll>) -> StoreResult<SetColl<S::Coll>> {
        if !self.colls.contains_key(&coll.name) {
            let mut current = self.set.current(coll).await?;
            // A present drive that lacks the collection (one that missed its creation, as a drive being
            // filled by a move can) gets it before it is written: else it could not take its shard and a
            // set whose write quorum is every drive (1+1) would refuse every write until a heal scan ran.
            if current.members.iter().enumerate().any(|(d, c)| c.is_none() && self.set.member(d).is_some()) {
                current = crate::heal::ensure_collection(self.set, current).await;
            }
            self.colls.insert(coll.name.clone(), current);
        }
        Ok(self.colls[&coll.name].clone())
    }

    /// Starts the transaction's work on an object as the drives left it; returns its index.
    fn add_object(
        &mut self,
        coll: &SetColl<S::Coll>,
        name: &[u8],
        before: Option<ObjectLayout>,
        holders: u16,
        present_on: u16,
        before_priority: bool,
    ) -> usize {
        debug_assert!(!self.index.contains_key(&(coll.name.clone(), name.to_vec())), "an object is added once");
        debug_assert!(before.is_some() || holders == 0, "an absent object has no holders");
        let w = ObjWork {
            coll: coll.name.clone(),
            name: name.to_vec(),
            before,
            holders,
            present_on,
            now: before,
            participants: if before.is_some() { holders } else { Self::coll_drives(coll) },
            changed: false,
            replaced: false,
            changed_attrs: BTreeSet::new(),
            changed_tag: false,
            changed_priority: false,
            saved: HashMap::new(),
            before_priority,
            appended_tail: Vec::new(),
            renamed_to: None,
            renamed_onto: false,
        };
        self.objects.push(w);
        let i = self.objects.len() - 1;
        self.index.insert((coll.name.clone(), name.to_vec()), i);
        i
    }

    fn coll_of(&self, o: usize) -> SetColl<S::Coll> {
        self.colls[&self.objects[o].coll].clone()
    }

    fn push(&mut self, d: usize, o: Option<usize>, op: DriveOp<S>) {
        self.ops[d].push((o, op));
    }

    /// Before the object is replaced (reset, created over, removed, cloned onto): every drive that holds it
    /// moves it aside into its undo log, and every drive takes part.
    fn replace(&mut self, o: usize) {
        let coll = self.coll_of(o);
        let w = &self.objects[o];
        if w.replaced {
            return;
        }
        let all = Self::coll_drives(&coll);
        let present = w.present_on;
        let name = w.name.clone();
        for d in mask_iter(all) {
            if !self.logged || self.objects[o].saved.contains_key(&d) {
                continue;
            }
            let Some(undo) = self.set.undo_coll(d) else { continue };
            let Some(c) = coll.members[d].clone() else { continue };
            let entry = self.next_entry;
            self.next_entry += 1;
            let entry_obj = entry_name(&self.write_id, entry);
            let saved = if present & (1 << d) != 0 {
                self.push(d, Some(o), Op::Rename { coll: c, from: name.clone(), to_coll: undo, to: entry_obj });
                Saved::Moved
            } else {
                self.push(d, Some(o), Op::Create { coll: undo, name: entry_obj });
                Saved::Created
            };
            self.objects[o].saved.insert(d, (entry, saved));
        }
        let w = &mut self.objects[o];
        w.participants = all;
        w.replaced = true;
        w.present_on = 0;
    }

    /// Before bytes of the object are overwritten in place on drives `mask` (its tail holders, when the
    /// tail is encoded): each clones it into its undo log, so that an undo puts those bytes back.
    fn copy_aside(&mut self, o: usize, mask: u16) {
        if !self.logged || self.objects[o].replaced {
            return;
        }
        let coll = self.coll_of(o);
        let name = self.objects[o].name.clone();
        for d in mask_iter(mask & self.objects[o].participants) {
            if self.objects[o].saved.contains_key(&d) {
                continue;
            }
            let (Some(undo), Some(c)) = (self.set.undo_coll(d), coll.members[d].clone()) else { continue };
            let entry = self.next_entry;
            self.next_entry += 1;
            let to = entry_name(&self.write_id, entry);
            self.push(d, Some(o), Op::Clone { coll: c, from: name.clone(), to_coll: undo, to });
            self.objects[o].saved.insert(d, (entry, Saved::Copied));
        }
    }

    /// Ops that start a fresh, empty object on every participant (a reset: unlogged, with one drive, the
    /// old object may still be there).
    fn start_fresh(&mut self, o: usize) {
        self.replace(o);
        let name = self.objects[o].name.clone();
        self.each_participant(o, |c, n| Op::Reset { coll: c, name: n });
        let layout = self.empty_layout(&name);
        self.objects[o].now = Some(layout);
    }

    fn require(&self, op: usize, o: usize) -> StoreResult<ObjectLayout> {
        self.objects[o]
            .now
            .ok_or_else(|| StoreError::not_found(format!("object {}", self.objects[o].name.escape_ascii())).in_op(op))
    }

    /// Appends `data` to the object's tail (on its holders), starting the tail if it has none.
    fn append_tail(&mut self, op: usize, o: usize, data: Vec<u8>) -> StoreResult<()> {
        let coll = self.coll_of(o);
        let mut l = self.require(op, o)?;
        if l.tail_bytes() == 0 {
            // m + 1 copies survive m failures; a small object is one such tail (more copies would only
            // multiply every small PUT's bytes, and a GET reads one holder either way).
            l.tail_holders = self.g.tail_holders(l.rotation as usize);
        }
        let at = l.shard_bytes() + l.tail_bytes();
        let name = self.objects[o].name.clone();
        for d in mask_iter(self.objects[o].participants & l.tail_holders) {
            let Some(c) = coll.members[d].clone() else { continue };
            self.push(d, Some(o), Op::Write { coll: c, name: name.clone(), offset: at, data: data.clone() });
        }
        l.size_bytes += data.len() as u64;
        l.write_id = self.write_id;
        l.mtime_ns = self.now_ns;
        let w = &mut self.objects[o];
        w.now = Some(l);
        if w.appended_tail.len() < self.set.cfg.max_op_data_bytes as usize {
            w.appended_tail.extend_from_slice(&data);
        }
        Ok(())
    }

    /// The object's tail as the operations so far left it: the part from before this transaction (read
    /// from a holder) and the bytes it appended.
    async fn current_tail(&self, o: usize) -> StoreResult<Vec<u8>> {
        let w = &self.objects[o];
        let tail = w.now.map_or(0, |n| n.tail_bytes());
        let appended = w.appended_tail.len() as u64;
        if appended > tail {
            return Err(StoreError::internal("more bytes appended to the tail than it holds"));
        }
        let mut bytes = Vec::with_capacity(tail as usize);
        let before_tail = tail - appended;
        if before_tail > 0 {
            let b = w.before.ok_or_else(|| StoreError::internal("a tail from before the transaction"))?;
            let read = self.read_tail(o, b).await?;
            if (read.len() as u64) < before_tail {
                return Err(StoreError::internal("the tail from before the transaction is shorter than it was"));
            }
            bytes.extend_from_slice(&read[read.len() - before_tail as usize..]);
        }
        bytes.extend_from_slice(&w.appended_tail);
        if bytes.len() as u64 != tail {
            return Err(StoreError::internal("the tail's bytes do not add up"));
        }
        Ok(bytes)
    }

    /// Encodes the whole stripes at the start of an object's tail: they are cut into shards, staged, and
    /// take the tail's place on every drive (its holders first keep a copy for the undo log); the rest of
    /// the tail (less than a stripe) stays on the same holders after them. With `whole_only`, a tail that
    /// is not whole stripes is an error (stripes are about to follow it). With `keep_time` the object's
    /// time stays (lazy sync changes how bytes are kept, not the object).
    async fn encode_tail(&mut self, i: usize, o: usize, whole_only: bool, keep_time: bool) -> StoreResult<u64> {
        let l = self.require(i, o)?;
        let (tail, stripe) = (l.tail_bytes(), self.g.stripe_bytes());
        if whole_only && !tail.is_multiple_of(stripe) {
            return Err(bad(i, "stripes follow an object's tail only when it is whole stripes"));
        }
        let whole = tail / stripe * stripe;
        if whole == 0 {
            return Ok(0);
        }
        let bytes = self.current_tail(o).await.map_err(|e| e.in_op(i))?;
        let (head, rest) = bytes.split_at(whole as usize);
        let name = self.objects[o].name.clone();
        let buf = AlignedBuf::copy_of(head);
        // Stripes already encoded fix the object's code; a tail alone is encoded with the set's current one.
        let codec = if l.encoded_bytes == 0 { self.set.cfg.write_codec() } else { l.codec };
        let (staged, _) =
            stage_at(self.set, buf, head.len(), l.rotation as usize, codec, &name).await.map_err(|e| e.in_op(i))?;
        // Holders drop the tail's bytes; then every drive takes its shard where the tail began.
        self.copy_aside(o, l.tail_holders);
        let coll = self.coll_of(o);
        let at = l.shard_bytes();
        for d in mask_iter(self.objects[o].participants & l.tail_holders) {
            if let Some(c) = coll.members[d].clone() {
                self.push(d, Some(o), Op::Truncate { coll: c, name: name.clone(), size_bytes: at });
            }
        }
        let mut encoded = l;
        encoded.size_bytes = l.encoded_bytes;
        encoded.tail_holders = 0;
        self.objects[o].now = Some(encoded);
        self.objects[o].appended_tail.clear();
        self.write_staged(i, o, encoded.encoded_bytes, staged)?;
        if !rest.is_empty() {
            self.append_tail(i, o, rest.to_vec())?;
        }
        let mut after = self.require(i, o)?;
        debug_assert_eq!(after.size_bytes, l.size_bytes, "encoding a tail keeps the object's bytes");
        debug_assert_eq!(after.encoded_bytes, l.encoded_bytes + whole);
        if keep_time {
            after.mtime_ns = l.mtime_ns;
            self.objects[o].now = Some(after);
        }
        Ok(whole)
    }

    /// With tails encoded on the request path (the ablation of lazy sync), encodes the whole stripes an
    /// append left in the tail before the write is acknowledged.
    async fn encode_on_request(&mut self, i: usize, o: usize) -> StoreResult<()> {
        if self.set.cfg.lazy_encode_min_bytes == 0 {
            self.encode_tail(i, o, false, false).await?;
        }
        Ok(())
    }

    async fn op(&mut self, i: usize, op: Op<SetColl<S::Coll>, SetStaged<S::Staged>>) -> StoreResult<()> {
        if self.renamed_any
            && changed_by(&op).iter().any(|n| self.index.get(n).is_some_and(|&o| self.objects[o].renamed_onto))
        {
            return Err(bad(i, "an object renamed onto in a transaction takes no further operations in it"));
        }
        match op {
            Op::CreateCollection { name } => self.create_collection(i, name).await,
            Op::RemoveCollection { name } => self.remove_collection(i, name).await,
            Op::Create { coll, name } => {
                let o = self.object(&coll, &name).await?;
                if self.objects[o].now.is_some() {
                    return Err(StoreError::new(ErrorKind::AlreadyExists, "the object exists").in_op(i));
                }
                self.start_fresh(o);
                Ok(())
            }
            Op::Reset { coll, name } => {
                let o = self.object_to_replace(&coll, &name).await?;
                self.start_fresh(o);
                Ok(())
            }
            Op::Write { coll, name, offset, data } => {
                let o = self.object(&coll, &name).await?;
                if self.objects[o].now.is_none() {
                    self.start_fresh(o);
                }
                if data.len() as u64 > self.set.cfg.max_op_data_bytes {
                    return Err(StoreError::new(ErrorKind::Limit, "too much data in one write").in_op(i));
                }
                let size = self.require(i, o)?.size_bytes;
                if offset != size {
                    return Err(bad(i, format!("an erasure set writes at an object's end ({size}), not at {offset}")));
                }
                self.append_tail(i, o, data)?;
                self.encode_on_request(i, o).await
            }
            Op::Append { coll, name, data, expected_offset } => {
                let o = self.object(&coll, &name).await?;
                if self.objects[o].now.is_none() {
                    self.start_fresh(o);
                }
                let size = self.require(i, o)?.size_bytes;
                if let Some(expected) = expected_offset
                    && expected != size
                {
                    return Err(StoreError::new(
                        ErrorKind::OffsetMismatch,
                        format!("the object has {size} bytes, not {expected}"),
                    )
                    .in_op(i));
                }
                self.append_tail(i, o, data)?;
                self.outcome.append_sizes.push(size + self.objects[o].now.map_or(0, |l| l.size_bytes - size));
                self.encode_on_request(i, o).await
            }
            Op::WriteStaged { coll, name, offset, staged } => {
                let o = self.object(&coll, &name).await?;
                if self.objects[o].now.is_none() {
                    self.start_fresh(o);
                }
                self.encode_tail(i, o, true, false).await?;
                self.write_staged(i, o, offset, staged)
            }
            Op::Remove { coll, name } => {
                let o = self.object(&coll, &name).await?;
                self.require(i, o)?;
                // What this transaction made there is removed by the drives; what was there before is
                // moved aside into the undo log (the removal itself) when the drives keep one.
                let made_here = self.objects[o].replaced;
                self.replace(o);
                let c = self.coll_of(o);
                let name = self.objects[o].name.clone();
                if !self.logged || made_here {
                    for d in mask_iter(self.objects[o].participants) {
                        if let Some(cd) = c.members[d].clone() {
                            self.push(d, Some(o), Op::Remove { coll: cd, name: name.clone() });
                        }
                    }
                }
                self.objects[o].now = None;
                Ok(())
            }
            Op::Clone { coll, from, to_coll, to } => self.clone_object(i, coll, from, to_coll, to).await,
            Op::CloneRange { src_coll, src, src_offset, len, dst_coll, dst, dst_offset } => {
                self.clone_range(i, src_coll, src, src_offset, len, dst_coll, dst, dst_offset).await
            }
            Op::SetAttr { coll, name, key, value } => {
                let k = key.clone();
                self.attr_op(i, coll, name, key, move |c, n| Op::SetAttr {
                    coll: c,
                    name: n,
                    key: k.clone(),
                    value: value.clone(),
                })
                .await
            }
            Op::RemoveAttr { coll, name, key } => {
                let k = key.clone();
                self.attr_op(i, coll, name, key, move |c, n| Op::RemoveAttr { coll: c, name: n, key: k.clone() }).await
            }
            Op::SetNameTag { coll, name, tag } => {
                let o = self.object(&coll, &name).await?;
                self.require(i, o)?;
                self.objects[o].changed_tag = true;
                self.each_participant(o, |c, n| Op::SetNameTag { coll: c, name: n, tag: tag.clone() });
                Ok(())
            }
            Op::SetPriority { coll, name, high } => {
                let o = self.object(&coll, &name).await?;
                self.require(i, o)?;
                self.objects[o].changed_priority = true;
                self.each_participant(o, |c, n| Op::SetPriority { coll: c, name: n, high });
                Ok(())
            }
            Op::AssertAttr { coll, name, key, expected } => self.assert_attr(i, coll, name, key, expected).await,
            Op::AssertExists { coll, name } => {
                let o = self.object(&coll, &name).await?;
                if self.objects[o].now.is_none() {
                    return Err(StoreError::new(ErrorKind::AssertionFailed, "the object does not exist").in_op(i));
                }
                Ok(())
            }
            Op::Rename { coll, from, to_coll, to } => self.rename(i, coll, from, to_coll, to).await,
            Op::Truncate { .. } => Err(bad(i, "truncation is not an operation of an erasure set")),
        }
    }

    fn each_participant(&mut self, o: usize, make: impl Fn(S::Coll, Vec<u8>) -> DriveOp<S>) {
        let coll = self.coll_of(o);
        let name = self.objects[o].name.clone();
        for d in mask_iter(self.objects[o].participants) {
            if let Some(c) = coll.members[d].clone() {
                self.push(d, Some(o), make(c, name.clone()));
            }
        }
    }

    async fn attr_op(
        &mut self,
        i: usize,
        coll: SetColl<S::Coll>,
        name: Vec<u8>,
        key: Vec<u8>,
        make: impl Fn(S::Coll, Vec<u8>) -> DriveOp<S>,
    ) -> StoreResult<()> {
        let o = self.object(&coll, &name).await?;
        self.require(i, o)?;
        if key == LAYOUT_ATTR || key == UNDO_ATTR {
            return Err(bad(i, "the attribute is the erasure set's own"));
        }
        self.objects[o].changed_attrs.insert(key);
        self.each_participant(o, make);
        Ok(())
    }

    async fn assert_attr(
        &mut self,
        i: usize,
        coll: SetColl<S::Coll>,
        name: Vec<u8>,
        key: Vec<u8>,
        expected: Option<Vec<u8>>,
    ) -> StoreResult<()> {
        let o = self.object(&coll, &name).await?;
        let w = &self.objects[o];
        if w.replaced || !w.changed_attrs.is_empty() || w.now != w.before {
            return Err(bad(i, "an assertion comes before the changes to its object"));
        }
        let actual = match w.before {
            None => None,
            Some(_) => self.read_attr(o, &key).await?,
        };
        if actual != expected {
            return Err(StoreError::new(ErrorKind::AssertionFailed, "the attribute differs").in_op(i));
        }
        Ok(())
    }

    /// An attribute of the object's current version, from one of its holders.
    async fn read_attr(&self, o: usize, key: &[u8]) -> StoreResult<Option<Vec<u8>>> {
        let w = &self.objects[o];
        let coll = &self.colls[&w.coll];
        let mut last = None;
        for d in mask_iter(w.holders) {
            let (Some(store), Some(c)) = (self.set.member(d), &coll.members[d]) else { continue };
            let snap = store.snapshot();
            match snap.lookup(c, &w.name).await {
                Ok(Some(info)) => match snap.attr(&info.obj, key).await {
                    Ok(v) => return Ok(v),
                    Err(e) => last = Some(e),
                },
                Ok(None) => {}
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| StoreError::unavailable("no drive holding the object answered")))
    }

    fn write_staged(&mut self, i: usize, o: usize, offset: u64, staged: SetStaged<S::Staged>) -> StoreResult<()> {
        let mut l = self.require(i, o)?;
        if offset != l.size_bytes || l.tail_bytes() != 0 {
            return Err(bad(
                i,
                format!("stripes are written at the end of the encoded part ({}), not at {offset}", l.encoded_bytes),
            ));
        }
        if l.encoded_bytes == 0 {
            l.rotation = staged.rotation as u8;
            l.codec = staged.codec;
        } else if l.rotation as usize != staged.rotation {
            return Err(bad(i, "the stripes were staged for an object placed differently"));
        } else if l.codec != staged.codec {
            return Err(bad(
                i,
                format!(
                    "the stripes were encoded with erasure code {} and the object with code {}: an object \
                     is never of two codes (rewrite it whole to change its code)",
                    staged.codec, l.codec
                ),
            ));
        }
        let coll = self.coll_of(o);
        let name = self.objects[o].name.clone();
        let at = l.shard_bytes();
        let mut participants = self.objects[o].participants;
        for (d, shard) in staged.shards.into_iter().enumerate() {
            if participants & (1 << d) == 0 {
                continue;
            }
            match (shard, coll.members[d].clone()) {
                (Some(st), Some(c)) => {
                    self.push(d, Some(o), Op::WriteStaged { coll: c, name: name.clone(), offset: at, staged: st })
                }
                // The drive has no shard: it cannot hold this version (it is healed later).
                _ => participants &= !(1 << d),
            }
        }
        self.objects[o].participants = participants;
        l.encoded_bytes += staged.len_bytes;
        l.size_bytes += staged.len_bytes;
        l.write_id = self.write_id;
        l.mtime_ns = self.now_ns;
        self.objects[o].now = Some(l);
        Ok(())
    }

    async fn clone_object(
        &mut self,
        i: usize,
        coll: SetColl<S::Coll>,
        from: Vec<u8>,
        to_coll: SetColl<S::Coll>,
        to: Vec<u8>,
    ) -> StoreResult<()> {
        let s = self.object(&coll, &from).await?;
        let src = self.require(i, s)?;
        let t = self.object(&to_coll, &to).await?;
        if s == t {
            return Ok(());
        }
        self.replace(t);
        // The handles as the planner refreshed them (an operation's may predate an attached drive).
        let (coll, to_coll) = (self.coll_of(s), self.coll_of(t));
        let (src_parts, name_from) = (self.objects[s].participants, from);
        let mut parts = self.objects[t].participants & src_parts;
        for d in mask_iter(parts) {
            match (coll.members[d].clone(), to_coll.members[d].clone()) {
                (Some(c), Some(tc)) => {
                    self.push(d, Some(t), Op::Clone { coll: c, from: name_from.clone(), to_coll: tc, to: to.clone() })
                }
                _ => parts &= !(1 << d),
            }
        }
        self.objects[t].participants = parts;
        self.objects[t].now = Some(ObjectLayout { write_id: self.write_id, mtime_ns: self.now_ns, ..src });
        Ok(())
    }

    /// Renames an object to another name of its collection: each drive holding its version moves the name
    /// (no byte of it is read or written, no block reference changes). The source must be as the
    /// transaction found it, the destination untouched by it. Where the destination exists it is moved
    /// aside first; the source's entry renames it back, before the destination's entry (if any) puts the
    /// old destination back.
    async fn rename(
        &mut self,
        i: usize,
        coll: SetColl<S::Coll>,
        from: Vec<u8>,
        to_coll: SetColl<S::Coll>,
        to: Vec<u8>,
    ) -> StoreResult<()> {
        if coll.name != to_coll.name {
            return Err(bad(i, "an erasure set renames within a collection"));
        }
        let s = self.object(&coll, &from).await?;
        let src = self.require(i, s)?;
        let t = self.object(&to_coll, &to).await?;
        if s == t {
            return Ok(());
        }
        if !self.untouched(s) || !self.untouched(t) {
            return Err(bad(i, "a rename comes before any other change to its source and destination"));
        }
        let c = self.coll_of(s);
        // Drives holding the source's version, able to log the rename where the set keeps an undo log.
        let parts = mask_iter(self.objects[s].holders & Self::coll_drives(&c))
            .filter(|&d| !self.logged || self.set.undo_coll(d).is_some())
            .fold(0u16, |m, d| m | 1 << d);
        let dest_present = self.objects[t].present_on;
        for d in mask_iter(parts) {
            let Some(cd) = c.members[d].clone() else { continue };
            if let Some(undo) = self.set.undo_coll(d).filter(|_| self.logged) {
                // The destination, where it is, goes aside (its entry restores it after the rename back).
                let dest_saved = if dest_present & (1 << d) != 0 {
                    let entry = self.take_entry();
                    let to_entry = entry_name(&self.write_id, entry);
                    self.push(
                        d,
                        Some(s),
                        Op::Rename { coll: cd.clone(), from: to.clone(), to_coll: undo.clone(), to: to_entry },
                    );
                    (entry, Saved::Moved)
                } else {
                    (u32::MAX, Saved::RenamedOnto)
                };
                self.objects[t].saved.insert(d, dest_saved);
                let entry = self.take_entry();
                self.push(d, Some(s), Op::Create { coll: undo, name: entry_name(&self.write_id, entry) });
                self.objects[s].saved.insert(d, (entry, Saved::RenamedAway));
            }
            self.push(d, Some(s), Op::Rename { coll: cd.clone(), from: from.clone(), to_coll: cd, to: to.clone() });
        }
        // Drives where the source's version is not (stale or absent) keep what they hold aside, as for any
        // replacement; the destination is left alone there (healed later).
        self.replace(s);
        self.objects[s].now = None;
        self.objects[s].renamed_to = Some(t);
        let w = &mut self.objects[t];
        w.participants = parts;
        w.replaced = true;
        w.present_on = 0;
        w.renamed_onto = true;
        w.now = Some(src);
        self.renamed_any = true;
        Ok(())
    }

    /// Before the transaction's operations are planned, for an object whose first of them (asserts aside)
    /// only the drives holding its version take (a rename, a change in place): where those are too few for
    /// the write to be durable under rule `kept` (a drive missed it and heal has not come yet; with k = m a
    /// single missing drive does it), the object is rebuilt on the others now, under the write's `locks`,
    /// and read again. Else the write would be refused until heal reached the object: a versioned
    /// overwrite on a 1+1 set, for one. An object past `SetConfig::rebuild_on_write_max_bytes` is only
    /// queued for heal (the write is then refused).
    async fn rebuild_if_short(
        &mut self,
        coll: &SetColl<S::Coll>,
        name: &[u8],
        kept: Option<u16>,
        locks: &mut crate::locks::Exclusive,
    ) -> StoreResult<()> {
        if self.index.contains_key(&(coll.name.clone(), name.to_vec())) {
            return Ok(());
        }
        let o = self.object(coll, name).await?;
        let w = &self.objects[o];
        let Some(layout) = w.before else { return Ok(()) };
        if self.set.cfg.write_is_durable(w.holders, kept) {
            return Ok(());
        }
        if layout.size_bytes > self.set.cfg.rebuild_on_write_max_bytes {
            self.set.queue_heal(&coll.name, name);
            return Ok(());
        }
        let c = self.coll_of(o);
        let healed = crate::heal::heal_locked(self.set, &c, name, locks, crate::heal::Urgency::Foreground).await?;
        tracing::debug!(object = %name.escape_ascii(), ?healed, "rebuilt an object short of a write quorum before a write");
        // Read again by the operation: the object was the last one read and nothing has changed it.
        assert_eq!(o + 1, self.objects.len(), "the object was read just now");
        assert!(self.untouched(o), "a rebuilt object is read again before any change");
        self.objects.pop();
        self.index.remove(&(coll.name.clone(), name.to_vec()));
        Ok(())
    }

    /// Whether the transaction has done nothing to the object so far.
    fn untouched(&self, o: usize) -> bool {
        let w = &self.objects[o];
        !w.replaced
            && w.now == w.before
            && w.changed_attrs.is_empty()
            && !w.changed_tag
            && !w.changed_priority
            && w.saved.is_empty()
            && w.renamed_to.is_none()
            && !w.renamed_onto
    }

    /// The index of a new undo entry of this write.
    fn take_entry(&mut self) -> u32 {
        let entry = self.next_entry;
        self.next_entry += 1;
        entry
    }

    #[allow(clippy::too_many_arguments)]
    async fn clone_range(
        &mut self,
        i: usize,
        src_coll: SetColl<S::Coll>,
        src: Vec<u8>,
        src_offset: u64,
        len: u64,
        dst_coll: SetColl<S::Coll>,
        dst: Vec<u8>,
        dst_offset: u64,
    ) -> StoreResult<()> {
        let s = self.object(&src_coll, &src).await?;
        let sl = self.require(i, s)?;
        let t = self.object(&dst_coll, &dst).await?;
        let (src_coll, dst_coll) = (self.coll_of(s), self.coll_of(t));
        if self.objects[t].now.is_none() {
            self.start_fresh(t);
        }
        if len >= self.g.stripe_bytes() {
            self.encode_tail(i, t, true, false).await?;
        }
        let mut dl = self.require(i, t)?;
        let stripe = self.g.stripe_bytes();
        let whole = len / stripe * stripe;
        if src_offset != 0 || dst_offset != dl.size_bytes || dl.tail_bytes() != 0 || len > sl.size_bytes {
            return Err(bad(i, "an erasure set clones ranges from an object's start onto another's end"));
        }
        if whole > sl.encoded_bytes || (len != whole && len != sl.size_bytes) {
            return Err(bad(i, "a cloned range is whole stripes, or a whole object"));
        }
        if whole > 0 {
            if dl.encoded_bytes == 0 {
                dl.rotation = sl.rotation;
                dl.codec = sl.codec;
            } else if dl.rotation != sl.rotation {
                return Err(bad(i, "the source is placed differently from the destination"));
            } else if dl.codec != sl.codec {
                return Err(bad(
                    i,
                    format!(
                        "the source is of erasure code {} and the destination of code {}: an object is never \
                         of two codes",
                        sl.codec, dl.codec
                    ),
                ));
            }
            let shard_len = whole / self.g.data as u64;
            let at = dl.shard_bytes();
            let mut parts = self.objects[t].participants & self.objects[s].participants;
            for d in mask_iter(parts) {
                match (src_coll.members[d].clone(), dst_coll.members[d].clone()) {
                    (Some(sc), Some(dc)) => self.push(
                        d,
                        Some(t),
                        Op::CloneRange {
                            src_coll: sc,
                            src: src.clone(),
                            src_offset: 0,
                            len: shard_len,
                            dst_coll: dc,
                            dst: dst.clone(),
                            dst_offset: at,
                        },
                    ),
                    _ => parts &= !(1 << d),
                }
            }
            self.objects[t].participants = parts;
            dl.encoded_bytes += whole;
            dl.size_bytes += whole;
            dl.write_id = self.write_id;
            dl.mtime_ns = self.now_ns;
            self.objects[t].now = Some(dl);
        }
        if len > whole {
            // The source's tail (less than a stripe) becomes the destination's: read from a holder.
            let tail = self.read_tail(s, sl).await?;
            self.append_tail(i, t, tail)?;
        }
        Ok(())
    }

    async fn read_tail(&self, o: usize, l: ObjectLayout) -> StoreResult<Vec<u8>> {
        let w = &self.objects[o];
        let coll = &self.colls[&w.coll];
        let mut last = None;
        for d in mask_iter(w.holders & l.tail_holders) {
            let (Some(store), Some(c)) = (self.set.member(d), &coll.members[d]) else { continue };
            let snap = store.snapshot();
            let Ok(Some(info)) = snap.lookup(c, &w.name).await else { continue };
            match snap.read(&info.obj, l.shard_bytes(), l.tail_bytes()).await {
                Ok(b) if b.len() as u64 == l.tail_bytes() => return Ok(b.to_vec()),
                Ok(_) => last = Some(StoreError::corrupt("a short tail")),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| StoreError::unavailable("no drive holding the object's tail answered")))
    }

    async fn create_collection(&mut self, i: usize, name: String) -> StoreResult<()> {
        let found = self.collection_states(&name).await;
        let present = found.iter().filter(|s| **s == Some(true)).count();
        if present >= self.g.read_quorum() {
            return Err(StoreError::new(ErrorKind::CollectionExists, format!("collection {name} exists")).in_op(i));
        }
        let mut parts = 0u16;
        for (d, state) in found.iter().enumerate() {
            match state {
                Some(false) => {
                    self.push(d, None, Op::CreateCollection { name: name.clone() });
                    parts |= 1 << d;
                }
                // A drive that has it already (it missed the removal) counts as done.
                Some(true) => parts |= 1 << d,
                None => {}
            }
        }
        self.coll_participants.push((name, parts));
        Ok(())
    }

    async fn remove_collection(&mut self, i: usize, name: String) -> StoreResult<()> {
        let snap = crate::read::SetSnapshot::new(self.set.clone());
        let Some(coll) = snap.collection(&name).await.map_err(|e| e.in_op(i))? else {
            return Err(StoreError::new(ErrorKind::CollectionNotFound, format!("no collection {name}")).in_op(i));
        };
        if !snap.list_entries(&coll, b"", b"", 1).await.map_err(|e| e.in_op(i))?.is_empty() {
            return Err(
                StoreError::new(ErrorKind::CollectionNotEmpty, format!("collection {name} is not empty")).in_op(i)
            );
        }
        let mut parts = 0u16;
        for (d, c) in coll.members.iter().enumerate() {
            if c.is_some() && self.set.member(d).is_some() {
                self.push(d, None, Op::RemoveCollection { name: name.clone() });
                parts |= 1 << d;
            }
        }
        self.coll_participants.push((name, parts));
        Ok(())
    }

    /// Per drive: whether it has the collection (None: it did not answer).
    async fn collection_states(&self, name: &str) -> Vec<Option<bool>> {
        let members = self.set.members();
        join_all(members.iter().map(|m| async move {
            let store = m.as_ref()?;
            store.snapshot().collection(name).await.ok().map(|c| c.is_some())
        }))
        .await
    }

    /// The per-drive transactions: each drive's ops for the objects it takes part in, the objects' new
    /// layouts, and its undo entries.
    /// `sent_to`: by slot, the incarnation of the drive each transaction goes to (the undo entries name
    /// them).
    async fn finish(mut self, sent_to: &[u64]) -> StoreResult<Finished<S>> {
        debug_assert_eq!(sent_to.len(), self.g.drives());
        let mut entries: Vec<Vec<(Vec<u8>, UndoEntry)>> = (0..self.g.drives()).map(|_| Vec::new()).collect();
        for o in 0..self.objects.len() {
            self.finish_object(o, &mut entries, sent_to).await?;
        }
        let mut txns = Vec::with_capacity(self.g.drives());
        for (d, ops) in std::mem::take(&mut self.ops).into_iter().enumerate() {
            let mut txn = Txn::new();
            for (obj, op) in ops {
                if obj.is_none_or(|o| self.objects[o].participants & (1 << d) != 0) {
                    txn.push(op);
                }
            }
            txns.push(txn);
        }
        Ok(Finished {
            txns,
            objects: self.objects,
            coll_participants: self.coll_participants,
            entries,
            outcome: self.outcome,
        })
    }

    /// The object's layout on its participants, and the undo entries that put it back.
    async fn finish_object(
        &mut self,
        o: usize,
        entries: &mut [Vec<(Vec<u8>, UndoEntry)>],
        sent_to: &[u64],
    ) -> StoreResult<()> {
        let coll = self.coll_of(o);
        let w = &self.objects[o];
        let touched =
            w.replaced || w.now != w.before || !w.changed_attrs.is_empty() || w.changed_tag || w.changed_priority;
        let (name, now, participants) = (w.name.clone(), w.now, w.participants);
        self.objects[o].changed = touched;
        if !touched {
            // Only asserted: no drive changes it.
            self.objects[o].participants = 0;
            return Ok(());
        }
        if let Some(l) = now {
            let raw = l.encode();
            for d in mask_iter(participants) {
                if let Some(c) = coll.members[d].clone() {
                    self.push(
                        d,
                        Some(o),
                        Op::SetAttr { coll: c, name: name.clone(), key: LAYOUT_ATTR.to_vec(), value: raw.clone() },
                    );
                }
            }
        }
        if !self.logged {
            return Ok(());
        }
        let target = now.map(|l| l.write_id);
        let revert = if self.objects[o].replaced { None } else { Some(self.revert_parts(o).await?) };
        // A copy kept in the undo log has no listing tag (a clone takes none): its entry carries it.
        let copied = self.objects[o].saved.values().any(|(_, s)| *s == Saved::Copied);
        let copied_tag = if copied { self.read_tag(o).await? } else { None };
        // A renamed object's entry renames back the destination as this write leaves it.
        let renamed = self.objects[o].renamed_to.map(|t| {
            let dest = &self.objects[t];
            let now = dest.now.expect("an object renamed onto takes no other operation, so it is there");
            (dest.name.clone(), now.write_id)
        });
        for d in mask_iter(participants) {
            let Some(undo) = self.set.undo_coll(d) else { continue };
            let (action, index) = match (&revert, self.objects[o].saved.get(&d).copied()) {
                (_, Some((_, Saved::RenamedOnto))) => continue,
                (_, Some((index, Saved::RenamedAway))) => {
                    let (from, from_target) = renamed.clone().expect("a renamed object knows its destination");
                    (UndoAction::RenameBack { from, from_target }, index)
                }
                (_, Some((index, Saved::Copied))) => (UndoAction::RestoreCopy { tag: copied_tag.clone() }, index),
                (None, Some((index, Saved::Moved))) => (UndoAction::Restore, index),
                (None, Some((index, Saved::Created))) => (UndoAction::RemoveCreated, index),
                (None, None) => (UndoAction::RemoveCreated, self.new_entry(d, &undo)),
                (Some((before, attrs, tag, priority)), _) => {
                    // A drive truncates to its own old size: a tail holder's includes the tail.
                    let old_size = before.drive_object_bytes(d);
                    let action =
                        UndoAction::Revert { old_size, attrs: attrs.clone(), tag: tag.clone(), priority: *priority };
                    (action, self.new_entry(d, &undo))
                }
            };
            let entry = UndoEntry {
                coll: coll.name.to_string(),
                name: name.clone(),
                target,
                action,
                sent_to: Some(sent_to.to_vec()),
            };
            let raw = entry.encode();
            if raw.len() > UNDO_ENTRY_MAX_BYTES {
                return Err(StoreError::new(
                    ErrorKind::Limit,
                    "an object's attributes are too large to change at once",
                ));
            }
            let entry_obj = entry_name(&self.write_id, index);
            self.push(
                d,
                Some(o),
                Op::SetAttr { coll: undo, name: entry_obj.clone(), key: UNDO_ATTR.to_vec(), value: raw },
            );
            entries[d].push((entry_obj, entry));
        }
        Ok(())
    }

    /// A fresh entry object on drive `d` (for objects changed in place or created).
    fn new_entry(&mut self, d: usize, undo: &S::Coll) -> u32 {
        let index = self.next_entry;
        self.next_entry += 1;
        self.push(d, None, Op::Create { coll: undo.clone(), name: entry_name(&self.write_id, index) });
        index
    }

    /// What puts an object changed in place back: its old layout, and the attributes, tag and priority the
    /// transaction changed, as they were.
    #[allow(clippy::type_complexity)]
    async fn revert_parts(
        &self,
        o: usize,
    ) -> StoreResult<(ObjectLayout, Vec<(Vec<u8>, Option<Vec<u8>>)>, Option<Vec<u8>>, bool)> {
        let w = &self.objects[o];
        let before = w.before.expect("an object changed in place existed");
        let mut attrs = vec![(LAYOUT_ATTR.to_vec(), Some(before.encode()))];
        for k in &w.changed_attrs {
            attrs.push((k.clone(), self.read_attr(o, k).await?));
        }
        let tag = if w.changed_tag { self.read_tag(o).await? } else { None };
        Ok((before, attrs, tag, w.before_priority))
    }

    async fn read_tag(&self, o: usize) -> StoreResult<Option<Vec<u8>>> {
        let w = &self.objects[o];
        let coll = &self.colls[&w.coll];
        for d in mask_iter(w.holders) {
            let (Some(store), Some(c)) = (self.set.member(d), &coll.members[d]) else { continue };
            if let Ok(list) = store.snapshot().list_entries(c, &w.name, &w.name, 1).await {
                return Ok(list.into_iter().next().filter(|e| e.name == w.name).and_then(|e| e.tag));
            }
        }
        Err(StoreError::unavailable("no drive holding the object answered"))
    }
}

struct Finished<S: Store> {
    txns: Vec<Txn<S::Coll, S::Staged>>,
    objects: Vec<ObjWork>,
    coll_participants: Vec<(String, u16)>,
    entries: Vec<Vec<(Vec<u8>, UndoEntry)>>,
    outcome: Outcome,
}

/// What a set transaction does: a store transaction's operations, or (in the background) the lazy sync
/// of one object's tail.
enum Plan<S: Store> {
    Ops(Vec<SetOp<S>>),
    EncodeTail { coll: SetColl<S::Coll>, name: Vec<u8> },
}

/// Applies a logical transaction on the set (see the module comment).
/// `kept`: the kept drives' rule the write is under (`SetConfig::kept_drives`), None for none.
pub(crate) async fn commit<S: Store>(
    set: &Arc<SetInner<S>>,
    txn: SetTxn<S>,
    kept: Option<u16>,
) -> StoreResult<Outcome> {
    commit_locked(set, txn, kept).await.map(|(outcome, _locks)| outcome)
}

/// `commit`, with its objects' locks still held when it returns: what must follow the write before any
/// other writer or heal of those objects acts (`SetConfig::removal_follower`) runs under them.
pub(crate) async fn commit_locked<S: Store>(
    set: &Arc<SetInner<S>>,
    txn: SetTxn<S>,
    kept: Option<u16>,
) -> StoreResult<(Outcome, crate::locks::Exclusive)> {
    set.check_alive()?;
    let _foreground = set.foreground();
    let names: Vec<(Arc<str>, Vec<u8>)> = txn.ops.iter().flat_map(touched).collect();
    let mut locks = crate::locks::Exclusive::take(set, names.iter().map(|(c, n)| (&**c, n.as_slice()))).await?;
    let outcome = apply(set, &mut locks, Plan::Ops(txn.ops), kept).await?;
    Ok((outcome, locks))
}

/// Encodes the whole stripes of an object's tail (lazy sync, paper 001 carried to erasure coding): until
/// then an append only adds to the tail on its m + 1 holders, never re-reading or re-encoding a stripe on
/// the request path. Returns the bytes encoded (0 when the tail holds no whole stripe, or the object went).
pub(crate) async fn encode_tail_now<S: Store>(set: &Arc<SetInner<S>>, coll: &str, name: &[u8]) -> StoreResult<u64> {
    set.check_alive()?;
    let Some(c) = crate::SetSnapshot::new(set.clone()).collection(coll).await? else { return Ok(0) };
    let mut locks = crate::locks::Exclusive::take(set, std::iter::once((&*c.name, name))).await?;
    let before = set.progress.encoded_bytes.load(Ordering::Relaxed);
    // Always under the kept drives' rule: no follower arms it, and it has no client waiting.
    apply(set, &mut locks, Plan::EncodeTail { coll: c, name: name.to_vec() }, set.cfg.kept_drives).await?;
    Ok(set.progress.encoded_bytes.load(Ordering::Relaxed) - before)
}

/// Plans and commits `plan` under `locks`, the locks of every object it touches, and under the kept
/// drives' rule `kept` (None: none).
async fn apply<S: Store>(
    set: &Arc<SetInner<S>>,
    locks: &mut crate::locks::Exclusive,
    plan: Plan<S>,
    kept: Option<u16>,
) -> StoreResult<Outcome> {
    let mut planner = Planner::new(set);
    let mut encoded = 0;
    match plan {
        Plan::Ops(ops) => {
            for (coll, name) in holders_only_objects(&ops) {
                planner.rebuild_if_short(&coll, &name, kept, locks).await?;
            }
            for (i, op) in ops.into_iter().enumerate() {
                planner.op(i, op).await?;
            }
        }
        Plan::EncodeTail { coll, name } => {
            let o = planner.object(&coll, &name).await?;
            if planner.objects[o].now.is_none() {
                return Ok(Outcome::default());
            }
            encoded = planner.encode_tail(0, o, false, true).await?;
            if encoded == 0 {
                return Ok(Outcome::default());
            }
        }
    }
    let quorum = set.geometry().write_quorum();
    // The drives the transactions go to, taken once: the undo entries name them by incarnation.
    let sent: Vec<Option<(Arc<S>, u64)>> = (0..set.drives()).map(|d| set.member_incarnation(d)).collect();
    let sent_to: Vec<u64> = sent.iter().map(|m| m.as_ref().map_or(0, |(_, incarnation)| *incarnation)).collect();
    let f = planner.finish(&sent_to).await?;
    for w in f.objects.iter().filter(|w| w.changed) {
        if !set.cfg.write_is_durable(w.participants, kept) {
            return Err(StoreError::unavailable(format!(
                "{} drives can take object {}; {quorum} are needed{}",
                w.participants.count_ones(),
                w.name.escape_ascii(),
                kept_needed(&set.cfg, kept)
            )));
        }
    }
    locks.check_held()?;
    let results = commit_on_drives(set, &sent, f.txns, kept).await;
    let committed: u16 = results.iter().enumerate().filter(|(_, r)| r.is_ok()).fold(0, |m, (d, _)| m | 1 << d);
    // A test's simulated crash: the process stops here, before the outcome is settled on any drive.
    set.maybe_die()?;
    let enough = |parts: u16| set.cfg.write_is_durable(parts & committed, kept);
    let ok = f.objects.iter().filter(|w| w.changed).all(|w| enough(w.participants))
        && f.coll_participants.iter().all(|(_, p)| enough(*p));
    for (d, r) in results.iter().enumerate() {
        if let Err(e) = r {
            tracing::warn!(drive = d, error = %e, "a drive did not commit a write");
        }
    }
    if ok {
        // Objects that not every drive took: healed later.
        let all = set.geometry().all_drives();
        let missed: Vec<&ObjWork> =
            f.objects.iter().filter(|w| w.changed && w.participants & committed != all).collect();
        if !missed.is_empty() {
            set.counters.partial_writes.fetch_add(1, Ordering::Relaxed);
            for w in missed {
                set.queue_heal(&w.coll, &w.name);
            }
        }
        let cleanup: Vec<(usize, Vec<u8>)> = f
            .entries
            .into_iter()
            .enumerate()
            .filter(|(d, _)| committed & (1 << d) != 0)
            .flat_map(|(d, es)| es.into_iter().map(move |(n, _)| (d, n)))
            .collect();
        queue_cleanup(set, cleanup);
        set.progress.encoded_bytes.fetch_add(encoded, Ordering::Relaxed);
        let min = set.cfg.lazy_encode_min_bytes;
        for w in f.objects.iter().filter(|w| w.changed) {
            if min > 0 && w.now.is_some_and(|l| l.tail_bytes() >= min.max(set.geometry().stripe_bytes())) {
                set.queue_encode(&w.coll, &w.name);
            }
        }
        return Ok(f.outcome);
    }
    set.counters.failed_writes.fetch_add(1, Ordering::Relaxed);
    // Fewer than a quorum committed: put back the drives that did.
    for (d, es) in f.entries.iter().enumerate() {
        if committed & (1 << d) != 0
            && !es.is_empty()
            && let Err(e) = undo_on_drive(set, d, es).await
        {
            tracing::warn!(drive = d, error = %e, "a drive could not undo a failed write; it is settled at the next open");
        }
    }
    let first_err = results.into_iter().find_map(|r| r.err());
    Err(StoreError::unavailable(format!(
        "{} of {} drives committed the write; {quorum} are needed{}{}",
        committed.count_ones(),
        set.drives(),
        kept_needed(&set.cfg, kept),
        first_err.map(|e| format!(" ({e})")).unwrap_or_default()
    )))
}

/// Drive transactions with their slots.
type SlotTxns<S> = Vec<(usize, Txn<<S as Store>::Coll, <S as Store>::Staged>)>;

/// Commits each drive's transaction (`txns`, by slot) on the drives it was `sent` to; Ok(true) for a drive
/// with nothing to do. While a group moves, its kept drives commit first and the others only once the kept
/// drives' share did: a write that misses that share is refused and undone, and committed on only some
/// kept drives (fewer than a write quorum) no read ever decided it, so no reader sees it come and go.
async fn commit_on_drives<S: Store>(
    set: &Arc<SetInner<S>>,
    sent: &[Option<(Arc<S>, u64)>],
    txns: Vec<Txn<S::Coll, S::Staged>>,
    kept: Option<u16>,
) -> Vec<StoreResult<bool>> {
    debug_assert_eq!(sent.len(), txns.len(), "a transaction per drive");
    let commit_one = |d: usize, mut t: Txn<S::Coll, S::Staged>| async move {
        if t.ops.is_empty() {
            return Ok(true);
        }
        let Some((store, _)) = sent[d].clone() else { return Err(StoreError::unavailable("missing drive")) };
        // Undo entries of earlier, settled writes leave with this one (no transaction of their own).
        let cleanup = crate::undo::take_for_write(set, d);
        if let Some((coll, names)) = &cleanup {
            t.ops.extend(names.iter().flat_map(|n| crate::undo::removal(set, coll, n.clone())));
        }
        let r = store.commit(t).await.map(|_| false);
        if let (Err(_), Some((_, names))) = (&r, cleanup) {
            crate::undo::requeue(set, d, names);
        }
        r
    };
    let Some(kept_mask) = kept else {
        return join_all(txns.into_iter().enumerate().map(|(d, t)| commit_one(d, t))).await;
    };
    let (first, rest): (Vec<_>, Vec<_>) = txns.into_iter().enumerate().partition(|(d, _)| kept_mask & (1 << d) != 0);
    let round =
        |slots: SlotTxns<S>| join_all(slots.into_iter().map(|(d, t)| async move { (d, commit_one(d, t).await) }));
    let mut results: Vec<Option<StoreResult<bool>>> = (0..sent.len()).map(|_| None).collect();
    for (d, r) in round(first).await {
        results[d] = Some(r);
    }
    let kept_committed = results.iter().flatten().filter(|r| r.is_ok()).count();
    let rest = if kept_committed >= set.cfg.kept_quorum(kept) {
        round(rest).await
    } else {
        let refused = "not sent: too few of the drives the move keeps took the write";
        rest.into_iter()
            .map(|(d, t)| (d, if t.ops.is_empty() { Ok(true) } else { Err(StoreError::unavailable(refused)) }))
            .collect()
    };
    for (d, r) in rest {
        results[d] = Some(r);
    }
    let results: Vec<StoreResult<bool>> = results.into_iter().flatten().collect();
    debug_assert_eq!(results.len(), sent.len(), "an outcome per drive");
    results
}

/// What an error adds when a moving group's kept drives must take a write too.
fn kept_needed(cfg: &crate::SetConfig, kept: Option<u16>) -> String {
    match kept {
        Some(mask) => {
            format!(", {} of them among the drives the group's move keeps ({mask:#b})", cfg.kept_quorum(kept))
        }
        None => String::new(),
    }
}

/// The objects an operation may change (a clone's source is only read).
fn changed_by<C, St>(op: &Op<SetColl<C>, St>) -> Vec<(Arc<str>, Vec<u8>)> {
    match op {
        Op::Clone { to_coll, to, .. } => vec![(to_coll.name.clone(), to.clone())],
        Op::CloneRange { dst_coll, dst, .. } => vec![(dst_coll.name.clone(), dst.clone())],
        _ => touched(op),
    }
}

/// The objects an operation names.
fn touched<C, St>(op: &Op<SetColl<C>, St>) -> Vec<(Arc<str>, Vec<u8>)> {
    op.named_objects().into_iter().map(|(c, name)| (c.name.clone(), name.to_vec())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_of_whole_stripes_encode_and_split() {
        let g = SetGeometry::new(4, 2).unwrap();
        let len = 3 * g.stripe_bytes() as usize;
        let mut buf = AlignedBuf::zeroed(len);
        for (i, b) in buf.as_mut_slice().iter_mut().enumerate() {
            *b = (i / 4096) as u8;
        }
        let (_, shards) = encode_stripes(g, &*crate::codec::codec_for(g.data, g.parity), buf, len).unwrap();
        // Shard 1 holds unit 1 of each stripe: units 1, 5 and 9.
        let s1 = shards[1].as_ref().unwrap().as_slice();
        assert_eq!((s1[0], s1[4096], s1[8192]), (1, 5, 9));
        assert!(shards.iter().all(|s| s.as_ref().unwrap().len() == 3 * crate::layout::SHARD_UNIT_BYTES as usize));
    }
}
