#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Creating compressed images (qcow2-create) and compressing writes
# (qcow2-compress): every cluster size and both compression types, all
# zero and incompressible clusters, a partial last cluster, concurrent
# compressed writes; bad sizes and a non-empty device refused.  Every
# image made must pass qemu-img check, compare identical to its source,
# and show the requested compression type in qemu-img info.
source "${top_srcdir:-.}/tests/functions.sh"
requires nbdcopy qemu-io
requires_nbd_python

cd "$TMPDIR_TEST"

# Source: compressible text, incompressible random data, all-zero
# clusters (written, not holes) and holes; 5 MiB + 1024 bytes, so the
# last cluster of every cluster size but 512 is partial.
$PYTHON - <<'EOF'
import random
rng = random.Random(5)
size = 5 * 1024 * 1024 + 1024
out = bytearray()
words = [b"qcow2", b"zstd", b"deflate", b"cluster", b"nbdkit", b"\n", b"the", b"image"]
while len(out) < size:
    k = rng.randrange(4)
    n = rng.randrange(1000, 400000)
    if k == 0:
        out += rng.randbytes(n)
    elif k == 1:
        out += b" ".join(rng.choice(words) for _ in range(n // 5))
    else:
        out += bytes(n)
out = out[:size]
out[0:(2 << 20) + 50] = rng.randbytes((2 << 20) + 50)  # a whole 2M cluster of noise
out[2 << 20:(4 << 20) + 100] = bytes((2 << 20) + 100)   # a whole 2M cluster of zeros
out[-600:] = b"tail " * 120       # data in the partial last cluster
open("src.raw", "wb").write(out)
EOF

check_image ()
{
    local img=$1 type=$2 what=$3
    qemu-img check "$img" > check.out 2>&1 || { cat check.out; fail "$what: qemu-img check failed"; }
    grep -q "No errors were found" check.out || { cat check.out; fail "$what: check found problems"; }
    qemu-img compare -q -f qcow2 -F raw "$img" src.raw || fail "$what: differs from the source"
    qemu-img info "$img" | grep -q "compression type: $type" ||
        fail "$what: qemu-img info does not show compression type $type"
    grep -Eq '[1-9][0-9.]*% compressed clusters' check.out ||
        { cat check.out; fail "$what: no compressed clusters"; }
}

size=$(stat -c %s src.raw)
for cs in 512 4K 64K 2M; do
    for type in zstd zlib; do
        rm -f new.qcow2
        truncate -s 24M new.qcow2
        start_server "$PWD/sock" file new.qcow2 qcow2-create="$size" \
            qcow2-cluster-size=$cs qcow2-compression-type=$type
        nbdcopy src.raw "$(nbd_uri "$PWD/sock")"
        stop_server
        check_image new.qcow2 $type "create $cs $type"
        # All-zero clusters are left unallocated, incompressible ones are
        # stored as they are: qemu-img map shows both kinds of range.
        qemu-img map --output=json new.qcow2 > map.json
        $PYTHON - map.json <<'EOF' || fail "create $cs $type: map"
import json, sys
m = json.load(open(sys.argv[1]))
assert any(not e["data"] for e in m), "no unallocated range"
assert any(e["data"] and "offset" in e for e in m), "no uncompressed data cluster"
EOF
        echo "create cluster $cs $type: check clean, identical, compressed, zero clusters unallocated"
        # zlib at the default level deflates each cluster to the very
        # stream qemu-img convert -c writes (same zlib, same level and
        # window), so an image made here is never larger than qemu's for
        # want of compression.
        if [ $type = zlib ] && { [ $cs = 64K ] || [ $cs = 2M ]; }; then
            rm -f qemu.qcow2
            qemu-img convert -c -O qcow2 -o cluster_size=$cs,compression_type=zlib src.raw qemu.qcow2
            n=$($PYTHON "$top_srcdir/tests/zlib-streams.py" new.qcow2 qemu.qcow2) ||
                fail "zlib $cs: the deflate streams are not qemu-img's"
            echo "zlib $cs, default level: all $n compressed clusters deflate to qemu-img convert -c's bytes"
        fi
    done
done

# A level and the other knobs.
rm -f new.qcow2; truncate -s 24M new.qcow2
start_server "$PWD/sock" file new.qcow2 qcow2-create="$size" qcow2-compression-level=19
nbdcopy src.raw "$(nbd_uri "$PWD/sock")"
stop_server
check_image new.qcow2 zstd "zstd level 19"
echo "zstd level 19: check clean, identical"

# Compression on an existing image (zlib, 4k clusters), with concurrent
# writers: whole-cluster writes from three connections get compressed.
qemu-img convert -c -O qcow2 -o cluster_size=4096,compression_type=zlib src.raw existing.qcow2
truncate -s +30M existing.qcow2
cp src.raw mirror.raw
start_server "$PWD/sock" file existing.qcow2 qcow2-compress=true
$PYTHON "$top_srcdir/tests/write-workload.py" "$(nbd_uri "$PWD/sock")" \
    mirror.raw 77 3 600 4096 > workload.out || { cat workload.out; fail "concurrent compressed writes"; }
stop_server
cp mirror.raw src.raw
check_image existing.qcow2 zlib "concurrent compressed writes"
echo "qcow2-compress=true, 3 connections x 600 operations: check clean, identical"

# Several connections copying into a created image at once.
head -c 3M /dev/urandom > a.raw
$PYTHON -c "import sys; sys.stdout.buffer.write(b'compress me ' * 300000)" | head -c 3M > b.raw
cat a.raw b.raw a.raw b.raw > src.raw
rm -f new.qcow2; truncate -s 30M new.qcow2
start_server "$PWD/sock" file new.qcow2 qcow2-create=12M qcow2-cluster-size=64K qcow2-threads=2
nbdcopy --connections=4 --requests=8 src.raw "$(nbd_uri "$PWD/sock")"
stop_server
check_image new.qcow2 zstd "nbdcopy with 4 connections"
echo "nbdcopy --connections=4 into a created image: check clean, identical"

# Packing: compressed clusters interleaved with incompressible ones.
# qemu-img convert -c starts a new host cluster after each plain cluster,
# leaving the rest of the one it packed into unused; the filter places a
# batch's compressed clusters before its plain ones, and later compressed
# clusters fill the room the plain ones cut off, so its packed data
# touches no more host clusters than the data fills, plus one per 32
# plain clusters, and no more than qemu's.
$PYTHON - <<'EOF'
import random
rng = random.Random(9)
words = [b"qcow2", b"zstd", b"packing", b"cluster", b"window", b"\n", b"of", b"data"]
out = bytearray()
for i in range(192):
    if i % 3 == 2:
        out += rng.randbytes(65536)
    else:
        # about 30 KiB compressed: most clusters cross a host cluster end
        out += rng.randbytes(24576) + b" ".join(rng.choice(words) for _ in range(12000))[:40960]
open("src.raw", "wb").write(out)
EOF
rm -f new.qcow2; truncate -s 20M new.qcow2
start_server "$PWD/sock" file new.qcow2 qcow2-create=12M qcow2-cluster-size=64K
nbdcopy src.raw "$(nbd_uri "$PWD/sock")"
stop_server
check_image new.qcow2 zstd "packing around plain clusters"
qemu-img convert -c -O qcow2 -o cluster_size=64k,compression_type=zstd src.raw qemu.qcow2
read -r ours union plain _ < <($PYTHON "$top_srcdir/tests/packing.py" new.qcow2)
read -r theirs _ _ < <($PYTHON "$top_srcdir/tests/packing.py" qemu.qcow2)
[ "$plain" = 64 ] || fail "packing: $plain plain clusters, expected 64"
bound=$(( (union + 65535) / 65536 + (plain + 31) / 32 + 1 ))
[ "$ours" -le "$bound" ] ||
    fail "packing: compressed data touches $ours host clusters; $union bytes need at most $bound"
[ "$ours" -le "$theirs" ] || fail "packing: $ours host clusters, qemu-img uses only $theirs"
echo "packing around 64 plain clusters: $ours host clusters (bound $bound; qemu-img: $theirs)"

# Tight packing at every cluster size: the images qcow2-create makes
# (filter and plugin) are no larger than qemu-img convert -c's of the
# same data, in file size and in allocated blocks.  The filter's file is
# as large as it was made; what counts there is where its image ends
# (qemu-img check's "Image end offset", as for qemu's own image) and its
# blocks.  The plugin's file ends where its data ends.  nbdcopy writes
# one request at a time here, as qemu-img convert does: with requests in
# flight the order in which clusters arrive, and so the packing, varies
# from run to run (the image end once came out one 512 KiB cluster past
# qemu's); concurrent writes into a created image are checked above.
$PYTHON - <<'EOF'
import random
rng = random.Random(16)
words = [b"qcow2", b"zstd", b"space", b"cluster", b"nbdkit", b"\n", b"the",
         b"image", b"discard", b"42"]
out = bytearray()
size = 24 << 20
while len(out) < size:
    k = rng.randrange(10)
    n = rng.randrange(4096, 1 << 20)
    if k < 2:
        out += rng.randbytes(n)
    elif k < 8:
        # text with some noise in it: compresses to 10 to 60 %
        t = bytearray(b" ".join(rng.choice(words) for _ in range(n // 5))[:n])
        for _ in range(rng.randrange(0, n // 20)):
            t[rng.randrange(len(t))] = rng.randrange(256)
        out += t
    else:
        out += bytes(n)
open("mix.raw", "wb").write(out[:size])
EOF
image_end ()
{
    qemu-img check "$1" | awk '/Image end offset/ { print $4 }'
}
blocks () { echo $(( $(stat -c %b "$1") * 512 )); }
msize=$(stat -c %s mix.raw)
for cs in 64K 512K 1M 2M; do
    rm -f qemu.qcow2 filter.qcow2 plugin.qcow2
    qemu-img convert -c -O qcow2 -o cluster_size=$cs,compression_type=zstd \
        mix.raw qemu.qcow2
    truncate -s 40M filter.qcow2
    start_server "$PWD/sock" file filter.qcow2 qcow2-create="$msize" \
        qcow2-cluster-size=$cs
    nbdcopy --connections=1 --requests=1 mix.raw "$(nbd_uri "$PWD/sock")"
    stop_server
    start_nbdkit "$PWD/sock" "$PLUGIN" plugin.qcow2 qcow2-create="$msize" \
        qcow2-cluster-size=$cs
    nbdcopy --connections=1 --requests=1 mix.raw "$(nbd_uri "$PWD/sock")"
    stop_server
    for f in filter plugin; do
        qemu-img check -q $f.qcow2 || fail "packing $cs: $f: qemu-img check"
        qemu-img compare -q -f qcow2 -F raw $f.qcow2 mix.raw ||
            fail "packing $cs: $f: differs from the source"
        [ "$(blocks $f.qcow2)" -le "$(blocks qemu.qcow2)" ] ||
            fail "packing $cs: $f: $(blocks $f.qcow2) bytes allocated, qemu-img $(blocks qemu.qcow2)"
    done
    [ "$(stat -c %s plugin.qcow2)" -le "$(stat -c %s qemu.qcow2)" ] ||
        fail "packing $cs: the plugin's file is $(stat -c %s plugin.qcow2) bytes, qemu-img's $(stat -c %s qemu.qcow2)"
    [ "$(image_end filter.qcow2)" -le "$(image_end qemu.qcow2)" ] ||
        fail "packing $cs: the filter's image ends at $(image_end filter.qcow2), qemu-img's at $(image_end qemu.qcow2)"
    echo "packing $cs: file qemu-img $(stat -c %s qemu.qcow2), plugin" \
         "$(stat -c %s plugin.qcow2); image end qemu-img $(image_end qemu.qcow2)," \
         "filter $(image_end filter.qcow2); allocated qemu-img" \
         "$(blocks qemu.qcow2), filter $(blocks filter.qcow2), plugin $(blocks plugin.qcow2)"
done

# Refusals.
expect_startup_error ()
{
    local what=$1 pattern=$2
    shift 2
    if NBDKIT_TIMEOUT=120 run_nbdkit -U "$PWD/bad.sock" --filter="$FILTER" file new.qcow2 "$@" --run true 2> err.out; then
        fail "$what: accepted"
    fi
    grep -q -- "$pattern" err.out || { cat err.out; fail "$what: no error naming $pattern"; }
    echo "$what: refused ($(grep -o -- "$pattern.*" err.out | head -1 | cut -c1-70))"
}
expect_startup_error "negative size" qcow2-create qcow2-create=-1
expect_startup_error "bad size" qcow2-create qcow2-create=lots

# A size that is not a multiple of 512 is rounded up, as qemu-img create
# rounds it: qemu would not see a partial last sector.
rm -f new.qcow2; truncate -s 4M new.qcow2
start_server "$PWD/sock" file new.qcow2 qcow2-create=1000
[ "$(nbdinfo --size "$(nbd_uri "$PWD/sock")")" = 1024 ] || fail "qcow2-create=1000 is not rounded to 1024"
stop_server
[ "$(qemu-img info --output=json new.qcow2 | $PYTHON -c 'import json,sys; print(json.load(sys.stdin)["virtual-size"])')" = 1024 ] ||
    fail "qemu does not see 1024 bytes"
echo "qcow2-create=1000: a 1024-byte disk"
expect_startup_error "size too large for 512-byte clusters" "use a larger qcow2-cluster-size" \
    qcow2-create=1P qcow2-cluster-size=512
expect_startup_error "cluster size not a power of 2" qcow2-cluster-size qcow2-create=1M qcow2-cluster-size=3000
expect_startup_error "cluster size too large" qcow2-cluster-size qcow2-create=1M qcow2-cluster-size=4M
expect_startup_error "unknown compression type" qcow2-compression-type qcow2-create=1M qcow2-compression-type=lz4
expect_startup_error "level out of range" qcow2-compression-level qcow2-create=1M qcow2-compression-level=99
expect_startup_error "cluster size without create" "only apply with qcow2-create" qcow2-cluster-size=4K
expect_startup_error "bad boolean" qcow2-compress qcow2-compress=maybe

# A device whose first cluster holds data is not formatted, and is left
# as it was: refused at start-up over nbdkit's file plugin with file=
# (--run never runs), and when the first client connects where the
# filter learns the file only then (dir=).
cp existing.qcow2 taken.qcow2
before=$(md5sum < taken.qcow2)
rm -f ran
if run_nbdkit -U - --filter="$FILTER" file taken.qcow2 qcow2-create=1M \
       --run 'touch ran' 2> start.err; then
    fail "a non-empty device: nbdkit started"
fi
[ ! -e ran ] || fail "a non-empty device: --run ran"
grep -q "taken.qcow2 is not empty: its first cluster is not all zeros" start.err ||
    { cat start.err; fail "no message at start-up for a non-empty device"; }
start_server "$PWD/sock" file dir="$PWD" qcow2-create=1M
nbdinfo "nbd+unix:///taken.qcow2?socket=$PWD/sock" > /dev/null 2>&1 && fail "a non-empty device was formatted"
grep -q "not all zeros" "$PWD/sock.log" || { cat "$PWD/sock.log"; fail "no message for a non-empty device"; }
stop_server
[ "$(md5sum < taken.qcow2)" = "$before" ] || fail "the non-empty device was modified"
echo "non-empty device: refused (at start-up with file=, at the first client with dir=), unchanged"

# A device too small for the metadata.
rm -f tiny.img; truncate -s 100K tiny.img
start_server "$PWD/sock" file tiny.img qcow2-create=1G
nbdinfo "$(nbd_uri "$PWD/sock")" > /dev/null 2>&1 && fail "a tiny device was formatted"
grep -q "too small" "$PWD/sock.log" || { cat "$PWD/sock.log"; fail "no message for a tiny device"; }
stop_server
echo "device too small: refused"

# A device served by nbdkit's eval plugin, which has no flush (nbdkit
# asserts if a filter flushes such a plugin).  FAULT=read fails reads past
# the first cluster (the check of the tables' clusters), FAULT=write fails
# every write, FAULT=none serves the file as it is.  The scripts' tools
# run without the sanitizer runtime that nbdkit gets under
# --enable-sanitizers (ASan rejects dd's aligned_alloc).
start_eval_device ()
{
    local fault=$1
    shift
    start_server "$PWD/sock" eval \
        get_size='env -u LD_PRELOAD stat -c %s device.img' \
        pread='if [ "'$fault'" = read ] && [ "$4" -ge 65536 ]; then
                 echo "EIO injected read error" >&2; exit 1; fi
               env -u LD_PRELOAD dd if=device.img skip="$4" count="$3" iflag=skip_bytes,count_bytes status=none' \
        pwrite='if [ "'$fault'" = write ]; then echo "EIO injected write error" >&2; exit 1; fi
                env -u LD_PRELOAD dd of=device.img seek="$4" iflag=count_bytes oflag=seek_bytes conv=notrunc status=none' \
        "$@"
}
if nbdkit --dump-plugin eval > /dev/null 2>&1; then
    # A device that fails while it is formatted: the connection is
    # refused with the step that failed, and no header is written.
    for fault in read write; do
        rm -f device.img; truncate -s 4M device.img
        start_eval_device $fault qcow2-create=1M
        nbdinfo "$(nbd_uri "$PWD/sock")" > /dev/null 2>&1 && fail "formatted a device whose ${fault}s fail"
        case $fault in
            read) msg="qcow2-create: cannot read the device" ;;
            write) msg="qcow2-create: writing the new image failed" ;;
        esac
        grep -q "$msg" "$PWD/sock.log" || { cat "$PWD/sock.log"; fail "no message for failing ${fault}s"; }
        stop_server
        cmp -s device.img <(head -c 4M /dev/zero) || fail "failing ${fault}s: the device was written"
        echo "device whose ${fault}s fail: refused ($msg)"
    done
    # A device without flush takes a created image and compressed writes
    # (the export then offers no flush: nbdcopy without --flush).
    rm -f device.img; truncate -s 4M device.img
    head -c 300000 /dev/urandom > part.raw
    { head -c 200000 /dev/zero; cat part.raw; for i in $(seq 500); do echo "text line $i of a plugin without flush"; done; } > noflush.raw
    truncate -s 1M noflush.raw
    start_eval_device none qcow2-create=1M
    nbdcopy noflush.raw "$(nbd_uri "$PWD/sock")" || { cat "$PWD/sock.log"; fail "nbdcopy into a device without flush"; }
    stop_server
    qemu-img check -q -f qcow2 device.img || fail "device without flush: qemu-img check"
    qemu-img compare -q -f qcow2 -F raw device.img noflush.raw || fail "device without flush: data differs"
    echo "device without flush (eval plugin): created, written, check clean, identical"
else
    skip_section "devices from nbdkit's eval plugin: the eval plugin is not installed"
fi

# A zlib level outside zlib's range is refused at start-up: the type of
# the image to be created is known then, and the device stays as it was,
# so that the rerun with a good level can format it.
rm -f new.qcow2; truncate -s 4M new.qcow2
expect_startup_error "zlib level 15" "qcow2-compression-level: 15 is out of range for zlib" \
    qcow2-create=1M qcow2-compression-type=zlib qcow2-compression-level=15
cmp -s new.qcow2 <(head -c 4M /dev/zero) || fail "zlib level 15: the device was written"
start_server "$PWD/sock" file new.qcow2 qcow2-create=1M qcow2-compression-type=zlib qcow2-compression-level=9
nbdinfo --size "$(nbd_uri "$PWD/sock")" > /dev/null || { cat "$PWD/sock.log"; fail "zlib level 9 after 15"; }
stop_server
qemu-img check -q new.qcow2 || fail "zlib level 9 after 15: qemu-img check"
echo "zlib level 15: refused at start-up, the device untouched; level 9 then formats it"
