"""The .sif that jobs run with `apptainer exec` / `singularity exec`, written without Apptainer.

    rootfs.py     image -> root folder: the layers of `docker save` (or an OCI archive) applied
                  in order, whiteouts honoured; the image config (ENV, CMD, labels, arch)
    metadata.py   /.singularity.d in that root folder, in the layout Apptainer's docker
                  conversion writes (env scripts with the image's ENV, runscript, labels, test)
    layout.py     the SIF file format: reading the header and descriptors, fixing the
                  header's times and ID (what `siftool` cannot set)
    build.py      `envbuilder build --sif`: mksquashfs + siftool, atomically into the folder
    check.py      `envbuilder verify x.sif`: the expected objects, and the SquashFS partition
                  mounted (squashfuse, at its offset) for charliecloud

What follows Apptainer where (apptainer/apptainer at v1.5.3, read for this):
internal/pkg/build/sources/conveyorPacker_oci.go (docker conversion: 10-docker2singularity.sh,
runscript, labels.json), internal/pkg/build/sources/base_environment.go (folders, symlinks,
action and env scripts, their modes), internal/pkg/build/metadata.go (Singularity, labels,
test), internal/pkg/build/assemblers/sif.go (object order, mksquashfs flags, SOURCE_DATE_EPOCH:
nil UUID and the sif library's deterministic times), sylabs/sif v2.8.3 pkg/sif (the binary
layout that siftool 2.8.3, Debian's, writes).
"""
