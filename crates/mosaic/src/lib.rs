//! The parts of the `mosaic` binary that other crates need to reach: today only the text formats of the
//! data directory's small files, so the fuzz targets in `fuzz/` can feed them arbitrary input.

pub mod datadir_format;
