#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# qemu-img for the tests that make LUKS images (or add key slots):
#
#     bash tests/qemu-img-luks.sh QEMU-IMG-ARGS...
#
# runs qemu-img with those arguments, and runs it again when it failed
# only because qemu's PBKDF2 benchmark could not measure itself.  Every
# LUKS create, convert to LUKS or key slot added runs that benchmark
# (qemu 7.2 has no option for a fixed iteration count: encrypt.iter-time
# only scales what the benchmark measured).  Its first round is a few
# milliseconds of CPU, read back from getrusage's user time, which the
# kernel only brings up to date at scheduler ticks; a round that saw no
# tick measures 0 ms and qemu-img gives up with "Unable to get accurate
# CPU usage".  On this kind of machine (2 cores, HZ=250) that was 16 runs
# in 60 idle, 20 in 60 with two CPU hogs, and in 150 runs at a load of 8
# it came in bursts of up to 7 in a row.  The image is not to blame and
# a new run is a new measurement, so a run that failed with that message
# and nothing else is run again, after a pause that grows to a second
# (to get out of a burst), up to QEMU_IMG_LUKS_TRIES times (default
# 100, about a minute and a half at most).  Any other failure is
# returned at once with qemu-img's messages.  Retries are reported on
# stderr.
set -u

tries=${QEMU_IMG_LUKS_TRIES:-100}
err=$(mktemp "${TMPDIR:-/tmp}/qemu-img-luks.XXXXXX")
trap 'rm -f "$err"' EXIT

for (( attempt = 1; ; attempt++ )); do
    status=0
    qemu-img "$@" 2> "$err" || status=$?
    # Only the benchmark's failure, and only that line, is retried.
    if [ "$status" = 0 ] || [ "$attempt" -ge "$tries" ] ||
       ! grep -q ': Unable to get accurate CPU usage$' "$err" ||
       grep -qv ': Unable to get accurate CPU usage$' "$err"; then
        break
    fi
    sleep "$(( attempt < 10 ? 0 : 1 )).$(( attempt < 10 ? attempt : 0 ))"
done
cat "$err" >&2
if [ "$attempt" -gt 1 ]; then
    if [ "$status" = 0 ]; then
        echo "qemu-img-luks: qemu-img $1 needed $attempt runs (PBKDF2 benchmark: \"Unable to get accurate CPU usage\")" >&2
    else
        echo "qemu-img-luks: qemu-img $1 failed $attempt times" >&2
    fi
fi
exit "$status"
