#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Filter parameters: bad values stop nbdkit at startup with an error
# naming the parameter; good values serve the image correctly.  Also what
# the export advertises: with -r read-only (and writes refused), without
# it writable; the virtual size,
# multi-conn and block sizes.
source "${top_srcdir:-.}/tests/functions.sh"

requires nbdinfo nbdcopy qemu-img python3 cmp cksum

T=$TMPDIR_TEST

requires_nbd_python
NBD_PY=$PYTHON

# ------------------------------------------------------------ images
# 8 MiB + 12 KiB (the last cluster is partial): clusters that compress
# well, random ones that stay normal, patterns, and holes.
python3 - "$T/data.raw" <<'EOF'
import random
import sys
rng = random.Random(4242)
C = 65536
out = bytearray()
for i in range(128):
    kind = i % 5
    if kind == 0:
        out += rng.randbytes(C // 2) + bytes(C // 2)
    elif kind == 1:
        out += bytes(C)
    elif kind == 2:
        out += rng.randbytes(C)
    elif kind == 3:
        out += bytes([i]) * C
    else:
        out += (b"qcow2zstd %d " % i) * (C // 16) + bytes(C - (C // 16) * len(b"qcow2zstd %d " % i))
out += rng.randbytes(12288)
with open(sys.argv[1], "wb") as f:
    f.write(out)
EOF
VSIZE=$(stat -c %s "$T/data.raw")

qemu-img convert -f raw -O qcow2 -c -o compression_type=zstd,cluster_size=65536 \
    "$T/data.raw" "$T/zstd.qcow2"
qemu-img convert -f raw -O qcow2 -c -o compression_type=zlib,cluster_size=65536 \
    "$T/data.raw" "$T/zlib.qcow2"
qemu-img convert -f raw -O qcow2 -o cluster_size=2M \
    "$T/data.raw" "$T/big-cluster.qcow2"
qemu-img convert -f raw -O qcow2 -o cluster_size=4096 \
    "$T/data.raw" "$T/small-cluster.qcow2"
for img in zstd zlib big-cluster small-cluster; do
    qemu-img convert -O raw "$T/$img.qcow2" "$T/$img.ref"
    cmp -s "$T/$img.ref" "$T/data.raw" || fail "setup: qemu-img did not round-trip $img"
done
for img in zstd zlib; do
    check=$(qemu-img check "$T/$img.qcow2" 2>&1 || true)
    grep -q '[1-9][0-9.]*% compressed clusters' <<<"$check" ||
        fail "setup: $img.qcow2 has no compressed clusters: $check"
done

# ------------------------------------------------------------ bad values
# bad_param KEY=VALUE: nbdkit must refuse to start, naming KEY.  A
# failure is counted (so that every value is tried) and reported at the end.
bad_failures=0
bad_param ()
{
    local param=$1 key=${1%%=*} rc=0

    NBDKIT_TIMEOUT=120 run_nbdkit -U "$T/bad.sock" --filter="$FILTER" file "$T/zstd.qcow2" \
        "$param" --run true >"$T/bad.out" 2>"$T/bad.err" || rc=$?
    if [ "$rc" -eq 0 ]; then
        echo "FAIL: $param: nbdkit accepted it" >&2
        bad_failures=$((bad_failures + 1))
    elif grep -E -q 'Assertion|AddressSanitizer|runtime error|Segmentation' "$T/bad.err"
    then
        cat "$T/bad.err" >&2
        echo "FAIL: $param: nbdkit crashed" >&2
        bad_failures=$((bad_failures + 1))
    elif ! grep -q -- "$key" "$T/bad.err"; then
        echo "FAIL: $param: nbdkit exited with $rc but its error does not name $key:" \
            "$(tr '\n' ' ' < "$T/bad.err")" >&2
        bad_failures=$((bad_failures + 1))
    else
        echo "ok: $param refused: $(grep -m1 -- "$key" "$T/bad.err")"
    fi
}

for v in 0 257 -1 abc '' 1.5 4294967297; do
    bad_param "qcow2-threads=$v"
done
for v in 1K 4095 128M 64M1 xyz '' -4K; do
    bad_param "qcow2-request-size=$v"
done
for key in qcow2-l2-cache-size qcow2-cluster-cache-size; do
    for v in -1 lots '' 2T; do
        bad_param "$key=$v"
    done
done
for v in yes trim '' UNMAP; do
    bad_param "qcow2-discard=$v"
done
for v in yes 1 '' discard; do
    bad_param "qcow2-detect-zeroes=$v"
done

# ------------------------------------------------------------ good values
# good_params IMAGE NBDCOPY-ARGS PARAMS...: the image, served with
# PARAMS, copies out identical to what qemu-img reads.
good_params ()
{
    local img=$1 copy_args=$2
    shift 2
    local sock="$T/good.sock"

    start_server "$sock" file "$T/$img.qcow2" "$@" ||
        fail "$img $*: nbdkit did not start"
    rm -f "$T/out.raw"
    case "$copy_args" in
    chunk=*)
        # Copy with reads of an odd size, so that most of them start and
        # end inside clusters.
        "$NBD_PY" - "$(nbd_uri "$sock")" "$T/out.raw" "${copy_args#chunk=}" <<'EOF' ||
import sys
import nbd
uri, out, chunk = sys.argv[1], sys.argv[2], int(sys.argv[3])
h = nbd.NBD()
h.connect_uri(uri)
size = h.get_size()
with open(out, "wb") as f:
    for off in range(0, size, chunk):
        f.write(h.pread(min(chunk, size - off), off))
h.shutdown()
EOF
            fail "$img $*: reading in chunks of ${copy_args#chunk=} bytes failed"
        ;;
    *)
        # shellcheck disable=SC2086
        nbdcopy $copy_args "$(nbd_uri "$sock")" "$T/out.raw" ||
            fail "$img $*: nbdcopy failed"
        ;;
    esac
    cmp "$T/out.raw" "$T/$img.ref" || fail "$img $*: wrong data"
    kill -0 "$SERVER_PID" || fail "$img $*: the server died"
    if grep -E 'error|Assertion|AddressSanitizer|runtime error|Segmentation' "$sock.log" >&2
    then
        fail "$img $*: errors in the server log"
    fi
    stop_server
    echo "ok: $img ${*:-(defaults)} serves the image${copy_args:+ ($copy_args)}"
}

good_params zstd ""
for p in qcow2-threads=1 qcow2-threads=4 qcow2-request-size=64K \
         qcow2-l2-cache-size=0 qcow2-cluster-cache-size=0 \
         qcow2-cluster-cache-size=1M qcow2-request-size=4K \
         qcow2-request-size=64M qcow2-l2-cache-size=64K; do
    good_params zstd "" "$p"
    good_params zlib "" "$p"
done
for p in qcow2-discard=unmap qcow2-discard=ignore qcow2-discard=on \
         qcow2-discard=off qcow2-detect-zeroes=off qcow2-detect-zeroes=on \
         qcow2-detect-zeroes=unmap; do
    good_params zstd "" "$p"
done
# Everything small at once, with small requests from the client so that
# partial clusters go through the (absent) caches.
good_params zlib "--request-size=4096" qcow2-threads=2 qcow2-request-size=4K \
    qcow2-l2-cache-size=0 qcow2-cluster-cache-size=0
good_params zstd "--request-size=4096 --connections=1" qcow2-threads=3 \
    qcow2-cluster-cache-size=0
good_params zstd chunk=10000 qcow2-cluster-cache-size=0
good_params zlib chunk=10000
good_params zstd chunk=200000 qcow2-request-size=4K
# The largest thread count, on one connection.
good_params zstd "--connections=1" qcow2-threads=256
good_params big-cluster "" qcow2-request-size=4K qcow2-cluster-cache-size=1M
good_params small-cluster "" qcow2-l2-cache-size=0

# ------------------------------------------------------------ export flags
# info_field JSON FIELD: one field of nbdinfo --json's first export.
info_field ()
{
    python3 -c '
import json, sys
e = json.load(open(sys.argv[1]))["exports"][0]
v = e.get(sys.argv[2])
print("missing" if v is None else json.dumps(v))' "$1" "$2"
}

for img in zstd big-cluster small-cluster; do
    sock="$T/info-$img.sock"
    start_server "$sock" -r file "$T/$img.qcow2"
    uri=$(nbd_uri "$sock")
    nbdinfo --json "$uri" > "$T/info.json" || fail "$img: nbdinfo --json failed"

    [ "$(nbdinfo --size "$uri")" = "$VSIZE" ] ||
        fail "$img: nbdinfo --size says $(nbdinfo --size "$uri"), expected $VSIZE"
    [ "$(info_field "$T/info.json" export-size)" = "$VSIZE" ] ||
        fail "$img: export-size is not $VSIZE"
    [ "$(info_field "$T/info.json" is_read_only)" = true ] ||
        fail "$img: the export is not read-only"
    for f in can_zero can_trim can_fast_zero; do
        [ "$(info_field "$T/info.json" $f)" = false ] ||
            fail "$img: $f is $(info_field "$T/info.json" $f)"
    done
    [ "$(info_field "$T/info.json" can_multi_conn)" = true ] ||
        fail "$img: can_multi_conn is not true"

    csize=$(qemu-img info --output=json "$T/$img.qcow2" |
            python3 -c 'import json, sys; print(json.load(sys.stdin)["cluster-size"])')
    min=$(info_field "$T/info.json" block_size_minimum)
    pref=$(info_field "$T/info.json" block_size_preferred)
    max=$(info_field "$T/info.json" block_size_maximum)
    case "$min$pref$max" in
        *missing*) fail "$img: nbdinfo shows no block size information" ;;
    esac
    [ "$min" -ge 1 ] && [ "$min" -le 4096 ] || fail "$img: block_size_minimum $min"
    [ "$pref" -ge "$csize" ] ||
        fail "$img: block_size_preferred $pref is below the cluster size $csize"
    [ "$pref" -ge "$min" ] && [ "$max" -ge "$pref" ] ||
        fail "$img: block sizes out of order: $min $pref $max"

    # Writes are refused: by libnbd for a read-only export, and by the
    # server when the client sends them anyway.
    sum=$(cksum < "$T/$img.qcow2")
    "$NBD_PY" - "$uri" "$T/$img.ref" <<'EOF' || fail "$img: write test"
import sys
import nbd

uri, ref = sys.argv[1:3]
h = nbd.NBD()
h.connect_uri(uri)
if not h.is_read_only():
    sys.exit("is_read_only() is false")
if h.can_zero() or h.can_trim():
    sys.exit("the export offers zero or trim")
try:
    h.pwrite(b"\xaa" * 4096, 0)
    sys.exit("pwrite succeeded")
except nbd.Error:
    pass
h.set_strict_mode(0)
for op in ("pwrite", "zero", "trim"):
    try:
        if op == "pwrite":
            h.pwrite(b"\xaa" * 4096, 65536)
        elif op == "zero":
            h.zero(4096, 65536)
        else:
            h.trim(4096, 65536)
        sys.exit("%s sent to the server succeeded" % op)
    except nbd.Error as e:
        if e.errnum is None:
            sys.exit("%s failed without an errno: %s" % (op, e))
with open(ref, "rb") as f:
    data = f.read()
if h.pread(2 * 65536, 0) != data[:2 * 65536]:
    sys.exit("the data changed after the refused writes")
h.shutdown()
EOF
    [ "$(cksum < "$T/$img.qcow2")" = "$sum" ] || fail "$img: the image was modified"
    kill -0 "$SERVER_PID" || fail "$img: the server died"
    stop_server
    echo "ok: $img: size $VSIZE, read-only, writes refused, multi-conn, block sizes $min/$pref/$max (cluster $csize)"
done

# Without -r the export is writable, with every write-side feature.
cp "$T/zstd.qcow2" "$T/rw.qcow2"
start_server "$T/rw.sock" file "$T/rw.qcow2"
nbdinfo --json "$(nbd_uri "$T/rw.sock")" > "$T/info.json" || fail "rw: nbdinfo --json failed"
stop_server
[ "$(info_field "$T/info.json" is_read_only)" = false ] || fail "rw: the export is read-only"
for f in can_flush can_zero can_trim can_fast_zero can_fua; do
    [ "$(info_field "$T/info.json" $f)" = true ] ||
        fail "rw: $f is $(info_field "$T/info.json" $f)"
done
echo "ok: without -r: writable, flush, zero, fast zero, trim, FUA"

if [ "$bad_failures" -gt 0 ]; then
    fail "$bad_failures bad parameter value(s) were not reported properly (see FAIL lines above)"
fi
echo "test-params: all cases passed"
