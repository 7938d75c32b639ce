#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# Patch a qcow2 image in place to make one field corrupt, for
# tests/test-corrupt.sh.  Standard library only; run with python3.
#
# Usage: corrupt-image.py IMAGE ACTION [ARGS...]
#
# Header fields (OFFSET and VALUE accept 0x... and decimal):
#   u8 OFFSET VALUE          write one byte
#   be32 OFFSET VALUE        write a big-endian 32-bit field
#   be64 OFFSET VALUE        write a big-endian 64-bit field
#   incompat-set BIT         set a bit of incompatible_features
#   incompat-clear BIT       clear a bit of incompatible_features
#
# Table entries, addressed by a guest offset (standard L2 entries only):
#   l1-or GUEST MASK         OR MASK into the L1 entry covering GUEST
#   l1-set GUEST VALUE       replace that L1 entry
#   l2-or GUEST MASK         OR MASK into the L2 entry of GUEST (which
#                            must be allocated)
#   l2-set GUEST VALUE       replace that L2 entry
#
# Compressed clusters (the L2 entry of GUEST must be compressed):
#   short-count GUEST        set the additional sector count to 0; refuses
#                            unless the original range is over 512 bytes
#   garbage GUEST LEN SEED   overwrite LEN bytes at the compressed data's
#                            host offset with pseudo-random bytes
#   compressed-past-eof GUEST  move the data offset past the end of file
#
#   show GUEST               print the L1 and L2 entries of GUEST
#
# Each action prints one line saying what it changed.

import os
import random
import struct
import sys

L1_OFFSET_MASK = 0x00fffffffffffe00
L2_OFFSET_MASK = 0x00fffffffffffe00
L2_COMPRESSED = 1 << 62


def die(msg):
    sys.stderr.write("corrupt-image.py: %s\n" % msg)
    sys.exit(2)


def num(s):
    try:
        return int(s, 0)
    except ValueError:
        die("not a number: %r" % s)


class Image:
    def __init__(self, path):
        self.path = path
        self.f = open(path, "r+b")
        hdr = self.read(0, 112)
        if hdr[0:4] != b"QFI\xfb":
            die("%s: not a qcow2 image" % path)
        self.version = struct.unpack(">I", hdr[4:8])[0]
        self.cluster_bits = struct.unpack(">I", hdr[20:24])[0]
        self.l1_size = struct.unpack(">I", hdr[36:40])[0]
        self.l1_offset = struct.unpack(">Q", hdr[40:48])[0]
        incompat = struct.unpack(">Q", hdr[72:80])[0] if self.version >= 3 else 0
        if incompat & (1 << 4):
            die("extended L2 images are not handled")
        self.cluster_size = 1 << self.cluster_bits
        self.l2_bits = self.cluster_bits - 3

    def read(self, off, n):
        self.f.seek(off)
        return self.f.read(n)

    def write(self, off, data):
        self.f.seek(off)
        self.f.write(data)

    def be64_at(self, off):
        return struct.unpack(">Q", self.read(off, 8))[0]

    def put_be64(self, off, v):
        self.write(off, struct.pack(">Q", v))

    def l1_pos(self, guest):
        idx = guest >> (self.cluster_bits + self.l2_bits)
        if idx >= self.l1_size:
            die("guest offset 0x%x is beyond the L1 table" % guest)
        return self.l1_offset + 8 * idx

    def l2_pos(self, guest):
        l1e = self.be64_at(self.l1_pos(guest))
        l2_offset = l1e & L1_OFFSET_MASK
        if l2_offset == 0:
            die("guest offset 0x%x has no L2 table" % guest)
        idx = (guest >> self.cluster_bits) & ((1 << self.l2_bits) - 1)
        return l2_offset + 8 * idx

    def compressed(self, guest):
        """(position of the L2 entry, entry, host offset, extra sectors,
        shift) of a compressed cluster."""
        pos = self.l2_pos(guest)
        entry = self.be64_at(pos)
        if not entry & L2_COMPRESSED:
            die("guest offset 0x%x is not compressed (entry 0x%016x)"
                % (guest, entry))
        shift = 62 - (self.cluster_bits - 8)
        host = entry & ((1 << shift) - 1)
        count = (entry >> shift) & ((1 << (self.cluster_bits - 8)) - 1)
        return pos, entry, host, count, shift


def main(argv):
    if len(argv) < 3:
        die("usage: corrupt-image.py IMAGE ACTION [ARGS...]")
    img = Image(argv[1])
    action, args = argv[2], argv[3:]

    def need(n):
        if len(args) != n:
            die("%s takes %d argument(s)" % (action, n))

    if action == "u8":
        need(2)
        img.write(num(args[0]), bytes([num(args[1]) & 0xff]))
        print("byte at %s = %s" % (args[0], args[1]))
    elif action == "be32":
        need(2)
        img.write(num(args[0]), struct.pack(">I", num(args[1]) & 0xffffffff))
        print("be32 at %s = %s" % (args[0], args[1]))
    elif action == "be64":
        need(2)
        img.put_be64(num(args[0]), num(args[1]) & 0xffffffffffffffff)
        print("be64 at %s = %s" % (args[0], args[1]))
    elif action in ("incompat-set", "incompat-clear"):
        need(1)
        if img.version < 3:
            die("incompatible_features exists in version 3 images only")
        v = img.be64_at(72)
        bit = 1 << num(args[0])
        v = v | bit if action == "incompat-set" else v & ~bit
        img.put_be64(72, v)
        print("incompatible_features = 0x%x" % v)
    elif action in ("l1-or", "l1-set"):
        need(2)
        pos = img.l1_pos(num(args[0]))
        old = img.be64_at(pos)
        new = old | num(args[1]) if action == "l1-or" else num(args[1])
        new &= 0xffffffffffffffff
        img.put_be64(pos, new)
        print("L1 entry at 0x%x: 0x%016x -> 0x%016x" % (pos, old, new))
    elif action in ("l2-or", "l2-set"):
        need(2)
        pos = img.l2_pos(num(args[0]))
        old = img.be64_at(pos)
        if action == "l2-or" and (old & ~(1 << 63)) == 0:
            die("the L2 entry of guest offset %s is unallocated" % args[0])
        new = old | num(args[1]) if action == "l2-or" else num(args[1])
        new &= 0xffffffffffffffff
        img.put_be64(pos, new)
        print("L2 entry at 0x%x: 0x%016x -> 0x%016x" % (pos, old, new))
    elif action == "short-count":
        need(1)
        pos, entry, host, count, shift = img.compressed(num(args[0]))
        size = (count + 1) * 512 - (host & 511)
        if size <= 512:
            die("the compressed range is only %d bytes" % size)
        new = entry & ~(((1 << (img.cluster_bits - 8)) - 1) << shift)
        img.put_be64(pos, new)
        print("compressed entry 0x%016x -> 0x%016x (range %d -> %d bytes)"
              % (entry, new, size, 512 - (host & 511)))
    elif action == "garbage":
        need(3)
        pos, entry, host, count, shift = img.compressed(num(args[0]))
        n = num(args[1])
        if n > (count + 1) * 512 - (host & 511):
            die("%d bytes is more than the compressed range" % n)
        rng = random.Random(num(args[2]))
        img.write(host, bytes(rng.randrange(256) for _ in range(n)))
        print("overwrote %d bytes at host offset 0x%x" % (n, host))
    elif action == "compressed-past-eof":
        need(1)
        pos, entry, host, count, shift = img.compressed(num(args[0]))
        eof = os.fstat(img.f.fileno()).st_size
        new_host = eof + 4096 + 123
        if new_host >> shift:
            die("the file is too large for this")
        new = (entry & ~((1 << shift) - 1)) | new_host
        img.put_be64(pos, new)
        print("compressed entry 0x%016x -> 0x%016x" % (entry, new))
    elif action == "show":
        need(1)
        g = num(args[0])
        l1p = img.l1_pos(g)
        l1e = img.be64_at(l1p)
        if l1e & L1_OFFSET_MASK:
            l2e = img.be64_at(img.l2_pos(g))
            print("L1 0x%016x L2 0x%016x" % (l1e, l2e))
        else:
            print("L1 0x%016x (no L2 table)" % l1e)
    else:
        die("unknown action %r" % action)
    img.f.close()


if __name__ == "__main__":
    main(sys.argv)
