#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Fault injection: the filter over nbdkit's error filter, which fails a
# share of the plugin's reads and writes with EIO, and over
# tests/flush-fault-filter.c, which fails a share of its flushes (the
# error filter of nbdkit 1.32 cannot).  The client keeps a shadow of the
# disk: what qemu read from the image before, with every write and zero
# the filter acknowledged applied (a range whose write failed may hold
# anything afterwards).  Every read that succeeds must match the shadow;
# errors must reach the client as EIO, flushes included; once the faults
# stop, a flush succeeds and the whole disk matches the shadow: nothing
# acknowledged was lost, even when a later write-back or flush failed.
# After the server stops, the image must pass qemu-img check without
# corruption (leaks allowed), and qemu and the filter must both read the
# shadow.  And an L2 table that cannot be read fails the reads under it
# with EIO, however many are tried.
source "${top_srcdir:-.}/tests/functions.sh"
requires nbdcopy qemu-io
requires_nbd_python
nbdkit --dump-plugin --filter=error null > /dev/null 2>&1 ||
    skip "nbdkit's error filter is not installed"
[ -f "${FLUSHFAULT_FILTER:-}" ] || fail "the flush fault filter is not built: ${FLUSHFAULT_FILTER:-}"

cd "$TMPDIR_TEST"
$PYTHON -c "
import random
r = random.Random(4)
open('src.raw', 'wb').write(b''.join(r.randbytes(20000) + b'faults ' * 5000 for _ in range(60)))
"

cat > client.py <<'EOF2'
import nbd, random, sys
uri, seed, trigger, before, shadow_out, known_out = sys.argv[1:7]
OPS = 1500
rng = random.Random(int(seed))
shadow = bytearray(open(before, "rb").read())
known = bytearray(b"\1" * len(shadow))     # 0: a failed write left anything
h = nbd.NBD()
h.connect_uri(uri)
size = h.get_size()
assert size == len(shadow), (size, len(shadow))


def check_read(got, off):
    want = shadow[off:off + len(got)]
    if got == want:
        return
    for i in range(len(got)):
        if known[off + i] and got[i] != want[i]:
            sys.exit(f"a read at {off}+{len(got)} returned wrong data at {off + i}")


# Faults start once the image is open (an injected error while opening
# it would only refuse the connection).
open(trigger, "w").close()
counts = {}
for i in range(OPS):
    off = rng.randrange(size)
    n = min(size - off, rng.randrange(1, 150000))
    k = rng.randrange(10)
    kind = "read" if k < 4 else "write" if k < 8 else "zero" if k == 8 else "flush"
    data = rng.randbytes(n) if kind == "write" else None
    try:
        if kind == "read":
            check_read(h.pread(n, off), off)
        elif kind == "write":
            h.pwrite(data, off)
            shadow[off:off + n] = data
            known[off:off + n] = b"\1" * n
        elif kind == "zero":
            h.zero(n, off)
            shadow[off:off + n] = bytes(n)
            known[off:off + n] = b"\1" * n
        else:
            h.flush()
        counts[kind] = counts.get(kind, 0) + 1
    except nbd.Error as e:
        if e.errno != "EIO" or h.aio_is_dead():
            sys.exit(f"{kind} at {off}+{n}: unexpected error {e}")
        counts[kind + "-EIO"] = counts.get(kind + "-EIO", 0) + 1
        if kind in ("write", "zero"):
            known[off:off + n] = bytes(n)
import os
os.unlink(trigger)
done = sum(counts.values())
print(" ".join(f"{k}={v}" for k, v in sorted(counts.items())))
if done != OPS:
    sys.exit(f"only {done} of {OPS} operations ran")
for k in ("read", "write", "flush", "read-EIO", "write-EIO", "flush-EIO"):
    if counts.get(k, 0) == 0:
        sys.exit(f"no {k} in {OPS} operations: the faults or the workload did nothing")
# Without faults, a flush succeeds and the disk reads as the shadow.
h.flush()
for off in range(0, size, 1 << 20):
    check_read(h.pread(min(1 << 20, size - off), off), off)
h.shutdown()
open(shadow_out, "wb").write(shadow)
open(known_out, "wb").write(known)
EOF2

# matches_shadow RAW: RAW holds the shadow wherever it is known.
matches_shadow ()
{
    $PYTHON - "$1" shadow.raw known.bin <<'EOF2'
import sys
got, shadow, known = (open(p, "rb").read() for p in sys.argv[1:4])
if len(got) != len(shadow):
    sys.exit(f"{sys.argv[1]}: {len(got)} bytes, the disk has {len(shadow)}")
if got != shadow:
    for i in range(len(got)):
        if known[i] and got[i] != shadow[i]:
            sys.exit(f"{sys.argv[1]}: byte {i} is not what was acknowledged")
print(f"{known.count(0)} bytes unknown (failed writes), the rest as acknowledged")
EOF2
}

for comp in zlib zstd; do
    for cs in 4096 65536; do
        img=f-$comp-$cs.qcow2
        qemu-img convert -c -O qcow2 -o cluster_size=$cs,compression_type=$comp src.raw "$img"
        qemu-img convert -O raw "$img" before.raw
        truncate -s +40M "$img"
        # The stack: qcow2zstd, error (reads, writes), flushfault, file.
        start_server "$PWD/sock" --filter=error --filter="$FLUSHFAULT_FILTER" file "$img" \
            error-pread-rate=2% error-pwrite-rate=2% error=EIO error-file="$PWD/inject" \
            flushfault-rate=20% flushfault-file="$PWD/inject" qcow2-threads=2
        rm -f inject
        result=$($PYTHON client.py "$(nbd_uri "$PWD/sock")" $cs "$PWD/inject" before.raw \
                 shadow.raw known.bin 2>&1) || { echo "$result"; fail "$comp $cs: client"; }
        injected=$(grep -c "flushfault: injecting EIO into flush" "$PWD/sock.log" || true)
        [ "$injected" -gt 0 ] || fail "$comp $cs: no flush failure was injected"
        stop_server
        rc=0
        qemu-img check "$img" > check.out 2>&1 || rc=$?
        if [ "$rc" != 0 ] && [ "$rc" != 3 ]; then
            cat check.out; fail "$comp $cs: qemu-img check exit $rc after injected faults"
        fi
        qemu-img convert -O raw "$img" qemu.raw
        shadow=$(matches_shadow qemu.raw 2>&1) || fail "$comp $cs: qemu: $shadow"
        # Without faults, the filter and qemu read the same disk.
        start_server "$PWD/sock" -r file "$img"
        nbdcopy "$(nbd_uri "$PWD/sock")" filter.raw
        stop_server
        cmp filter.raw qemu.raw || fail "$comp $cs: the filter and qemu disagree after faults"
        leaks=$(grep -o '[0-9]* leaked clusters' check.out || echo "no leaks")
        echo "$comp cluster $cs: $result ($injected flush failures injected); image valid ($leaks);"
        echo "    qemu and the filter read what was acknowledged: $shadow"
    done
done

# An L2 table that cannot be read.  With 512-byte clusters an L2 table
# covers 32 KiB: the image's tables are read one at a time, as reads
# reach them.  Once the image is open, every read underneath fails: a
# read of a range whose table was not read yet must fail with EIO (not
# read as unallocated, zeros), and so must its map; with the faults gone
# the same reads return the data (no failed table was cached).
if section l2-read-error; then
    $PYTHON -c "open('l2.raw', 'wb').write(b'L2 table read error ' * 100000)"
    qemu-img convert -O qcow2 -o cluster_size=512 l2.raw l2.qcow2
    start_server "$PWD/sock" -r --filter=error file l2.qcow2 error-pread-rate=100% \
        error=EIO error-file="$PWD/inject-l2"
    rm -f inject-l2
    $PYTHON - "$(nbd_uri "$PWD/sock")" "$PWD/inject-l2" l2.raw <<'EOF2' ||
import nbd, sys
uri, trigger, raw = sys.argv[1:4]
want = open(raw, "rb").read()
h = nbd.NBD()
h.connect_uri(uri)
assert h.pread(512, 0) == want[:512]
open(trigger, "w").close()
failed = 0
for off in (1 << 20, 3 << 19, (1 << 20) + 65536):
    try:
        got = h.pread(4096, off)
    except nbd.Error as e:
        if e.errno != "EIO":
            sys.exit(f"a read at {off} failed with {e}, not EIO")
        failed += 1
        continue
    sys.exit(f"a read at {off} whose L2 table could not be read returned "
             f"{'zeros' if got == bytes(4096) else 'data'}, not an error")
import os
os.unlink(trigger)
for off in (1 << 20, 3 << 19, (1 << 20) + 65536):
    if h.pread(4096, off) != want[off:off + 4096]:
        sys.exit(f"after the faults, a read at {off} is wrong")
h.shutdown()
print(f"{failed} reads of ranges whose L2 table could not be read failed with EIO")
EOF2
        fail "an L2 table that cannot be read"
    stop_server
    grep -qi "L2\|read" "$PWD/sock.log" || { cat "$PWD/sock.log"; fail "l2-read-error: the server said nothing"; }
    echo "an L2 table that cannot be read: reads under it fail with EIO, and succeed once the storage recovers"
fi
