#!/usr/bin/env python3
"""CPU per stage of a GET from collapsed perf stacks (inferno-collapse-perf output): the share of the
server's samples whose stack passes through each stage's frames (inclusive, so nested stages overlap).
Used by scripts/profile-get.sh (issue 14).

    scripts/profile-stages.py FOLDED
"""
import re
import sys

# Stage name, regular expression over the stack (frames joined by ';'). Ordered as a request flows.
STAGES = [
    ("http: read and parse the request", r"poll_read_head|parse_headers|httparse|Http1Transaction>::parse"),
    ("auth: SigV4 check", r"SignatureContext::check"),
    ("layer: GET (all of it below)", r"S3Semantics<S> as mosaic_layer::ObjectLayer>::get_object"),
    ("layer: bucket lookup", r"S3Semantics<S>::bucket_coll"),
    ("set: resolve the version", r"mosaic_erasure::read::resolve"),
    ("layer: metadata record (attr + decode)", r"mosaic_layer::semantics::read_meta"),
    ("metadata decode (JSON)", r"ObjectMeta::decode"),
    ("store: data read, on the async thread", r"read_bytes_resident"),
    ("store: data read, on a blocking thread", r"Reader::read_bytes[^_]"),
    ("store: hop to a blocking thread", r"spawn_blocking"),
    ("checksum (crc32c)", r"crc32c|crc_fast|first_bad_unit"),
    ("erasure decode", r"reed_solomon|decode_stripes"),
    ("rocksdb (any)", r"rocksdb::"),
    ("http: write the response (syscall)", r"vfs_writev|ksys_write|__sys_sendto"),
    ("kernel: socket send", r"tcp_sendmsg"),
    ("kernel: socket receive", r"tcp_recvmsg"),
    ("memcpy (user)", r"__memmove|__memcpy"),
    ("allocator", r"mi_malloc|mi_free|_mi_|malloc|free"),
    ("futex (wake or wait)", r"futex"),
    ("scheduler: idle/park", r"park|epoll_wait"),
]


def main(path: str) -> None:
    total = 0
    counts = [0] * len(STAGES)
    patterns = [re.compile(p) for _, p in STAGES]
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            if not n.isdigit():
                continue
            total += int(n)
            for i, p in enumerate(patterns):
                if p.search(stack):
                    counts[i] += int(n)
    print(f"sample weight: {total}")
    for (name, _), c in zip(STAGES, counts):
        print(f"{100 * c / max(total, 1):5.1f}%  {name}")


if __name__ == "__main__":
    main(sys.argv[1])
