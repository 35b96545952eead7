//! Buckets' data on their microstores' sets (paper 002: a microstore has its own resources, drives among
//! them). A microstore may own some of the server's erasure sets; the buckets it serves (assigned by hand
//! or by their class) have their objects placed on those sets only, as scopes of the pool
//! (`mosaic_pool::Scope`). When a bucket's microstore changes, its objects move in the background: the
//! move is recorded in the microstores file first (sets, and the sets it leaves), so a restart goes on
//! with it; every object stays readable and writable meanwhile (the pool reads the new set, then the old
//! one; a write moves what it touches first). A move is paced to `move_rate` bytes per second at the
//! background priority. A bucket whose move is under way does not begin another until it is done.
//!
//! The buckets of the default microstore (those placed nowhere else) live on its home: the sets no
//! microstore owns (every set when microstores own them all). When a microstore takes sets (or gives them
//! back), the home moves the same way, so a microstore's sets hold its own buckets only.

use mosaic_drive::DriveStore;
use mosaic_erasure::ErasureSet;
use mosaic_microstore::{BucketPlacement, Microstores};
use mosaic_pool::{Home, Pool, Scope};
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

/// The pool's home for the stored `home` (None: every one of `sets` sets).
pub fn home_of(home: Option<&BucketPlacement>, sets: usize) -> Home {
    match home {
        Some(p) => Home { members: p.sets.clone(), moving_from: p.moving_from.clone() },
        None => Home::all(sets),
    }
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
    let home = catalog.home.iter().map(|p| ("of the default microstore", p));
    for (bucket, p) in catalog.placements.iter().map(|(b, p)| (b.as_str(), p)).chain(home) {
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
    /// The home began to move, or its move ended.
    pub home_begun: bool,
    pub home_settled: bool,
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

    /// The sets the home is on (or moves to).
    fn home_sets(&self, all: &[usize]) -> Vec<usize> {
        self.microstores.home().map_or_else(|| all.to_vec(), |h| h.sets)
    }

    /// Begins a move of the home when the sets no microstore owns changed and it is not moving: true if
    /// it began. When microstores own every set, the home is every set (the default microstore shares).
    fn begin_home_move(&self, all: &[usize]) -> Result<bool, String> {
        let home = self.microstores.home();
        if home.as_ref().is_some_and(|h| h.moving_from.is_some()) {
            return Ok(false);
        }
        let now = home.map_or_else(|| all.to_vec(), |h| h.sets);
        let wanted = mosaic_microstore::registry::home_for(&self.microstores.owned_sets(), all.len());
        if wanted == now {
            return Ok(false);
        }
        self.microstores.set_home(Some(BucketPlacement { sets: wanted, moving_from: Some(now) }))?;
        Ok(true)
    }

    /// Begins the moves that bucket routes (and the sets microstores own) ask for, moves a batch of
    /// objects, and ends the moves that are done. Every change of placement is stored before the pool
    /// applies it.
    pub async fn pass(&self) -> Result<Pass, String> {
        let mut pass = Pass::default();
        let all = self.all_sets();
        pass.home_begun = self.begin_home_move(&all)?;
        let home = self.home_sets(&all);
        let home_moving = self.microstores.home().filter(|h| h.moving_from.is_some());
        let placements = self.microstores.placements();
        for bucket in self.microstores.placement_candidates() {
            let current = placements.get(&bucket);
            if current.is_some_and(|p| p.moving_from.is_some()) {
                continue;
            }
            // A bucket of no microstore's sets lives on the home, and goes back there. Not while the home
            // moves: a scope leaving it would have to say two places its objects may be.
            let wanted = self.microstores.wanted_sets(&bucket);
            if home_moving.is_some() && (current.is_none() || wanted.is_none()) {
                continue;
            }
            let now = current.map_or(home.clone(), |p| p.sets.clone());
            let wanted = wanted.unwrap_or_else(|| home.clone());
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
        if pass.home_begun || !pass.begun.is_empty() {
            self.apply().await?;
        }
        let moving: Vec<String> = self
            .microstores
            .placements()
            .into_iter()
            .filter(|(_, p)| p.moving_from.is_some())
            .map(|(b, _)| b)
            .collect();
        if moving.is_empty() && home_moving.is_none() {
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
            // Back on the home: the same as no scope, which is what is kept (while the bucket is of no
            // microstore's sets: else it would follow the home's later moves).
            let on_home = p.sets == home && self.microstores.wanted_sets(&bucket).is_none();
            let settled = (!on_home).then_some(BucketPlacement { sets: p.sets, moving_from: None });
            self.microstores.set_placement(&bucket, settled)?;
            pass.settled.push(bucket);
        }
        if let (Some(h), true) = (home_moving, report.home_settled) {
            // On every set: the same as no home, which is what is kept.
            let settled = (h.sets != all).then_some(BucketPlacement { sets: h.sets, moving_from: None });
            self.microstores.set_home(settled)?;
            pass.home_settled = true;
        }
        if pass.home_settled || !pass.settled.is_empty() {
            self.apply().await?;
        }
        Ok(pass)
    }

    /// Sets the pool's placement to the stored placements and home.
    pub async fn apply(&self) -> Result<(), String> {
        let home = home_of(self.microstores.home().as_ref(), self.pool.members().len());
        let scopes = scopes_of(&self.microstores.placements());
        self.pool.set_placement(home, scopes).await.map_err(|e| e.to_string())
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
        if pass.home_begun {
            let home = self.microstores.home();
            tracing::info!(?home, "the data of buckets of no microstore's sets moves off the sets microstores own");
            *self.progress_logged.lock() = None;
        }
        if pass.home_settled {
            tracing::info!(home = ?self.microstores.home(), "the data of buckets of no microstore's sets moved");
        }
        metrics::counter!("mosaic_microstore_moved_objects_total").increment(pass.objects);
        metrics::counter!("mosaic_microstore_moved_bytes_total").increment(pass.bytes);
        let moving = self.microstores.placements().values().filter(|p| p.moving_from.is_some()).count();
        metrics::gauge!("mosaic_microstore_buckets_moving").set(moving as f64);
        let home_moving = self.microstores.home().is_some_and(|h| h.moving_from.is_some());
        metrics::gauge!("mosaic_microstore_home_moving").set(f64::from(u8::from(home_moving)));
    }
}
