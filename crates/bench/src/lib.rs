//! Workloads and reports. `mosaic bench engine` runs paper 001's write workloads straight on the engine
//! (no HTTP); `mosaic bench s3` runs the papers' workloads against any S3 endpoint; `mosaic bench compare`
//! sets results side by side. Measurement is honest: every operation is timed into an HDR histogram,
//! errors are counted by class, bodies read back are verified, and peak RSS comes from the kernel.
//!
//! This crate drives the engine through its public API and S3 stores through aws-sdk-s3 only; it knows
//! nothing of Mosaic's server internals.

pub mod ceiling;
pub mod compare;
pub mod engine_bench;
pub mod plot;
pub mod report;
pub mod s3;

pub use engine_bench::{EngineBenchOptions, EngineBenchResult, Target, Workload, run_engine_bench};
