//! Records the commit the binary is built from, for `mosaic --version`: a benchmark's result names the
//! binary it ran, not whatever the checkout holds when the script runs. It is the commit HEAD named at build
//! time ("unknown" outside a git checkout); uncommitted changes are not detected.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=MOSAIC_BUILD_COMMIT={commit}");
    // Built again when HEAD moves: HEAD itself (a checkout), the branch it names (a commit) and the
    // packed refs (a gc).
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        let dir = Path::new(&dir);
        println!("cargo:rerun-if-changed={}", dir.join("HEAD").display());
        println!("cargo:rerun-if-changed={}", dir.join("packed-refs").display());
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={}", dir.join(branch).display());
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
