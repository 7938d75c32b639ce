#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Persistent dirty bitmaps kept valid.  An image made by qemu with
# enabled bitmaps of three granularities, a disabled one with bits set
# and one left in use by a crash of qemu: the same writes, zeroes and
# discards through the filter (two sessions, then four connections at
# once), the plugin form, and qemu-io on copies of it, and then qemu-img
# info lists the same bitmaps
# and qemu-nbd -B gives the same map for each; the disabled bitmap and
# the one in use are byte for byte as they were, qemu-img check is clean.
# A session that only reads leaves the file as it was.  SIGTERM while the
# client is connected leaves them consistent; after kill -9 of nbdkit,
# qemu reports them inconsistent.  Bitmaps that cannot be
# kept (an unknown flag, an unknown type) are dropped as before, with the
# reason in the log; a bitmap table outside the file or on top of the L1
# table refuses writing (at start-up over the file plugin with file=,
# at open with dir=), and nothing is written.
source "${top_srcdir:-.}/tests/functions.sh"
requires qemu-img qemu-io qemu-nbd nbdinfo nbdcopy
requires_nbd_python

cd "$TMPDIR_TEST"
BITMAPS=("$PYTHON" "$top_srcdir/tests/bitmaps.py")
M=$((1 << 20))

# The image: 64 MiB, 64 KiB clusters.  "stale" is left in use by qemu's
# crash (then made consistent in every other way by qemu-img check);
# "frozen" got bits while enabled and was then disabled.
qemu-img create -q -f qcow2 base.qcow2 64M
qemu-img bitmap --add base.qcow2 stale
qemu-io -c 'write -P 0x11 0 64k' -c 'sigraise 9' base.qcow2 > /dev/null 2>&1 || true
qemu-img check -q -r all base.qcow2
qemu-img bitmap --add base.qcow2 daily
qemu-img bitmap --add -g 1M base.qcow2 coarse
qemu-img bitmap --add -g 512 base.qcow2 fine
qemu-img bitmap --add base.qcow2 frozen
qemu-io -c 'write -P 0x22 3M 100k' -c 'write -P 0x23 40M 1k' base.qcow2 > /dev/null
qemu-img bitmap --disable base.qcow2 frozen
TRACKED="daily coarse fine"

# bitmap_info IMAGE: name, flags and granularity of each bitmap, one a line.
bitmap_info ()
{
    qemu-img info --output=json "$1" | "$PYTHON" -c '
import json, sys
for b in json.load(sys.stdin)["format-specific"]["data"].get("bitmaps", []):
    print(b["name"], ",".join(b["flags"]), b["granularity"])'
}
# bitmap_map IMAGE NAME: the dirty map qemu-nbd -B serves.
bitmap_map ()
{
    nbdinfo --map="qemu:dirty-bitmap:$2" -- [ qemu-nbd -r -B "$2" -f qcow2 "$1" ]
}
digests ()
{
    "${BITMAPS[@]}" "$1" digest frozen
    "${BITMAPS[@]}" "$1" digest stale
}

[ "$(bitmap_info base.qcow2 | grep -c in-use)" = 1 ] || fail "the base image should have one bitmap in use"
bitmap_map base.qcow2 stale > /dev/null 2> stale.err && fail "qemu served the bitmap in use"
grep -q inconsistent stale.err || { cat stale.err; fail "qemu did not call the bitmap in use inconsistent"; }
base_digests=$(digests base.qcow2)

# ops SEED [BASE SPAN]: writes of every size (whole and part granules of
# each bitmap), zeroes and discards, and flushes, one a line, inside
# [BASE, BASE+SPAN) (the whole disk by default):
# "w OFFSET LENGTH PATTERN", "z OFFSET LENGTH", "t OFFSET LENGTH", "f".
ops ()
{
    "$PYTHON" - "$1" "${2:-0}" "${3:-$((64 * M))}" <<'EOF'
import random, sys
rng = random.Random(int(sys.argv[1]))
base, size = int(sys.argv[2]), int(sys.argv[3])
for i in range(40):
    kind = rng.choice("wwwwzt")
    n = rng.choice([1, 511, 512, 4096, 65536, 65537, 300000, 1 << 20, 3 << 20])
    off = base + rng.randrange(0, size - n)
    if rng.randrange(3) == 0:
        off -= off % 65536
    print(kind, off, n, rng.randrange(1, 255) if kind == "w" else "")
    if i % 7 == 6:
        print("f")
EOF
}

# same_as_qemu LABEL OURS QEMUS: the bitmaps, their maps, the data.
same_as_qemu ()
{
    local label=$1 ours=$2 theirs=$3 b
    qemu-img check "$ours" > check.out 2>&1 ||
        { cat check.out; echo "----- the last server's log"; cat "$PWD/sock.log"; fail "$label: qemu-img check"; }
    [ "$(bitmap_info "$ours")" = "$(bitmap_info "$theirs")" ] || {
        bitmap_info "$ours"; echo "qemu-io:"; bitmap_info "$theirs"
        fail "$label: qemu-img info lists other bitmaps"
    }
    for b in $TRACKED frozen; do
        bitmap_map "$ours" $b > ours.map
        bitmap_map "$theirs" $b > theirs.map
        cmp -s ours.map theirs.map || {
            diff ours.map theirs.map | head -20
            fail "$label: bitmap $b: the map differs from qemu's"
        }
    done
    qemu-img compare -q "$ours" "$theirs" || fail "$label: the data differs from qemu's"
    [ "$(digests "$ours")" = "$base_digests" ] ||
        fail "$label: the disabled bitmap or the one in use changed on disk"
    echo "$label: $(bitmap_info "$ours" | wc -l) bitmaps as qemu lists them, the maps of $TRACKED frozen as qemu's ($(wc -l < ours.map) ranges in frozen's), frozen and stale byte for byte unchanged, check clean"
}

# 1. Two filter sessions against qemu-io: the second marks the bitmaps
# in use again before its first write.
cp base.qcow2 ours.qcow2
cp base.qcow2 theirs.qcow2
truncate -s +16M ours.qcow2
for seed in 1 2; do
    ops $seed > ops.$seed
    start_server "$PWD/sock" file ours.qcow2
    apply_ops_nbd "$(nbd_uri "$PWD/sock")" < ops.$seed
    stop_server
    apply_ops_qemu_io theirs.qcow2 < ops.$seed
    [ "$(bitmap_info ours.qcow2 | grep -c in-use)" = 1 ] || fail "session $seed: a tracked bitmap was left in use"
    same_as_qemu "filter, session $seed ($(wc -l < ops.$seed) operations)" ours.qcow2 theirs.qcow2
done
daily=$(bitmap_map ours.qcow2 daily | awk '$3 == 1 { n += $2 } END { print n }')
echo "daily marks $daily dirty bytes after both sessions"
[ "$daily" -gt $((8 * M)) ] || fail "the workload dirtied too little to tell"

# 2. The plugin form, on the same two images.
ops 3 > ops.3
start_nbdkit "$PWD/sock" "$PLUGIN" ours.qcow2
apply_ops_nbd "$(nbd_uri "$PWD/sock")" < ops.3
stop_server
apply_ops_qemu_io theirs.qcow2 < ops.3
same_as_qemu "plugin form" ours.qcow2 theirs.qcow2

# 3. Four connections at once, each in its own quarter of the disk,
# writing and flushing while the others do: the bits of all of them, as
# qemu-io marks them one list after the other.
for k in 0 1 2 3; do ops $((10 + k)) $((k * 16 * M)) $((16 * M)) > ops.c$k; done
truncate -s +48M ours.qcow2
start_server "$PWD/sock" file ours.qcow2
pids=()
for k in 0 1 2 3; do
    apply_ops_nbd "$(nbd_uri "$PWD/sock")" < ops.c$k & pids+=($!)
done
for pid in "${pids[@]}"; do
    wait "$pid" || fail "a connection of the four failed"
done
stop_server
cat ops.c0 ops.c1 ops.c2 ops.c3 | apply_ops_qemu_io theirs.qcow2
same_as_qemu "4 connections at once" ours.qcow2 theirs.qcow2

# 4. Writable, but only read: not a byte changes.
sum=$(sha256sum < ours.qcow2)
start_server "$PWD/sock" file ours.qcow2
nbdcopy "$(nbd_uri "$PWD/sock")" /dev/null
stop_server
[ "$(sha256sum < ours.qcow2)" = "$sum" ] || fail "a session that only read changed the image"
echo "a writable session that only read: the image unchanged"

# 5. kill -9 after writes and a flush, with the client still connected
# (its leaving would close the image cleanly): the tracked bitmaps stay
# in use, qemu calls them inconsistent; the others are as they were.
cp ours.qcow2 killed.qcow2
start_server "$PWD/sock" file killed.qcow2
"$PYTHON" -c '
import nbd, os, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pwrite(b"\x5a" * 70000, 9 << 20)
h.flush()
h.pwrite(b"\x5b" * 4096, 30 << 20)
os.kill(int(sys.argv[2]), 9)' "$(nbd_uri "$PWD/sock")" "$SERVER_PID" ||
    { cat "$PWD/sock.log"; fail "the writes before kill -9 failed"; }
server_killed
info=$(bitmap_info killed.qcow2)
for b in $TRACKED; do
    grep -q "^$b in-use,auto " <<<"$info" || fail "after kill -9: $b is not in use"
    bitmap_map killed.qcow2 $b > /dev/null 2> killed.err && fail "after kill -9: qemu served $b"
    grep -q "inconsistent" killed.err || { cat killed.err; fail "after kill -9: qemu did not call $b inconsistent"; }
done
grep -q "^frozen  65536" <<<"$info" || fail "after kill -9: frozen changed"
[ "$(digests killed.qcow2)" = "$base_digests" ] || fail "after kill -9: frozen or stale changed on disk"
qemu-img check killed.qcow2 > check.out 2>&1 || [ $? = 3 ] || { cat check.out; fail "after kill -9: qemu-img check"; }
echo "kill -9: qemu reports $TRACKED inconsistent, frozen and stale unchanged"

# 6. nbdkit stopped (SIGTERM) while the client is still connected:
# nbdkit 1.32 then skips the plugin's close, and the plugin's unload
# finishes the image instead; the filter finishes it as it finalizes.
# Both leave the bitmaps consistent, with the writes marked, and no leak.
for form in filter plugin; do
    cp base.qcow2 stopped.qcow2
    truncate -s +4M stopped.qcow2
    if [ $form = filter ]; then
        start_server "$PWD/sock" file stopped.qcow2
    else
        start_nbdkit "$PWD/sock" "$PLUGIN" stopped.qcow2
    fi
    "$PYTHON" -c '
import nbd, os, sys, time
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pwrite(b"\x5c" * 70000, 9 << 20)
h.flush()
h.pwrite(b"\x5d" * 512, 30 << 20)
os.kill(int(sys.argv[2]), 15)
# nbdkit is quitting before the connection ends, which it waits for.
time.sleep(1)' "$(nbd_uri "$PWD/sock")" "$SERVER_PID" ||
        { cat "$PWD/sock.log"; fail "$form: the writes before SIGTERM failed"; }
    stop_server
    info=$(bitmap_info stopped.qcow2)
    [ "$(grep in-use <<<"$info" | cut -d' ' -f1)" = stale ] ||
        { echo "$info"; fail "$form, SIGTERM: a tracked bitmap was left in use"; }
    qemu-img check stopped.qcow2 > check.out 2>&1 || { cat check.out; fail "$form, SIGTERM: qemu-img check"; }
    marked=$(bitmap_map stopped.qcow2 daily | awk '$3 == 1 { print $1 }' | tr '\n' ' ')
    [[ " $marked " == *" 9437184 "* ]] && [[ " $marked " == *" 31457280 "* ]] ||
        fail "$form, SIGTERM: daily does not mark the writes ($marked)"
    echo "$form, SIGTERM with the client connected: the bitmaps consistent, the writes marked, check clean"
done

# 7. Bitmaps that cannot be kept: dropped as before, with the reason.
for bad in "flags 0x6 has unknown flags 0x4" "type 2 is of unknown type 2"; do
    read -r field value reason <<<"$bad"
    cp base.qcow2 bad.qcow2
    truncate -s +16M bad.qcow2
    "${BITMAPS[@]}" bad.qcow2 set frozen "$field" "$value"
    start_server "$PWD/sock" file bad.qcow2
    apply_ops_nbd "$(nbd_uri "$PWD/sock")" < ops.1
    stop_server
    grep -q "bitmap 'frozen' $reason: they cannot be kept valid" "$PWD/sock.log" ||
        { cat "$PWD/sock.log"; fail "$field $value: no reason in the log"; }
    [ "$("${BITMAPS[@]}" bad.qcow2 autoclear)" = 0 ] || fail "$field $value: autoclear bit 0 kept"
    [ -z "$(bitmap_info bad.qcow2 2> /dev/null)" ] || fail "$field $value: qemu still lists bitmaps"
    qemu-img check bad.qcow2 > check.out 2>&1 || [ $? = 3 ] || { cat check.out; fail "$field $value: qemu-img check"; }
    echo "bitmap that $reason: dropped as before; the log says: $(grep -o "persistent bitmaps: [^;]*" "$PWD/sock.log" | head -1)"
done

# 8. A bitmap table outside the file, or on top of the refcount table
# (whose entries it then reads as valid ones): writing refused, nothing
# written; reading still works.
for bad in "eof+65536 lies outside the file" \
           "refcount-table overlaps the refcount table"; do
    read -r value message <<<"$bad"
    cp base.qcow2 bad.qcow2
    "${BITMAPS[@]}" bad.qcow2 set daily table_offset "$value"
    sum=$(sha256sum < bad.qcow2)
    # Over the file plugin with file=, at start-up.
    if run_nbdkit -U - --filter="$FILTER" file bad.qcow2 --run true 2> start.err; then
        fail "table at $value: nbdkit started to write it"
    fi
    grep -q "persistent bitmaps: bitmap 'daily'.*$message" start.err ||
        { cat start.err; fail "table at $value: no '$message' at start-up"; }
    # With dir=, when a client names it.
    start_server "$PWD/sock" file dir="$PWD"
    nbdinfo "nbd+unix:///bad.qcow2?socket=$PWD/sock" > /dev/null 2>&1 && fail "table at $value: opened for writing"
    stop_server
    said=$(grep -o "persistent bitmaps: bitmap 'daily'.*$message[^;]*" "$PWD/sock.log" | head -n 1) ||
        { cat "$PWD/sock.log"; fail "table at $value: no '$message' in the log"; }
    [ "$(sha256sum < bad.qcow2)" = "$sum" ] || fail "table at $value: the image changed"
    start_server "$PWD/sock" -r file bad.qcow2
    nbdcopy "$(nbd_uri "$PWD/sock")" bad.raw
    stop_server
    echo "table at $value: $said; nothing written, readable with -r"
done
