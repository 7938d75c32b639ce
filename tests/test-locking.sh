#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Image locking, the way qemu locks images: two writers of ours (filter
# and plugin in every pairing, and two exports of one nbdkit that reach
# one file through a symlink in dir=) cannot both write, and the first
# one's data survives; ours and qemu-nbd, qemu-io and qemu-img refuse
# each other as two qemus would, with and without -r and -U; readers
# share; two clients on one export keep the locks until both have left;
# a kill -9'd writer leaves the image free; qcow2-locking=off
# takes no locks; backing files are locked as qemu locks them.  The
# locks last from start-up where the file is known then (the plugin
# form; the filter over nbdkit's file plugin with file=), else from the
# first client (the filter with dir=), until nbdkit exits, as qemu-nbd's: between two clients of an export,
# qemu-img info, qemu-io and a second writer of ours are refused, and
# after nbdkit exits or is killed with -9 nothing is locked.  A file
# that cannot be confirmed as the one served (under the offset filter)
# is not written with qcow2-locking=on, and written unlocked with a
# warning with qcow2-locking=auto.  Also:
# a session that only reads through a writable export leaves the file
# byte for byte as it was, and the first write then keeps the persistent
# bitmap valid (autoclear bit 0 kept; qemu finds the bitmap consistent,
# with the write marked).
source "${top_srcdir:-.}/tests/functions.sh"
requires qemu-io qemu-nbd nbdinfo nbdcopy sha256sum timeout
requires_nbd_python
[ -f "$PLUGIN" ] || fail "the plugin is not built: $PLUGIN"

cd "$TMPDIR_TEST"
HOLD=("$PYTHON" "$top_srcdir/tests/nbd-hold.py")

declare -A PIDS JOBS HOLDERS

# serve NAME FORM ARGS...: our server NAME on NAME.sock, FORM filter
# (over nbdkit's file plugin: ARGS start with the image or dir=) or
# plugin (ARGS start with the image).  Its log is NAME.sock.log.
serve ()
{
    local name=$1 form=$2
    shift 2
    case $form in
        filter) start_server "$PWD/$name.sock" file "$@" ;;
        plugin) start_nbdkit "$PWD/$name.sock" "$PLUGIN" "$@" ;;
    esac
    PIDS[$name]=$SERVER_PID
    JOBS[$name]=$SERVER_JOB
    SERVER_PID=
}

unserve ()
{
    local name=$1 pid=${PIDS[$1]}
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    wait "${JOBS[$name]}" 2>/dev/null || true
}

uri () # NAME [EXPORT]
{
    echo "nbd+unix:///${2:-}?socket=$PWD/$1.sock"
}

# hold CLIENT URI [OFFSET LENGTH BYTE]: a client that stays connected
# (after writing and flushing the pattern).  Fails if it was refused.
hold ()
{
    local client=$1
    shift
    rm -f "$client.ready" "$client.stop"
    "${HOLD[@]}" "$1" "$client.ready" "$client.stop" "${@:2}" 2> "$client.err" &
    HOLDERS[$client]=$!
    for _ in $(seq 600); do
        [ -e "$client.ready" ] && return 0
        kill -0 "${HOLDERS[$client]}" 2>/dev/null || { wait "${HOLDERS[$client]}" || true; return 1; }
        sleep 0.05
    done
    fail "$client: neither connected nor refused within 30 s"
}

release ()
{
    touch "$1.stop"
    wait "${HOLDERS[$1]}" || fail "$1: the client failed: $(cat "$1.err")"
}

# refused_client NAME URI PATTERN: a client of server NAME is turned
# away, and the server's log says PATTERN.
refused_client ()
{
    local name=$1 u=$2 pattern=$3
    if hold "refused-$name" "$u" 0x200000 65536 0xb2; then
        fail "$name: a client that should have been refused got in"
    fi
    grep -q -- "$pattern" "$PWD/$name.sock.log" ||
        { cat "$PWD/$name.sock.log"; fail "$name: no '$pattern' in the log"; }
    echo "  refused: $(grep -o -- "$pattern.*" "$PWD/$name.sock.log" | head -1)"
}

# refused_start PATTERN NBDKIT-ARGS...: nbdkit refuses to start.
refused_start ()
{
    local pattern=$1
    shift
    if NBDKIT_TIMEOUT=120 run_nbdkit -U "$PWD/refused.sock" "$@" --run true 2> start.err; then
        fail "nbdkit $*: started"
    fi
    grep -q -- "$pattern" start.err || { cat start.err; fail "nbdkit $*: no '$pattern'"; }
    echo "  refused at start-up: $(grep -o -- "$pattern.*" start.err | head -1)"
}

# qemu_refused PATTERN CMD...: a qemu tool fails with PATTERN.  Tools that
# would serve (qemu-nbd) are cut off after 20 s: if they got so far,
# they were not refused.
qemu_refused ()
{
    local pattern=$1 rc=0
    shift
    timeout 20 "$@" > qemu.out 2>&1 || rc=$?
    [ "$rc" != 0 ] && [ "$rc" != 124 ] || { cat qemu.out; fail "$*: not refused"; }
    grep -q -- "$pattern" qemu.out || { cat qemu.out; fail "$*: no '$pattern'"; }
    grep -q "Is another process using the image" qemu.out || { cat qemu.out; fail "$*: no hint"; }
    echo "  qemu refused: $(tr '\n' ' ' < qemu.out)"
}

qemu_granted ()
{
    "$@" > qemu.out 2>&1 || { cat qemu.out; fail "$*: refused"; }
}

# lock_bytes FILE: the lock bytes held on FILE, from /proc/locks.
lock_bytes ()
{
    local ino
    ino=$(stat -L -c %i "$1")
    awk -v ino="$ino" '{ split($6, dev, ":"); if (dev[3] == ino) for (b = $7; b <= $8; b++) print b }' \
        /proc/locks | sort -n -u | tr '\n' ' '
}

# start_qemu NAME BYTE CMD...: a qemu tool in the background that holds
# the image; waits until byte BYTE of IMG is locked.
start_qemu ()
{
    local name=$1 byte=$2
    shift 2
    "$@" > "$name.out" 2>&1 &
    PIDS[$name]=$!
    JOBS[$name]=$!
    for _ in $(seq 300); do
        case " $(lock_bytes img.qcow2) " in *" $byte "*) return 0 ;; esac
        kill -0 "${PIDS[$name]}" 2>/dev/null || { cat "$name.out"; fail "$name exited"; }
        sleep 0.1
    done
    fail "$name: no lock on byte $byte"
}

new_image ()
{
    rm -f img.qcow2
    qemu-img create -q -f qcow2 img.qcow2 64M
    qemu-io -f qcow2 -c "write -P 0x11 0 4M" img.qcow2 > /dev/null
}

W='Failed to get "write" lock'
SW='Failed to get shared "write" lock'

# ------------------------------------------------------------ two writers
for pair in filter/filter plugin/filter filter/plugin plugin/plugin; do
    first=${pair%/*} second=${pair#*/}
    echo "two writers, $first then $second:"
    new_image
    serve a "$first" img.qcow2
    hold one "$(uri a)" 0 0x100000 0xa1 || fail "$pair: the first writer was refused"
    [ "$(lock_bytes img.qcow2)" = "100 101 103 201 203 " ] ||
        fail "$pair: the first writer locks bytes $(lock_bytes img.qcow2)"
    # Both forms check at start-up (the filter: over nbdkit's file
    # plugin with file=).
    if [ "$second" = plugin ]; then
        refused_start "$W" "$PLUGIN" img.qcow2
    else
        refused_start "$W" --filter="$FILTER" file img.qcow2
    fi
    release one
    unserve a
    qemu-io -r -f qcow2 -c "read -P 0xa1 0 1M" -c "read -P 0x11 2M 64k" img.qcow2 > read.out ||
        { cat read.out; fail "$pair: the first writer's data is not there"; }
    qemu-img check -q img.qcow2 || fail "$pair: qemu-img check"
    echo "  the first writer's data survived, check clean"
done

# Both forms lock at start-up: a second one is refused before either
# has a client.
for pair in filter/filter plugin/filter filter/plugin plugin/plugin; do
    first=${pair%/*} second=${pair#*/}
    echo "two writers, $first and $second, the second started before the first has a client:"
    new_image
    serve a "$first" img.qcow2
    if [ "$second" = plugin ]; then
        refused_start "$W" "$PLUGIN" img.qcow2
    else
        refused_start "$W" --filter="$FILTER" file img.qcow2
    fi
    hold one "$(uri a)" 0 0x100000 0xa1 || fail "$pair: the first writer was refused"
    release one
    unserve a
    qemu-io -r -f qcow2 -c "read -P 0xa1 0 1M" -c "read -P 0x11 2M 64k" img.qcow2 > read.out ||
        { cat read.out; fail "$pair: the first writer's data is not there"; }
    echo "  the first writer's data survived"
done

# Two exports of one nbdkit reaching one file, through a symlink in dir=.
echo "two writers, exports disk.qcow2 and alias.qcow2 -> disk.qcow2 of dir=:"
mkdir -p d
new_image
mv img.qcow2 d/disk.qcow2
ln -sf disk.qcow2 d/alias.qcow2
qemu-img create -q -f qcow2 d/other.qcow2 64M
truncate -s +2M d/other.qcow2           # room: the filter does not grow files
serve a filter dir="$PWD/d"
hold one "$(uri a disk.qcow2)" 0 0x100000 0xa1 || fail "dir=: the first writer was refused"
refused_client a "$(uri a alias.qcow2)" "$W"
hold other "$(uri a other.qcow2)" 0 0x100000 0xc4 || fail "dir=: another file was refused"
release other
release one
unserve a
qemu-io -r -f qcow2 -c "read -P 0xa1 0 1M" -c "read -P 0x11 2M 64k" d/disk.qcow2 > read.out ||
    { cat read.out; fail "dir=: the first writer's data is not there"; }
qemu-io -r -f qcow2 -c "read -P 0xc4 0 1M" d/other.qcow2 > read.out ||
    { cat read.out; fail "dir=: the other file's data is not there"; }
echo "  the first writer's data survived; another file of the directory was written alongside"

# ------------------------------------------------------------ ours, then qemu
for form in filter plugin; do
    echo "$form writing, then qemu:"
    new_image
    serve a $form img.qcow2
    hold one "$(uri a)" 0 0x100000 0xa1 || fail "$form: our writer was refused"
    qemu_refused "$W" qemu-io -f qcow2 -c "write 0 512" img.qcow2
    qemu_refused "$SW" qemu-io -r -f qcow2 -c "read 0 512" img.qcow2
    qemu_refused "$SW" qemu-img info img.qcow2
    qemu_refused "$W" qemu-nbd -k "$PWD/q.sock" img.qcow2
    qemu_refused "$SW" qemu-nbd -r -k "$PWD/q.sock" img.qcow2
    qemu_granted qemu-io -r -U -f qcow2 -c "read -P 0xa1 0 1M" img.qcow2
    qemu_granted qemu-img info -U img.qcow2
    echo "  granted: qemu-io -r -U (reads our flushed data), qemu-img info -U"
    release one
    unserve a

    echo "$form reading (-r), then qemu:"
    serve a $form -r img.qcow2
    hold one "$(uri a)" || fail "$form -r: our reader was refused"
    [ "$(lock_bytes img.qcow2)" = "100 201 203 " ] ||
        fail "$form -r: our reader locks bytes $(lock_bytes img.qcow2)"
    qemu_refused "$W" qemu-io -f qcow2 -c "write 0 512" img.qcow2
    qemu_refused "$W" qemu-nbd -k "$PWD/q.sock" img.qcow2
    qemu_granted qemu-io -r -f qcow2 -c "read -P 0xa1 0 1M" img.qcow2
    qemu_granted qemu-img info img.qcow2
    echo "  granted: qemu-io -r, qemu-img info"
    release one
    unserve a

    echo "$form reading with qcow2-force-share=true, then qemu:"
    serve a $form -r img.qcow2 qcow2-force-share=true
    hold one "$(uri a)" || fail "$form -U: our reader was refused"
    [ "$(lock_bytes img.qcow2)" = "100 " ] ||
        fail "$form -U: our reader locks bytes $(lock_bytes img.qcow2)"
    qemu_granted qemu-io -f qcow2 -c "write -P 0xe5 3M 64k" img.qcow2
    echo "  granted: qemu-io writing"
    release one
    unserve a
done

# ------------------------------------------------------------ qemu, then ours
for holder in qemu-nbd qemu-io qemu-img; do
    new_image
    case $holder in
        qemu-nbd) start_qemu q 101 qemu-nbd -k "$PWD/q.sock" img.qcow2 ;;
        qemu-io) start_qemu q 101 qemu-io -f qcow2 -c "write -P 0x5a 0 64k" -c "sleep 600000" img.qcow2 ;;
        # A writer that grows the file as we look (bench walks the
        # whole disk, allocating): the served size and the file's then
        # differ by the time the filter compares them.  qemu keeps the
        # new L2 entries in its cache until it exits, so the metadata
        # on disk stays as our force-share reader below reads it.
        qemu-img) start_qemu q 101 qemu-img bench -w -c 1000000000 -d 1 -s 4096 -S 0 img.qcow2 ;;
    esac
    echo "$holder writing, then ours:"
    refused_start "$W" --filter="$FILTER" file img.qcow2
    refused_start "$SW" -r --filter="$FILTER" file img.qcow2
    refused_start "$W" "$PLUGIN" img.qcow2
    refused_start "$SW" -r "$PLUGIN" img.qcow2
    for form in filter plugin; do
        serve a $form -r img.qcow2 qcow2-force-share=true
        nbdcopy "$(uri a)" out.raw || fail "$holder: our $form -r with force share could not read"
        unserve a
    done
    echo "  granted: ours -r with qcow2-force-share=true, in both forms"
    kill "${PIDS[q]}"; wait "${PIDS[q]}" 2>/dev/null || true
done

new_image
echo "qemu-nbd -r, then ours:"
start_qemu q 100 qemu-nbd -r -k "$PWD/q.sock" img.qcow2
refused_start "$W" --filter="$FILTER" file img.qcow2
refused_start "$W" "$PLUGIN" img.qcow2
# Readers share: qemu-nbd -r, qemu-io -r, our filter and plugin with -r.
serve a filter -r img.qcow2
serve b plugin -r img.qcow2
hold one "$(uri a)" || fail "readers: our filter was refused"
hold two "$(uri b)" || fail "readers: our plugin was refused"
qemu_granted qemu-io -r -f qcow2 -c "read -P 0x11 0 4M" img.qcow2
qemu-img convert -O raw img.qcow2 qemu.raw
for s in a b; do
    nbdcopy "$(uri $s)" out.raw && cmp out.raw qemu.raw || fail "readers: $s reads other data"
done
release one
release two
unserve a
unserve b
kill "${PIDS[q]}"; wait "${PIDS[q]}" 2>/dev/null || true
echo "  readers share: qemu-nbd -r, qemu-io -r, our filter -r and plugin -r at once, same data"

echo "qemu-io -U reading, then ours writing:"
start_qemu q 100 qemu-io -r -U -f qcow2 -c "sleep 600000" img.qcow2
serve a plugin img.qcow2
hold one "$(uri a)" 0 65536 0xd7 || fail "our writer was refused by a force-share reader"
release one
unserve a
kill "${PIDS[q]}"; wait "${PIDS[q]}" 2>/dev/null || true
echo "  granted: a force-share reader does not stand in a writer's way"

# ------------------------------------------------------------ overlapping clients
# Two clients on one writable export: when the first leaves, the second
# still writes through the image, so its locks must stay; qemu-io is
# refused while the second is connected.  The first one's close has
# returned when its connection's threads are gone (nbdkit ends them
# after the close callbacks): a break there cannot hide behind timing.
threads_of () { ls "/proc/$1/task" | wc -l; }
for form in filter plugin; do
    section overlap-$form || continue
    echo "$form: two clients on one writable export, the first leaves:"
    new_image
    serve a $form img.qcow2
    before=$(threads_of "${PIDS[a]}")
    hold one "$(uri a)" 0 0x100000 0xa1 || fail "overlap $form: the first client was refused"
    one_threads=$(( $(threads_of "${PIDS[a]}") - before ))
    hold two "$(uri a)" 0x100000 0x100000 0xa2 || fail "overlap $form: the second client was refused"
    both=$(threads_of "${PIDS[a]}")
    [ "$(lock_bytes img.qcow2)" = "100 101 103 201 203 " ] ||
        fail "overlap $form: two clients lock bytes $(lock_bytes img.qcow2)"
    release one
    for (( i = 0; i < CALL_TIMEOUT * 10; i++ )); do
        [ "$(threads_of "${PIDS[a]}")" -gt $(( both - one_threads )) ] || break
        sleep 0.1
    done
    [ "$(threads_of "${PIDS[a]}")" -le $(( both - one_threads )) ] ||
        fail "overlap $form: the first client's connection did not end"
    [ "$(lock_bytes img.qcow2)" = "100 101 103 201 203 " ] ||
        fail "overlap $form: with the second client still connected, the locks are bytes '$(lock_bytes img.qcow2)'"
    qemu_refused "$W" qemu-io -f qcow2 -c "write -P 0x5e 0 64k" img.qcow2
    release two
    unserve a
    qemu-io -r -f qcow2 -c "read -P 0xa1 0 1M" -c "read -P 0xa2 1M 1M" img.qcow2 > read.out ||
        { cat read.out; fail "overlap $form: the clients' data is not there"; }
    qemu-img check -q img.qcow2 || fail "overlap $form: qemu-img check"
    echo "  the first client gone, the second connected: locks kept, qemu-io refused, both clients' data there"
done

# ------------------------------------------------------------ kill -9
for form in filter plugin; do
    new_image
    serve a $form img.qcow2
    hold one "$(uri a)" 0x100000 0x100000 0xc3 || fail "kill -9: our writer was refused"
    kill -9 "${PIDS[a]}"
    touch one.stop
    wait "${HOLDERS[one]}" 2>/dev/null || true
    unserve a
    qemu_granted qemu-io -f qcow2 -c "read -P 0xc3 1M 1M" -c "write -P 0x77 8M 64k" img.qcow2
    qemu-img check -q img.qcow2 || fail "kill -9 $form: qemu-img check"
    echo "$form killed with -9 while writing: the image is free (qemu-io writes), its flushed data there"
done

# ------------------------------------------------------------ between clients
# The locks last as long as the server, as qemu-nbd's: between two
# clients of one export, qemu and a second writer of ours are refused
# as while a client is connected, and the next client finds its data.
for form in filter plugin; do
    section between-$form || continue
    echo "$form, between two clients of one export:"
    new_image
    serve a $form img.qcow2
    hold one "$(uri a)" 0 0x100000 0xa1 || fail "between clients, $form: the first client was refused"
    release one
    [ "$(lock_bytes img.qcow2)" = "100 101 103 201 203 " ] ||
        fail "between clients, $form: bytes '$(lock_bytes img.qcow2)' locked with no client"
    qemu_refused "$SW" qemu-img info img.qcow2
    qemu_refused "$W" qemu-io -f qcow2 -c "write -P 0x66 0 64k" img.qcow2
    refused_start "$W" --filter="$FILTER" file img.qcow2
    refused_start "$W" "$PLUGIN" img.qcow2
    hold two "$(uri a)" 0x100000 0x100000 0xa2 || fail "between clients, $form: the second client was refused"
    release two
    unserve a
    [ -z "$(lock_bytes img.qcow2)" ] || fail "$form: bytes $(lock_bytes img.qcow2) still locked after nbdkit exited"
    qemu_granted qemu-io -f qcow2 -c "read -P 0xa1 0 1M" -c "read -P 0xa2 1M 1M" -c "write -P 0x77 8M 64k" img.qcow2
    echo "  nbdkit exited: no lock left; qemu-io reads both clients' data and writes"

    new_image
    serve a $form img.qcow2
    hold one "$(uri a)" 0 0x100000 0xa1 || fail "kill -9 between clients, $form: the client was refused"
    release one
    [ -n "$(lock_bytes img.qcow2)" ] || fail "kill -9 between clients, $form: nothing locked"
    kill -9 "${PIDS[a]}"
    unserve a
    [ -z "$(lock_bytes img.qcow2)" ] || fail "kill -9 between clients, $form: bytes $(lock_bytes img.qcow2) still locked"
    qemu_granted qemu-io -f qcow2 -c "read -P 0xa1 0 1M" -c "write -P 0x77 8M 64k" img.qcow2
    echo "  killed with -9 between clients: no lock left; qemu-io writes"
done

# ------------------------------------------------------------ locking off
new_image
start_qemu q 101 qemu-nbd -k "$PWD/q.sock" img.qcow2
for form in filter plugin; do
    serve a $form -r img.qcow2 qcow2-locking=off
    nbdcopy "$(uri a)" out.raw || fail "qcow2-locking=off: our $form was refused"
    unserve a
done
kill "${PIDS[q]}"; wait "${PIDS[q]}" 2>/dev/null || true
serve a plugin img.qcow2 qcow2-locking=off
hold one "$(uri a)" 0 65536 0xd7 || fail "qcow2-locking=off: our writer was refused"
[ -z "$(lock_bytes img.qcow2)" ] || fail "qcow2-locking=off: bytes $(lock_bytes img.qcow2) locked"
qemu_granted qemu-io -r -f qcow2 -c "read 0 512" img.qcow2
release one
unserve a
echo "qcow2-locking=off: no locks taken, none respected"

# ------------------------------------------------------------ backing files
rm -f base.qcow2 img.qcow2
qemu-img create -q -f qcow2 base.qcow2 64M
qemu-io -f qcow2 -c "write -P 0x22 0 1M" base.qcow2 > /dev/null
qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 img.qcow2
truncate -s +1M img.qcow2
for form in filter plugin; do
    serve a $form img.qcow2
    hold one "$(uri a)" 0x200000 65536 0xa1 || fail "backing: our writer was refused"
    [ "$(lock_bytes base.qcow2)" = "100 201 203 " ] ||
        fail "backing: $form locks bytes $(lock_bytes base.qcow2) of the backing file"
    qemu_refused "$W" qemu-io -f qcow2 -c "write 0 512" base.qcow2
    qemu_granted qemu-io -r -f qcow2 -c "read -P 0x22 0 1M" base.qcow2
    release one
    [ "$(lock_bytes base.qcow2)" = "100 201 203 " ] ||
        fail "backing: $form locks bytes '$(lock_bytes base.qcow2)' of the backing file with no client"
    qemu_refused "$W" qemu-io -f qcow2 -c "write 0 512" base.qcow2
    unserve a
    [ -z "$(lock_bytes base.qcow2)" ] || fail "backing: $form left bytes $(lock_bytes base.qcow2) locked"
done
echo "backing file: locked as qemu locks it (bytes 100, 201, 203), with or without a client, until nbdkit exits; qemu cannot write it, can read it"

# ------------------------------------------------------------ which file is served
# A file the plugin serves with another size but the same first bytes
# (here under the truncate filter) is the one locked; a file whose
# bytes are served from elsewhere in it (the offset filter) is not.
new_image
start_qemu q 101 qemu-nbd -k "$PWD/q.sock" img.qcow2
start_server "$PWD/a.sock" --filter=truncate file img.qcow2 \
    truncate=$(( $(stat -c %s img.qcow2) + 65536 ))
PIDS[a]=$SERVER_PID JOBS[a]=$SERVER_JOB SERVER_PID=
refused_client a "$(uri a)" "$W"
unserve a
kill "${PIDS[q]}"; wait "${PIDS[q]}" 2>/dev/null || true
echo "  served with another size, same first bytes: locked (and refused beside qemu-nbd)"
# Not confirmed as the file served, it cannot be locked: with
# qcow2-locking=on (the default) it is not written, but read (unlocked);
# with qcow2-locking=auto it is written unlocked, with a warning at
# error level (no -v).
qemu-img create -q -f qcow2 inner.qcow2 32M
{ head -c 1M /dev/zero; cat inner.qcow2; head -c 1M /dev/zero; } > outer.img
UNCONFIRMED="the plugin serves [0-9]* bytes, not the [0-9]* of $PWD/outer.img, and they begin differently: it is not that file, so the image cannot be locked, and it is not opened for writing unlocked: serve it read-only (-r), or give qcow2-locking=auto to write it without a lock"
start_server "$PWD/a.sock" --filter=offset file outer.img offset=1M
PIDS[a]=$SERVER_PID JOBS[a]=$SERVER_JOB SERVER_PID=
refused_client a "$(uri a)" "$UNCONFIRMED"
unserve a
echo "  served from 1M into the file, qcow2-locking=on: not written"
start_server "$PWD/a.sock" -r --filter=offset file outer.img offset=1M -v
PIDS[a]=$SERVER_PID JOBS[a]=$SERVER_JOB SERVER_PID=
hold one "$(uri a)" || fail "offset, -r: our reader was refused"
[ -z "$(lock_bytes outer.img)" ] || fail "offset, -r: bytes $(lock_bytes outer.img) of outer.img locked"
release one
unserve a
grep -q "it is not that file: the image is read without a lock" a.sock.log ||
    { cat a.sock.log; fail "offset, -r: no debug line for the file not locked"; }
echo "  served from 1M into the file, -r: read, not locked"
before=$(sha256sum < outer.img)
start_server "$PWD/a.sock" --filter=offset file outer.img offset=1M qcow2-locking=auto
PIDS[a]=$SERVER_PID JOBS[a]=$SERVER_JOB SERVER_PID=
hold one "$(uri a)" 0 65536 0xe1 || fail "offset, qcow2-locking=auto: our writer was refused"
[ -z "$(lock_bytes outer.img)" ] || fail "offset, auto: bytes $(lock_bytes outer.img) of outer.img locked"
release one
unserve a
[ "$(sha256sum < outer.img)" != "$before" ] || fail "offset, auto: nothing was written"
grep -q "error: qcow2zstd: warning: export '': the plugin serves .* it is not that file: the image is served without a lock (qcow2-locking=auto)" a.sock.log ||
    { cat a.sock.log; fail "offset, auto: no warning"; }
echo "  served from 1M into the file, qcow2-locking=auto: written unlocked, warned ($(grep -o "warning: .*" a.sock.log | head -1 | cut -c1-90)...)"

# ------------------------------------------------------------ no lock possible
NBDKIT_TIMEOUT=120 run_nbdkit -v -U "$PWD/mem.sock" --filter="$FILTER" memory 64M \
    qcow2-create=32M --run 'nbdinfo --size "$uri"' > /dev/null 2> mem.err ||
    { cat mem.err; fail "over the memory plugin"; }
grep -q "serves no local file.*not locked" mem.err || { cat mem.err; fail "no debug line for an unlocked image"; }
echo "over the memory plugin: $(grep -o "serves no local file.*" mem.err | head -1)"

# ------------------------------------------------------------ read-only sessions
# An image with a persistent bitmap (autoclear bit 0).
for form in filter plugin; do
    rm -f bm.qcow2
    qemu-img create -q -f qcow2 bm.qcow2 64M
    qemu-io -f qcow2 -c "write -P 0x33 0 1M" bm.qcow2 > /dev/null
    qemu-img bitmap --add bm.qcow2 b0
    truncate -s +1M bm.qcow2
    before=$(sha256sum < bm.qcow2)
    serve a $form bm.qcow2
    nbdinfo "$(uri a)" > /dev/null
    nbdinfo --map "$(uri a)" > /dev/null
    nbdcopy "$(uri a)" out.raw
    "$PYTHON" -c '
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pread(65536, 0)
h.flush()
h.zero(1 << 20, 32 << 20)       # reads as zeros already
h.trim(1 << 20, 40 << 20)       # nothing allocated there
h.flush()
h.shutdown()' "$(uri a)"
    unserve a
    [ "$(sha256sum < bm.qcow2)" = "$before" ] || fail "$form: a read-only session changed the file"
    echo "$form: a session that only read, flushed, zeroed zeros and trimmed nothing left the file as it was"
    serve a $form bm.qcow2
    "$PYTHON" -c '
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1]); h.pwrite(b"w" * 512, 4 << 20); h.flush(); h.shutdown()' "$(uri a)"
    unserve a
    autoclear=$(od -An -tx1 -j88 -N8 bm.qcow2 | tr -d ' \n')
    [ "$autoclear" = 0000000000000001 ] || fail "$form: the first write left autoclear bits $autoclear"
    qemu-img check bm.qcow2 > check.out 2>&1 || { cat check.out; fail "$form: check after the first write"; }
    map=$(nbdinfo --map=qemu:dirty-bitmap:b0 -- [ qemu-nbd -r -B b0 -f qcow2 bm.qcow2 ]) ||
        fail "$form: qemu cannot serve the bitmap after the first write"
    [ "$(awk '$3 == 1 { print $1, $2 }' <<<"$map")" = "4194304 65536" ] ||
        { echo "$map"; fail "$form: the bitmap does not mark the write, and only it"; }
    echo "$form: the first write kept autoclear bit 0; qemu serves bitmap b0 with the write's 64 KiB marked"
done
