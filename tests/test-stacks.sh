#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The filter in stacks with nbdkit's own filters and plugins:
#   (a) cow on top: a writable overlay of the image, which stays unchanged;
#   (b) cache on top, reading and writing (writeback);
#   (c) readahead on top, small sequential reads;
#   (d) blocksize on top (minblock=4096 maxdata=65536), reading;
#   (e) the memory plugin underneath, with qcow2-create;
#   (f) the nbd plugin underneath, the qcow2 file served raw by a second
#       nbdkit, read-only and read-write;
#   (g) the curl plugin underneath, over HTTP with byte ranges from nginx;
#   (h) write workloads with blocksize (read-modify-write of unaligned
#       requests) and with fua (every write forced to FUA) on top.
# Every case compares what the client reads with the source, and every
# case that writes ends with qemu-img check clean and qemu reading the
# expected disk from the file.  One line per case.
source "${top_srcdir:-.}/tests/functions.sh"
source "${top_srcdir:-.}/tests/nginx-functions.sh"
requires nbdcopy qemu-io cmp md5sum
requires_nbd_python

cd "$TMPDIR_TEST"

# start_stack SOCKET NBDKIT-ARGS...: start_nbdkit (functions.sh), which
# does not add the filter: the caller places --filter="$FILTER" in the
# stack itself, since nbdkit's first --filter is the one nearest the
# client.
start_stack ()
{
    start_nbdkit "$@" || fail "nbdkit ${*:2} did not start"
}

# have_filter NAME / have_plugin NAME: whether nbdkit has it.
have_filter () { nbdkit --filter="$1" null --dump-plugin >/dev/null 2>&1; }
have_plugin () { nbdkit "$1" --dump-plugin >/dev/null 2>&1; }

# skip_case LETTER WHAT REASON: a case that cannot run here (counted
# and printed by .ci/run).
ran=0 skipped=0
skip_case () { skip_section "($1) $2: $3"; skipped=$((skipped + 1)); }
ok_case () { echo "($1) $2"; ran=$((ran + 1)); }

check_clean ()
{
    qemu-img check "$1" > check.out 2>&1 || { cat check.out; fail "$2: qemu-img check failed"; }
    grep -q "No errors were found" check.out || { cat check.out; fail "$2: qemu-img check found problems"; }
}

# The source disk: 6 MiB of random data, text, written zeros and holes.
mixed_disk src.raw $((6 * 1024 * 1024)) 21
# fresh NAME: a compressed zstd image of src.raw with 16 MiB of room.
fresh ()
{
    rm -f "$1"
    qemu-img convert -f raw -O qcow2 -c -o compression_type=zstd src.raw "$1"
    truncate -s +16M "$1"
}
fresh base.qcow2
qemu-img compare -q -f qcow2 -F raw base.qcow2 src.raw || fail "qemu-img made a wrong image"
sock=$PWD/sock
uri=$(nbd_uri "$sock")

# -------------------------------------------------------------- (a) cow
if have_filter cow; then
    sum=$(md5sum < base.qcow2)
    start_stack "$sock" --filter=cow --filter="$FILTER" file base.qcow2
    nbdcopy "$uri" a-read.raw
    cmp a-read.raw src.raw || fail "(a) cow: read differs from the source"
    cp src.raw a-expect.raw
    ops=(-c 'write -P 0x5a 1000 200000' -c 'write -z 1048576 131072' -c 'write -P 0x6b 6000000 291152')
    qemu-io -f raw "$uri" "${ops[@]}" -c 'read -P 0x5a 1000 200000' > a-io.out 2>&1 ||
        { cat a-io.out; fail "(a) cow: qemu-io write/read failed"; }
    qemu-io -f raw a-expect.raw "${ops[@]}" > /dev/null
    # Through a second connection: the overlay is shared by the connections.
    nbdcopy "$uri" a-after.raw
    cmp a-after.raw a-expect.raw || fail "(a) cow: writes do not read back"
    cmp -s a-after.raw src.raw && fail "(a) cow: the writes changed nothing"
    stop_server
    [ "$(md5sum < base.qcow2)" = "$sum" ] || fail "(a) cow: the qcow2 file changed under cow"
    check_clean base.qcow2 "(a) cow"
    qemu-img compare -q -f qcow2 -F raw base.qcow2 src.raw || fail "(a) cow: the image's disk changed"
    ok_case a "cow on top: reads identical, writes read back, qcow2 file unchanged (md5), check clean"
else
    skip_case a "cow on top" "nbdkit has no cow filter"
fi

# ------------------------------------------------------------ (b) cache
if have_filter cache; then
    fresh b.qcow2
    start_stack "$sock" --filter=cache --filter="$FILTER" file b.qcow2
    nbdcopy "$uri" b-read1.raw
    nbdcopy "$uri" b-read2.raw        # the second time from the cache
    cmp b-read1.raw src.raw || fail "(b) cache: first read differs"
    cmp b-read2.raw src.raw || fail "(b) cache: cached read differs"
    cp src.raw b-expect.raw
    ops=(-c 'write -P 0x21 70000 300000' -c 'write -P 0x22 2097152 65536'
         -c 'write -z 3145728 131072' -c 'write -P 0x23 4000001 12345' -c 'flush')
    qemu-io -f raw "$uri" "${ops[@]}" > b-io.out 2>&1 || { cat b-io.out; fail "(b) cache: qemu-io failed"; }
    qemu-io -f raw b-expect.raw "${ops[@]}" > /dev/null
    nbdcopy "$uri" b-after.raw
    cmp b-after.raw b-expect.raw || fail "(b) cache: writes do not read back"
    stop_server
    check_clean b.qcow2 "(b) cache"
    qemu-img compare -q -f qcow2 -F raw b.qcow2 b-expect.raw || fail "(b) cache: the qcow2 does not hold the writes"
    ok_case b "cache on top: reads identical (twice), writes + flush in the qcow2, check clean"
else
    skip_case b "cache on top" "nbdkit has no cache filter"
fi

# -------------------------------------------------------- (c) readahead
if have_filter readahead; then
    start_stack "$sock" -r --filter=readahead --filter="$FILTER" file base.qcow2
    # Small sequential reads (what readahead is for), then nbdcopy.
    $PYTHON - "$uri" <<'EOF' || fail "(c) readahead: sequential 4k reads differ"
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
src = open("src.raw", "rb").read()
step = 4096
for off in range(0, len(src), step):
    if h.pread(step, off) != src[off:off + step]:
        sys.exit("differs at %d" % off)
# and some odd-sized sequential reads across cluster boundaries
off = 12345
while off + 7000 < len(src):
    if h.pread(7000, off) != src[off:off + 7000]:
        sys.exit("differs at %d" % off)
    off += 7000
EOF
    nbdcopy --request-size=65536 --connections=1 "$uri" c-read.raw
    cmp c-read.raw src.raw || fail "(c) readahead: nbdcopy read differs"
    stop_server
    ok_case c "readahead on top: sequential 4k and 7000-byte reads and nbdcopy identical"
    # nbdkit 1.32's readahead sends its queued .cache requests from its own
    # thread until its .close, which comes after this filter's .finalize:
    # the filter must still serve them then.  delay-cache keeps a few
    # queued when the client leaves (nbdkit crashed here before).
    if have_filter delay; then
        start_stack "$sock" -r -v --filter=readahead --filter=delay --filter="$FILTER" \
            file base.qcow2 delay-cache=100ms
        $PYTHON - "$uri" <<'EOF' || fail "(c) readahead: reads failed"
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
for off in range(0, 5 * 4096, 4096):
    h.pread(4096, off)
h.shutdown()
EOF
        # The queue drains (100 ms per request) before the connection's
        # last layer closes: nbdkit -v logs each layer's close.
        for (( i = 0; i < 600; i++ )); do
            ! grep -q "debug: qcow2zstd: close" "$sock.log" || break
            _alive "$SERVER_PID" || break
            sleep 0.1
        done
        [ "$(nbdinfo --size "$uri")" = 6291456 ] ||
            { cat "$sock.log"; fail "(c) readahead: the server died serving .cache after the client left"; }
        late=$(grep -c "cache request after the connection was finalized" "$sock.log" || true)
        [ "$late" -gt 0 ] || { grep qcow2zstd "$sock.log" | tail; fail "(c) readahead: no .cache request came after the client left"; }
        stop_server
        ok_case c "readahead on top, client leaves with .cache requests queued: $late served late, server still serving"
    else
        skip_case c "readahead, client leaves with .cache requests queued" "nbdkit has no delay filter"
    fi
else
    skip_case c "readahead on top" "nbdkit has no readahead filter"
fi

# -------------------------------------------------------- (d) blocksize
if have_filter blocksize; then
    start_stack "$sock" -r --filter=blocksize --filter="$FILTER" file base.qcow2 \
        minblock=4096 maxdata=65536
    nbdcopy --request-size=1048576 "$uri" d-read.raw
    cmp d-read.raw src.raw || fail "(d) blocksize: nbdcopy read differs"
    # Unaligned reads are widened to 4096 by blocksize.
    $PYTHON - "$uri" <<'EOF' || fail "(d) blocksize: unaligned reads differ"
import nbd, random, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
src = open("src.raw", "rb").read()
rng = random.Random(4)
for _ in range(300):
    off = rng.randrange(len(src))
    n = rng.randrange(1, min(200000, len(src) - off) + 1)
    if h.pread(n, off) != src[off:off + n]:
        sys.exit("differs at %d+%d" % (off, n))
EOF
    stop_server
    ok_case d "blocksize minblock=4096 maxdata=65536 on top: nbdcopy and 300 unaligned reads identical"
else
    skip_case d "blocksize on top" "nbdkit has no blocksize filter"
fi

# ----------------------------------------------------------- (e) memory
if [ "${VALGRIND:-0}" = 1 ]; then
    skip_case e "memory plugin under" "under valgrind: nbdkit 1.32's memory plugin itself leaks 24 bytes at load"
elif have_plugin memory; then
    # 24 MiB of guest disk: random, text, zeros; written into a 48M disk.
    $PYTHON -c '
import os, sys
text = b"memory plugin under qcow2zstd\n" * 300000
sys.stdout.buffer.write(os.urandom(8 << 20) + text[:8 << 20] + bytes(8 << 20))' > e-src.raw
    cp e-src.raw e-expect.raw
    truncate -s 48M e-expect.raw
    start_server "$sock" -v -D qcow2zstd.stats=1 memory 64M qcow2-create=48M
    [ "$(nbdinfo --size "$uri")" = $((48 << 20)) ] || fail "(e) memory: the created disk is not 48M"
    nbdcopy e-src.raw "$uri"
    # A new connection after the last one closed opens the image again
    # from the bytes in memory: the metadata was written there.
    nbdcopy "$uri" e-read.raw
    cmp e-read.raw e-expect.raw || fail "(e) memory: read back differs"
    # Partial reads decompress: the compressed clusters are real.
    $PYTHON - "$uri" <<'EOF' || fail "(e) memory: partial reads differ"
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
ref = open("e-expect.raw", "rb").read()
for off in range(100, 24 << 20, 1000003):
    if h.pread(5000, off) != ref[off:off + 5000]:
        sys.exit("differs at %d" % off)
EOF
    stop_server
    grep -Eq "stats for export '.*': [1-9][0-9]* clusters decompressed" "$sock.log" ||
        { grep qcow2zstd "$sock.log" | tail -5; fail "(e) memory: no cluster was decompressed: the data was not compressed"; }
    ok_case e "memory plugin under the filter, qcow2-create=48M: nbdcopy in, reopened, read back identical, clusters compressed"
else
    skip_case e "memory plugin under" "nbdkit has no memory plugin"
fi

# -------------------------------------------------------------- (f) nbd
if have_plugin nbd; then
    sock2=$PWD/sock2
    sum=$(md5sum < base.qcow2)
    start_stack "$sock2" -r file base.qcow2
    raw_server=$SERVER_PID raw_job=$SERVER_JOB
    start_server "$sock" -r nbd socket="$sock2"
    nbdcopy "$uri" f-read.raw
    cmp f-read.raw src.raw || fail "(f) nbd read-only: read differs"
    qemu-img compare -q -f raw -F qcow2 "$uri" base.qcow2 || fail "(f) nbd read-only: qemu-img compare differs"
    stop_server
    SERVER_PID=$raw_server SERVER_JOB=$raw_job stop_server
    [ "$(md5sum < base.qcow2)" = "$sum" ] || fail "(f) nbd read-only: the qcow2 file changed"
    ok_case f "nbd plugin under the filter (qcow2 bytes from a second nbdkit -r): reads identical, file unchanged"

    # Read-write: a write workload through the nbd plugin.
    fresh f.qcow2
    cp src.raw f-mirror.raw
    start_stack "$sock2" file f.qcow2
    raw_server=$SERVER_PID raw_job=$SERVER_JOB
    start_server "$sock" nbd socket="$sock2"
    $PYTHON "$top_srcdir/tests/write-workload.py" "$uri" f-mirror.raw 31 2 300 65536 > f-work.out 2>&1 ||
        { cat f-work.out; fail "(f) nbd read-write: workload failed"; }
    nbdcopy "$uri" f-after.raw
    cmp f-after.raw f-mirror.raw || fail "(f) nbd read-write: export differs from the mirror"
    stop_server
    SERVER_PID=$raw_server SERVER_JOB=$raw_job stop_server
    check_clean f.qcow2 "(f) nbd read-write"
    qemu-img compare -q -f qcow2 -F raw f.qcow2 f-mirror.raw || fail "(f) nbd read-write: qcow2 differs from the mirror"
    ok_case f "nbd plugin under the filter, read-write: 2 connections x 300 ops, identical, check clean"
else
    skip_case f "nbd plugin under" "nbdkit has no nbd plugin"
fi

# ------------------------------------------------------------- (g) curl
if ! have_plugin curl; then
    skip_case g "curl plugin under" "nbdkit has no curl plugin (in Debian 12 it is part of the nbdkit package)"
elif ! start_test_nginx "$PWD"; then
    skip_case g "curl plugin under" "$NGINX_SKIP"
else
    start_server "$sock" -r curl "$NGINX_URL/base.qcow2" qcow2-request-size=256K
    nbdcopy "$uri" g-read.raw
    cmp g-read.raw src.raw || fail "(g) curl: read differs"
    stop_server
    stop_nginx
    nranges=$(grep -c '^GET /base.qcow2 206 range=bytes=' "$NGINX_ACCESS_LOG" || true)
    [ "$nranges" -gt 1 ] || { cat "$NGINX_ACCESS_LOG"; fail "(g) curl: nginx served no range requests"; }
    ok_case g "curl plugin under the filter, nginx with ranges ($nranges range requests): read identical"
fi

# ------------------------------------------- (h) writing through filters
if have_filter blocksize; then
    fresh h.qcow2
    cp src.raw h-mirror.raw
    start_stack "$sock" --filter=blocksize --filter="$FILTER" file h.qcow2 \
        minblock=4096 maxdata=65536
    # One connection: blocksize's read-modify-write of unaligned requests
    # is not atomic against other connections' writes to the same block.
    $PYTHON "$top_srcdir/tests/write-workload.py" "$uri" h-mirror.raw 41 1 500 65536 > h-work.out 2>&1 ||
        { cat h-work.out; fail "(h) blocksize: workload failed"; }
    nbdcopy "$uri" h-after.raw
    cmp h-after.raw h-mirror.raw || fail "(h) blocksize: export differs from the mirror"
    stop_server
    check_clean h.qcow2 "(h) blocksize"
    qemu-img compare -q -f qcow2 -F raw h.qcow2 h-mirror.raw || fail "(h) blocksize: the qcow2 differs from the mirror"
    ok_case h "blocksize minblock=4096 maxdata=65536 on top, 500 unaligned writes/zeroes/trims/flushes: identical, check clean"
else
    skip_case h "blocksize on top, writing" "nbdkit has no blocksize filter"
fi
# fua on top, fuamode=force: every write, zero and trim carries FUA, so
# each one is durable (data and metadata) when it is acknowledged.  The
# client writes without flushing and then kills the server with SIGKILL
# while still connected: no flush, no writeback at disconnect.
fua_run ()
{
    # fua_run IMG MIRROR yes|no: with or without --filter=fua fuamode=force.
    local img=$1 mirror=$2
    if [ "$3" = yes ]; then
        start_stack "$sock" --filter=fua --filter="$FILTER" file "$img" fuamode=force
    else
        start_stack "$sock" --filter="$FILTER" file "$img"
    fi
    $PYTHON - "$uri" "$mirror" "$SERVER_PID" <<'PYEOF' > fua.out 2>&1 || { cat fua.out; fail "(h) fua: client failed"; }
import nbd, os, random, signal, sys
uri, mirror, pid = sys.argv[1], sys.argv[2], int(sys.argv[3])
h = nbd.NBD()
h.connect_uri(uri)
size = h.get_size()
fd = os.open(mirror, os.O_RDWR)
rng = random.Random(47)
for i in range(200):
    off = rng.randrange(size - 1)
    n = rng.randrange(1, min(150000, size - off) + 1)
    k = rng.randrange(10)
    if k < 7:
        data = rng.randbytes(n) if k < 4 else bytes([i & 255]) * n
        h.pwrite(data, off)
        os.pwrite(fd, data, off)
    else:
        h.zero(n, off)
        os.pwrite(fd, bytes(n), off)
os.close(fd)
os.kill(pid, signal.SIGKILL)
PYEOF
    server_killed
}
if have_filter fua; then
    fresh h2.qcow2
    cp src.raw h2-mirror.raw
    fua_run h2.qcow2 h2-mirror.raw yes
    # Every request was acknowledged before the kill, each one after a
    # full metadata flush: not even a leak is allowed.
    check_clean h2.qcow2 "(h) fua, after kill -9"
    qemu-img compare -q -f qcow2 -F raw h2.qcow2 h2-mirror.raw || fail "(h) fua: acknowledged FUA writes are missing after kill -9"
    # The same without the fua filter, for contrast (not a check: the
    # filter may write metadata early); shows the check above can fail.
    fresh h3.qcow2
    cp src.raw h3-mirror.raw
    fua_run h3.qcow2 h3-mirror.raw no
    if qemu-img compare -q -f qcow2 -F raw h3.qcow2 h3-mirror.raw 2>/dev/null; then
        contrast="without fua the same run also kept every write"
    else
        contrast="without fua the same run loses writes"
    fi
    ok_case h "fua fuamode=force on top, 200 writes/zeroes without flush, kill -9: check clean (no leak), every write in the qcow2 ($contrast)"
else
    skip_case h "fua on top" "nbdkit has no fua filter"
fi

echo "$ran cases ran, $skipped skipped"
[ "$ran" -gt 0 ] || skip "no case could run here"
