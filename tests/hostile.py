#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# Hostile images: mutations of qemu-made images, and a client that reads
# and writes each one through the filter.
#
#   hostile.py make SEED_DIR OUT_DIR COUNT RNG_SEED
#       writes COUNT mutated images to OUT_DIR, each named after its
#       mutation, from the images in SEED_DIR.
#   hostile.py run RO_SOCKET RO_LOG RW_SOCKET RW_LOG DIR NAMES...
#       for each name: read it through the read-only server, write it
#       through the read-write server (whose files are DIR/NAME), and
#       print one line: NAME, qemu-img check's verdict before, what the
#       reads and the writes saw, qemu-img check's verdict after, and a
#       word in capitals when something is wrong:
#       - a refusal at open must be the server's, with the filter's error
#         message in the server's log (LOG, read from where the previous
#         session ended); a dropped connection is a failure;
#       - every read that succeeds must return what qemu reads there;
#       - every write or zero the filter acknowledged must read back,
#         through the filter at once and, if qemu-img check finds the
#         image valid afterwards, through qemu;
#       - writes must not turn an image qemu-img check found clean into
#         one it finds corrupt.
#       An image that takes more than 60 s (a hang: a libnbd call that
#       never returns) kills the client with a HANG line.  The caller
#       judges the lines; the exit status is 0 unless the client itself
#       failed.

import json
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
    # -U: the server holds the image's lock until it exits.
    r = subprocess.run(["qemu-img", "check", "-U", "-q", "-f", "qcow2", path],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return r.returncode


class Bad(Exception):
    """A verdict that fails the test (the line says why)."""


class Log:
    """A server log, read from where the last session left it."""

    def __init__(self, path):
        self.path = path
        self.pos = 0

    def mark(self):
        self.pos = os.path.getsize(self.path)

    def errors(self):
        with open(self.path, "rb") as f:
            f.seek(self.pos)
            new = f.read().decode("utf-8", "replace")
        return [l for l in new.splitlines() if " error: qcow2zstd: " in l]


def session(sock, log, name, fn, *args):
    """Run FN on a connection to export NAME.  A refusal at open must be
    the server's (the connection was not just dropped) and come with the
    filter's message naming what is wrong; returns refused(message)."""
    log.mark()
    h = nbd.NBD()
    h.set_export_name(name)
    try:
        h.connect_unix(sock)
    except nbd.Error as e:
        if "server has no export named" not in (e.string or ""):
            raise Bad(f"DROPPED-AT-OPEN ({e.string})")
        errors = log.errors()
        if not errors:
            raise Bad(f"REFUSED-WITHOUT-MESSAGE ({e.string})")
        msg = errors[0].split(" error: ", 1)[1]
        return "refused(" + msg[:70].replace(" ", "_") + ")"
    try:
        return fn(h, *args)
    except nbd.Error as e:
        if h.aio_is_dead() or h.aio_is_closed():
            raise Bad(f"CONNECTION-LOST ({e.string})")
        raise
    finally:
        try:
            h.shutdown()
        except nbd.Error:
            pass


CHUNK = 256 * 1024


def qemu_bytes(path, start, n):
    """What qemu reads from the image at START+N, or None if it cannot.
    (qemu-img dd copies the blocks from skip= to count=.)"""
    bs = 4096
    first = start // bs
    last = (start + n + bs - 1) // bs
    out = path + ".qemu-read"
    r = subprocess.run(["qemu-img", "dd", "-U", "-f", "qcow2", "-O", "raw", f"bs={bs}",
                        f"skip={first}", f"count={last}", f"if={path}", f"of={out}"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        data = open(out, "rb").read() if r.returncode == 0 else None
        os.unlink(out)
    except FileNotFoundError:
        data = None
    if data is None:
        return None
    return data[start - first * bs:start - first * bs + n]


def reads(h, path):
    """Read spans of the disk; every read that succeeds must return what
    qemu reads there (where qemu can read the image at all)."""
    size = h.get_size()
    errors = compared = 0
    spans = [(0, min(size, 4 << 20))]
    if size > (4 << 20):
        spans.append(((size - (1 << 20)) // 4096 * 4096, 1 << 20))
        spans.append((size // 2 // 4096 * 4096, 1 << 20))
    qemu_refused = False
    for start, n in spans:
        n = min(n, size - start)
        want = None if qemu_refused else qemu_bytes(path, start, n)
        if want is None:
            qemu_refused = True
        for off in range(start, start + n, CHUNK):
            length = min(CHUNK, start + n - off)
            try:
                got = h.pread(length, off)
            except nbd.Error:
                errors += 1
                continue
            if want is None or len(want) < off - start + length:
                continue
            exp = want[off - start:off - start + length]
            if got != exp:
                bad = next(i for i in range(length) if got[i] != exp[i])
                raise Bad(f"READ-DIFFERS-FROM-QEMU at {off + bad}")
            compared += length
    try:
        h.block_status(min(size, 8 << 20) or 1, 0, lambda *a: 0)
    except nbd.Error:
        errors += 1
    return f"read-errors={errors} compared-with-qemu={compared}"


def writes(h, model, strict):
    """Writes, a zero, a trim and a flush; if STRICT, every one the
    filter acknowledged must read back.  MODEL gets the bytes each byte
    range must hold afterwards: (offset, length, byte value), and the
    disk's size first."""
    if h.is_read_only():
        return "read-only"
    size = h.get_size()
    model.append(size)
    if size == 0:
        return "empty"
    rng = random.Random(size)
    errors = acked = written = 0
    ops = [("w", rng.randrange(size), 5000), ("w", 0, 65536),
           ("z", rng.randrange(size), 70000), ("t", 0, 131072),
           ("w", size - 1, 1), ("f", 0, 0)]
    for kind, off, n in ops:
        n = min(n, size - off)
        try:
            if kind == "w":
                h.pwrite(b"\x5a" * n, off)
                model.append((off, n, 0x5a))
                written += 1
            elif kind == "z":
                h.zero(n, off)
                model.append((off, n, 0))
            elif kind == "t":
                # A trim is a hint: the range holds old data or zeros.
                model.append((off, n, None))
                h.trim(n, off)
            else:
                h.flush()
            acked += 1
        except nbd.Error as e:
            if h.aio_is_dead() or h.aio_is_closed():
                raise
            if kind in "wz":
                model.append((off, n, None))    # failed: anything
            errors += 1
    aliased = 0
    for off, n, value in final_ranges(model[1:]):
        got = h.pread(n, off)
        if got != bytes([value]) * n:
            bad = next(i for i in range(n) if got[i] != value)
            if strict:
                raise Bad(f"ACKNOWLEDGED-WRITE-DOES-NOT-READ-BACK at {off + bad}")
            aliased += 1
    # On an image qemu-img check finds corrupt (an L2 table that two L1
    # entries share, say), one write may change what another range
    # reads, as it would through qemu.
    return f"acknowledged={acked} writes-acknowledged={written} write-errors={errors}" + \
        (f" aliased-on-a-corrupt-image={aliased}" if aliased else "")


def final_ranges(model):
    """The ranges whose content the operations in MODEL (later ones over
    earlier ones) determine: (offset, length, value)."""
    points = sorted({p for off, n, _ in model for p in (off, off + n)})
    out = []
    for a, b in zip(points, points[1:]):
        value = "untouched"
        for off, n, v in model:
            if off <= a and b <= off + n:
                value = v
        if value not in ("untouched", None):
            if out and out[-1][0] + out[-1][1] == a and out[-1][2] == value:
                out[-1] = (out[-1][0], out[-1][1] + b - a, value)
            else:
                out.append((a, b - a, value))
    return out


def qemu_reads_writes(path, model, size):
    """qemu reads what the acknowledged writes and zeroes left: None, or
    what is wrong."""
    cmds = []
    for off, n, value in final_ranges(model):
        cmds += ["-c", f"read -q -P {value} {off} {n}"]
    if not cmds:
        return None
    r = subprocess.run(["qemu-io", "-r", "-U", "-f", "qcow2", *cmds, path],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode == 0 and "failed" not in r.stdout:
        return None
    info = subprocess.run(["qemu-img", "info", "-U", "--output=json", "-f", "qcow2", path],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        qemu_size = json.loads(info.stdout)["virtual-size"]
    except (ValueError, KeyError):
        qemu_size = None
    if qemu_size is not None and qemu_size != size:
        how = "rounds it down to" if qemu_size == size // 512 * 512 else "says"
        return f"SIZE-DIFFERS-FROM-QEMU (ours {size}, qemu {how} {qemu_size})"
    first = next((l for l in r.stdout.splitlines() if "failed" in l), r.stdout[:80])
    return f"QEMU-DOES-NOT-READ-THE-ACKNOWLEDGED-WRITES ({first.strip()[:80]})"


def watchdog(seconds):
    """A process that kills this one if an image takes longer than
    SECONDS: a hang of the server shows as a libnbd call that never
    returns, which nothing inside this process could interrupt.  Returns
    the function that tells it an image started."""
    rfd, wfd = os.pipe()
    parent = os.getpid()
    if os.fork() == 0:
        import select
        os.close(wfd)
        current = b"(start)"
        while True:
            ready, _, _ = select.select([rfd], [], [], seconds)
            if not ready:
                print(f"{current.decode().strip()}: HANG (no answer within {seconds} s)",
                      flush=True)
                os.kill(parent, signal.SIGKILL)
                os._exit(1)
            data = os.read(rfd, 4096)
            if not data:
                os._exit(0)
            current = data.splitlines()[-1]
    os.close(rfd)
    return lambda name: os.write(wfd, name.encode() + b"\n")


def run(ro_sock, ro_log, rw_sock, rw_log, directory, names):
    started = watchdog(60)
    ro, rw = Log(ro_log), Log(rw_log)
    for name in names:
        started(name)
        path = os.path.join(directory, name)
        before = check(path)
        verdict = ""
        r1 = r2 = "-"
        model = []
        # qemu-img check: 0 clean, 3 leaks only, 2 corruption, 1 cannot.
        valid = before in (0, 3)
        try:
            r1 = session(ro_sock, ro, name, reads, path)
            r2 = session(rw_sock, rw, name, writes, model, valid)
        except Bad as e:
            verdict = " " + str(e)
        after = check(path)
        if not verdict and before == 0 and after not in (0, 3):
            verdict = " CORRUPTED-BY-WRITES"
        if not verdict and len(model) > 1 and valid and after in (0, 3):
            wrong = qemu_reads_writes(path, model[1:], model[0])
            if wrong:
                verdict = " " + wrong
        print(f"{name} check-before={before} {r1} {r2} check-after={after}{verdict}",
              flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        sys.exit(run(*sys.argv[2:7], sys.argv[7:]))
