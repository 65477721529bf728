"""The .sif that jobs run with `apptainer exec` / `singularity exec`, written without Apptainer.

    rootfs.py     the archive (`docker save` or OCI): its JSON checked, the image config (ENV,
                  CMD, labels, arch), its layers opened (compressed ones decompressed once)
    layers.py     the layers' headers -> one tree in memory (OCI whiteout rules, paths and
                  links resolved inside the tree, size bounded), emitted as one tar stream
    metadata.py   /.singularity.d added to that tree, in the layout Apptainer's docker
                  conversion writes (env scripts with the image's ENV, runscript, labels, test)
    layout.py     the SIF file format: reading the header and descriptors, fixing the
                  header's times and ID (what `siftool` cannot set)
    build.py      `envbuilder build --sif`: tar stream -> tar2sqfs, + siftool, atomically
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
