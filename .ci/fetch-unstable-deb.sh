#!/usr/bin/env bash
# Download one package's .deb from Debian's unstable suite into DIR and print its path, with an apt
# configuration of its own (sources, lists and cache under DIR): unstable never enters this
# machine's own sources, which would offer a newer glibc. Used for what Debian 12 lacks or has too
# old (.ci/install-cosign.sh: cosign; .ci/install-qemu.sh: qemu-user).
#   fetch-unstable-deb.sh PACKAGE VERSION DIR
# VERSION is the upstream version the tests were written against (an epoch may precede it); when
# unstable no longer has it, its current version is taken, with a note on stderr.
set -euo pipefail

die() { echo "fetch-unstable-deb: error: $*" >&2; exit 1; }
[ $# -eq 3 ] || die "usage: fetch-unstable-deb.sh PACKAGE VERSION DIR"
pkg=$1 want=$2 dir=$3

# the Debian mirror this machine already uses
mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
[ -n "$mirror" ] || mirror=$(awk '/^deb / {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
[ -n "$mirror" ] || mirror=http://deb.debian.org/debian

mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s sid main\n' "$mirror" >"$dir/sources.list"
APT=(-o "Dir::Etc::SourceList=$dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
     -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir/cache"
     -o Acquire::Check-Valid-Until=false -o Acquire::Retries=3 -o Debug::NoLocking=1
     -o APT::Sandbox::User=root)
apt-get "${APT[@]}" update -q >/dev/null
apt-cache "${APT[@]}" show "$pkg" >/dev/null 2>&1 || \
    die "Debian's unstable suite at $mirror has no package $pkg (apt-cache show $pkg finds none):" \
        "find where Debian keeps it now (https://tracker.debian.org/pkg/$pkg)"
version=$(apt-cache "${APT[@]}" show "$pkg" | awk '/^Version:/ {print $2}' | grep -m1 -E "^([0-9]+:)?${want//./\\.}" || true)
if [ -z "$version" ]; then
    version=$(apt-cache "${APT[@]}" policy "$pkg" | awk '/Candidate:/ {print $2}')
    echo "fetch-unstable-deb: note: $pkg $want is gone from unstable; taking $version (the tests were written against $want)" >&2
fi
(cd "$dir" && apt-get "${APT[@]}" download "$pkg=$version" >/dev/null)
found=("$dir/${pkg}_"*.deb)
[ -f "${found[0]}" ] || die "apt-get download $pkg=$version wrote no .deb in $dir"
echo "${found[0]}"
