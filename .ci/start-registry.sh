#!/usr/bin/env bash
# A real OCI registry on loopback for the attestation tests: Debian 12's docker-registry (the CNCF
# distribution registry 2.8) serving 127.0.0.1:5000 from its own storage folder, started without
# systemd. Idempotent: nothing is done when the port already answers as a registry. Needs root
# (.ci/install-system.sh installs the package).
set -euo pipefail
ADDR=${ENVBUILDER_REGISTRY_ADDR:-127.0.0.1:5000}
ROOT=${ENVBUILDER_REGISTRY_ROOT:-/var/lib/envbuilder-registry}
log() { echo "start-registry: $*"; }
die() { echo "start-registry: error: $*" >&2; exit 1; }

answers() { curl -fsS -o /dev/null "http://$ADDR/v2/" 2>/dev/null; }
if answers; then log "registry already answers on $ADDR"; exit 0; fi
command -v docker-registry >/dev/null || die "no docker-registry: apt-get install docker-registry (.ci/install-system.sh)"
mkdir -p "$ROOT/data"
cat >"$ROOT/config.yml" <<CONF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $ROOT/data
  delete:
    enabled: true
http:
  addr: $ADDR
CONF
nohup docker-registry serve "$ROOT/config.yml" >"$ROOT/registry.log" 2>&1 &
for _ in $(seq 50); do
    if answers; then log "registry on $ADDR ($(docker-registry --version 2>/dev/null | head -1)), storage $ROOT/data"; exit 0; fi
    sleep 0.2
done
die "docker-registry did not answer on $ADDR within 10 s; its log: $ROOT/registry.log"
