#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Backing files: raw and qcow2 backing files and a chain of three, named
# in the header (absolute and relative) or given with qcow2-backing=PATH;
# reads compared with qemu's, also of backing files that end inside a
# cluster, smaller than the disk (both forms); partial writes, zeroes and trims over
# unallocated clusters, on v3 and v2, checked with qemu-img check and
# compared with qemu's reading of the result.  Which files a header may
# name: chains beside the image (and below it) are served; absolute
# paths elsewhere, ../ escapes, symbolic links out, json: and protocol
# names, device files and FIFOs are refused with their message, in both
# forms and at depths 1 to 3 of a chain; qcow2-backing-dir= (given once
# or twice) allows a directory, and qcow2-backing= still names a file.
source "${top_srcdir:-.}/tests/functions.sh"
requires nbdcopy qemu-io
requires_nbd_python
[ -f "$PLUGIN" ] || fail "the plugin is not built: $PLUGIN"

cd "$TMPDIR_TEST"
$PYTHON -c "
import random
r = random.Random(12)
open('base.raw', 'wb').write(b''.join(r.randbytes(9000) + b'backing ' * 3000 for _ in range(100)))
"
base_size=$(stat -c %s base.raw)

# served_equals_qemu IMAGE [PARAMS]: the filter reads IMAGE as qemu does.
served_equals_qemu ()
{
    local img=$1 what=$2
    shift 2
    start_server "$PWD/sock" -r file "$img" "$@"
    nbdcopy "$(nbd_uri "$PWD/sock")" served.raw
    stop_server
    qemu-img convert -U -O raw "$img" qemu.raw
    cmp served.raw qemu.raw || fail "$what: the filter and qemu read different data"
}

# 1. A raw backing file, named by an absolute path.
qemu-img create -q -f qcow2 -b "$PWD/base.raw" -F raw top-raw.qcow2 $((base_size + 100000))
qemu-io -f qcow2 -c "write -P 0x11 100000 50000" -c "write -z 400000 70000" top-raw.qcow2 > /dev/null
served_equals_qemu top-raw.qcow2 "raw backing"
echo "raw backing file, larger disk than the backing file: reads as qemu reads it"

# 2. A chain: compressed zstd base <- zlib middle <- top, relative names.
mkdir chain
qemu-img convert -c -O qcow2 -o compression_type=zstd base.raw chain/base.qcow2
(cd chain &&
 qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 -o compression_type=zlib mid.qcow2 &&
 qemu-io -f qcow2 -c "write -c -P 0x22 65536 65536" -c "write -P 0x23 300000 5000" mid.qcow2 > /dev/null &&
 qemu-img create -q -f qcow2 -b mid.qcow2 -F qcow2 top.qcow2 &&
 qemu-io -f qcow2 -c "write -P 0x33 70000 1000" -c "write -z 600000 65536" \
     -c "write -z 786432 131072" top.qcow2 > /dev/null)
served_equals_qemu chain/top.qcow2 "chain"
echo "chain of three (zstd base, zlib middle), relative names: reads as qemu reads it"

# 3. qcow2-backing=PATH overrides a name that does not resolve.
qemu-img create -q -f qcow2 -b "$PWD/chain/base.qcow2" -F qcow2 moved.qcow2
qemu-io -f qcow2 -c "write -P 0x44 1000 3000" moved.qcow2 > /dev/null
qemu-img rebase -u -b /nonexistent/base.qcow2 -F qcow2 moved.qcow2
start_server "$PWD/sock" -r file moved.qcow2 qcow2-backing="$PWD/chain/base.qcow2"
nbdcopy "$(nbd_uri "$PWD/sock")" served.raw
stop_server
cp moved.qcow2 rebased.qcow2
qemu-img rebase -u -b "$PWD/chain/base.qcow2" -F qcow2 rebased.qcow2
qemu-img convert -O raw rebased.qcow2 qemu.raw
cmp served.raw qemu.raw || fail "qcow2-backing: wrong data"
echo "qcow2-backing=PATH in place of a name that does not resolve: reads right"

# 4. Writing over a backing file (v3 and v2): partial writes copy the
# backing data into the new cluster, zeroes hide it, and a trim does
# what qemu's discard does.  The expected disk is computed here, from
# qemu's reading of the new image and the operations.
for compat in 1.1 0.10; do
    qemu-img create -q -f qcow2 -o compat=$compat -b "$PWD/chain/base.qcow2" -F qcow2 w.qcow2
    truncate -s +4M w.qcow2
    qemu-img convert -O raw w.qcow2 expect.raw
    start_server "$PWD/sock" file w.qcow2
    $PYTHON - "$(nbd_uri "$PWD/sock")" "$compat" <<'EOF'
import nbd, os, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
compat = sys.argv[2]
fd = os.open("expect.raw", os.O_RDWR)
def write(data, off):
    h.pwrite(data, off); os.pwrite(fd, data, off)
def zero(n, off):
    h.zero(n, off); os.pwrite(fd, bytes(n), off)
write(b"partial" * 100, 70000)          # inside one unallocated cluster
write(b"x" * 65536, 131072)             # a whole cluster
zero(1000, 200000)                      # part of a cluster
zero(131072, 262144)                    # whole clusters
zero(65536 + 3000, 458752 - 1000)       # parts and a whole one
# Trims of whole clusters over a backing file, as qemu 7.2 discards
# them: a v3 image marks them zero (they read zeros); a v2 image has no
# zero flag, and qemu leaves them as they are (reading the backing file,
# or what was written).  Of a cluster unallocated before, and of two
# this session allocated.
h.trim(65536, 589824)
write(b"y" * 65536 * 2, 720896)
h.trim(65536 * 2, 720896)
if compat == "1.1":
    os.pwrite(fd, bytes(65536), 589824)
    os.pwrite(fd, bytes(65536 * 2), 720896)
h.flush()
got = h.pread(h.get_size(), 0)
want = os.pread(fd, h.get_size(), 0)
assert got == want, "the filter does not read back what was written"
EOF
    stop_server
    qemu-img check w.qcow2 > check.out 2>&1 || { cat check.out; fail "compat $compat: qemu-img check"; }
    grep -q "No errors were found" check.out || { cat check.out; fail "compat $compat: check found problems"; }
    qemu-img compare -q -f qcow2 -F raw w.qcow2 expect.raw || fail "compat $compat: qemu reads other data"
    echo "compat $compat over a backing file: writes, zeroes, trims: check clean, qemu agrees"
done

# 4b. Backing files that end inside a cluster, under a 4 MiB overlay:
# a qcow2 one made with a size of 1 MiB + 4 bytes (qemu-img rounds it
# to 1 MiB + 512), the same with the header's size set to exactly
# 1 MiB + 4 (qemu reads a size in whole sectors, rounded down), and a
# raw file of 1 MiB + 4 bytes.  The backing data fills every byte, and
# the overlay's cluster over the backing file's end is unallocated, so
# its read is the backing file's last part and then zeros.  Read whole
# through both forms (nbdcopy, as a client reads the disk) and compared
# with qemu's reading of the overlay.
odd=$((1048576 + 4))
for kind in qcow2 qcow2-exact raw; do
    section odd-backing-$kind || continue
    rm -f odd-base.* odd-top.qcow2
    if [ $kind = raw ]; then
        $PYTHON -c "open('odd-base.raw', 'wb').write((b'backing end ' * 90000)[:$odd])"
        qemu-img create -q -f qcow2 -b "$PWD/odd-base.raw" -F raw odd-top.qcow2 4M
    else
        qemu-img create -q -f qcow2 odd-base.qcow2 $odd
        qemu-io -f qcow2 -c "write -P 0x6b 0 $(( (odd + 511) / 512 * 512 ))" odd-base.qcow2 > /dev/null
        if [ $kind = qcow2-exact ]; then
            $PYTHON -c "
import struct
with open('odd-base.qcow2', 'r+b') as f:
    f.seek(24)
    f.write(struct.pack('>Q', $odd))"
        fi
        qemu-img create -q -f qcow2 -b "$PWD/odd-base.qcow2" -F qcow2 odd-top.qcow2 4M
    fi
    qemu-io -f qcow2 -c "write -P 0x71 64k 64k" -c "write -P 0x72 2M 64k" odd-top.qcow2 > /dev/null
    qemu-img convert -O raw odd-top.qcow2 qemu.raw
    for form in filter plugin; do
        rm -f served.raw
        if [ $form = filter ]; then
            start_server "$PWD/sock" -r file odd-top.qcow2
        else
            start_nbdkit "$PWD/sock" -r "$PLUGIN" odd-top.qcow2
        fi
        nbdcopy "$(nbd_uri "$PWD/sock")" served.raw ||
            fail "$kind backing of $odd bytes, $form: nbdcopy failed"
        stop_server
        cmp served.raw qemu.raw ||
            fail "$kind backing of $odd bytes, $form: the disk read differs from qemu's"
    done
    echo "$kind backing file of $odd bytes under a 4 MiB disk: read whole by both forms as qemu reads it"
done

# 5. Extents: zero clusters of the top image are holes that read as
# zeros; unallocated ones show the backing file's data, so they are data.
start_server "$PWD/sock" -r file chain/top.qcow2
nbdinfo --map "$(nbd_uri "$PWD/sock")" > map.txt
stop_server
qemu-img map --output=json chain/top.qcow2 > qemu-map.json
$PYTHON - map.txt qemu-map.json <<'EOF' || { cat map.txt; fail "extents over a backing file"; }
import json, sys
ours = []
for line in open(sys.argv[1]):
    off, length, kind = (int(x) for x in line.split()[:3])
    ours.append((off, off + length, kind))
def ours_at(pos):
    return next(k for a, b, k in ours if a <= pos < b)
holes = 0
for e in json.load(open(sys.argv[2])):
    # Zero at depth 0 without data: a zero cluster of the top image.
    want = 3 if e["depth"] == 0 and e["zero"] and not e["data"] else 0
    holes += want == 3
    for pos in range(e["start"], e["start"] + e["length"], 65536):
        assert ours_at(pos) == want, (pos, ours_at(pos), want)
assert holes > 0, "the image has no zero cluster to check"
EOF
echo "extents over a backing file: zero clusters are holes, the rest data, as qemu maps it"

# 6. Which files a header may name.  A backing file is opened only if
# it is a regular file inside the served image's directory (symbolic
# links resolved) or a directory qcow2-backing-dir= adds; json: and
# protocol names never.  Anything else is refused at open, in both
# forms and at every depth of a chain, with a message naming the file,
# the header's name for it and the parameter that allows it; a client
# reads nothing of the file.
mkdir -p srv/sub elsewhere other
$PYTHON -c "open('elsewhere/secret.raw', 'wb').write(b'SECRET! ' * 131072)"
qemu-img convert -q -O qcow2 elsewhere/secret.raw elsewhere/secret.qcow2
cp elsewhere/secret.raw other/other.raw
SRV=$(cd srv && pwd -P) ELSE=$(cd elsewhere && pwd -P)

# overlay NAME BACKING FORMAT: srv/NAME.qcow2 over BACKING as the header
# names it (qemu-img does not open it: it may be anything).
overlay ()
{
    qemu-img create -q -f qcow2 -u -b "$2" -F "$3" "srv/$1.qcow2" 1M
}

# refused WHAT IMAGE TEXT [PARAMS...]: both forms refuse IMAGE when the
# client connects, logging TEXT (a fixed string).
refused ()
{
    local what=$1 img=$2 text=$3 form
    shift 3
    for form in filter plugin; do
        local stack=(--filter="$FILTER" file "$img")
        [ $form = filter ] || stack=("$PLUGIN" "$img")
        rm -f out.raw
        if run_nbdkit -U - -r "${stack[@]}" "$@" --run 'nbdcopy "$uri" out.raw' 2> err.txt; then
            fail "$what, $form: served"
        fi
        grep -qF -- "$text" err.txt || { cat err.txt; fail "$what, $form: no '$text' in the log"; }
        ! grep -q SECRET out.raw 2>/dev/null || fail "$what, $form: the secret was read"
    done
    echo "$what: refused in both forms: $(grep -oF -- "$text" err.txt | head -1 | cut -c1-160)"
}

# served WHAT IMAGE [PARAMS...]: both forms read IMAGE as qemu does.
served ()
{
    local what=$1 img=$2 form
    shift 2
    qemu-img convert -U -O raw "$img" qemu.raw
    for form in filter plugin; do
        local stack=(--filter="$FILTER" file "$img")
        [ $form = filter ] || stack=("$PLUGIN" "$img")
        rm -f out.raw
        run_nbdkit -U - -r "${stack[@]}" "$@" --run 'nbdcopy "$uri" out.raw' 2> err.txt ||
            { cat err.txt; fail "$what, $form: not served"; }
        cmp out.raw qemu.raw || fail "$what, $form: read differently from qemu"
    done
    echo "$what: served in both forms, as qemu reads it"
}

outside ()  # FILE NAME DIR: the message for FILE, named NAME, outside
{
    echo "the backing file $1 (named '$2' in the image) is outside the directories backing files may be opened from ($SRV): qcow2-backing-dir=$3 allows it, or qcow2-backing=PATH names the backing file"
}

# Beside the image, and below it.
cp chain/base.qcow2 srv/base.qcow2
overlay mid base.qcow2 qcow2
overlay top mid.qcow2 qcow2
served "a chain of three beside the image" srv/top.qcow2
cp chain/base.qcow2 srv/sub/base.qcow2
overlay below sub/base.qcow2 qcow2
served "a backing file in a directory below the image's" srv/below.qcow2
overlay abs-beside "$SRV/base.qcow2" qcow2
served "a backing file beside the image named by its absolute path" srv/abs-beside.qcow2

# Outside it, at depth 1.
overlay abs-raw "$ELSE/secret.raw" raw
refused "an absolute path elsewhere (raw)" srv/abs-raw.qcow2 \
    "$(outside "$ELSE/secret.raw" "$ELSE/secret.raw" "$ELSE")"
overlay abs-qcow2 "$ELSE/secret.qcow2" qcow2
refused "an absolute path elsewhere (qcow2)" srv/abs-qcow2.qcow2 \
    "$(outside "$ELSE/secret.qcow2" "$ELSE/secret.qcow2" "$ELSE")"
overlay escape ../elsewhere/secret.raw raw
refused "a ../ escape" srv/escape.qcow2 \
    "$(outside "$ELSE/secret.raw" ../elsewhere/secret.raw "$ELSE")"
ln -s ../elsewhere/secret.raw srv/link.raw
overlay symlink link.raw raw
refused "a symbolic link beside the image that leads out" srv/symlink.qcow2 \
    "$(outside "$ELSE/secret.raw" link.raw "$ELSE")"
json='json:{"driver":"raw","file":{"driver":"file","filename":"'$ELSE'/secret.raw"}}'
overlay json "$json" raw
refused "a json: name" srv/json.qcow2 \
    "the backing file name '$json' is a protocol or json: name, which only qemu opens: refused"
overlay protocol "nbd+unix:///?socket=$PWD/none.sock" raw
refused "a protocol name" srv/protocol.qcow2 "is a protocol or json: name, which only qemu opens: refused"
overlay device /dev/zero raw
refused "a device file, even in a directory allowed" srv/device.qcow2 \
    "the backing file /dev/zero (named '/dev/zero' in the image) is not a regular file" \
    qcow2-backing-dir=/dev
mkfifo srv/fifo.raw
overlay fifo fifo.raw raw
refused "a FIFO beside the image" srv/fifo.qcow2 \
    "the backing file $SRV/fifo.raw (named 'fifo.raw' in the image) is not a regular file"

# Outside it, deeper down a chain that begins beside the image.
overlay deep2-mid ../elsewhere/secret.raw raw
overlay deep2 deep2-mid.qcow2 qcow2
refused "a ../ escape at depth 2" srv/deep2.qcow2 \
    "$(outside "$ELSE/secret.raw" ../elsewhere/secret.raw "$ELSE")"
overlay deep3-low link.raw raw
overlay deep3-mid deep3-low.qcow2 qcow2
overlay deep3 deep3-mid.qcow2 qcow2
refused "a symbolic link out at depth 3" srv/deep3.qcow2 \
    "$(outside "$ELSE/secret.raw" link.raw "$ELSE")"
overlay deep3-json-low "$json" raw
overlay deep3-json-mid deep3-json-low.qcow2 qcow2
overlay deep3-json deep3-json-mid.qcow2 qcow2
refused "a json: name at depth 3" srv/deep3-json.qcow2 "is a protocol or json: name"

# The parameters that allow them.
served "qcow2-backing-dir= the directory of an absolute path elsewhere" \
    srv/abs-raw.qcow2 qcow2-backing-dir="$ELSE"
served "qcow2-backing-dir= for a symbolic link out at depth 3" \
    srv/deep3.qcow2 qcow2-backing-dir=elsewhere
overlay two-dirs "$PWD/other/other.raw" raw
served "qcow2-backing-dir= given twice" srv/two-dirs.qcow2 \
    qcow2-backing-dir="$ELSE" qcow2-backing-dir="$PWD/other"
served "qcow2-backing= naming a file elsewhere" srv/abs-qcow2.qcow2 \
    qcow2-backing="$ELSE/secret.qcow2"
for bad in "$PWD/none" "$ELSE/secret.raw"; do
    for form in filter plugin; do
        stack=(--filter="$FILTER" file srv/top.qcow2)
        [ $form = filter ] || stack=("$PLUGIN" srv/top.qcow2)
        if run_nbdkit -U - -r "${stack[@]}" qcow2-backing-dir="$bad" --run true 2> err.txt; then
            fail "qcow2-backing-dir=$bad, $form: nbdkit started"
        fi
        grep -q "qcow2-backing-dir: $bad" err.txt || { cat err.txt; fail "qcow2-backing-dir=$bad, $form"; }
    done
done
echo "qcow2-backing-dir= a missing directory or a file: refused at start-up in both forms"
