# SPDX-License-Identifier: BSD-3-Clause
# shellcheck shell=bash
# Helpers of the crash tests (test-crash.sh for the filter,
# test-plugin-durability.sh for the plugin): a run of
# tests/crash-workload.py killed with SIGKILL at a chosen point, and the
# checks of the image afterwards.  Sourced after functions.sh, in
# $TMPDIR_TEST.

# make_base_raw MIB SEED TEXT: base.raw, the disk before the workload:
# MIB MiB of random runs and runs of TEXT repeated.
make_base_raw ()
{
    $PYTHON - "$@" <<'EOF'
import random, sys
mib, seed, text = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].encode()
rng = random.Random(seed)
size = mib << 20
out = bytearray()
while len(out) < size:
    n = rng.randrange(1000, 200000)
    out += rng.randbytes(n) if rng.randrange(2) else (text * (n // len(text) + 1))[:n]
open("base.raw", "wb").write(out[:size])
EOF
}

# kill_round ROUND K MODE DELAY: with the server started last serving
# on $PWD/sock, run the crash workload (seed ROUND, MODE mixed or fua)
# until it has made K operations durable (the K-th "F" or "D" in its
# log) or reached the end of the disk, wait DELAY seconds more, kill -9
# the server and check that the client was working until then and died
# of the kill.  Sets WHEN (mid-workload or after the workload).
# durable_points: the "F" and "D" lines the client has logged so far.
durable_points ()
{
    local n
    n=$(grep -c '^[FD]' log.txt 2>/dev/null || true)
    echo "${n:-0}"
}

kill_round ()
{
    local round=$1 k=$2 mode=$3 delay=$4 i status
    rm -f log.txt client.out
    $PYTHON "$top_srcdir/tests/crash-workload.py" client "$(nbd_uri "$PWD/sock")" \
        "$round" log.txt "$mode" > client.out 2>&1 &
    local client=$!
    for (( i = 0; i < 1200; i++ )); do
        [ "$(durable_points)" -lt "$k" ] || break
        ! grep -q '^DONE' log.txt 2>/dev/null || break
        if ! _alive "$client"; then
            status=0; wait "$client" || status=$?
            cat client.out
            fail "round $round: the client ended (status $status) before the kill, after $(grep -c '^A' log.txt || true) operations"
        fi
        sleep 0.05
    done
    [ "$(durable_points)" -ge "$k" ] || grep -q '^DONE' log.txt ||
        fail "round $round: the client made no $k operations durable in 60 s"
    # A few milliseconds more, so that the kill lands at various stages
    # of the writes, allocations and metadata writeback that follow.
    sleep "$delay"
    kill_server
    status=0
    wait "$client" || status=$?
    # 3: the client saw the connection go, in the middle of its work.
    [ "$status" = 3 ] || { cat client.out; fail "round $round: the client ended with status $status, not by the kill"; }
    if grep -q '^DONE' log.txt; then WHEN="after the workload"; else WHEN="mid-workload"; fi
}

# check_after_kill IMAGE WHAT: qemu-img check finds no corruption (leaks
# allowed: clusters allocated for writes that did not complete), and the
# disk qemu reads holds every durable operation and nothing else
# changed.  Sets RESULT.
check_after_kill ()
{
    local img=$1 what=$2 rc=0
    qemu-img check "$img" > check.out 2>&1 || rc=$?
    # 0: clean; 3: leaks only.  2 means corruption, 1 a check failure.
    if [ "$rc" != 0 ] && [ "$rc" != 3 ]; then
        cat check.out
        fail "$what: qemu-img check exit $rc after kill -9"
    fi
    ! grep -q "ERROR" check.out || { cat check.out; fail "$what: errors after kill -9"; }
    rm -f after.raw
    qemu-img convert -O raw "$img" after.raw
    RESULT=$($PYTHON "$top_srcdir/tests/crash-workload.py" verify after.raw base.raw log.txt 2>&1) ||
        fail "$what: $RESULT"
    RESULT="check ok ($(grep -o '[0-9]* leaked clusters' check.out || echo "no leaks")); $RESULT"
}
