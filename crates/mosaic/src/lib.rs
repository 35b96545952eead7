//! The parts of the `mosaic` binary that other crates need to reach: the parsers of what a user or the data
//! directory hands the binary (the data directory's small files, human sizes), so the fuzz targets in
//! `fuzz/` can feed them arbitrary input.

pub mod datadir_format;
pub mod size_format;
