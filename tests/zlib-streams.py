#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# Do two zlib qcow2 images (no backing file, no snapshots) hold the same
# deflate streams?  Reads the L1 and L2 tables of each, cuts every
# compressed cluster's stream out of its descriptor's sectors (inflating
# with qemu's 4 KiB window to find where it ends), and compares them
# guest cluster by guest cluster.  Prints the number of compressed
# clusters; exits non-zero naming the first difference.
import struct
import sys
import zlib


def streams(path):
    """Guest cluster -> the deflate stream of its compressed cluster."""
    out = {}
    with open(path, "rb") as f:
        header = f.read(104)
        (cluster_bits,) = struct.unpack(">I", header[20:24])
        (l1_size,) = struct.unpack(">I", header[36:40])
        (l1_offset,) = struct.unpack(">Q", header[40:48])
        cs = 1 << cluster_bits
        per_l2 = cs // 8
        offset_bits = 62 - (cluster_bits - 8)
        f.seek(l1_offset)
        l1 = struct.unpack(">%dQ" % l1_size, f.read(8 * l1_size))
        for i, l1_entry in enumerate(l1):
            l2_offset = l1_entry & 0x00FFFFFFFFFFFE00
            if not l2_offset:
                continue
            f.seek(l2_offset)
            for j, entry in enumerate(struct.unpack(">%dQ" % per_l2, f.read(cs))):
                if not entry & (1 << 62):
                    continue
                start = entry & ((1 << offset_bits) - 1)
                sectors = ((entry >> offset_bits) & ((1 << (62 - offset_bits)) - 1)) + 1
                f.seek(start)
                data = f.read((start & ~511) + sectors * 512 - start)
                d = zlib.decompressobj(-12)
                d.decompress(data, cs)
                if not d.eof:
                    sys.exit("%s: guest cluster %d: the stream does not end" % (path, i * per_l2 + j))
                out[i * per_l2 + j] = data[:len(data) - len(d.unused_data)]
    return out


ours, theirs = streams(sys.argv[1]), streams(sys.argv[2])
if not ours:
    sys.exit("%s: no compressed cluster" % sys.argv[1])
if sorted(ours) != sorted(theirs):
    sys.exit("not the same guest clusters compressed (%d and %d)" % (len(ours), len(theirs)))
differ = [c for c in sorted(ours) if ours[c] != theirs[c]]
if differ:
    c = differ[0]
    sys.exit("%d of %d streams differ; the first, guest cluster %d: %d bytes against %d"
             % (len(differ), len(ours), c, len(ours[c]), len(theirs[c])))
print(len(ours))
