# The `mosaic bench s3` workloads of the S3 benchmark series, sourced by the bench scripts so that every
# series runs exactly the same commands.
# name | arguments (scaled to 2 cores and one shared disk: large objects are 16 MiB instead of 128 MiB)
WORKLOADS=(
  "cosbench-a|--workload cosbench-a --concurrency 16"
  "cosbench-b|--workload cosbench-b --concurrency 16"
  "cosbench-c|--workload cosbench-c --size 1MiB-16MiB --objects 32 --concurrency 4"
  "cosbench-d|--workload cosbench-d --size 1MiB-16MiB --objects 32 --concurrency 4"
  "write-only|--workload write-only --size 16MiB --objects 32 --concurrency 4"
  "read-only|--workload read-only --size 16MiB --objects 32 --concurrency 4"
  "read-write|--workload read-write --size 16MiB --objects 32 --concurrency 4"
  "list|--workload list --objects 100000 --prefixes 100 --concurrency 1"
  "list-c2|--workload list --objects 100000 --prefixes 100 --concurrency 2"
  "list-versions|--workload list --objects 100000 --prefixes 100 --concurrency 1 --versioning --versions 3"
  "list-versions-lean|--workload list --objects 100000 --prefixes 100 --concurrency 1 --versioning --versions 3 --list-client lean"
  "create|--workload create --concurrency 16"
  "append|--workload append --objects 64 --concurrency 16"
  "tenants|--workload tenants --tenants cosbench-b,cosbench-d:1MiB-16MiB --objects 32 --concurrency 8"
  "priority|--workload priority --size 16MiB --concurrency 4 --deadline 50ms --interval 10ms"
  "small-put|--workload write-only --size 4KiB --objects 10000 --concurrency 16"
  "small-get|--workload cosbench-a --mix 100/0/0 --size 4KiB --objects 10000 --concurrency 16"
  "large-put|--workload write-only --size 64MiB --objects 16 --concurrency 4"
  "large-get|--workload cosbench-c --mix 100/0/0 --size 64MiB --objects 16 --concurrency 4"
  "small-get-lean|--workload cosbench-a --mix 100/0/0 --size 4KiB --objects 10000 --concurrency 16 --get-client lean"
  "large-get-lean|--workload cosbench-c --mix 100/0/0 --size 64MiB --objects 16 --concurrency 4 --get-client lean"
)

