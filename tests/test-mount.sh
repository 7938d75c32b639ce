#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Mounting the guest's ext4 filesystem read-write without kernel NBD:
# nbdfuse presents the export as a file, fuse2fs mounts the filesystem in
# that file.  The files read through both FUSE layers must equal the
# files the filesystem was made from; files written, changed, shrunk and
# deleted through the mount must be in the qcow2 afterwards: qemu-img
# check clean, e2fsck -fn clean, debugfs finds the expected files, and a
# second read-only mount with fuse2fs shows them too.  Then the same
# read-write round with the kernel's ext4 on a loop device over the
# nbdfuse file (the README's recipe), when loop devices can be used.
#
# Needs libnbd-bin (nbdfuse), fuse3 (fusermount3), fuse2fs and e2fsprogs
# (mke2fs -d, e2fsck, debugfs), /dev/fuse and permission to mount FUSE
# filesystems.
source "${top_srcdir:-.}/tests/functions.sh"
source "${top_srcdir:-.}/tests/mount-functions.sh"


for cmd in nbdfuse fuse2fs mke2fs e2fsck debugfs mountpoint diff cmp; do
    command -v "$cmd" >/dev/null 2>&1 || PATH=$PATH:/sbin:/usr/sbin
    command -v "$cmd" >/dev/null 2>&1 ||
        skip "'$cmd' is not installed (packages: libnbd-bin fuse3 fuse2fs e2fsprogs)"
done
[ -c /dev/fuse ] || skip "/dev/fuse does not exist (no FUSE in this kernel or container)"
{ exec 9<>/dev/fuse; } 2>/dev/null || skip "/dev/fuse cannot be opened (permission denied in this sandbox)"
exec 9>&-

cd "$TMPDIR_TEST"

# Unmount whatever is still mounted when the test ends, before the
# servers are killed and the directory is removed.
mounts=()
mount_pids=()
unmount ()
{
    if command -v fusermount3 >/dev/null 2>&1; then
        fusermount3 -u "$1" 2>/dev/null || umount "$1" 2>/dev/null
    else
        umount "$1" 2>/dev/null
    fi
}
mount_cleanup ()
{
    local i m
    for (( i = ${#mounts[@]} - 1; i >= 0; i-- )); do
        m=${mounts[i]}
        if mountpoint -q "$m" 2>/dev/null; then
            unmount "$m" || umount -l "$m" 2>/dev/null || true
        fi
    done
    for i in "${mount_pids[@]}"; do
        kill "$i" 2>/dev/null || true
    done
}
trap 'status=$?; mount_cleanup; _cleanup "$status"' EXIT

# nbdfuse_mount DIR SOCKET [OPTIONS]: nbdfuse in the background; the
# export appears as DIR/nbd.  Sets NBDFUSE_PID.  Returns 1 if the file
# did not appear (nbdfuse's messages are in DIR.err).
nbdfuse_mount ()
{
    local dir=$1 sock=$2
    shift 2
    mkdir -p "$dir"
    nbdfuse "$@" "$dir" --unix "$sock" 2> "$dir.err" &
    NBDFUSE_PID=$!
    mount_pids+=("$NBDFUSE_PID")
    mounts+=("$dir")
    wait_until 20 test -f "$dir/nbd"
}

# fuse2fs_mount FILE DIR [OPTIONS]: fuse2fs in the foreground, in the
# background, so that its exit (after it wrote everything) can be waited
# for.  Sets FUSE2FS_PID.
fuse2fs_mount ()
{
    local file=$1 dir=$2
    shift 2
    mkdir -p "$dir"
    fuse2fs "$file" "$dir" -f "$@" > "$dir.err" 2>&1 &
    FUSE2FS_PID=$!
    mount_pids+=("$FUSE2FS_PID")
    mounts+=("$dir")
    wait_until 20 mountpoint -q "$dir"
}

# fusermount_idle DIR: whether nothing (a loop device being released)
# holds the nbdfuse file open any more.
fusermount_idle ()
{
    command -v losetup > /dev/null 2>&1 || return 0
    ! losetup -j "$1/nbd" 2>/dev/null | grep -q .
}

# umount_wait DIR PID WHAT: unmount DIR and wait for its daemon to exit
# with status 0.
umount_wait ()
{
    local dir=$1 pid=$2 what=$3 status=0
    unmount "$dir" || fail "$what: cannot unmount $dir"
    wait_exit "$pid" 30 || status=$?
    [ "$status" = 124 ] && fail "$what: still running 30 s after unmount"
    [ "$status" = 0 ] || { cat "$dir.err"; fail "$what: exited with status $status"; }
    # Reaped: forget the pid, so that the cleanup does not signal a reuse.
    local p rest=()
    for p in "${mount_pids[@]}"; do [ "$p" = "$pid" ] || rest+=("$p"); done
    mount_pids=("${rest[@]}")
}

# ---------------------------------------------------- can FUSE mount here?
# Both tools against a plain nbdkit memory disk and a plain file, without
# the filter: a failure here is the environment, not the filter.
probe_sock=$PWD/probe.sock
start_nbdkit "$probe_sock" memory 8M || skip "nbdkit memory did not start for the FUSE probe"
probe_server=$SERVER_PID
if ! nbdfuse_mount probe-nbd "$probe_sock"; then
    skip "nbdfuse cannot mount here (FUSE mounts not permitted?): $(head -c 300 probe-nbd.err)"
fi
mke2fs -q -t ext4 -F probe-nbd/nbd > /dev/null 2>&1 || skip "mke2fs on the nbdfuse file failed"
if ! fuse2fs_mount probe-nbd/nbd probe-fs; then
    skip "fuse2fs cannot mount here: $(head -c 300 probe-fs.err)"
fi
umount_wait probe-fs "$FUSE2FS_PID" "probe fuse2fs"
# The kernel's ext4 on a loop device over the nbdfuse file (README's
# recipe) needs loop devices and mount permission: probed the same way.
loop_ok=yes
mkdir -p probe-loop
mounts+=("$PWD/probe-loop")
if ! command -v losetup > /dev/null 2>&1; then
    loop_ok="losetup is not installed (util-linux)"
elif ! mount -o loop -t ext4 probe-nbd/nbd probe-loop 2> probe-loop.err; then
    loop_ok="mount -o loop of the nbdfuse file failed: $(head -c 200 probe-loop.err)"
else
    umount probe-loop
fi
wait_until 20 fusermount_idle probe-nbd
umount_wait probe-nbd "$NBDFUSE_PID" "probe nbdfuse"
stop_server "$probe_server"

# ------------------------------------------------------------- the test
make_fs_image
sock=$PWD/sock
start_server "$sock" file img.qcow2

nbdfuse_mount nbd "$sock" || { cat nbd.err; fail "nbdfuse did not mount the export"; }
cmp nbd/nbd img.raw || fail "the export read through nbdfuse differs from the ext4 image"
echo "nbdfuse: the export read as a file equals the ext4 image it was made from"

fuse2fs_mount nbd/nbd fs || { cat fs.err; fail "fuse2fs did not mount the filesystem in the export"; }
compare_tree fs "read through fuse2fs"
echo "fuse2fs on nbdfuse, read-write: every file equals its source"

change_tree fs
sync
compare_tree fs "after writing, through the mount"
umount_wait fs "$FUSE2FS_PID" "fuse2fs"
umount_wait nbd "$NBDFUSE_PID" "nbdfuse"
echo "wrote 3 MiB + a text file, changed, appended, shrank, deleted and filled a hole; unmounted cleanly"
stop_server

check_image_after "after the read-write mount"
echo "after stop: qemu-img check clean, e2fsck -fn clean, debugfs finds every expected file"

# The README's recipe: nbdfuse, then the kernel's ext4 on a loop device
# over the nbdfuse file (mount -o loop), read-write.
if [ "$loop_ok" = yes ]; then
    start_server "$sock" file img.qcow2
    nbdfuse_mount nbd3 "$sock" || { cat nbd3.err; fail "nbdfuse did not mount the export (loop)"; }
    mkdir -p loopfs
    mounts+=("$PWD/loopfs")
    mount -o loop -t ext4 nbd3/nbd loopfs || fail "mount -o loop nbd3/nbd failed"
    compare_tree loopfs "read through mount -o loop"
    change_tree loopfs
    sync
    umount loopfs || fail "umount of the loop mount failed"
    wait_until 20 fusermount_idle nbd3 || fail "the loop device still holds the nbdfuse file"
    umount_wait nbd3 "$NBDFUSE_PID" "nbdfuse (loop)"
    stop_server
    check_image_after "after the loop mount"
    echo "nbdfuse + mount -o loop (kernel ext4), read-write: files as expected, changes made; check, e2fsck, debugfs clean"
else
    skip_section "nbdfuse + mount -o loop (kernel ext4): $loop_ok"
fi

# Mount again, read-only, from the image through the filter.
start_server "$sock" -r file img.qcow2
nbdfuse_mount nbd2 "$sock" -r || { cat nbd2.err; fail "nbdfuse -r did not mount"; }
fuse2fs_mount nbd2/nbd fs2 -o ro || { cat fs2.err; fail "fuse2fs -o ro did not mount"; }
compare_tree fs2 "second, read-only mount"
umount_wait fs2 "$FUSE2FS_PID" "fuse2fs -o ro"
umount_wait nbd2 "$NBDFUSE_PID" "nbdfuse -r"
stop_server
echo "mounted again read-only (nbdfuse -r, fuse2fs -o ro): every file as written"
