#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The plugin form, nbdkit qcow2zstd FILE: the same engine and parameters
# as the filter, but it opens the file itself, so it grows the file when
# writes need room, creates the file for qcow2-create, and resolves
# relative backing file names next to the image.
source "${top_srcdir:-.}/tests/functions.sh"
requires nbdcopy qemu-io
requires_nbd_python
[ -f "$PLUGIN" ] || fail "the plugin is not built: $PLUGIN"

cd "$TMPDIR_TEST"
$PYTHON -c "
import random
r = random.Random(21)
open('src.raw', 'wb').write(b''.join(r.randbytes(20000) + b'plugin ' * 4000 + bytes(30000) for _ in range(60)))
"

# 1. Reading zlib and zstd images, as qemu reads them.
for comp in zlib zstd; do
    qemu-img convert -c -O qcow2 -o compression_type=$comp src.raw r-$comp.qcow2
    start_nbdkit "$PWD/sock" -r "$PLUGIN" r-$comp.qcow2
    nbdcopy "$(nbd_uri "$PWD/sock")" out.raw
    stop_server
    qemu-img convert -O raw r-$comp.qcow2 qemu.raw
    cmp out.raw qemu.raw || fail "$comp: the plugin reads other data than qemu"
    echo "$comp: reads as qemu reads it"
done

# 2. Writes into an image with no room after it: the file grows.
cp r-zstd.qcow2 grow.qcow2
before=$(stat -c %s grow.qcow2)
qemu-img convert -O raw r-zstd.qcow2 mirror.raw   # the disk, whole sectors
start_nbdkit "$PWD/sock" "$PLUGIN" grow.qcow2
$PYTHON "$top_srcdir/tests/write-workload.py" "$(nbd_uri "$PWD/sock")" mirror.raw 31 3 500 65536 \
    > workload.out || { cat workload.out "$PWD/sock.log"; fail "workload"; }
stop_server
after=$(stat -c %s grow.qcow2)
[ "$after" -gt "$before" ] || fail "the file did not grow ($before -> $after)"
qemu-img check grow.qcow2 > check.out 2>&1 || { cat check.out; fail "check after growing"; }
grep -q "No errors were found" check.out || { cat check.out; fail "check found problems"; }
qemu-img compare -q -f qcow2 -F raw grow.qcow2 mirror.raw || fail "grown image differs"
echo "writes with no room: the file grew from $before to $after bytes; check clean, identical"

# 3. qcow2-create makes the file.
start_nbdkit "$PWD/sock" "$PLUGIN" new.qcow2 qcow2-create="$(stat -c %s src.raw)" \
    qcow2-compression-type=zlib qcow2-cluster-size=4K
nbdcopy src.raw "$(nbd_uri "$PWD/sock")"
stop_server
qemu-img check new.qcow2 > check.out 2>&1 || { cat check.out; fail "created image: check"; }
qemu-img compare -q -f qcow2 -F raw new.qcow2 src.raw || fail "created image differs"
qemu-img info new.qcow2 | grep -q "compression type: zlib" || fail "created image is not zlib"
echo "qcow2-create into a file that did not exist: check clean, identical, zlib"

# 4. A relative backing file name, resolved next to the image.
mkdir -p sub
qemu-img convert -O qcow2 src.raw sub/base.qcow2
(cd sub && qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 top.qcow2 &&
 qemu-io -f qcow2 -c "write -P 0x5e 10000 20000" top.qcow2 > /dev/null)
start_nbdkit "$PWD/sock" -r "$PLUGIN" sub/top.qcow2
nbdcopy "$(nbd_uri "$PWD/sock")" out.raw
stop_server
qemu-img convert -O raw sub/top.qcow2 qemu.raw
cmp out.raw qemu.raw || fail "relative backing file: wrong data"
echo "relative backing file: reads as qemu reads it"

# 5. The same parameters, checked the same way.
if run_nbdkit -U "$PWD/bad.sock" "$PLUGIN" grow.qcow2 qcow2-threads=0 --run true 2> err.out; then
    fail "qcow2-threads=0 accepted"
fi
grep -q "qcow2-threads" err.out || { cat err.out; fail "no error naming qcow2-threads"; }
if run_nbdkit -U "$PWD/bad.sock" "$PLUGIN" --run true 2> err.out; then
    fail "no file accepted"
fi
grep -q "image file was not given" err.out || { cat err.out; fail "no error for a missing file"; }
run_nbdkit "$PLUGIN" --help | grep -q "qcow2-compression-level" || fail "--help lacks the parameters"
echo "parameters: bad values refused with the parameter named"

# 6. A flush makes what was written part of the file, while the client
# is still connected (a disconnect writes everything back anyway, so it
# must not come first): qemu reads the file beside the running server.
cp r-zstd.qcow2 flush.qcow2
start_nbdkit "$PWD/sock" "$PLUGIN" flush.qcow2
$PYTHON - "$(nbd_uri "$PWD/sock")" "$PWD/flush.qcow2" <<'PY' || fail "a flushed write is not in the file"
import subprocess, sys
import nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pwrite(b"\x5a" * 65536, 1 << 20)
h.pwrite(b"\x5b" * 4096, 3 << 20)
h.flush()
r = subprocess.run(["qemu-io", "-r", "-U", "-f", "qcow2",
                    "-c", "read -P 0x5a 1M 64k", "-c", "read -P 0x5b 3M 4k",
                    sys.argv[2]], capture_output=True, text=True)
h.shutdown()
if r.returncode != 0 or "Pattern verification failed" in r.stdout + r.stderr:
    print(r.stdout, r.stderr)
    sys.exit(1)
PY
stop_server
echo "flush: the written data is in the file before the client disconnects"
