#!/usr/bin/env bash
# Real Apptainer for the tests and for users of this machine (Debian 12 has no apptainer package,
# and Debian's needs glibc >= 2.38): a Docker image local/envbuilder-apptainer:<hash of this
# script and envbuilder's runtime dependencies> made from a debootstrapped Debian 13 (trixie):
#   - apptainer from Debian's unstable suite (sid), pinned low so that only apptainer comes from
#     it (its dependencies, glibc included, stay Debian 13's); the unstable Release file is past
#     its Valid-Until date, so apt inside ignores that date (as this machine's own apt does);
#   - squashfuse, fuse2fs, fuse-overlayfs (Debian's package brings no FUSE helpers) and uidmap
#     (newuidmap/newgidmap: `build --fakeroot` with subordinate ids);
#   - the non-root user `builder` (uid 1000, subordinate ids 100000-165535): Apptainer runs
#     unprivileged, as most HPC users run it (root's exec and build fail in a container here);
#   - python3 + a venv at /opt/envbuilder-venv with envbuilder's runtime dependencies
#     (pyproject.toml; pip trusts this network's CA through a BuildKit secret, in no layer).
# tools/apptainer-node runs a command in a container of it with the flags Apptainer needs.
#   .ci/install-apptainer.sh          build the image unless it exists; print the versions
#   .ci/install-apptainer.sh --tag    print the image's tag only (tools/apptainer-node, tests)
# Needs root, Docker (.ci/start-docker.sh) and debootstrap (.ci/install-system.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

SUITE=trixie
BASE="local/debian:$SUITE"
CA_BUNDLE="${ENVBUILDER_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
DOCKER="${DOCKER:-/usr/bin/docker}"
[ -x "$DOCKER" ] || DOCKER="$(command -v docker)"

log() { echo "install-apptainer: $*"; }
die() { echo "install-apptainer: error: $*" >&2; exit 1; }

requirements() {  # envbuilder's runtime dependencies, one a line, as pyproject.toml lists them
    python3 -c 'import sys, tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))'
}

dockerfile() {
    cat <<'EOF'
ARG BASE
FROM ${BASE}
RUN set -eu; \
    rm -f /etc/apt/sources.list; \
    mirror=$(cat /etc/envbuilder-mirror); \
    printf 'Types: deb\nURIs: %s\nSuites: trixie trixie-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\nTypes: deb\nURIs: %s\nSuites: sid\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
        "$mirror" "$mirror" >/etc/apt/sources.list.d/debian.sources; \
    printf 'Package: *\nPin: release n=sid\nPin-Priority: 100\n' >/etc/apt/preferences.d/sid-low; \
    echo 'Acquire::Check-Valid-Until "false";' >/etc/apt/apt.conf.d/99-unstable-valid-until; \
    apt-get update -q; \
    if ! apt-cache show apptainer/sid >/dev/null 2>&1; then \
        echo "install-apptainer: Debian's unstable suite at $mirror no longer has the package apptainer" \
             "(apt-cache show apptainer/sid finds none): find where Debian keeps it now" \
             "(https://tracker.debian.org/pkg/apptainer) and change .ci/install-apptainer.sh" >&2; \
        exit 3; \
    fi; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        apptainer/sid squashfuse fuse2fs fuse-overlayfs uidmap \
        python3 python3-venv ca-certificates util-linux; \
    apt-get clean; rm -rf /var/lib/apt/lists/*
RUN useradd -m -u 1000 -s /bin/bash builder \
 && echo 'builder:100000:65536' >/etc/subuid && echo 'builder:100000:65536' >/etc/subgid
COPY requirements.txt /opt/envbuilder-requirements.txt
RUN --mount=type=secret,id=ca \
    python3 -m venv /opt/envbuilder-venv \
 && PIP_CERT=/run/secrets/ca /opt/envbuilder-venv/bin/python -m pip install -q --no-cache-dir \
        --disable-pip-version-check -r /opt/envbuilder-requirements.txt
COPY entry.sh /usr/local/bin/apptainer-node-entry
ENV PATH=/opt/envbuilder-venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1
ENTRYPOINT ["/usr/local/bin/apptainer-node-entry"]
EOF
}

entry() {  # the container's first process: as root, /dev/fuse usable, then the command as builder
    cat <<'EOF'
#!/bin/sh
# /dev/fuse comes from the host as root's alone: the user must open it (squashfuse, fuse2fs);
# a container started without it shows what envbuilder says then. The Docker socket's group
# joins the user's groups (Bootstrap: docker-daemon).
set -eu
if [ -c /dev/fuse ]; then chmod 666 /dev/fuse; fi
groups=$(id -G builder | tr ' ' ',')
if [ -S /var/run/docker.sock ]; then groups="$groups,$(stat -c %g /var/run/docker.sock)"; fi
export HOME=/home/builder USER=builder LOGNAME=builder
exec setpriv --reuid=1000 --regid=1000 --groups="$groups" -- "$@"
EOF
}

image_tag() {
    local hash
    hash=$({ cat "${BASH_SOURCE[0]}"; requirements; } | sha256sum | cut -c1-12)
    echo "local/envbuilder-apptainer:$hash"
}

if [ "${1:-}" = --tag ]; then
    image_tag
    exit 0
fi
[ $# -eq 0 ] || { echo "usage: install-apptainer.sh [--tag]" >&2; exit 2; }

TAG=$(image_tag)
versions() {
    # shellcheck disable=SC2016  # dpkg-query's format, expanded by nobody
    "$DOCKER" run --rm --device /dev/fuse --cap-add SYS_ADMIN "$TAG" sh -c \
        'apptainer --version; dpkg-query -W -f "\${Package} \${Version}\n" squashfuse fuse2fs fuse-overlayfs; python3 --version'
}

if "$DOCKER" image inspect "$TAG" >/dev/null 2>&1; then
    log "$TAG exists"
    versions | sed 's/^/install-apptainer:   /'
    exit 0
fi
[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap)"
command -v debootstrap >/dev/null || die "debootstrap missing (run .ci/install-system.sh)"
[ -s "$CA_BUNDLE" ] || die "no CA bundle at $CA_BUNDLE (pip inside the image needs it; set ENVBUILDER_CA_BUNDLE)"

# One build at a time on this machine.
exec 9>/var/lock/envbuilder-apptainer-image.lock
flock -w 1200 9

# shellcheck disable=SC2016  # $(...) is apt's format syntax, not the shell's
MIRROR="${DEBIAN_MIRROR:-$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 2>/dev/null \
    | awk '$2 == "bookworm" {print $1; exit}')}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
MIRROR="${MIRROR%/}"
WORK="$(mktemp -d /var/tmp/envbuilder-apptainer.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
start=$SECONDS

if ! "$DOCKER" image inspect "$BASE" >/dev/null 2>&1; then
    log "debootstrap --variant=minbase $SUITE from $MIRROR"
    debootstrap --variant=minbase "$SUITE" "$WORK/rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 || {
        tail -n 40 "$WORK/debootstrap.log" >&2
        die "debootstrap $SUITE failed"
    }
    echo "$MIRROR" >"$WORK/rootfs/etc/envbuilder-mirror"
    rm -rf "${WORK:?}"/rootfs/var/lib/apt/lists/* "${WORK:?}"/rootfs/var/cache/apt/archives/*.deb
    tar -C "$WORK/rootfs" --numeric-owner -c . | "$DOCKER" import - "$BASE" >/dev/null
    rm -rf "$WORK/rootfs"
    log "made $BASE in $((SECONDS - start))s"
fi

mkdir -p "$WORK/context"
dockerfile >"$WORK/context/Dockerfile"
entry >"$WORK/context/entry.sh"
chmod 0755 "$WORK/context/entry.sh"
requirements >"$WORK/context/requirements.txt"
log "building $TAG"
if ! DOCKER_BUILDKIT=1 "$DOCKER" build --progress=plain --build-arg "BASE=$BASE" --secret "id=ca,src=$CA_BUNDLE" \
        -t "$TAG" "$WORK/context" >"$WORK/build.log" 2>&1; then
    if grep -q 'install-apptainer: ' "$WORK/build.log"; then
        grep -o 'install-apptainer: .*' "$WORK/build.log" | head -n 1 >&2
    else
        tail -n 40 "$WORK/build.log" >&2
    fi
    die "building $TAG failed"
fi
log "built $TAG in $((SECONDS - start))s"
versions | sed 's/^/install-apptainer:   /'
# an earlier image of this script's inputs is left unused: drop it
"$DOCKER" image ls --format '{{.Repository}}:{{.Tag}}' local/envbuilder-apptainer \
    | grep -vxF "$TAG" | xargs -r "$DOCKER" image rm >/dev/null 2>&1 || true
