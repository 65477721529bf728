#!/bin/bash
# envbuilder's attestation gate for the SITE (docs/attestation.md "The site's gate"): a Slurm
# PrologSlurmctld (or node Prolog) that checks the image a job declares before the job starts,
# with the same checking program as job.sbatch's gate, run as root in a clean environment. The
# submitter can edit job.sbatch and its in-script gate; this runs in slurmctld/slurmd as root.
#
# The job declares its image:   sbatch --comment envbuilder-image=/abs/path/x.sif job.sbatch
# (x.sif.att.json + x.sif.att.json.bundle beside it, or the statement inside the SIF).
# Settings (root-owned, not writable by others): /etc/envbuilder/attestation-gate.conf, lines
#   keys=/etc/envbuilder/keys/site.pub /etc/envbuilder/keys/next.pub
#   policy=require                 # require | warn
#   verified_dir=/shared/envbuilder-verified   # optional: a root-owned read-only copy per job
# With verified_dir, the image is first copied to verified_dir/JOBID/ (root-owned, 0444) and the
# COPY is hashed and checked: the job should run that copy (ENVBUILDER_IMAGE=verified_dir/JOBID/
# NAME), which nobody but root can change. To make it the only image a job can run, restrict the
# runtime too (Apptainer's `limit container paths` in apptainer.conf, setuid mode; or the ECL).
# Remove the copy in the Epilog: rm -rf -- "verified_dir/$SLURM_JOB_ID".
# Exit: 0 passed (or warn); 1 refused, the reason on stderr (slurmctld's log; the job is requeued
# held: "launch failed requeued held"). A node Prolog's failure DRAINS the node: prefer
# PrologSlurmctld=/etc/slurm/envbuilder-attestation-prolog.sh in slurm.conf.
set -u
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
conf=/etc/envbuilder/attestation-gate.conf
[ "${1:-}" = --conf ] && conf=$2          # tests and a site's own wrapper
say() { echo "envbuilder-attestation-prolog: job ${SLURM_JOB_ID:-?}: $*" >&2; }
fail() { say "refused: $*"; [ "$policy" = warn ] && exit 0; exit 1; }
policy=require keys="" verified_dir=""
[ -f "$conf" ] || { say "no $conf: nothing checked"; exit 1; }
owner=$(stat -Lc %u -- "$conf") perm=$(stat -Lc %a -- "$conf")
if [ "$owner" != 0 ] || [ $((8#$perm & 8#022)) != 0 ]; then say "$conf is not root-owned or is writable by others"; exit 1; fi
while IFS='=' read -r k v; do
    case $k in keys) keys=$v ;; policy) policy=$v ;; verified_dir) verified_dir=$v ;; esac
done < <(grep -E '^(keys|policy|verified_dir)=' "$conf")
case $policy in require|warn) ;; *) say "policy=$policy in $conf: require or warn"; exit 1 ;; esac
read -r -a key_list <<< "$keys"
[ "${#key_list[@]}" -gt 0 ] || { say "no keys= in $conf"; exit 1; }
id=${SLURM_JOB_ID:-}
case $id in ""|*[!0-9_]*) say "no SLURM_JOB_ID"; exit 1 ;; esac
comment=${SLURM_JOB_COMMENT:-}
[ -n "$comment" ] || comment=$(scontrol show job "$id" 2>/dev/null | sed -n 's/^ *Comment=//p' | head -n 1)
image=""
case $comment in envbuilder-image=/*) image=${comment#envbuilder-image=} ;; esac
[ -n "$image" ] || fail "the job declares no image (sbatch --comment envbuilder-image=/abs/path/x.sif)"
att=$image.att.json
if [ -n "$verified_dir" ]; then
    dest="$verified_dir/$id"
    rm -rf -- "$dest"
    { mkdir -p -- "$verified_dir" && mkdir -m 0755 -- "$dest"; } || fail "cannot make $dest"
    [ -f "$image" ] || fail "the image $image is not a file"
    cp -- "$image" "$dest/${image##*/}" || fail "cannot copy $image"
    for f in "$att" "$att.bundle"; do
        if [ -f "$f" ]; then head -c $((1048576 + 1)) -- "$f" > "$dest/${f##*/}"; fi
    done
    chmod 0444 -- "$dest"/*
    image="$dest/${image##*/}" att="$dest/${att##*/}"
fi
IFS= read -r -d '' program <<'ENVBUILDER_GATE' || true
set -u
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH LC_ALL=C
mode=$1; shift
max=1048576
refuse() { printf "refuse:%s\n" "$*"; exit 2; }
# every tool by its absolute path in the system folders (type -P: never a function or alias)
tool() { local p; p=$(type -P "$1") || return 1; printf "%s" "$p"; }
for t in stat sha256sum; do tool "$t" >/dev/null || refuse "no $t in $PATH on $(uname -n)"; done
STAT=$(tool stat) SHA=$(tool sha256sum)
fp() { "$STAT" -Lc "%s %.9Y %.9Z %i" -- "$1"; }
# the image, hashed from one open descriptor: fingerprint before, hash, fingerprint after
hash_image() {
    local f=$1 fp0 fp1 fpp d
    [ -f "$f" ] || refuse "the image $f is not a file: only a .sif can carry a verify attestation"
    exec 3< "$f" || refuse "cannot read the image $f"
    fp0=$(fp /dev/fd/3) || refuse "cannot stat the image $f"
    d=$("$SHA" <&3) || refuse "cannot hash the image $f"
    fp1=$(fp /dev/fd/3); fpp=$(fp "$f" 2>/dev/null || true)
    exec 3<&-
    { [ "$fp0" = "$fp1" ] && [ "$fp0" = "$fpp" ]; } || refuse "digest differs: $f changed while it was checked (size, time or inode)"
    DIGEST=${d%% *} FP=$fp0
}
case $mode in
node|rank)
    f=$1 want_fp=$2 want_digest=${3:-}
    now=$(fp "$f" 2>/dev/null) || refuse "digest differs: $f is gone on $(uname -n)"
    if [ "$now" = "$want_fp" ]; then printf "ok|%s\n" "$now"; exit 0; fi
    [ "$mode" = node ] || refuse "digest differs: $f changed on $(uname -n) after it was checked ($now, checked $want_fp)"
    hash_image "$f"
    [ "$DIGEST" = "$want_digest" ] || refuse "digest differs: node $(uname -n) sees another $f than the one checked (sha256:$DIGEST)"
    printf "ok|%s\n" "$FP"; exit 0 ;;
esac
# mode gate: IMAGE ATTESTATION STACK KEY...
image=$1 att=$2 stack=$3; shift 3
# the private folder: under TMPDIR only when it is ours and nobody else can write it (else /tmp,
# whose sticky bit keeps others from moving our folder away)
base=${TMPDIR:-/tmp}
if [ "$base" != /tmp ] && ! { [ -d "$base" ] && [ -O "$base" ] && [ $((8#$("$STAT" -c %a -- "$base") & 8#022)) = 0 ]; }; then base=/tmp; fi
tmp=$(umask 077; mktemp -d "$base/envbuilder-gate.XXXXXX") || refuse "cannot make a private folder in $base"
trap 'rm -rf "$tmp"' EXIT
export HOME=$tmp
# one read of each file into the private folder, at most max + 1 bytes (never a FIFO's wait)
copy_once() {
    [ -f "$1" ] || return 1
    timeout 60 head -c $((max + 1)) -- "$1" > "$2" 2>/dev/null || refuse "cannot read $1"
    local size; size=$("$STAT" -c %s "$2")
    [ "$size" -le "$max" ] || refuse "$1 is more than $max (1 MiB) bytes: not an attestation"
}
# the statement's gate line of this stack (gate_spec: an image built from a lock, for a job
# rendered without the lock: the spec's own id); no stack (the site's prolog): any stack's gate line
if [ -n "$stack" ]; then key_re='gate(_spec)?' stack_re=$stack; else key_re=gate stack_re='(lock|spec):[0-9a-f]{64}'; fi
gate_re() { printf '^  "%s": "result=passed subject=sha256:%s stack=%s",$' "$key_re" "$1" "$stack_re"; }
judge() {   # the statement copy $1 of sha256 $2 (grep reads the copy only)
    local st=$1 d=$2 n
    n=$(grep -cE -- "$(gate_re "$d")" "$st" || true)
    [ "$n" = 1 ] && return 0
    if ! grep -qF "subject=sha256:$d " "$st"; then
        refuse "digest differs: $image is sha256:$d; $3 is of another image (or the image changed after verify)"
    elif ! grep -qF '"gate": "result=passed ' "$st"; then
        refuse "verify failed: $3 records no passing verify"
    fi
    refuse "other stack: $3 is not of this job's stack $stack"
}
[ -f "$image" ] || refuse "the image $image is not a file: only a .sif can carry a verify attestation"
if ! [ -f "$att" ] && ! [ -L "$att" ]; then
    # the apptainer form: the statement inside the SIF's signed group; the SIF opened once
    app=$(tool apptainer || tool singularity) || refuse "no attestation: $att does not exist (envbuilder verify --attest, then envbuilder attest sign)"
    exec 3< "$image" || refuse "cannot read the image $image"
    fd=/proc/self/fd/3
    before=$(fp "$fd")
    id=""
    for oid in $("$app" sif list "$fd" 2>/dev/null | awk -F'|' '$NF ~ /JSON\.Generic/ {print $1+0}'); do
        if "$app" sif info "$oid" "$fd" 2>/dev/null | grep -qE '^ *Name: +envbuilder-attestation[.]json$'; then id=$oid; fi
    done
    [ -n "$id" ] || refuse "no attestation: neither $att nor an attestation signed inside $image (envbuilder verify --attest, then envbuilder attest sign)"
    # in the root file system's group (one signature covers both), never a group of its own
    group=$("$app" sif list "$fd" 2>/dev/null | awk -F'|' -v id="$id" '$1+0 == id {print $2+0}')
    "$app" sif list "$fd" 2>/dev/null | awk -F'|' -v g="$group" '$NF ~ /FS/ && $2+0 == g {f=1} END {exit !f}' \
        || refuse "no attestation: the attestation in $image is in object group $group, not in the root file system's"
    size=$("$app" sif info "$id" "$fd" | awk '/^ *Size:/ {print $2}')
    [ "${size:-0}" -le "$max" ] || refuse "the attestation in $image is $size bytes, more than $max (1 MiB): not an attestation"
    "$app" sif dump "$id" "$fd" | head -c $((max + 1)) > "$tmp/att.json"
    ok="" why=""
    for key in "$@"; do
        [ -f "$key" ] || continue
        if why=$("$app" verify --key "$key" "$fd" 2>&1); then ok=$key; break; fi
    done
    if [ -z "$ok" ]; then
        case $why in
            *"signature not found"*) refuse "no attestation: $image holds an attestation object but no signature of it" ;;
            *"integrity compromised"*) refuse "digest differs: $image changed after it was signed (apptainer verify: data object integrity compromised)" ;;
            *"object not signed"*|*"not associated with object group"*) refuse "no attestation: apptainer verify of $image: the attestation object is not signed (${why##*: })" ;;
        esac
        refuse "wrong key: apptainer verify of $image fails with $* (signed by another key)"
    fi
    [ "$(fp "$fd")" = "$before" ] || refuse "digest differs: $image changed while it was checked"
    exec 3<&-
    hash_image "$image"
    [ "$FP" = "$before" ] || refuse "digest differs: $image changed while it was checked"
    n=$(grep -cE -- "$(gate_re '[0-9a-f]{64}')" "$tmp/att.json" || true)
    if [ "$n" != 1 ]; then
        grep -qF '"gate": "result=passed ' "$tmp/att.json" && refuse "other stack: the attestation in $image is not of this job's stack $stack"
        refuse "verify failed: the attestation in $image records no passing verify"
    fi
    printf "ok|%s|%s|%s|apptainer verify: signed group with the attestation\n" "$DIGEST" "$FP" "$ok"; exit 0
fi
bundle=$att.bundle
copy_once "$att" "$tmp/att.json" || refuse "no attestation: $att is not a file"
copy_once "$bundle" "$tmp/att.json.bundle" || refuse "no attestation: $att has no signature bundle $bundle (envbuilder attest sign)"
cosign=$(tool cosign) || refuse "no cosign in $PATH on $(uname -n) to check $bundle (install cosign 3: docs/attestation.md)"
ok=""
for key in "$@"; do
    [ -f "$key" ] || continue
    if "$cosign" verify-blob --key "$key" --bundle "$tmp/att.json.bundle" --insecure-ignore-tlog=true "$tmp/att.json" >/dev/null 2>&1; then
        ok=$key; break
    fi
done
[ -n "$ok" ] || refuse "wrong key: the signature on $att verifies with none of $* (signed by another key, or changed after signing)"
hash_image "$image"
judge "$tmp/att.json" "$DIGEST" "$att"
printf "ok|%s|%s|%s|cosign bundle\n" "$DIGEST" "$FP" "$ok"
ENVBUILDER_GATE
out=$(/usr/bin/env -i PATH="$PATH" TMPDIR=/tmp /bin/bash --norc --noprofile -c "$program" envbuilder-gate \
      gate "$image" "$att" "" "${key_list[@]}")
case $out in
    ok\|*) rest=${out#ok|}
           say "attestation ok: $image sha256:${rest%%|*} (verify passed; signed by a site key)"
           exit 0 ;;
    refuse:*) fail "${out#refuse:}" ;;
    *) fail "the check stopped without a verdict (${out:-no output})" ;;
esac
