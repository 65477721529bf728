#!/usr/bin/env bash
# This machine stands in for Docker Hub with a pull-through mirror (issue 46): Docker Hub is
# unreachable here, so the presets' public base `debian:bookworm-slim` is served by the loopback
# registry of .ci/start-registry.sh, and every engine is pointed at it the way a site points its
# engines at a mirror. Idempotent. As root, after start-docker.sh, make-base-image.sh and
# start-registry.sh.
#
# 1. The debootstrapped bases (local/debian:bookworm-slim, amd64; local/debian:bookworm-arm64) are
#    pushed as 127.0.0.1:5000/library/debian:bookworm-slim, one multi-arch index (amd64 + arm64),
#    the shape Docker Hub serves (tools/mirror_index.py writes the index).
# 2. Docker: "registry-mirrors" in /etc/docker/daemon.json (Docker Hub names only; dockerd reloads
#    it on SIGHUP, no restart); 127.0.0.0/8 is an insecure registry to dockerd by default.
# 3. buildah / podman (containers/image): a registries.conf drop-in, docker.io mirrored.
# 4. Apptainer: the same registries.conf drop-in (Apptainer 1.4.5 reads /etc/containers/
#    registries.conf.d/*.conf for docker:// mirrors; tools/apptainer-node mounts this file).
# 5. envbuilder: /etc/envbuilder/config.toml, the site config (the mirror, the wheelhouse holding
#    the CPU torch wheel, the CA bundle of this network's TLS-intercepting proxy).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ADDR=${ENVBUILDER_REGISTRY_ADDR:-127.0.0.1:5000}
DOCKER="${DOCKER:-/usr/bin/docker}"
[ -x "$DOCKER" ] || DOCKER="$(command -v docker)"
REPO=library/debian
TAG=bookworm-slim
log() { echo "mirror-bases: $*"; }

# --- 1. the bases, pushed and joined into one index
bash .ci/make-base-image.sh --slim
bash .ci/make-base-image.sh --arch arm64
if python3 tools/mirror_index.py check "$ADDR" "$REPO" "$TAG" amd64 arm64 2>/dev/null; then
    log "$ADDR/$REPO:$TAG already serves amd64 and arm64"
else
    for pair in amd64:local/debian:bookworm-slim arm64:local/debian:bookworm-arm64; do
        arch=${pair%%:*} src=${pair#*:}
        "$DOCKER" tag "$src" "$ADDR/$REPO:$TAG-$arch"
        "$DOCKER" push -q "$ADDR/$REPO:$TAG-$arch" >/dev/null
        "$DOCKER" rmi "$ADDR/$REPO:$TAG-$arch" >/dev/null
    done
    python3 tools/mirror_index.py join "$ADDR" "$REPO" "$TAG" amd64 arm64
fi

# --- 2. Docker
python3 - "$ADDR" <<'PY'
import json, os, sys
path, mirror = "/etc/docker/daemon.json", f"http://{sys.argv[1]}"
conf = json.load(open(path)) if os.path.exists(path) and os.path.getsize(path) else {}
mirrors = conf.setdefault("registry-mirrors", [])
if mirror not in mirrors:
    mirrors.append(mirror)
    os.makedirs("/etc/docker", exist_ok=True)
    with open(path + ".new", "w") as f:
        json.dump(conf, f, indent=2)
    os.replace(path + ".new", path)
    print("mirror-bases: /etc/docker/daemon.json: registry-mirrors", mirrors)
PY
if ! "$DOCKER" info --format '{{json .RegistryConfig.Mirrors}}' | grep -q "$ADDR"; then
    pkill -HUP -x dockerd
    for _ in $(seq 50); do
        "$DOCKER" info --format '{{json .RegistryConfig.Mirrors}}' | grep -q "$ADDR" && break
        sleep 0.2
    done
    "$DOCKER" info --format '{{json .RegistryConfig.Mirrors}}' | grep -q "$ADDR" \
        || { echo "mirror-bases: error: dockerd did not take the mirror after SIGHUP" >&2; exit 1; }
    log "dockerd pulls Docker Hub names through http://$ADDR"
fi

# --- 3 and 4. containers/image (buildah, podman) and Apptainer
mkdir -p /etc/containers/registries.conf.d
cat >/etc/containers/registries.conf.d/envbuilder-mirror.conf <<CONF
# written by envbuilder's .ci/mirror-bases.sh: Docker Hub through this machine's mirror
[[registry]]
prefix = "docker.io"
location = "registry-1.docker.io"
[[registry.mirror]]
location = "$ADDR"
insecure = true
CONF

# --- 5. envbuilder's site config
mkdir -p /etc/envbuilder
cat >/etc/envbuilder/config.toml.new <<CONF
# written by envbuilder's .ci/mirror-bases.sh: what this machine's site sets once
registry_mirror = "http://$ADDR"
# the CPU torch wheel (PyTorch's CPU index is unreachable from here)
wheelhouse = "/opt/wheels"
# this network's TLS-intercepting proxy
ca_bundle = "/etc/ssl/certs/ca-certificates.crt"
CONF
mv /etc/envbuilder/config.toml.new /etc/envbuilder/config.toml
log "site config /etc/envbuilder/config.toml written"

# the check a user would make: the public name, pulled by Docker through the mirror
"$DOCKER" pull -q "debian:$TAG" >/dev/null
log "docker pull debian:$TAG: $("$DOCKER" image inspect -f '{{index .RepoDigests 0}}' "debian:$TAG")"
