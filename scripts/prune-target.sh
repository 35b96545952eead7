#!/usr/bin/env bash
# Keeps the cargo target directory outside the clone bounded. Every build of a test target links a new
# executable (RocksDB included, 100-300 MB each) beside the old ones, whose names differ only by a hash;
# over many builds they filled the disk (55 GB). This removes every test and bench executable in
# release/deps and debug/deps that a newer one of the same name has superseded, and the incremental caches when the
# directory is still larger than MOSAIC_TARGET_MAX_GB (default 40). Libraries (RocksDB's above all) are
# never removed, so nothing slow is rebuilt. (The name patterns are POSIX basic regular expressions: find's
# default syntax has no `\{n\}` and matched nothing, so nothing was ever pruned.)
set -euo pipefail
target="${CARGO_TARGET_DIR:?CARGO_TARGET_DIR must be set}"
# A fresh machine has no target directory yet: nothing to prune (du on a missing path fails the run).
if [ ! -d "$target" ]; then
    echo "prune-target: $target does not exist yet: nothing to prune"
    exit 0
fi
removed=0
# Both profiles: the tests build debug executables, the benchmarks and CI's s3-tests server release ones.
for deps in "$target/release/deps" "$target/debug/deps"; do
    [ -d "$deps" ] || continue
    # Executables are the files without an extension and with the execute bit: name-<16 hex digits>.
    while read -r name; do
        mapfile -t files < <(find "$deps" -maxdepth 1 -type f -perm -u+x -regextype posix-basic -regex ".*/${name}-[0-9a-f]\{16\}" -printf '%T@ %p\n' | sort -rn | cut -d' ' -f2-)
        for old in "${files[@]:1}"; do
            rm -f -- "$old" "$old.d"
            removed=$((removed + 1))
        done
    done < <(find "$deps" -maxdepth 1 -type f -perm -u+x -regextype posix-basic -regex '.*-[0-9a-f]\{16\}' -printf '%f\n' | sed 's/-[0-9a-f]\{16\}$//' | sort -u)
done
max_gb="${MOSAIC_TARGET_MAX_GB:-40}"
size_gb=$(( $(du -sk "$target" | cut -f1) / 1024 / 1024 ))
if [ "$size_gb" -gt "$max_gb" ]; then
    rm -rf -- "$target/release/incremental" "$target/debug/incremental"
    echo "prune-target: $target was ${size_gb} GB (over ${max_gb} GB): removed the incremental caches"
fi
echo "prune-target: removed $removed superseded executables; $target is $(du -sh "$target" | cut -f1)"
