#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Mounting the guest's ext4 filesystem read-write with the kernel's NBD
# client: nbd-client connects /dev/nbdN to the export and the kernel
# mounts the ext4 filesystem on it.  Two ways, each run where it can be:
#
#   guest  Debian's kernel, booted by qemu-system-x86_64 from an
#          initramfs made of Debian packages (tests/guest-functions.sh),
#          runs nbd-client against 'nbdkit -s --filter=qcow2zstd file
#          img.qcow2', which qemu's user network starts for the guest's
#          connection to 10.0.2.100:10809 (guestfwd=...-cmd:) and which
#          talks over qemu's pipes: no address of this machine is used.
#          In the guest: the files read through the mount match the sums
#          made on the host, files are written, changed, shrunk and
#          deleted, read back after the page cache is dropped, fstrim
#          discards the free space; unmount, disconnect.
#   host   this machine's own nbd module and nbd-client (where /dev/nbd0
#          exists or modprobe nbd works, usually not in containers),
#          read-write and then read-only.
#
# After each, on the host: qemu-img check clean, e2fsck -fn clean, and
# the files of the filesystem (read by debugfs, without any mount) as
# expected.  Skipped only when neither can run, with both reasons.
source "${top_srcdir:-.}/tests/functions.sh"
source "${top_srcdir:-.}/tests/mount-functions.sh"
source "${top_srcdir:-.}/tests/guest-functions.sh"

PATH=$PATH:/sbin:/usr/sbin
requires mke2fs e2fsck debugfs diff cmp md5sum

cd "$TMPDIR_TEST"

# ================================================================ guest
guest_session ()
{
    rm -rf src expect guest && mkdir guest
    make_fs_image
    head -c 3M /dev/urandom > guest/new-big.dat
    head -c 16M /dev/urandom > guest/large.dat
    cp "$top_srcdir/tests/tree-changes.sh" guest/
    tree_sums src > guest/sums.before
    apply_tree_changes expect guest/new-big.dat
    cp guest/large.dat expect/new/large.dat
    cp guest/new-big.dat new-big.dat   # for check_image_after
    tree_sums expect > guest/sums.after

    cat > guest/run.sh <<'EOF'
. ./tree-changes.sh
nbd-client -N qcow2 10.0.2.100 10809 /dev/nbd0
echo "GUEST: nbd-client connected /dev/nbd0, $(cat /sys/block/nbd0/size) sectors"
mount -t ext4 /dev/nbd0 /mnt
check_sums /mnt /test/sums.before
apply_tree_changes /mnt /test/new-big.dat
cp /test/large.dat /mnt/new/large.dat
sync
echo 3 > /proc/sys/vm/drop_caches
check_sums /mnt /test/sums.after
echo "GUEST: fstrim: $(fstrim -v /mnt)"
umount /mnt
nbd-client -d /dev/nbd0
echo "GUEST: unmounted and disconnected"
EOF

    # The server, run by qemu for the guest's connection: the filter
    # under nbdkit's log filter, which records the guest's trims.
    local fwd
    fwd=$(guest_nbdkit_cmd "$PWD/nbdkit.log" "$PWD/nbdkit.status" \
              --filter=log --filter="$FILTER" file "$PWD/img.qcow2" logfile="$PWD/requests.log")
    rm -f nbdkit.status requests.log
    local start=$SECONDS
    guest_boot kernel 900 guest \
        -netdev "user,id=net0,restrict=on,guestfwd=tcp:10.0.2.100:10809-cmd:$fwd" \
        -device virtio-net-pci,netdev=net0 ||
        { cat nbdkit.log >&2 2>/dev/null; fail "guest: $GUEST_FAILURE"; }
    grep -E '^(GUEST|/mnt): ' kernel.console
    # nbdkit -s exits once the guest has disconnected and it has written
    # the image's metadata.
    guest_nbdkit_end guest nbdkit.log nbdkit.status
    echo "guest: the session took $((SECONDS - start)) s ($GUEST_ACCEL)"

    local trimmed trims
    trimmed=$(sed -n 's/^GUEST: fstrim: .*: \([0-9]*\) bytes trimmed.*/\1/p' kernel.console)
    [ "${trimmed:-0}" -gt 0 ] || fail "guest: fstrim trimmed nothing: $(grep 'fstrim' kernel.console)"
    trims=$(grep -c ' Trim id=[0-9]* offset=' requests.log || true)
    [ "$trims" -gt 0 ] || fail "guest: fstrim said $trimmed bytes, but no trim reached nbdkit"
    if grep -E ' id=[0-9]+ return=-' requests.log | head -n 5 | grep .; then
        fail "guest: requests failed (above)"
    fi
    check_image_after "after the guest's kernel read-write mount"
    echo "guest: fstrim discarded $trimmed bytes in $trims trim requests; qemu-img check clean, e2fsck -fn clean, debugfs finds every expected file"
}

# ================================================================= host
# host_client: the host's kernel nbd client, if it has one; 1 with the
# reason in $HOST_SKIP if not.
dev=
name=
connected=no
mounted=()
kernel_cleanup ()
{
    local m
    for m in "${mounted[@]}"; do
        mountpoint -q "$m" 2>/dev/null && { umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; }
    done
    [ "$connected" = yes ] && nbd-client -d "$dev" > /dev/null 2>&1 || true
}
# The test's status goes on to functions.sh's cleanup, which judges the
# servers still running only when the test passed.
# shellcheck disable=SC2154
trap 'st=$?; kernel_cleanup; _cleanup "$st"' EXIT

# connect SOCKET [nbd-client options]: attach $dev to the server.
connect ()
{
    local sock=$1
    shift
    nbd-client -unix "$sock" "$dev" -N qcow2 "$@" > nbd-client.out 2>&1 || return 1
    connected=yes
    wait_until 10 eval '[ -e /sys/block/$name/pid ] && [ "$(cat /sys/block/$name/size)" != 0 ]'
}

# disconnect: detach $dev and wait until the kernel let go of it.
disconnect ()
{
    nbd-client -d "$dev" > nbd-client.out 2>&1 || { cat nbd-client.out; fail "nbd-client -d $dev failed"; }
    connected=no
    wait_until 30 eval '[ ! -e /sys/block/$name/pid ]' || fail "$dev still connected 30 s after nbd-client -d"
}

# host_client_usable: whether the host can attach and mount an NBD device
# at all (against a plain nbdkit memory disk, without the filter: a
# failure here is the environment, not the filter).  Sets $dev, or
# HOST_SKIP.
host_client_usable ()
{
    HOST_SKIP=
    [ "$(id -u)" = 0 ] || { HOST_SKIP="needs root for nbd-client and mount"; return 1; }
    if [ ! -b /dev/nbd0 ]; then
        if ! command -v modprobe >/dev/null 2>&1; then
            HOST_SKIP="/dev/nbd0 does not exist and modprobe is not installed (package kmod) to load the nbd module"
            return 1
        fi
        if ! modprobe nbd > modprobe.err 2>&1; then
            HOST_SKIP="/dev/nbd0 does not exist and 'modprobe nbd' failed: $(head -c 200 modprobe.err)"
            return 1
        fi
        wait_until 5 test -b /dev/nbd0 ||
            { HOST_SKIP="'modprobe nbd' succeeded but /dev/nbd0 did not appear (no devtmpfs in this container?)"; return 1; }
    fi
    local cmd d
    for cmd in nbd-client mountpoint; do
        command -v "$cmd" >/dev/null 2>&1 || { HOST_SKIP="'$cmd' is not installed (packages: nbd-client util-linux)"; return 1; }
    done
    # A free NBD device: one the kernel has no connection for.
    for d in /dev/nbd{0..15}; do
        [ -b "$d" ] || continue
        n=${d#/dev/}
        if [ ! -e "/sys/block/$n/pid" ] && [ "$(cat "/sys/block/$n/size" 2>/dev/null || echo 0)" = 0 ]; then
            dev=$d
            break
        fi
    done
    [ -n "$dev" ] || { HOST_SKIP="every /dev/nbd0../dev/nbd15 is in use"; return 1; }
    name=${dev#/dev/}

    local probe_sock=$PWD/probe.sock probe_server
    start_nbdkit "$probe_sock" memory 16M || { HOST_SKIP="nbdkit memory did not start for the probe"; return 1; }
    probe_server=$SERVER_PID
    connect "$probe_sock" || { HOST_SKIP="nbd-client cannot connect $dev: $(head -c 200 nbd-client.out)"; return 1; }
    mke2fs -q -t ext4 -F "$dev" > /dev/null 2>&1 || { disconnect; HOST_SKIP="mke2fs on $dev failed"; return 1; }
    mkdir -p probe
    mounted+=("$PWD/probe")
    if ! mount -t ext4 "$dev" probe 2> mount.err; then
        disconnect
        HOST_SKIP="cannot mount ext4 from $dev: $(head -c 200 mount.err)"
        return 1
    fi
    umount probe
    disconnect
    stop_server "$probe_server"
}

host_session ()
{
    rm -rf src expect
    make_fs_image
    local sock=$PWD/sock
    start_server "$sock" file img.qcow2

    connect "$sock" || { cat nbd-client.out; fail "host: nbd-client could not connect $dev to the export"; }
    cmp "$dev" img.raw || fail "host: $dev differs from the ext4 image it was made from"
    echo "host: nbd-client: $dev equals the ext4 image it was made from"

    mkdir -p mnt
    mounted+=("$PWD/mnt")
    mount -t ext4 "$dev" mnt || fail "host: mount $dev failed"
    compare_tree mnt "host: read through the kernel mount"
    echo "host: kernel ext4 mount of $dev, read-write: every file equals its source"

    change_tree mnt
    sync
    compare_tree mnt "host: after writing, through the mount"
    umount mnt || fail "host: umount failed"
    disconnect
    echo "host: wrote 3 MiB + a text file, changed, appended, shrank, deleted and filled a hole; unmounted and disconnected"
    stop_server

    check_image_after "host: after the kernel read-write mount"
    echo "host: after stop: qemu-img check clean, e2fsck -fn clean, debugfs finds every expected file"

    # Read-only: nbdkit -r, nbd-client -readonly, mount -o ro,noload.
    start_server "$sock" -r file img.qcow2
    connect "$sock" -readonly || { cat nbd-client.out; fail "host: nbd-client -readonly could not connect"; }
    mount -t ext4 -o ro,noload "$dev" mnt || fail "host: read-only mount failed"
    compare_tree mnt "host: read-only kernel mount"
    umount mnt
    disconnect
    stop_server
    echo "host: mounted again read-only (nbd-client -readonly, mount -o ro): every file as written"
}

# ================================================================= main
ran=0
if guest_prepare; then
    guest_session
    ran=$((ran + 1))
else
    skip_section "guest: $GUEST_SKIP"
fi
if host_client_usable; then
    host_session
    ran=$((ran + 1))
else
    skip_section "host: $HOST_SKIP"
fi
[ "$ran" -gt 0 ] || skip "no kernel NBD client: guest: $GUEST_SKIP; host: $HOST_SKIP"
