#!/usr/bin/env bash
# Make room for the test suite's image builds under Docker's data root.
# The suite builds its framework images plus small lock-test images; cold, they and their build
# cache take about ENVBUILDER_CI_DISK_GB (default 25) GB. A machine that has run builds before
# (benchmarks, earlier CI runs) may hold far more cache than that; the disk may also be shared.
#
# The build cache is what keeps the suite fast: a cold run compiles Horovod twice and installs
# every framework again (about 25 more minutes on 2 cores). So when less is free, this frees the
# cheapest things first and the cache last, least recently used first, in steps, stopping as soon
# as enough is free:
#   1. what earlier test runs left: images tagged envbuilder-(bench|test)/, dangling images,
#      pytest folders older than a day, charliecloud conversions in the test caches;
#   2. build cache not used for a week, 3 days, a day, 12, 6, 3, 1 hours;
#   3. build cache down to a shrinking size (newest kept), 5 GB a step;
#   4. only then all of it.
# Exits 1 with the figures when even that is not enough.
set -euo pipefail

need_gb="${ENVBUILDER_CI_DISK_GB:-25}"
# Debian's docker.io CLI (the engine's own version); a newer CLI without buildx nags on `builder`
docker() { if [ -x /usr/bin/docker ]; then /usr/bin/docker "$@"; else command docker "$@"; fi; }
root="$(docker info --format '{{.DockerRootDir}}' 2>/dev/null || echo /var/lib/docker)"

free_gb() { df -P -B1G "$root" | awk 'NR == 2 {print $4}'; }
enough() { [ "$(free_gb)" -ge "$need_gb" ]; }
report() { echo "free-disk: $(free_gb) GB free under $root (want $need_gb GB); $*"; }

cache_gb() {   # the build cache's size in whole GB (docker prints e.g. "48.32GB" or "512MB")
    docker system df --format '{{.Type}} {{.Size}}' | python3 -c '
import re, sys
for line in sys.stdin:
    kind, _, size = line.strip().partition(" ")
    m = re.match(r"([\d.]+)\s*([kMGT]?B)", size.split()[-1] if size else "")
    if kind == "Build" and m:
        unit = {"B": 1e-9, "kB": 1e-6, "MB": 1e-3, "GB": 1, "TB": 1e3}
        print(int(float(m.group(1)) * unit[m.group(2)]))
        break
else:
    print(0)'
}

if enough; then
    report "nothing to do"
    exit 0
fi

report "removing what earlier test runs left (test images, dangling images, old test folders)"
for image in $(docker images --format '{{.Repository}}:{{.Tag}}' | grep -E '^envbuilder-(bench|test)/'); do
    docker rmi -f "$image" >/dev/null || true
done
docker image prune -f >/dev/null
find /tmp/pytest-of-* -mindepth 1 -maxdepth 1 -name 'pytest-*' -mtime +0 -exec rm -rf {} + 2>/dev/null || true
for cache in /var/lib/envbuilder-minicluster/shared/charliecloud /var/tmp/envbuilder-charliecloud; do
    [ -d "$cache" ] && find "$cache" -mindepth 1 -maxdepth 1 -exec rm -rf {} + 2>/dev/null || true
done

for hours in 168 72 24 12 6 3 1; do
    enough && break
    report "build cache holds $(cache_gb) GB; removing what was not used for ${hours} h"
    docker builder prune -f --filter "until=${hours}h" >/dev/null
done

keep=$(cache_gb)
while ! enough && [ "$keep" -gt 5 ]; do
    keep=$(( keep - 5 ))
    report "keeping the newest ${keep} GB of build cache"
    docker builder prune -f --keep-storage "${keep}GB" >/dev/null
done

if ! enough; then
    report "still short; removing the whole build cache"
    docker builder prune -af >/dev/null
fi

if ! enough; then
    report "not enough even with Docker's cache empty: free space elsewhere on this disk" >&2
    exit 1
fi
report "done"
