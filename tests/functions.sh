# SPDX-License-Identifier: BSD-3-Clause
# Helpers sourced by the shell tests: starting and stopping nbdkit with
# the filter from the build tree, skipping when a tool is missing, and a
# scratch directory removed at exit.
#
# Every nbdkit a test starts is watched to its end.  A server that exits
# with anything but 0 after SIGTERM (a crash or an abort at shutdown, at
# a client's disconnect or at any time before), that does not exit
# within a time limit of SIGTERM (a hang in .unload), or whose log or
# sanitizer output shows an error, fails the test that started it, and
# so does a server still running when the test ends: the exit trap stops
# it the same way.  Runs in the foreground (run_nbdkit, --run) are timed
# and their exit status judged alike; a server nbdkit forks into the
# background is collected by tests/reaper.py.  Every client call
# (nbdcopy, nbdinfo, nbdsh, qemu-img, qemu-io, python3) has a time
# limit, and so has the whole test: a hang is a failure that names what
# hung, never a stuck make check.
#
# Variables set by the Makefile (TESTS_ENVIRONMENT); each has a default so
# that a test can also be run by hand from the top of the build tree:
#   FILTER        the built filter, .libs/nbdkit-qcow2zstd-filter.so
#   PLUGIN        the built plugin
#   top_srcdir, top_builddir
#   SANITIZERS=yes  the build has ASan + UBSan: nbdkit gets their runtimes
#   TSAN=yes        the build has ThreadSanitizer: nbdkit gets its runtime
#   VALGRIND=1      every server runs under valgrind
# Time limits, in seconds (doubled under valgrind and ThreadSanitizer):
#   QCOW2ZSTD_TEST_TIMEOUT  the whole test (default 1200)
#   QCOW2ZSTD_CALL_TIMEOUT  one client call or foreground nbdkit (300)
#   QCOW2ZSTD_STOP_TIMEOUT  a server's exit after SIGTERM (30)

set -euo pipefail

# Debian's python3-libnbd (nbdsh's nbd module) is installed for the
# system python; a python earlier in PATH (pyenv, venv) would lack it.
export PATH="/usr/bin:$PATH"

: "${top_builddir:=$(pwd)}"
: "${top_srcdir:=$top_builddir}"
: "${FILTER:=$top_builddir/filters/qcow2zstd/.libs/nbdkit-qcow2zstd-filter.so}"
: "${PLUGIN:=$top_builddir/plugins/qcow2zstd/.libs/nbdkit-qcow2zstd-plugin.so}"
export FILTER PLUGIN

# skip REASON: the whole test cannot run here (exit 77, counted and
# printed by .ci/run with REASON).
skip ()
{
    echo "SKIP: ${0##*/}: $*"
    exit 77
}

# skip_section REASON: one part of the test cannot run here; the rest
# goes on.  .ci/run counts and prints these lines.
skip_section ()
{
    echo "SKIP-SECTION: ${0##*/}: $*"
}

# section NAME: does this run include the part NAME of this test?  All
# parts run, unless QCOW2ZSTD_SECTIONS names some of this test's, as
# words TEST:GLOB (test-locking:overlap, test-power-loss:*-encrypted):
# then only the parts that one of its globs matches (the mutation check
# runs only the parts that claim a break).  A glob that matched no part
# by the end fails the test: a name that no longer exists cannot pass
# unseen.  Call it from the test's own shell, not from a subshell.
_test_base=${0##*/}
_test_base=${_test_base%.sh}
_section_globs=()
declare -A _section_hits=()
for _w in ${QCOW2ZSTD_SECTIONS:-}; do
    [[ $_w != "$_test_base":* ]] || _section_globs+=("${_w#*:}")
done
section ()
{
    local glob hit=1
    [ ${#_section_globs[@]} -gt 0 ] || return 0
    # Every glob that matches is marked, not only the first: two breaks'
    # globs may name the same part (*-create and filter-create).
    for glob in "${_section_globs[@]}"; do
        # shellcheck disable=SC2053
        if [[ $1 == $glob ]]; then
            _section_hits[$glob]=1
            hit=0
        fi
    done
    [ $hit != 0 ] || echo "=== section $1 (QCOW2ZSTD_SECTIONS)"
    return $hit
}

# Exit 77 (skip) with a reason unless every named command exists (as a
# program: the client commands below are also shell functions).
requires ()
{
    local cmd
    for cmd in "$@"; do
        type -P "$cmd" >/dev/null 2>&1 || skip "'$cmd' is not installed"
    done
}

requires nbdkit qemu-img timeout

if [ ! -f "$FILTER" ]; then
    echo "$0: the filter is not built: $FILTER" >&2
    exit 1
fi

# The test's own stderr (its log): failures are reported there even from
# a call whose stderr the test sends elsewhere (run_nbdkit ... 2> file).
exec {_TEST_STDERR}>&2

TMPDIR_TEST=$(mktemp -d "${TMPDIR:-/tmp}/qcow2zstd-test.XXXXXX")
# Sanitizer and valgrind reports of every nbdkit land here, whatever the
# test does with nbdkit's stderr (and a daemon has none).
_REPORTS=$TMPDIR_TEST/.reports
mkdir "$_REPORTS"

_slow=1
[ "${VALGRIND:-0}" = 1 ] && _slow=2
[ "${TSAN:-no}" = yes ] && _slow=2
TEST_TIMEOUT=$(( ${QCOW2ZSTD_TEST_TIMEOUT:-1200} * _slow ))
CALL_TIMEOUT=$(( ${QCOW2ZSTD_CALL_TIMEOUT:-300} * _slow ))
STOP_TIMEOUT=$(( ${QCOW2ZSTD_STOP_TIMEOUT:-30} * _slow ))

# tests/crash-report.c, preloaded into nbdkit: a process killed by a
# crash signal says so on stderr (nbdkit --run exits with the command's
# status whatever its server died of).
: "${CRASH_REPORT:=$top_builddir/tests/.libs/crash-report.so}"
_preload=
[ ! -f "$CRASH_REPORT" ] || _preload=$CRASH_REPORT
NBDKIT_ENV=()
[ -z "$_preload" ] || NBDKIT_ENV=(env "LD_PRELOAD=$_preload")

# Under --enable-sanitizers the filter needs the sanitizer runtimes loaded
# into nbdkit, which is not built with them.  An ASan error aborts nbdkit
# (status 134) and its report goes to $_REPORTS; UBSan's go to stderr.
# tests/asan-locale-fix.c goes with it: with libasan preloaded, nbdkit
# otherwise hangs in exit (in libp11-kit's destructor) after any error
# message that glibc translated.
: "${ASAN_LOCALE_FIX:=$top_builddir/tests/.libs/asan-locale-fix.so}"
if [ "${SANITIZERS:-no}" = yes ]; then
    [ ! -f "$ASAN_LOCALE_FIX" ] || _preload=${_preload:+$_preload:}$ASAN_LOCALE_FIX
    NBDKIT_ENV=(env
        "LD_PRELOAD=$(${CC:-gcc} -print-file-name=libasan.so)${_preload:+:$_preload}"
        "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:log_path=$_REPORTS/asan"
        "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
fi

# Under --enable-tsan (gcc's ThreadSanitizer) the same: nbdkit runs with
# the runtime preloaded, so that the filter's threads, locks and
# accesses are watched (nbdkit's own code is not: it is not built with
# it).  A report makes nbdkit exit 66 at its end (TSAN_OPTIONS from the
# Makefile) and lands in $_REPORTS: either fails the test.  libtsan
# preloaded leaves the same hang in exit as libasan: the locale fix too.
if [ "${TSAN:-no}" = yes ]; then
    [ ! -f "$ASAN_LOCALE_FIX" ] || _preload=${_preload:+$_preload:}$ASAN_LOCALE_FIX
    NBDKIT_ENV=(env
        "LD_PRELOAD=$(${CC:-gcc} -print-file-name=libtsan.so)${_preload:+:$_preload}"
        "TSAN_OPTIONS=${TSAN_OPTIONS:-} log_path=$_REPORTS/tsan")
fi

# VALGRIND=1 (make check-valgrind) runs every server under valgrind; a
# server that valgrind found an invalid access or a leak in exits 99.
if [ "${VALGRIND:-0}" = 1 ]; then
    requires valgrind
    NBDKIT_ENV=(valgrind --quiet --error-exitcode=99 --leak-check=full
                --errors-for-leak-kinds=definite --show-leak-kinds=definite
                --trace-children=no --child-silent-after-fork=yes
                "--log-file=$_REPORTS/valgrind.%p"
                "--suppressions=$top_srcdir/tests/valgrind.supp")
fi

# Every process a test starts inherits this tag.  The cleanup signals
# only processes that carry this test's tag: a pid recorded for a server
# stopped long ago may have been reused (pid_max is 32768 on Debian's
# default) by a process of a test running in parallel under make -j2,
# such as its nbdcopy, which would die of SIGTERM with no message.
QCOW2ZSTD_TEST_TAG="$$.$RANDOM.$RANDOM"
export QCOW2ZSTD_TEST_TAG

# Pids the cleanup kills, if still running (kept for the tests that add
# theirs; the cleanup also kills every other process with the tag).
_pids=()

# _ours PID: is PID a live process started by this test?  Pure bash: a
# helper process would carry the tag too.
_ours ()
{
    local e
    while IFS= read -r -d '' e; do
        [ "$e" = "QCOW2ZSTD_TEST_TAG=$QCOW2ZSTD_TEST_TAG" ] && return 0
    done 2>/dev/null < "/proc/$1/environ"
    return 1
}

# _our_processes: the pids of this test's processes, but for this shell
# and the one asking.
_our_processes ()
{
    local f pid
    for f in $(grep -lzx "QCOW2ZSTD_TEST_TAG=$QCOW2ZSTD_TEST_TAG" /proc/[0-9]*/environ 2>/dev/null); do
        pid=${f#/proc/}
        pid=${pid%/environ}
        [ "$pid" = $$ ] || [ "$pid" = "$BASHPID" ] || ! _ours "$pid" || echo "$pid"
    done
}

# _alive PID: PID exists and has not exited (a zombie has).
_alive ()
{
    local stat
    { read -r stat < "/proc/$1/stat"; } 2>/dev/null || return 1
    stat=${stat##*) }
    [ "${stat%% *}" != Z ]
}

# _describe_status STATUS: "status N" or the signal that ended it.
_describe_status ()
{
    if [[ ! $1 =~ ^[0-9]+$ ]]; then
        echo "status $1"
    elif [ "$1" -gt 128 ] && [ "$1" -lt 160 ]; then
        echo "signal $(kill -l "$(( $1 - 128 ))" 2>/dev/null || echo "$(( $1 - 128 ))") (status $1)"
    else
        echo "status $1"
    fi
}

# _backtrace PID: every thread's stack of a hung process, if gdb is here.
_backtrace ()
{
    if type -P gdb > /dev/null; then
        timeout 60 gdb -p "$1" -batch -ex 'thread apply all bt' 2>&1 |
            grep -E '^(Thread|#)' | head -n 200 || true
    else
        echo "(no gdb to show where it hangs)"
    fi
}

# _reports: print the sanitizer and valgrind reports collected so far;
# false if there are none.
_reports ()
{
    local f found=1
    for f in "$_REPORTS"/*; do
        [ -s "$f" ] || continue
        echo "----- ${f##*/}"
        head -n 80 "$f"
        found=0
    done
    return $found
}

# _log_errors LOG: print the lines of a server log that show a crash or
# a sanitizer report (nothing if there are none).
_log_errors ()
{
    grep -E 'AddressSanitizer|LeakSanitizer|ThreadSanitizer|UndefinedBehaviorSanitizer|runtime error:|Assertion .* failed|Segmentation fault|stack smashing|double free|corrupted (size|double-linked)|qcow2zstd tests: process [0-9]+ killed by signal' \
        "$1" 2>/dev/null | head -n 40 || true
}

# Failures inside $(...) or a background job cannot exit the test; they
# leave this mark, which the exit trap turns into a failure.
_mark_failed () { : > "$TMPDIR_TEST/.failed" 2>/dev/null || true; }

# Fail the test with a message (and, when a server it started has died,
# say so: the failing client is often only where that showed).
fail ()
{
    echo "FAIL: $*" >&"$_TEST_STDERR"
    _note_dead_servers >&"$_TEST_STDERR"
    _mark_failed
    exit 1
}

_note_dead_servers ()
{
    local pid how
    for pid in "${!_server_what[@]}"; do
        _alive "$pid" && continue
        how=
        if [ "$BASHPID" = $$ ]; then
            _server_status "$pid"
            how=" with $(_describe_status "$_status")"
        fi
        echo "note: ${_server_what[$pid]} (pid $pid) had already exited$how"
        if [ -n "${_server_log[$pid]}" ]; then
            echo "----- last lines of ${_server_log[$pid]}"
            tail -n 20 "${_server_log[$pid]}"
        fi
        _unregister_server "$pid"
    done
}

# ------------------------------------------------------------- servers
# The servers being watched: their log and what they are, by pid; for a
# server forked into the background, the directory where the reaper
# writes its exit status.
declare -A _server_log=() _server_what=() _server_reaper_dir=()

# _register_server PID LOG WHAT [REAPER_DIR]
_register_server ()
{
    _server_log[$1]=$2
    _server_what[$1]=$3
    [ -z "${4:-}" ] || _server_reaper_dir[$1]=$4
    _pids+=("$1")
}

_unregister_server ()
{
    unset "_server_log[$1]" "_server_what[$1]" "_server_reaper_dir[$1]"
}

# _server_status PID: set _status to the exit status of a server that
# has exited (not in a subshell: only this shell can wait for it).
_server_status ()
{
    local dir=${_server_reaper_dir[$1]:-} i
    _status=0
    if [ -n "$dir" ]; then
        # The reaper writes the file right after it reaps the process.
        for (( i = 0; i < 100; i++ )); do
            [ ! -s "$dir/exit.$1" ] || break
            sleep 0.1
        done
        _status=$(cat "$dir/exit.$1" 2>/dev/null || echo unknown)
    else
        { wait "$1"; } 2>/dev/null || _status=$?
    fi
}

# _server_end PID EXPECTED: wait for the server to exit (it has been
# signalled, or has exited already), then judge it: it must have exited
# with EXPECTED (0 after SIGTERM, 137 after SIGKILL; or a list of
# statuses), within the time limit, and without an error in its log or a
# sanitizer report.  Prints what is wrong and returns 1; never exits (it
# also runs in the exit trap).
_server_end ()
{
    local pid=$1 expected=$2
    local log=${_server_log[$pid]:-} what=${_server_what[$pid]:-nbdkit} status i
    local limit=$(( STOP_TIMEOUT * 10 ))
    # (bash's notice of a job killed by a signal, printed when it reaps
    # it during the loop, is not wanted: the status says it all.)
    { for (( i = 0; i < limit; i++ )); do
        _alive "$pid" || break
        sleep 0.1
    done; } 2>/dev/null
    if _alive "$pid"; then
        {
            echo "FAIL: $what (pid $pid) did not exit within $STOP_TIMEOUT s of SIGTERM: it hangs at shutdown"
            _backtrace "$pid"
            [ -z "$log" ] || { echo "----- last lines of $log"; tail -n 30 "$log"; }
        } >&"$_TEST_STDERR"
        kill -9 "$pid" 2>/dev/null || true
        _server_status "$pid"
        _unregister_server "$pid"
        return 1
    fi
    _server_status "$pid"
    status=$_status
    _unregister_server "$pid"
    if [[ " $expected " != *" $status "* ]]; then
        {
            if [ "$status" = 99 ] && [ "${VALGRIND:-0}" = 1 ]; then
                echo "FAIL: valgrind found errors in $what (pid $pid)"
            elif [ "$status" = 66 ] && [ "${TSAN:-no}" = yes ]; then
                echo "FAIL: ThreadSanitizer reported $what (pid $pid)"
            else
                echo "FAIL: $what (pid $pid) ended with $(_describe_status "$status"), expected status ${expected// / or }"
            fi
            _reports || true
            [ -z "$log" ] || { echo "----- last lines of $log"; tail -n 40 "$log"; }
        } >&"$_TEST_STDERR"
        return 1
    fi
    local errors
    errors=$([ -z "$log" ] || _log_errors "$log")
    if [ -n "$errors" ] || _reports > /dev/null; then
        {
            echo "FAIL: $what (pid $pid): its log shows a crash or a sanitizer report"
            [ -z "$errors" ] || echo "$errors"
            _reports || true
        } >&"$_TEST_STDERR"
        return 1
    fi
    return 0
}

# nbdkit_bg LOG NBDKIT-ARGS...: start nbdkit (with the sanitizer
# environment) in the background, as a child of this shell, its stderr
# in LOG, and watch it; no waiting.  Sets SERVER_PID, SERVER_JOB (the
# same pid) and SERVER_LOG.  For an nbdkit that stays in the foreground
# (-f, or a test's own -U and -f); stop it with stop_server.
nbdkit_bg ()
{
    local log=$1
    shift
    "${NBDKIT_ENV[@]}" nbdkit "$@" 2> "$log" &
    SERVER_PID=$!
    SERVER_JOB=$SERVER_PID
    SERVER_LOG=$log
    _register_server "$SERVER_PID" "$log" "nbdkit $*"
}

# start_server SOCKET [NBDKIT ARGS...]: start nbdkit in the background
# serving on the Unix socket SOCKET, with the filter first in the stack,
# and wait until it accepts connections.  Its pid is in $SERVER_PID.  Its
# stderr goes to SOCKET.log.
start_server ()
{
    local sock=$1
    shift
    start_nbdkit "$sock" --filter="$FILTER" "$@"
}

# start_nbdkit SOCKET [NBDKIT ARGS...]: the same without adding the
# filter: for the plugin form ($PLUGIN) and for stacks that place the
# filter themselves.  Returns 1 (with nbdkit's messages) if nbdkit exits
# at startup; a crash at startup fails the test.
start_nbdkit ()
{
    local sock=$1
    shift
    local pidfile="$sock.pid" i
    rm -f "$pidfile" "$sock"
    nbdkit_bg "$sock.log" -U "$sock" -P "$pidfile" -f "$@"
    for (( i = 0; i < CALL_TIMEOUT * 10; i++ )); do
        if [ -s "$pidfile" ] && [ -S "$sock" ]; then
            return 0
        fi
        if ! _alive "$SERVER_PID"; then
            local status
            _server_status "$SERVER_PID"
            status=$_status
            _unregister_server "$SERVER_PID"
            SERVER_PID=
            echo "nbdkit exited at startup with $(_describe_status "$status"):" >&2
            cat "$sock.log" >&2
            if [ "$status" -gt 128 ] || _reports >&2; then
                fail "nbdkit crashed at startup: nbdkit $*"
            fi
            return 1
        fi
        sleep 0.1
    done
    fail "nbdkit did not start within $CALL_TIMEOUT s: nbdkit $*"
}

# stop_server [PID]: SIGTERM the server (by default the one started
# last) and wait for it; fail the test unless it exits with status 0 in
# time with a clean log.  For the plugin form and every stack alike.
stop_server ()
{
    local pid=${1:-${SERVER_PID:-}}
    [ -n "$pid" ] || return 0
    [ "$pid" = "${SERVER_PID:-}" ] && SERVER_PID=
    if [ -z "${_server_what[$pid]:-}" ]; then
        fail "stop_server: $pid is not a server this test started (or it was stopped already)"
    fi
    ! _ours "$pid" || kill -TERM "$pid" 2>/dev/null || true
    _server_end "$pid" 0 || { _mark_failed; exit 1; }
}

# kill_server [PID]: SIGKILL the server (a crash test), wait for it and
# check that nothing went wrong before the kill.
kill_server ()
{
    local pid=${1:-${SERVER_PID:-}}
    ! _ours "$pid" || kill -KILL "$pid" 2>/dev/null || true
    server_killed "$pid"
}

# server_killed [PID]: the server was sent SIGKILL by a client: collect
# it as kill_server does.
server_killed ()
{
    local pid=${1:-${SERVER_PID:-}}
    [ "$pid" = "${SERVER_PID:-}" ] && SERVER_PID=
    _server_end "$pid" 137 || { _mark_failed; exit 1; }
}

# run_nbdkit NBDKIT-ARGS...: run nbdkit (with the sanitizer environment)
# as the shell would, returning its exit status: for --run, --dump-plugin,
# refusals at startup and the examples that fork a server into the
# background.  nbdkit that crashes (killed by SIGABRT, SIGSEGV, ...),
# shows a sanitizer report (in its stderr, which the reaper keeps a copy
# of: UBSan writes nowhere else, and after a --run command nbdkit 1.32
# exits with the command's status even when UBSan stopped it in .unload)
# or does not finish within NBDKIT_TIMEOUT (default $CALL_TIMEOUT)
# seconds fails the test.  A server it forks into the background is
# watched like the others (stop_server PID).
run_nbdkit ()
{
    local limit=${NBDKIT_TIMEOUT:-$CALL_TIMEOUT} dir fd line status daemon
    dir=$(mktemp -d "$TMPDIR_TEST/.nbdkit.XXXXXX")
    mkfifo "$dir/fifo"
    exec {fd}<>"$dir/fifo"
    /usr/bin/python3 "$top_srcdir/tests/reaper.py" "$dir" "${NBDKIT_ENV[@]}" nbdkit "$@" <&0 &
    local reaper=$!
    if ! read -r -t "$limit" -u "$fd" line; then
        exec {fd}<&-
        local child
        child=$(cat "/proc/$reaper/task/$reaper/children" 2>/dev/null || true)
        {
            echo "FAIL: nbdkit $* did not finish within $limit s"
            for pid in $child; do _backtrace "$pid"; done
        } >&"$_TEST_STDERR"
        for pid in $child; do kill -9 "$pid" 2>/dev/null || true; done
        fail "nbdkit timed out"
    fi
    exec {fd}<&-
    read -r status daemon <<<"$line"
    case $status in
        132|133|134|135|136|139)
            _reports >&"$_TEST_STDERR" || true
            fail "nbdkit $* crashed: $(_describe_status "$status")" ;;
        99)
            if [ "${VALGRIND:-0}" = 1 ]; then
                _reports >&"$_TEST_STDERR" || true
                fail "valgrind found errors in nbdkit $*"
            fi ;;
    esac
    local errors
    errors=$(_log_errors "$dir/stderr")
    if [ -n "$errors" ]; then
        echo "$errors" >&"$_TEST_STDERR"
        fail "nbdkit $*: its stderr shows a crash or a sanitizer report (above)"
    fi
    if _reports >&"$_TEST_STDERR"; then
        fail "nbdkit $*: a sanitizer or valgrind report (above)"
    fi
    for pid in $daemon; do
        _register_server "$pid" "$dir/stderr" "nbdkit $* (in the background)" "$dir"
    done
    return "$status"
}

# ------------------------------------------------------------- clients
# _client_call COMMAND ARGS...: run a client with the time limit; one
# that does not finish fails the test, naming the call.
_client_call ()
{
    local status=0 start=$SECONDS
    timeout -k 10 "$CALL_TIMEOUT" "$@" || status=$?
    if { [ "$status" = 124 ] || [ "$status" = 137 ]; } && [ $(( SECONDS - start )) -ge "$CALL_TIMEOUT" ]; then
        fail "no answer within $CALL_TIMEOUT s: $*"
    fi
    return "$status"
}
nbdcopy () { _client_call nbdcopy "$@"; }
nbdinfo () { _client_call nbdinfo "$@"; }
nbdsh () { _client_call nbdsh "$@"; }
qemu-img () { _client_call qemu-img "$@"; }
qemu-io () { _client_call qemu-io "$@"; }
python3 () { _client_call /usr/bin/python3 "$@"; }
# qemu-img for making LUKS images and key slots: run again when qemu's
# PBKDF2 benchmark fails to measure (tests/qemu-img-luks.sh says why).
qemu_img_luks () { _client_call bash "$top_srcdir/tests/qemu-img-luks.sh" "$@"; }

# nbd_uri SOCKET: the NBD URI of a server on a Unix socket.
nbd_uri ()
{
    echo "nbd+unix:///?socket=$1"
}

# requires_nbdsh: set NBDSH to the command that runs libnbd's nbdsh
# (python3 -m nbd, with the python3 this file put first in PATH), or skip
# the test when that python3 lacks the nbd module.
requires_nbdsh ()
{
    nbdsh -c pass > /dev/null 2>&1 ||
        skip "nbdsh cannot import the nbd python module (python3-libnbd)"
    NBDSH=(nbdsh)
}

# requires_nbd_python: set PYTHON to a python3 with libnbd's nbd module
# (Debian's python3-libnbd serves the system python; one earlier in PATH
# may lack it), or skip the test.  $PYTHON is the timed python3 above.
requires_nbd_python ()
{
    /usr/bin/python3 -c 'import nbd' 2>/dev/null ||
        skip "/usr/bin/python3 has no nbd module (python3-libnbd)"
    PYTHON=python3
}

# mixed_disk FILE SIZE SEED: a disk of SIZE bytes made of random, text
# and zero regions of up to 300000 bytes, the same for the same SEED.
mixed_disk ()
{
    "${PYTHON:-/usr/bin/python3}" - "$@" <<'EOF'
import random, sys
path, size, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
out = bytearray()
while len(out) < size:
    k = rng.randrange(3)
    n = rng.randrange(1, 300000)
    out += rng.randbytes(n) if k == 0 else (b"lorem ipsum qcow2 " * (n // 18 + 1))[:n] if k == 1 else bytes(n)
open(path, "wb").write(out[:size])
EOF
}

# ------------------------------------------------------------- images
# data_file_image IMAGE DATA RAW CLUSTER: an 8 MiB qcow2 image whose
# data lives in the file DATA (data_file_raw=RAW, clusters of CLUSTER
# bytes), written by qemu-io with patterns, zeroes and a discard.
data_file_image ()
{
    rm -f "$1" "$2"
    qemu-img create -q -f qcow2 \
        -o "data_file=$2,data_file_raw=$3,cluster_size=$4" "$1" 8M
    qemu-io -c "write -P 0x51 0 100k" -c "write -P 0x52 1M 2M" \
        -c "write -z 1536k 64k" -c "discard 2M 128k" -c "write -P 0x53 7M 3000" \
        "$1" > io.out || { cat io.out; fail "qemu-io on $1"; }
}

# nbdkit_refuses LABEL MESSAGE NBDKIT-ARGS...: nbdkit, started with
# NBDKIT-ARGS (as run_nbdkit runs it), does not serve, and says MESSAGE
# (a fixed string); its messages are left in refused.out.
nbdkit_refuses ()
{
    local label=$1 msg=$2
    shift 2
    if run_nbdkit -U - "$@" --run 'nbdinfo --size "$uri"' > refused.out 2>&1; then
        cat refused.out; fail "$label: served"
    fi
    grep -qF -- "$msg" refused.out || { cat refused.out; fail "$label: not the message '$msg'"; }
}

# header_u64 IMAGE OFFSET: the big-endian u64 at OFFSET of IMAGE's header.
header_u64 ()
{
    od -An -tu8 --endian=big -j "$2" -N 8 "$1" | tr -d ' '
}

# image_dirty IMAGE: is the dirty bit (incompatible feature bit 0) set?
image_dirty ()
{
    [ $(( $(header_u64 "$1" 72) & 1 )) = 1 ]
}

# write_errno URI OFFSET LENGTH BYTE: one write through NBD of LENGTH
# bytes of BYTE (or of random bytes, for BYTE "random") at OFFSET, then
# a flush; prints "ok", or "errno NAME" of the one that failed.  Needs
# requires_nbd_python.
write_errno ()
{
    $PYTHON - "$@" <<'EOF'
import nbd, os, sys
uri, byte = sys.argv[1], sys.argv[4]
offset, length = int(sys.argv[2], 0), int(sys.argv[3], 0)
data = os.urandom(length) if byte == "random" else bytes([int(byte, 0)]) * length
h = nbd.NBD()
h.connect_uri(uri)
try:
    h.pwrite(data, offset)
    h.flush()
except nbd.Error as e:
    print("errno", e.errno)
else:
    print("ok")
EOF
}

# no_room_names_no_file LOG WHAT: LOG holds the message of a full image
# where no file can be given room: it ends at "reconnect", and nothing
# in LOG tells to truncate.
no_room_names_no_file ()
{
    grep -q "no room in the image file: .*give the image room and reconnect$" "$1" ||
        { cat "$1"; fail "$2: no message for the full image"; }
    if grep -q "truncate" "$1"; then
        cat "$1"; fail "$2: the message tells to truncate a file there is not"
    fi
}

# Lists of operations, one a line: "w OFFSET LENGTH PATTERN" (LENGTH
# bytes of the byte PATTERN), "z OFFSET LENGTH" (zero), "t OFFSET LENGTH"
# (trim or discard), "f" (flush).
# apply_ops_nbd URI < OPS: through NBD, one connection, no flush but the
# listed ones; fails the test if a request fails.
apply_ops_nbd ()
{
    /usr/bin/python3 -c '
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
for line in sys.stdin:
    op = line.split()
    if op[0] == "w":
        h.pwrite(bytes([int(op[3])]) * int(op[2]), int(op[1]))
    elif op[0] == "z":
        h.zero(int(op[2]), int(op[1]))
    elif op[0] == "t":
        h.trim(int(op[2]), int(op[1]))
    else:
        h.flush()
h.shutdown()' "$1" || fail "the operations through $1 failed"
}
# apply_ops_qemu_io IMAGE [UNMAP] < OPS: the same with one qemu-io on
# IMAGE; with UNMAP ("-u") its zeroes may unmap, as an NBD zero without
# NO_HOLE may.
apply_ops_qemu_io ()
{
    local args=() kind off len pat unmap=${2:+$2 }
    while read -r kind off len pat; do
        case $kind in
            w) args+=(-c "write -P $pat $off $len") ;;
            z) args+=(-c "write -z $unmap$off $len") ;;
            t) args+=(-c "discard $off $len") ;;
            f) args+=(-c flush) ;;
        esac
    done
    qemu-io "${args[@]}" "$1" > "$TMPDIR_TEST/qemu-io.out" ||
        { cat "$TMPDIR_TEST/qemu-io.out"; fail "qemu-io on $1"; }
}

# ------------------------------------------------------ the test's end
# _cleanup [STATUS]: the exit trap.  STATUS is the test's exit status
# ($? by default; a test whose own trap runs something first passes
# it).  If the test passed or is skipping (77), servers still running
# are stopped and judged as stop_server does (a crash or hang at exit
# fails the test), and so are the failure marks of subshells and the
# sanitizer reports: a test that skips after a check failed fails, for
# a skip is never counted as a failure.  Then whatever of ours is still
# running is killed and the scratch directory removed.
_cleanup ()
{
    local status=${1:-$?} failed=0 pid
    # Whatever goes wrong here, the rest must still run: nothing of the
    # test may be left running.
    set +eu
    kill "$_watchdog" 2>/dev/null || true
    if [ "$status" = 0 ] || [ "$status" = 77 ]; then
        for pid in "${!_server_what[@]}"; do
            if _alive "$pid"; then
                ! _ours "$pid" || kill -TERM "$pid" 2>/dev/null || true
                _server_end "$pid" 0 || failed=1
            else
                # Gone before the end, not through stop_server: a test
                # that stops its servers itself may have sent SIGTERM or
                # SIGKILL, but a crash is never one of those.
                _server_end "$pid" "0 137 143" || failed=1
            fi
        done
        local glob
        for glob in "${_section_globs[@]}"; do
            if [ -z "${_section_hits[$glob]:-}" ]; then
                echo "FAIL: QCOW2ZSTD_SECTIONS names '$_test_base:$glob', which matched no part of the test" >&"$_TEST_STDERR"
                failed=1
            fi
        done
        if [ -e "$TMPDIR_TEST/.failed" ]; then
            echo "FAIL: a check failed in a subshell (see above)" >&"$_TEST_STDERR"
            failed=1
        fi
        if _reports > "$TMPDIR_TEST/.reports.txt"; then
            echo "FAIL: a sanitizer or valgrind report:" >&"$_TEST_STDERR"
            cat "$TMPDIR_TEST/.reports.txt" >&"$_TEST_STDERR"
            failed=1
        fi
    fi
    local left i
    left=$(_our_processes)
    if [ -n "$left" ]; then
        # shellcheck disable=SC2086
        kill $left 2>/dev/null || true
        for (( i = 0; i < 50; i++ )); do
            left=$(for pid in $left; do ! _alive "$pid" || echo "$pid"; done)
            [ -n "$left" ] || break
            sleep 0.1
        done
        # shellcheck disable=SC2086
        [ -z "$left" ] || kill -9 $left 2>/dev/null || true
    fi
    rm -rf "$TMPDIR_TEST"
    if [ "$failed" != 0 ] && [ "$status" = 77 ]; then
        echo "FAIL: ${0##*/} was skipping, but a check had failed before: a failure is never a skip" >&"$_TEST_STDERR"
    fi
    [ "$failed" = 0 ] || status=1
    case $status in
        0) echo "${0##*/}: passed in $SECONDS s" ;;
        77) echo "${0##*/}: skipped after $SECONDS s" ;;
        *) echo "${0##*/}: failed (status $status) after $SECONDS s" ;;
    esac
    # Only a failure found here changes the exit status.
    [ "$failed" = 0 ] || exit 1
}
trap _cleanup EXIT
# The time limit's watchdog ends the test with SIGTERM.
trap 'exit 143' TERM
trap 'exit 130' INT

# The time limit of the whole test: past it, say what is still running,
# kill it all and fail.
_watchdog_run ()
{
    trap - EXIT TERM INT
    local main=$1 me=$BASHPID waited=0 pid procs cmd
    while kill -0 "$main" 2>/dev/null; do
        if [ "$waited" -ge "$TEST_TIMEOUT" ]; then
            procs=$(_our_processes | grep -vx "$me" || true)
            {
                echo "FAIL: ${0##*/} ran for more than $TEST_TIMEOUT s (QCOW2ZSTD_TEST_TIMEOUT); still running:"
                for pid in $procs; do
                    cmd=$(tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline" | cut -c1-200) || true
                    [ -z "$cmd" ] || echo "  $pid: $cmd"
                done
            } >&"$_TEST_STDERR"
            _mark_failed
            for pid in $procs; do kill -9 "$pid" 2>/dev/null || true; done
            kill -TERM "$main" 2>/dev/null || true
            return 0
        fi
        sleep 1
        waited=$(( waited + 1 ))
    done
}
_watchdog_run $$ &
_watchdog=$!
