# SPDX-License-Identifier: BSD-3-Clause
# The power-loss harness for the shell tests: serve an image so that
# every write, flush and discard that reaches its storage is logged, in
# device order with what was in flight, run a client workload that sends
# its requests in batches over several connections and keeps a shadow of
# what returned, and check the crash states rebuilt from the log.
# Source it after functions.sh.
#
#   power_loss_run [--data-file DATA] NAME FORM IMAGE WORKLOAD CLUSTER SEED
#                  SPAN [SERVER-ARGS...]
#       Copies IMAGE (or notes that it does not exist) to NAME.initial,
#       serves IMAGE in FORM (filter: the filter over tests/record-plugin,
#       which logs; plugin: the plugin form with tests/record-shim
#       preloaded into nbdkit, which logs what the plugin does to IMAGE;
#       either holds each change in flight up to POWER_LOSS_DELAY_US
#       microseconds longer, default 2000, so that requests overlap),
#       runs tests/power-loss-workload.py WORKLOAD (CLUSTER SEED SPAN)
#       against it and stops the server.  Leaves NAME.log, NAME.shadow.
#       --data-file DATA: IMAGE has an external data file, DATA (which
#       the engine opens itself, by the name in IMAGE's header): it is
#       copied to NAME.initial-data, and tests/record-shim logs both
#       files in one log, in either form (filter: the filter over
#       nbdkit's file plugin, with the shim preloaded into nbdkit).
#   power_loss_check NAME VIRTUAL-SIZE [CHECKER-ARGS...]
#       Runs tests/power-loss-check.py on what power_loss_run left (with
#       the data file's, if it had one); it prints the number of crash
#       states checked, and fails the test if any is corrupt or lost
#       flushed data.
#   power_loss_self_check NAME VIRTUAL-SIZE [CHECKER-ARGS...]
#       The same log checked by a replay that ignores the device's
#       flushes: the checker must find durable data lost (else the check
#       is blind, and the test fails).  CHECKER-ARGS may end with
#       --self-check data-file: only the data file's flushes ignored.
#       Call it before power_loss_check, which removes what the run left.
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

# _power_loss_shim LOG FILE [FILE2]: NBDKIT_ENV with tests/record-shim
# preloaded, logging FILE (and FILE2) to LOG.  The shim goes after
# whatever the environment preloads (the sanitizers' runtime must come
# first).  The caller saves NBDKIT_ENV first and restores it.
_power_loss_shim ()
{
    local i found=
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
    NBDKIT_ENV=(env "RECORD_FILE=$2" ${3:+"RECORD_FILE2=$3"} "RECORD_LOG=$1"
                "RECORD_DELAY_US=${POWER_LOSS_DELAY_US:-2000}" "${NBDKIT_ENV[@]}")
}

power_loss_run ()
{
    local data=
    if [ "$1" = --data-file ]; then
        data=$(realpath -e "$2") || fail "power_loss_run: no data file $2"
        shift 2
    fi
    local name=$1 form=$2 image=$3 workload=$4 cluster=$5 seed=$6 span=$7
    shift 7
    local log=$PWD/$name.log sock=$PWD/$name.sock
    local saved=("${NBDKIT_ENV[@]}")
    image=$(realpath -m "$image")

    rm -f "$log" "$name.shadow" "$name.initial" "$name.initial-data"
    if [ -e "$image" ]; then cp --sparse=always "$image" "$name.initial"; fi
    [ -z "$data" ] || cp --sparse=always "$data" "$name.initial-data"
    : > "$log"
    case $form in
        filter)
            if [ -n "$data" ]; then
                # Both files in one log: the shim sees the file plugin's
                # calls on the image and the engine's on the data file.
                _power_loss_shim "$log" "$image" "$data"
                start_server "$sock" file "$image" "$@"
            else
                start_server "$sock" "$RECORD_PLUGIN" file="$image" log="$log" \
                    delay-us="${POWER_LOSS_DELAY_US:-2000}" "$@"
            fi ;;
        plugin)
            _power_loss_shim "$log" "$image" "$data"
            start_nbdkit "$sock" "$PLUGIN" "$image" "$@" ;;
        *) fail "power_loss_run: unknown form $form" ;;
    esac
    NBDKIT_ENV=("${saved[@]}")
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
    local initial=none data=()
    [ -e "$name.initial" ] && initial=$name.initial
    [ -e "$name.initial-data" ] && data=(--initial-data "$name.initial-data")
    mkdir -p "$name.states"
    "$PYTHON" "$top_srcdir/tests/power-loss-check.py" --name "$name" \
        --log "$name.log" --shadow "$name.shadow" --initial "$initial" \
        "${data[@]}" --size "$size" --workdir "$name.states" "$@" ||
        fail "$name: crash states failed the check (see above)"
    rm -rf "$name.states"
}

power_loss_self_check ()
{
    local name=$1 size=$2
    shift 2
    local initial=none data=()
    [ -e "$name.initial" ] && initial=$name.initial
    [ -e "$name.initial-data" ] && data=(--initial-data "$name.initial-data")
    mkdir -p "$name.self-check"
    # The caller's --self-check data-file, if any, comes last and wins.
    "$PYTHON" "$top_srcdir/tests/power-loss-check.py" --name "$name" \
        --log "$name.log" --shadow "$name.shadow" --initial "$initial" \
        "${data[@]}" --size "$size" --workdir "$name.self-check" \
        --self-check "$@" ||
        fail "$name: the self-check failed (above: the checker found no flushed data lost when the replay ignores flushes, or could not run)"
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
