//! Buckets' data on their microstores' sets (paper 002: a microstore has its own resources, drives among
//! them). A microstore may own some of the server's erasure sets; the buckets it serves (assigned by hand
//! or by their class) have their objects placed on those sets only, as scopes of the pool
//! (`mosaic_pool::Scope`). When a bucket's microstore changes, its objects move in the background: the
//! move is recorded in the microstores file first (sets, and the sets it leaves), so a restart goes on
//! with it; every object stays readable and writable meanwhile (the pool reads the new set, then the old
//! one; a write moves what it touches first). A move is paced to `move_rate` bytes per second at the
//! background priority. A bucket whose move is under way does not begin another until it is done.

use mosaic_drive::DriveStore;
use mosaic_erasure::ErasureSet;
use mosaic_microstore::{BucketPlacement, Microstores};
use mosaic_pool::{Pool, Scope};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The pool of the server's sets.
pub type SetPool = Pool<ErasureSet<DriveStore>>;

/// Objects a pass moves at most before it looks at the buckets again.
const OBJECTS_PER_PASS: u64 = 64;
/// How often the buckets are looked at when no move is under way.
const IDLE_PASS_EVERY: Duration = Duration::from_secs(1);
/// The longest pause a pass takes to keep to the rate.
const MAX_PACING_PAUSE: Duration = Duration::from_secs(10);
/// Progress is logged at most this often.
const PROGRESS_LOG_EVERY: Duration = Duration::from_secs(5);

/// The pool's scopes for the buckets placed on some sets.
pub fn scopes_of(placements: &BTreeMap<String, BucketPlacement>) -> Vec<Scope> {
    let mut out = Vec::with_capacity(placements.len() * 2);
    for (bucket, p) in placements {
        for (coll, prefix) in mosaic_layer::bucket_scopes(bucket) {
            out.push(Scope { coll, prefix, members: p.sets.clone(), moving_from: p.moving_from.clone() });
        }
    }
    out
}

/// Refuses placements or microstores that name sets the server does not have (its drives' layout fixes
/// the count: a catalog naming more belongs to another layout, and its buckets' objects could not be found).
pub fn check_sets(catalog: &mosaic_microstore::Catalog, sets: usize) -> Result<(), String> {
    let beyond = |list: &[usize]| list.iter().any(|s| *s >= sets);
    for (name, d) in &catalog.microstores {
        if beyond(&d.sets) {
            return Err(format!("microstore {name} names sets {:?}; this server has {sets}", d.sets));
        }
    }
    for (bucket, p) in &catalog.placements {
        if beyond(&p.sets) || p.moving_from.as_deref().is_some_and(beyond) {
            return Err(format!("bucket {bucket} is placed on sets {p:?}; this server has {sets}"));
        }
    }
    Ok(())
}

/// What one pass did.
#[derive(Debug, Default, PartialEq)]
pub struct Pass {
    pub begun: Vec<String>,
    pub settled: Vec<String>,
    pub objects: u64,
    pub bytes: u64,
}

/// The buckets' moves of one server.
pub struct BucketMoves {
    pool: Arc<SetPool>,
    microstores: Arc<Microstores>,
    move_rate_bytes_s: u64,
    /// When progress was last logged (None: not since the last move began).
    progress_logged: parking_lot::Mutex<Option<std::time::Instant>>,
}

impl BucketMoves {
    pub fn new(pool: Arc<SetPool>, microstores: Arc<Microstores>, move_rate_bytes_s: u64) -> Self {
        assert!(move_rate_bytes_s > 0, "a move rate of 0 would never move");
        BucketMoves { pool, microstores, move_rate_bytes_s, progress_logged: Default::default() }
    }

    fn all_sets(&self) -> Vec<usize> {
        (0..self.pool.members().len()).collect()
    }

    /// Begins the moves that bucket routes ask for, moves a batch of objects, and ends the moves that are
    /// done. Every change of placement is stored before the pool applies it.
    pub async fn pass(&self) -> Result<Pass, String> {
        let mut pass = Pass::default();
        let all = self.all_sets();
        let placements = self.microstores.placements();
        for bucket in self.microstores.placement_candidates() {
            let current = placements.get(&bucket);
            if current.is_some_and(|p| p.moving_from.is_some()) {
                continue;
            }
            let now = current.map_or(all.clone(), |p| p.sets.clone());
            let wanted = self.microstores.wanted_sets(&bucket).unwrap_or_else(|| all.clone());
            if wanted == now {
                continue;
            }
            if wanted.iter().any(|s| *s >= all.len()) {
                tracing::warn!(bucket, ?wanted, sets = all.len(), "a bucket's microstore names sets this server lacks");
                continue;
            }
            self.microstores.set_placement(&bucket, Some(BucketPlacement { sets: wanted, moving_from: Some(now) }))?;
            pass.begun.push(bucket);
        }
        if !pass.begun.is_empty() {
            self.apply().await?;
        }
        let moving: Vec<String> = self
            .microstores
            .placements()
            .into_iter()
            .filter(|(_, p)| p.moving_from.is_some())
            .map(|(b, _)| b)
            .collect();
        if moving.is_empty() {
            return Ok(pass);
        }
        let report = self.pool.move_objects(OBJECTS_PER_PASS).await.map_err(|e| e.to_string())?;
        (pass.objects, pass.bytes) = (report.objects, report.bytes);
        for bucket in moving {
            let done = mosaic_layer::bucket_scopes(&bucket)
                .iter()
                .all(|(c, p)| report.settled.iter().any(|(sc, sp)| sc == c && sp == p));
            if !done {
                continue;
            }
            let Some(p) = self.microstores.placements().remove(&bucket) else { continue };
            // On every set again: the same as no scope, which is what is kept.
            let settled = (p.sets != all).then_some(BucketPlacement { sets: p.sets, moving_from: None });
            self.microstores.set_placement(&bucket, settled)?;
            pass.settled.push(bucket);
        }
        if !pass.settled.is_empty() {
            self.apply().await?;
        }
        Ok(pass)
    }

    /// Sets the pool's scopes to the stored placements.
    pub async fn apply(&self) -> Result<(), String> {
        self.pool.set_scopes(scopes_of(&self.microstores.placements())).await.map_err(|e| e.to_string())
    }

    /// Passes until `stop`: at once while a move is under way (paced to the rate), else once a second.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        loop {
            let pause = match self.pass().await {
                Ok(pass) => {
                    self.report(&pass);
                    if pass.objects > 0 {
                        Duration::from_secs_f64(pass.bytes as f64 / self.move_rate_bytes_s as f64).min(MAX_PACING_PAUSE)
                    } else {
                        IDLE_PASS_EVERY
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "moving buckets between sets failed; trying again");
                    IDLE_PASS_EVERY
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    fn report(&self, pass: &Pass) {
        for bucket in &pass.begun {
            let p = self.microstores.placements().get(bucket).cloned();
            tracing::info!(bucket, placement = ?p, "a bucket's data moves to its microstore's sets");
            *self.progress_logged.lock() = None;
        }
        if pass.objects > 0 {
            let mut logged = self.progress_logged.lock();
            if logged.is_none_or(|at| at.elapsed() >= PROGRESS_LOG_EVERY) {
                tracing::info!(objects = pass.objects, bytes = pass.bytes, "objects of moving buckets moved");
                *logged = Some(std::time::Instant::now());
            }
        }
        for bucket in &pass.settled {
            tracing::info!(bucket, "a bucket's data moved");
        }
        metrics::counter!("mosaic_microstore_moved_objects_total").increment(pass.objects);
        metrics::counter!("mosaic_microstore_moved_bytes_total").increment(pass.bytes);
        let moving = self.microstores.placements().values().filter(|p| p.moving_from.is_some()).count();
        metrics::gauge!("mosaic_microstore_buckets_moving").set(moving as f64);
    }
}
