"""The attestation gate (`cluster.attestation: require | warn`; docs/attestation.md): in the batch
step, before any srun, the image must have a signed attestation of a passing verify of this
stack. What the job needs is what a site has or installs once: cosign (verify-blob, offline) or
Apptainer, and coreutils (sha256sum, stat, head, mktemp, timeout), grep.

The check is one bash program (GATE_PROGRAM), run by absolute path in a clean environment:
`/usr/bin/env -i PATH=<system folders> /bin/bash --norc --noprofile -c PROGRAM`, so no function
(`BASH_FUNC_cosign%%`), alias or other `cosign` earlier on the job's PATH can stand in for a
tool, and every tool is resolved once to an absolute path in root's folders. It has three modes:

gate   (batch step) read once, check those bytes, use those bytes: the statement and the bundle
       are copied ONCE (at most 1 MiB + 1 byte read; a bigger one is refused) into a private
       folder (mktemp -d, 0700); cosign verifies that copy and grep reads that copy. The apptainer
       form opens the SIF once and hands every apptainer command that open file
       (/proc/self/fd/3). The image is hashed from one open descriptor (`sha256sum <&3`, so every
       legal name works, backslash and newline included) with its fingerprint (size, mtime,
       ctime in ns, inode) taken BEFORE the hash and again after: a file changed meanwhile is
       refused. Prints `ok|DIGEST|FINGERPRINT|KEY|FORM`, or `refuse:REASON` (exit 2).
node   (node_setup, once per node, after the image is staged) the file the ranks will open
       (the staged copy, or the shared one) has the gate's fingerprint, or is hashed here
       (fingerprint before, hash, fingerprint after) and must have the gate's digest; its
       fingerprint is recorded in the node's private folder ($JOB_LOCAL, 0700).
rank   (each rank, on the host, just before the runtime opens the image: launch[] is prefixed)
       the image's fingerprint is still the node's record. ctime cannot be set back by a user,
       so a rewrite in place shows even with size and mtime restored.

require: a refusal is `die` (exit 2) naming what failed; warn: a warning, and the job runs."""

from __future__ import annotations

from ...quoting import shell_word
from ...plan.job import JobPlan

MAX_BYTES = 1 << 20     # attest/bounded.py MAX_BYTES
CLEAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
FINGERPRINT = "%s %.9Y %.9Z %i"     # size, mtime, ctime (ns), inode: the same on every node of a shared file system

# The checking program (single-quoted heredoc in the script: nothing in it expands there)
GATE_PROGRAM = [
    "set -u",
    f"PATH={CLEAN_PATH}",
    "export PATH LC_ALL=C",
    'mode=$1; shift',
    f"max={MAX_BYTES}",
    'refuse() { printf "refuse:%s\\n" "$*"; exit 2; }',
    "# every tool by its absolute path in the system folders (type -P: never a function or alias)",
    'tool() { local p; p=$(type -P "$1") || return 1; printf "%s" "$p"; }',
    'for t in stat sha256sum; do tool "$t" >/dev/null || refuse "no $t in $PATH on $(uname -n)"; done',
    'STAT=$(tool stat) SHA=$(tool sha256sum)',
    'fp() { "$STAT" -Lc "%s %.9Y %.9Z %i" -- "$1"; }',
    "# the image, hashed from one open descriptor: fingerprint before, hash, fingerprint after",
    "hash_image() {",
    '    local f=$1 fp0 fp1 fpp d',
    '    [ -f "$f" ] || refuse "the image $f is not a file: only a .sif can carry a verify attestation"',
    '    exec 3< "$f" || refuse "cannot read the image $f"',
    '    fp0=$(fp /dev/fd/3) || refuse "cannot stat the image $f"',
    '    d=$("$SHA" <&3) || refuse "cannot hash the image $f"',
    '    fp1=$(fp /dev/fd/3); fpp=$(fp "$f" 2>/dev/null || true)',
    '    exec 3<&-',
    '    { [ "$fp0" = "$fp1" ] && [ "$fp0" = "$fpp" ]; } || refuse "digest differs: $f changed while it was checked (size, time or inode)"',
    '    DIGEST=${d%% *} FP=$fp0',
    "}",
    'case $mode in',
    "node|rank)",
    '    f=$1 want_fp=$2 want_digest=${3:-}',
    '    now=$(fp "$f" 2>/dev/null) || refuse "digest differs: $f is gone on $(uname -n)"',
    '    if [ "$now" = "$want_fp" ]; then printf "ok|%s\\n" "$now"; exit 0; fi',
    '    [ "$mode" = node ] || refuse "digest differs: $f changed on $(uname -n) after it was checked ($now, checked $want_fp)"',
    '    hash_image "$f"',
    '    [ "$DIGEST" = "$want_digest" ] || refuse "digest differs: node $(uname -n) sees another $f than the one checked (sha256:$DIGEST)"',
    '    printf "ok|%s\\n" "$FP"; exit 0 ;;',
    "esac",
    "# mode gate: IMAGE ATTESTATION STACK KEY...",
    'image=$1 att=$2 stack=$3; shift 3',
    "# the private folder: under TMPDIR only when it is ours and nobody else can write it (else /tmp,",
    "# whose sticky bit keeps others from moving our folder away)",
    'base=${TMPDIR:-/tmp}',
    'if [ "$base" != /tmp ] && ! { [ -d "$base" ] && [ -O "$base" ] && [ $((8#$("$STAT" -c %a -- "$base") & 8#022)) = 0 ]; }; then base=/tmp; fi',
    'tmp=$(umask 077; mktemp -d "$base/envbuilder-gate.XXXXXX") || refuse "cannot make a private folder in $base"',
    'trap \'rm -rf "$tmp"\' EXIT',
    'export HOME=$tmp',
    "# one read of each file into the private folder, at most max + 1 bytes (never a FIFO's wait)",
    "copy_once() {",
    '    [ -f "$1" ] || return 1',
    '    timeout 60 head -c $((max + 1)) -- "$1" > "$2" 2>/dev/null || refuse "cannot read $1"',
    '    local size; size=$("$STAT" -c %s "$2")',
    '    [ "$size" -le "$max" ] || refuse "$1 is more than $max (1 MiB) bytes: not an attestation"',
    "}",
    "# the statement's gate line of this stack (gate_spec: an image built from a lock, for a job",
    "# rendered without the lock: the spec's own id); no stack (the site's prolog): any stack's gate line",
    'if [ -n "$stack" ]; then key_re=\'gate(_spec)?\' stack_re=$stack; else key_re=gate stack_re=\'(lock|spec):[0-9a-f]{64}\'; fi',
    'gate_re() { printf \'^  "%s": "result=passed subject=sha256:%s stack=%s",$\' "$key_re" "$1" "$stack_re"; }',
    "judge() {   # the statement copy $1 of sha256 $2 (grep reads the copy only)",
    '    local st=$1 d=$2 n',
    '    n=$(grep -cE -- "$(gate_re "$d")" "$st" || true)',
    '    [ "$n" = 1 ] && return 0',
    '    if ! grep -qF "subject=sha256:$d " "$st"; then',
    '        refuse "digest differs: $image is sha256:$d; $3 is of another image (or the image changed after verify)"',
    '    elif ! grep -qF \'"gate": "result=passed \' "$st"; then',
    '        refuse "verify failed: $3 records no passing verify"',
    "    fi",
    '    refuse "other stack: $3 is not of this job\'s stack $stack"',
    "}",
    '[ -f "$image" ] || refuse "the image $image is not a file: only a .sif can carry a verify attestation"',
    'if ! [ -f "$att" ] && ! [ -L "$att" ]; then',
    "    # the apptainer form: the statement inside the SIF's signed group; the SIF opened once",
    '    app=$(tool apptainer || tool singularity) || refuse "no attestation: $att does not exist (envbuilder verify --attest, then envbuilder attest sign)"',
    '    exec 3< "$image" || refuse "cannot read the image $image"',
    '    fd=/proc/self/fd/3',
    '    before=$(fp "$fd")',
    '    id=""',
    "    for oid in $(\"$app\" sif list \"$fd\" 2>/dev/null | awk -F'|' '$NF ~ /JSON\\.Generic/ {print $1+0}'); do",
    "        if \"$app\" sif info \"$oid\" \"$fd\" 2>/dev/null | grep -qE '^ *Name: +envbuilder-attestation[.]json$'; then id=$oid; fi",
    "    done",
    '    [ -n "$id" ] || refuse "no attestation: neither $att nor an attestation signed inside $image (envbuilder verify --attest, then envbuilder attest sign)"',
    "    # in the root file system's group (one signature covers both), never a group of its own",
    "    group=$(\"$app\" sif list \"$fd\" 2>/dev/null | awk -F'|' -v id=\"$id\" '$1+0 == id {print $2+0}')",
    "    \"$app\" sif list \"$fd\" 2>/dev/null | awk -F'|' -v g=\"$group\" '$NF ~ /FS/ && $2+0 == g {f=1} END {exit !f}' \\",
    '        || refuse "no attestation: the attestation in $image is in object group $group, not in the root file system\'s"',
    "    size=$(\"$app\" sif info \"$id\" \"$fd\" | awk '/^ *Size:/ {print $2}')",
    '    [ "${size:-0}" -le "$max" ] || refuse "the attestation in $image is $size bytes, more than $max (1 MiB): not an attestation"',
    '    "$app" sif dump "$id" "$fd" | head -c $((max + 1)) > "$tmp/att.json"',
    '    ok="" why=""',
    '    for key in "$@"; do',
    '        [ -f "$key" ] || continue',
    '        if why=$("$app" verify --key "$key" "$fd" 2>&1); then ok=$key; break; fi',
    "    done",
    '    if [ -z "$ok" ]; then',
    '        case $why in',
    '            *"signature not found"*) refuse "no attestation: $image holds an attestation object but no signature of it" ;;',
    '            *"integrity compromised"*) refuse "digest differs: $image changed after it was signed (apptainer verify: data object integrity compromised)" ;;',
    '            *"object not signed"*|*"not associated with object group"*) refuse "no attestation: apptainer verify of $image: the attestation object is not signed (${why##*: })" ;;',
    "        esac",
    '        refuse "wrong key: apptainer verify of $image fails with $* (signed by another key)"',
    "    fi",
    '    [ "$(fp "$fd")" = "$before" ] || refuse "digest differs: $image changed while it was checked"',
    '    exec 3<&-',
    '    hash_image "$image"',
    '    [ "$FP" = "$before" ] || refuse "digest differs: $image changed while it was checked"',
    '    n=$(grep -cE -- "$(gate_re \'[0-9a-f]{64}\')" "$tmp/att.json" || true)',
    '    if [ "$n" != 1 ]; then',
    '        grep -qF \'"gate": "result=passed \' "$tmp/att.json" && refuse "other stack: the attestation in $image is not of this job\'s stack $stack"',
    '        refuse "verify failed: the attestation in $image records no passing verify"',
    "    fi",
    '    printf "ok|%s|%s|%s|apptainer verify: signed group with the attestation\\n" "$DIGEST" "$FP" "$ok"; exit 0',
    "fi",
    'bundle=$att.bundle',
    'copy_once "$att" "$tmp/att.json" || refuse "no attestation: $att is not a file"',
    'copy_once "$bundle" "$tmp/att.json.bundle" || refuse "no attestation: $att has no signature bundle $bundle (envbuilder attest sign)"',
    'cosign=$(tool cosign) || refuse "no cosign in $PATH on $(uname -n) to check $bundle (install cosign 3: docs/attestation.md)"',
    'ok=""',
    'for key in "$@"; do',
    '    [ -f "$key" ] || continue',
    '    if "$cosign" verify-blob --key "$key" --bundle "$tmp/att.json.bundle" --insecure-ignore-tlog=true "$tmp/att.json" >/dev/null 2>&1; then',
    '        ok=$key; break',
    "    fi",
    "done",
    '[ -n "$ok" ] || refuse "wrong key: the signature on $att verifies with none of $* (signed by another key, or changed after signing)"',
    'hash_image "$image"',
    'judge "$tmp/att.json" "$DIGEST" "$att"',
    'printf "ok|%s|%s|%s|cosign bundle\\n" "$DIGEST" "$FP" "$ok"',
]

# how the job script runs it: by absolute path, nothing of the job's environment but TMPDIR
RUN = (f'/usr/bin/env -i PATH={CLEAN_PATH} TMPDIR="${{TMPDIR:-/tmp}}" /bin/bash --norc --noprofile '
       '-c "$ATTEST_PROGRAM" envbuilder-gate')


def batch_lines(plan: JobPlan) -> list[str]:
    gate = plan.attestation
    if gate is None:
        return []
    keys = " ".join(shell_word(k, "cluster.attestation_keys") for k in gate.keys)
    return [
        f"# Attestation gate (cluster.attestation: {gate.policy}): the image must carry a signed attestation",
        "# of a passing verify of this stack, checked here before any rank (docs/attestation.md).",
        "# What it protects against: an image or statement changed by someone other than the submitter",
        "# (a shared folder, a swapped file), a wrong image. It cannot stop a submitter, who can edit",
        "# this script: the site's own gate (a Slurm prolog, docs/attestation.md) does that.",
        f"ATTEST_POLICY={gate.policy}",
        f"ATTEST_KEYS=({keys})",
        f"ATTEST_STACK={shell_word(gate.stack, 'stack')}",
        "ATTEST_DIGEST='' ATTEST_STAT='' ATTEST_IMAGE=''",
        "attest_refuse() {",
        '    if [ "$ATTEST_POLICY" = require ]; then die "attestation: $* (cluster.attestation: require; nothing was run)"; fi',
        '    note "warning: attestation: $*; running anyway (cluster.attestation: warn)"',
        "    return 1",
        "}",
        "# The check, one program run by absolute path in a clean environment (no function, alias or",
        "# PATH of this job reaches it); modes gate (here), node (node_setup), rank (each rank's start)",
        "IFS= read -r -d '' ATTEST_PROGRAM <<'ENVBUILDER_GATE' || true",
        *GATE_PROGRAM,
        "ENVBUILDER_GATE",
        "export ATTEST_PROGRAM",
        "attest_gate() {",
        '    local att="${ENVBUILDER_ATTESTATION:-$IMAGE.att.json}" out rest key form t0=$SECONDS',
        f'    out=$({RUN} gate "$IMAGE" "$att" "$ATTEST_STACK" "${{ATTEST_KEYS[@]}}")',
        '    case $out in',
        "        ok\\|*) ;;",
        '        refuse:*) attest_refuse "${out#refuse:}"; return ;;',
        '        *) attest_refuse "the check stopped without a verdict (${out:-no output})"; return ;;',
        "    esac",
        '    rest=${out#ok|}',
        '    ATTEST_DIGEST=${rest%%|*}; rest=${rest#*|}',
        '    ATTEST_STAT=${rest%%|*}; rest=${rest#*|}',
        '    key=${rest%%|*}; form=${rest#*|}',
        '    ATTEST_IMAGE=$IMAGE',
        '    note "attestation ok: $IMAGE sha256:${ATTEST_DIGEST:0:12}... ($form) passed verify of stack ${ATTEST_STACK:0:17}..., signed by $key (checked in $((SECONDS - t0)) s)"',
        "}",
        "attest_gate || true",
        "export ATTEST_DIGEST ATTEST_STAT ATTEST_IMAGE",
    ]


def node_lines(plan: JobPlan) -> list[str]:
    """node_setup, after the image is staged: the file the ranks open on this node is the one
    checked (fingerprint, else hashed here), its fingerprint recorded for the ranks' check."""
    if plan.attestation is None:
        return []
    return [
        '    if [ -n "${ATTEST_DIGEST:-}" ]; then',
        '        local attest_f=$IMAGE attest_out',
        '        [ -f "$attest_f" ] || attest_f=$ATTEST_IMAGE   # a SIF mounted for charliecloud: the file under it',
        f'        attest_out=$({RUN} node "$attest_f" "$ATTEST_STAT" "$ATTEST_DIGEST")',
        '        case $attest_out in',
        "            ok\\|*) printf '%s\\n' \"${attest_out#ok|}\" > \"$JOB_LOCAL/attest.fp\" ;;",
        '            *) die "attestation: ${attest_out#refuse:} (node $(hostname))" ;;',
        "        esac",
        "    fi",
    ]


def launch_lines(plan: JobPlan) -> list[str]:
    """Each rank, on the host, checks the image's fingerprint against its node's record right
    before the runtime opens it (launch[] prefixed). pyxis opens the image inside srun itself
    (launch[] is empty): its last check is node_setup's."""
    if plan.attestation is None or not plan.runtime.launches_on_host:
        return []
    return [
        "# Attestation: every rank checks, just before the runtime opens the image, that it is the file",
        "# checked (its fingerprint, ctime included, is its node's record from node_setup)",
        'if [ -n "${ATTEST_DIGEST:-}" ]; then',
        "    # shellcheck disable=SC2016  # expanded by each rank's bash, not here",
        "    launch=(/bin/bash --norc --noprofile -c 'f=$IMAGE; [ -f \"$f\" ] || f=$ATTEST_IMAGE",
        f"        out=$({RUN} rank \"$f\" \"$(< \"$JOB_LOCAL/attest.fp\")\")",
        "        case $out in ok\\|*) ;; *) echo \"envbuilder: error: attestation: ${out#refuse:}\" >&2; exit 2 ;; esac",
        "        exec \"$@\"' attest-rank \"${launch[@]}\")",
        "fi",
    ]


# --- the site's gate: a Slurm prolog the submitter cannot skip ----------------------------------

PROLOG_HEAD = r"""#!/bin/bash
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
"""

PROLOG_TAIL = r"""ENVBUILDER_GATE
out=$(/usr/bin/env -i PATH="$PATH" TMPDIR=/tmp /bin/bash --norc --noprofile -c "$program" envbuilder-gate \
      gate "$image" "$att" "" "${key_list[@]}")
case $out in
    ok\|*) rest=${out#ok|}
           say "attestation ok: $image sha256:${rest%%|*} (verify passed; signed by a site key)"
           exit 0 ;;
    refuse:*) fail "${out#refuse:}" ;;
    *) fail "the check stopped without a verdict (${out:-no output})" ;;
esac
"""


def prolog_script() -> str:
    """The site's prolog (envbuilder/data/attestation-prolog.sh): the gate's program with a driver
    that reads the job's declared image and the site's settings. The stack is the job's own
    business (left empty: any stack of a passing verify signed by a site key)."""
    return PROLOG_HEAD + "\n".join(GATE_PROGRAM) + "\n" + PROLOG_TAIL
