# SPDX-License-Identifier: BSD-3-Clause
# Helpers shared by bench-write.sh and bench-compress.sh (sourced, not
# run).  Builds on common.sh (through make-image.sh, for the cached
# images) and changes nothing there: the read benchmark keeps working the
# same way, and may even run at the same time, because these scripts use
# their own run directory ($BENCH_DIR/run-NAME.PID) and never modify the
# cached images (they work on copies).

[ -z "${_BENCH_COMMON_WRITE_SOURCED:-}" ] || return 0
_BENCH_COMMON_WRITE_SOURCED=1

source "$(dirname "${BASH_SOURCE[0]}")/make-image.sh"

# ---------------------------------------------------------------------
# Run and result directories, private copy of the filter.

# bench_setup NAME: sets RUN_DIR, RES_DIR, FILTER (a private copy),
# FILTER_ORIG, FILTER_BUILT, FILTER_SHA.  RUN_DIR is removed at exit.
bench_setup ()
{
    local name=$1
    RUN_DIR=$BENCH_DIR/run-$name.$$
    RES_DIR=$BENCH_DIR/results/$(date +%Y%m%d-%H%M%S)-$name-$BENCH_VARIANT
    rm -rf "$RUN_DIR"
    mkdir -p "$RUN_DIR" "$RES_DIR"
    [ -f "$FILTER" ] || die "the filter is not built: $FILTER"
    # A private copy: the build tree may be rebuilt while we run, and one
    # run must not mix two builds.
    FILTER_ORIG=$FILTER
    FILTER_BUILT=$(date -u -r "$FILTER_ORIG" '+%Y-%m-%d %H:%M:%S UTC')
    cp -f "$FILTER_ORIG" "$RUN_DIR/filter.so"
    FILTER=$RUN_DIR/filter.so
    FILTER_SHA=$(sha256sum "$FILTER" | cut -c1-12)
    trap '_bench_cleanup; _bench_write_cleanup' EXIT
}

_bench_write_cleanup ()
{
    if [ "${BENCH_KEEP:-0}" = 1 ]; then
        msg "BENCH_KEEP=1: leaving $RUN_DIR"
    elif [ -n "${RUN_DIR:-}" ] && [ -d "$RUN_DIR" ]; then
        # Logs of a failed run are worth keeping: copy them next to the
        # results before the run directory goes.
        if [ -n "${RES_DIR:-}" ] && [ -d "$RES_DIR" ]; then
            cp -f "$RUN_DIR"/*.log "$RES_DIR"/ 2>/dev/null || true
        fi
        rm -rf "$RUN_DIR"
    fi
}

# print_machine TITLE: the header every benchmark prints.
print_machine ()
{
    echo "$1 ($BENCH_VARIANT), $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "Machine: $NPROC CPUs ($(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)), $(awk '/^MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo) RAM, kernel $(uname -r), load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "Versions: $(nbdkit --version | head -n1); $(qemu-img --version | head -n1); $(nbdcopy --version | head -n1); $(fio --version)"
    echo "Filter: $FILTER_ORIG (built $FILTER_BUILT, sha256 $FILTER_SHA..., run from a copy; tree $(git -C "$BENCH_TOPDIR" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$BENCH_TOPDIR" diff --quiet HEAD -- filters common 2>/dev/null || echo ' + local changes'))"
    echo "Filesystem of $BENCH_DIR: $(df -T "$BENCH_DIR" | awk 'NR == 2 { print $2 " on " $1 }')"
}

# ---------------------------------------------------------------------
# Files.

# Allocated bytes of FILE (what du counts).
alloc_bytes ()
{
    local b u
    read -r b u < <(stat -c '%b %B' "$1")
    echo $((b * u))
}

mib () { fmt "${2:-1}" "$(calc "$1 / 1048576")"; }

# qcow2_check FILE LOG: qemu-img check, output appended to LOG.  Returns
# qemu-img's status (0 clean, 2 corrupt, 3 leaks only).  Prints the
# image end offset.
qcow2_check ()
{
    local f=$1 log=$2 out rc=0
    out=$(qemu-img check "$f" 2>&1) || rc=$?
    printf '== qemu-img check %s (status %s)\n%s\n' "$f" "$rc" "$out" >> "$log"
    sed -n 's/^Image end offset: //p' <<<"$out"
    return "$rc"
}

# qcow2_info FILE: "VIRTUAL_SIZE COMPRESSION_TYPE CLUSTER_SIZE" from
# qemu-img info (compression type "-" if the image has none recorded).
qcow2_info ()
{
    qemu-img info --output=json "$1" | python3 -c '
import json, sys
j = json.load(sys.stdin)
d = j.get("format-specific", {}).get("data", {})
print(j["virtual-size"], d.get("compression-type", "-"), j.get("cluster-size", "-"))'
}

# ---------------------------------------------------------------------
# Servers (in addition to start_server's kinds, which are read-only for
# qemu): qemu-nbd writable.  The server is registered like start_server's
# so that stop_server, server_alive and the exit trap handle it.

# start_qemu_rw NAME IMAGE: qemu-nbd -f qcow2 --cache=writeback, writable.
# --persistent only so that the readiness probe (nbdinfo) does not make
# it exit; it does not change how requests are served.
start_qemu_rw ()
{
    start_command "$1" qemu-nbd -f qcow2 --cache=writeback --persistent \
        -k SOCK "$2"
}

# fio_json_field JSON: "iops MiB/s mean_lat_us p99_lat_us total_ios
# runtime_s" of the write side of fio's JSON output; fails on fio errors.
fio_json_write ()
{
    python3 - "$1" <<'EOF'
import json, sys
with open(sys.argv[1]) as f:
    text = f.read()
# fio may print notes before the JSON document.
j = json.loads(text[text.index("{"):])
job = j["jobs"][0]
w = job["write"]
if job.get("error"):
    sys.exit("fio: job error %s" % job["error"])
if w.get("short_ios") or w.get("drop_ios"):
    sys.exit("fio: short or dropped writes")
p99 = w["clat_ns"].get("percentile", {}).get("99.000000", 0)
print("%.1f %.3f %.1f %.1f %d %.3f" % (w["iops"], w["bw_bytes"] / 1048576.0,
      w["lat_ns"]["mean"] / 1000.0, p99 / 1000.0, w["total_ios"],
      w["runtime"] / 1000.0))
EOF
}

# min/max of column N of FILE, "MIN-MAX" with precision P.
col_range ()
{
    local f=$1 n=$2 p=${3:-1}
    if [ ! -s "$f" ]; then printf -- '-'; return; fi
    awk -v n="$n" -v p="$p" 'NR == 1 { lo = hi = $n }
        { if ($n < lo) lo = $n; if ($n > hi) hi = $n }
        END { printf "%.*f-%.*f", p, lo, p, hi }' "$f"
}

# to_bytes SIZE: 4k, 16M, 1G, 1GiB, 512 -> bytes (IEC, powers of 1024).
to_bytes ()
{
    local s=${1^^}
    s=${s%B}
    s=${s%I}
    numfmt --from=iec "$s" 2>/dev/null || die "not a size: $1"
}
