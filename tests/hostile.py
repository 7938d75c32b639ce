#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# Hostile images: mutations of qemu-made images, and a client that reads
# and writes each one through the filter.
#
#   hostile.py make SEED_DIR OUT_DIR COUNT RNG_SEED
#       writes COUNT mutated images to OUT_DIR, each named after its
#       mutation, from the images in SEED_DIR.
#   hostile.py run RO_SOCKET RW_SOCKET DIR NAMES...
#       for each name: read it through the read-only server, write it
#       through the read-write server (whose files are DIR/NAME), and
#       print one line "NAME valid-before|invalid-before outcome".
#       Any client-side hang (30 s) or a server that stops answering is a
#       failure (exit 1).

import os
import random
import signal
import struct
import subprocess
import sys

import nbd


def be64(b, o):
    return struct.unpack(">Q", b[o:o + 8])[0]


def be32(b, o):
    return struct.unpack(">I", b[o:o + 4])[0]


def put64(b, o, v):
    b[o:o + 8] = struct.pack(">Q", v & (2**64 - 1))


def put32(b, o, v):
    b[o:o + 4] = struct.pack(">I", v & (2**32 - 1))


class Layout:
    """The places in a qemu-made image that are worth hitting."""

    def __init__(self, data):
        self.cluster_bits = be32(data, 20)
        self.cs = 1 << self.cluster_bits
        self.l1_off = be64(data, 40)
        self.l1_size = be32(data, 36)
        self.rt_off = be64(data, 48)
        self.rt_clusters = be32(data, 56)
        self.l1 = [be64(data, self.l1_off + 8 * i) for i in range(self.l1_size)
                   if self.l1_off + 8 * i + 8 <= len(data)]
        self.l2_tables = [e & 0x00fffffffffffe00 for e in self.l1
                          if e & 0x00fffffffffffe00]
        self.l2_entries = []        # (file offset of entry, value)
        for t in self.l2_tables:
            for i in range(self.cs // 8):
                o = t + 8 * i
                if o + 8 <= len(data) and be64(data, o):
                    self.l2_entries.append((o, be64(data, o)))
        self.rt_entries = [(self.rt_off + 8 * i, be64(data, self.rt_off + 8 * i))
                           for i in range(self.rt_clusters * self.cs // 8)
                           if self.rt_off + 8 * i + 8 <= len(data)
                           and be64(data, self.rt_off + 8 * i)]


def mutate(data, rng):
    """Return (name, mutated bytes)."""
    d = bytearray(data)
    lay = Layout(data)
    cs = lay.cs
    end = len(d)
    hostile_offsets = [0, cs, lay.l1_off, lay.rt_off, end, end + cs,
                       2**55, 2**56 - cs, 2**63, 2**64 - 512, 123 * 512 + 7]
    kind = rng.randrange(14)
    if kind == 0:
        for _ in range(rng.randrange(1, 9)):
            p = rng.randrange(min(end, 4 * cs + 4096))
            d[p] ^= 1 << rng.randrange(8)
        return "bitflip", d
    if kind == 1:
        return "truncate", d[:rng.randrange(end)]
    if kind == 2:
        field = rng.choice([(24, 8), (36, 4), (40, 8), (48, 8), (56, 4),
                            (60, 4), (64, 8), (100, 4), (96, 4), (20, 4)])
        v = rng.choice([0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1, end,
                        end + cs, cs, lay.l1_off, lay.rt_off, 7])
        if field[1] == 8:
            put64(d, field[0], v)
        else:
            put32(d, field[0], v)
        return f"header-{field[0]}", d
    if kind == 3 and lay.l1:
        i = rng.randrange(len(lay.l1))
        v = rng.choice(hostile_offsets + [lay.l1_off | 2**63,
                                          rng.choice(lay.l2_tables or [0]) | 2**63])
        put64(d, lay.l1_off + 8 * i, v | (2**63 if rng.randrange(2) else 0))
        return "l1-pointer", d
    if kind == 4 and len(lay.l1) > 1 and lay.l2_tables:
        # Two L1 entries sharing one L2 table; or an L2 table that is
        # also the L1 table (a cycle through the metadata).
        t = rng.choice(lay.l2_tables)
        for i in range(len(lay.l1)):
            put64(d, lay.l1_off + 8 * i, t | 2**63)
        return "l2-shared", d
    if kind == 5 and lay.l1:
        put64(d, lay.l1_off, lay.l1_off | 2**63)
        return "l1-is-l2", d
    if kind == 6 and lay.l2_entries:
        o, v = rng.choice(lay.l2_entries)
        target = rng.choice(hostile_offsets + lay.l2_tables + [lay.rt_off])
        put64(d, o, (target & 0x00fffffffffffe00) | 2**63 |
              (1 if rng.randrange(4) == 0 else 0))
        return "l2-normal-pointer", d
    if kind == 7 and lay.l2_entries:
        o, v = rng.choice(lay.l2_entries)
        x = 62 - (lay.cluster_bits - 8)
        off = rng.choice([0, lay.l1_off, lay.rt_off, end - 1, end, end + 4096,
                          rng.randrange(end), (2**x) - 1])
        sectors = rng.choice([0, 1, (1 << (lay.cluster_bits - 8)) - 1])
        put64(d, o, 2**62 | (sectors << x) | (off & ((1 << x) - 1)))
        return "l2-compressed-pointer", d
    if kind == 8 and lay.l2_entries:
        o, v = rng.choice(lay.l2_entries)
        put64(d, o, v | (1 << rng.choice([1, 5, 8, 56, 60, 61])))
        return "l2-reserved", d
    if kind == 9 and lay.rt_entries:
        o, v = rng.choice(lay.rt_entries)
        put64(d, o, rng.choice(hostile_offsets + lay.l2_tables + [lay.l1_off]))
        return "refcount-table-pointer", d
    if kind == 10 and lay.rt_entries:
        # Refcounts of zero under live metadata.
        o, v = rng.choice(lay.rt_entries)
        blk = v & ~511
        if blk + cs <= end:
            for i in range(rng.randrange(1, 20)):
                p = blk + rng.randrange(cs)
                d[p] = rng.choice([0, 0xff, 1])
        return "refcount-block", d
    if kind == 11:
        # Refcount table overlapping data or the L1 table.
        put64(d, 48, rng.choice([lay.l1_off, cs * 2, end - cs]))
        return "refcount-table-overlap", d
    if kind == 12:
        put64(d, 24, rng.choice([2**62, 2**50, end * 1000, 0, 1]))
        put32(d, 36, rng.choice([2**31, 0, 1, lay.l1_size * 4]))
        return "huge-sizes", d
    # Snapshot table pointing anywhere.
    put32(d, 60, rng.choice([1, 1000, 2**31]))
    put64(d, 64, rng.choice(hostile_offsets))
    return "snapshots", d


def make(seed_dir, out_dir, count, rng_seed):
    rng = random.Random(rng_seed)
    seeds = sorted(os.listdir(seed_dir))
    datas = [open(os.path.join(seed_dir, s), "rb").read() for s in seeds]
    for i in range(count):
        j = rng.randrange(len(seeds))
        name, d = mutate(datas[j], rng)
        with open(os.path.join(out_dir, f"{i:04d}-{name}-{seeds[j]}"), "wb") as f:
            f.write(d)


def check(path):
    r = subprocess.run(["qemu-img", "check", "-q", "-f", "qcow2", path],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return r.returncode


class Hang(Exception):
    pass


def on_alarm(sig, frame):
    raise Hang()


def session(sock, name, fn):
    h = nbd.NBD()
    h.set_export_name(name)
    try:
        h.connect_unix(sock)
    except nbd.Error:
        return "refused"
    try:
        return fn(h)
    finally:
        try:
            h.shutdown()
        except nbd.Error:
            pass


def reads(h):
    size = h.get_size()
    errors = 0
    spans = [(0, min(size, 4 << 20))]
    if size > (4 << 20):
        spans.append((size - (1 << 20), 1 << 20))
        spans.append((size // 2, 1 << 20))
    for start, n in spans:
        for off in range(start, start + n, 256 * 1024):
            try:
                h.pread(min(256 * 1024, start + n - off), off)
            except nbd.Error:
                errors += 1
    try:
        h.block_status(min(size, 8 << 20) or 1, 0, lambda *a: 0)
    except nbd.Error:
        errors += 1
    return f"read-errors={errors}"


def writes(h):
    if h.is_read_only():
        return "read-only"
    size = h.get_size()
    if size == 0:
        return "empty"
    rng = random.Random(size)
    errors = 0
    ops = [("w", rng.randrange(size), 5000), ("w", 0, 65536),
           ("z", rng.randrange(size), 70000), ("t", 0, 131072),
           ("w", size - 1, 1), ("f", 0, 0)]
    for kind, off, n in ops:
        n = min(n, size - off)
        try:
            if kind == "w":
                h.pwrite(b"\x5a" * n, off)
            elif kind == "z":
                h.zero(n, off)
            elif kind == "t":
                h.trim(n, off)
            else:
                h.flush()
        except nbd.Error:
            errors += 1
    return f"write-errors={errors}"


def run(ro_sock, rw_sock, directory, names):
    signal.signal(signal.SIGALRM, on_alarm)
    bad = 0
    for name in names:
        path = os.path.join(directory, name)
        before = check(path)
        signal.alarm(30)
        try:
            r1 = session(ro_sock, name, reads)
            r2 = session(rw_sock, name, writes)
        except Hang:
            print(f"{name}: HANG", flush=True)
            return 1
        signal.alarm(0)
        after = check(path)
        verdict = ""
        # qemu-img check: 0 clean, 3 leaks only, 2 corruption.
        if before == 0 and after not in (0, 3):
            verdict = " CORRUPTED-BY-WRITES"
            bad += 1
        print(f"{name} check-before={before} {r1} {r2} check-after={after}{verdict}",
              flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        sys.exit(run(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]))
