#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The registry of images (nbdkit-glue/registry.c): one image per export,
# and no lock held across an image's open.  The filter serves two
# exports of a plugin (nbdkit's eval plugin over two image files) whose
# export "slow" answers no read until the test lets it: while the image
# of "slow" is being opened, a client of "fast" is served in full, and a
# second client of "slow" waits for the first one's open and then shares
# its image, which is opened once.  Deterministic: "fast" must be served
# before "slow" is let go, so a registry that held its lock across the
# open would never serve it (the client's time limit fails the test).
source "${top_srcdir:-.}/tests/functions.sh"
requires nbdcopy qemu-img qemu-io
requires_nbd_python

cd "$TMPDIR_TEST"
D=$PWD
qemu-img create -q -f qcow2 slow.qcow2 16M
qemu-io -f qcow2 -c "write -P 0x51 0 1M" slow.qcow2 > /dev/null
qemu-img create -q -f qcow2 fast.qcow2 8M
qemu-io -f qcow2 -c "write -P 0xfa 1M 1M" fast.qcow2 > /dev/null
qemu-img convert -O raw slow.qcow2 slow.raw
qemu-img convert -O raw fast.qcow2 fast.raw

# The plugin: the handle is the export's name; each open is logged; a
# read of "slow" waits for the file "go" (saying so with "slow-waiting").
# shellcheck disable=SC2016
start_server "$D/sock" -r -v -D qcow2zstd.image=1 eval \
    thread_model='echo parallel' \
    open='echo "$3" >> '"$D"'/opens.log; echo "$3"' \
    get_size='stat -L -c %s '"$D"'/"$2".qcow2' \
    pread='if [ "$2" = slow ] && [ ! -e '"$D"'/go ]; then
               : > '"$D"'/slow-waiting
               while [ ! -e '"$D"'/go ]; do sleep 0.05; done
           fi
           dd if='"$D"'/"$2".qcow2 iflag=skip_bytes,count_bytes skip="$4" count="$3" bs=1M status=none'

# wait_for WHAT CONDITION...: until the command succeeds.
wait_for ()
{
    local what=$1 i
    shift
    for (( i = 0; i < CALL_TIMEOUT * 20; i++ )); do
        "$@" && return 0
        sleep 0.05
    done
    fail "$what did not happen within $CALL_TIMEOUT s"
}
opens_of () { grep -c -x "$1" opens.log 2>/dev/null || true; }

# The first client of "slow": its connection opens the image, whose
# first read waits.
"$PYTHON" "$top_srcdir/tests/nbd-hold.py" "nbd+unix:///slow?socket=$D/sock" \
    hold.ready hold.stop 2> hold.err &
hold=$!
wait_for "the open of slow's image" test -e slow-waiting

# Meanwhile another export is served.
nbdcopy "nbd+unix:///fast?socket=$D/sock" fast.out ||
    { cat sock.log; fail "fast: not served while slow's image was opening"; }
cmp fast.raw fast.out || fail "fast: wrong data"
[ ! -e hold.ready ] || fail "slow: connected before its reads were let go"
echo "export fast served in full while the image of export slow was opening"

# A second client of "slow", connected while the open is still waiting.
nbdcopy --connections=1 "nbd+unix:///slow?socket=$D/sock" slow.out 2> copy.err &
copy=$!
# shellcheck disable=SC2016
wait_for "the second client of slow" eval '[ "$(opens_of slow)" -ge 2 ]'
: > go
wait "$copy" || { cat copy.err sock.log; fail "slow: the second client failed"; }
cmp slow.raw slow.out || fail "slow: wrong data"
wait_for "the first client of slow" test -e hold.ready
touch hold.stop
wait "$hold" || fail "slow: the first client failed: $(cat hold.err)"
stop_server

opened=$(grep -c "qcow2 v3, cluster size 65536, virtual size 16777216," sock.log || true)
[ "$opened" = 1 ] || { grep "virtual size" sock.log; fail "slow's image was opened $opened times"; }
echo "two clients of export slow, the second connected while the first one's open waited: one image, opened once, data as qemu reads it"
