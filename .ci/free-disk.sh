#!/usr/bin/env bash
# Make room for the test suite's image builds under Docker's data root.
# The suite builds two framework images plus small lock-test images; cold, they and their build
# cache take about ENVBUILDER_CI_DISK_GB (default 25) GB. A machine that has run builds before
# (benchmarks, earlier CI runs) may hold far more cache than that; the disk may also be shared.
# When less is free: drop images left by benchmarks and tests, then dangling images, then build
# cache oldest first (keeping the newest, which makes the next build warm), and only if still
# short, all of it. Exits 1 with the figures when even that is not enough.
set -euo pipefail

need_gb="${ENVBUILDER_CI_DISK_GB:-25}"
# Debian's docker.io CLI (the engine's own version); a newer CLI without buildx nags on `builder`
docker() { if [ -x /usr/bin/docker ]; then /usr/bin/docker "$@"; else command docker "$@"; fi; }
root="$(docker info --format '{{.DockerRootDir}}' 2>/dev/null || echo /var/lib/docker)"

free_gb() { df -P -B1G "$root" | awk 'NR == 2 {print $4}'; }

report() { echo "free-disk: $(free_gb) GB free under $root (want $need_gb GB); $*"; }

if [ "$(free_gb)" -ge "$need_gb" ]; then
    report "nothing to do"
    exit 0
fi

report "removing benchmark/test images and dangling images"
for image in $(docker images --format '{{.Repository}}:{{.Tag}}' | grep -E '^envbuilder-(bench|test)/'); do
    docker rmi -f "$image" >/dev/null || true
done
docker image prune -f >/dev/null

if [ "$(free_gb)" -lt "$need_gb" ]; then
    cache_gb="$(docker system df --format '{{.Type}} {{.Size}}' | awk '$1 == "Build" {print $3}')"
    report "build cache holds ${cache_gb:-?}; trimming the oldest"
    short=$(( need_gb - $(free_gb) ))
    # keep what the shortfall leaves of the cache (newest first), never less than nothing
    keep=$(python3 - "$cache_gb" "$short" <<'EOF'
import re, sys
size, short = sys.argv[1], int(sys.argv[2])
m = re.match(r"([\d.]+)\s*([kMGT]?B)", size or "")
unit = {"B": 1e-9, "kB": 1e-6, "MB": 1e-3, "GB": 1, "TB": 1e3}
gb = float(m.group(1)) * unit[m.group(2)] if m else 0.0
print(max(0, int(gb - short - 1)))
EOF
)
    docker builder prune -f --keep-storage "${keep}GB" >/dev/null
fi

if [ "$(free_gb)" -lt "$need_gb" ]; then
    report "still short; removing the whole build cache"
    docker builder prune -af >/dev/null
fi

if [ "$(free_gb)" -lt "$need_gb" ]; then
    report "not enough even with Docker's cache empty: free space elsewhere on this disk" >&2
    exit 1
fi
report "done"
