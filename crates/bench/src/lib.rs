//! Workloads and reports: `mosaic bench engine` (paper 001's write workloads straight on the engine, no
//! HTTP). Measurement is honest: every operation is timed into an HDR histogram, the engine's own counters
//! give the traffic, and peak RSS comes from the kernel.
//!
//! This crate drives the engine through its public API only; it knows nothing of S3.

pub mod engine_bench;
pub mod report;

pub use engine_bench::{EngineBenchOptions, EngineBenchResult, Target, Workload, run_engine_bench};
