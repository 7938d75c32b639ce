#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Lazy refcounts, the repair: images that qemu left dirty (lazy_refcounts
# =on, qemu-io killed before it closed them, so that qemu-img check
# finds refcount errors) are repaired when they are opened for writing,
# then served: the guest disk reads as qemu reads it, writes land, and
# afterwards the dirty bit is clear and qemu-img check finds no error and
# no leak.  Plain, compressed, with an internal snapshot (which must stay
# as it was) and with a persistent bitmap, through the filter and the
# plugin form; the repair in place and the rebuild of a refcount table
# that is itself damaged (the filter without room for it refuses, naming
# the room missing).  Read-only (-r) changes nothing.  A dirty image whose
# L1 or L2 tables are damaged is refused for writing with the reason, and
# nothing is written.
source "${top_srcdir:-.}/tests/functions.sh"
requires qemu-img qemu-io nbdcopy nbdinfo
requires_nbd_python
[ -f "$PLUGIN" ] || fail "the plugin is not built: $PLUGIN"

cd "$TMPDIR_TEST"
M=$((1 << 20))

# qemu_dirty IMAGE QEMU-IO-COMMANDS...: run the commands on IMAGE and
# kill qemu-io before it closes it: the image is left dirty with stale
# refcounts, which qemu-img check reports.
qemu_dirty ()
{
    local img=$1 args=() c
    shift
    for c in "$@"; do args+=(-c "$c"); done
    qemu-io "${args[@]}" -c 'sigraise 9' "$img" > /dev/null 2>&1 || true
    image_dirty "$img" || fail "$img: qemu-io did not leave the dirty bit"
    qemu-img check "$img" > precheck.out 2>&1 && fail "$img: qemu-img check finds nothing to repair"
    grep -c "^ERROR" precheck.out > /dev/null || { cat precheck.out; fail "$img: no refcount error to repair"; }
}

# The writes after the repair, through NBD, and into RAW likewise.
after_repair ()
{
    "$PYTHON" - "$@" <<'EOF'
import sys
uri, raw = sys.argv[1], sys.argv[-1]
ops = [("w", 3 * 65536 + 1000, 5000, 0x71), ("w", 40 << 20, 200000, 0x72),
       ("z", 8 << 20, 65536, 0), ("w", 61 << 20, 65536, 0x73),
       ("t", 20 << 20, 65536, 0)]
if uri != "-":
    import nbd
    h = nbd.NBD()
    h.connect_uri(uri)
    for kind, off, n, pat in ops:
        if kind == "w":
            h.pwrite(bytes([pat]) * n, off)
        elif kind == "z":
            h.zero(n, off)
        else:
            h.trim(n, off)
    h.flush()
    h.shutdown()
else:
    with open(raw, "r+b") as f:
        for kind, off, n, pat in ops:
            f.seek(off)
            f.write(bytes([pat]) * n if kind == "w" else bytes(n))
EOF
}
check_clean ()
{
    qemu-img check "$1" > check.out 2>&1 || { cat check.out; fail "$2: qemu-img check after the repair"; }
    grep -q "No errors were found" check.out || { cat check.out; fail "$2: qemu-img check is not clean"; }
    grep -qi "leak" check.out && { cat check.out; fail "$2: leaked clusters after the repair"; }
    image_dirty "$1" && fail "$2: the dirty bit is still set"
    return 0
}
# serve FORM IMAGE [NBDKIT-OPTIONS...]: with the debug lines of the
# image's opening (the repair says what it did).
serve ()
{
    local form=$1 img=$2
    shift 2
    if [ "$form" = filter ]; then
        start_server "$PWD/sock" -v -D qcow2zstd.image=1 "$@" file "$img"
    else
        start_nbdkit "$PWD/sock" -v -D qcow2zstd.image=1 "$@" "$PLUGIN" "$img"
    fi
}

# The dirty images, made by qemu.
head -c $((8 * M)) /dev/urandom > rand.raw
qemu-img create -q -f qcow2 -o lazy_refcounts=on plain.qcow2 64M
qemu_dirty plain.qcow2 'write -c -P 5 20M 64k' 'write -P 3 0 1M' \
    'write -P 4 8M 128k' 'write -P 6 512k 4k' 'write -z 16M 64k'
qemu-img convert -q -c -f raw -O qcow2 -o lazy_refcounts=on rand.raw compressed.qcow2
qemu-img resize -q compressed.qcow2 64M
qemu_dirty compressed.qcow2 'write -P 7 100k 8k' 'write -P 8 2M 1M' 'write -P 9 30M 64k'
qemu-img convert -q -f raw -O qcow2 -o lazy_refcounts=on rand.raw snap.qcow2
qemu-img resize -q snap.qcow2 64M
qemu-img snapshot -c before snap.qcow2
qemu-img convert -l snapshot.name=before -O raw snap.qcow2 snap-before.raw
qemu_dirty snap.qcow2 'write -P 10 1M 70k' 'write -P 11 5M 2M' 'write -P 12 50M 64k'
qemu-img create -q -f qcow2 -o lazy_refcounts=on bitmap.qcow2 64M
qemu-img bitmap --add bitmap.qcow2 daily
qemu_dirty bitmap.qcow2 'write -P 13 0 300k' 'write -P 14 33M 64k'

for img in plain compressed snap bitmap; do
    for form in filter plugin; do
        name="$img image, $form"
        cp $img.qcow2 work.qcow2
        [ $form = filter ] && truncate -s +8M work.qcow2
        qemu-img convert -O raw $img.qcow2 want.raw
        qemu-img check $img.qcow2 > precheck.out 2>&1 || true
        errors=$(grep -c "^ERROR" precheck.out || true)

        # Read-only changes nothing, and repairs nothing.
        sum=$(sha256sum < work.qcow2)
        serve $form work.qcow2 -r
        nbdcopy "$(nbd_uri "$PWD/sock")" got.raw
        stop_server
        cmp -s got.raw want.raw || fail "$name, -r: reads other data than qemu"
        [ "$(sha256sum < work.qcow2)" = "$sum" ] || fail "$name, -r: the image changed"

        serve $form work.qcow2
        nbdcopy "$(nbd_uri "$PWD/sock")" got.raw
        cmp -s got.raw want.raw || fail "$name: after the repair, reads other data than qemu"
        after_repair "$(nbd_uri "$PWD/sock")"
        stop_server
        said=$(grep -o "dirty image repaired: .*" "$PWD/sock.log" | head -n 1)
        [ -n "$said" ] || { cat "$PWD/sock.log"; fail "$name: no repair in the debug log"; }
        check_clean work.qcow2 "$name"
        after_repair - want.raw
        qemu-img convert -O raw work.qcow2 got.raw
        cmp -s got.raw want.raw || fail "$name: qemu reads other data than was written"
        if [ $img = snap ]; then
            qemu-img convert -l snapshot.name=before -O raw work.qcow2 got.raw
            cmp -s got.raw snap-before.raw || fail "$name: the snapshot changed"
        fi
        if [ $img = bitmap ]; then
            qemu-img info work.qcow2 | grep -q "in-use" ||
                fail "$name: the bitmap qemu left in use is not in use"
        fi
        echo "$name: $errors errors of qemu-img check before; $said; check clean, qemu reads what was written"
    done
done

# qemu's own repair of the same image agrees on the data.
cp plain.qcow2 qemu-repaired.qcow2
qemu-img check -q -r all qemu-repaired.qcow2 > /dev/null 2>&1 || true
cp plain.qcow2 work.qcow2
truncate -s +8M work.qcow2
serve filter work.qcow2
nbdinfo "$(nbd_uri "$PWD/sock")" > /dev/null
stop_server
qemu-img compare -q qemu-repaired.qcow2 work.qcow2 || fail "ours and qemu's repair read differently"
check_clean work.qcow2 "opened only"
echo "a dirty image only opened for writing: repaired and clean, reads as after qemu-img check -r all"

# set_u64 IMAGE OFFSET VALUE; refcount table entry 0, the L1 entry 0 and
# the first L2 entry of the first table, for damaging them.
set_u64 ()
{
    "$PYTHON" -c '
import struct, sys
with open(sys.argv[1], "r+b") as f:
    f.seek(int(sys.argv[2])); f.write(struct.pack(">Q", int(sys.argv[3], 0)))' "$@"
}
l1_at=$(header_u64 plain.qcow2 40)
l2_at=$(( $(od -An -tu8 --endian=big -j "$l1_at" -N 8 plain.qcow2 | tr -d ' ') & 0x00fffffffffffe00 ))
rt_at=$(header_u64 plain.qcow2 48)

# A refcount table whose first entry is lost: rebuilt (the old table and
# blocks become free), in the filter with room and in the plugin form;
# the filter without room refuses, saying how much is missing.
for form in filter plugin; do
    cp plain.qcow2 work.qcow2
    set_u64 work.qcow2 "$rt_at" 0
    [ $form = filter ] && truncate -s +1M work.qcow2
    qemu-img convert -O raw plain.qcow2 want.raw
    serve $form work.qcow2
    nbdcopy "$(nbd_uri "$PWD/sock")" got.raw
    after_repair "$(nbd_uri "$PWD/sock")"
    stop_server
    grep -q "the refcounts rebuilt" "$PWD/sock.log" || { cat "$PWD/sock.log"; fail "$form: the refcount table was not rebuilt"; }
    cmp -s got.raw want.raw || fail "$form, rebuilt: reads other data than qemu"
    check_clean work.qcow2 "$form, rebuilt"
    after_repair - want.raw
    qemu-img convert -O raw work.qcow2 got.raw
    cmp -s got.raw want.raw || fail "$form, rebuilt: qemu reads other data than was written"
    echo "$form, refcount table entry lost: $(grep -o "dirty image repaired: .*" "$PWD/sock.log" | head -n 1)"
done
cp plain.qcow2 work.qcow2
set_u64 work.qcow2 "$rt_at" 0
sum=$(sha256sum < work.qcow2)
serve filter work.qcow2
nbdinfo "$(nbd_uri "$PWD/sock")" > /dev/null 2>&1 && fail "rebuilt without room: opened for writing"
stop_server
grep -q "the refcounts must be rebuilt, but the image file has no room" "$PWD/sock.log" ||
    { cat "$PWD/sock.log"; fail "rebuilt without room: no message"; }
[ "$(sha256sum < work.qcow2)" = "$sum" ] || fail "rebuilt without room: the image changed"
echo "filter, refcount table entry lost, no room: refused, $(grep -o "no room for [^;]*" "$PWD/sock.log" | head -n 1), unchanged"

# COPIED wrong (clear on a cluster counted once): set by the repair, as
# qemu's check sets it.
cp plain.qcow2 work.qcow2
truncate -s +8M work.qcow2
entry=$(od -An -tu8 --endian=big -j "$l2_at" -N 8 plain.qcow2 | tr -d ' ')
[ $(( entry >> 63 & 1 )) = 1 ] || fail "the first L2 entry has no COPIED to clear"
set_u64 work.qcow2 "$l2_at" $(( entry & 0x7fffffffffffffff ))
serve filter work.qcow2
nbdinfo "$(nbd_uri "$PWD/sock")" > /dev/null
stop_server
grep -q "dirty image repaired: .* 1 COPIED flags fixed" "$PWD/sock.log" ||
    { grep "repaired" "$PWD/sock.log"; fail "COPIED: not fixed"; }
check_clean work.qcow2 "COPIED"
echo "COPIED cleared on a cluster counted once: $(grep -o "[0-9]* COPIED flags fixed" "$PWD/sock.log" | head -n 1), check clean"

# Damaged tables: refused for writing, nothing written, readable with -r.
for bad in "l2 0x2 reserved bits are set" \
           "l2 0x8000000040000000 lies past the end of the file" \
           "l1 0x8000000040000000 lies outside the file" \
           "l1 $rt_at holds an L2 table and the refcount table"; do
    read -r where value message <<<"$bad"
    cp plain.qcow2 work.qcow2
    truncate -s +8M work.qcow2
    if [ $where = l1 ]; then
        # The L1 entry points elsewhere: outside the file, or at the
        # refcount table (as an L2 table).
        set_u64 work.qcow2 "$l1_at" "$value"
    else
        set_u64 work.qcow2 "$l2_at" "$value"
    fi
    sum=$(sha256sum < work.qcow2)
    serve filter work.qcow2
    nbdinfo "$(nbd_uri "$PWD/sock")" > /dev/null 2>&1 && fail "$where $value: opened for writing"
    stop_server
    grep -q "$message" "$PWD/sock.log" || { cat "$PWD/sock.log"; fail "$where $value: no '$message' in the log"; }
    grep -q "the image cannot be repaired" "$PWD/sock.log" || { cat "$PWD/sock.log"; fail "$where $value: no refusal"; }
    [ "$(sha256sum < work.qcow2)" = "$sum" ] || fail "$where $value: the image changed"
    said=$(grep -o "cannot be repaired: [^;]*" "$PWD/sock.log" | head -n 1)
    serve filter work.qcow2 -r
    nbdinfo "$(nbd_uri "$PWD/sock")" > /dev/null
    stop_server
    echo "$where entry $value: refused, nothing written, readable with -r: $said"
done
