"""A bounded fuzzer for `attest check` and `attest provenance` (issue 47, item 7): hostile
statements (unsigned, and signed by a TRUSTED key so every field check runs), hostile bundles,
hostile manifests and image records (not JSON, nested deep, huge integers, wrong types at every
field, not UTF-8). Every case must end in exit 0 or one message with exit 2: no traceback, no
other exit code. Seeded (ENVBUILDER_FUZZ_SEED) and bounded in cases and seconds; the counts are
printed (cases, tracebacks=0)."""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import time
from pathlib import Path

from conftest import run_envbuilder_in_process
from test_attest import ENV, MANIFEST, keys, write_statement  # noqa: F401  (keys: a fixture)

SEED = int(os.environ.get("ENVBUILDER_FUZZ_SEED", "47"))
SECONDS = float(os.environ.get("ENVBUILDER_FUZZ_SECONDS", "60"))
SIGNED_CASES = int(os.environ.get("ENVBUILDER_FUZZ_SIGNED", "30"))


def hostile_values(rng: random.Random) -> list:
    deep_list: list = []
    cur = deep_list
    for _ in range(rng.choice((20, 70, 200))):
        cur.append([])
        cur = cur[0]
    return [None, True, 0, -1, 10 ** 30, 1.5e308, "", "x" * rng.choice((1, 300, 70_000)), "\x1b[2J\n\\", [], {},
            [1, "a", None], {"a": {"b": {}}}, deep_list, {"sha256": 5}, ["passed"], {"id": []}]


def mutate(rng: random.Random, data, depth: int = 0):
    """DATA with one place (at any depth) replaced by a hostile value, or a key dropped/added."""
    data = copy.deepcopy(data)
    node, path = data, []
    while isinstance(node, (dict, list)) and node and rng.random() < 0.7:
        key = rng.choice(list(node.keys())) if isinstance(node, dict) else rng.randrange(len(node))
        path.append((node, key))
        node = node[key]
    if not path:
        return rng.choice(hostile_values(rng))
    parent, key = path[-1]
    roll = rng.random()
    if roll < 0.15 and isinstance(parent, dict):
        del parent[key]
    elif roll < 0.25 and isinstance(parent, dict):
        parent[rng.choice(["gate", "result", "stack", "verified", "summary", "checks", "id", "x"])] = \
            rng.choice(hostile_values(rng))
    else:
        parent[key] = rng.choice(hostile_values(rng))
    return data


def raw_hostile(rng: random.Random, valid: str) -> bytes:
    """Bytes that are not a well-formed statement at all."""
    return rng.choice([
        b"", b"\xff\xfe\x00garbage", b"[" * 100_000 + b"]" * 100_000, b"{" + b'"a":{' * 20_000 + b"}" * 20_001,
        b'{"_type": ' + b"9" * 5000 + b"}", b"NaN", b'{"a": Infinity}', valid[: len(valid) // 2].encode(),
        valid.encode() + b"\x00", b'{"_type": "x"}' * 3, os.urandom(rng.choice((10, 4096))),
        json.dumps([json.loads(valid)]).encode(),
    ])


def _json_refusal(out: str) -> bool:
    try:
        data = json.loads(out)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("ok") is False and bool(data.get("reason"))


class Counts(dict):
    def record(self, what: str, r) -> None:
        self["cases"] = self.get("cases", 0) + 1
        key = f"exit {r.code}"
        self[key] = self.get(key, 0) + 1
        one_message = r.err.startswith("error: ") or _json_refusal(r.out)
        bad = r.code not in (0, 2) or "Traceback" in r.err + r.out or (r.code == 2 and not one_message)
        if bad:
            self.setdefault("bad", []).append((what, r.code, r.err[-500:]))


def run_case(counts: Counts, what: str, *args: str) -> None:
    try:
        r = run_envbuilder_in_process(*args)
    except Exception as exc:           # a traceback the user would see
        counts["tracebacks"] = counts.get("tracebacks", 0) + 1
        counts.setdefault("bad", []).append((what, "traceback", repr(exc)[:500]))
        return
    counts.record(what, r)


def test_fuzz_attest_check_and_provenance(keys, tmp_path, monkeypatch):
    monkeypatch.setenv("COSIGN_PASSWORD", "")
    rng = random.Random(SEED)
    counts = Counts(tracebacks=0)
    key, pub = (str(k) for k in keys["site"])
    image = tmp_path / "x.sif"
    image.write_bytes(os.urandom(8192))
    att = write_statement(image)
    valid = att.read_text()
    statement = json.loads(valid)
    bundle = Path(f"{att}.bundle")
    proc = subprocess.run(["cosign", "sign-blob", "--key", key, "--use-signing-config=false", "--tlog-upload=false",
                           "--yes", "--bundle", str(bundle), str(att)], capture_output=True, text=True,
                          env={**os.environ, **ENV}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    valid_bundle = bundle.read_bytes()
    t0 = time.time()

    def sign(text: bytes) -> None:
        att.write_bytes(text)
        subprocess.run(["cosign", "sign-blob", "--key", key, "--use-signing-config=false", "--tlog-upload=false",
                        "--yes", "--bundle", str(bundle), str(att)], capture_output=True,
                       env={**os.environ, **ENV}, timeout=60)

    # 1. statements signed by the trusted key: every field check runs on hostile content
    for i in range(SIGNED_CASES):
        if time.time() - t0 > SECONDS / 3:
            break
        text = (json.dumps(mutate(rng, statement), indent=1).encode() if i % 4 else raw_hostile(rng, valid))
        sign(text)
        run_case(counts, f"signed statement {i}", "attest", "check", "--image", str(image), "--key", pub)
        run_case(counts, f"signed statement {i} --json", "attest", "check", "--image", str(image), "--key", pub,
                 "--json", "--stack", "lock:" + "0" * 64)
    # 2. unsigned hostile statements and bundles
    att.write_text(valid)
    i = 0
    while time.time() - t0 < SECONDS * 2 / 3:
        i += 1
        if i % 2:
            att.write_bytes(json.dumps(mutate(rng, statement)).encode() if i % 3 else raw_hostile(rng, valid))
            bundle.write_bytes(valid_bundle)
        else:
            att.write_text(valid)
            bundle.write_bytes(raw_hostile(rng, valid_bundle.decode()) if i % 4 else
                               json.dumps(mutate(rng, json.loads(valid_bundle))).encode())
        run_case(counts, f"unsigned {i}", "attest", "check", "--image", str(image), "--key", pub)
        if i >= 200:
            break
    # 3. hostile manifests and image records: attest check --folder, attest provenance
    manifest = json.loads(MANIFEST.read_text())
    folder = tmp_path / "folder"
    folder.mkdir()
    att.write_text(valid)
    bundle.write_bytes(valid_bundle)
    record = {"engine": "docker", "tag": "envbuilder/x:1", "id": "sha256:" + "a" * 64}
    j = 0
    while time.time() - t0 < SECONDS:
        j += 1
        (folder / "manifest.json").write_bytes(json.dumps(mutate(rng, manifest)).encode() if j % 3
                                               else raw_hostile(rng, json.dumps(manifest)))
        (folder / "image.json").write_bytes(json.dumps(mutate(rng, record)).encode() if j % 2
                                            else raw_hostile(rng, json.dumps(record)))
        run_case(counts, f"manifest {j} check", "attest", "check", "--image", str(image), "--key", pub,
                 "--folder", str(folder))
        run_case(counts, f"manifest {j} provenance", "attest", "provenance", str(folder), "--out",
                 str(tmp_path / "prov.json"))
        if j >= 300:
            break
    bad = counts.pop("bad", [])
    print(f"attest fuzz (seed {SEED}): {dict(counts)}, bad={len(bad)}")
    assert counts["tracebacks"] == 0 and not bad, bad[:5]
    assert counts["cases"] >= 100, counts
