#!/usr/bin/env bash
# cosign (Sigstore) for `envbuilder attest`: Debian 12 has no package; Debian's unstable suite has
# cosign 3.1.1, which needs glibc >= 2.34 only and so runs here (checked by hand, November 2026;
# /work/shared/ENVIRONMENT.md). The .deb is fetched with an apt configuration of its own (sources
# and lists in a private folder) and installed with dpkg -i: unstable never enters this machine's
# own sources, which would offer a newer glibc. Idempotent; prints the version. Needs root.
#   COSIGN_VERSION (default 3.1.1): the version the tests were written against; another one is
#   used when that one is gone from the archive, with a note.
set -euo pipefail

log() { echo "install-cosign: $*"; }
die() { echo "install-cosign: error: $*" >&2; exit 1; }

if command -v cosign >/dev/null 2>&1; then
    log "present: cosign $(dpkg-query -W -f='${Version}' cosign 2>/dev/null || echo '(not from dpkg)')"
    exit 0
fi
[ "$(id -u)" -eq 0 ] || die "must run as root (dpkg -i)"

# the Debian mirror this machine already uses
mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
[ -n "$mirror" ] || mirror=$(awk '/^deb / {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
[ -n "$mirror" ] || mirror=http://deb.debian.org/debian

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s sid main\n' "$mirror" >"$work/sources.list"
APT=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
     -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
     -o Acquire::Check-Valid-Until=false -o Acquire::Retries=3 -o Debug::NoLocking=1)
apt-get "${APT[@]}" update -q >/dev/null
if ! apt-cache "${APT[@]}" show cosign >/dev/null 2>&1; then
    die "Debian's unstable suite at $mirror has no package cosign (apt-cache show cosign finds none):" \
        "find where Debian keeps it now (https://tracker.debian.org/pkg/cosign) and change .ci/install-cosign.sh"
fi
want=${COSIGN_VERSION:-3.1.1}
version=$(apt-cache "${APT[@]}" show cosign | awk '/^Version:/ {print $2}' | grep -m1 "^$want" || true)
if [ -z "$version" ]; then
    version=$(apt-cache "${APT[@]}" policy cosign | awk '/Candidate:/ {print $2}')
    log "note: cosign $want is gone from unstable; installing $version (tests were written against $want)"
fi
(cd "$work" && apt-get "${APT[@]}" download "cosign=$version" >/dev/null)
dpkg -i "$work"/cosign_*.deb >/dev/null
log "installed: cosign $(dpkg-query -W -f='${Version}' cosign)"
