#!/bin/busybox sh
# SPDX-License-Identifier: BSD-3-Clause
# /init of the test guest (see tests/guest-functions.sh): mount the
# kernel's filesystems, load the modules, bring up the network card if
# qemu gave one (qemu's user network: the guest is 10.0.2.15), run the
# test's /test/run.sh with errors fatal, print its exit status and power
# off.  Everything goes to the serial console, which the host keeps.
/bin/busybox --install -s /bin
export PATH=/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /lib/modules/load); do
    insmod "/lib/modules/$m" || echo "GUEST: insmod $m failed"
done
ip link set lo up
if [ -e /sys/class/net/eth0 ]; then
    ip addr add 10.0.2.15/24 dev eth0
    ip link set eth0 up
fi
status=0
if [ -f /test/run.sh ]; then
    cd /test && sh -e ./run.sh || status=$?
else
    echo "GUEST: no /test/run.sh in the initramfs"
    status=127
fi
echo "GUEST-EXIT $status"
sync
poweroff -f
