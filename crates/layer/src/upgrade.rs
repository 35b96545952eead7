//! Names written before objects were placed by locator (`mosaic_store::locator`): bucket records were
//! "bucket/<b>", upload records "<b>/<id>" and parts "<b>/<id>/<n>", all without a locator. A store that
//! an older build wrote (always a single set: pools of sets came with locators) is renamed once when the
//! layer opens, a page per transaction, and a marker records that it was, so that later opens cost one
//! lookup. Every rename keeps the object (data, attributes, listing tag): nothing is rewritten.

use crate::error::{LayerError, LayerResult};
use crate::records::*;
use crate::semantics::S3Semantics;
use mosaic_store::{Op, Snapshot, Store, Txn, with_locator};

/// Names renamed per transaction.
const PAGE: usize = 256;

/// The marker in the system collection: its names are placed by locator.
fn marker() -> Vec<u8> {
    with_locator(b"upgrade/names-with-locators", b"")
}

impl<S: Store> S3Semantics<S> {
    /// Renames what an older build named without locators; a no-op (one lookup) once done.
    pub(crate) async fn upgrade_names(&self) -> LayerResult<()> {
        let (sys, mpu) = (self.sys().await?, self.mpu().await?);
        if self.store.snapshot().lookup(&sys, &marker()).await?.is_some() {
            return Ok(());
        }
        let mut renamed = self.rename_bucket_records(&sys).await?;
        renamed += self.rename_uploads(&mpu).await?;
        self.commit(Txn::new().op(Op::Reset { coll: sys, name: marker() })).await?;
        if renamed > 0 {
            tracing::info!(renamed, "records named by an older build now carry their locators");
        }
        Ok(())
    }

    async fn rename_bucket_records(&self, sys: &S::Coll) -> LayerResult<u64> {
        let prefix = b"bucket/".to_vec();
        let mut from = prefix.clone();
        let mut renamed = 0;
        loop {
            let page = self.store.snapshot().list_entries(sys, &prefix, &from, PAGE).await?;
            let Some(last) = page.last() else { return Ok(renamed) };
            from = [&last.name[..], b"\0"].concat();
            let mut txn = Txn::new();
            for e in page.iter().filter(|e| !e.name.contains(&0)) {
                let to = with_locator(&e.name, b"");
                txn.push(Op::Rename { coll: sys.clone(), from: e.name.clone(), to_coll: sys.clone(), to });
            }
            renamed += txn.ops.len() as u64;
            if !txn.ops.is_empty() {
                self.commit(txn).await?;
            }
        }
    }

    /// Renames each legacy upload record with its parts, under the key its record names. Parts whose
    /// record is gone are left where they are: no upload lists or completes them.
    async fn rename_uploads(&self, mpu: &S::Coll) -> LayerResult<u64> {
        let mut from = Vec::new();
        let mut renamed = 0;
        loop {
            let snap = self.store.snapshot();
            let page = snap.list_entries(mpu, b"", &from, PAGE).await?;
            let Some(last) = page.last() else { return Ok(renamed) };
            from = [&last.name[..], b"\0"].concat();
            for e in page.iter().filter(|e| !e.name.contains(&0)) {
                let Some(raw) = snap.attr(&e.obj, ATTR_UPLOAD).await? else { continue };
                let whose = format!(" of upload {}", String::from_utf8_lossy(&e.name));
                let rec = UploadRecord::decode(&raw, &whose)?;
                let parts_prefix = [&e.name[..], b"/"].concat();
                let parts = snap.list_entries(mpu, &parts_prefix, &parts_prefix, crate::MAX_PARTS as usize + 1).await?;
                let mut txn = Txn::new();
                for p in parts.iter().filter(|p| !p.name.contains(&0)).chain(std::iter::once(e)) {
                    let to = with_locator(&p.name, rec.key.as_bytes());
                    txn.push(Op::Rename { coll: mpu.clone(), from: p.name.clone(), to_coll: mpu.clone(), to });
                }
                renamed += txn.ops.len() as u64;
                self.commit(txn).await.map_err(LayerError::from)?;
            }
        }
    }
}
