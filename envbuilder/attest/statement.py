"""The in-toto Statement v1 (https://github.com/in-toto/attestation/blob/main/spec/v1/statement.md:
`_type`, `subject` [{name, digest}], `predicateType`, `predicate`) that envbuilder writes:

- a verify attestation, from a PASSING verify report only (`verify_statement`): what passed (every
  check with its status and figure), the stack (versions the manifest expects, lock and spec
  hashes), runtime, site, nodes, ranks, envbuilder's version, the time;
- a build provenance statement (`provenance_statement`): the inputs of a build (lock hash, base
  digests, Dockerfile / Apptainer.def hashes, engine) and the image it made.

`dumps` is the one text form (indent 1, keys in insertion order): the predicate's `gate` value is
one line that job.sbatch matches exactly (`gate_text`), so the job needs only cosign, sha256sum
and grep."""

from __future__ import annotations

import hashlib
import json
import time

from .. import __version__

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
# predicate types of ours (URIs name them; nothing is fetched from them)
VERIFY_PREDICATE = "https://envbuilder.dev/attestation/verify/v1"
PROVENANCE_PREDICATE = "https://envbuilder.dev/attestation/build/v1"
PASSED = "passed"


def image_spec_sha256(canonical_spec: dict) -> str:
    """The spec's sha256 without its `cluster` section: what the image is, not where it runs (a
    site profile changes the cluster section, never the image)."""
    part = {k: v for k, v in canonical_spec.items() if k != "cluster"}
    return hashlib.sha256(json.dumps(part, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def stack_id(manifest: dict) -> str:
    """What "this stack" is: the lock's sha256 when the image was built from a lock, else the
    image part of the spec (image_spec_sha256); the job script computes the same (plan/job.py)."""
    lock = manifest.get("lock") if isinstance(manifest.get("lock"), dict) else None
    if lock and isinstance(lock.get("sha256"), str):
        return f"lock:{lock['sha256']}"
    spec = manifest.get("spec")
    return f"spec:{image_spec_sha256(spec) if isinstance(spec, dict) else manifest.get('spec_sha256')}"


def spec_stack_id(manifest: dict) -> str | None:
    """The `spec:` id of the image part of the manifest's spec, whatever the lock: what a job
    folder rendered without the lock (build --no-build --out elsewhere) knows of its stack."""
    spec = manifest.get("spec")
    return f"spec:{image_spec_sha256(spec)}" if isinstance(spec, dict) else None


def gate_text(digest: str, stack: str) -> str:
    """The predicate's `gate` value: result, subject digest and stack on one line."""
    return f"result={PASSED} subject=sha256:{digest} stack={stack}"


def why_not_passing(report: dict) -> str | None:
    """None when REPORT is a passing, complete verify: every check passed or was skipped, at least
    one passed, the suite exited 0 in time, and a GPU image's GPU checks ran or were left out by
    --no-gpu (recorded). Else the reason no attestation is written."""
    checks = report.get("checks")
    if not isinstance(checks, list) or not checks:
        return "the report holds no checks (the suite did not run)"
    statuses = [c.get("status") if isinstance(c, dict) else None for c in checks]
    failed = [str(c.get("name")) for c, s in zip(checks, statuses) if s == "fail"]
    if failed:
        return f"{len(failed)} check(s) failed: {', '.join(failed[:5])}"
    unknown = [str(c.get("name") if isinstance(c, dict) else c) for c, s in zip(checks, statuses)
               if s not in ("pass", "skip")]
    if unknown:
        return f"check(s) without a result: {', '.join(unknown[:5])} (a partial run)"
    if "pass" not in statuses:
        return "no check passed (everything was skipped)"
    if report.get("ok") is not True:
        return "the report does not say ok"
    run = report.get("verify") or {}
    if run.get("timed_out"):
        return "the suite timed out (a partial run)"
    if run.get("exit_code") not in (0, None):
        return f"the suite exited {run.get('exit_code')}"
    if report.get("gpu_checks") == "not run: no GPU visible":
        return "the GPU checks did not run (no GPU visible)"
    return None


def verify_statement(report: dict, manifest: dict, subject: dict, *, site: str | None = None,
                     nodes: int = 1, now: float | None = None) -> dict:
    """The verify attestation. SUBJECT: {"name": ..., "digest": {"sha256": hex}}. The caller has
    checked why_not_passing(report) is None (raise otherwise: never a statement for a failure)."""
    problem = why_not_passing(report)
    if problem:
        raise ValueError(problem)
    expect = manifest.get("expect") or {}
    run = report.get("verify") or {}
    lock = manifest.get("lock") if isinstance(manifest.get("lock"), dict) else {}
    stack = stack_id(manifest)
    spec_id = spec_stack_id(manifest)
    predicate = {
        "gate": gate_text(subject["digest"]["sha256"], stack),
        # an image built from a lock also passes the gate of a job folder rendered without that
        # lock (it knows only the spec's image part): the same line of the spec's id
        **({"gate_spec": gate_text(subject["digest"]["sha256"], spec_id)}
           if spec_id and spec_id != stack else {}),
        "result": PASSED,
        "summary": report.get("summary"),
        "gpu_checks": report.get("gpu_checks"),
        "checks": [{"name": c.get("name"), "status": c.get("status"),
                    **({"figure": c["figure"]} if c.get("figure") not in (None, "") else {})}
                   for c in report["checks"]],
        "stack": {
            "id": stack,
            **({"spec_id": spec_id} if spec_id and spec_id != stack else {}),
            "name": manifest.get("name"),
            "spec_sha256": manifest.get("spec_sha256"),
            "lock_sha256": lock.get("sha256"),
            "base_digests": lock.get("base"),
            "python": expect.get("python"),
            "framework": expect.get("framework"),
            "horovod": expect.get("horovod"),
            "mpi": expect.get("mpi"),
            "cuda": expect.get("cuda"), "cudnn": expect.get("cudnn"), "nccl": expect.get("nccl"),
            "distributed": expect.get("distributed"),
        },
        "run": {
            "runtime": run.get("runtime"),
            "image": run.get("image"),
            "ranks": report.get("ranks"),
            "launcher": report.get("launcher"),
            "nodes": nodes,
            "site": site,
            "host": report.get("host"),
            "wall_s": report.get("wall_s"),
            "suite_version": report.get("suite_version"),
        },
        "envbuilder": __version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now)),
    }
    return {"_type": STATEMENT_TYPE, "subject": [subject], "predicateType": VERIFY_PREDICATE,
            "predicate": predicate}


def provenance_statement(manifest: dict, files: dict[str, str], image: dict, subject: dict, *,
                         now: float | None = None) -> dict:
    """The build provenance: FILES the hashes of the build's inputs (Dockerfile, Apptainer.def,
    envbuilder.lock), IMAGE the build's record (image.json: engine, tag, id)."""
    lock = manifest.get("lock") if isinstance(manifest.get("lock"), dict) else {}
    predicate = {
        "stack": {"id": stack_id(manifest), "name": manifest.get("name"),
                  "spec_sha256": manifest.get("spec_sha256"), "lock_sha256": lock.get("sha256")},
        "inputs": {"files": files, "base": (manifest.get("image") or {}).get("base"),
                   "base_digests": lock.get("base")},
        "engine": image.get("engine"),
        "image": {k: image.get(k) for k in ("tag", "id", "digest", "pushed") if image.get(k)},
        "envbuilder": __version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now)),
    }
    return {"_type": STATEMENT_TYPE, "subject": [subject], "predicateType": PROVENANCE_PREDICATE,
            "predicate": predicate}


def dumps(statement: dict) -> str:
    """The one text form of a statement (the job gate matches its `gate` line)."""
    return json.dumps(statement, indent=1, ensure_ascii=True) + "\n"


def gate_line(digest: str, stack: str) -> str:
    """The exact line dumps() writes for the gate value (job.sbatch greps for it)."""
    return '  "gate": ' + json.dumps(gate_text(digest, stack)) + ","
