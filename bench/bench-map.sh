#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Map benchmark: the time `nbdinfo --map` takes to map a huge sparse disk
# with a few clusters written, through the qcow2zstd filter (nbdkit file)
# and through qemu-nbd, both serving the same image read-only; and the
# time `qemu-img map --output=json` takes on the image file itself.
#
#   bench/bench-map.sh                 a 256 TiB disk, 2000 clusters, 5 runs
#   BENCH_QUICK=1 bench/bench-map.sh   a 16 TiB disk, 200 clusters, 3 runs
#
# The image: qemu-img create -f qcow2 (64 KiB clusters), then qemu-io
# writes one cluster every 131 GiB (the quick one: every 81 GiB), so the
# map has two extents per cluster written and all but a few L1 entries
# are empty.  The servers are started once each and kept; every run is
# one nbdinfo --map against one of them, contenders alternating and the
# first of each pair alternating too; qemu-img map runs after each pair.
# Both NBD maps must be the same (as nbdinfo prints them), and qemu-img's
# the same extents (data, or hole and zero), or the run fails.  Prints
# the median wall time of each and the ratios qemu-nbd/filter and
# qemu-img/filter, with PASS when the filter is at least as fast as
# qemu-nbd (qemu-img map makes no NBD round trips: shown, not a target).
#
# Knobs (environment):
#   BENCH_RUNS=N        repetitions (default 5, quick 3)
#   BENCH_MAP_SIZE=SIZE disk size (default 256T, quick 16T)
#   BENCH_MAP_WRITES=N  clusters written (default 2000, quick 200; 0: an
#                       empty disk, whose map is one extent per request)
#   BENCH_DIR=DIR       work dir (the image is kept there)
#   FILTER=PATH         the filter .so (default: this build tree)

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [ "$BENCH_QUICK" = 1 ]; then
    : "${BENCH_MAP_SIZE:=16T}"
    : "${BENCH_MAP_WRITES:=200}"
else
    : "${BENCH_MAP_SIZE:=256T}"
    : "${BENCH_MAP_WRITES:=2000}"
fi
need_cmds nbdkit qemu-nbd qemu-img qemu-io nbdinfo
[ -f "$FILTER" ] || die "the filter is not built: $FILTER"
bench_nice

RUN_DIR=$BENCH_DIR/run-map
mkdir -p "$RUN_DIR"
img=$RUN_DIR/sparse-$BENCH_MAP_SIZE-$BENCH_MAP_WRITES.qcow2
if [ ! -f "$img" ]; then
    msg "making $img"
    qemu-img create -q -f qcow2 -o cluster_size=65536 "$img.tmp" "$BENCH_MAP_SIZE"
    vsize=$(qemu-img info --output=json "$img.tmp" |
                sed -n 's/.*"virtual-size": \([0-9]*\).*/\1/p')
    if [ "$BENCH_MAP_WRITES" -gt 0 ]; then
        step=$(( (vsize / BENCH_MAP_WRITES) & ~65535 ))
        args=()
        for i in $(seq 0 $((BENCH_MAP_WRITES - 1))); do
            args+=(-c "write -P $((i % 250 + 1)) $((i * step + 65536)) 64k")
        done
        qemu-io -f qcow2 "${args[@]}" "$img.tmp" > /dev/null
    fi
    mv "$img.tmp" "$img"
fi

fsock=$RUN_DIR/filter.sock qsock=$RUN_DIR/qemu.sock
rm -f "$fsock" "$qsock" "$qsock.pid"
nbdkit -f -r -U "$fsock" --filter="$FILTER" file "$img" 2> "$RUN_DIR/filter.log" &
_server_pids+=($!)
qemu-nbd -r -t -f qcow2 -k "$qsock" "$img" 2> "$RUN_DIR/qemu.log" &
_server_pids+=($!)
for _ in $(seq 100); do
    [ -S "$fsock" ] && [ -S "$qsock" ] && break
    sleep 0.1
done
[ -S "$fsock" ] && [ -S "$qsock" ] || die "the servers did not start"

# map_once NAME SOCKET: one nbdinfo --map; its seconds go to NAME.times.
map_once ()
{
    local t0 t1
    t0=$(now)
    nbdinfo --map "nbd+unix:///?socket=$2" > "$RUN_DIR/$1.map" ||
        die "nbdinfo --map failed on $1"
    t1=$(now)
    calc "$t1 - $t0" >> "$RUN_DIR/$1.times"
    echo >> "$RUN_DIR/$1.times"
}

# qemu_img_map_once: one qemu-img map of the file; its seconds go to
# qemu-img.times, its extents as "start length type" (nbdinfo's types:
# 0 data, 3 hole and zero) to qemu-img.map.
qemu_img_map_once ()
{
    local t0 t1
    t0=$(now)
    qemu-img map -f qcow2 --output=json "$img" > "$RUN_DIR/qemu-img.json" ||
        die "qemu-img map failed"
    t1=$(now)
    calc "$t1 - $t0" >> "$RUN_DIR/qemu-img.times"
    echo >> "$RUN_DIR/qemu-img.times"
    /usr/bin/python3 -c '
import json, sys
out = []
for e in json.load(open(sys.argv[1])):
    t = 0 if e["data"] else 3
    if out and out[-1][2] == t and out[-1][0] + out[-1][1] == e["start"]:
        out[-1][1] += e["length"]
    else:
        out.append([e["start"], e["length"], t])
for start, length, t in out:
    print(start, length, t)
' "$RUN_DIR/qemu-img.json" > "$RUN_DIR/qemu-img.map" ||
        die "qemu-img map: its output could not be read"
}

# merged_extents: nbdinfo --map's lines as "start length type", runs of
# one type merged (as qemu_img_map_once prints them).
merged_extents ()
{
    awk 'n && $3 == t && $1 == s + l { l += $2; next }
         n { printf "%.0f %.0f %d\n", s, l, t }
         { s = $1; l = $2; t = $3; n = 1 }
         END { if (n) printf "%.0f %.0f %d\n", s, l, t }'
}

rm -f "$RUN_DIR/filter.times" "$RUN_DIR/qemu.times" "$RUN_DIR/qemu-img.times"
for run in $(seq "$BENCH_RUNS"); do
    if [ $((run % 2)) = 1 ]; then
        map_once filter "$fsock"; map_once qemu "$qsock"
    else
        map_once qemu "$qsock"; map_once filter "$fsock"
    fi
    qemu_img_map_once
    cmp -s "$RUN_DIR/filter.map" "$RUN_DIR/qemu.map" ||
        die "run $run: the maps differ (diff $RUN_DIR/filter.map $RUN_DIR/qemu.map)"
    merged_extents < "$RUN_DIR/filter.map" | cmp -s - "$RUN_DIR/qemu-img.map" ||
        die "run $run: qemu-img map ($RUN_DIR/qemu-img.map) differs from the filter's map"
done

extents=$(wc -l < "$RUN_DIR/filter.map")
tf=$(col_median "$RUN_DIR/filter.times" 1)
tq=$(col_median "$RUN_DIR/qemu.times" 1)
ti=$(col_median "$RUN_DIR/qemu-img.times" 1)
echo "Map of a $BENCH_MAP_SIZE qcow2 disk with $BENCH_MAP_WRITES clusters" \
     "written ($extents extents), median of $BENCH_RUNS runs:"
printf '  %-32s %8s s\n' "nbdinfo --map, qcow2zstd filter" "$(fmt 2 "$tf")" \
    "nbdinfo --map, qemu-nbd" "$(fmt 2 "$tq")" \
    "qemu-img map --output=json" "$(fmt 2 "$ti")"
printf '  ratio qemu-img map / filter: %sx (not a target)\n' "$(fmt 2 "$(ratio "$ti" "$tf")")"
target "map time qemu-nbd / filter" "$(ratio "$tq" "$tf")" ">=" 1
