#!/usr/bin/env bash
# One-node Slurm cluster on this machine (Slurm 22.05 from Debian, munge auth).
# Writes /etc/slurm/slurm.conf (NodeName = `hostname`, CPUs from nproc, RealMemory a
# bit below the machine's), creates the spool folders and the munge key if missing,
# starts munged, slurmctld and slurmd when they are not running, and waits until
# `sinfo` shows the node idle (resuming it if it comes up down or drained).
# Idempotent: a second run with nothing changed only checks.
set -euo pipefail

TIMEOUT="${SLURM_START_TIMEOUT:-90}"
NODE="$(hostname)"
CPUS="$(nproc)"
MEM_MB=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 ))
REAL_MEM=$(( MEM_MB * 85 / 100 ))
CONF=/etc/slurm/slurm.conf
LOGDIR=/var/log/slurm

for b in munged slurmctld slurmd sinfo scontrol; do
    command -v "$b" >/dev/null || { echo "start-slurm: $b missing (run .ci/install-system.sh)" >&2; exit 1; }
done

if ! getent hosts "$NODE" >/dev/null; then
    echo "start-slurm: adding $NODE to /etc/hosts"
    echo "127.0.0.1 $NODE" >>/etc/hosts
fi

mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd "$LOGDIR" /run/slurm
new_conf="$(cat <<CONF
# Written by .ci/start-slurm.sh: one-node cluster for envbuilder's tests.
ClusterName=local
SlurmctldHost=$NODE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=$LOGDIR/slurmctld.log
SlurmdLogFile=$LOGDIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdTimeout=60
NodeName=$NODE CPUs=$CPUS RealMemory=$REAL_MEM State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
CONF
)"
conf_changed=0
if [ ! -f "$CONF" ] || [ "$(cat "$CONF")" != "$new_conf" ]; then
    printf '%s\n' "$new_conf" >"$CONF"
    conf_changed=1
    echo "start-slurm: wrote $CONF (node $NODE, CPUs=$CPUS, RealMemory=$REAL_MEM)"
fi

# --- munge -----------------------------------------------------------------
if [ ! -s /etc/munge/munge.key ]; then
    echo "start-slurm: creating munge key"
    mkdir -p /etc/munge
    if command -v mungekey >/dev/null; then
        mungekey --create --keyfile=/etc/munge/munge.key --force
    else
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
fi
chown munge:munge /etc/munge /etc/munge/munge.key
chmod 0700 /etc/munge
chmod 0400 /etc/munge/munge.key
mkdir -p /run/munge /var/lib/munge /var/log/munge
chown munge:munge /run/munge /var/lib/munge /var/log/munge
chmod 0755 /run/munge

if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    pkill_pidfile() { [ -f "$1" ] && kill "$(cat "$1")" 2>/dev/null; rm -f "$1"; }
    if pgrep -x munged >/dev/null; then
        echo "start-slurm: munged runs but does not answer; restarting it"
        pkill_pidfile /run/munge/munged.pid || true
        sleep 1
    fi
    rm -f /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
    echo "start-slurm: starting munged"
    runuser -u munge -- /usr/sbin/munged
    for ((i = 0; i < 20; i++)); do
        munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break
        sleep 0.5
    done
    munge -n | unmunge >/dev/null || { echo "start-slurm: munged does not answer" >&2; exit 1; }
fi

# --- slurm daemons -----------------------------------------------------------
stop_daemon() {  # stop a daemon this script started earlier, by its pid file
    local name="$1" pidfile="/run/slurm/$1.pid"
    if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        echo "start-slurm: stopping $name (configuration changed)"
        kill "$(cat "$pidfile")"
        for ((i = 0; i < 20; i++)); do kill -0 "$(cat "$pidfile")" 2>/dev/null || break; sleep 0.5; done
    fi
}
if [ "$conf_changed" = 1 ]; then
    stop_daemon slurmd
    stop_daemon slurmctld
fi

if ! pgrep -x slurmctld >/dev/null; then
    echo "start-slurm: starting slurmctld"
    slurmctld
fi
for ((i = 0; i < 30; i++)); do scontrol ping >/dev/null 2>&1 && break; sleep 1; done
if ! scontrol ping >/dev/null 2>&1; then
    echo "start-slurm: slurmctld does not answer; last lines of $LOGDIR/slurmctld.log:" >&2
    tail -n 30 "$LOGDIR/slurmctld.log" >&2 || true
    exit 1
fi
if ! pgrep -x slurmd >/dev/null; then
    echo "start-slurm: starting slurmd"
    slurmd
fi

# --- wait for the node -------------------------------------------------------
state=""
for ((i = 0; i < TIMEOUT; i++)); do
    state="$(sinfo -h -n "$NODE" -o '%T' 2>/dev/null | head -n1 || true)"
    case "$state" in
        idle|mixed|allocated|completing)
            echo "start-slurm: node $NODE is $state after ${i}s"
            sinfo
            exit 0 ;;
        down*|drain*|fail*)
            echo "start-slurm: node $NODE is $state; resuming it"
            scontrol update nodename="$NODE" state=resume || true ;;
    esac
    sleep 1
done
echo "start-slurm: node $NODE not idle within ${TIMEOUT}s (state: '${state:-none}')" >&2
sinfo -N -l >&2 || true
scontrol show node "$NODE" >&2 || true
tail -n 20 "$LOGDIR/slurmd.log" >&2 || true
exit 1
