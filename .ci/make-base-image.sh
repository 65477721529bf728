#!/usr/bin/env bash
# Build the local base image local/debian:bookworm (no registry is reachable here):
# (and, with --slim, local/debian:bookworm-slim, the recipes' base; see below)
#   debootstrap --variant=minbase bookworm ROOTFS MIRROR  ->  tar  ->  docker import
# MIRROR is read from apt's own sources on this machine. Does nothing when the image
# already exists (pass --force to rebuild). The rootfs is made to look like Docker
# Hub's debian:bookworm: minbase, deb822 sources for bookworm, -updates and -security,
# empty apt lists, no machine-specific files, normalised file times.
#
# --plain: the same rootfs without Docker Hub's apt settings (no docker-clean: apt keeps its
# caches unless told otherwise), as a site base made by plain debootstrap has it; tagged
# local/debian:bookworm-plain. The recipes must leave no apt cache on either base.
#
# --slim: the same rootfs made like Docker Hub's debian:bookworm-slim, tagged local/debian:bookworm-slim
# (the recipes' base): Docker Hub's slim variants are debuerreotype's rootfs with its "slimify" step
# (github.com/debuerreotype/debuerreotype, scripts/debuerreotype-slimify with scripts/.slimify-excludes
# and .slimify-includes): dpkg path excludes for documentation, manual and info pages, translations,
# lintian overrides and groff, written to /etc/dpkg/dpkg.cfg.d/docker so later installs leave them out
# too, and the files of the packages already installed that match them deleted. Kept: each package's
# copyright file and locale.alias (and the other includes of that list).
#
# --arch arm64: the arm64 base local/debian:bookworm-arm64 (issue 37), made under emulation:
# .ci/install-qemu.sh registers a qemu-aarch64 binfmt_misc handler (binfmt_misc is mounted first
# when it is not), debootstrap --arch=arm64 runs the second stage through it, and the image config written
# below says "architecture": "arm64" (`docker import --platform` is ignored by Docker 20.10 and
# records amd64, so the config is written here and loaded with `docker load`).
set -euo pipefail

PLAIN=0
SLIM=0
FORCE=0
ARCH=amd64
while [ $# -gt 0 ]; do
    case $1 in
        --force) FORCE=1 ;;
        --plain) PLAIN=1 ;;
        --slim) SLIM=1 ;;
        --arch) shift; ARCH="${1:-}" ;;
        --arch=*) ARCH="${1#--arch=}" ;;
        *) echo "usage: make-base-image.sh [--force] [--plain | --slim] [--arch amd64|arm64]" >&2; exit 2 ;;
    esac
    shift
done
case $ARCH in
    amd64|arm64) ;;
    *) echo "make-base-image: --arch $ARCH: amd64 or arm64" >&2; exit 2 ;;
esac
if { [ "$PLAIN" = 1 ] || [ "$SLIM" = 1 ]; } && [ "$ARCH" != amd64 ]; then
    echo "make-base-image: --plain and --slim are made for amd64 only" >&2; exit 2
fi
if [ "$PLAIN" = 1 ] && [ "$SLIM" = 1 ]; then
    echo "make-base-image: --plain or --slim, not both" >&2; exit 2
fi
if [ "$PLAIN" = 1 ]; then
    TAG="${ENVBUILDER_PLAIN_BASE_IMAGE:-local/debian:bookworm-plain}"
elif [ "$SLIM" = 1 ]; then
    TAG="${ENVBUILDER_SLIM_BASE_IMAGE:-local/debian:bookworm-slim}"
elif [ "$ARCH" = arm64 ]; then
    TAG="${ENVBUILDER_ARM64_BASE_IMAGE:-local/debian:bookworm-arm64}"
else
    TAG="${ENVBUILDER_BASE_IMAGE:-local/debian:bookworm}"
fi
SUITE=bookworm
DOCKER="${DOCKER:-/usr/bin/docker}"
[ -x "$DOCKER" ] || DOCKER="$(command -v docker)"

# One build at a time on this machine.
exec 9>/var/lock/envbuilder-base-image.lock
flock -w 600 9

if [ "$FORCE" = 0 ] && "$DOCKER" image inspect "$TAG" >/dev/null 2>&1; then
    echo "make-base-image: $TAG exists ($("$DOCKER" image inspect -f '{{.Id}}' "$TAG"))"
    exit 0
fi

command -v debootstrap >/dev/null || { echo "make-base-image: debootstrap missing (run .ci/install-system.sh)" >&2; exit 1; }

if [ "$ARCH" = arm64 ] && [ "$(uname -m)" != aarch64 ]; then
    # arm64 binaries (debootstrap's second stage, later the image's RUN steps) run through qemu:
    # .ci/install-qemu.sh registers Debian unstable's qemu-user (Debian 12's 7.2 crashes on PyPI's
    # aarch64 torch 2.15) as the aarch64 binfmt_misc handler, mounting binfmt_misc first
    bash "$(dirname "${BASH_SOURCE[0]}")/install-qemu.sh"
fi

# Debian mirror URLs from apt's own configuration (the same archive the host uses).
# shellcheck disable=SC2016  # $(...) is apt's format syntax, not the shell's
targets="$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 2>/dev/null | sort -u || true)"
MIRROR="${DEBIAN_MIRROR:-$(awk -v s="$SUITE" '$2 == s {print $1; exit}' <<<"$targets")}"
SECURITY_MIRROR="${DEBIAN_SECURITY_MIRROR:-$(awk -v s="$SUITE-security" '$2 == s {print $1; exit}' <<<"$targets")}"
if [ -z "$MIRROR" ]; then
    # No downloaded lists yet: read the URIs from the sources files themselves.
    MIRROR="$(grep -rhoE '(URIs:|^deb)[[:space:]]+[^[:space:]]*debian/?([[:space:]]|$)' \
        /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null | awk '{print $2; exit}' || true)"
fi
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
MIRROR="${MIRROR%/}"
SECURITY_MIRROR="${SECURITY_MIRROR:-${MIRROR%/debian}/debian-security}"
SECURITY_MIRROR="${SECURITY_MIRROR%/}"
echo "make-base-image: mirror $MIRROR, security $SECURITY_MIRROR"

WORK="$(mktemp -d /var/tmp/envbuilder-rootfs.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
ROOT="$WORK/rootfs"

start=$SECONDS
debootstrap --arch="$ARCH" --variant=minbase "$SUITE" "$ROOT" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 || {
    tail -n 40 "$WORK/debootstrap.log" >&2
    echo "make-base-image: debootstrap failed" >&2
    exit 1
}

# apt sources inside the image (as in Docker Hub's debian:bookworm).
rm -f "$ROOT/etc/apt/sources.list"
cat >"$ROOT/etc/apt/sources.list.d/debian.sources" <<SRC
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY_MIRROR
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
# Container-friendly apt settings, as the official image has them (not in the --plain base).
if [ "$PLAIN" = 0 ]; then
cat >"$ROOT/etc/apt/apt.conf.d/docker-clean" <<'CONF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
CONF
echo 'Acquire::Languages "none";' >"$ROOT/etc/apt/apt.conf.d/docker-no-languages"
echo 'Acquire::GzipIndexes "true";' >"$ROOT/etc/apt/apt.conf.d/docker-gzip-indexes"
echo 'APT::AutoRemove::SuggestsImportant "false";' >"$ROOT/etc/apt/apt.conf.d/docker-autoremove-suggests"
fi

# The slim variant: dpkg's path filter for this and later installs, and the installed files it
# would have left out deleted (dpkg's own rule: shell globs where * matches /, the last match wins).
if [ "$SLIM" = 1 ]; then
cat >"$ROOT/etc/dpkg/dpkg.cfg.d/docker" <<'CONF'
# made like Docker Hub's debian:*-slim (debuerreotype-slimify)
path-exclude /usr/share/doc/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
path-include /usr/share/doc/*/copyright
path-include /usr/share/doc/kde/HTML/C/*
path-include /usr/share/gnome/help/*/C/*
path-include /usr/share/locale/all_languages
path-include /usr/share/locale/currency/*
path-include /usr/share/locale/l10n/*
path-include /usr/share/locale/languages
path-include /usr/share/locale/locale.alias
path-include /usr/share/omf/*/*-C.emf
CONF
python3 - "$ROOT" <<'PY'
import fnmatch, os, sys
root = sys.argv[1]
rules = [line.split(None, 1) for line in open(os.path.join(root, "etc/dpkg/dpkg.cfg.d/docker"))
         if line.startswith("path-")]
def dropped(path):
    keep = True
    for option, glob in rules:
        if fnmatch.fnmatchcase(path, glob.strip()):
            keep = option == "path-include"
    return not keep
removed = 0
for top in ("doc", "groff", "info", "linda", "lintian", "locale", "man"):
    base = os.path.join(root, "usr/share", top)
    for folder, dirs, files in os.walk(base, topdown=False):
        for name in files:
            full = os.path.join(folder, name)
            if dropped("/" + os.path.relpath(full, root)):
                os.unlink(full)
                removed += 1
        if folder != base and not os.listdir(folder):
            os.rmdir(folder)
print(f"make-base-image: slim: {removed} files left out (documentation, manual pages, translations)")
PY
fi

# Drop what is machine- or time-specific.
rm -rf "${ROOT:?}"/var/lib/apt/lists/* "${ROOT:?}"/var/cache/apt/*.bin "${ROOT:?}"/var/cache/apt/archives/*.deb \
       "${ROOT:?}"/var/log/* "${ROOT:?}"/tmp/* "${ROOT:?}"/var/tmp/* "${ROOT:?}"/var/cache/ldconfig/aux-cache \
       "${ROOT:?}"/etc/hostname "${ROOT:?}"/etc/resolv.conf "${ROOT:?}"/dev/*
: >"$ROOT/etc/machine-id"
mkdir -p "$ROOT/var/lib/apt/lists/partial"

# Normalised tar stream: same packages -> same bytes -> same layer digest.
EPOCH="${SOURCE_DATE_EPOCH:-1704067200}"   # 2024-01-01
tar -C "$ROOT" --sort=name --numeric-owner --mtime="@$EPOCH" --clamp-mtime \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -cf "$WORK/rootfs.tar" .
ROOTFS_SHA="$(sha256sum "$WORK/rootfs.tar" | cut -d' ' -f1)"
# shellcheck disable=SC2016
PKGS_SHA="$(chroot "$ROOT" dpkg-query -W -f='${Package}=${Version}\n' | sort | sha256sum | cut -d' ' -f1)"

# Load it as a hand-written image archive (docker save format) rather than with
# `docker import`, whose config carries the current time: with a fixed "created" the
# image ID is a function of the rootfs alone (same packages -> same image ID).
OLD_ID="$("$DOCKER" image inspect -f '{{.Id}}' "$TAG" 2>/dev/null || true)"
mkdir -p "$WORK/image/layer"
mv "$WORK/rootfs.tar" "$WORK/image/layer/layer.tar"
python3 - "$WORK/image" "$TAG" "$ROOTFS_SHA" "$PKGS_SHA" "$MIRROR" "$SUITE" "$EPOCH" "$ARCH" <<'PY'
import datetime, hashlib, json, os, sys
out, tag, rootfs_sha, pkgs_sha, mirror, suite, epoch, arch = sys.argv[1:]
created = datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
config = {
    "architecture": arch,
    "os": "linux",
    "created": created,
    "config": {
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        "Cmd": ["bash"],
        "Labels": {
            "org.envbuilder.base.mirror": mirror,
            "org.envbuilder.base.suite": suite,
            "org.envbuilder.base.rootfs-sha256": rootfs_sha,
            "org.envbuilder.base.packages-sha256": pkgs_sha,
        },
    },
    "rootfs": {"type": "layers", "diff_ids": ["sha256:" + rootfs_sha]},
    "history": [{"created": created,
                 "created_by": f"debootstrap {'--arch=arm64 ' if arch == 'arm64' else ''}--variant=minbase {suite} {mirror}"
                               + (" (no docker-clean apt settings)" if tag.endswith("-plain") else "")
                               + (" (slim: debuerreotype-slimify's dpkg path excludes)" if tag.endswith("-slim") else "")}],
}
data = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
name = hashlib.sha256(data).hexdigest() + ".json"
with open(os.path.join(out, name), "wb") as f:
    f.write(data)
with open(os.path.join(out, "manifest.json"), "w") as f:
    json.dump([{"Config": name, "RepoTags": [tag], "Layers": ["layer/layer.tar"]}], f)
PY
tar -C "$WORK/image" -c . | "$DOCKER" load >/dev/null

ID="$("$DOCKER" image inspect -f '{{.Id}}' "$TAG")"
echo "make-base-image: built $TAG ($("$DOCKER" image inspect -f '{{.Architecture}}' "$TAG")) in $((SECONDS - start))s"
echo "make-base-image:   image id      $ID"
echo "make-base-image:   rootfs layer  sha256:$ROOTFS_SHA"
echo "make-base-image:   package list  sha256:$PKGS_SHA"
# A forced rebuild that changed the image leaves the old one untagged: drop it if unused.
if [ -n "$OLD_ID" ] && [ "$OLD_ID" != "$ID" ]; then
    "$DOCKER" image rm "$OLD_ID" >/dev/null 2>&1 || true
fi
