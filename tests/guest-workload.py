#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# A random filesystem workload for the test guest (test-vm-disk.sh), and
# the files it must leave behind.
#
#   guest-workload.py SEED STREAMS OPS GUESTDIR EXPECTDIR
#
# Writes GUESTDIR/pool.dat (the bytes every write takes its data from:
# random and text, 4 MiB) and GUESTDIR/opsN.sh, N = 1..STREAMS: shell
# scripts for busybox, each of OPS operations on the files of its own
# directory /mnt/w/sN (the streams run at the same time): create a file
# with dd, rewrite a random range of one in place (dd conv=notrunc, also
# past its end), truncate one shorter or longer, copy, rename, delete,
# and sync now and then.  Sizes and offsets are in 512-byte units, files
# up to 768 KiB, live data kept under 16 MiB per stream.
#
# The script models what each operation does, and writes the files the
# streams must leave under EXPECTDIR/w (to compare with the filesystem
# afterwards).

import os
import random
import sys

seed, streams, nops = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
guestdir, expectdir = sys.argv[4], sys.argv[5]
rng = random.Random(seed)

SECTOR = 512
POOL_SECTORS = 8192
words = [b"guest", b"disk", b"qcow2", b"zstd", b"virtio", b"block", b"\n"]
pool = bytearray()
while len(pool) < POOL_SECTORS * SECTOR:
    if rng.randrange(2):
        pool += rng.randbytes(rng.randrange(1, 65536))
    else:
        pool += b" ".join(rng.choice(words) for _ in range(rng.randrange(1, 10000)))
pool = bytes(pool[:POOL_SECTORS * SECTOR])
with open(os.path.join(guestdir, "pool.dat"), "wb") as f:
    f.write(pool)

MAX_FILE_SECTORS = 1536
BUDGET = 16 << 20


def piece(count):
    skip = rng.randrange(POOL_SECTORS - count + 1)
    return skip, pool[skip * SECTOR:(skip + count) * SECTOR]


for s in range(1, streams + 1):
    files = {}          # path under /mnt -> bytearray
    serial = 0
    out = ["mkdir -p /mnt/w/s%d/a /mnt/w/s%d/b /mnt/w/s%d/c" % (s, s, s)]

    def new_name():
        global serial
        serial += 1
        return "w/s%d/%s/f%04d" % (s, rng.choice("abc"), serial)

    for _ in range(nops):
        live = sum(len(v) for v in files.values())
        r = rng.random()
        if not files or (r < 0.25 and live < BUDGET):
            path = new_name()
            count = rng.randrange(1, MAX_FILE_SECTORS // 2)
            skip, data = piece(count)
            out.append("dd if=/test/pool.dat of=/mnt/%s bs=512 skip=%d count=%d status=none"
                       % (path, skip, count))
            files[path] = bytearray(data)
            continue
        path = rng.choice(sorted(files))
        content = files[path]
        if r < 0.60:
            # In place, anywhere up to a little past the end.
            count = rng.randrange(1, 128)
            seek = rng.randrange(min(len(content) // SECTOR + 16, MAX_FILE_SECTORS - count))
            skip, data = piece(count)
            out.append("dd if=/test/pool.dat of=/mnt/%s bs=512 skip=%d seek=%d count=%d conv=notrunc status=none"
                       % (path, skip, seek, count))
            start = seek * SECTOR
            if start > len(content):
                content.extend(bytes(start - len(content)))
            content[start:start + len(data)] = data
        elif r < 0.70:
            size = rng.randrange(MAX_FILE_SECTORS * SECTOR)
            out.append("truncate -s %d /mnt/%s" % (size, path))
            if size < len(content):
                del content[size:]
            else:
                content.extend(bytes(size - len(content)))
        elif r < 0.78 and live < BUDGET:
            dest = new_name()
            out.append("cp /mnt/%s /mnt/%s" % (path, dest))
            files[dest] = bytearray(content)
        elif r < 0.85:
            dest = new_name()
            out.append("mv /mnt/%s /mnt/%s" % (path, dest))
            files[dest] = files.pop(path)
        elif r < 0.97:
            out.append("rm /mnt/%s" % path)
            del files[path]
        else:
            out.append("sync")

    with open(os.path.join(guestdir, "ops%d.sh" % s), "w") as f:
        f.write("\n".join(out) + "\n")
    for sub in "abc":
        os.makedirs(os.path.join(expectdir, "w/s%d/%s" % (s, sub)), exist_ok=True)
    for path, content in files.items():
        with open(os.path.join(expectdir, path), "wb") as f:
            f.write(content)
