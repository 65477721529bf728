#!/bin/bash
# Keep a one-off image build from crowding the suite's BuildKit cache off the disk.
#   tools/build-cache-snapshot.sh save FILE    record the build cache's record ids now
#   tools/build-cache-snapshot.sh prune FILE   remove every record made since (leaves first,
#                                              repeated until none goes; records in use stay)
# .ci/free-disk.sh trims the cache by last use, oldest first: a long build made beside the suite
# would otherwise survive while the suite's own layers go. Remove the one-off image (and any
# dangling image it left) before pruning: a record an image holds is not removed.
set -euo pipefail
ids() { docker system df -v 2>/dev/null | sed -n '/^Build cache usage/,$p' | awk 'NR>3 && NF>0 {print $1}' | sort; }
case "${1:-}:${2:-}" in
    save:?*) ids > "$2"; echo "build-cache-snapshot: $(wc -l < "$2") records saved in $2" ;;
    prune:?*)
        [ -s "$2" ] || { echo "build-cache-snapshot: $2 is empty or missing (run save first)" >&2; exit 2; }
        for pass in 1 2 3 4 5 6; do
            new=$(comm -13 "$2" <(ids))
            [ -n "$new" ] || break
            gone=0
            for id in $new; do
                out=$(docker builder prune -f --filter "id=$id" 2>/dev/null | tail -n 1)
                case "$out" in *" 0B"|"") ;; *) gone=1 ;; esac
            done
            echo "build-cache-snapshot: pass $pass, $(echo "$new" | wc -w) new records"
            [ "$gone" = 1 ] || break
        done
        left=$(comm -13 "$2" <(ids) | wc -l)
        echo "build-cache-snapshot: $left new records left (held by an image or a running build)" ;;
    *) echo "usage: $0 save|prune FILE" >&2; exit 2 ;;
esac
