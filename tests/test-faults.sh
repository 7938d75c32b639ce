#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Fault injection: the filter over nbdkit's error filter, which fails a
# share of the reads, writes and flushes of the plugin with EIO.  The
# client must see the errors (EIO, not a dead server), and after the
# faulty writes the image must still pass qemu-img check without
# corruption (leaks allowed) and read the same through qemu and through
# the filter.
source "${top_srcdir:-.}/tests/functions.sh"
requires nbdcopy qemu-io
requires_nbd_python
nbdkit --dump-plugin --filter=error null > /dev/null 2>&1 ||
    { echo "$0: skipped: nbdkit's error filter is not installed"; exit 77; }

cd "$TMPDIR_TEST"
$PYTHON -c "
import random
r = random.Random(4)
open('src.raw', 'wb').write(b''.join(r.randbytes(20000) + b'faults ' * 5000 for _ in range(60)))
"

cat > client.py <<'EOF'
import nbd, random, sys
uri, seed, trigger = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rng = random.Random(seed)
h = nbd.NBD()
h.connect_uri(uri)
# Faults start once the image is open (an injected error while opening
# it would only refuse the connection).
open(trigger, "w").close()
size = h.get_size()
errors = {"EIO": 0}
ok = 0
for i in range(1500):
    off = rng.randrange(size)
    n = min(size - off, rng.randrange(1, 150000))
    k = rng.randrange(10)
    try:
        if k < 4:
            h.pread(n, off)
        elif k < 8:
            h.pwrite(rng.randbytes(n), off)
        elif k == 8:
            h.zero(n, off)
        else:
            h.flush()
        ok += 1
    except nbd.Error as e:
        errors[e.errno] = errors.get(e.errno, 0) + 1
        if e.errno != "EIO":
            sys.exit(f"unexpected error {e}")
import os
os.unlink(trigger)
print(f"ok={ok} eio={errors['EIO']}")
if errors["EIO"] == 0:
    sys.exit("no error was injected")
EOF

for comp in zlib zstd; do
    for cs in 4096 65536; do
        img=f-$comp-$cs.qcow2
        qemu-img convert -c -O qcow2 -o cluster_size=$cs,compression_type=$comp src.raw "$img"
        truncate -s +40M "$img"
        start_server "$PWD/sock" --filter=error file "$img" \
            error-pread-rate=2% error-pwrite-rate=2% \
            error=EIO error-file="$PWD/inject" qcow2-threads=2
        rm -f inject
        result=$($PYTHON client.py "$(nbd_uri "$PWD/sock")" $cs "$PWD/inject") || fail "$comp $cs: $result"
        kill -0 "$SERVER_PID" || fail "$comp $cs: the server died"
        stop_server
        rc=0
        qemu-img check "$img" > check.out 2>&1 || rc=$?
        if [ "$rc" != 0 ] && [ "$rc" != 3 ]; then
            cat check.out; fail "$comp $cs: qemu-img check exit $rc after injected faults"
        fi
        # Without faults, the filter and qemu read the same disk.
        start_server "$PWD/sock" -r file "$img"
        nbdcopy "$(nbd_uri "$PWD/sock")" filter.raw
        stop_server
        qemu-img convert -O raw "$img" qemu.raw
        cmp filter.raw qemu.raw || fail "$comp $cs: the filter and qemu disagree after faults"
        leaks=$(grep -o '[0-9]* leaked clusters' check.out || echo "no leaks")
        echo "$comp cluster $cs: $result; image valid ($leaks), filter and qemu agree"
    done
done
