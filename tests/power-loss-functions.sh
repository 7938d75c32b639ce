# SPDX-License-Identifier: BSD-3-Clause
# The power-loss harness for the shell tests: serve an image so that
# every write, flush and discard that reaches its storage is logged, in
# device order with what was in flight, run a client workload that sends
# its requests in batches over several connections and keeps a shadow of
# what returned, and check the crash states rebuilt from the log.
# Source it after functions.sh.
#
#   power_loss_run NAME FORM IMAGE WORKLOAD CLUSTER SEED SPAN [SERVER-ARGS...]
#       Copies IMAGE (or notes that it does not exist) to NAME.initial,
#       serves IMAGE in FORM (filter: the filter over tests/record-plugin,
#       which logs; plugin: the plugin form with tests/record-shim
#       preloaded into nbdkit, which logs what the plugin does to IMAGE;
#       either holds each change in flight up to POWER_LOSS_DELAY_US
#       microseconds longer, default 2000, so that requests overlap),
#       runs tests/power-loss-workload.py WORKLOAD (CLUSTER SEED SPAN)
#       against it and stops the server.  Leaves NAME.log, NAME.shadow.
#   power_loss_check NAME VIRTUAL-SIZE [CHECKER-ARGS...]
#       Runs tests/power-loss-check.py on what power_loss_run left; it
#       prints the number of crash states checked, and fails the test if
#       any is corrupt or lost flushed data.
#   power_loss_self_check NAME VIRTUAL-SIZE [CHECKER-ARGS...]
#       The same log checked by a replay that ignores the device's
#       flushes: the checker must find durable data lost (else the check
#       is blind, and the test fails).  Call it before power_loss_check,
#       which removes what the run left.
#
#   power_loss_base_raw FILE
#       Writes an 8 MiB disk of text and random sectors (write id 0, as
#       tests/powerloss.py makes them) with holes to FILE.
#
# For another write path, reuse both: a workload of its own (a new entry
# of power-loss-workload.py, or any client that writes the shadow log of
# tests/powerloss.py) and the same check.

RECORD_PLUGIN=$top_builddir/tests/.libs/record-plugin.so
RECORD_SHIM=$top_builddir/tests/.libs/record-shim.so
[ -f "$RECORD_PLUGIN" ] && [ -f "$RECORD_SHIM" ] ||
    fail "the power-loss harness is not built ($RECORD_PLUGIN, $RECORD_SHIM)"

power_loss_run ()
{
    local name=$1 form=$2 image=$3 workload=$4 cluster=$5 seed=$6 span=$7
    shift 7
    local log=$PWD/$name.log sock=$PWD/$name.sock
    image=$(realpath -m "$image")

    rm -f "$log" "$name.shadow" "$name.initial"
    if [ -e "$image" ]; then cp --sparse=always "$image" "$name.initial"; fi
    : > "$log"
    case $form in
        filter)
            start_server "$sock" "$RECORD_PLUGIN" file="$image" log="$log" \
                delay-us="${POWER_LOSS_DELAY_US:-2000}" "$@" ;;
        plugin)
            # The shim goes after whatever the environment preloads (the
            # sanitizers' runtime must come first).
            local saved=("${NBDKIT_ENV[@]}") i found=
            for i in "${!NBDKIT_ENV[@]}"; do
                case ${NBDKIT_ENV[$i]} in
                    LD_PRELOAD=*) NBDKIT_ENV[$i]="${NBDKIT_ENV[$i]} $RECORD_SHIM"; found=1 ;;
                esac
            done
            if [ -z "$found" ]; then
                if [ "${NBDKIT_ENV[0]:-}" = env ]; then
                    NBDKIT_ENV=(env "LD_PRELOAD=$RECORD_SHIM" "${NBDKIT_ENV[@]:1}")
                else
                    NBDKIT_ENV=(env "LD_PRELOAD=$RECORD_SHIM" "${NBDKIT_ENV[@]}")
                fi
            fi
            NBDKIT_ENV=(env "RECORD_FILE=$image" "RECORD_LOG=$log"
                        "RECORD_DELAY_US=${POWER_LOSS_DELAY_US:-2000}" "${NBDKIT_ENV[@]}")
            start_nbdkit "$sock" "$PLUGIN" "$image" "$@"
            NBDKIT_ENV=("${saved[@]}") ;;
        *) fail "power_loss_run: unknown form $form" ;;
    esac
    "$PYTHON" "$top_srcdir/tests/power-loss-workload.py" "$workload" \
        "$(nbd_uri "$sock")" "$log" "$PWD/$name.shadow" "$cluster" "$seed" "$span" ||
        { cat "$sock.log"; fail "$name: the workload failed"; }
    stop_server
    if grep -E 'AddressSanitizer|runtime error' "$sock.log" >&2; then
        fail "$name: the sanitizers found errors in the server"
    fi
}

power_loss_check ()
{
    local name=$1 size=$2
    shift 2
    local initial=none
    [ -e "$name.initial" ] && initial=$name.initial
    mkdir -p "$name.states"
    "$PYTHON" "$top_srcdir/tests/power-loss-check.py" --name "$name" \
        --log "$name.log" --shadow "$name.shadow" --initial "$initial" \
        --size "$size" --workdir "$name.states" "$@" ||
        fail "$name: crash states failed the check (see above)"
    rm -rf "$name.states"
}

power_loss_self_check ()
{
    local name=$1 size=$2
    shift 2
    local initial=none
    [ -e "$name.initial" ] && initial=$name.initial
    mkdir -p "$name.self-check"
    "$PYTHON" "$top_srcdir/tests/power-loss-check.py" --name "$name" \
        --log "$name.log" --shadow "$name.shadow" --initial "$initial" \
        --size "$size" --workdir "$name.self-check" "$@" --self-check ||
        fail "$name: the checker found nothing wrong with a replay that ignores device flushes"
    rm -rf "$name.self-check"
}

power_loss_base_raw ()
{
    "$PYTHON" - "$top_srcdir/tests" "$1" <<'EOF'
import random, sys
sys.path.insert(0, sys.argv[1])
from powerloss import write_data
rng = random.Random(7)
out = bytearray()
for c in range(128):
    kind = rng.randrange(4)
    if kind == 0:
        out += bytes(65536)
    else:
        out += write_data(0, c * 65536, 65536, kind != 3)
open(sys.argv[2], "wb").write(out)
EOF
}
