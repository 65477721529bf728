#!/bin/bash
# Node Epilog for envbuilder jobs (cluster.local_cleanup: epilog in the site profile).
# Removes <local root>/envbuilder.$SLURM_JOB_ID, the job's node-local folder (staged data, HOME),
# on every node of the job when it ends, whatever ended it (the end, scancel, a time limit, a
# crash): slurmd runs the Epilog as root on each of the job's nodes after its processes are gone.
# Install (an admin, on every compute node): copy this file to e.g. /etc/slurm/epilog.d/,
# root-owned and executable; name it in slurm.conf (Epilog=/etc/slurm/epilog.d/*), or call it
# from the site's existing Epilog; then `scontrol reconfigure`.
# It removes only a real folder (never a link) that carries envbuilder's marker and belongs to
# the job's user, and does not cross into another file system. It always exits 0: a failing
# Epilog drains the node.
PATH=/usr/sbin:/usr/bin:/sbin:/bin
# The node-local root(s): the site profile's cluster.local_scratch
ROOTS=(/tmp)
id=${SLURM_JOB_ID:-}
case $id in ""|*[!0-9]*) exit 0 ;; esac
uid=${SLURM_JOB_UID:-}
for root in "${ROOTS[@]}"; do
    dir="$root/envbuilder.$id"
    if [ ! -d "$dir" ] || [ -L "$dir" ] || [ ! -f "$dir/.envbuilder-job" ] || [ -L "$dir/.envbuilder-job" ]; then
        continue
    fi
    if [ -n "$uid" ] && [ "$(stat -c %u -- "$dir")" != "$uid" ]; then continue; fi
    rm -rf --one-file-system -- "$dir" 2>/dev/null ||
        logger -t envbuilder-epilog "could not remove $dir entirely" 2>/dev/null || true
done
exit 0
