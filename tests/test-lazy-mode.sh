#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# qcow2-lazy-refcounts=on (issue 28 part 4, the mode; not in TESTS until
# the engine has it).  The dirty bit is set, durably, before the first
# allocating write and the refcounts stay in memory until the close, which
# writes them and clears the bit: afterwards qemu-img check is clean and
# qemu reads what a raw mirror holds, for the filter and the plugin,
# plain and compressed.  A session killed with kill -9 leaves the bit
# set; the next open (the filter's) repairs the image, which then holds
# every write a flush covered.  The power-loss harness with the mode on:
# every crash state is repaired by the filter's own open and then holds
# what every returned flush made durable.  Without the mode nothing
# changes (the bit is never set).  A version 2 image, or a value that
# is not a boolean, stops nbdkit at start-up with the reason.
source "${top_srcdir:-.}/tests/functions.sh"
source "$top_srcdir/tests/power-loss-functions.sh"
requires qemu-img qemu-io nbdcopy
requires_nbd_python
[ -f "$PLUGIN" ] || fail "the plugin is not built: $PLUGIN"

cd "$TMPDIR_TEST"
M=$((1 << 20))

serve ()
{
    local form=$1 img=$2
    shift 2
    if [ "$form" = filter ]; then
        start_server "$PWD/sock" file "$img" "$@"
    else
        start_nbdkit "$PWD/sock" "$PLUGIN" "$img" "$@"
    fi
}
check_clean ()
{
    qemu-img check "$1" > check.out 2>&1 || { cat check.out; fail "$2: qemu-img check"; }
    grep -qi leak check.out && { cat check.out; fail "$2: leaked clusters"; }
    image_dirty "$1" && fail "$2: the dirty bit is still set"
    return 0
}

for compress in false true; do
    for form in filter plugin; do
        label="$form, qcow2-compress=$compress"
        rm -f img.qcow2
        qemu-img create -q -f qcow2 img.qcow2 8M
        [ $form = filter ] && truncate -s +32M img.qcow2
        qemu-img convert -O raw img.qcow2 mirror.raw
        serve $form img.qcow2 qcow2-lazy-refcounts=on qcow2-compress=$compress
        "$PYTHON" -c '
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pread(4096, 0)
open(sys.argv[2] + ".before", "w").write("%d" % (open(sys.argv[2], "rb").read()[79] & 1))
h.pwrite(b"a" * 70000, 1 << 20)
open(sys.argv[2] + ".during", "w").write("%d" % (open(sys.argv[2], "rb").read()[79] & 1))
h.flush()
h.shutdown()
with open(sys.argv[3], "r+b") as f:
    f.seek(1 << 20)
    f.write(b"a" * 70000)' "$(nbd_uri "$PWD/sock")" img.qcow2 mirror.raw
        $PYTHON "$top_srcdir/tests/write-workload.py" "$(nbd_uri "$PWD/sock")" \
            mirror.raw 21 3 300 65536 > workload.out ||
            { cat workload.out "$PWD/sock.log"; fail "$label: the workload failed"; }
        stop_server
        [ "$(cat img.qcow2.before)" = 0 ] || fail "$label: the dirty bit was set before the first write"
        [ "$(cat img.qcow2.during)" = 1 ] || fail "$label: the dirty bit was not set by the first allocating write"
        check_clean img.qcow2 "$label"
        qemu-img compare -q -f qcow2 -F raw img.qcow2 mirror.raw || fail "$label: qemu reads other data than the mirror"
        echo "$label: dirty while written, clean after the close, check clean, the mirror's data"
    done
done

# kill -9: the bit stays, the next open repairs, flushed writes are there.
rm -f img.qcow2
qemu-img create -q -f qcow2 img.qcow2 8M
truncate -s +16M img.qcow2
serve filter img.qcow2 qcow2-lazy-refcounts=on
"$PYTHON" -c '
import nbd, os, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pwrite(b"k" * 300000, 2 << 20)
h.flush()
h.pwrite(b"l" * 5000, 6 << 20)
os.kill(int(sys.argv[2]), 9)' "$(nbd_uri "$PWD/sock")" "$SERVER_PID"
server_killed
image_dirty img.qcow2 || fail "after kill -9: the dirty bit is clear"
serve filter img.qcow2
nbdcopy "$(nbd_uri "$PWD/sock")" got.raw
stop_server
check_clean img.qcow2 "after kill -9 and the repair"
"$PYTHON" -c '
import sys
d = open(sys.argv[1], "rb").read()
sys.exit(0 if d[2 << 20:(2 << 20) + 300000] == b"k" * 300000 else 1)' got.raw ||
    fail "after kill -9: a flushed write is lost"
echo "kill -9 in lazy mode: dirty, repaired by the next open, the flushed write there"

# Without the mode the bit is never set (the default).
rm -f img.qcow2
qemu-img create -q -f qcow2 img.qcow2 8M
truncate -s +8M img.qcow2
serve filter img.qcow2
"$PYTHON" -c '
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1]); h.pwrite(b"x" * 70000, 0)
sys.exit(open(sys.argv[2], "rb").read()[79] & 1)' "$(nbd_uri "$PWD/sock")" img.qcow2 ||
    fail "the dirty bit was set without qcow2-lazy-refcounts"
stop_server
echo "without the mode: the dirty bit never set"

# Refused, with the reason and nothing written: a version 2 image (qemu
# too refuses lazy refcounts there) and a value that is not a boolean.
rm -f v2.qcow2
qemu-img create -q -f qcow2 -o compat=0.10 v2.qcow2 8M
truncate -s +8M v2.qcow2
sum_before=$(md5sum < v2.qcow2)
for form in filter plugin; do
    if [ $form = filter ]; then
        args=(--filter="$FILTER" file v2.qcow2)
    else
        args=("$PLUGIN" v2.qcow2)
    fi
    for bad in "qcow2-lazy-refcounts=on:Lazy refcounts require a qcow2 image with at least qemu 1.1 compatibility level (this image is version 2" \
               "qcow2-lazy-refcounts=maybe:qcow2-lazy-refcounts: 'maybe' is not a boolean"; do
        if "${NBDKIT_ENV[@]}" nbdkit -U - "${args[@]}" "${bad%%:*}" \
               --run 'nbdinfo --size "$uri"' > refused.out 2>&1; then
            cat refused.out; fail "$form, ${bad%%:*}: nbdkit served"
        fi
        grep -qF "${bad#*:}" refused.out || { cat refused.out; fail "$form, ${bad%%:*}: not the message"; }
    done
done
[ "$(md5sum < v2.qcow2)" = "$sum_before" ] || fail "a refused start changed the image"
echo "refused at start-up with the reason, the image unchanged: a version 2 image, a bad boolean"

# The power-loss harness with the mode on, both forms.
for form in filter plugin; do
    name=$form-lazy
    rm -f img.qcow2
    qemu-img create -q -f qcow2 -o cluster_size=65536 img.qcow2 8M
    [ $form = filter ] && truncate -s +12M img.qcow2
    so=$FILTER
    [ $form = plugin ] && so=$PLUGIN
    env_args=()
    for e in "${NBDKIT_ENV[@]}"; do env_args+=("--nbdkit-env=$e"); done
    power_loss_run $name $form img.qcow2 random 65536 12 0 qcow2-lazy-refcounts=on
    power_loss_check $name $((8 * M)) --states "${POWER_LOSS_STATES:-90}" --seed 12 \
        --repair-dirty "$form=$so" "${env_args[@]}"
done
