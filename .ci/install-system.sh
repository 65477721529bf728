#!/usr/bin/env bash
# Install every system part the test suite needs on a bare Debian 12 (bookworm)
# machine, skipping what is already present. Idempotent; needs root.
set -euo pipefail

PACKAGES=(
    ca-certificates      # pip / apt over the network's TLS CA
    pipx                 # tests/test_install.py: `pipx install` of the built wheel, as docs/install.md says
    git
    python3 python3-venv python3-pip
    python3-dev g++ make cmake   # compile Horovod for the host smoke environment (make-smoke-venv.sh)
    docker.io            # dockerd 20.10 + Debian's CLI with BuildKit built in
    iptables             # dockerd's bridge networking
    debootstrap          # builds the local base image (no registry reachable)
    openmpi-bin libopenmpi-dev
    slurm-wlm munge      # one-node Slurm cluster
    shellcheck           # lints generated job wrappers
    charliecloud         # unprivileged container runtime used under Slurm
    docker-registry      # the CNCF distribution registry on loopback: attestation tests (.ci/start-registry.sh)
    siftool squashfs-tools   # envbuilder build --sif: the SIF reference tool; unsquashfs (tests)
    squashfs-tools-ng    # envbuilder build --sif: tar2sqfs (SquashFS from a tar stream, unprivileged), sqfs2tar
    squashfuse fuse3     # verify x.sif / job.sbatch: mount a SIF's SquashFS partition (fusermount3)
    procps               # pgrep/pkill used by the start scripts
    buildah podman       # daemonless, rootless engines: bit-identical images (engines/buildah.py)
    uidmap slirp4netns fuse-overlayfs   # rootless builds: subordinate ids, network, overlay storage
)

if [ "$(id -u)" -ne 0 ]; then
    echo "install-system: must run as root" >&2
    exit 1
fi

missing=()
for p in "${PACKAGES[@]}"; do
    status="$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)"
    [ "$status" = "installed" ] || missing+=("$p")
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "install-system: all ${#PACKAGES[@]} packages present"
    exit 0
fi

echo "install-system: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Wait for another apt/dpkg run (e.g. unattended installs) instead of failing.
APT_OPTS=(-o DPkg::Lock::Timeout=900 -o Acquire::Retries=3)
apt-get "${APT_OPTS[@]}" update -q
apt-get "${APT_OPTS[@]}" install -y -q "${missing[@]}"
echo "install-system: done"
