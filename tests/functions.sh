# SPDX-License-Identifier: BSD-3-Clause
# Helpers sourced by the shell tests: starting and stopping nbdkit with
# the filter from the build tree, skipping when a tool is missing, and a
# scratch directory removed at exit.
#
# Variables set by the Makefile (TESTS_ENVIRONMENT); each has a default so
# that a test can also be run by hand from the top of the build tree:
#   FILTER        the built filter, .libs/nbdkit-qcow2zstd-filter.so
#   top_srcdir, top_builddir

set -euo pipefail

# Debian's python3-libnbd (nbdsh's nbd module) is installed for the
# system python; a python earlier in PATH (pyenv, venv) would lack it.
export PATH="/usr/bin:$PATH"

: "${top_builddir:=$(pwd)}"
: "${top_srcdir:=$top_builddir}"
: "${FILTER:=$top_builddir/filters/qcow2zstd/.libs/nbdkit-qcow2zstd-filter.so}"
: "${PLUGIN:=$top_builddir/plugins/qcow2zstd/.libs/nbdkit-qcow2zstd-plugin.so}"
export FILTER PLUGIN

# Exit 77 (skip) with a reason unless every named command exists.
requires ()
{
    local cmd
    for cmd in "$@"; do
        if ! command -v "$cmd" >/dev/null 2>&1; then
            echo "$0: skipped: '$cmd' is not installed"
            exit 77
        fi
    done
}

requires nbdkit qemu-img

if [ ! -f "$FILTER" ]; then
    echo "$0: the filter is not built: $FILTER" >&2
    exit 1
fi

# Under --enable-sanitizers the filter needs the sanitizer runtimes loaded
# into nbdkit, which is not built with them.
NBDKIT_ENV=()
if [ "${SANITIZERS:-no}" = yes ]; then
    NBDKIT_ENV=(env
        "LD_PRELOAD=$(${CC:-gcc} -print-file-name=libasan.so)"
        "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1"
        "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
fi

# VALGRIND=1 (make check-valgrind) runs every server under valgrind; a
# server that valgrind found an invalid access or a leak in exits 99,
# which stop_server turns into a test failure.
if [ "${VALGRIND:-0}" = 1 ]; then
    requires valgrind
    NBDKIT_ENV=(valgrind --quiet --error-exitcode=99 --leak-check=full
                --errors-for-leak-kinds=definite --show-leak-kinds=definite
                --trace-children=no --child-silent-after-fork=yes
                "--suppressions=$top_srcdir/tests/valgrind.supp")
fi

TMPDIR_TEST=$(mktemp -d "${TMPDIR:-/tmp}/qcow2zstd-test.XXXXXX")
_pids=()

# Every process a test starts inherits this tag.  The cleanup signals
# only processes that carry this test's tag: a pid recorded for a server
# stopped long ago may have been reused (pid_max is 32768 on Debian's
# default) by a process of a test running in parallel under make -j2,
# such as its nbdcopy, which would die of SIGTERM with no message.
QCOW2ZSTD_TEST_TAG="$$.$RANDOM.$RANDOM"
export QCOW2ZSTD_TEST_TAG

# _ours PID: is PID a live process started by this test?
_ours ()
{
    tr '\0' '\n' 2>/dev/null < "/proc/$1/environ" |
        grep -qx "QCOW2ZSTD_TEST_TAG=$QCOW2ZSTD_TEST_TAG"
}

_cleanup ()
{
    local pid
    for pid in "${_pids[@]}"; do
        if _ours "$pid"; then kill "$pid" 2>/dev/null || true; fi
    done
    for pid in "${_pids[@]}"; do
        # Wait for the server to go, so its socket and files can be removed.
        if _ours "$pid"; then _wait_gone "$pid" 100 || true; fi
    done
    rm -rf "$TMPDIR_TEST"
}
trap _cleanup EXIT

# Run nbdkit with the filter (and any extra arguments) through the
# sanitizer environment if there is one.  Usage as for nbdkit itself.
# With NBDKIT_TIMEOUT=SECONDS set, nbdkit is killed after that long: for
# runs expected to end by themselves (a hang in glibc's exit path under
# the sanitizer runtimes was seen once).  Not for servers started in the
# background, whose pid must be nbdkit's.
run_nbdkit ()
{
    if [ -n "${NBDKIT_TIMEOUT:-}" ]; then
        timeout -k 10 "$NBDKIT_TIMEOUT" "${NBDKIT_ENV[@]}" nbdkit "$@"
    else
        "${NBDKIT_ENV[@]}" nbdkit "$@"
    fi
}

# start_server SOCKET [NBDKIT ARGS...]: start nbdkit in the background
# serving on the Unix socket SOCKET, with the filter first in the stack,
# and wait until it accepts connections.  Its pid is in $SERVER_PID and it
# is killed at exit.  Its stderr goes to SOCKET.log.
start_server ()
{
    local sock=$1
    shift
    start_nbdkit "$sock" --filter="$FILTER" "$@"
}

# start_nbdkit SOCKET [NBDKIT ARGS...]: the same without adding the
# filter: for the plugin form ($PLUGIN) and for stacks that place the
# filter themselves.
start_nbdkit ()
{
    local sock=$1
    shift
    local pidfile="$sock.pid"
    rm -f "$pidfile" "$sock"
    run_nbdkit -U "$sock" -P "$pidfile" -f "$@" \
        2>"$sock.log" &
    local bgpid=$!
    _pids+=("$bgpid")
    SERVER_JOB=$bgpid
    for _ in $(seq 600); do
        if [ -s "$pidfile" ] && [ -S "$sock" ]; then
            SERVER_PID=$(cat "$pidfile")
            SERVER_LOG="$sock.log"
            _pids+=("$SERVER_PID")  # nbdkit itself, for the cleanup
            return 0
        fi
        if ! kill -0 "$bgpid" 2>/dev/null; then
            echo "nbdkit exited at startup:" >&2
            cat "$sock.log" >&2
            return 1
        fi
        sleep 0.1
    done
    echo "nbdkit did not start within 60 s" >&2
    cat "$sock.log" >&2
    return 1
}

# stop_server: kill the server started last and wait for it.
stop_server ()
{
    if [ -n "${SERVER_PID:-}" ]; then
        kill "$SERVER_PID" 2>/dev/null || true
        _wait_gone "$SERVER_PID" 300 ||
            echo "$0: warning: nbdkit $SERVER_PID hung while exiting; killed" >&2
        local status=0
        wait "$SERVER_JOB" 2>/dev/null || status=$?
        SERVER_PID=
        if [ "$status" = 99 ]; then
            cat "$SERVER_LOG" >&2
            fail "valgrind found errors in the server (see above)"
        fi
    fi
}

# _wait_gone PID TENTHS: wait up to TENTHS tenths of a second for PID to
# exit; then SIGKILL it and return 1.  nbdkit under the sanitizer
# runtimes now and then hangs in glibc's exit path (in libp11-kit's
# destructor, on the locale lock), after all its work is done.
_wait_gone ()
{
    local i
    for i in $(seq "$2"); do
        kill -0 "$1" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -9 "$1" 2>/dev/null || true
    return 1
}

# nbd_uri SOCKET: the NBD URI of a server on a Unix socket.
nbd_uri ()
{
    echo "nbd+unix:///?socket=$1"
}

# requires_nbd_python: set PYTHON to a python3 with libnbd's nbd module
# (Debian's python3-libnbd serves the system python; one earlier in PATH
# may lack it), or skip the test.
requires_nbd_python ()
{
    PYTHON=/usr/bin/python3
    "$PYTHON" -c 'import nbd' 2>/dev/null || {
        echo "$0: skipped: $PYTHON has no nbd module (python3-libnbd)"
        exit 77
    }
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

# Fail the test with a message.
fail ()
{
    echo "FAIL: $*" >&2
    exit 1
}
