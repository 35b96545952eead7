//! What each worker does next, as a pure function of the seed: workloads, their operation mixes and size
//! ranges, keys and sizes. A worker owns the keys whose index is congruent to its id modulo the concurrency,
//! tracks which of them exist and how large they are, and never depends on the server's answers to choose
//! its next step, so two runs with the same seed issue the same keys and sizes.

use rand::{Rng, SeedableRng, rngs::StdRng};
use rand_distr::{Distribution, Zipf};
use serde::Serialize;

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum S3Workload {
    CosbenchA,
    CosbenchB,
    CosbenchC,
    CosbenchD,
    WriteOnly,
    ReadOnly,
    ReadWrite,
    List,
    Create,
    Append,
    Tenants,
    Priority,
}

impl S3Workload {
    pub fn name(self) -> &'static str {
        match self {
            S3Workload::CosbenchA => "cosbench-a",
            S3Workload::CosbenchB => "cosbench-b",
            S3Workload::CosbenchC => "cosbench-c",
            S3Workload::CosbenchD => "cosbench-d",
            S3Workload::WriteOnly => "write-only",
            S3Workload::ReadOnly => "read-only",
            S3Workload::ReadWrite => "read-write",
            S3Workload::List => "list",
            S3Workload::Create => "create",
            S3Workload::Append => "append",
            S3Workload::Tenants => "tenants",
            S3Workload::Priority => "priority",
        }
    }

    /// Object sizes of the papers (COSBench A-D of paper 002; 128 MiB objects of paper 000; 2 KiB records of
    /// paper 001). Scale down with `--size` on small machines.
    pub fn default_size(self) -> SizeRange {
        match self {
            S3Workload::CosbenchA | S3Workload::CosbenchB => SizeRange { min: KIB, max: 128 * KIB },
            S3Workload::CosbenchC | S3Workload::CosbenchD => SizeRange { min: MIB, max: 128 * MIB },
            S3Workload::WriteOnly | S3Workload::ReadOnly | S3Workload::ReadWrite => SizeRange::fixed(128 * MIB),
            S3Workload::List => SizeRange::fixed(0),
            S3Workload::Create => SizeRange::fixed(0),
            S3Workload::Append => SizeRange::fixed(2 * KIB),
            // The writer's objects; the prioritized reader reads one 64 KiB object.
            S3Workload::Priority => SizeRange::fixed(16 * MIB),
            S3Workload::Tenants => SizeRange::fixed(0),
        }
    }

    /// Objects prepared before the timed phase (or the key space written to).
    pub fn default_objects(self) -> u64 {
        match self {
            S3Workload::CosbenchA | S3Workload::CosbenchB => 1000,
            S3Workload::CosbenchC | S3Workload::CosbenchD => 32,
            S3Workload::WriteOnly | S3Workload::ReadOnly | S3Workload::ReadWrite => 32,
            S3Workload::List => 100_000,
            S3Workload::Append => 64,
            S3Workload::Create | S3Workload::Tenants => 0,
            S3Workload::Priority => 8,
        }
    }

    /// GET / PUT / DELETE percentages and the key popularity.
    pub fn mix(self) -> Mix {
        let (get, put, delete, zipf) = match self {
            S3Workload::CosbenchA | S3Workload::CosbenchC => (90, 5, 5, false),
            S3Workload::CosbenchB | S3Workload::CosbenchD => (5, 90, 5, false),
            S3Workload::WriteOnly | S3Workload::Create | S3Workload::Priority => (0, 100, 0, false),
            S3Workload::ReadOnly => (95, 5, 0, true),
            S3Workload::ReadWrite => (50, 50, 0, true),
            S3Workload::List | S3Workload::Append | S3Workload::Tenants => (0, 0, 0, false),
        };
        Mix { get, put, delete, zipf }
    }

    /// Whether the timed phase reads objects that must exist first.
    pub fn prepares(self) -> bool {
        let m = self.mix();
        m.get > 0 || m.delete > 0 || self == S3Workload::List || self == S3Workload::Append
    }

    pub const ALL: [S3Workload; 12] = [
        S3Workload::CosbenchA,
        S3Workload::CosbenchB,
        S3Workload::CosbenchC,
        S3Workload::CosbenchD,
        S3Workload::WriteOnly,
        S3Workload::ReadOnly,
        S3Workload::ReadWrite,
        S3Workload::List,
        S3Workload::Create,
        S3Workload::Append,
        S3Workload::Tenants,
        S3Workload::Priority,
    ];

    pub fn parse(s: &str) -> Option<S3Workload> {
        S3Workload::ALL.into_iter().find(|w| w.name() == s)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mix {
    pub get: u32,
    pub put: u32,
    pub delete: u32,
    pub zipf: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SizeRange {
    pub min: u64,
    pub max: u64,
}

impl SizeRange {
    pub fn fixed(n: u64) -> SizeRange {
        SizeRange { min: n, max: n }
    }

    fn pick(&self, rng: &mut StdRng) -> u64 {
        debug_assert!(self.min <= self.max);
        if self.min == self.max { self.min } else { rng.random_range(self.min..=self.max) }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum OpKind {
    Get,
    Put,
    Delete,
    List,
    ListDelimited,
    Append,
}

impl OpKind {
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Get => "GET",
            OpKind::Put => "PUT",
            OpKind::Delete => "DELETE",
            OpKind::List => "LIST",
            OpKind::ListDelimited => "LIST_DELIMITED",
            OpKind::Append => "APPEND",
        }
    }
}

/// One step of a worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub kind: OpKind,
    pub key: String,
    /// PUT: object size. GET: the size the worker expects. APPEND: record size. DELETE: 0.
    pub size: u64,
    /// PUT: pool offset of the payload. APPEND: write offset.
    pub offset: u64,
}

/// The key of object `index`, under one of `prefixes` prefixes when asked (listing with a delimiter).
pub fn object_key(index: u64, prefixes: u64) -> String {
    if prefixes > 1 { format!("p{:05}/obj-{index:010}", index % prefixes) } else { format!("obj-{index:010}") }
}

/// A worker's deterministic generator and its view of its own keys.
pub struct WorkerPlan {
    rng: StdRng,
    mix: Mix,
    sizes: SizeRange,
    /// Indices this worker owns: `worker + k * workers` for k in 0..owned.
    worker: u64,
    workers: u64,
    prefixes: u64,
    /// Current size of each owned key, None when it does not exist.
    state: Vec<Option<u64>>,
    zipf: Option<Zipf<f64>>,
    created: u64,
    workload: S3Workload,
}

impl WorkerPlan {
    pub fn new(workload: S3Workload, seed: u64, worker: u64, workers: u64, objects: u64, sizes: SizeRange) -> Self {
        assert!(workers > 0 && worker < workers);
        let owned = objects / workers + u64::from(worker < objects % workers);
        let rng = StdRng::seed_from_u64(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(worker));
        let zipf = (workload.mix().zipf && owned > 0).then(|| Zipf::new(owned as f64, 0.99)).and_then(Result::ok);
        WorkerPlan {
            rng,
            mix: workload.mix(),
            sizes,
            worker,
            workers,
            prefixes: 1,
            state: vec![None; owned as usize],
            zipf,
            created: 0,
            workload,
        }
    }

    /// Replaces the operation mix, keeping the workload's key popularity.
    pub fn with_mix(mut self, mix: Mix) -> Self {
        self.mix = Mix { zipf: self.mix.zipf, ..mix };
        self
    }

    pub fn with_prefixes(mut self, prefixes: u64) -> Self {
        self.prefixes = prefixes.max(1);
        self
    }

    fn key_of(&self, slot: usize) -> String {
        object_key(self.worker + slot as u64 * self.workers, self.prefixes)
    }

    /// The PUTs that create this worker's objects before the timed phase. Append streams start empty.
    pub fn prepare(&mut self) -> Vec<Step> {
        (0..self.state.len())
            .map(|slot| {
                let size = if self.workload == S3Workload::Append { 0 } else { self.sizes.pick(&mut self.rng) };
                self.state[slot] = Some(size);
                Step { kind: OpKind::Put, key: self.key_of(slot), size, offset: self.rng.random() }
            })
            .collect()
    }

    /// Keys and sizes this worker holds now (for verification after the run).
    /// After a failed write the object's state is unknown: stop reading or appending to it until rewritten.
    pub fn forget(&mut self, key: &str) {
        if let Some(slot) = (0..self.state.len()).find(|&s| self.key_of(s) == key) {
            self.state[slot] = None;
        }
    }

    pub fn existing(&self) -> Vec<(String, u64)> {
        (0..self.state.len()).filter_map(|s| self.state[s].map(|n| (self.key_of(s), n))).collect()
    }

    fn pick_slot(&mut self) -> usize {
        let n = self.state.len();
        match &self.zipf {
            Some(z) => (z.sample(&mut self.rng) as usize).saturating_sub(1).min(n - 1),
            None => self.rng.random_range(0..n),
        }
    }

    /// Picks an owned key that exists (or does not), searching from a random slot.
    fn pick_where(&mut self, exists: bool) -> Option<usize> {
        let n = self.state.len();
        if n == 0 {
            return None;
        }
        let start = self.pick_slot();
        (0..n).map(|i| (start + i) % n).find(|&s| self.state[s].is_some() == exists)
    }

    /// The next step of the timed phase.
    pub fn next_step(&mut self) -> Step {
        match self.workload {
            S3Workload::Create => {
                let key = format!("create/w{:04}/{:012}", self.worker, self.created);
                self.created += 1;
                return Step { kind: OpKind::Put, key, size: 0, offset: 0 };
            }
            S3Workload::Append => {
                let slot = self.pick_where(true).unwrap_or(0);
                let size = self.sizes.pick(&mut self.rng);
                let offset = self.state.get(slot).copied().flatten().unwrap_or(0);
                if let Some(s) = self.state.get_mut(slot) {
                    *s = Some(offset + size);
                }
                return Step { kind: OpKind::Append, key: self.key_of(slot), size, offset };
            }
            _ => {}
        }
        let total = self.mix.get + self.mix.put + self.mix.delete;
        if total == 0 {
            return self.put_step();
        }
        let roll = self.rng.random_range(0..total);
        let kind = if roll < self.mix.get {
            OpKind::Get
        } else if roll < self.mix.get + self.mix.put {
            OpKind::Put
        } else {
            OpKind::Delete
        };
        match kind {
            OpKind::Get | OpKind::Delete => match self.pick_where(true) {
                Some(slot) => {
                    let size = self.state[slot].unwrap_or(0);
                    if kind == OpKind::Delete {
                        self.state[slot] = None;
                    }
                    Step { kind, key: self.key_of(slot), size, offset: 0 }
                }
                // Nothing left to read or delete: write instead.
                None => self.put_step(),
            },
            _ => self.put_step(),
        }
    }

    /// A PUT recreates a deleted key first (keeping the population steady), else overwrites one.
    fn put_step(&mut self) -> Step {
        let slot = if self.state.is_empty() { None } else { self.pick_where(false).or_else(|| Some(self.pick_slot())) };
        let size = self.sizes.pick(&mut self.rng);
        let offset = self.rng.random();
        match slot {
            Some(s) => {
                self.state[s] = Some(size);
                Step { kind: OpKind::Put, key: self.key_of(s), size, offset }
            }
            None => {
                let key = format!("put/w{:04}/{:012}", self.worker, self.created);
                self.created += 1;
                Step { kind: OpKind::Put, key, size, offset }
            }
        }
    }
}

/// A digest of the steps issued, independent of how workers interleave: the XOR of a hash of every
/// (worker, sequence number, step).
pub fn step_hash(worker: u64, seq: u64, s: &Step) -> u64 {
    let text = format!("{worker}/{seq}/{}/{}/{}/{}", s.kind.name(), s.key, s.size, s.offset);
    crate::s3::body::key_hash(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(seed: u64, workload: S3Workload) -> Vec<Step> {
        let mut p = WorkerPlan::new(workload, seed, 1, 4, 100, workload.default_size());
        let mut v = p.prepare();
        v.extend((0..500).map(|_| p.next_step()));
        v
    }

    #[test]
    fn same_seed_same_steps_other_seed_other_steps() {
        for w in S3Workload::ALL {
            assert_eq!(run(42, w), run(42, w), "{w:?}");
        }
        assert_ne!(run(42, S3Workload::CosbenchA), run(43, S3Workload::CosbenchA));
    }

    #[test]
    fn mix_and_sizes_follow_the_workload() {
        let steps = run(1, S3Workload::CosbenchA);
        let timed = &steps[25..];
        let gets = timed.iter().filter(|s| s.kind == OpKind::Get).count();
        assert!((400..=490).contains(&gets), "{gets} GETs of 500");
        for s in steps.iter().filter(|s| s.kind == OpKind::Put) {
            assert!((KIB..=128 * KIB).contains(&s.size));
        }
        // Workers stay in their own keys: worker 1 of 4 owns indices 1, 5, 9, ...
        for s in &steps {
            let idx: u64 = s.key.trim_start_matches("obj-").parse().unwrap_or(1);
            assert_eq!(idx % 4, 1, "{}", s.key);
        }
    }

    #[test]
    fn gets_only_target_existing_keys() {
        let mut p = WorkerPlan::new(S3Workload::CosbenchB, 9, 0, 1, 10, SizeRange::fixed(5));
        let mut live: std::collections::HashMap<String, u64> =
            p.prepare().into_iter().map(|s| (s.key, s.size)).collect();
        for _ in 0..2000 {
            let s = p.next_step();
            match s.kind {
                OpKind::Get => assert_eq!(live.get(&s.key), Some(&s.size)),
                OpKind::Delete => assert!(live.remove(&s.key).is_some()),
                OpKind::Put => {
                    live.insert(s.key, s.size);
                }
                _ => unreachable!(),
            }
        }
    }

    #[test]
    fn zipf_prefers_a_few_keys() {
        let mut p = WorkerPlan::new(S3Workload::ReadOnly, 3, 0, 1, 1000, SizeRange::fixed(1));
        p.prepare();
        let mut counts = std::collections::HashMap::new();
        for _ in 0..10_000 {
            *counts.entry(p.next_step().key).or_insert(0u32) += 1;
        }
        let top = counts.values().max().copied().unwrap_or(0);
        assert!(top > 500, "hottest key read {top} times of 10,000");
    }

    #[test]
    fn append_offsets_grow_per_key() {
        let mut p = WorkerPlan::new(S3Workload::Append, 5, 0, 2, 6, SizeRange::fixed(2048));
        p.prepare();
        let mut sizes = std::collections::HashMap::new();
        for _ in 0..100 {
            let s = p.next_step();
            let cur = sizes.entry(s.key.clone()).or_insert(0u64);
            assert_eq!(s.offset, *cur);
            *cur += s.size;
        }
    }
}
