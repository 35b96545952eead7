//! Planning: turns one transaction's operations into KV changes (in the transaction's overlay), device
//! writes of fresh blocks, allocator marks and deferred frees. Runs only on the committer thread, so the
//! view it reads (database + group overlay + transaction overlay) cannot change under it.
//!
//! The write path of paper 001 is here: every write is split into whole blocks (copy-on-write to fresh
//! blocks) and pieces inside a block (fragments in the KV store, no read). Only `WriteMode::Rmw` (the
//! ablation baseline) and lazy sync (`MergeBlock`) read a block to merge into it.

use crate::alloc::{Extent, Placement};
use crate::blockio::BlockIo;
use crate::config::{EngineConfig, WriteMode};
use crate::error::{EngineError, Result};
use crate::frag_index::{FragDelta, FragIndex};
use crate::keys::*;
use crate::overlay::View;
use crate::page_cache::PageChange;
use crate::space::Space;
use crate::superblock::BLOCK_SIZE_BYTES;
use crate::txn::{MergedBlock, Op, Outcome, Staged, Transaction};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

pub const MAX_NAME_BYTES: usize = 4096;
pub const MAX_ATTR_KEY_BYTES: usize = 1024;
pub const MAX_ATTR_VALUE_BYTES: usize = 64 * 1024;
/// Largest listing tag of a name entry: it is read with every listed name, so it stays small.
pub const MAX_NAME_TAG_BYTES: usize = 256;

#[derive(Default)]
pub(crate) struct TxnState {
    pub(crate) marks: Vec<(Extent, bool)>,
    pub(crate) frees: Vec<Extent>,
    /// Blocks allocated while planning: returned to the allocator if the transaction fails.
    pub(crate) fresh: Vec<Extent>,
    pub(crate) staged: Vec<Staged>,
    pub(crate) frag_deltas: Vec<FragDelta>,
    pub(crate) device_written: bool,
    pub(crate) user_bytes: u64,
    /// Objects created by this transaction: the database holds nothing of them yet.
    pub(crate) fresh_nids: std::collections::HashSet<Nid>,
    /// What the page cache must learn when this transaction commits, in op order.
    pub(crate) page_changes: Vec<PageChange>,
    /// Fragments this transaction added, per block (the write path bounds a block's fragments).
    pub(crate) frag_adds: FragAdds,
    /// Attribute (or omap) entries of objects this transaction added to, counted (see `check_attr_room`).
    pub(crate) attr_counts: std::collections::HashMap<(Nid, &'static str), usize>,
}

/// Fragments added per block since the last committed state.
pub(crate) type FragAdds = std::collections::HashMap<(Nid, u64), u32>;

/// Fragments of one block above which the write path counts them exactly (lazy sync keeps blocks far
/// below, so the count is rare); at half of `MAX_FRAGS_PER_BLOCK` it merges the block first.
const FRAG_COUNT_CHECK: usize = 256;

/// Ids the planner hands out: object ids and fragment sequence numbers, both only increasing.
pub(crate) struct Ids {
    pub(crate) next_nid: AtomicU64,
    pub(crate) next_frag_seq: AtomicU64,
}

/// What planning needs beyond its view: the configuration, block IO (whole-block writes of the RMW
/// baseline, reads of checksum units cut through), space, ids, and the committed fragment counts.
pub(crate) struct PlanCtx<'a> {
    pub(crate) cfg: &'a EngineConfig,
    pub(crate) io: &'a BlockIo,
    pub(crate) space: &'a Space,
    pub(crate) ids: &'a Ids,
    pub(crate) frags: &'a Mutex<FragIndex>,
}

pub(crate) struct Planner<'a, 'v> {
    pub(crate) ctx: &'a PlanCtx<'a>,
    pub(crate) view: &'a mut View<'v>,
    pub(crate) ts: &'a mut TxnState,
    /// Fragments the group's earlier transactions added.
    pub(crate) group_frag_adds: &'a FragAdds,
}

fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

impl Planner<'_, '_> {
    /// Plans every operation in order; the first failure fails the transaction and names its operation.
    pub(crate) fn plan(mut self, txn: Transaction) -> Result<Outcome> {
        let mut out = Outcome::default();
        for (index, op) in txn.ops.into_iter().enumerate() {
            let name = op.kind_name();
            self.op(op, &mut out).map_err(|e| EngineError::in_op(index, name, e))?;
        }
        Ok(out)
    }

    fn op(&mut self, op: Op, out: &mut Outcome) -> Result<()> {
        match op {
            Op::CreateCollection { name } => out.created_collections.push(self.create_collection(&name)?),
            Op::RemoveCollection { name } => self.remove_collection(&name)?,
            Op::Create { coll, name } => {
                if self.lookup(coll, &name)?.is_some() {
                    return Err(EngineError::AlreadyExists);
                }
                self.create_object(coll, &name)?;
            }
            Op::Reset { coll, name } => {
                if let Some((nid, _)) = self.lookup(coll, &name)? {
                    self.destroy(nid)?;
                }
                self.create_object(coll, &name)?;
            }
            Op::Write { coll, name, offset, data } => {
                self.check_data_len(data.len())?;
                let (nid, onode) = self.lookup_or_create(coll, &name)?;
                self.write(nid, onode, offset, &data)?;
            }
            Op::WriteStaged { coll, name, offset, staged } => {
                let (nid, onode) = self.lookup_or_create(coll, &name)?;
                self.write_staged(nid, onode, offset, staged)?;
            }
            Op::Append { coll, name, data, expected_offset } => {
                self.check_data_len(data.len())?;
                let (nid, onode) = self.lookup_or_create(coll, &name)?;
                if let Some(expected) = expected_offset
                    && expected != onode.size_bytes
                {
                    return Err(EngineError::OffsetMismatch { expected, actual: onode.size_bytes });
                }
                let offset = onode.size_bytes;
                let end = offset + data.len() as u64;
                self.write(nid, onode, offset, &data)?;
                out.append_sizes.push(end);
            }
            Op::Truncate { coll, name, size_bytes } => {
                let (nid, onode) = self.lookup(coll, &name)?.ok_or(EngineError::NotFound)?;
                self.truncate(nid, onode, size_bytes)?;
            }
            Op::Remove { coll, name } => {
                let (nid, _) = self.lookup(coll, &name)?.ok_or(EngineError::NotFound)?;
                self.destroy(nid)?;
            }
            Op::Rename { coll, from, to_coll, to } => self.rename(coll, &from, to_coll, &to)?,
            Op::Clone { coll, from, to_coll, to } => self.clone_object(coll, &from, to_coll, &to)?,
            Op::CloneRange { src_coll, src, src_offset, len, dst_coll, dst, dst_offset } => {
                self.clone_range(src_coll, &src, src_offset, len, dst_coll, &dst, dst_offset)?
            }
            Op::SetAttr { coll, name, key, value } => {
                check_attr(&key, Some(&value))?;
                let (nid, _) = self.lookup(coll, &name)?.ok_or(EngineError::NotFound)?;
                self.check_attr_room(CF_ATTRS, nid, &key)?;
                self.view.top.put(CF_ATTRS, &nid_sub_key(nid, &key), value);
            }
            Op::RemoveAttr { coll, name, key } => {
                check_attr(&key, None)?;
                let (nid, _) = self.lookup(coll, &name)?.ok_or(EngineError::NotFound)?;
                self.forget_attr(CF_ATTRS, nid, &key)?;
            }
            Op::OmapSet { coll, name, key, value } => {
                check_attr(&key, Some(&value))?;
                let (nid, _) = self.lookup(coll, &name)?.ok_or(EngineError::NotFound)?;
                self.check_attr_room(CF_OMAP, nid, &key)?;
                self.view.top.put(CF_OMAP, &nid_sub_key(nid, &key), value);
            }
            Op::OmapRemove { coll, name, key } => {
                check_attr(&key, None)?;
                let (nid, _) = self.lookup(coll, &name)?.ok_or(EngineError::NotFound)?;
                self.forget_attr(CF_OMAP, nid, &key)?;
            }
            Op::SetNameTag { coll, name, tag } => {
                if tag.len() > MAX_NAME_TAG_BYTES {
                    return Err(EngineError::Limit(format!("name tags are at most {MAX_NAME_TAG_BYTES} bytes")));
                }
                let (nid, _) = self.lookup(coll, &name)?.ok_or(EngineError::NotFound)?;
                self.view.top.put(CF_NAMES, &name_key(coll, &name), encode_name_entry(nid, Some(&tag)));
            }
            Op::SetPriority { coll, name, high } => {
                let (nid, mut onode) = self.lookup(coll, &name)?.ok_or(EngineError::NotFound)?;
                if high {
                    onode.flags |= ONODE_FLAG_PRIORITY;
                } else {
                    onode.flags &= !ONODE_FLAG_PRIORITY;
                }
                self.put_onode(nid, &onode);
            }
            Op::AssertAttr { coll, name, key, expected } => {
                let actual = match self.lookup(coll, &name)? {
                    Some((nid, _)) => self.view.get(CF_ATTRS, &nid_sub_key(nid, &key))?,
                    None => None,
                };
                if actual != expected {
                    return Err(EngineError::AssertionFailed);
                }
            }
            Op::AssertExists { coll, name } => {
                if self.lookup(coll, &name)?.is_none() {
                    return Err(EngineError::AssertionFailed);
                }
            }
            Op::MergeBlock { nid, lblock } => self.merge_block(nid, lblock)?,
            Op::InstallMerged { staged, blocks } => self.install_merged(staged, blocks)?,
        }
        Ok(())
    }

    /// An object holds at most `MAX_ATTRS_PER_OBJECT` attributes (and as many omap entries), so that
    /// removing or cloning it is bounded. Replacing a value is always allowed. The count is taken once per
    /// object and transaction (one bounded scan) and kept up to date from there.
    fn check_attr_room(&mut self, cf: &'static str, nid: Nid, key: &[u8]) -> Result<()> {
        let sub = nid_sub_key(nid, key);
        let fresh = self.ts.fresh_nids.contains(&nid);
        let exists =
            if fresh { self.view.get_overlay_only(cf, &sub).is_some() } else { self.view.get(cf, &sub)?.is_some() };
        if exists {
            return Ok(());
        }
        let count = match self.ts.attr_counts.get(&(nid, cf)) {
            Some(n) => *n,
            // Only this transaction can have written entries of an object it created.
            None if fresh => 0,
            None => self.view.scan(cf, &nid_key(nid), &nid_key(nid + 1), MAX_ATTRS_PER_OBJECT)?.len(),
        };
        if count >= MAX_ATTRS_PER_OBJECT {
            return Err(EngineError::Limit(format!("an object holds at most {MAX_ATTRS_PER_OBJECT} {cf} entries")));
        }
        self.ts.attr_counts.insert((nid, cf), count + 1);
        Ok(())
    }

    /// Removes an attribute (or omap entry), keeping the transaction's count of them exact.
    fn forget_attr(&mut self, cf: &'static str, nid: Nid, key: &[u8]) -> Result<()> {
        let sub = nid_sub_key(nid, key);
        if let Some(n) = self.ts.attr_counts.get(&(nid, cf)).copied()
            && self.view.get(cf, &sub)?.is_some()
        {
            self.ts.attr_counts.insert((nid, cf), n.saturating_sub(1));
        }
        self.view.top.delete(cf, &sub);
        Ok(())
    }

    fn check_data_len(&self, len: usize) -> Result<()> {
        check_op_data_len(len, self.ctx.cfg.max_op_data_bytes)
    }

    // ---- collections -------------------------------------------------------------------------------

    fn create_collection(&mut self, name: &str) -> Result<CollectionId> {
        if name.is_empty() || name.len() > MAX_NAME_BYTES {
            return Err(EngineError::InvalidArgument("collection names are 1 to 4096 bytes".into()));
        }
        let key = name_key(REGISTRY_COLLECTION, name.as_bytes());
        if self.view.get(CF_NAMES, &key)?.is_some() {
            return Err(EngineError::CollectionExists(name.to_string()));
        }
        // Ids are handed out above the highest in use: the reverse registry is ordered by id, so that is
        // one backward seek.
        let (lower, highest) = (collection_prefix(REVERSE_REGISTRY), reverse_registry_key(REVERSE_REGISTRY - 1));
        let id = match self.view.floor(CF_NAMES, &highest, &lower, false)? {
            Some((k, _)) => u32_at(&k, 4)? + 1,
            None => 1,
        };
        if id as usize > MAX_COLLECTIONS {
            return Err(EngineError::Limit(format!("at most {MAX_COLLECTIONS} collections")));
        }
        self.view.top.put(CF_NAMES, &key, id.to_be_bytes().to_vec());
        self.view.top.put(CF_NAMES, &reverse_registry_key(id), name.as_bytes().to_vec());
        Ok(id)
    }

    fn remove_collection(&mut self, name: &str) -> Result<()> {
        let key = name_key(REGISTRY_COLLECTION, name.as_bytes());
        let raw = self.view.get(CF_NAMES, &key)?.ok_or_else(|| EngineError::CollectionNotFound(name.to_string()))?;
        let id = u32_at(&raw, 0)?;
        let prefix = collection_prefix(id);
        let end = prefix_end(&prefix).expect("id below u32::MAX");
        if !self.view.scan(CF_NAMES, &prefix, &end, 1)?.is_empty() {
            return Err(EngineError::CollectionNotEmpty(name.to_string()));
        }
        self.view.top.delete(CF_NAMES, &key);
        self.view.top.delete(CF_NAMES, &reverse_registry_key(id));
        Ok(())
    }

    fn check_collection(&self, coll: CollectionId) -> Result<()> {
        if coll == REGISTRY_COLLECTION || coll == REVERSE_REGISTRY {
            return Err(EngineError::InvalidArgument("reserved collection id".into()));
        }
        if self.view.get(CF_NAMES, &reverse_registry_key(coll))?.is_none() {
            return Err(EngineError::CollectionNotFound(coll.to_string()));
        }
        Ok(())
    }

    // ---- objects -----------------------------------------------------------------------------------

    fn lookup(&self, coll: CollectionId, name: &[u8]) -> Result<Option<(Nid, Onode)>> {
        self.check_collection(coll)?;
        if name.len() > MAX_NAME_BYTES {
            return Err(EngineError::InvalidArgument(format!("object names are at most {MAX_NAME_BYTES} bytes")));
        }
        let Some(raw) = self.view.get(CF_NAMES, &name_key(coll, name))? else { return Ok(None) };
        let (nid, _) = decode_name_entry(&raw)?;
        let onode = self.view.get(CF_ONODES, &nid_key(nid))?.ok_or_else(|| {
            EngineError::Corrupt(format!("name {} points at missing object {nid}", String::from_utf8_lossy(name)))
        })?;
        Ok(Some((nid, Onode::decode(&onode)?)))
    }

    fn lookup_or_create(&mut self, coll: CollectionId, name: &[u8]) -> Result<(Nid, Onode)> {
        match self.lookup(coll, name)? {
            Some(found) => Ok(found),
            None => self.create_object(coll, name),
        }
    }

    fn create_object(&mut self, coll: CollectionId, name: &[u8]) -> Result<(Nid, Onode)> {
        self.check_collection(coll)?;
        if name.is_empty() || name.len() > MAX_NAME_BYTES {
            return Err(EngineError::InvalidArgument(format!("object names are 1 to {MAX_NAME_BYTES} bytes")));
        }
        let nid = self.ctx.ids.next_nid.fetch_add(1, Ordering::Relaxed);
        self.ts.fresh_nids.insert(nid);
        let onode = Onode {
            size_bytes: 0,
            mtime_ns: now_ns(),
            write_count: 0,
            flags: 0,
            collection: coll,
            name: name.to_vec(),
        };
        self.view.top.put(CF_NAMES, &name_key(coll, name), encode_name_entry(nid, None));
        self.put_onode(nid, &onode);
        Ok((nid, onode))
    }

    fn put_onode(&mut self, nid: Nid, onode: &Onode) {
        self.view.top.put(CF_ONODES, &nid_key(nid), onode.encode());
    }

    /// Removes an object's name, onode, blocks, fragments, attributes and omap.
    fn destroy(&mut self, nid: Nid) -> Result<()> {
        let onode = Onode::decode(&self.view.get(CF_ONODES, &nid_key(nid))?.ok_or(EngineError::NotFound)?)?;
        self.view.top.delete(CF_NAMES, &name_key(onode.collection, &onode.name));
        self.view.top.delete(CF_ONODES, &nid_key(nid));
        // The runs are the object's whole block map (runs never overlap): their keys are deleted as found,
        // without a second scan of the column family.
        for (first, run) in self.runs_overlapping(nid, 0, u64::MAX)? {
            self.free_blocks(run.physical_start, run.len_blocks())?;
            self.view.top.delete(CF_BLOCKS, &block_key(nid, first));
        }
        self.ts.page_changes.push(PageChange::Forget { nid, first: 0, end: u64::MAX });
        let (start, end) = (nid_key(nid), nid_key(nid + 1));
        self.delete_all(CF_FRAGS, &start, &end, object_frags_cap(onode.size_bytes))?;
        self.delete_all(CF_ATTRS, &start, &end, MAX_ATTRS_PER_OBJECT)?;
        self.delete_all(CF_OMAP, &start, &end, MAX_ATTRS_PER_OBJECT)?;
        self.ts.frag_deltas.push(FragDelta::ClearObject(nid));
        Ok(())
    }

    fn rename(&mut self, coll: CollectionId, from: &[u8], to_coll: CollectionId, to: &[u8]) -> Result<()> {
        let (nid, mut onode) = self.lookup(coll, from)?.ok_or(EngineError::NotFound)?;
        if coll == to_coll && from == to {
            return Ok(());
        }
        if to.is_empty() || to.len() > MAX_NAME_BYTES {
            return Err(EngineError::InvalidArgument("object names are 1 to 4096 bytes".into()));
        }
        if let Some((dst, _)) = self.lookup(to_coll, to)? {
            self.destroy(dst)?;
        }
        // The entry moves whole: the listing tag describes the object, not its name.
        let entry = self.view.get(CF_NAMES, &name_key(coll, from))?.ok_or(EngineError::NotFound)?;
        self.view.top.delete(CF_NAMES, &name_key(coll, from));
        self.view.top.put(CF_NAMES, &name_key(to_coll, to), entry);
        onode.collection = to_coll;
        onode.name = to.to_vec();
        self.put_onode(nid, &onode);
        Ok(())
    }

    fn clone_object(&mut self, coll: CollectionId, from: &[u8], to_coll: CollectionId, to: &[u8]) -> Result<()> {
        let (src, src_onode) = self.lookup(coll, from)?.ok_or(EngineError::NotFound)?;
        if coll == to_coll && from == to {
            return Ok(());
        }
        if let Some((dst, _)) = self.lookup(to_coll, to)? {
            self.destroy(dst)?;
        }
        let (dst, _) = self.create_object(to_coll, to)?;
        let inline = self.is_inline(src, &src_onode)?;
        let frags_cap = object_frags_cap(src_onode.size_bytes);
        for (lb, run) in self.runs_overlapping(src, 0, u64::MAX)? {
            for p in run.physical_start..run.physical_start + run.len_blocks() {
                self.share_block(p)?;
            }
            self.view.top.put(CF_BLOCKS, &block_key(dst, lb), run.encode());
        }
        for (k, v) in self.view.scan_prefix(CF_FRAGS, &nid_key(src), frags_cap, "fragments in an object")? {
            let (lb, seq) = (u64_at(&k, 8)?, u64_at(&k, 16)?);
            if !inline {
                self.ts.frag_deltas.push(FragDelta::Add(dst, lb, v.len().saturating_sub(8) as u64));
            }
            self.view.top.put(CF_FRAGS, &frag_key(dst, lb, seq), v);
        }
        for cf in [CF_ATTRS, CF_OMAP] {
            for (k, v) in self.view.scan_prefix(cf, &nid_key(src), MAX_ATTRS_PER_OBJECT, "attributes of an object")? {
                self.view.top.put(cf, &nid_sub_key(dst, &k[8..]), v);
            }
        }
        let onode = Onode { collection: to_coll, name: to.to_vec(), mtime_ns: now_ns(), write_count: 0, ..src_onode };
        self.put_onode(dst, &onode);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn clone_range(
        &mut self,
        src_coll: CollectionId,
        src: &[u8],
        src_offset: u64,
        len: u64,
        dst_coll: CollectionId,
        dst: &[u8],
        dst_offset: u64,
    ) -> Result<()> {
        let bs = BLOCK_SIZE_BYTES;
        let (src_nid, src_onode) = self.lookup(src_coll, src)?.ok_or(EngineError::NotFound)?;
        if !src_offset.is_multiple_of(bs) || !dst_offset.is_multiple_of(bs) {
            return Err(EngineError::InvalidArgument("clone_range offsets must be block-aligned".into()));
        }
        let src_end =
            src_offset.checked_add(len).ok_or_else(|| EngineError::InvalidArgument("range overflows".into()))?;
        if src_end > src_onode.size_bytes {
            return Err(EngineError::InvalidArgument("clone_range reads past the end of the source".into()));
        }
        let (dst_nid, mut dst_onode) = self.lookup_or_create(dst_coll, dst)?;
        if src_nid == dst_nid {
            return Err(EngineError::InvalidArgument("clone_range within one object".into()));
        }
        let dst_end = dst_offset + len;
        if dst_end > MAX_OBJECT_BYTES {
            return Err(EngineError::Limit("object larger than 5 TiB".into()));
        }
        if !len.is_multiple_of(bs) && (src_end != src_onode.size_bytes || dst_end < dst_onode.size_bytes) {
            return Err(EngineError::InvalidArgument(
                "a clone_range length that is not block-aligned must end both objects".into(),
            ));
        }
        let dst_was_inline = self.is_inline(dst_nid, &dst_onode)?;
        let blocks = len.div_ceil(bs);
        let first_src = src_offset / bs;
        let first_dst = dst_offset / bs;
        // The destination range loses its blocks and fragments, then gets the source's, shared.
        self.punch(dst_nid, first_dst, first_dst + blocks)?;
        self.delete_frags(dst_nid, first_dst, first_dst + blocks)?;
        self.ts.page_changes.push(PageChange::Forget { nid: dst_nid, first: first_dst, end: first_dst + blocks });
        for (start, run) in self.runs_overlapping(src_nid, first_src, first_src + blocks)? {
            let from = first_src.max(start);
            let to = (first_src + blocks).min(start + run.len_blocks());
            for (lb, piece) in self.piece(src_nid, start, &run, from - start, to - start)? {
                for p in piece.physical_start..piece.physical_start + piece.len_blocks() {
                    self.share_block(p)?;
                }
                self.view.top.put(CF_BLOCKS, &block_key(dst_nid, first_dst + (lb - first_src)), piece.encode());
            }
        }
        let (fs, fe) = (frag_key(src_nid, first_src, 0), frag_key(src_nid, first_src + blocks, 0));
        let cap = (blocks as usize).saturating_mul(MAX_FRAGS_PER_BLOCK);
        for (k, v) in self.view.scan_capped(CF_FRAGS, &fs, &fe, cap, "fragments in the cloned range")? {
            let (slb, seq) = (u64_at(&k, 8)?, u64_at(&k, 16)?);
            let dlb = first_dst + (slb - first_src);
            self.ts.frag_deltas.push(FragDelta::Add(dst_nid, dlb, v.len().saturating_sub(8) as u64));
            self.view.top.put(CF_FRAGS, &frag_key(dst_nid, dlb, seq), v);
        }
        if dst_was_inline && dst_end > self.ctx.cfg.inline_max_bytes {
            self.index_existing_frags(dst_nid)?;
        }
        if dst_end > dst_onode.size_bytes {
            dst_onode.size_bytes = dst_end;
        }
        dst_onode.write_count = dst_onode.write_count.saturating_add(1);
        self.put_onode(dst_nid, &dst_onode);
        Ok(())
    }

    fn truncate(&mut self, nid: Nid, mut onode: Onode, size: u64) -> Result<()> {
        if size > MAX_OBJECT_BYTES {
            return Err(EngineError::Limit("object larger than 5 TiB".into()));
        }
        let bs = BLOCK_SIZE_BYTES;
        if size < onode.size_bytes {
            let first_dead = size.div_ceil(bs);
            self.punch(nid, first_dead, u64::MAX)?;
            self.ts.page_changes.push(PageChange::Forget { nid, first: first_dead, end: u64::MAX });
            let cap = object_frags_cap(onode.size_bytes);
            self.delete_all(CF_FRAGS, &frag_key(nid, first_dead, 0), &nid_key(nid + 1), cap)?;
            self.ts.frag_deltas.push(FragDelta::ClearFrom(nid, first_dead));
            if !size.is_multiple_of(bs) {
                // Zero the tail of the last block so that growing the object later reads zeros there.
                let off = (size % bs) as usize;
                let zeros = vec![0u8; bs as usize - off];
                let inline = self.is_inline(nid, &onode)?;
                self.put_frag(nid, size / bs, off as u32, &zeros, !inline, false);
            }
        }
        onode.size_bytes = size;
        onode.write_count = onode.write_count.saturating_add(1);
        self.put_onode(nid, &onode);
        Ok(())
    }

    // ---- the write path ----------------------------------------------------------------------------

    fn is_inline(&self, nid: Nid, onode: &Onode) -> Result<bool> {
        Ok(crate::blockmap::lives_in_kv(onode.size_bytes, self.has_blocks(nid)?, self.ctx.cfg.inline_max_bytes))
    }

    fn write(&mut self, nid: Nid, mut onode: Onode, offset: u64, data: &[u8]) -> Result<()> {
        let end = offset.checked_add(data.len() as u64).filter(|e| *e <= MAX_OBJECT_BYTES);
        let end = end.ok_or_else(|| EngineError::Limit("object larger than 5 TiB".into()))?;
        if data.is_empty() {
            return Ok(());
        }
        let bs = BLOCK_SIZE_BYTES;
        let was_inline = self.is_inline(nid, &onode)?;
        let inline = was_inline && end <= self.ctx.cfg.inline_max_bytes;
        if was_inline && !inline {
            self.index_existing_frags(nid)?;
        }
        let hot = onode.write_count >= 2 || offset < onode.size_bytes;
        let mut pos = offset;
        while pos < end {
            let lb = pos / bs;
            let in_block = pos % bs;
            let take = (bs - in_block).min(end - pos);
            let piece = &data[(pos - offset) as usize..(pos - offset + take) as usize];
            if take == bs && !inline {
                // A run of whole blocks: copy-on-write to fresh blocks in one IO.
                let run_blocks = (end - pos) / bs;
                let run = &data[(pos - offset) as usize..(pos - offset + run_blocks * bs) as usize];
                self.write_whole_blocks(nid, lb, run, hot)?;
                pos += run_blocks * bs;
                continue;
            }
            if inline || self.ctx.cfg.write_mode == WriteMode::FragmentLog {
                self.bound_fragments(nid, lb, inline)?;
                // A block at or past the old end holds nothing yet (truncation drops such blocks).
                let block_was_empty = lb * bs >= onode.size_bytes;
                self.put_frag(nid, lb, in_block as u32, piece, !inline, block_was_empty);
            } else {
                self.rmw_block(nid, lb, in_block as usize, piece)?;
            }
            pos += take;
        }
        self.ts.user_bytes += data.len() as u64;
        if end > onode.size_bytes {
            onode.size_bytes = end;
            onode.write_count = onode.write_count.saturating_add(1);
            onode.mtime_ns = now_ns();
            self.put_onode(nid, &onode);
        }
        Ok(())
    }

    fn write_staged(&mut self, nid: Nid, mut onode: Onode, offset: u64, staged: Staged) -> Result<()> {
        let bs = BLOCK_SIZE_BYTES;
        if !offset.is_multiple_of(bs) {
            return Err(EngineError::InvalidArgument("staged writes must start on a block boundary".into()));
        }
        let end = offset.checked_add(staged.len_bytes).filter(|e| *e <= MAX_OBJECT_BYTES);
        let end = end.ok_or_else(|| EngineError::Limit("object larger than 5 TiB".into()))?;
        if self.is_inline(nid, &onode)? {
            self.index_existing_frags(nid)?;
        }
        let mut entries = Vec::with_capacity(staged.crcs.len());
        for ext in staged.extents.clone() {
            self.ts.marks.push((ext, true));
            for p in ext.start..ext.start + ext.len {
                entries.push(BlockEntry { physical_block: p, crc32c: staged.crcs[entries.len()] });
            }
        }
        self.set_blocks_run(nid, offset / bs, &entries)?;
        let first_lb = offset / bs;
        self.ts.page_changes.push(PageChange::Forget { nid, first: first_lb, end: first_lb + entries.len() as u64 });
        // The flusher made the staged data durable before this group reached the committer.
        self.ts.user_bytes += staged.len_bytes;
        self.ts.staged.push(staged);
        if end > onode.size_bytes {
            onode.size_bytes = end;
            onode.write_count = onode.write_count.saturating_add(1);
            onode.mtime_ns = now_ns();
            self.put_onode(nid, &onode);
        }
        Ok(())
    }

    fn write_whole_blocks(&mut self, nid: Nid, first_lb: u64, data: &[u8], hot: bool) -> Result<()> {
        let bs = BLOCK_SIZE_BYTES as usize;
        let blocks = (data.len() / bs) as u64;
        let placement = if blocks >= 16 {
            Placement::Large
        } else if hot {
            Placement::Hot
        } else {
            Placement::Cold
        };
        let extents = self.ctx.space.allocate(self.ctx.io, blocks, placement)?;
        self.ts.fresh.extend(extents.iter().copied());
        let mut done = 0usize;
        let mut entries = Vec::with_capacity(blocks as usize);
        for ext in extents {
            let len = ext.len as usize * bs;
            self.ctx.io.write_blocks(ext.start, &data[done..done + len])?;
            self.ts.marks.push((ext, true));
            for (i, block) in data[done..done + len].chunks_exact(bs).enumerate() {
                entries
                    .push(BlockEntry { physical_block: ext.start + i as u64, crc32c: crate::checksum::crc32c(block) });
            }
            done += len;
        }
        self.set_blocks_run(nid, first_lb, &entries)?;
        self.ts.page_changes.push(PageChange::Forget { nid, first: first_lb, end: first_lb + blocks });
        self.ts.device_written = true;
        Ok(())
    }

    /// The classic path, kept as the ablation baseline: read the block, merge, write a fresh copy.
    fn rmw_block(&mut self, nid: Nid, lb: u64, in_block: usize, piece: &[u8]) -> Result<()> {
        let mut content = self.block_content(nid, lb)?;
        content[in_block..in_block + piece.len()].copy_from_slice(piece);
        self.ctx.io.counters().rmw_on_write_path.fetch_add(1, Ordering::Relaxed);
        self.write_fresh_block(nid, lb, &content)
    }

    fn write_fresh_block(&mut self, nid: Nid, lb: u64, content: &[u8]) -> Result<()> {
        let ext = self.ctx.space.allocate(self.ctx.io, 1, Placement::Hot)?[0];
        self.ts.fresh.push(ext);
        self.ctx.io.write_blocks(ext.start, content)?;
        self.ts.device_written = true;
        self.ts.marks.push((ext, true));
        let entry = BlockEntry { physical_block: ext.start, crc32c: crate::checksum::crc32c(content) };
        self.set_block_unmarked(nid, lb, entry)?;
        self.ts.page_changes.push(PageChange::Clean { nid, lblock: lb, data: content.to_vec() });
        Ok(())
    }

    /// Lazy sync of one block: merge its fragments over its base into a fresh block.
    fn merge_block(&mut self, nid: Nid, lb: u64) -> Result<()> {
        self.ts.frag_deltas.push(FragDelta::ClearBlock(nid, lb));
        let Some(raw) = self.view.get(CF_ONODES, &nid_key(nid))? else { return Ok(()) };
        let onode = Onode::decode(&raw)?;
        if self.is_inline(nid, &onode)? || lb * BLOCK_SIZE_BYTES >= onode.size_bytes {
            return Ok(());
        }
        let start = frag_key(nid, lb, 0);
        if self.view.scan(CF_FRAGS, &start, &frag_key(nid, lb + 1, 0), 1)?.is_empty() {
            return Ok(());
        }
        let content = match self.block_content(nid, lb) {
            Ok(c) => c,
            Err(e @ EngineError::Checksum { .. }) => {
                // Leave the block as it is: reads report the damage, scrub names it.
                tracing::warn!(error = %e, "lazy sync skipped a damaged block");
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        self.ctx.io.counters().rmw_in_lazy_sync.fetch_add(1, Ordering::Relaxed);
        self.write_fresh_block(nid, lb, &content)
    }

    /// Installs blocks merged outside the committer whose base and fragments have not changed since.
    fn install_merged(&mut self, staged: Staged, blocks: Vec<MergedBlock>) -> Result<()> {
        let physical: Vec<u64> = staged.extents.iter().flat_map(|e| e.start..e.start + e.len).collect();
        assert_eq!(physical.len(), blocks.len(), "one staged block per merged block");
        for (&p, b) in physical.iter().zip(&blocks) {
            let ext = Extent { start: p, len: 1 };
            let base = self.run_at(b.nid, b.lblock)?.map(|(start, r)| r.physical_start + (b.lblock - start));
            let (fs, fe) = (frag_key(b.nid, b.lblock, 0), frag_key(b.nid, b.lblock + 1, 0));
            let frags: Vec<Vec<u8>> = self
                .view
                .scan_capped(CF_FRAGS, &fs, &fe, MAX_FRAGS_PER_BLOCK, "fragments in a block")?
                .into_iter()
                .map(|(k, _)| k)
                .collect();
            let alive = self.view.get(CF_ONODES, &nid_key(b.nid))?.is_some();
            if alive && base == b.expected_base && frags == b.frag_keys {
                self.ts.marks.push((ext, true));
                self.set_block_unmarked(b.nid, b.lblock, BlockEntry { physical_block: p, crc32c: b.crc32c })?;
                self.ts.page_changes.push(PageChange::Synced { nid: b.nid, lblock: b.lblock });
                self.ctx.io.counters().rmw_in_lazy_sync.fetch_add(1, Ordering::Relaxed);
            } else {
                // Written to after the merge was read: this staged block was never referenced.
                self.ts.frees.push(ext);
            }
        }
        self.ts.staged.push(staged);
        Ok(())
    }

    /// The current content of one logical block: base block (checked) with fragments applied in order.
    fn block_content(&self, nid: Nid, lb: u64) -> Result<Vec<u8>> {
        let mut content = vec![0u8; BLOCK_SIZE_BYTES as usize];
        if let Some((start, run)) = self.run_at(nid, lb)? {
            self.ctx.io.read_verified_block(nid, start, &run, lb, &mut content)?;
        }
        let (fs, fe) = (frag_key(nid, lb, 0), frag_key(nid, lb + 1, 0));
        let frags = self.view.scan_capped(CF_FRAGS, &fs, &fe, MAX_FRAGS_PER_BLOCK, "fragments in a block")?;
        apply_fragments(&mut content, nid, lb, frags.iter().map(|(_, v)| v.as_slice()))?;
        Ok(content)
    }

    /// Keeps a block below `MAX_FRAGS_PER_BLOCK` fragments, so that every scan of a block's fragments is
    /// bounded: when lazy sync has fallen behind (or is off), a block's fragments are merged into a fresh
    /// block first; an object that lives in the KV store gets its block's fragments joined into one.
    fn bound_fragments(&mut self, nid: Nid, lb: u64, inline: bool) -> Result<()> {
        let key = (nid, lb);
        let added = |m: &FragAdds| m.get(&key).copied().unwrap_or(0) as usize;
        let known =
            self.ctx.frags.lock().count(nid, lb) as usize + added(self.group_frag_adds) + added(&self.ts.frag_adds);
        // Objects in the KV store are not indexed: their count is known only for one this transaction made.
        let unknown = inline && !self.ts.fresh_nids.contains(&nid);
        if known < FRAG_COUNT_CHECK && !unknown {
            return Ok(());
        }
        let (fs, fe) = (frag_key(nid, lb, 0), frag_key(nid, lb + 1, 0));
        let frags = self.view.scan_capped(CF_FRAGS, &fs, &fe, MAX_FRAGS_PER_BLOCK, "fragments in a block")?;
        if frags.len() + 1 < MAX_FRAGS_PER_BLOCK / 2 {
            return Ok(());
        }
        if !inline {
            let content = self.block_content(nid, lb)?;
            self.ctx.io.counters().rmw_on_write_path.fetch_add(1, Ordering::Relaxed);
            self.write_fresh_block(nid, lb, &content)?;
            self.ts.frag_adds.remove(&key);
            return Ok(());
        }
        // One fragment covering what they covered, with the bytes they left.
        let mut content = vec![0u8; BLOCK_SIZE_BYTES as usize];
        let (mut lo, mut hi) = (BLOCK_SIZE_BYTES as usize, 0usize);
        for (k, v) in &frags {
            let (off, data) = decode_frag(v)?;
            (lo, hi) = (lo.min(off as usize), hi.max(off as usize + data.len()));
            apply_fragments(&mut content, nid, lb, std::iter::once(v.as_slice()))?;
            self.view.top.delete(CF_FRAGS, k);
        }
        let seq = self.ctx.ids.next_frag_seq.fetch_add(1, Ordering::Relaxed);
        self.view.top.put(CF_FRAGS, &frag_key(nid, lb, seq), encode_frag(lo as u32, &content[lo..hi]));
        self.ts.frag_adds.insert(key, 1);
        Ok(())
    }

    fn put_frag(&mut self, nid: Nid, lb: u64, off: u32, data: &[u8], indexed: bool, block_was_empty: bool) {
        debug_assert!(off as u64 + data.len() as u64 <= BLOCK_SIZE_BYTES);
        *self.ts.frag_adds.entry((nid, lb)).or_default() += 1;
        self.ts.page_changes.push(PageChange::Fragment {
            nid,
            lblock: lb,
            offset: off as u16,
            data: data.to_vec(),
            block_was_empty,
        });
        let seq = self.ctx.ids.next_frag_seq.fetch_add(1, Ordering::Relaxed);
        self.view.top.put(CF_FRAGS, &frag_key(nid, lb, seq), encode_frag(off, data));
        if indexed {
            self.ts.frag_deltas.push(FragDelta::Add(nid, lb, data.len() as u64));
        }
    }

    /// An inline object is growing out of the KV store: its fragments become lazy-sync work.
    fn index_existing_frags(&mut self, nid: Nid) -> Result<()> {
        let cap = object_frags_cap(self.ctx.cfg.inline_max_bytes);
        for (k, v) in self.view.scan_prefix(CF_FRAGS, &nid_key(nid), cap, "fragments of an object in the KV store")? {
            self.ts.frag_deltas.push(FragDelta::Add(nid, u64_at(&k, 8)?, v.len().saturating_sub(8) as u64));
        }
        Ok(())
    }

    // ---- block map -----------------------------------------------------------------------------
    //
    // Entries are runs (`BlockRun`): up to MAX_RUN_BLOCKS logical blocks at consecutive physical blocks,
    // keyed by their first logical block; the runs of one object never overlap. Changing blocks inside a
    // run splits it (the pieces keep their checksums, nothing is read).

    fn has_blocks(&self, nid: Nid) -> Result<bool> {
        Ok(!self.view.scan(CF_BLOCKS, &nid_key(nid), &nid_key(nid + 1), 1)?.is_empty())
    }

    /// The runs of `nid` that map any block in [first, end) (end u64::MAX: to the object's end), in order.
    fn runs_overlapping(&self, nid: Nid, first: u64, end: u64) -> Result<Vec<(u64, BlockRun)>> {
        let fresh = self.ts.fresh_nids.contains(&nid);
        crate::blockmap::runs_overlapping(&PlanRuns { view: &*self.view, fresh }, nid, first, end)
    }

    /// The run that maps logical block `lb`, as (its first logical block, run), if any.
    fn run_at(&self, nid: Nid, lb: u64) -> Result<Option<(u64, BlockRun)>> {
        Ok(self.runs_overlapping(nid, lb, lb + 1)?.into_iter().next())
    }

    /// The runs that map blocks [from, to) of `run` (which starts at logical block `start`): the run's own
    /// checksum units where the cut falls on their boundaries; a unit cut through is read (checked) and
    /// its kept blocks get one checksum each.
    fn piece(&mut self, nid: Nid, start: u64, run: &BlockRun, from: u64, to: u64) -> Result<Vec<(u64, BlockRun)>> {
        if let Some(r) = run.slice(from, to) {
            return Ok(vec![(start + from, r)]);
        }
        let unit = run.unit_blocks;
        let mut out = Vec::with_capacity(3);
        let a = from.next_multiple_of(unit).min(to);
        if a > from {
            out.push((start + from, self.rechecksum(nid, start, run, from, a)?));
        }
        let b = if to == run.len_blocks() { to } else { (to / unit * unit).max(a) };
        if b > a {
            out.push((start + a, run.slice(a, b).expect("cut on unit boundaries")));
        }
        if to > b {
            out.push((start + b, self.rechecksum(nid, start, run, b, to)?));
        }
        Ok(out)
    }

    /// Blocks [from, to) of one checksum unit of `run` as a run with a checksum per block: the unit is read
    /// from the device and checked first.
    fn rechecksum(&mut self, nid: Nid, start: u64, run: &BlockRun, from: u64, to: u64) -> Result<BlockRun> {
        let bs = BLOCK_SIZE_BYTES as usize;
        let unit = run.unit_of(from);
        assert!(to <= unit.first + unit.blocks, "a re-checksummed piece lies within one unit");
        let mut buf = vec![0u8; unit.blocks as usize * bs];
        self.ctx.io.read_verified_unit(nid, start, run, unit, &mut buf)?;
        self.ctx.io.counters().checksum_split_reads.fetch_add(1, Ordering::Relaxed);
        let crcs = (from..to).map(|i| crate::checksum::crc32c(&buf[(i - unit.first) as usize * bs..][..bs])).collect();
        Ok(BlockRun::per_block(run.physical_start + from, crcs))
    }

    /// Unmaps [first, end): runs inside go, runs across an edge are cut (each piece keeps its checksums),
    /// and the unmapped physical blocks lose a reference. Fragments are the caller's.
    fn punch(&mut self, nid: Nid, first: u64, end: u64) -> Result<()> {
        for (start, run) in self.runs_overlapping(nid, first, end)? {
            let run_end = start + run.len_blocks();
            let (cut_from, cut_to) = (first.max(start), end.min(run_end));
            // Pieces first: a piece cut through a checksum unit reads blocks that are freed below.
            let mut kept = Vec::new();
            if start < cut_from {
                kept.extend(self.piece(nid, start, &run, 0, cut_from - start)?);
            }
            if cut_to < run_end {
                kept.extend(self.piece(nid, start, &run, cut_to - start, run.len_blocks())?);
            }
            self.view.top.delete(CF_BLOCKS, &block_key(nid, start));
            for (lb, r) in kept {
                self.view.top.put(CF_BLOCKS, &block_key(nid, lb), r.encode());
            }
            self.free_blocks(run.physical_start + (cut_from - start), cut_to - cut_from)?;
        }
        Ok(())
    }

    /// Maps logical blocks from `first_lb` on to `entries` (blocks already marked used), after unmapping
    /// what was there. Physically consecutive blocks become one run (16 KiB checksum units when long); a
    /// run that continues the one ending just before (sequential writes) extends it.
    fn map_blocks(&mut self, nid: Nid, first_lb: u64, entries: &[BlockEntry]) -> Result<()> {
        self.punch(nid, first_lb, first_lb + entries.len() as u64)?;
        let mut i = 0;
        while i < entries.len() {
            let mut n = 1;
            while i + n < entries.len()
                && (n as u64) < MAX_RUN_BLOCKS
                && entries[i + n].physical_block == entries[i].physical_block + n as u64
            {
                n += 1;
            }
            let lb = first_lb + i as u64;
            let crcs: Vec<u32> = entries[i..i + n].iter().map(|e| e.crc32c).collect();
            let previous = if lb > 0 { self.run_at(nid, lb - 1)? } else { None };
            let joined = previous.and_then(|(start, prev)| {
                (start + prev.len_blocks() == lb)
                    .then(|| prev.joined(&crcs, entries[i].physical_block).map(|r| (start, r)))?
            });
            match joined {
                Some((start, run)) => self.view.top.put(CF_BLOCKS, &block_key(nid, start), run.encode()),
                None => self.view.top.put(
                    CF_BLOCKS,
                    &block_key(nid, lb),
                    BlockRun::from_block_crcs(entries[i].physical_block, &crcs).encode(),
                ),
            }
            i += n;
        }
        Ok(())
    }

    /// Points a logical block at a new physical block (already marked used), freeing the old one and
    /// dropping the block's fragments, which the new content supersedes.
    fn set_block_unmarked(&mut self, nid: Nid, lb: u64, entry: BlockEntry) -> Result<()> {
        self.set_blocks_run(nid, lb, &[entry])
    }

    /// Points a run of logical blocks at new physical blocks (already marked used) and drops their
    /// fragments, with one scan of the old entries and one of the fragments.
    fn set_blocks_run(&mut self, nid: Nid, first_lb: u64, entries: &[BlockEntry]) -> Result<()> {
        let end_lb = first_lb + entries.len() as u64;
        self.map_blocks(nid, first_lb, entries)?;
        self.delete_frags(nid, first_lb, end_lb)
    }

    /// Deletes the fragments of blocks [first, end) and takes them out of lazy sync's index.
    fn delete_frags(&mut self, nid: Nid, first: u64, end: u64) -> Result<()> {
        let (fs, fe) = (frag_key(nid, first, 0), frag_key(nid, end, 0));
        let frags: Vec<Vec<u8>> = if self.ts.fresh_nids.contains(&nid) {
            // Only this transaction can have written fragments of a new object.
            self.view.top.keys_in(CF_FRAGS, &fs, &fe)
        } else {
            let cap = (end.saturating_sub(first) as usize).saturating_mul(MAX_FRAGS_PER_BLOCK);
            self.view
                .scan_capped(CF_FRAGS, &fs, &fe, cap, "fragments in a range")?
                .into_iter()
                .map(|(k, _)| k)
                .collect()
        };
        let mut cleared = None;
        for k in frags {
            let lb = u64_at(&k, 8)?;
            if cleared != Some(lb) {
                self.ts.frag_deltas.push(FragDelta::ClearBlock(nid, lb));
                cleared = Some(lb);
            }
            self.view.top.delete(CF_FRAGS, &k);
        }
        Ok(())
    }

    /// Point-deletes every live key in [start, end), of which there are at most `cap`.
    fn delete_all(&mut self, cf: &'static str, start: &[u8], end: &[u8], cap: usize) -> Result<()> {
        for (k, _) in self.view.scan_capped(cf, start, end, cap, cf)? {
            self.view.top.delete(cf, &k);
        }
        Ok(())
    }

    /// Drops one reference to each of `n` physical blocks from `start`; blocks whose last reference this
    /// was are freed (after commit) as whole extents.
    fn free_blocks(&mut self, start: u64, n: u64) -> Result<()> {
        if n == 1 {
            return self.free_block(start);
        }
        let shared =
            self.view.scan_capped(CF_REFS, &nid_key(start), &nid_key(start + n), n as usize, "shared blocks")?;
        let mut next = start;
        for (k, _) in shared {
            let p = u64_at(&k, 0)?;
            if p > next {
                self.free_extent(Extent { start: next, len: p - next });
            }
            self.free_block(p)?;
            next = p + 1;
        }
        if next < start + n {
            self.free_extent(Extent { start: next, len: start + n - next });
        }
        Ok(())
    }

    fn free_extent(&mut self, ext: Extent) {
        self.ts.marks.push((ext, false));
        self.ts.frees.push(ext);
    }

    /// Drops one reference to a physical block; the last reference frees it (after commit).
    fn free_block(&mut self, physical: u64) -> Result<()> {
        let key = nid_key(physical);
        if let Some(raw) = self.view.get(CF_REFS, &key)? {
            let count = u64_at(&raw, 0)?;
            assert!(count >= 2, "refs entry below 2 for block {physical}");
            if count == 2 {
                self.view.top.delete(CF_REFS, &key);
            } else {
                self.view.top.put(CF_REFS, &key, (count - 1).to_be_bytes().to_vec());
            }
            return Ok(());
        }
        self.free_extent(Extent { start: physical, len: 1 });
        Ok(())
    }

    fn share_block(&mut self, physical: u64) -> Result<()> {
        let key = nid_key(physical);
        let count = match self.view.get(CF_REFS, &key)? {
            Some(raw) => u64_at(&raw, 0)?,
            None => 1,
        };
        self.view.top.put(CF_REFS, &key, (count + 1).to_be_bytes().to_vec());
        Ok(())
    }
}

/// The size limit of data carried inside one Write/Append op.
pub(crate) fn check_op_data_len(len: usize, max: usize) -> Result<()> {
    if len > max {
        return Err(EngineError::Limit(format!("{len} bytes in one write op (maximum {max}); stage larger writes")));
    }
    Ok(())
}

/// The block map as planning sees it: database, group and transaction changes; for an object created by
/// the transaction (`fresh`) only the transaction's changes, which hold all of it.
struct PlanRuns<'a, 'v> {
    view: &'a View<'v>,
    fresh: bool,
}

impl crate::blockmap::RunSource for PlanRuns<'_, '_> {
    fn floor_run(&self, key: &[u8], lower: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        self.view.floor(CF_BLOCKS, key, lower, self.fresh)
    }

    fn scan_runs(&self, from: &[u8], to: &[u8], cap: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        if !self.fresh {
            return self.view.scan_capped(CF_BLOCKS, from, to, cap, "block-map runs");
        }
        let keys = self.view.top.keys_in(CF_BLOCKS, from, to);
        Ok(keys.into_iter().filter_map(|k| self.view.get_overlay_only(CF_BLOCKS, &k).map(|v| (k, v))).collect())
    }
}

/// Most fragments an object of `size_bytes` can hold (`MAX_FRAGS_PER_BLOCK` in each of its blocks).
fn object_frags_cap(size_bytes: u64) -> usize {
    (size_bytes.div_ceil(BLOCK_SIZE_BYTES) as usize).saturating_add(1).saturating_mul(MAX_FRAGS_PER_BLOCK)
}

fn check_attr(key: &[u8], value: Option<&[u8]>) -> Result<()> {
    if key.is_empty() || key.len() > MAX_ATTR_KEY_BYTES {
        return Err(EngineError::InvalidArgument(format!("attribute keys are 1 to {MAX_ATTR_KEY_BYTES} bytes")));
    }
    if value.is_some_and(|v| v.len() > MAX_ATTR_VALUE_BYTES) {
        return Err(EngineError::Limit(format!("attribute values are at most {MAX_ATTR_VALUE_BYTES} bytes")));
    }
    Ok(())
}
