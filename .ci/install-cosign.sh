#!/usr/bin/env bash
# cosign (Sigstore) for `envbuilder attest`: Debian 12 has no package; Debian's unstable suite has
# cosign 3.1.1, which needs glibc >= 2.34 only and so runs here (checked by hand, November 2026;
# /work/shared/ENVIRONMENT.md). The .deb is fetched by .ci/fetch-unstable-deb.sh (an apt
# configuration of its own) and installed with dpkg -i. Idempotent; prints the version. Needs root.
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

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
deb=$(bash "$(dirname "${BASH_SOURCE[0]}")/fetch-unstable-deb.sh" cosign "${COSIGN_VERSION:-3.1.1}" "$work")
dpkg -i "$deb" >/dev/null
log "installed: cosign $(dpkg-query -W -f='${Version}' cosign)"
