#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# References to compressed clusters: images with narrow refcounts
# (refcount_bits 1 and 2), where a host cluster runs out of references
# before it runs out of bytes, and compressed copies shared by clusters
# with the same data, including copies freed or packed over since.
# Every image must pass qemu-img check and compare identical to its
# source.
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

# copy_in IMG SRC WHAT [FILTER ARGS...]: serve IMG with the filter and
# copy SRC into it with nbdcopy.
copy_flags=(--connections=1 --requests=1 --request-size=65536)
copy_in ()
{
    local img=$1 src=$2 what=$3
    shift 3
    start_server "$PWD/sock" file "$img" "$@"
    # By default one cluster per request, one request at a time, so that
    # the clusters are placed in the source's order on every run.
    nbdcopy "${copy_flags[@]}" \
        "$src" "$(nbd_uri "$PWD/sock")" || { cat "$PWD/sock.log"; fail "$what: nbdcopy"; }
    stop_server
}

# expect_sharing IMG ENTRIES RANGES WHAT: the compressed clusters of IMG
# have ENTRIES L2 entries, describing RANGES distinct compressed ranges.
expect_sharing ()
{
    local entries ranges
    read -r _ _ _ entries ranges < <($PYTHON "$top_srcdir/tests/packing.py" "$1")
    [ "$entries" = "$2" ] && [ "$ranges" = "$3" ] ||
        fail "$4: $entries compressed entries in $ranges ranges, expected $2 in $3"
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
    copy_in narrow.qcow2 distinct.raw "refcount_bits=$bits" qcow2-compress=true
    truncate -s 3M distinct3.raw; dd if=distinct.raw of=distinct3.raw conv=notrunc status=none
    check_image narrow.qcow2 distinct3.raw "refcount_bits=$bits"
    read -r touched _ _ < <($PYTHON "$top_srcdir/tests/packing.py" narrow.qcow2)
    max=$(( (1 << bits) - 1 ))
    [ "$touched" -ge $(( 48 / max )) ] || fail "refcount_bits=$bits: 48 compressed clusters in only $touched host clusters"
    echo "refcount_bits=$bits: 48 compressed clusters in $touched host clusters, check clean, identical"
done

# Identical clusters with refcount_bits=2: a copy takes at most three
# references (two shares), then a new copy is made.  same9 WHAT: the one
# cluster copied in nine times with copy_flags, into a new image; it
# must hold three copies.
$PYTHON -c 'import sys; d = open("distinct.raw", "rb").read(65536); sys.stdout.buffer.write(d * 9)' > same9.raw
same9 ()
{
    rm -f narrow.qcow2
    qemu-img create -q -f qcow2 -o refcount_bits=2,cluster_size=64k narrow.qcow2 576K
    truncate -s +2M narrow.qcow2
    copy_in narrow.qcow2 same9.raw "$1" qcow2-compress=true
    check_image narrow.qcow2 same9.raw "$1"
    expect_sharing narrow.qcow2 9 3 "$1"
}
same9 "refcount_bits=2, same data"
echo "refcount_bits=2, one cluster written 9 times: 3 copies of 3 references each, check clean, identical"

# The same, with the nine requests in flight at once: writes that find
# the shared copy full at the same moment share the new copy the first of
# them makes, as serial writes do, instead of each making its own.  (When
# they did not, four runs in five made 4 to 6 copies here.)  The last run
# writes the nine in one request, compressed as one batch.
for run in 1 2 3 4 5 6 7; do
    copy_flags=(--connections=4 --requests=64 --request-size=65536)
    [ $run = 7 ] && copy_flags=(--connections=1 --requests=1 --request-size=1048576)
    same9 "refcount_bits=2, same data in flight, run $run"
done
copy_flags=(--connections=1 --requests=1 --request-size=65536)
echo "refcount_bits=2, one cluster written 9 times by 9 requests in flight (6 runs) and in one request: 3 copies of 3 references each, check clean, identical"

# Identical clusters share one compressed copy: 16 distinct clusters,
# each written four times in a shuffled order, take 16 compressed ranges
# for 64 L2 entries, and each range is counted once per entry.
$PYTHON - <<'PY'
import random
rng = random.Random(12)
data = open("distinct.raw", "rb").read()
order = [i for i in range(16) for _ in range(4)]
rng.shuffle(order)
open("dups.raw", "wb").write(b"".join(data[i << 16:(i + 1) << 16] for i in order))
PY
rm -f new.qcow2; truncate -s 12M new.qcow2
copy_in new.qcow2 dups.raw "identical clusters" qcow2-create=4M
check_image new.qcow2 dups.raw "identical clusters"
expect_sharing new.qcow2 64 16 "identical clusters"
echo "16 distinct clusters written 4 times each: 64 entries share 16 compressed ranges, check clean, identical"

# Rewriting: a copy shared, one of its references overwritten, shared
# again.  Then, in a new image where the packing is known, data whose
# copy was freed (refcount 0), and data whose copy was freed and then
# packed over by other data, written again: the table of copies is only
# a hint, and each use is checked against the data.
cat > rewrite.py <<'PY'
import random
import sys

import nbd

CS = 65536
uri, image = sys.argv[1:3]
rng = random.Random(13)
h = nbd.NBD()
h.connect_uri(uri)
mirror = open(image, "r+b")
distinct = open("distinct.raw", "rb").read()


def write(cluster, data):
    h.pwrite(data, cluster * CS)
    mirror.seek(cluster * CS)
    mirror.write(data)


def pattern(i):
    return distinct[i * CS:(i + 1) * CS]


if image == "mirror.raw":
    write(60, pattern(30))
    write(61, pattern(30))
    write(60, rng.randbytes(CS))
    h.flush()
    write(62, pattern(30))
else:
    # Pattern 20 alone in the first packing cluster: overwritten and
    # flushed, that cluster is free.
    write(0, pattern(20))
    h.flush()
    write(0, rng.randbytes(CS))
    h.flush()
    write(1, pattern(20))       # refcount 0: a new copy
    h.flush()
    write(1, rng.randbytes(CS))
    h.flush()
    write(2, pattern(21))       # packed where pattern 20 was
    h.flush()
    write(3, pattern(20))       # other data there: a new copy
    write(4, pattern(20))       # shares that one
h.flush()
h.shutdown()
PY
cp dups.raw mirror.raw
start_server "$PWD/sock" -v -D qcow2zstd.map=1 file new.qcow2 qcow2-compress=true
$PYTHON rewrite.py "$(nbd_uri "$PWD/sock")" mirror.raw
stop_server
check_image new.qcow2 mirror.raw "rewriting shared copies"
shares=$(grep -c "shares compressed entry" "$PWD/sock.log" || true)
[ "$shares" = 2 ] || fail "rewriting shared copies: $shares clusters shared a copy, expected 2"
echo "rewriting shared copies: $shares shared, check clean, identical"

truncate -s 1M fresh.raw
rm -f fresh.qcow2; truncate -s 4M fresh.qcow2
start_server "$PWD/sock" -v -D qcow2zstd.map=1 file fresh.qcow2 qcow2-create=1M
$PYTHON rewrite.py "$(nbd_uri "$PWD/sock")" fresh.raw
stop_server
check_image fresh.qcow2 fresh.raw "stale copies"
shares=$(grep -c "shares compressed entry" "$PWD/sock.log" || true)
cannot=$(grep -c "cannot share compressed entry" "$PWD/sock.log" || true)
[ "$cannot" = 2 ] && [ "$shares" = 1 ] ||
    fail "stale copies: $cannot refused and $shares shared, expected 2 and 1"
echo "copies freed, and freed and packed over: both refused, check clean, identical"
