"""The attestation gate (`cluster.attestation: require | warn`; docs/attestation.md): in the batch
step, before any srun, the image must have a signed attestation of a passing verify of this
stack. What the job needs is what a site has or installs once: cosign (verify-blob, offline),
sha256sum, grep, stat.

1. IMAGE.att.json (or $ENVBUILDER_ATTESTATION) and its bundle exist and are at most 1 MiB each
   (a bigger file is refused by its size, never read);
2. `cosign verify-blob --key K --bundle ... --insecure-ignore-tlog=true` passes for one trusted key;
3. the image is hashed once (sha256sum) and the statement holds exactly one line
   `  "gate": "result=passed subject=sha256:<that digest> stack=<this stack>",` (the one text form
   attest/statement.py writes);
4. every node's node_setup compares the image's size, time and inode with the batch step's and
   hashes its own copy only where they differ (the bytes are the same on a shared file system).

require: a refusal is `die` (exit 2) naming what failed; warn: a warning, and the job runs."""

from __future__ import annotations

from ...quoting import shell_word
from ...plan.job import JobPlan

MAX_BYTES = 1 << 20     # attest/bounded.py MAX_BYTES


def batch_lines(plan: JobPlan) -> list[str]:
    gate = plan.attestation
    if gate is None:
        return []
    keys = " ".join(shell_word(k, "cluster.attestation_keys") for k in gate.keys)
    return [
        f"# Attestation gate (cluster.attestation: {gate.policy}): the image must carry a signed attestation",
        "# of a passing verify of this stack, checked here before any rank (docs/attestation.md)",
        f"ATTEST_POLICY={gate.policy}",
        f"ATTEST_KEYS=({keys})",
        f"ATTEST_STACK={shell_word(gate.stack, 'stack')}",
        "attest_refuse() {",
        '    if [ "$ATTEST_POLICY" = require ]; then die "attestation: $* (cluster.attestation: require; nothing was run)"; fi',
        '    note "warning: attestation: $*; running anyway (cluster.attestation: warn)"',
        "    return 1",
        "}",
        "# the apptainer form: the statement inside the SIF's signed group (apptainer verify hashes the file)",
        "attest_in_sif() {",
        '    local apptainer oid id="" size key ok="" n line t0=$SECONDS',
        '    apptainer=$(command -v apptainer || command -v singularity) || return 3',
        "    for oid in $(\"$apptainer\" sif list \"$IMAGE\" 2>/dev/null | awk -F'|' '$NF ~ /JSON\\.Generic/ {print $1+0}'); do",
        "        if \"$apptainer\" sif info \"$oid\" \"$IMAGE\" 2>/dev/null | grep -qE '^ *Name: +envbuilder-attestation[.]json$'; then id=$oid; fi",
        "    done",
        '    [ -n "$id" ] || return 3',
        "    size=$(\"$apptainer\" sif info \"$id\" \"$IMAGE\" | awk '/^ *Size:/ {print $2}')",
        f'    [ "${{size:-0}}" -le {MAX_BYTES} ] || {{ attest_refuse "the attestation in $IMAGE is $size bytes, more than {MAX_BYTES} (1 MiB): not an attestation"; return; }}',
        '    local why=""',
        '    for key in "${ATTEST_KEYS[@]}"; do',
        '        [ -f "$key" ] || continue',
        '        if why=$("$apptainer" verify --key "$key" "$IMAGE" 2>&1); then ok=$key; break; fi',
        "    done",
        '    case $why in *"signature not found"*) [ -n "$ok" ] || { attest_refuse "no attestation: $IMAGE holds an attestation object but no signature of it"; return; } ;; esac',
        '    case $why in *"integrity compromised"*) [ -n "$ok" ] || { attest_refuse "digest differs: $IMAGE changed after it was signed (apptainer verify: data object integrity compromised)"; return; } ;; esac',
        '    [ -n "$ok" ] || { attest_refuse "wrong key: apptainer verify of $IMAGE fails with ${ATTEST_KEYS[*]} (signed by another key)"; return; }',
        '    line=$(printf \'^  "gate": "result=passed subject=sha256:[0-9a-f]{64} stack=%s",$\' "$ATTEST_STACK")',
        '    n=$("$apptainer" sif dump "$id" "$IMAGE" | grep -cE -- "$line" || true)',
        '    if [ "$n" != 1 ]; then',
        '        if "$apptainer" sif dump "$id" "$IMAGE" | grep -qF \'"gate": "result=passed \'; then',
        '            attest_refuse "other stack: the attestation in $IMAGE is not of this job\'s stack $ATTEST_STACK"',
        "        else",
        '            attest_refuse "verify failed: the attestation in $IMAGE records no passing verify"',
        "        fi",
        "        return",
        "    fi",
        '    ATTEST_STAT=$(stat -Lc "%s %Y %i" "$IMAGE") ATTEST_IMAGE=$IMAGE ATTEST_DIGEST=signed-sif',
        '    note "attestation ok: $IMAGE (apptainer verify: signed group with the attestation) passed verify of stack ${ATTEST_STACK:0:17}..., signed by $ok (checked in $((SECONDS - t0)) s)"',
        "    export ATTEST_DIGEST ATTEST_STAT ATTEST_IMAGE",
        "}",
        "attest_gate() {",
        '    local att="${ENVBUILDER_ATTESTATION:-$IMAGE.att.json}" key ok="" size n line t0=$SECONDS',
        '    local bundle="$att.bundle"',
        '    [ -f "$IMAGE" ] || { attest_refuse "the image $IMAGE is not a file: only a .sif can carry a verify attestation"; return; }',
        '    if [ ! -f "$att" ]; then',
        "        attest_in_sif; local rc=$?",
        '        [ "$rc" = 3 ] || return "$rc"',
        '        attest_refuse "no attestation: neither $att nor an attestation signed inside $IMAGE (envbuilder verify --attest, then envbuilder attest sign)"; return',
        "    fi",
        '    [ -f "$bundle" ] || { attest_refuse "no attestation: $att has no signature bundle $bundle (envbuilder attest sign)"; return; }',
        "    for f in \"$att\" \"$bundle\"; do",
        "        size=$(stat -Lc %s \"$f\")",
        f'        [ "$size" -le {MAX_BYTES} ] || {{ attest_refuse "$f is $size bytes, more than {MAX_BYTES} (1 MiB): not an attestation"; return; }}',
        "    done",
        '    command -v cosign >/dev/null || { attest_refuse "no cosign on $(hostname) to check $bundle (install cosign 3: docs/attestation.md)"; return; }',
        '    for key in "${ATTEST_KEYS[@]}"; do',
        '        [ -f "$key" ] || continue',
        '        if cosign verify-blob --key "$key" --bundle "$bundle" --insecure-ignore-tlog=true "$att" >/dev/null 2>&1; then',
        '            ok=$key; break',
        "        fi",
        "    done",
        '    [ -n "$ok" ] || { attest_refuse "wrong key: the signature on $att verifies with none of ${ATTEST_KEYS[*]} (signed by another key, or changed after signing)"; return; }',
        "    # the image is hashed once, here; node_setup reuses the digest where the file is the same",
        '    ATTEST_DIGEST=$(sha256sum "$IMAGE" | cut -d" " -f1)',
        '    ATTEST_STAT=$(stat -Lc "%s %Y %i" "$IMAGE") ATTEST_IMAGE=$IMAGE',
        '    line=$(printf \'  "gate": "result=passed subject=sha256:%s stack=%s",\' "$ATTEST_DIGEST" "$ATTEST_STACK")',
        '    n=$(grep -cFx -- "$line" "$att" || true)',
        '    if [ "$n" != 1 ]; then',
        '        if ! grep -qF "subject=sha256:$ATTEST_DIGEST " "$att"; then',
        '            attest_refuse "digest differs: $IMAGE is sha256:$ATTEST_DIGEST; $att is of another image (or the image changed after verify)"',
        '        elif ! grep -qF \'"gate": "result=passed \' "$att"; then',
        '            attest_refuse "verify failed: $att records no passing verify"',
        "        else",
        '            attest_refuse "other stack: $att is not of this job\'s stack $ATTEST_STACK"',
        "        fi",
        "        return",
        "    fi",
        '    note "attestation ok: $IMAGE sha256:${ATTEST_DIGEST:0:12}... passed verify of stack ${ATTEST_STACK:0:17}..., signed by $ok (checked in $((SECONDS - t0)) s)"',
        "    export ATTEST_DIGEST ATTEST_STAT ATTEST_IMAGE",
        "}",
        "attest_gate || true",
    ]


def node_lines(plan: JobPlan) -> list[str]:
    """node_setup: the same bytes on every node (hashed again only where the file differs)."""
    if plan.attestation is None:
        return []
    return [
        '    if [ -n "${ATTEST_DIGEST:-}" ] && [ "$(stat -Lc "%s %Y %i" "$ATTEST_IMAGE")" != "$ATTEST_STAT" ] \\',
        '            && { [ "$ATTEST_DIGEST" = signed-sif ] || [ "$(sha256sum "$ATTEST_IMAGE" | cut -d" " -f1)" != "$ATTEST_DIGEST" ]; }; then',
        '        die "attestation: digest differs: node $(hostname) sees another $ATTEST_IMAGE than the one checked"',
        "    fi",
    ]
