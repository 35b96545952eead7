//! Microstores (paper 002, MOS): a store serves tenants of different kinds badly when they share every
//! resource, so each bucket is watched, classified by its workload, and served by the microstore of its
//! class, whose resources move toward it when it misses its target.
//!
//! This crate holds the policy only, with no IO and no clock of its own (every call takes the time), so
//! every decision is deterministic for a given input:
//! - `histogram`: a small log-scale histogram (sizes and latencies) with bounded error.
//! - `window`: one bucket's sliding window of requests: operation mix, sizes, bytes, latencies.
//! - `class`: the workload classes (COSBench A-D) and the classifier with hysteresis.
//! - `monitor`: the windows and classes of every bucket, bounded in count.
//! - `manager`: the resource manager: which microstore gains or gives back workers, and why.
//! - `sets`: which erasure sets move between microstores (their drives), and why.
//! - `io`: each microstore's points of drive IO, and the share ids its requests run in.

pub mod bandwidth;
pub mod class;
pub mod histogram;
pub mod io;
pub mod manager;
pub mod monitor;
pub mod pacer;
pub mod registry;
pub mod sets;
pub mod window;
pub mod workers;

pub use class::{Class, Classifier, ClassifyConfig};
pub use manager::{Decision, Holding, ManagerConfig, Observation, ResourceManager, Target};
pub use monitor::{BucketStatus, Monitor, MonitorConfig};
pub use registry::{BucketPlacement, Catalog, Definition, Microstores};
pub use window::{OpKind, Sample, Summary, Window, WindowConfig};
