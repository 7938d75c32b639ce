#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Many connections and threads reading at once get correct data, through
# the worker pool, the shared L2 cache and a cluster cache small enough to
# evict all the time.
source "${top_srcdir:-.}/tests/functions.sh"
requires nbdcopy nbdsh qemu-io

cd "$TMPDIR_TEST"

# A disk mixing incompressible, compressible and zero data, 4k clusters so
# there are many L2 tables and many compressed clusters per host cluster.
python3 - <<'EOF'
import random
rng = random.Random(7)
out = bytearray()
words = [b"qcow2", b"cluster", b"zstd", b"deflate", b"nbdkit", b"guest", b"\n"]
while len(out) < 24 * 1024 * 1024 + 1536:
    kind = rng.randrange(3)
    n = rng.randrange(1, 200000)
    if kind == 0:
        out += rng.randbytes(n)
    elif kind == 1:
        out += b" ".join(rng.choice(words) for _ in range(n // 6))
    else:
        out += bytes(n)
open("disk.raw", "wb").write(out[:24 * 1024 * 1024 + 1536])
EOF

for comp in zstd zlib; do
    img=disk-$comp.qcow2
    qemu-img convert -c -O qcow2 \
        -o compression_type=$comp,cluster_size=4096 disk.raw "$img"

    # 1. Parallel full copies: four nbdcopy clients, each with several
    # connections and requests in flight, into one server whose pool
    # has three workers per connection.
    start_server "$PWD/s-$comp" -v -D qcow2zstd.stats=1 file "$img" \
        qcow2-threads=4 qcow2-request-size=64K \
        qcow2-cluster-cache-size=256K qcow2-l2-cache-size=64K
    uri=$(nbd_uri "$PWD/s-$comp")
    pids=()
    for i in 1 2 3 4; do
        nbdcopy --connections=4 --requests=16 --request-size=$((4096 << i)) \
            "$uri" "copy-$i.raw" & pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || fail "$comp: nbdcopy failed"; done
    for i in 1 2 3 4; do
        cmp "copy-$i.raw" disk.raw || fail "$comp: copy $i differs"
    done
    echo "$comp: 4 parallel nbdcopy clients, 16 connections: identical"

    # 2. Small unaligned reads from several connections at once, each
    # with many commands in flight, through a tiny cluster cache: every
    # read may evict another connection's cluster.
    pids=()
    for seed in 1 2 3 4; do
        nbdsh -u "$uri" -c - >"nbdsh-$seed.out" 2>&1 <<EOF & pids+=($!)
import random
rng = random.Random($seed)
data = open("disk.raw", "rb").read()
size = h.get_size()
assert size == len(data), (size, len(data))
pending = []
bad = 0
for i in range(3000):
    n = rng.choice([1, 511, 4096, 4097, 12288, 65536, 200000])
    off = rng.randrange(0, size - n)
    if rng.randrange(4) == 0:
        off = (off // 4096) * 4096 + rng.choice([0, 4095, 2048])
        off = min(off, size - n)
    buf = nbd.Buffer(n)
    cookie = h.aio_pread(buf, off)
    pending.append((cookie, buf, off, n))
    while len(pending) >= 16 or (i == 2999 and pending):
        h.poll(-1)
        still = []
        for c, b, o, l in pending:
            if h.aio_command_completed(c):
                if b.to_bytearray() != data[o:o + l]:
                    bad += 1
            else:
                still.append((c, b, o, l))
        pending = still
assert bad == 0, f"{bad} reads returned wrong data"
print("ok")
EOF
    done
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}" || { cat "nbdsh-$((i + 1)).out"; fail "$comp: nbdsh reader $((i + 1)) failed"; }
    done
    echo "$comp: 4 connections x 3000 random reads, 16 in flight, 256K cluster cache: identical"

    kill -0 "$SERVER_PID" || fail "$comp: server died"
    if grep -E "Assertion|AddressSanitizer|runtime error|Segmentation" "$PWD/s-$comp.log"; then
        fail "$comp: server log shows a crash"
    fi
    stop_server
    # Every connection has closed, so the image was closed and logged its
    # counters: the small caches must have evicted, and reads of parts of
    # clusters must have hit the cluster cache.
    stats=$(grep -o 'stats for export .*' "$PWD/s-$comp.log" | tail -1)
    [ -n "$stats" ] || fail "$comp: no statistics line in the log"
    echo "$comp: $stats"
    evictions=$(sed -E 's/.*cluster cache ([0-9]+) hits ([0-9]+) misses ([0-9]+) evictions.*/\3/' <<<"$stats")
    hits=$(sed -E 's/.*cluster cache ([0-9]+) hits.*/\1/' <<<"$stats")
    l2_evictions=$(sed -E 's/.*L2 cache ([0-9]+) hits ([0-9]+) misses ([0-9]+) evictions.*/\3/' <<<"$stats")
    [ "$evictions" -gt 0 ] || fail "$comp: the cluster cache never evicted"
    [ "$hits" -gt 0 ] || fail "$comp: the cluster cache never hit"
    [ "$l2_evictions" -gt 0 ] || fail "$comp: the L2 cache never evicted"
done

# 3. Sequential 4 KiB reads, one at a time, as a filesystem or fio at
# queue depth 1 makes them: the readahead decodes the next clusters into
# the cache while the client works.  Every byte must still be right.
start_server "$PWD/s-seq" -r -v -D qcow2zstd.stats=1 file disk-zstd.qcow2 qcow2-threads=2
nbdsh -u "$(nbd_uri "$PWD/s-seq")" -c - <<'EOF'
data = open("disk.raw", "rb").read()
size = h.get_size()
for off in range(0, size, 4096):
    n = min(4096, size - off)
    if h.pread(n, off) != data[off:off + n]:
        raise SystemExit(f"sequential read at {off} differs")
EOF
stop_server
stats=$(grep -o 'stats for export .*' "$PWD/s-seq.log" | tail -1)
hits=$(sed -E 's/.*cluster cache ([0-9]+) hits.*/\1/' <<<"$stats")
[ "$hits" -gt 0 ] || fail "sequential reads never hit the cluster cache"
echo "sequential 4 KiB reads of the whole disk: identical ($stats)"

# 4. The same image served with every pool size and cache setting reads
# the same.
for args in "qcow2-threads=1" "qcow2-threads=2 qcow2-cluster-cache-size=0" \
            "qcow2-threads=8 qcow2-request-size=4K" \
            "qcow2-l2-cache-size=0 qcow2-cluster-cache-size=0"; do
    # shellcheck disable=SC2086
    start_server "$PWD/s-args" file disk-zstd.qcow2 $args
    nbdcopy "$(nbd_uri "$PWD/s-args")" copy.raw
    cmp copy.raw disk.raw || fail "copy with $args differs"
    stop_server
    echo "$args: identical"
done
