#!/usr/bin/env bash
# Start the Docker engine if its socket does not answer, then wait until it does.
# No systemd on these machines: dockerd is started in the background, logging to
# /var/log/dockerd.log. Idempotent: does nothing when the engine already answers.
set -euo pipefail

TIMEOUT="${DOCKER_START_TIMEOUT:-90}"
LOG="${DOCKERD_LOG:-/var/log/dockerd.log}"
# Debian's CLI (docker.io 20.10) has BuildKit built in; a newer CLI without the
# buildx plugin may sit earlier in PATH (e.g. /usr/local/bin), so prefer Debian's.
DOCKER="${DOCKER:-/usr/bin/docker}"
[ -x "$DOCKER" ] || DOCKER="$(command -v docker)"

answers() { "$DOCKER" info >/dev/null 2>&1; }

if answers; then
    echo "start-docker: engine already answers ($("$DOCKER" version --format '{{.Server.Version}}'))"
    exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
    echo "start-docker: dockerd not installed (run .ci/install-system.sh)" >&2
    exit 1
fi

if pgrep -x dockerd >/dev/null 2>&1; then
    echo "start-docker: dockerd is running but does not answer yet; waiting"
else
    # A stale pid file from a killed dockerd stops a new one from starting.
    if [ -f /var/run/docker.pid ] && ! kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
        rm -f /var/run/docker.pid
    fi
    echo "start-docker: starting dockerd (log: $LOG)"
    nohup dockerd >"$LOG" 2>&1 </dev/null &
fi

for ((i = 0; i < TIMEOUT; i++)); do
    if answers; then
        echo "start-docker: engine answers after ${i}s ($("$DOCKER" version --format '{{.Server.Version}}'))"
        exit 0
    fi
    sleep 1
done

echo "start-docker: the Docker engine did not answer within ${TIMEOUT}s; last lines of $LOG:" >&2
tail -n 30 "$LOG" >&2 || true
exit 1
