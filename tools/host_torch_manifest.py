"""A smoke-suite manifest for the PyTorch of the Python that runs this (the lent GPU machine's own:
no image reaches it), its CUDA, cuDNN and NCCL read from that torch. Standard library + torch only.

    python3 tools/host_torch_manifest.py OUT.json --name NAME [--horovod-ops nccl,gloo]

Without --horovod-ops: torch.distributed over NCCL (tools/device_gpu_smoke.sh); with it: Horovod
0.28.1 with those operations and the Gloo controller (tools/device_horovod_gpu.sh). Prints `expect`.
"""

import argparse
import json
import sys

import torch


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--name", required=True)
    p.add_argument("--horovod-ops", default="", help="comma list of Horovod operations; empty: torch.distributed")
    args = p.parse_args()
    gpu = torch.cuda.is_available()
    v = torch.backends.cudnn.version() or 0
    expect = {"python": f"{sys.version_info[0]}.{sys.version_info[1]}",
              "framework": {"name": "pytorch", "module": "torch", "version": torch.__version__.split("+")[0],
                            "distribution": "torch"},
              "horovod": None, "mpi": None, "cuda": torch.version.cuda,
              "cudnn": (str(v // 10000) if v >= 90000 else str(v // 1000)) if gpu and v else None,
              "nccl": ".".join(map(str, torch.cuda.nccl.version())) if gpu else None,
              "gpu": True, "packages": {}}
    if args.horovod_ops:
        expect["horovod"] = {"version": "0.28.1", "frameworks": ["pytorch"], "controllers": ["gloo"],
                             "operations": args.horovod_ops.split(",")}
    else:
        expect["distributed"] = {"kind": "torch", "backend": "nccl", "launcher": "srun"}
    with open(args.out, "w") as fh:
        json.dump({"schema": "envbuilder.manifest/1", "name": args.name, "expect": expect}, fh, indent=1)
    print(json.dumps(expect))
    return 0


if __name__ == "__main__":
    sys.exit(main())
