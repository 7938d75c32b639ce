#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Crash safety: kill -9 the server at random points of a write workload.
# Every image afterwards must pass qemu-img check without corruption
# (leaked clusters are allowed) and hold every write that a completed
# flush covered; bytes never written keep their old content.
source "${top_srcdir:-.}/tests/functions.sh"
requires qemu-io
requires_nbd_python

cd "$TMPDIR_TEST"

$PYTHON - <<'EOF'
import random
rng = random.Random(11)
size = 32 * 1024 * 1024
out = bytearray()
while len(out) < size:
    n = rng.randrange(1000, 200000)
    out += rng.randbytes(n) if rng.randrange(2) else (b"crash test text " * (n // 16 + 1))[:n]
open("base.raw", "wb").write(out[:size])
EOF

# The client: writes of random sizes at increasing offsets (each byte is
# written at most once), zeroes now and then, a flush every few
# operations.  After each completed flush it logs the operations it
# covered.  It runs until the server is killed under it.
cat > client.py <<'EOF'
import nbd, random, sys
uri, seed, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rng = random.Random(seed)
h = nbd.NBD()
h.connect_uri(uri)
size = h.get_size()
pos = rng.randrange(0, 65536)
pending = []
with open(log, "w") as f:
    while True:
        n = rng.randrange(1, 60000)
        if pos + n > size:
            # Out of fresh bytes: stay connected until the kill.
            h.flush()
            print("DONE", flush=True)
            import time
            while True:
                time.sleep(0.05)
        op_seed = rng.randrange(1 << 30)
        if rng.randrange(6) == 0:
            h.zero(n, pos)
            pending.append(("Z", pos, n, 0))
        else:
            h.pwrite(random.Random(op_seed).randbytes(n), pos)
            pending.append(("W", pos, n, op_seed))
        pos += n + rng.randrange(0, 5000)
        if rng.randrange(4) == 0:
            h.flush()
            for p in pending:
                print(*p, file=f)
            print("F", file=f, flush=True)
            pending = []
EOF

cat > verify.py <<'EOF'
import random, sys
image, base, log = sys.argv[1:4]
data = open(image, "rb").read()
old = open(base, "rb").read()
ops = []
for line in open(log):
    p = line.split()
    if p[0] in "WZ":
        ops.append((p[0], int(p[1]), int(p[2]), int(p[3])))
# Only lines before the last F are covered by a flush (F is printed after
# them, so every logged op is).
covered_end = 0
for kind, off, n, s in ops:
    want = random.Random(s).randbytes(n) if kind == "W" else bytes(n)
    if data[off:off + n] != want:
        sys.exit(f"flushed {kind} at {off}+{n} is not in the image")
    covered_end = max(covered_end, off + n)
# Bytes before the last flushed op that no op wrote keep the base content.
written = bytearray(covered_end)
for kind, off, n, s in ops:
    written[off:off + n] = b"\1" * n
for i in range(0, covered_end, 4096):
    j = min(i + 4096, covered_end)
    if b"\0" in written[i:j]:
        for k in range(i, j):
            if not written[k] and data[k] != old[k]:
                sys.exit(f"byte {k} changed but was never written")
print(f"{len(ops)} flushed operations present, {covered_end} bytes checked")
EOF

mid=0
for round in 1 2 3 4 5 6 7 8; do
    for comp in zlib zstd; do
        img=crash-$comp.qcow2
        cs=$(( round % 2 ? 4096 : 65536 ))
        qemu-img convert -c -O qcow2 -o cluster_size=$cs,compression_type=$comp base.raw "$img"
        truncate -s +40M "$img"
        rm -f log.txt client.out
        start_server "$PWD/sock" file "$img"
        $PYTHON client.py "$(nbd_uri "$PWD/sock")" "$round" log.txt > client.out 2>&1 &
        client=$!
        # The kill point: after the K-th completed flush (K from 1 to 40),
        # then a further 0 to 49 ms, so it lands at various stages of the
        # writes, allocations and metadata writeback that follow.
        k=$(( 1 + (round * 7919 + ${#comp} * 104729) % 40 ))
        for _ in $(seq 600); do
            flushes=$(grep -c '^F' log.txt 2>/dev/null || true)
            [ "${flushes:-0}" -ge "$k" ] && break
            grep -q DONE client.out 2>/dev/null && break
            sleep 0.05
        done
        sleep "0.0$(( (round * 31 + ${#comp}) % 50 / 10 ))$(( round % 10 ))"
        kill -9 "$SERVER_PID"
        wait "$client" || true
        SERVER_PID=
        rc=0
        qemu-img check "$img" > check.out 2>&1 || rc=$?
        # 0: clean; 3: leaks only.  2 means corruption, 1 a check failure.
        if [ "$rc" != 0 ] && [ "$rc" != 3 ]; then
            cat check.out
            fail "round $round $comp: qemu-img check exit $rc after kill -9"
        fi
        grep -q "ERROR" check.out && { cat check.out; fail "round $round $comp: errors after kill -9"; }
        qemu-img convert -O raw "$img" after.raw
        result=$($PYTHON verify.py after.raw base.raw log.txt) || fail "round $round $comp: $result"
        leaks=$(grep -o '[0-9]* leaked clusters' check.out || echo "no leaks")
        if grep -q DONE client.out; then
            when="after the workload"
        else
            when="mid-workload"
            mid=$((mid + 1))
        fi
        echo "round $round $comp (cluster $cs): killed $when; check ok ($leaks); $result"
    done
done
# The kills must mostly land inside the workload, or this tests nothing.
[ "$mid" -ge 10 ] || fail "only $mid of 16 kills landed mid-workload"
