#!/usr/bin/env bash
# References to compressed clusters: images with narrow refcounts
# (refcount_bits 1 and 2), where a host cluster runs out of references
# before it runs out of bytes.  Every image must pass qemu-img check and
# compare identical to its source.
source "${top_srcdir:-.}/tests/functions.sh"
requires nbdcopy qemu-img
requires_nbd_python

cd "$TMPDIR_TEST"

check_image ()
{
    local img=$1 src=$2 what=$3
    qemu-img check "$img" > check.out 2>&1 || { cat check.out; fail "$what: qemu-img check failed"; }
    grep -q "No errors were found" check.out || { cat check.out; fail "$what: check found problems"; }
    qemu-img compare -q -f qcow2 -F raw "$img" "$src" || fail "$what: differs from the source"
}

# 48 distinct compressible clusters of 64 KiB, each a few KiB compressed:
# a dozen or more would fit in one host cluster.
$PYTHON - <<'PY'
import random
rng = random.Random(11)
words = [b"shared", b"cluster", b"refcount", b"qcow2", b"\n", b"of", b"the"]
out = bytearray()
for i in range(48):
    out += b" ".join(rng.choice(words) for _ in range(20000))[:65536]
open("distinct.raw", "wb").write(out)
PY

# With refcount_bits=1 every compressed cluster needs a host cluster of
# its own; with 2, at most three share one.
for bits in 1 2; do
    rm -f narrow.qcow2
    qemu-img create -q -f qcow2 -o refcount_bits=$bits,cluster_size=64k narrow.qcow2 3M
    truncate -s +8M narrow.qcow2
    start_server "$PWD/sock" file narrow.qcow2 qcow2-compress=true
    nbdcopy distinct.raw "$(nbd_uri "$PWD/sock")" || { cat "$PWD/sock.log"; fail "refcount_bits=$bits: nbdcopy"; }
    stop_server
    truncate -s 3M distinct3.raw; dd if=distinct.raw of=distinct3.raw conv=notrunc status=none
    check_image narrow.qcow2 distinct3.raw "refcount_bits=$bits"
    read -r touched _ _ < <($PYTHON "$top_srcdir/tests/packing.py" narrow.qcow2)
    max=$(( (1 << bits) - 1 ))
    [ "$touched" -ge $(( 48 / max )) ] || fail "refcount_bits=$bits: 48 compressed clusters in only $touched host clusters"
    echo "refcount_bits=$bits: 48 compressed clusters in $touched host clusters, check clean, identical"
done
