#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# Damaged images for tests/test-overlap.sh: one table entry of a small
# qemu-made image pointed at the image's own metadata, so that the next
# write where that entry leads would land on (or be counted in) a
# metadata structure.  Standard library only.
#
#   overlap-shapes.py shapes
#       one line per shape: NAME BASE GUEST_OFFSET LENGTH REDIRECTED QEMU
#       BASE is the kind of image the shape starts from (plain, snapshot,
#       luks, bitmap); GUEST_OFFSET and LENGTH the write that hits the
#       damage; REDIRECTED the guest clusters (comma-separated, or -)
#       whose reading the damage itself changes, so that only the other
#       clusters can be compared with the undamaged image; QEMU what
#       qemu does with that write (see SHAPES).
#   overlap-shapes.py damage IMAGE NAME
#       damages IMAGE in place and prints what it changed
#   overlap-shapes.py regions IMAGE
#       prints the image's metadata regions, one "KIND START LENGTH" a line
#
# Every base image has 64 KiB clusters and guest clusters 0 to 3 written
# by qemu-io (cluster 3 compressed, but in the luks base, which cannot
# compress): see make_base in test-overlap.sh.

import struct
import sys

COPIED = 1 << 63
COMPRESSED = 1 << 62
OFFSET_MASK = 0x00fffffffffffe00
EXT_LUKS = 0x0537be77
EXT_BITMAPS = 0x23852875


def die(msg):
    sys.stderr.write("overlap-shapes.py: %s\n" % msg)
    sys.exit(2)


class Image:
    """The structures of a v3 image that a shape can point at."""

    def __init__(self, path):
        self.f = open(path, "r+b")
        h = self.read(0, 104)
        if h[0:4] != b"QFI\xfb":
            die("%s: not a qcow2 image" % path)
        (self.version,) = struct.unpack(">I", h[4:8])
        (self.cluster_bits,) = struct.unpack(">I", h[20:24])
        self.cs = 1 << self.cluster_bits
        (self.l1_size,) = struct.unpack(">I", h[36:40])
        (self.l1_offset, self.rt_offset) = struct.unpack(">QQ", h[40:56])
        (self.rt_clusters, self.nb_snapshots) = struct.unpack(">II", h[56:64])
        (self.snapshots_offset,) = struct.unpack(">Q", h[64:72])
        (self.refcount_order, self.header_length) = struct.unpack(">II", h[96:104])
        self.extensions = self.read_extensions()

    def read(self, off, n):
        self.f.seek(off)
        return self.f.read(n)

    def be64(self, off):
        return struct.unpack(">Q", self.read(off, 8))[0]

    def put64(self, off, v):
        self.f.seek(off)
        self.f.write(struct.pack(">Q", v))

    def read_extensions(self):
        out = {}
        off = self.header_length
        while off + 8 <= self.cs:
            t, n = struct.unpack(">II", self.read(off, 8))
            if t == 0:
                break
            out[t] = self.read(off + 8, n)
            off += 8 + (n + 7) // 8 * 8
        return out

    # --------------------------------------------------------- tables
    def l1_pos(self, guest):
        return self.l1_offset + 8 * (guest >> (2 * self.cluster_bits - 3))

    def l2_table(self, guest):
        return self.be64(self.l1_pos(guest)) & OFFSET_MASK

    def l2_pos(self, guest):
        index = (guest >> self.cluster_bits) & (self.cs // 8 - 1)
        return self.l2_table(guest) + 8 * index

    def luks_area(self):
        data = self.extensions.get(EXT_LUKS)
        if data is None:
            die("the image has no LUKS area")
        return struct.unpack(">QQ", data[:16])

    def bitmap_directory(self):
        data = self.extensions.get(EXT_BITMAPS)
        if data is None:
            die("the image has no bitmaps")
        nb, _, size, offset = struct.unpack(">IIQQ", data[:24])
        return nb, offset, size

    def bitmap_table(self):
        nb, offset, _ = self.bitmap_directory()
        table, entries = struct.unpack(">QI", self.read(offset, 12))
        return table, 8 * entries

    def snapshot_l1(self):
        if self.nb_snapshots == 0:
            die("the image has no snapshots")
        table, size = struct.unpack(">QI", self.read(self.snapshots_offset, 12))
        return table, 8 * size

    def snapshot_table_length(self):
        off = self.snapshots_offset
        for _ in range(self.nb_snapshots):
            id_len, name_len, _, _, _, _, extra = \
                struct.unpack(">HHIIIQI", self.read(off + 12, 28))
            off += (40 + extra + id_len + name_len + 7) // 8 * 8
        return off - self.snapshots_offset

    def regions(self):
        out = [("header", 0, self.cs),
               ("l1", self.l1_offset, 8 * self.l1_size),
               ("refcount-table", self.rt_offset, self.rt_clusters * self.cs)]
        for i in range(self.l1_size):
            t = self.be64(self.l1_offset + 8 * i) & OFFSET_MASK
            if t:
                out.append(("l2", t, self.cs))
        for i in range(self.rt_clusters * self.cs // 8):
            b = self.be64(self.rt_offset + 8 * i)
            if b:
                out.append(("refcount-block", b, self.cs))
        if self.nb_snapshots:
            out.append(("snapshot-table", self.snapshots_offset,
                        self.snapshot_table_length()))
            out.append(("snapshot-l1",) + self.snapshot_l1())
        if EXT_LUKS in self.extensions:
            out.append(("luks",) + self.luks_area())
        if EXT_BITMAPS in self.extensions:
            _, offset, size = self.bitmap_directory()
            out.append(("bitmap-directory", offset, size))
            out.append(("bitmap-table",) + self.bitmap_table())
        return out


C = 65536


def l2_at(target, guest=0):
    """The L2 entry of GUEST: a normal cluster with COPIED at TARGET."""
    def damage(img):
        pos = img.l2_pos(guest)
        old = img.be64(pos)
        img.put64(pos, target(img) | COPIED)
        return "L2 entry of guest 0x%x at 0x%x: 0x%016x -> 0x%016x" % (
            guest, pos, old, img.be64(pos))
    return damage


def refcount_table_at(target):
    def damage(img):
        old = img.be64(img.rt_offset)
        img.put64(img.rt_offset, target(img))
        return "refcount table entry 0 at 0x%x: 0x%x -> 0x%x" % (
            img.rt_offset, old, img.be64(img.rt_offset))
    return damage


def l1_at(target):
    def damage(img):
        pos = img.l1_pos(0)
        old = img.be64(pos)
        img.put64(pos, target(img) | COPIED)
        return "L1 entry 0 at 0x%x: 0x%016x -> 0x%016x" % (pos, old, img.be64(pos))
    return damage


def compressed_at(target, guest=3 * C):
    """The compressed descriptor of GUEST moved to TARGET, its length kept."""
    def damage(img):
        pos = img.l2_pos(guest)
        old = img.be64(pos)
        if not old & COMPRESSED:
            die("guest 0x%x is not compressed" % guest)
        shift = 62 - (img.cluster_bits - 8)
        new = (old & ~((1 << shift) - 1)) | target(img)
        img.put64(pos, new)
        return "compressed descriptor of guest 0x%x at 0x%x: 0x%016x -> 0x%016x" % (
            guest, pos, old, new)
    return damage


def refcount_zero(guest):
    """The refcount of GUEST's host cluster set to 0, its L2 entry kept:
    the cluster looks free to an allocator that trusts the refcounts."""
    def damage(img):
        cluster = img.be64(img.l2_pos(guest)) & OFFSET_MASK
        index = cluster >> img.cluster_bits
        width = 1 << img.refcount_order
        per_block = img.cs * 8 // width
        block = img.be64(img.rt_offset + 8 * (index // per_block)) & OFFSET_MASK
        if width != 16:
            die("refcount_zero: only 16-bit refcounts")
        pos = block + 2 * (index % per_block)
        old = struct.unpack(">H", img.read(pos, 2))[0]
        img.f.seek(pos)
        img.f.write(b"\0\0")
        return "refcount of host cluster 0x%x (guest 0x%x) at 0x%x: %d -> 0" % (
            cluster, guest, pos, old)
    return damage


def reftable(img): return img.rt_offset
def refblock(img): return img.be64(img.rt_offset)
def l1(img): return img.l1_offset
def own_l2(img): return img.l2_table(0)
def snapshot_l1(img): return img.snapshot_l1()[0]
def snapshot_table(img): return img.snapshots_offset
def luks(img): return img.luks_area()[0]
def bitmap_dir(img): return img.bitmap_directory()[1]
def bitmap_table(img): return img.bitmap_table()[0]


# NAME: (BASE, GUEST_OFFSET, LENGTH, REDIRECTED, QEMU, damage).  The
# write is 4 KiB where the damaged entry leads; a refcount table entry
# leads to the next allocation (guest cluster 6 is unallocated); an L1
# entry leads to all of guest clusters 0 to 3.  QEMU is what qemu-io
# 7.2 does with the same write on the same image, which the test checks
# again every run:
#   corrupt:STRUCTURE        refuses it with EIO and marks the image
#                            corrupt ("overlaps with STRUCTURE")
#   acked-corrupt:STRUCTURE  marks the image corrupt, yet acknowledges
#                            the write
#   eio                      refuses it with EIO (the compressed data
#                            does not decode) and marks nothing
#   writes                   writes it: qemu does not check that region
#                            (its overlap checks know no LUKS area and no
#                            bitmap table), frees a metadata cluster
#                            through a compressed descriptor, or hands out
#                            a cluster that a table maps but whose
#                            refcount reads 0 (the next allocation, guest
#                            cluster 6, lands on guest cluster 0's data)
# The filter and the plugin must refuse every one with EIO and mark the
# image corrupt (where qemu would only log or write, refuse).
SHAPES = {
    "l2-at-refcount-table": ("plain", 0, 4096, "0", "corrupt:refcount table",
                             l2_at(reftable)),
    "l2-at-refcount-block": ("plain", 0, 4096, "0", "corrupt:refcount block",
                             l2_at(refblock)),
    "l2-at-l1": ("plain", 0, 4096, "0", "corrupt:active L1 table", l2_at(l1)),
    "l2-at-own-l2": ("plain", 0, 4096, "0", "corrupt:active L2 table",
                     l2_at(own_l2)),
    "refcount-table-at-l1": ("plain", 6 * C, 4096, "-", "corrupt:refcount table",
                             refcount_table_at(l1)),
    "refcount-table-at-l2": ("plain", 6 * C, 4096, "-", "corrupt:refcount table",
                             refcount_table_at(own_l2)),
    "refcount-table-at-itself": ("plain", 6 * C, 4096, "-", "corrupt:qcow2_header",
                                 refcount_table_at(reftable)),
    "refcount-zero-but-mapped": ("plain", 6 * C, 4096, "-", "writes",
                                 refcount_zero(0)),
    "l1-at-refcount-table": ("plain", 0, 4096, "0,1,2,3", "corrupt:refcount table",
                             l1_at(reftable)),
    "l1-at-refcount-block": ("plain", 0, 4096, "0,1,2,3",
                             "acked-corrupt:active L2 table", l1_at(refblock)),
    "compressed-at-l1": ("plain", 3 * C, 4096, "3", "eio", compressed_at(l1)),
    "compressed-at-refcount-block": ("plain", 3 * C, 4096, "3", "eio",
                                     compressed_at(refblock)),
    "compressed-at-l1-whole": ("plain", 3 * C, C, "3", "writes",
                               compressed_at(l1)),
    # In the snapshot base, guest cluster 1 was written after the
    # snapshot: its entry alone has COPIED.
    "l2-at-snapshot-l1": ("snapshot", C, 4096, "1", "corrupt:inactive L1 table",
                          l2_at(snapshot_l1, C)),
    "l2-at-snapshot-table": ("snapshot", C, 4096, "1", "corrupt:snapshot table",
                             l2_at(snapshot_table, C)),
    "l2-at-luks": ("luks", 0, 4096, "0", "writes", l2_at(luks)),
    "l2-at-bitmap-directory": ("bitmap", 0, 4096, "0",
                               "corrupt:bitmap directory", l2_at(bitmap_dir)),
    "l2-at-bitmap-table": ("bitmap", 0, 4096, "0", "writes", l2_at(bitmap_table)),
}


def main(argv):
    if len(argv) >= 2 and argv[1] == "shapes":
        for name, (base, off, n, redirected, qemu, _) in SHAPES.items():
            print(name, base, off, n, redirected, qemu)
    elif len(argv) == 4 and argv[1] == "damage":
        if argv[3] not in SHAPES:
            die("unknown shape %r" % argv[3])
        img = Image(argv[2])
        print(SHAPES[argv[3]][5](img))
        img.f.close()
    elif len(argv) == 3 and argv[1] == "regions":
        for kind, start, length in Image(argv[2]).regions():
            print(kind, start, length)
    else:
        die("usage: overlap-shapes.py shapes | damage IMAGE NAME | regions IMAGE")


if __name__ == "__main__":
    main(sys.argv)
