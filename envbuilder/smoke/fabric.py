"""The transport each layer really used, read inside a running rank, and what the site promised.

A rank reads its own process after the collectives ran (``observe``): Open MPI's selected
components are the ``mca_pml_*``/``mca_btl_*``/``mca_mtl_*`` objects still mapped in
/proc/self/maps (Open MPI unloads the components it did not select: `pml_base_verbose=10`
prints "select: component ob1 selected" then "unloading component cm"), UCX's and libfabric's
libraries likewise, NCCL's network from its own init log (``parse_nccl_log``), and whether an
RDMA device is visible at all. Maps alone cannot tell what an MPI chose when its components are
built in (the PyPI Open MPI wheel) or when it is MPICH (ch4:ucx and ch4:ofi in one library), so
in a fabric run the rank also asks each layer to log its own choice into the run's folder before
MPI starts (``transport_logging_setup``): Open MPI's component selection (`*_base_verbose=10`,
written to a file through ``OPAL_OUTPUT_STDERR_FD``, opal/util/output.c) and UCX's protocol
tables (``UCX_PROTO_INFO=y`` into ``UCX_LOG_FILE``), and reads them back (``parse_ompi_log``,
``parse_ucx_log``). ``judge`` (the launcher, rank 0) turns every rank's observation
into one `fabric` check: with a fabric that promises RDMA (ENVBUILDER_FABRIC, set by job.sbatch
from the site profile's `fabric:`), a layer that fell back to TCP or sockets across nodes fails,
naming the layer, the node and the likely cause. ``floor_checks`` compares the measured
allreduce bus bandwidth with the profile's floors (ENVBUILDER_BANDWIDTH_FLOOR).

Standard library only, Python >= 3.8.
"""

import glob
import os
import re
import shutil
import socket
import sys
import tempfile

from .common import FAIL, PASS, SKIP, fmt_rate, result


def _rate(bytes_per_s):
    """fmt_rate, down to single bytes (a floor of 1 B/s reads as such)."""
    return fmt_rate(bytes_per_s) if bytes_per_s >= 1e3 else "%g B/s" % bytes_per_s

FABRIC_ENV = "ENVBUILDER_FABRIC"
FLOOR_ENV = "ENVBUILDER_BANDWIDTH_FLOOR"
RDMA_FABRICS = ("ib", "roce", "slingshot", "efa")
TCP_LIKE = ("tcp", "sockets", "udp", "tcp;ofi_rxm", "socket")
SHARED_MEMORY_BTLS = ("self", "vader", "sm", "smcuda")
DEVICE_BTLS = ("uct", "openib", "usnic", "ugni")      # BTLs that send only through an RDMA device
NCCL_LOG_NAME = "nccl-%h-%p.log"         # NCCL_DEBUG_FILE's pattern (%h host, %p pid)
UCX_LOG_NAME = "ucx-%h-%p.log"           # UCX_LOG_FILE's pattern (the same %h, %p)
UCX_LOG_DIR_ENV = "ENVBUILDER_UCX_LOG_DIR"   # the node-local folder transport_logging_setup made
OMPI_LOG_ENV = "ENVBUILDER_OMPI_LOG"     # the file this rank's Open MPI selection log goes to
OMPI_VERBOSE = ("OMPI_MCA_pml_base_verbose", "OMPI_MCA_mtl_base_verbose", "OMPI_MCA_btl_base_verbose")
# UCX transports (uct names) that carry RDMA: verbs/mlx5 RC, DC, UD and EFA's SRD; tcp is TCP, and
# self/posix/sysv/cma/knem/xpmem/cuda_* stay inside a node
UCX_RDMA_TLS = re.compile(r"^(rc|dc|ud)(_[a-z0-9]+)?$|^(srd|gga|ib)$")
UNITS = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def fabric():
    """The site's fabric for this run ('' when the job named none)."""
    return os.environ.get(FABRIC_ENV, "").strip()


def check_name(tag):
    return "fabric.transport" + tag


# ----------------------------------------------------------------------------- one rank

def loaded_libraries(maps_text=None):
    """Base names of the shared objects mapped in this process."""
    if maps_text is None:
        try:
            with open("/proc/self/maps") as fh:
                maps_text = fh.read()
        except OSError:
            return set()
    return set(re.findall(r"/([^/\s]+\.so(?:\.[0-9.]+)?)\s*$", maps_text, re.M))


def mpi_components(libs):
    """Open MPI's selected pml/mtl and initialised btl components, from the mapped objects."""
    out = {}
    for kind in ("pml", "btl", "mtl"):
        out[kind] = sorted(set(m.group(1) for lib in libs for m in [re.match(r"mca_%s_(\w+)\.so" % kind, lib)]
                               if m and m.group(1) != "monitoring"))
    return out


def rdma_devices():
    """What the container sees of RDMA hardware."""
    ib = sorted(os.listdir("/sys/class/infiniband")) if os.path.isdir("/sys/class/infiniband") else []
    return {"dev_infiniband": os.path.isdir("/dev/infiniband"), "ib_devices": ib,
            "cxi": bool(glob.glob("/dev/cxi*")), "efa": any(d.startswith("efa") for d in ib)}


def verbs_provider_present():
    """libibverbs and at least one provider (ibverbs-providers) in the image."""
    dirs = [d for pat in ("/usr/lib/*/libibverbs", "/usr/lib64/libibverbs", "/usr/lib/libibverbs")
            for d in glob.glob(pat)]
    return any(glob.glob(os.path.join(d, "lib*-rdmav*.so")) for d in dirs)


# ----------------------------------------------------------------------------- the layers' own logs

def transport_logging_setup(workdir, environ=None):
    """Before MPI starts in a fabric run: Open MPI and UCX write which transport they chose
    (Open MPI's log into WORKDIR, UCX's into a node-local temporary folder), unless the user
    already sent their logs somewhere. Open MPI's component selection goes to a file of its own
    through OPAL_OUTPUT_STDERR_FD (the descriptor opal_output writes its stderr stream to), so
    the rank's stderr is not flooded; UCX's protocol tables (UCX_PROTO_INFO) go to UCX_LOG_FILE. ENVIRON (default: this process's) is what is set."""
    env = os.environ if environ is None else environ
    os.makedirs(workdir, exist_ok=True)
    if "OPAL_OUTPUT_STDERR_FD" not in env and not any(v in env for v in OMPI_VERBOSE):
        path = os.path.join(workdir, "ompi-%s-%d.log" % (socket.gethostname(), os.getpid()))
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError:
            fd = None
        if fd is not None:
            env["OPAL_OUTPUT_STDERR_FD"] = str(fd)
            env[OMPI_LOG_ENV] = path
            for name in OMPI_VERBOSE:
                env[name] = "10"
    if "UCX_LOG_FILE" not in env and "UCX_PROTO_INFO" not in env:
        # UCX's log goes to a short node-local folder, not the run's: with the log in a job folder
        # on the shared file system at a long enough path, MPICH 5.0.2's UCX address exchange
        # across nodes broke ("Assertion `*addr_version == UCP_OBJECT_VERSION_V2' failed",
        # "Destination is unreachable"; CI 2026-11-28, 2 nodes x 2 ranks, deterministic at that
        # path, gone with the log in /tmp). Only this process reads it (read_transport_logs).
        try:
            folder = tempfile.mkdtemp(prefix="envbuilder-ucx-")
        except OSError:
            folder = None
        if folder is not None:
            env["UCX_PROTO_INFO"] = "y"
            env["UCX_LOG_FILE"] = os.path.join(folder, UCX_LOG_NAME)
            env[UCX_LOG_DIR_ENV] = folder


def parse_ompi_log(text):
    """Open MPI's choice from its `*_base_verbose=10` selection log: {'pml': name or None,
    'mtl': [selected], 'btl': [initialised]}; None when the log holds no selection."""
    pml = None
    mtl, btl, failed = [], [], set()
    for line in text.splitlines():
        m = re.search(r"select: component (\w+) selected", line)
        if m:
            pml = m.group(1)
        m = re.search(r"mca:base:select:\(\s*mtl\) Selected component \[(\w+)\]", line)
        if m and m.group(1) not in mtl:
            mtl.append(m.group(1))
        m = re.search(r"select: init(?:ializing)? (?:of )?(?:mtl )?component (\w+) returned failure"
                      r"|select: init returned failure for component (\w+)", line)
        if m:
            failed.add(m.group(1) or m.group(2))
        m = re.search(r"select: init of component (\w+) returned success", line)
        if m and m.group(1) not in btl:
            btl.append(m.group(1))
    if pml is None and not btl:
        return None
    # the mtl matters under pml cm only, and cm is selected only when its mtl initialised
    return {"pml": pml, "mtl": [x for x in mtl if x not in failed] if pml == "cm" else [], "btl": sorted(btl)}


def parse_ucx_log(text):
    """UCX's protocol tables (UCX_PROTO_INFO=y): {'inter-node': [transport/device ...],
    'intra-node': [...], 'self': [...]}, each in the order first seen; None without a table."""
    out = {}
    scope = None
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) < 2:
            continue
        m = re.match(r"ucp_context_\d+ (inter-node|intra-node|self) cfg#\d+", cells[0])
        if m:
            scope = m.group(1)
            out.setdefault(scope, [])
            continue
        if scope is None:
            continue
        for tl in re.findall(r"\b([a-z][a-z0-9_]*)/([A-Za-z0-9_.:-]+)", cells[-1]):
            name = "%s/%s" % tl
            if name not in out[scope]:
                out[scope].append(name)
    return out or None


def ucx_rdma(transports):
    """Whether any of UCX's transports ('rc_mlx5/mlx5_0:1', 'tcp/eth0') carries RDMA."""
    return any(UCX_RDMA_TLS.match(t.split("/", 1)[0]) for t in transports)


def _read(path):
    try:
        with open(path, errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def read_transport_logs(environ=None):
    """(Open MPI's selection, UCX's tables) from this process's own logs (transport_logging_setup)."""
    env = os.environ if environ is None else environ
    ompi = parse_ompi_log(_read(env.get(OMPI_LOG_ENV, ""))) if env.get(OMPI_LOG_ENV) else None
    ucx = None
    path = env.get("UCX_LOG_FILE", "")
    if path and env.get("UCX_PROTO_INFO", "").lower() in ("y", "yes", "1", "on"):
        text = _read(path.replace("%h", socket.gethostname()).replace("%p", str(os.getpid())))
        if env.get(UCX_LOG_DIR_ENV) and os.path.dirname(path) == env[UCX_LOG_DIR_ENV]:
            shutil.rmtree(env[UCX_LOG_DIR_ENV], ignore_errors=True)     # ours (transport_logging_setup)
        ucx = parse_ucx_log(text)
        # UCX's own warnings and errors went to the file too: show them where the user looks
        for line in text.splitlines():
            if re.search(r"UCX\s+(ERROR|WARN)", line):
                sys.stderr.write(line + "\n")
    return ompi, ucx


def mpi_family(libs):
    """'openmpi' | 'mpich' (MPICH, Intel MPI, Cray MPICH: the MPICH ABI) | None, from the libmpi mapped."""
    if any(l.startswith("libmpi.so.40") or l.startswith("libopen-pal") for l in libs):
        return "openmpi"
    if any(l.startswith(("libmpi.so.12", "libmpi_abi.so")) for l in libs):
        return "mpich"
    return None


def _ucx_transport(libs, devices, ucx):
    """(transport text, rdma) of UCX between nodes: its own tables when it printed an inter-node
    one, else what is loaded and visible (no IB transport open or no device: its tcp one)."""
    inter = (ucx or {}).get("inter-node") or []
    if inter:
        names = sorted(set(t.split("/", 1)[0] for t in inter))
        return "ucx/" + "+".join(names), ucx_rdma(inter), "UCX's protocol table: " + ", ".join(inter[:4])
    rdma = devices["dev_infiniband"] and any(l.startswith("libuct_ib") for l in libs)
    return ("ucx/" + ("ib" if rdma else "tcp"), rdma,
            "UCX" + ("" if rdma else " (no IB transport open: its tcp one carries the traffic)"))


def _ofi_transport(provider, devices):
    if not provider:
        return "unknown (FI_PROVIDER unset)", devices["cxi"] or devices["efa"] or devices["dev_infiniband"]
    return provider, provider not in TCP_LIKE


def mpi_layer(libs, devices, ompi=None, ucx=None):
    """The MPI's transport between nodes (a layer dict), or None when no MPI is seen.

    Open MPI: the pml its selection log names (``ompi``; else the mca_pml_*.so still mapped:
    a build with dlopen'd components unloads the rest), then UCX's tables for pml ucx, the
    mtl's libfabric provider for pml cm, the network BTLs for ob1. MPICH (and MPICH-ABI
    libraries: Intel MPI, Cray MPICH): its ch4 netmod, UCX when UCX printed tables or is loaded
    and MPIR_CVAR_CH4_NETMOD does not ask for ofi, else libfabric with the provider the job
    asked for (FI_PROVIDER, MPIR_CVAR_OFI_USE_PROVIDER, I_MPI_OFI_PROVIDER)."""
    comp = mpi_components(libs)
    family = mpi_family(libs)
    if ompi and ompi.get("pml"):
        comp = {"pml": [ompi["pml"]], "btl": ompi["btl"] or comp["btl"], "mtl": ompi["mtl"] or comp["mtl"]}
        family = "openmpi"
    if comp["pml"]:
        pml = comp["pml"][0]
        # a verbs/UCT BTL initialises without a device too (with no module to send through)
        any_device = devices["dev_infiniband"] or devices["efa"] or devices["cxi"]
        net_btls = [b for b in comp["btl"] if b not in SHARED_MEMORY_BTLS
                    and (any_device or b not in DEVICE_BTLS)]
        layer = {"mpi": "openmpi", "pml": pml, "btl": comp["btl"], "mtl": comp["mtl"],
                 "seen_in": "selection log" if ompi else "mapped components"}
        if pml == "ucx":
            transport, rdma, via = _ucx_transport(libs, devices, ucx)
            layer.update(transport=transport, rdma=rdma, via=via)
        elif pml == "cm":
            provider = os.environ.get("FI_PROVIDER", "") if "ofi" in comp["mtl"] else ""
            if "ofi" in comp["mtl"]:
                provider, rdma = _ofi_transport(provider, devices)
            else:
                rdma = bool(comp["mtl"])       # psm2, portals4: no TCP mode
            layer.update(transport="cm/%s%s" % ("+".join(comp["mtl"]) or "?", ":" + provider if provider else ""),
                         rdma=bool(rdma), via="mtl %s" % "+".join(comp["mtl"]))
        else:
            rdma = any(b not in ("tcp",) for b in net_btls)
            layer.update(transport="%s/%s" % (pml, "+".join(net_btls) or "none"), rdma=rdma,
                         via="btl " + ("+".join(net_btls) or "none"))
        return layer
    if family != "mpich":
        return None
    netmod = os.environ.get("MPIR_CVAR_CH4_NETMOD", "").strip().lower()
    has_ucx = any(l.startswith("libucp") for l in libs)
    if (ucx or (has_ucx and netmod != "ofi")) and netmod != "ofi":
        transport, rdma, via = _ucx_transport(libs, devices, ucx)
        return {"mpi": "mpich", "netmod": "ucx", "transport": "ch4:" + transport, "rdma": rdma, "via": via}
    if any(l.startswith("libfabric") for l in libs):
        provider = next((os.environ[v].strip() for v in ("FI_PROVIDER", "MPIR_CVAR_OFI_USE_PROVIDER",
                                                          "I_MPI_OFI_PROVIDER") if os.environ.get(v, "").strip()), "")
        provider, rdma = _ofi_transport(provider, devices)
        return {"mpi": "mpich", "netmod": "ofi", "transport": "ch4:ofi/" + provider, "rdma": bool(rdma),
                "via": "libfabric provider " + provider}
    return None


def parse_nccl_log(text):
    """NCCL's network from its NCCL_DEBUG=INFO init log: {'net': 'IB'|'Socket'|'AWS Libfabric'|...,
    'provider': libfabric provider or None, 'plugin_missing': bool, 'lines': [evidence]}; None
    when the log names no network.

    The strongest line wins: "Using network X" (every NCCL), then "Assigned NET plugin X to comm"
    (2.2x), then "Initialized NET plugin X", then "NET/IB|Socket : Using [0]dev" naming a device.
    NCCL 2.28 prints "NET/IB : Using [RO]; OOB eth0" with no device at all before "Failed to
    initialize NET plugin IB" (recorded on an H100 without an HCA: tests/data/fabric), so an IB
    line that lists no device, or whose plugin failed, never counts as IB."""
    found = {}          # strength -> network name (lower is stronger)
    failed = set()
    provider = None
    lines = []
    plugin_missing = no_ib_device = False
    patterns = ((0, r"NCCL INFO Using network (.+?)\s*$"),
                (1, r"NCCL INFO Assigned NET plugin (.+?) to comm"),
                (2, r"NCCL INFO Initialized NET plugin (.+?)\s*$"),
                (3, r"NCCL INFO NET/(IB|Socket)\s*:\s*Using \[\d+\]"))
    for line in text.splitlines():
        for strength, pattern in patterns:
            m = re.search(pattern, line)
            if m:
                found.setdefault(strength, m.group(1))
                lines.append(line.strip())
        m = re.search(r"NCCL INFO Failed to initialize NET plugin (\S+)", line)
        if m:
            failed.add(m.group(1))
            lines.append(line.strip())
        m = re.search(r"NCCL INFO NET/OFI Selected [Pp]rovider is (\S+)", line)
        if m:
            provider = m.group(1)
            lines.append(line.strip())
        if re.search(r"NCCL INFO NET/(?:Plugin|OFI).*(?:No plugin found|dlerror|[Uu]nable to load|[Ff]ailed to initialize)",
                     line):
            plugin_missing = plugin_missing or "No plugin found" in line or "dlerror" in line
            lines.append(line.strip())
        if re.search(r"NCCL INFO NET/IB\s*: No device found", line):
            no_ib_device = True
            lines.append(line.strip())
    nets = [found[k] for k in sorted(found) if k == 0 or found[k] not in failed]
    net = nets[0] if nets else None
    if net is None and not lines:
        return None
    return {"net": net, "provider": provider, "plugin_missing": plugin_missing, "no_ib_device": no_ib_device,
            "lines": list(dict.fromkeys(lines))[:6]}


def nccl_layer(parsed):
    if not parsed:
        return None
    net = parsed["net"] or "?"
    # IB, IBext_vN (NCCL's and the SHARP plugin's verbs), AWS Libfabric / Libfabric: RDMA unless
    # libfabric's provider is a TCP one; Socket is NCCL's TCP fallback
    rdma = net not in ("Socket", "?") and (parsed["provider"] or "") not in TCP_LIKE
    via = "NET/%s" % net + (" (provider %s)" % parsed["provider"] if parsed["provider"] else "")
    return {"transport": via, "rdma": bool(rdma), "via": via, "plugin_missing": parsed["plugin_missing"],
            "no_ib_device": parsed.get("no_ib_device", False), "evidence": parsed["lines"]}


def nccl_debug_setup(workdir):
    """Before NCCL starts in a fabric run: its init log into the run's folder (unless the user
    asked for one), so that the rank can read which network it chose."""
    if os.environ.get("NCCL_DEBUG_FILE"):
        return
    os.environ["NCCL_DEBUG"] = "INFO"
    os.environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,NET")
    os.environ["NCCL_DEBUG_FILE"] = os.path.join(workdir, NCCL_LOG_NAME)


def read_nccl_log():
    path = os.environ.get("NCCL_DEBUG_FILE", "")
    if not path:
        return None
    path = path.replace("%h", socket.gethostname()).replace("%p", str(os.getpid()))
    try:
        with open(path, errors="replace") as fh:
            return parse_nccl_log(fh.read())
    except OSError:
        return None


def observe(controller, nccl=None):
    """This rank's transports, per layer: {'host', 'fabric', 'layers': {name: {...}}, 'devices'}."""
    libs = loaded_libraries()
    devices = rdma_devices()
    layers = {}
    ompi, ucx = read_transport_logs()
    mpi = mpi_layer(libs, devices, ompi, ucx)
    if mpi:
        layers["mpi"] = mpi
    if controller in ("gloo", "tf"):
        layers[controller] = {
            "transport": "tcp", "rdma": False, "by_design": True,
            "via": "Gloo/gRPC sockets (no RDMA transport in the framework's wheels)"}
    n = nccl_layer(nccl if nccl is not None else read_nccl_log())
    if n:
        layers["nccl"] = n
    libfabric = sorted(l for l in libs if l.startswith("libfabric") or l.endswith("-fi.so"))
    return {"host": socket.gethostname(), "fabric": fabric(), "layers": layers, "devices": devices,
            "verbs_provider": verbs_provider_present(), "libfabric": libfabric,
            "ucx": sorted(l for l in libs if l.startswith(("libucp", "libuct"))),
            "ucx_transports": ucx or {},
            "nccl_plugin": sorted(l for l in libs if l.startswith("libnccl-net"))}


def rank_result(tag, controller, nccl=None):
    """The rank's `fabric.transport[...]` result: what it saw (judged by ``judge``)."""
    obs = observe(controller, nccl)
    figure = ", ".join("%s: %s" % (k, v["transport"]) for k, v in sorted(obs["layers"].items())) or "no layer seen"
    return result(check_name(tag), PASS, "%s: %s" % (obs["host"], figure), figure, obs)


# ----------------------------------------------------------------------------- the report

def missing_device(kind, dev, no_ib_device=False):
    """Why a container that sees DEV (rdma_devices) cannot use fabric KIND's RDMA; None when the
    fabric's device is there."""
    if kind in ("ib", "roce") and (not dev.get("dev_infiniband") or no_ib_device):
        return ("no RDMA device visible to the rank: /dev/infiniband absent (no HCA on the node, or "
                "the container runtime does not pass /dev/infiniband in)")
    if kind in ("ib", "roce") and not dev.get("ib_devices"):
        # /dev/infiniband can hold rdma_cm alone with no HCA behind it (seen on the lent GPU
        # machine, docs/gpu.md): no uverbs device, nothing in /sys/class/infiniband
        return ("no RDMA device visible to the rank: /sys/class/infiniband is empty (/dev/infiniband "
                "holds no HCA's device: no HCA on the node, or the runtime passes only part of it in)")
    if kind == "slingshot" and not dev.get("cxi"):
        return "no Slingshot device visible in the container: /dev/cxi* absent"
    if kind == "efa" and not dev.get("efa"):
        return "no EFA device visible in the container (/sys/class/infiniband has no efa_*)"
    return None


def _cause(layer_name, layer, obs, kind):
    if layer.get("plugin_missing"):
        return ("NCCL's network plugin did not load (plugin/NCCL/libfabric mismatch: aws-ofi-nccl "
                "#241, #1055): NCCL uses its internal sockets")
    missing = missing_device(kind, obs.get("devices") or {}, layer.get("no_ib_device"))
    if missing:
        return missing
    if kind in ("ib", "roce", "efa") and not obs.get("verbs_provider"):
        return "provider library missing in the image: no libibverbs provider (ibverbs-providers)"
    if layer_name == "mpi" and layer.get("pml") == "ob1":
        return ("this Open MPI selected ob1 with the tcp BTL: it has no %s component (built without "
                "--with-ucx/--with-ofi?)" % ("UCX" if kind in ("ib", "roce") else "OFI"))
    if kind in ("slingshot", "efa") and not obs.get("libfabric"):
        return "provider library missing in the image: libfabric not loaded"
    return "a device is visible but the layer chose TCP: check its settings (%s)" % layer.get("via", "")


def judge(checks, kind=None, devices=None, host=None):
    """One `fabric` check from every run's fabric.transport results (None when no fabric was set).
    When no run reported its transports (each failed first) the launcher's own container is
    looked at (DEVICES, HOST: rdma_devices() and this machine): a missing RDMA device is then
    the fabric's failure, named, beside the runs' own."""
    kind = fabric() if kind is None else kind
    if not kind:
        return None
    seen = [c for c in checks if c["name"].startswith("fabric.transport")]
    if not seen:
        failed = [c["name"] for c in checks if c.get("status") == FAIL]
        missing = missing_device(kind, rdma_devices() if devices is None else devices) \
            if kind in RDMA_FABRICS and failed else None
        if missing:
            return result("fabric", FAIL, "fabric %s promises RDMA between nodes; no run reported its transports "
                          "(failed: %s) and on %s %s" % (kind, ", ".join(failed), host or socket.gethostname(),
                                                         missing), "no RDMA device", {"fabric": kind})
        return result("fabric", SKIP, "not run: no run reported its transports (fabric: %s)" % kind)
    rows, failures, hosts = [], [], set()
    for c in seen:
        for _rank, r in sorted((c.get("ranks") or {}).items(), key=lambda x: int(x[0])):
            obs = r.get("data") or {}
            hosts.add(obs.get("host"))
    multi = len(hosts) > 1
    table = {}
    for c in seen:
        for _rank, r in sorted((c.get("ranks") or {}).items(), key=lambda x: int(x[0])):
            obs = r.get("data") or {}
            for name, layer in sorted((obs.get("layers") or {}).items()):
                key = (obs.get("host"), name)
                table.setdefault(key, layer["transport"])
                if kind in RDMA_FABRICS and multi and not layer.get("rdma") and not layer.get("by_design"):
                    msg = "%s on %s fell back to %s: %s" % (name, obs.get("host"), layer["transport"],
                                                            _cause(name, layer, obs, kind))
                    if msg not in failures:
                        failures.append(msg)
    rows = ["%s %s: %s" % (h, n, t) for (h, n), t in sorted(table.items())]
    figure = ", ".join(sorted(set("%s: %s" % (n, t) for (_h, n), t in table.items())))
    data = {"fabric": kind, "transports": [{"host": h, "layer": n, "transport": t} for (h, n), t in sorted(table.items())]}
    if failures:
        return result("fabric", FAIL, "fabric %s promises RDMA between nodes; %s" % (kind, "; ".join(failures)),
                      figure, data)
    if kind in RDMA_FABRICS and not multi:
        note = "one node: the fabric is not crossed (run on 2 nodes to check it)"
    elif kind in RDMA_FABRICS:
        by_design = sorted(set(n for c in seen for r in (c.get("ranks") or {}).values()
                               for n, l in ((r.get("data") or {}).get("layers") or {}).items() if l.get("by_design")))
        note = "every layer that can use RDMA did" + (
            " (%s: TCP by design)" % ", ".join(by_design) if by_design else "")
    else:
        note = "fabric %s: TCP expected" % kind
    return result("fabric", PASS, "%s; %s" % (note, "; ".join(rows)), figure, data)


def parse_floors(text):
    """'inter_node=15 GB/s;intra_node_mpi=2 GB/s' -> {name: bytes per second}."""
    out = {}
    for part in (text or "").split(";"):
        if "=" not in part:
            continue
        name, value = part.split("=", 1)
        m = re.match(r"\s*([0-9.]+)\s*([kMGT]?)B/s\s*$", value)
        if m:
            out[name.strip()] = float(m.group(1)) * UNITS[m.group(2)]
    return out


def _hosts(checks, tag):
    hosts = set()
    for c in checks:
        if c["name"].endswith(tag):
            for r in (c.get("ranks") or {}).values():
                h = (r.get("data") or {}).get("host")
                if h:
                    hosts.add(h)
    return hosts


def floor_checks(checks, text=None):
    """`perf.floor[...]` per measured allreduce the profile gives a floor for."""
    floors = parse_floors(os.environ.get(FLOOR_ENV, "") if text is None else text)
    if not floors:
        return []
    out = []
    for c in checks:
        name = c["name"]
        if not name.startswith(("perf.allreduce", "gpu.nccl_allreduce")) or "[" not in name:
            continue
        tag = name[name.index("["):]
        stack = "nccl" if name.startswith("gpu.") else tag.strip("[]")
        hosts = _hosts(checks, tag)
        scope = "inter_node" if len(hosts) > 1 else "intra_node"
        key = "%s_%s" % (scope, stack) if "%s_%s" % (scope, stack) in floors else scope
        if key not in floors:
            continue
        fname = ("perf.floor.nccl" if name.startswith("gpu.") else "perf.floor") + tag
        if c["status"] != PASS:
            out.append(result(fname, SKIP, "not measured: %s %s" % (name, c["status"])))
            continue
        sizes = (((c.get("ranks") or {}).get("0") or {}).get("data") or {}).get("sizes") or \
            (c.get("data") or {}).get("sizes") or []
        if not sizes:
            out.append(result(fname, SKIP, "not measured: %s has no figures" % name))
            continue
        measured = sizes[-1]["busbw_GBps"] * 1e9
        floor = floors[key]
        where = "%s (%d node%s)" % (scope.replace("_", "-"), len(hosts), "" if len(hosts) == 1 else "s")
        data = {"measured_Bps": measured, "floor_Bps": floor, "floor_name": key, "message_bytes": sizes[-1]["bytes"]}
        if measured < floor:
            out.append(result(fname, FAIL, "%s: measured %s < floor %s (%s, cluster.bandwidth_floor)" % (
                name, _rate(measured), _rate(floor), key), "%s < %s" % (_rate(measured), _rate(floor)), data))
        else:
            out.append(result(fname, PASS, "%s %s: measured %s >= floor %s (%s)" % (
                name, where, _rate(measured), _rate(floor), key),
                "%s >= %s" % (_rate(measured), _rate(floor)), data))
    return out
