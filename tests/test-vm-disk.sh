#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A virtual machine whose disk is the export: the test guest
# (tests/guest-functions.sh: Debian's kernel under qemu-system-x86_64)
# with the filter's export attached as a virtio-blk disk through qemu's
# own NBD client (-drive file=nbd+unix:///?socket=...,format=raw,
# if=virtio), the disk a compressed qcow2 image holding an ext4
# filesystem.  In the guest: mount /dev/vda, check the files against the
# sums made on the host, run two streams of random file operations at
# once (tests/guest-workload.py: files created, rewritten in place at
# random offsets, past their end, truncated, copied, renamed, deleted,
# with syncs), sync, fstrim, drop the page cache and check every file
# against the sums of what the workload must leave, unmount.  Then, on
# the host: qemu-img check clean, e2fsck -fn clean, and the files read
# by debugfs exactly as expected.
source "${top_srcdir:-.}/tests/functions.sh"
source "${top_srcdir:-.}/tests/mount-functions.sh"
source "${top_srcdir:-.}/tests/guest-functions.sh"

PATH=$PATH:/sbin:/usr/sbin
requires mke2fs e2fsck debugfs diff md5sum
guest_prepare || skip "$GUEST_SKIP"

cd "$TMPDIR_TEST"

make_fs_image 160M
mkdir guest
tree_sums src > guest/sums.before
python3 "$top_srcdir/tests/guest-workload.py" 17 2 400 guest expect ||
    fail "guest-workload.py failed"
tree_sums expect > guest/sums.after
echo "workload: 2 streams of 400 operations, leaving $(find expect/w -type f | wc -l) files of $(du -sm --apparent-size expect/w | cut -f1) MiB"

cp "$top_srcdir/tests/tree-changes.sh" guest/
cat > guest/run.sh <<'EOF'
. ./tree-changes.sh
echo "GUEST: /dev/vda has $(cat /sys/block/vda/size) sectors"
mount -t ext4 /dev/vda /mnt
check_sums /mnt /test/sums.before
sh -e ./ops1.sh > /tmp/ops1.out 2>&1 &
one=$!
sh -e ./ops2.sh > /tmp/ops2.out 2>&1 &
two=$!
status=0
wait $one || { status=1; echo "GUEST: ops1.sh failed:"; tail -n 5 /tmp/ops1.out; }
wait $two || { status=1; echo "GUEST: ops2.sh failed:"; tail -n 5 /tmp/ops2.out; }
[ $status = 0 ]
sync
echo "GUEST: fstrim: $(fstrim -v /mnt)"
echo 3 > /proc/sys/vm/drop_caches
check_sums /mnt /test/sums.after
umount /mnt
echo "GUEST: unmounted"
EOF

sock=$PWD/sock
start_server "$sock" file img.qcow2
start=$SECONDS
guest_boot vm 900 guest \
    -drive "file=$(nbd_uri "$sock"),format=raw,if=virtio,discard=unmap" ||
    { cat "$SERVER_LOG" >&2; fail "guest: $GUEST_FAILURE"; }
grep -E '^(GUEST|/mnt): ' vm.console
echo "guest: the session took $((SECONDS - start)) s ($GUEST_ACCEL)"
stop_server
grep -E 'nbdkit: .*(error|ERROR)' "$sock.log" && fail "nbdkit logged errors (above)"

trimmed=$(sed -n 's/^GUEST: fstrim: .*: \([0-9]*\) bytes trimmed.*/\1/p' vm.console)
[ "${trimmed:-0}" -gt 0 ] || fail "fstrim trimmed nothing: $(grep 'fstrim' vm.console)"
check_image_fs "after the VM's session"
echo "after: fstrim discarded $trimmed bytes; qemu-img check clean, e2fsck -fn clean, debugfs finds exactly the expected files"
