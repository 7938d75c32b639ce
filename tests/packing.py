#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# How tightly an image's compressed clusters are packed: reads the L1 and
# L2 tables of a qcow2 file (no backing file, no snapshots) and prints
#   HOST_CLUSTERS UNION_BYTES PLAIN_CLUSTERS COMPRESSED_ENTRIES RANGES
# the host clusters that compressed data touches, the bytes of the union
# of the compressed ranges (whole sectors, as the descriptors give them),
# the guest clusters stored uncompressed, the L2 entries of compressed
# clusters, and the distinct compressed ranges they describe.
import struct
import sys

with open(sys.argv[1], "rb") as f:
    header = f.read(104)
    (cluster_bits,) = struct.unpack(">I", header[20:24])
    (l1_size,) = struct.unpack(">I", header[36:40])
    (l1_offset,) = struct.unpack(">Q", header[40:48])
    cluster_size = 1 << cluster_bits
    offset_bits = 62 - (cluster_bits - 8)
    f.seek(l1_offset)
    l1 = struct.unpack(">%dQ" % l1_size, f.read(8 * l1_size))
    ranges, plain = [], 0
    for l1_entry in l1:
        l2_offset = l1_entry & 0x00FFFFFFFFFFFE00
        if l2_offset == 0:
            continue
        f.seek(l2_offset)
        for entry in struct.unpack(">%dQ" % (cluster_size // 8), f.read(cluster_size)):
            if entry & (1 << 62):
                start = entry & ((1 << offset_bits) - 1)
                sectors = ((entry >> offset_bits) & ((1 << (62 - offset_bits)) - 1)) + 1
                ranges.append((start, (start & ~511) + sectors * 512))
            elif entry & 0x00FFFFFFFFFFFE00:
                plain += 1

touched, union, end = set(), 0, 0
for start, stop in sorted(ranges):
    union += max(0, stop - max(start, end))
    end = max(end, stop)
    touched.update(range(start >> cluster_bits, ((stop - 1) >> cluster_bits) + 1))
print(len(touched), union, plain, len(ranges), len(set(ranges)))
