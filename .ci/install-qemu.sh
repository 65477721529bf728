#!/usr/bin/env bash
# A newer QEMU user-mode emulator as this machine's aarch64 binfmt_misc handler (issue 37).
#
# Why: Debian 12's qemu-user-static 7.2 runs the CPU aarch64 presets, but PyPI's aarch64 torch 2.15.0
# (the GH200 preset, recipes/torch215-ddp-pypi-aarch64.yaml) crashes on `import torch` under it
# (SIGSEGV after oneDNN's xbyak_aarch64 "Can't open MIDR_EL1 sysfs entry"); Debian unstable's
# qemu-user 11.1.3 imports it and runs the smoke suite (measured here, docs/aarch64.md).
#
# How: the qemu-user .deb of Debian's unstable suite (static binaries, no dependencies) is fetched
# by .ci/fetch-unstable-deb.sh (an apt configuration of its own: unstable never enters this
# machine's sources), and unpacked with dpkg-deb -x under /opt/envbuilder/qemu-VERSION: not
# installed with dpkg, so Debian 12's qemu-user-static and binfmt-support stay as they are. Its
# qemu-aarch64 is registered in /proc/sys/fs/binfmt_misc as envbuilder-qemu-aarch64 with the flags
# Debian gives its own entry (P: keep argv[0]; F: the kernel opens the interpreter now, so a
# container, whose files lack it, can use it), and every other enabled aarch64 entry (Debian's
# qemu-aarch64) is disabled, so exactly one handler serves aarch64 programs. The kernel's table does
# not survive a reboot: run this again (idempotent; prints the handler's version).
#   QEMU_VERSION (default 11.1.3): the version the figures were measured with; another one is used
#   when that one is gone from the archive, with a note.
#   --check: print the registered handler and its version; exit 1 when it is not this script's.
set -euo pipefail

log() { echo "install-qemu: $*"; }
die() { echo "install-qemu: error: $*" >&2; exit 1; }

BINFMT=/proc/sys/fs/binfmt_misc
NAME=envbuilder-qemu-aarch64
# 64-bit little-endian ELF executables for EM_AARCH64 (183 = 0xb7), as Debian's qemu-aarch64 entry
MAGIC='\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00'
MASK='\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff'

if [ "${1:-}" = --check ]; then
    [ -e "$BINFMT/$NAME" ] || { log "no $NAME handler registered"; exit 1; }
    interp=$(awk '$1 == "interpreter" {print $2}' "$BINFMT/$NAME")
    log "$(head -1 "$BINFMT/$NAME"): $interp ($("$interp" --version | head -1))"
    exit 0
fi
[ "$(id -u)" -eq 0 ] || die "must run as root (binfmt_misc)"
[ "$(uname -m)" = x86_64 ] || { log "this machine is $(uname -m): nothing to do"; exit 0; }

if [ ! -e "$BINFMT/status" ]; then
    mount -t binfmt_misc binfmt_misc "$BINFMT" || die "cannot mount binfmt_misc at $BINFMT"
fi

want=${QEMU_VERSION:-11.1.3}
root=
for found in /opt/envbuilder/qemu-"$want"*; do
    [ -x "$found/usr/bin/qemu-aarch64" ] && { root=$found; break; }
done
if [ -z "$root" ] || [ ! -x "$root/usr/bin/qemu-aarch64" ]; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    deb=$(bash "$(dirname "${BASH_SOURCE[0]}")/fetch-unstable-deb.sh" qemu-user "$want" "$work")
    version=$(dpkg-deb -f "$deb" Version)
    plain=${version#*:}
    root=/opt/envbuilder/qemu-${plain%%+*}
    rm -rf "$root.tmp"
    mkdir -p "$root.tmp"
    dpkg-deb -x "$deb" "$root.tmp"
    # the name Debian's binfmt entries use for the P flag's interpreter
    ln -s usr/bin/qemu-aarch64 "$root.tmp/aarch64-binfmt-P"
    rm -rf "$root"
    mv "$root.tmp" "$root"
fi
interp="$root/aarch64-binfmt-P"
"$interp" --version >/dev/null || die "$interp does not run here"

if [ -e "$BINFMT/$NAME" ] && grep -qx "interpreter $interp" "$BINFMT/$NAME" && grep -qx enabled "$BINFMT/$NAME"; then
    :
else
    [ -e "$BINFMT/$NAME" ] && echo -1 >"$BINFMT/$NAME"
    printf ':%s:M:0:%s:%s:%s:PF\n' "$NAME" "$MAGIC" "$MASK" "$interp" >"$BINFMT/register"
fi
# every other enabled entry for aarch64 ELF programs steps aside (the kernel would pick the newest)
for entry in "$BINFMT"/*; do
    case $(basename "$entry") in register|status|"$NAME") continue ;; esac
    if grep -qx enabled "$entry" && grep -q '^magic 7f454c460201010000000000000000000200b700' "$entry"; then
        echo 0 >"$entry"
        log "disabled $(basename "$entry") ($(awk '$1 == "interpreter" {print $2}' "$entry"))"
    fi
done
log "aarch64 handler: $NAME -> $interp ($("$interp" --version | head -1))"
