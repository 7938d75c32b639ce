#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Damaged images are never made worse: qemu's overlap checks.  Each
# shape of tests/overlap-shapes.py (an L2 entry with COPIED pointing at
# the refcount table, a refcount block, the L1 table, the L2 table
# itself, a snapshot's L1 table, the snapshot table, the LUKS area, the
# bitmap directory or a bitmap table; a refcount table entry pointing at
# the L1 table, an L2 table or the refcount table; an L1 entry pointing
# at metadata; a compressed descriptor pointing into metadata; a host
# cluster that an L2 entry maps with its refcount set to 0, which the
# next allocation would hand out) is made
# from a small qemu-made image (64 KiB clusters, guest clusters 0 to 3
# written), and then:
#
# - qemu-io does the same write on a copy, and must do what the shape's
#   entry says qemu 7.2 does (the oracle; for most shapes: EIO, "Marking
#   image as corrupt: Preventing invalid write on metadata (overlaps
#   with ...)", the corrupt bit set, and the image refused read-write
#   afterwards);
# - one write through the filter and one through the plugin form, where
#   the damaged entry leads, must be refused with EIO, with "Marking
#   image as corrupt" in the log; a later write elsewhere is refused
#   too, and the undamaged guest clusters still read as before;
# - the file must be byte for byte as it was but for the corrupt bit
#   (bit 1 of incompatible_features), which is set; qemu must read the
#   undamaged guest clusters as it read them in the undamaged image, and
#   refuse to open the image read-write, in the words it uses after its
#   own detection.
#
# OVERLAP_SHAPES="NAME ..." runs only those shapes.
source "${top_srcdir:-.}/tests/functions.sh"
requires qemu-io cmp od
requires_nbd_python
[ -f "$PLUGIN" ] || fail "the plugin is not built: $PLUGIN"

SHAPES_PY=("$PYTHON" "$top_srcdir/tests/overlap-shapes.py")
cd "$TMPDIR_TEST"
echo -n "overlap secret" > pass.txt
SECRET=(--object "secret,id=s0,file=$PWD/pass.txt")
C=65536

# qemu_io BASE IMAGE ARGS...: qemu-io on IMAGE (decrypted for luks).
qemu_io ()
{
    local base=$1 img=$2
    shift 2
    if [ "$base" = luks ]; then
        qemu-io "${SECRET[@]}" --image-opts \
            "driver=qcow2,file.filename=$img,encrypt.key-secret=s0" "$@"
    else
        qemu-io -f qcow2 "$@" "$img"
    fi
}

# qemu_raw BASE IMAGE RAW: what qemu reads from IMAGE, into RAW.
qemu_raw ()
{
    if [ "$1" = luks ]; then
        qemu-img convert -U "${SECRET[@]}" --image-opts \
            "driver=qcow2,file.filename=$2,encrypt.key-secret=s0" -O raw "$3"
    else
        qemu-img convert -U -f qcow2 -O raw "$2" "$3"
    fi
}

# ------------------------------------------------------------ the bases
# Guest clusters 0 to 3 written, the last one compressed (not in the
# luks base: qemu does not compress encrypted images).
WRITES=(-c "write -P 0xa0 0 64k" -c "write -P 0xa1 64k 64k" -c "write -P 0xa2 128k 64k")
qemu-img create -q -f qcow2 -o cluster_size=65536 plain.qcow2 4M
qemu_io plain plain.qcow2 "${WRITES[@]}" -c "write -c -P 0xa3 192k 64k" > /dev/null
# A snapshot, then guest cluster 1 written again: its entry alone has
# COPIED.
cp plain.qcow2 snapshot.qcow2
qemu-img snapshot -c s1 snapshot.qcow2
qemu_io snapshot snapshot.qcow2 -c "write -P 0xb1 64k 64k" > /dev/null
cp plain.qcow2 bitmap.qcow2
qemu-img bitmap --add bitmap.qcow2 b0
qemu_img_luks create -q -f qcow2 "${SECRET[@]}" \
    -o cluster_size=65536,encrypt.format=luks,encrypt.key-secret=s0,encrypt.iter-time=10 \
    luks.qcow2 4M || fail "qemu-img could not make the LUKS image"
qemu_io luks luks.qcow2 "${WRITES[@]}" -c "write -P 0xa3 192k 64k" > /dev/null
for base in plain snapshot bitmap luks; do
    # Room for allocations: the filter does not grow the file.
    truncate -s +1M $base.qcow2
    qemu_raw $base $base.qcow2 $base.raw
done

# ------------------------------------------------------------ the client
# client.py SOCKET EXPORT LOG OFFSET LENGTH REDIRECTED RAW: the damaged
# write must fail with EIO and leave "Marking image as corrupt" in LOG
# (read from where it ended when the client started), a later write
# must fail, and the guest clusters 0 to 3 that are not REDIRECTED must
# read as RAW says.  Prints what is wrong, or nothing.
cat > client.py <<'EOF'
import os, sys
import nbd

sock, export, log, off, length, redirected, raw = sys.argv[1:8]
off, length = int(off), int(length)
redirected = set() if redirected == "-" else {int(c) for c in redirected.split(",")}
C = 65536
want = open(raw, "rb").read()
start = os.path.getsize(log)
wrong = []
h = nbd.NBD()
h.set_export_name(export)
h.connect_unix(sock)
try:
    h.pwrite(b"\x5a" * length, off)
    wrong.append("the damaged write was acknowledged")
except nbd.Error as e:
    if e.errno != "EIO":
        wrong.append(f"the damaged write failed with {e.errno}, not EIO")
try:
    h.flush()
except nbd.Error:
    pass
try:
    h.pwrite(b"\x6b" * 4096, 8 * C)
    wrong.append("a write after the damaged one was acknowledged")
except nbd.Error as e:
    if e.errno not in ("EIO", "EROFS"):
        wrong.append(f"a later write failed with {e.errno}, not EIO or EROFS")
for c in range(4):
    if c in redirected:
        continue
    try:
        if h.pread(C, c * C) != want[c * C:(c + 1) * C]:
            wrong.append(f"guest cluster {c} reads other data")
    except nbd.Error as e:
        wrong.append(f"guest cluster {c} cannot be read: {e.string}")
h.shutdown()
with open(log, "rb") as f:
    f.seek(start)
    new = f.read().decode("utf-8", "replace")
if "Marking image as corrupt" not in new:
    wrong.append("no 'Marking image as corrupt' in the log")
print("; ".join(wrong))
EOF

# shapes: the shapes this run tries (all, or those of OVERLAP_SHAPES),
# one line each as overlap-shapes.py prints them.
selected=" ${OVERLAP_SHAPES:-} "
shapes ()
{
    "${SHAPES_PY[@]}" shapes | while read -r name rest; do
        [ "$selected" = "  " ] || [[ $selected == *" $name "* ]] || continue
        echo "$name $rest"
    done
}

# damaged DIR NAME BASE: DIR/NAME.qcow2, the base damaged as shape NAME,
# and a copy of it, DIR/NAME.qcow2.damaged.
damaged ()
{
    mkdir -p "$1"
    cp "$3.qcow2" "$1/$2.qcow2"
    "${SHAPES_PY[@]}" damage "$1/$2.qcow2" "$2" > /dev/null
    cp "$1/$2.qcow2" "$1/$2.qcow2.damaged"
}

# ------------------------------------------------------------ the oracle
# The claim of every shape about qemu, checked: what qemu-io does with
# the write, and how qemu refuses the image afterwards when it marked it.
declare -A QEMU_REFUSAL
failures=()
while read -r name base off len redirected claim; do
    damaged oracle "$name" $base
    img=oracle/$name.qcow2
    out=$(qemu_io $base "$img" -c "write -P 0x5a $off $len" 2>&1 || true)
    if [[ $out =~ Marking\ image\ as\ corrupt:\ Preventing\ invalid\ write\ on\ metadata\ \(overlaps\ with\ ([^\)]*)\) ]]; then
        structure=${BASH_REMATCH[1]}
        if grep -q "write failed: Input/output error" <<<"$out"; then
            seen="corrupt:$structure"
        else
            seen="acked-corrupt:$structure"
        fi
    elif grep -q "write failed: Input/output error" <<<"$out"; then
        seen=eio
    elif grep -q "^wrote $len/$len bytes" <<<"$out"; then
        seen=writes
    else
        seen="unknown ($out)"
    fi
    if [ "$seen" != "$claim" ]; then
        failures+=("oracle $name: qemu-io: $seen, not $claim as the shape says")
        continue
    fi
    if [[ $claim == *corrupt:* ]]; then
        refusal=$(qemu_io $base "$img" -c "read 0 512" 2>&1 || true)
        grep -q "Image is corrupt; cannot be opened read/write" <<<"$refusal" ||
            failures+=("oracle $name: qemu opened the image it marked corrupt read-write: $refusal")
        QEMU_REFUSAL[$name]=${refusal//$img/IMAGE}
    fi
    echo "qemu $name: $seen"
done < <(shapes)

# ------------------------------------------------------------ ours
# judge FORM NAME BASE IMG REDIRECTED WRONG: the file, qemu's reading of
# it and qemu's refusal, after our write.
judge ()
{
    local form=$1 name=$2 base=$3 img=$4 redirected=$5 wrong=$6
    local diff c expect refusal
    diff=$(cmp -l "$img.damaged" "$img" 2>&1 || true)
    # cmp -l: 1-based offset, old and new byte in octal.  Byte 80 is the
    # last of incompatible_features (bytes 72 to 79).
    if [ -z "$diff" ]; then
        wrong+="${wrong:+; }the corrupt bit is not set"
    else
        read -r c old new rest <<<"$diff"
        if [ "$(wc -l <<<"$diff")" != 1 ] || [ "$c" != 80 ] || [ -n "$rest" ] ||
           [ $(( 8#$new )) != $(( 8#$old | 2 )) ]; then
            wrong+="${wrong:+; }the file changed beyond the corrupt bit ($(wc -l <<<"$diff") bytes: $(head -c 200 <<<"$diff" | tr '\n' ' '))"
        fi
    fi
    # Cluster by cluster: a cluster the damage redirects may not be
    # readable by qemu at all (a compressed descriptor into metadata).
    # Each undamaged cluster holds one byte throughout (the bases' writes).
    for c in 0 1 2 3; do
        [[ ,$redirected, == *,$c,* ]] && continue
        pattern=$(od -An -tx1 -j $((c * C)) -N1 $base.raw | tr -d ' ')
        out=$(qemu_io $base "$img" -r -U -c "read -P 0x$pattern $((c * C)) $C" 2>&1 || true)
        grep -q "^read $C/$C bytes" <<<"$out" && ! grep -q "Pattern verification failed" <<<"$out" ||
            wrong+="${wrong:+; }qemu reads guest cluster $c differently ($(head -1 <<<"$out"))"
    done
    refusal=$(qemu_io $base "$img" -c "read 0 512" 2>&1 || true)
    expect=${QEMU_REFUSAL[$name]:-}
    if ! grep -q "Image is corrupt; cannot be opened read/write" <<<"$refusal"; then
        wrong+="${wrong:+; }qemu opens it read-write: $(head -1 <<<"$refusal")"
    elif [ -n "$expect" ] && [ "${refusal//$img/IMAGE}" != "$expect" ]; then
        wrong+="${wrong:+; }qemu refuses it otherwise than after its own detection: $refusal"
    fi
    if [ -n "$wrong" ]; then
        failures+=("$form $name: $wrong")
        echo "$form $name: FAILED: $wrong"
    else
        echo "$form $name: refused, corrupt bit set, nothing else changed, qemu refuses it read-write"
    fi
}

# The filter: one server for every shape, over the file plugin's dir=.
while read -r name base off len redirected claim; do
    damaged filter "$name" $base
done < <(shapes)
start_server "$PWD/filter.sock" file dir="$PWD/filter" qcow2-passphrase=+pass.txt
declare -A WRONG
while read -r name base off len redirected claim; do
    WRONG[$name]=$(python3 client.py "$PWD/filter.sock" $name.qcow2 "$PWD/filter.sock.log" \
                   "$off" "$len" "$redirected" $base.raw) || WRONG[$name]="the client failed"
done < <(shapes)
stop_server
while read -r name base off len redirected claim; do
    judge filter "$name" $base filter/$name.qcow2 "$redirected" "${WRONG[$name]}"
done < <(shapes)

# The plugin form: a server for each.
while read -r name base off len redirected claim; do
    damaged plugin "$name" $base
    img=plugin/$name.qcow2
    start_nbdkit "$PWD/plugin.sock" "$PLUGIN" "$img" qcow2-passphrase=+pass.txt ||
        fail "plugin $name: nbdkit did not start"
    wrong=$(python3 client.py "$PWD/plugin.sock" "" "$PWD/plugin.sock.log" \
            "$off" "$len" "$redirected" $base.raw) || wrong="the client failed"
    stop_server
    judge plugin "$name" $base "$img" "$redirected" "$wrong"
done < <(shapes)

if [ ${#failures[@]} -gt 0 ]; then
    printf '  %s\n' "${failures[@]}"
    fail "${#failures[@]} of the checks above failed"
fi
