#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# LUKS-encrypted images: a full read and a full write of an encrypted disk
# through the qcow2zstd filter and through qemu-nbd, the same image, the
# same passphrase and the same client, in one run.
#
#   read:  a 1 GiB image qemu-img convert made from random data
#          (aes-256-xts-plain64, qemu-img's default), read whole with
#          nbdcopy URI null: from a read-only server.  The image is in the
#          page cache for both, so the cipher and the servers are measured.
#   write: nbdcopy of the 1 GiB of random data into a new, empty encrypted
#          image qemu-img create made (with its final flush).
#
# The contenders alternate, BENCH_RUNS times each; the table shows the
# medians of the wall time, the throughput and the server's CPU seconds,
# and the ratio qemu-nbd time / filter time.  Every written image is
# compared with the data by qemu-img compare (with the secret).
#
#   bench/bench-luks.sh                  1 GiB, 5 runs
#   BENCH_QUICK=1 bench/bench-luks.sh    256 MiB, 3 runs
#   BENCH_LUKS_SIZE=512M                 another disk size
#   BENCH_DIR, BENCH_RUNS, BENCH_NICE, FILTER: as in bench/common.sh
source "$(dirname "$0")/common.sh"

if [ "$BENCH_QUICK" = 1 ]; then
    : "${BENCH_LUKS_SIZE:=256M}"
else
    : "${BENCH_LUKS_SIZE:=1G}"
fi
need_cmds nbdkit qemu-nbd qemu-img nbdcopy nbdinfo
[ -f "$FILTER" ] || die "the filter is not built: $FILTER"
bench_nice

RUN_DIR=$BENCH_DIR/luks
mkdir -p "$RUN_DIR"
cp -f "$FILTER" "$RUN_DIR/filter.so"
FILTER=$RUN_DIR/filter.so
PASSFILE=$RUN_DIR/pass
printf 'bench passphrase' > "$PASSFILE"
SECRET="secret,id=s0,file=$PASSFILE"
# iter-time only sets how long opening takes, which no timing includes:
# both servers are started and answer a first client before the clock.
LUKS_OPTS=encrypt.format=luks,encrypt.key-secret=s0,encrypt.iter-time=200

# qemu-img's PBKDF benchmark fails now and then on a busy machine ("Unable
# to get accurate CPU usage"): try again.
qemu_img_retry ()
{
    local i
    for i in 1 2 3 4 5; do
        qemu-img "$@" 2> "$RUN_DIR/qemu-img.err" && return 0
        grep -q "accurate CPU usage" "$RUN_DIR/qemu-img.err" ||
            { cat "$RUN_DIR/qemu-img.err" >&2; return 1; }
    done
    return 1
}

RAW=$RUN_DIR/data-$BENCH_LUKS_SIZE.raw
IMG=$RUN_DIR/read-$BENCH_LUKS_SIZE.qcow2
if [ ! -s "$RAW" ] || [ ! -s "$IMG" ]; then
    msg "making $BENCH_LUKS_SIZE of random data and its encrypted image"
    rm -f "$RAW" "$IMG"
    bytes=$(numfmt --from=iec "$BENCH_LUKS_SIZE")
    head -c "$bytes" /dev/urandom > "$RAW"
    qemu_img_retry convert -f raw -O qcow2 --object "$SECRET" -o "$LUKS_OPTS" \
        "$RAW" "$IMG" || die "qemu-img convert failed"
fi
SIZE=$(stat -c %s "$RAW")
MB=$(calc "$SIZE / 1000000")

qemu_opts () { echo "driver=qcow2,file.filename=$1,encrypt.key-secret=s0"; }

# measure OUT NAME: time nbdcopy "$@" against the server started last;
# append "wall server_cpu" to OUT.
measure ()
{
    local out=$1 cpu0 cpu1 t0 t1
    shift
    cpu0=$(proc_cpu "$SERVER_PID")
    t0=$(now)
    nbdcopy "$@" 2>> "$RUN_DIR/nbdcopy.log" || die "nbdcopy $* failed"
    t1=$(now)
    server_alive
    cpu1=$(proc_cpu "$SERVER_PID")
    echo "$(calc "$t1 - $t0") $(calc "$cpu1 - $cpu0")" >> "$out"
}

read_qemu ()
{
    start_command qemu-read qemu-nbd -r --persistent -e 8 -k SOCK \
        --object "$SECRET" --image-opts "$(qemu_opts "$IMG")"
    measure "$RUN_DIR/read-qemu.txt" "$SERVER_URI" null:
    stop_server
}

read_filter ()
{
    start_command filter-read nbdkit -f -r -U SOCK --filter="$FILTER" \
        file "$IMG" "qcow2-passphrase=+$PASSFILE"
    measure "$RUN_DIR/read-filter.txt" "$SERVER_URI" null:
    stop_server
}

# A new empty encrypted image for a write run; the filter's gets room to
# grow into (a filter cannot extend the file).
new_target ()
{
    rm -f "$1"
    qemu_img_retry create -q -f qcow2 --object "$SECRET" -o "$LUKS_OPTS" \
        "$1" "$SIZE" || die "qemu-img create failed"
}

check_target ()
{
    qemu-img compare -q --object "$SECRET" --image-opts "$(qemu_opts "$1")" \
        "driver=raw,file.filename=$RAW" || die "$2: the written image differs from the data"
}

write_qemu ()
{
    local t=$RUN_DIR/write-qemu.qcow2
    new_target "$t"
    start_command qemu-write qemu-nbd --persistent -e 8 -k SOCK \
        --object "$SECRET" --image-opts "$(qemu_opts "$t")"
    measure "$RUN_DIR/write-qemu.txt" "$RAW" "$SERVER_URI"
    stop_server
    check_target "$t" qemu-nbd
    rm -f "$t"
}

write_filter ()
{
    local t=$RUN_DIR/write-filter.qcow2
    new_target "$t"
    truncate -s +$((SIZE + SIZE / 8)) "$t"
    start_command filter-write nbdkit -f -U SOCK --filter="$FILTER" \
        file "$t" "qcow2-passphrase=+$PASSFILE"
    measure "$RUN_DIR/write-filter.txt" "$RAW" "$SERVER_URI"
    stop_server
    check_target "$t" filter
    rm -f "$t"
}

rm -f "$RUN_DIR"/read-*.txt "$RUN_DIR"/write-*.txt
warm_files "$IMG" "$RAW"
msg "$BENCH_RUNS runs of each, alternating"
for i in $(seq "$BENCH_RUNS"); do
    warm_files "$IMG"
    read_qemu
    read_filter
    warm_files "$RAW"
    write_qemu
    write_filter
done

echo "LUKS: $BENCH_LUKS_SIZE aes-256-xts-plain64 disk of random data, nbdcopy, $NPROC CPUs," \
     "median of $BENCH_RUNS runs"
echo "cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)"
printf '%-28s %9s %9s %12s %16s\n' "" "wall s" "MB/s" "server CPU s" "qemu-nbd/filter"
for op in read write; do
    wq=$(col_median "$RUN_DIR/$op-qemu.txt" 1)
    wf=$(col_median "$RUN_DIR/$op-filter.txt" 1)
    cq=$(col_median "$RUN_DIR/$op-qemu.txt" 2)
    cf=$(col_median "$RUN_DIR/$op-filter.txt" 2)
    printf '%-28s %9s %9s %12s %16s\n' "$op: qemu-nbd" "$(fmt 2 "$wq")" \
        "$(fmt 0 "$(calc "$MB / $wq")")" "$(fmt 2 "$cq")" ""
    printf '%-28s %9s %9s %12s %16s\n' "$op: qcow2zstd filter" "$(fmt 2 "$wf")" \
        "$(fmt 0 "$(calc "$MB / $wf")")" "$(fmt 2 "$cf")" "$(fmt 2 "$(ratio "$wq" "$wf")")x"
done
target "encrypted full read: speedup vs qemu-nbd" \
    "$(ratio "$(col_median "$RUN_DIR/read-qemu.txt" 1)" \
             "$(col_median "$RUN_DIR/read-filter.txt" 1)")" ">=" 1.5
