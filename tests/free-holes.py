#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# free-holes.py IMAGE: how the clusters of a qcow2 file are used and
# whether its free clusters are holes in the file system.
#
# Reads the refcounts straight from the file (no qemu, no engine) and,
# with SEEK_DATA, which clusters hold data.  Prints one line:
#   CLUSTER_SIZE USED FREE FREE_WITH_DATA FILE_SIZE IMAGE_END
# USED and FREE count the clusters below the end of the file (FREE: with
# refcount 0), FREE_WITH_DATA those free ones the file system still keeps
# blocks for, IMAGE_END the end of the last cluster in use.
import errno
import os
import struct
import sys


def refcount_getter(f, order):
    width = 1 << order
    if width >= 8:
        fmt = {8: ">B", 16: ">H", 32: ">I", 64: ">Q"}[width]
        return lambda block, i: struct.unpack_from(fmt, block, i * width // 8)[0]
    return lambda block, i: (block[i * width // 8] >> (i * width % 8)) & ((1 << width) - 1)


def main():
    path = sys.argv[1]
    with open(path, "rb") as f:
        head = f.read(104)
        magic, version = struct.unpack_from(">II", head, 0)
        if magic != 0x514649fb:
            sys.exit(f"{path}: not qcow2")
        bits = struct.unpack_from(">I", head, 20)[0]
        rt_offset, rt_clusters = struct.unpack_from(">QI", head, 48)
        order = struct.unpack_from(">I", head, 96)[0] if version >= 3 else 4
        cs = 1 << bits
        size = os.fstat(f.fileno()).st_size
        clusters = (size + cs - 1) // cs
        per_block = cs * 8 // (1 << order)
        get = refcount_getter(f, order)
        f.seek(rt_offset)
        table = f.read(rt_clusters * cs)
        counts = [0] * clusters
        for i in range(len(table) // 8):
            off = struct.unpack_from(">Q", table, i * 8)[0] & ~0x1ff
            if off == 0:
                continue
            f.seek(off)
            block = f.read(cs).ljust(cs, b"\0")
            for j in range(per_block):
                c = i * per_block + j
                if c >= clusters:
                    break
                counts[c] = get(block, j)
        fd = f.fileno()
        used = free = free_data = 0
        end = 0
        for c in range(clusters):
            if counts[c]:
                used += 1
                end = (c + 1) * cs
                continue
            free += 1
            try:
                data = os.lseek(fd, c * cs, os.SEEK_DATA)
            except OSError as e:
                if e.errno != errno.ENXIO:
                    raise
                data = size
            if data < min((c + 1) * cs, size):
                free_data += 1
    print(cs, used, free, free_data, size, end)


main()
