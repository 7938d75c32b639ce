#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Mounting the guest's ext4 filesystem read-write with the kernel's NBD
# client: nbd-client connects /dev/nbdN to the export and the kernel
# mounts the ext4 filesystem on it.  The files read through the mount
# must equal the files the filesystem was made from; files written,
# changed, shrunk and deleted through the mount must be in the qcow2
# afterwards: qemu-img check clean, e2fsck -fn clean, debugfs finds the
# expected files, and a read-only mount over NBD shows them too.
#
# Needs the nbd kernel module (modprobe nbd, or /dev/nbd0 present),
# nbd-client (package nbd-client), permission to mount, and e2fsprogs.
# Skipped, with the reason, wherever one of these is missing (containers
# usually have no /dev/nbd*; tests/test-mount.sh covers mounting through
# FUSE instead).
source "${top_srcdir:-.}/tests/functions.sh"
source "${top_srcdir:-.}/tests/mount-functions.sh"

skip () { echo "$0: skipped: $*"; exit 77; }
PATH=$PATH:/sbin:/usr/sbin

[ "$(id -u)" = 0 ] || skip "needs root for nbd-client and mount"
if [ ! -b /dev/nbd0 ]; then
    if ! command -v modprobe >/dev/null 2>&1; then
        skip "/dev/nbd0 does not exist and modprobe is not installed (package kmod) to load the nbd module"
    fi
    if ! modprobe nbd > "$TMPDIR_TEST/modprobe.err" 2>&1; then
        skip "/dev/nbd0 does not exist and 'modprobe nbd' failed: $(head -c 200 "$TMPDIR_TEST/modprobe.err")"
    fi
    wait_until 5 test -b /dev/nbd0 ||
        skip "'modprobe nbd' succeeded but /dev/nbd0 did not appear (no devtmpfs in this container?)"
fi
for cmd in nbd-client mke2fs e2fsck debugfs mountpoint diff cmp; do
    command -v "$cmd" >/dev/null 2>&1 || skip "'$cmd' is not installed (packages: nbd-client e2fsprogs)"
done

# A free NBD device: one the kernel has no connection for.
dev=
for d in /dev/nbd{0..15}; do
    [ -b "$d" ] || continue
    n=${d#/dev/}
    if [ ! -e "/sys/block/$n/pid" ] && [ "$(cat "/sys/block/$n/size" 2>/dev/null || echo 0)" = 0 ]; then
        dev=$d
        break
    fi
done
[ -n "$dev" ] || skip "every /dev/nbd0../dev/nbd15 is in use"
name=${dev#/dev/}

cd "$TMPDIR_TEST"

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
trap 'kernel_cleanup; _cleanup' EXIT

# connect SOCKET [nbd-client options]: attach $dev to the server.
connect ()
{
    local sock=$1
    shift
    nbd-client -unix "$sock" "$dev" -N qcow2 -b 4096 "$@" > nbd-client.out 2>&1 || return 1
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

# ------------------------------------------------------- can we do this?
# nbd-client and mount against a plain nbdkit memory disk, without the
# filter: a failure here is the environment, not the filter.
probe_sock=$PWD/probe.sock
run_nbdkit -U "$probe_sock" -P "$probe_sock.pid" -f memory 16M 2>/dev/null &
probe_server=$!
_pids+=("$probe_server")
wait_until 20 test -S "$probe_sock" || skip "nbdkit memory did not start for the probe"
connect "$probe_sock" || skip "nbd-client cannot connect $dev: $(head -c 200 nbd-client.out)"
mke2fs -q -t ext4 -F "$dev" > /dev/null 2>&1 || { disconnect; skip "mke2fs on $dev failed"; }
mkdir -p probe
mounted+=("$PWD/probe")
mount -t ext4 "$dev" probe 2> mount.err || { disconnect; skip "cannot mount ext4 from $dev: $(head -c 200 mount.err)"; }
umount probe
disconnect
kill "$probe_server" 2>/dev/null; wait "$probe_server" 2>/dev/null || true

# ------------------------------------------------------------- the test
make_fs_image
sock=$PWD/sock
start_server "$sock" file img.qcow2

connect "$sock" || { cat nbd-client.out; fail "nbd-client could not connect $dev to the export"; }
cmp "$dev" img.raw || fail "$dev differs from the ext4 image it was made from"
echo "nbd-client: $dev equals the ext4 image it was made from"

mkdir -p mnt
mounted+=("$PWD/mnt")
mount -t ext4 "$dev" mnt || fail "mount $dev failed"
compare_tree mnt "read through the kernel mount"
echo "kernel ext4 mount of $dev, read-write: every file equals its source"

change_tree mnt
sync
compare_tree mnt "after writing, through the mount"
umount mnt || fail "umount failed"
disconnect
echo "wrote 3 MiB + a text file, changed, appended, shrank, deleted and filled a hole; unmounted and disconnected"
stop_server

check_image_after "after the kernel read-write mount"
echo "after stop: qemu-img check clean, e2fsck -fn clean, debugfs finds every expected file"

# Read-only: nbdkit -r, nbd-client -readonly, mount -o ro,noload.
start_server "$sock" -r file img.qcow2
connect "$sock" -readonly || { cat nbd-client.out; fail "nbd-client -readonly could not connect"; }
mount -t ext4 -o ro,noload "$dev" mnt || fail "read-only mount failed"
compare_tree mnt "read-only kernel mount"
umount mnt
disconnect
stop_server
echo "mounted again read-only (nbd-client -readonly, mount -o ro): every file as written"
