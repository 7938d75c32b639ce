#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# The checker of the power-loss harness: crash states rebuilt from the
# storage's write log (record-log.h), each checked with qemu-img.
#
#   power-loss-check.py --name NAME --log LOG --shadow SHADOW
#       --initial DEVICE|none [--initial-data DATA [--data-file-raw]]
#       --size VIRTUAL_SIZE [--initial-raw RAW]
#       [--states N] [--seed S] [--create CLUSTER_SIZE]
#       [--keep-unformatted PATH] [--expect-discards] [--expect-cut]
#       [--secret FILE] [--snapshot ID=RAW]...
#       [--bitmap NAME=MAP]... [--frozen-bitmap NAME=MAP]...
#       [--repair-dirty filter|plugin=SO [--nbdkit-env ARG]...]
#       [--workdir DIR] [--jobs J] [--self-check [all|data-file]]
#
# The log is in device order (record-log.h): every change to the storage
# as it began and as it returned, every flush as it was received and as
# it returned.  A crash can come at any point of the log.  What the
# storage then holds: every change that a flush made durable (one to the
# flush's file that had returned before the flush was received, if the
# flush returned before the crash), applied in the order they returned,
# plus any subset of the other changes begun before the crash (those in
# flight then included), some writes torn at 512-byte sectors.  The
# crash points taken are the returns of the flushes (all, or if there
# are too many an even sample with the first and the last), random
# points between them (half of them where changes were in flight), and
# the end of the log.
# Each state must
#   - pass qemu-img check without corruption (leaked clusters are fine),
#   - read, through qemu, every byte that a request made durable by the
#     crash point (a flush that had returned covers what had returned
#     when it was sent; a FUA request covers itself once returned), where
#     a sector may also hold what a later write or zero put there, and
#     nothing else.
# Two changes to the same bytes of a file in flight at once are an error
# of their own (the storage may keep either).  --self-check drops the
# flushes' ordering from the replay (nothing is durable, every state a
# subset of everything begun; --self-check data-file: only the data
# file's flushes dropped): the check must then fail, which shows that it
# is not blind to lost flushed data; the exit status is 0 only if it did
# fail.
# With --create the storage starts out empty and is formatted by the
# server with clusters of CLUSTER_SIZE: a state whose first cluster is
# still all zeros is also fine, if no flush or FUA request had returned
# (qcow2-create can run again on it; --keep-unformatted keeps the last
# such state, for the caller to show that).
#
# A discard that reached the storage (a trim, a hole punched, the part of
# a file that a truncate cut off) is data lost there: in a state that
# includes it, the range holds garbage, and nothing the image refers to
# (its tables, the data clusters and compressed data its L2 tables
# point at) may lie in a range discarded and not written since.  With
# --expect-discards the log must hold a discard, with --expect-cut a
# truncate that made the file shorter.
#
# A log of two files (record-log.h; --initial-data DATA, the data file
# when the log began, is then required) is of an image (file 0, whose
# start is --initial) and its external data file (file 1): a state is
# both, rebuilt alike, except that a hole punched in the data file reads
# as zeros (the file system's promise: the engine punches out only
# clusters the guest zeroed, and with data_file_raw relies on it), and
# that the image's data clusters lie in the data file, not in its own
# discarded ranges.  Each state is checked in a directory of its own:
# the image, and its data file under the relative name in the state's
# header (that of --initial if the state's names none); qemu runs there,
# as it looks for a relative data file name in its working directory,
# where the engine looks beside the image.  The log must hold a change
# of the data file.  With --data-file-raw (data_file_raw=on), at the end
# of the log (a clean close) the data file must read as the guest disk.
#
# With --secret, the image is LUKS-encrypted and qemu opens it with the
# passphrase in FILE.  Each --snapshot ID=RAW is an internal snapshot that every state must still
# hold exactly as RAW (qemu-img convert -l snapshot.id=ID).
#
# Each --bitmap NAME=MAP is an enabled persistent bitmap, MAP its dirty
# map when the log began (nbdinfo --map=qemu:dirty-bitmap:NAME of
# qemu-nbd -B NAME): in every state where qemu finds it consistent (not
# in use), it must mark every guest sector that differs from
# --initial-raw (a write or zero that reached the disk); at the end of
# the log (a clean close) it must be consistent and mark exactly MAP and
# the granules of every operation of the shadow.  Each
# --frozen-bitmap NAME=MAP is a disabled one: never in use, and its map
# MAP in every state.
#
# With --repair-dirty FORM=SO, a state with the dirty bit set (the
# refcounts may be stale) is first opened for writing by nbdkit with SO,
# the filter (over the file plugin) or the plugin form, whose open
# repairs it; the open must succeed and leave the bit clear, and the
# state is then checked as any other.  Each --nbdkit-env ARG goes before nbdkit on its command line
# (the sanitizers' runtime, valgrind).

import argparse
import bisect
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from powerloss import SECTOR, identify, read_shadow, write_data  # noqa: E402

FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE = 1, 2, 0x10
INCOMPAT_DATA_FILE = 1 << 2
EXT_DATA_FILE = 0x44415441


class Change:
    """A change to the storage: REC (what apply takes), where its record
    ends in the log (BEGIN) and where its completion's does (DONE, None
    if it never returned), its number, and the file it changes (0 the
    image, 1 its data file).
    """
    __slots__ = ("rec", "begin", "done", "number", "file")

    def __init__(self, rec, begin, number, file):
        self.rec, self.begin, self.done, self.number = rec, begin, None, number
        self.file = file

    def extent(self):
        """[lo, hi) of the bytes it changes (a cut: all from its size)."""
        r = self.rec
        if r[0] == "W":
            return r[2], r[2] + len(r[3])
        if r[0] == "T":
            return r[2], 1 << 64
        if r[0] == "A":
            return r[3], r[3] + r[4]
        return r[2], r[2] + r[3]


def parse_log(path):
    """(changes in the order they began, flushes as [received, returned,
    file] (log offsets, returned None if never), the offsets where each
    record ends, the log's size, the number of files it records).
    """
    data = open(path, "rb").read()
    pos, changes, flushes, ends, files = 0, [], [], [], 1
    while pos < len(data):
        kind = chr(data[pos])
        # A log of several files: the FILE byte after the kind of each
        # change and 'f' record (record-log.h).
        file, at = 0, pos + 1
        if files > 1 and kind in "WTADf":
            file, at = data[pos + 1], pos + 2
            if file >= files:
                sys.exit(f"{path}: record {kind!r} of file {file} at {pos}")
        if kind == "M":
            if pos != 0:
                sys.exit(f"{path}: 'M' record at {pos}, not first")
            (files,) = struct.unpack_from("<I", data, pos + 1)
            end = pos + 5
            rec = None
        elif kind == "W":
            off, n = struct.unpack_from("<QI", data, at)
            end = at + 12 + n
            rec = ("W", end, off, data[at + 12:end])
        elif kind == "T":
            (length,) = struct.unpack_from("<Q", data, at)
            end = at + 8
            rec = ("T", end, length)
        elif kind == "A":
            mode, off, n = struct.unpack_from("<IQQ", data, at)
            end = at + 20
            rec = ("A", end, mode, off, n)
        elif kind == "D":
            off, n = struct.unpack_from("<QQ", data, at)
            end = at + 16
            rec = ("D", end, off, n)
        elif kind in "CfF":
            (number,) = struct.unpack_from("<Q", data, at)
            end = at + 8
            rec = None
            if kind == "C":
                if number >= len(changes) or changes[number].done is not None:
                    sys.exit(f"{path}: completion of change {number} at {pos}")
                changes[number].done = end
            elif kind == "f":
                if number != len(flushes):
                    sys.exit(f"{path}: flush {number} received at {pos}")
                flushes.append([end, None, file])
            else:
                if number >= len(flushes) or flushes[number][1] is not None:
                    sys.exit(f"{path}: flush {number} returned at {pos}")
                flushes[number][1] = end
        elif kind == "X":
            (n,) = struct.unpack_from("<I", data, pos + 1)
            sys.exit(f"{path}: the storage saw a call the harness cannot "
                     f"model: {data[pos + 5:pos + 5 + n].decode()}")
        else:
            sys.exit(f"{path}: bad record {kind!r} at {pos}")
        if rec is not None:
            changes.append(Change(rec, end, len(changes), file))
        ends.append(end)
        pos = end
    return changes, flushes, ends, len(data), files


def overlapping_in_flight(changes):
    """Pairs of changes to the same bytes of a file that were in flight
    at once.
    """
    out, active = [], []
    for c in changes:
        active = [a for a in active if a.done is None or a.done > c.begin]
        lo, hi = c.extent()
        for a in active:
            alo, ahi = a.extent()
            if a.file == c.file and alo < hi and lo < ahi:
                out.append((a, c))
        active.append(c)
    return out


_GARBAGE = random.Random(0xD15C).randbytes(1 << 20)


def garbage(off, n):
    """What a discarded range holds: bytes that are neither zeros nor
    anything a write put there.
    """
    start = off % len(_GARBAGE)
    reps = (start + n) // len(_GARBAGE) + 1
    return (_GARBAGE * reps)[start:start + n] if reps > 1 else \
        _GARBAGE[start:start + n]


def discard(dev, lost, off, n):
    end = min(off + n, len(dev))
    if end > off:
        dev[off:end] = garbage(off, end - off)
    if off + n > len(lost):
        lost.extend(bytes(off + n - len(lost)))
    lost[off:off + n] = b"\1" * n


def apply(dev, rec, sectors=None, lost=None, holes_zero=False):
    """Apply REC to the bytearray DEV; for a write, only SECTORS (indexes
    of its 512-byte pieces, split at the storage's sector boundaries)
    if given.  LOST (a bytearray, a byte per byte of the device) marks
    what discards took and no write put back since.  HOLES_ZERO: a hole
    punched reads as zeros (the data file), not as garbage.
    """
    if lost is None:
        lost = bytearray()
    if rec[0] == "W":
        _, _, off, data = rec
        if off + len(data) > len(dev):
            dev.extend(bytes(off + len(data) - len(dev)))
        ranges = ([(off, off + len(data))] if sectors is None else
                  [pieces(off, len(data))[i] for i in sectors])
        for lo, hi in ranges:
            dev[lo:hi] = data[lo - off:hi - off]
            if lo < len(lost):
                lost[lo:min(hi, len(lost))] = bytes(min(hi, len(lost)) - lo)
    elif rec[0] == "T":
        length = rec[2]
        if length < len(dev):
            if len(lost) < len(dev):
                lost.extend(bytes(len(dev) - len(lost)))
            lost[length:len(dev)] = b"\1" * (len(dev) - length)
            del dev[length:]
        else:
            dev.extend(bytes(length - len(dev)))
    elif rec[0] == "A":
        _, _, mode, off, n = rec
        if not mode & FALLOC_FL_KEEP_SIZE and off + n > len(dev):
            dev.extend(bytes(off + n - len(dev)))
        if mode & FALLOC_FL_PUNCH_HOLE and not holes_zero:
            discard(dev, lost, off, n)
        elif mode & (FALLOC_FL_ZERO_RANGE | FALLOC_FL_PUNCH_HOLE):
            end = min(off + n, len(dev))
            if end > off:
                dev[off:end] = bytes(end - off)
                if off < len(lost):
                    lost[off:min(end, len(lost))] = bytes(min(end, len(lost)) - off)
    elif rec[0] == "D":
        _, _, off, n = rec
        discard(dev, lost, off, n)


def is_discard(rec):
    return rec[0] == "D" or (rec[0] == "A" and rec[2] & FALLOC_FL_PUNCH_HOLE)


def lost_ranges(lost, size):
    """[start, end) of the runs of LOST, below SIZE (past the end of a
    file that was cut too).
    """
    return [(m.start(), min(m.end(), size))
            for m in re.finditer(rb"\x01+", bytes(lost[:size]))]


def pieces(off, n):
    """[lo, hi) of each 512-byte storage sector a write touches."""
    out, lo = [], off
    while lo < off + n:
        hi = min((lo // SECTOR + 1) * SECTOR, off + n)
        out.append((lo, hi))
        lo = hi
    return out


# ------------------------------------------------------------ the worker
# Each worker keeps the shadow and one expected guest disk, that of the
# last flush it was asked about (states come roughly in log order).

W = {}


def unformatted(state, cluster):
    head = bytes(state[:cluster])
    return head.count(0) == len(head)


def worker_init(shadow_path, initial_raw, vsize, create, secret, snapshots,
                bitmaps, repair, nbdkit_env, data_file_raw):
    W["secret"] = os.path.abspath(secret) if secret else None
    W["data_file_raw"] = data_file_raw
    W["repair"] = repair
    W["nbdkit_env"] = nbdkit_env
    W["bitmaps"] = {name: (kind, open(path).read())
                    for kind, name, path in bitmaps}
    W["snapshots"] = [(i, open(raw, "rb").read()) for i, raw in snapshots]
    W["ops"] = read_shadow(shadow_path)
    W["initial"] = (open(initial_raw, "rb").read() if initial_raw
                    else bytes(vsize))
    W["vsize"] = vsize
    W["create"] = create
    W["cached"] = None          # (key, required set, bytearray)


def required_at(pos):
    """The shadow entries (W and Z) durable at log offset POS: those that
    a flush returned by then covered, and FUA requests returned by then;
    and whether any flush or FUA request had returned.
    """
    ops = W["ops"]
    covers, any_returned = 0, False
    for op in ops:
        if op["pos"] <= pos and op["op"] == "F":
            covers = max(covers, op["covers"])
            any_returned = True
    req = set()
    for i, op in enumerate(ops):
        if op["op"] == "F":
            continue
        if i < covers or (op.get("fua") and op["pos"] <= pos):
            req.add(i)
            any_returned = any_returned or bool(op.get("fua"))
    return req, any_returned


def expected_at(req):
    """The guest disk with the entries REQ applied, in shadow order."""
    key = frozenset(req)
    cached = W["cached"]
    if cached and cached[0] == key:
        return cached[1]
    disk = bytearray(W["initial"])
    for i in sorted(req):
        op = W["ops"][i]
        if op["op"] == "W":
            disk[op["off"]:op["off"] + op["len"]] = write_data(
                op["id"], op["off"], op["len"], op["c"])
        elif op["op"] == "Z":
            disk[op["off"]:op["off"] + op["len"]] = bytes(op["len"])
    W["cached"] = (key, disk)
    return disk


def tool(cmd, **kw):
    """subprocess.run of CMD, its output captured as text, in W["cwd"]:
    the directory of a state with a data file, so that qemu (which looks
    for a relative data file name in its working directory, where the
    engine looks beside the image) finds that state's data file, and no
    other.
    """
    return subprocess.run(cmd, capture_output=True, text=True,
                          cwd=W.get("cwd"), **kw)


def touches(op, sector):
    lo = sector * SECTOR
    return op["op"] != "F" and op["off"] <= lo < op["off"] + op["len"]


def later_explains(req, sector, got):
    """Did a request not in REQ, after the last one in REQ that wrote
    SECTOR (requests to the same bytes are in different batches, so the
    shadow's order is theirs), leave GOT in it?
    """
    ops = W["ops"]
    last = max((i for i in req if touches(ops[i], sector)), default=-1)
    for i in range(last + 1, len(ops)):
        op = ops[i]
        if i in req or not touches(op, sector):
            continue
        if (got == "Z") == (op["op"] == "Z") and (got == "Z" or got == op["id"]):
            return True
    return False


def references(state):
    """(start, end, what) of every range of its own file the qcow2 image
    in STATE refers to: its header, refcount table and blocks, L1 and L2
    tables, data clusters (unless they lie in an external data file),
    and the bytes of compressed data that its last sector does not share
    with what follows.
    """
    u32 = lambda o: struct.unpack_from(">I", state, o)[0]
    u64 = lambda o: struct.unpack_from(">Q", state, o)[0]
    external = u32(4) >= 3 and u64(72) & INCOMPAT_DATA_FILE
    bits = u32(20)
    cs = 1 << bits
    l1_size, l1_off = u32(36), u64(40)
    rt_off, rt_clusters = u64(48), u32(56)
    shift = 62 - (bits - 8)
    out = [(0, min(cs, len(state)), "the header"),
           (rt_off, rt_off + rt_clusters * cs, "the refcount table"),
           (l1_off, l1_off + 8 * l1_size, "the L1 table")]
    for i in range(rt_clusters * cs // 8):
        if rt_off + 8 * i + 8 > len(state):
            break
        b = u64(rt_off + 8 * i) & ~0x1ff
        if b:
            out.append((b, b + cs, "a refcount block"))
    for i in range(l1_size):
        if l1_off + 8 * i + 8 > len(state):
            break
        l2 = u64(l1_off + 8 * i) & 0x00fffffffffffe00
        if not l2:
            continue
        out.append((l2, l2 + cs, "an L2 table"))
        for j in range(cs // 8):
            if l2 + 8 * j + 8 > len(state):
                break
            e = u64(l2 + 8 * j)
            if e & (1 << 62):
                off = e & ((1 << shift) - 1)
                nsect = ((e >> shift) & ((1 << (bits - 8)) - 1)) + 1
                last = (off & ~511) + (nsect - 1) * 512
                out.append((off, max(off, last) + 1,
                            f"compressed data of guest cluster {i * cs // 8 + j}"))
            elif e & 0x00fffffffffffe00 and not external:
                d = e & 0x00fffffffffffe00
                out.append((d, d + cs, f"the data of guest cluster {i * cs // 8 + j}"))
    return out


def data_file_name(state):
    """The external data file's name in the header of the qcow2 image in
    STATE (its header extension), or None.
    """
    if len(state) < 104 or struct.unpack_from(">I", state, 4)[0] < 3:
        return None
    pos = struct.unpack_from(">I", state, 100)[0]
    while pos + 8 <= len(state):
        kind, n = struct.unpack_from(">II", state, pos)
        if kind == 0 or pos + 8 + n > len(state):
            return None
        if kind == EXT_DATA_FILE:
            return bytes(state[pos + 8:pos + 8 + n]).decode(errors="replace")
        pos += 8 + (n + 7) // 8 * 8
    return None


def beside(name):
    """NAME if it is a relative name that stays inside the image's
    directory (where a crash state's data file can be placed), else None.
    """
    if not name or os.path.isabs(name):
        return None
    norm = os.path.normpath(name)
    if norm == "." or norm.split(os.sep)[0] == ".." or norm == "image.qcow2":
        return None
    return norm


def refers_to_lost(state, lost):
    """What of STATE refers to a range in LOST (sorted [start, end)), or
    None.
    """
    if not lost:
        return None
    starts = [r[0] for r in lost]
    for lo, hi, what in references(state):
        i = bisect.bisect_right(starts, lo) - 1
        for r in lost[max(i, 0):]:
            if r[0] >= hi:
                break
            if r[1] > lo:
                return (f"{what} at host offset {lo:#x} lies in bytes a "
                        f"discard took ({r[0]:#x}-{r[1]:#x}) and no write "
                        f"put back")
    return None


def qemu_read(image, raw, options=()):
    """The guest disk qemu reads from IMAGE (qemu-img's arguments for
    the image, the file last) with OPTIONS, through the scratch file RAW:
    (bytes, None), or (None, qemu-img's error).
    """
    r = tool(["qemu-img", "convert", *options, *image[:-1],
              "-O", "raw", image[-1], raw])
    if r.returncode != 0:
        return None, r.stderr
    with open(raw, "rb") as f:
        got = f.read()
    os.unlink(raw)
    return got, None


def dirty_granules(map_text, granularity):
    """The set of granule indexes a dirty map marks."""
    out = set()
    for line in map_text.splitlines():
        f = line.split()
        if len(f) >= 3 and f[2] == "1":
            start, length = int(f[0]), int(f[1])
            out.update(range(start // granularity,
                             (start + length + granularity - 1) // granularity))
    return out


def bitmap_info(image):
    """{name: (flags, granularity)} of IMAGE's bitmaps, or an error."""
    r = tool(["qemu-img", "info", "--output=json", *image])
    if r.returncode != 0:
        return f"qemu-img info failed: {r.stderr}"
    data = json.loads(r.stdout).get("format-specific", {}).get("data", {})
    return {b["name"]: (b["flags"], b["granularity"])
            for b in data.get("bitmaps", [])}


def bitmap_map(path, name):
    r = tool(["nbdinfo", f"--map=qemu:dirty-bitmap:{name}", "--",
              "[", "qemu-nbd", "-r", "-B", name, "-f", "qcow2",
              path, "]"])
    if r.returncode != 0:
        return None, r.stderr
    return r.stdout, None


def check_bitmaps(path, image, got, final):
    """None if the bitmaps of the state at PATH (guest disk GOT as qemu
    reads it) are right, else what is wrong.
    """
    info = bitmap_info(image)
    if isinstance(info, str):
        return info
    initial = W["initial"]
    changed = None
    for name, (kind, want_map) in W["bitmaps"].items():
        if name not in info:
            return f"bitmap {name} is gone ({sorted(info)} are left)"
        flags, gran = info[name]
        in_use = "in-use" in flags
        if kind == "frozen" and in_use:
            return f"the disabled bitmap {name} is in use"
        if in_use:
            if final:
                return f"bitmap {name} is still in use after the clean close"
            continue
        text, err = bitmap_map(path, name)
        if err:
            return f"qemu-nbd -B {name} failed: {err}"
        marked = dirty_granules(text, gran)
        if kind == "frozen":
            if marked != dirty_granules(want_map, gran):
                return f"the disabled bitmap {name} changed"
            continue
        if changed is None:
            changed = [s for s in range(len(got) // SECTOR)
                       if got[s * SECTOR:(s + 1) * SECTOR] !=
                       initial[s * SECTOR:(s + 1) * SECTOR]]
        for sec in changed:
            if sec * SECTOR // gran not in marked:
                return (f"bitmap {name} is consistent but misses guest "
                        f"sector {sec}, which a write changed on disk")
        if final:
            want = dirty_granules(want_map, gran)
            for op in W["ops"]:
                if op["op"] in ("W", "Z"):
                    want.update(range(op["off"] // gran,
                                      (op["off"] + op["len"] + gran - 1) // gran))
            if marked != want:
                return (f"bitmap {name} after the clean close marks "
                        f"{len(marked)} granules, the operations "
                        f"{len(want)}: {len(marked - want)} more, "
                        f"{len(want - marked)} fewer")
    return None


def is_dirty(path):
    with open(path, "rb") as f:
        f.seek(72)
        return struct.unpack(">Q", f.read(8))[0] & 1 == 1


def repair_dirty(path):
    """None once the engine's open repaired the dirty state at PATH."""
    form, so = W["repair"].split("=", 1)
    serve = [f"--filter={so}", "file", path] if form == "filter" else [so, path]
    r = tool([*W["nbdkit_env"], "nbdkit", "-U", "-", *serve,
              "--run", "nbdinfo --size \"$uri\""])
    if r.returncode != 0:
        return (f"{form} did not repair the dirty state (status "
                f"{r.returncode}): {r.stderr[-1500:]}")
    if is_dirty(path):
        return f"the dirty bit is still set after the {form}'s open"
    return None


def check_state(path, pos, label, lost=(), final=False, data_path=None):
    """None if the state at PATH (its data file at DATA_PATH, if it has
    one) is fine for a crash at log offset POS, else what is wrong; FINAL
    for the end of the log.
    """
    W["cwd"] = os.path.dirname(path) if data_path else None
    try:
        req, any_returned = required_at(pos)
        with open(path, "rb") as f:
            first = f.read(W["create"] or 1)
        if W["create"] and unformatted(first, W["create"]):
            if any_returned:
                return ("the first cluster is zero, but a flush or a FUA "
                        "request had returned")
            return None
        with open(path, "rb") as f:
            err = refers_to_lost(f.read(), list(lost))
        if err:
            return err
        if W["repair"] and is_dirty(path):
            err = repair_dirty(path)
            if err:
                return err
        if W["secret"]:
            image = ["--object", f"secret,id=s0,file={W['secret']}",
                     "--image-opts",
                     f"driver=qcow2,file.filename={path},encrypt.key-secret=s0"]
        else:
            image = ["-f", "qcow2", path]
        r = tool(["qemu-img", "check"] + image)
        if r.returncode not in (0, 3) or "ERROR" in r.stdout:
            return (f"qemu-img check exit {r.returncode}:\n"
                    f"{r.stdout}{r.stderr}")
        for sid, want_snap in W["snapshots"]:
            got, err = qemu_read(image, path + ".raw",
                                 ["-l", f"snapshot.id={sid}"])
            if err:
                return f"qemu-img convert -l snapshot.id={sid} failed: {err}"
            if got != want_snap:
                return f"snapshot {sid} changed"
        got, err = qemu_read(image, path + ".raw")
        if err:
            return f"qemu-img convert failed: {err}"
        want = expected_at(req)
        if len(got) != W["vsize"]:
            return f"the disk is {len(got)} bytes, not {W['vsize']}"
        if W["bitmaps"]:
            err = check_bitmaps(path, image, got, final)
            if err:
                return err
        if final and W["data_file_raw"]:
            with open(data_path, "rb") as f:
                raw = f.read(W["vsize"])
            if raw + bytes(len(got) - len(raw)) != got:
                return ("data_file_raw: after the clean close the data file "
                        "does not read as the guest disk")
        if got == want:
            return None
        for c in range(0, len(got), 65536):
            if got[c:c + 65536] == want[c:c + 65536]:
                continue
            for s in range(c // SECTOR, min(c + 65536, len(got)) // SECTOR):
                a = got[s * SECTOR:(s + 1) * SECTOR]
                if a == want[s * SECTOR:(s + 1) * SECTOR]:
                    continue
                what = identify(a, s)
                if what is None:
                    return f"guest sector {s} holds data no write put there"
                if not later_explains(req, s, what):
                    expect = identify(bytes(want[s * SECTOR:(s + 1) * SECTOR]), s)
                    return (f"guest sector {s} holds {what!r}, but {expect!r} "
                            f"was durable there at log offset {pos}: "
                            f"flushed data lost")
        return None
    finally:
        if data_path:
            shutil.rmtree(os.path.dirname(path))
        else:
            os.unlink(path)


# ------------------------------------------------------------ the main
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--shadow", required=True)
    ap.add_argument("--initial", required=True)
    ap.add_argument("--initial-data")
    ap.add_argument("--data-file-raw", action="store_true")
    ap.add_argument("--initial-raw")
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--states", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--create", type=int, default=0)
    ap.add_argument("--keep-unformatted")
    ap.add_argument("--expect-discards", action="store_true")
    ap.add_argument("--expect-cut", action="store_true")
    ap.add_argument("--secret")
    ap.add_argument("--snapshot", action="append", default=[])
    ap.add_argument("--bitmap", action="append", default=[])
    ap.add_argument("--frozen-bitmap", action="append", default=[])
    ap.add_argument("--repair-dirty")
    ap.add_argument("--nbdkit-env", action="append", default=[])
    ap.add_argument("--workdir", default=".")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--self-check", nargs="?", const="all",
                    choices=["all", "data-file"])
    a = ap.parse_args()
    a.workdir = os.path.abspath(a.workdir)
    rng = random.Random(a.seed)

    changes, flushes, ends, log_size, files = parse_log(a.log)
    ops = read_shadow(a.shadow)
    if files > 2:
        sys.exit(f"{a.log}: a log of {files} files (an image and its data "
                 f"file are two)")
    if (files == 2) != (a.initial_data is not None):
        sys.exit(f"{a.name}: the log records {files} file(s), but "
                 f"--initial-data was{'' if a.initial_data else ' not'} given")
    if a.self_check == "data-file" and files != 2:
        sys.exit(f"{a.name}: --self-check data-file needs a data file")
    # The data file (file 1): a hole punched there reads as zeros, as
    # the file system promises; the engine punches only clusters the
    # guest zeroed, and relies on it with data_file_raw.
    holes_zero = [False, True]
    ndiscards = sum(1 for c in changes if is_discard(c.rec))
    ncuts = 0
    for f in range(files):
        sizes = [0]
        for c in changes:
            if c.file != f:
                continue
            if c.rec[0] == "W":
                sizes.append(max(sizes[-1], c.rec[2] + len(c.rec[3])))
            elif c.rec[0] == "T":
                sizes.append(c.rec[2])
        ncuts += sum(1 for a_, b_ in zip(sizes, sizes[1:]) if b_ < a_)
    if a.expect_discards and ndiscards == 0:
        sys.exit(f"{a.name}: the storage saw no discard")
    if a.expect_cut and ncuts == 0:
        sys.exit(f"{a.name}: the file was never made shorter")
    data_changes = [c for c in changes if c.file == 1]
    data_flushes = [f for f in flushes if f[2] == 1]
    # (A data file never flushed is what the crash states must show.)
    if files == 2 and not data_changes:
        sys.exit(f"{a.name}: the log holds no change of the data file: was "
                 f"it recorded?")
    client_flushes = [i for i, op in enumerate(ops) if op["op"] == "F"]
    if not client_flushes:
        sys.exit(f"{a.name}: the client logged no flush")
    # A flush that returned after requests which had not returned when
    # it was sent: it was sent with them in flight.
    sent_in_flight = sum(1 for i in client_flushes if ops[i]["covers"] < i)
    races = overlapping_in_flight(changes)
    if races:
        for x, y in races[:5]:
            print(f"  changes {x.number} ({x.rec[0]} {x.extent()[0]:#x}-"
                  f"{x.extent()[1]:#x}) and {y.number} ({y.rec[0]} "
                  f"{y.extent()[0]:#x}-{y.extent()[1]:#x}) to the same bytes "
                  f"of file {x.file} were in flight at once")
        sys.exit(f"{a.name}: {len(races)} pairs of changes to the same bytes "
                 f"in flight at once: the storage may keep either")

    # The barriers at a crash at log offset POS, one per file: the latest
    # offset at which a flush of that file that returned by POS was
    # received; what of the file completed before it is durable.  Without
    # the flushes' ordering (--self-check), none; with --self-check
    # data-file, none of the data file's.
    returned = sorted((f[1], f[0], f[2]) for f in flushes if f[1] is not None)
    ignored = (set(range(files)) if a.self_check == "all" else
               {1} if a.self_check == "data-file" else set())

    def barrier(pos):
        b = [-1] * files
        for end, begin, f in returned:
            if end > pos:
                break
            if f not in ignored:
                b[f] = max(b[f], begin)
        return tuple(b)

    def durable(c, b):
        return c.done is not None and c.done <= b[c.file]

    def in_flight(pos):
        return [c for c in changes if c.begin <= pos and
                (c.done is None or c.done > pos)]

    # The crash points and what of the undurable changes each state holds:
    # (pos, kind, subset) with subset None (none of them), "all", or a
    # list of (change, sectors or None).
    plan = []
    points = [end for end, _, _ in returned]
    if len(points) * 2 > a.states:
        keep = {0, len(points) - 1} | set(rng.sample(range(len(points)),
                                                     a.states // 2))
        points = [p for i, p in enumerate(points) if i in keep]
    plan += [(p, "boundary", None) for p in points]
    plan.append((log_size, "end", "all"))
    flight_points = [e for e in ends if in_flight(e)]

    def random_subset(candidates):
        for _ in range(20):
            subset = []
            for c in candidates:
                if rng.random() < 0.5:
                    continue
                sectors = None
                if c.rec[0] == "W" and rng.random() < 0.3:
                    count = len(pieces(c.rec[2], len(c.rec[3])))
                    if count > 1:
                        sectors = sorted(rng.sample(range(count),
                                                    rng.randrange(1, count)))
                subset.append((c, sectors))
            torn = any(sec is not None for _, sec in subset)
            if subset and (len(subset) < len(candidates) or torn):
                return subset
        return None

    # qcow2-create writes the header last, after a flush of everything
    # it refers to: the one state that shows that order broken (the
    # header on disk, the tables not) is taken always, not left to the
    # random subsets below.
    if a.create:
        header = next((c for c in changes if c.rec[0] == "W" and
                       c.rec[2] == 0 and c.file == 0), None)
        if header is None:
            sys.exit(f"{a.name}: qcow2-create wrote no header")
        pos = header.done if header.done is not None else header.begin
        if not durable(header, barrier(pos)):
            plan.append((pos, "subset", [(header, None)]))

    budget = a.states - len(plan)
    tries = 0
    while budget > 0 and tries < 10 * a.states:
        tries += 1
        pool = flight_points if flight_points and rng.random() < 0.5 else ends
        pos = rng.choice(pool)
        b = barrier(pos)
        undurable = [c for c in changes if c.begin <= pos and
                     not durable(c, b)]
        subset = random_subset(undurable)
        if subset is not None:
            plan.append((pos, "subset", subset))
            budget -= 1
    # Each file's barrier grows with POS: in this order the durable
    # changes of every file are applied once, as the plan goes on.
    plan.sort(key=lambda p: (barrier(p[0]), p[0]))

    counts = {"boundary": 0, "subset": 0, "torn": 0, "unformatted": 0,
              "in flight": 0, "holding one": 0, "dirty": 0}
    failures = []
    keep_candidate = None
    # Per file: its durable contents, what discards took from it (only
    # the image's are garbage), its changes in the order they completed,
    # and how many of those are applied.
    initial = [a.initial, a.initial_data][:files]
    devs = [bytearray(open(p, "rb").read()) if p != "none" else bytearray()
            for p in initial]
    losts = [bytearray(len(d)) for d in devs]
    data_name = None
    if files == 2:
        data_name = beside(data_file_name(devs[0]))
        if data_name is None:
            sys.exit(f"{a.name}: the image names no data file, or not by a "
                     f"relative name inside its directory "
                     f"({data_file_name(devs[0])!r})")
    by_done = [sorted((c for c in changes if c.done is not None and
                       c.file == f), key=lambda c: c.done)
               for f in range(files)]
    applied = [0] * files
    futures = []
    done = 0

    def collect(entry):
        label, fut = entry
        err = fut.result()
        if err:
            failures.append((label, err))

    with ProcessPoolExecutor(a.jobs, initializer=worker_init,
                             initargs=(a.shadow, a.initial_raw, a.size,
                                       a.create, a.secret,
                                       [x.split("=", 1) for x in a.snapshot],
                                       [("tracked", *x.split("=", 1)) for x in a.bitmap] +
                                       [("frozen", *x.split("=", 1)) for x in a.frozen_bitmap],
                                       a.repair_dirty, a.nbdkit_env,
                                       a.data_file_raw)) as pool:
        for number, (pos, kind, subset) in enumerate(plan):
            b = barrier(pos)
            for f in range(files):
                while (applied[f] < len(by_done[f]) and
                       by_done[f][applied[f]].done <= b[f]):
                    apply(devs[f], by_done[f][applied[f]].rec, lost=losts[f],
                          holes_zero=holes_zero[f])
                    applied[f] += 1
            states = [bytearray(d) for d in devs]
            states_lost = [bytearray(x) for x in losts]
            flying = in_flight(pos)
            if flying:
                counts["in flight"] += 1
            if subset == "all":
                for c in changes:
                    if not durable(c, b):
                        apply(states[c.file], c.rec, lost=states_lost[c.file],
                              holes_zero=holes_zero[c.file])
                label = "end of the log"
            else:
                for c, sectors in subset or []:
                    apply(states[c.file], c.rec, sectors,
                          lost=states_lost[c.file],
                          holes_zero=holes_zero[c.file])
                torn = any(sec is not None for _, sec in subset or [])
                if any(c in flying for c, _ in subset or []):
                    counts["holding one"] += 1
                label = ("flush returned at log offset %d" % pos
                         if subset is None else
                         "crash at log offset %d with %d of %d undurable "
                         "changes%s, %d in flight" %
                         (pos, len(subset),
                          sum(1 for c in changes if c.begin <= pos and
                              not durable(c, b)),
                          " (torn)" if torn else "", len(flying)))
                counts["boundary" if subset is None else
                       "torn" if torn else "subset"] += 1
            state = states[0]
            if a.create and unformatted(state, a.create):
                counts["unformatted"] += 1
                keep_candidate = bytes(state)
            if len(state) >= 80 and state[79] & 1:
                counts["dirty"] += 1
            data_path = None
            if files == 1:
                path = os.path.join(a.workdir, f"state-{number}.img")
            else:
                # The image and its data file in a directory of their
                # own, the data file where the name in the state's header
                # finds it (that of the image the log began with, if the
                # state's header names none).
                statedir = os.path.join(a.workdir, f"state-{number}")
                path = os.path.join(statedir, "image.qcow2")
                data_path = os.path.join(
                    statedir, beside(data_file_name(state)) or data_name)
                os.makedirs(os.path.dirname(data_path), exist_ok=True)
                with open(data_path, "wb") as f:
                    f.write(states[1])
            with open(path, "wb") as f:
                f.write(state)
            futures.append((label, pool.submit(
                check_state, path, pos, label,
                lost_ranges(states_lost[0], len(states_lost[0])),
                subset == "all", data_path)))
            # A few states on disk at a time, not all of them.
            while len(futures) - done >= 2 * a.jobs:
                collect(futures[done])
                done += 1
        while done < len(futures):
            collect(futures[done])
            done += 1

    total = len(futures)
    if a.self_check:
        lost_data = [f for f in failures if "flushed data lost" in f[1] or
                     "had returned" in f[1]]
        what = ("device flushes" if a.self_check == "all" else
                "the data file's flushes")
        print(f"{a.name}: self-check, the replay ignoring {what}: "
              f"{len(failures)} of {total} crash states failed, "
              f"{len(lost_data)} of them for durable data lost"
              + (f" (e.g. {lost_data[0][0]}: {lost_data[0][1]})" if lost_data
                 else ": THE CHECK IS BLIND to lost flushed data"))
        sys.exit(0 if lost_data else 1)
    if a.keep_unformatted and keep_candidate is not None:
        with open(a.keep_unformatted, "wb") as f:
            f.write(keep_candidate)
    data_holes = sum(1 for c in data_changes if is_discard(c.rec))
    print(f"{a.name}: {total} crash states checked ({counts['boundary']} at "
          f"flush returns, {counts['subset']} with later changes, "
          f"{counts['torn']} with torn writes, 1 at the end of the log"
          + (f"; {counts['unformatted']} not formatted yet" if a.create else "")
          + (f"; {counts['dirty']} dirty, repaired by the {a.repair_dirty.split('=')[0]} first"
             if a.repair_dirty else "")
          + f"; {counts['in flight']} with requests in flight, "
          f"{counts['holding one']} holding part of one) from "
          f"{len(changes)} changes ({ndiscards} discards, {ncuts} cuts"
          + (f"; {len(data_changes)} to the data file, {data_holes} of them "
             f"holes" if files == 2 else "")
          + f") and {len(flushes)} device flushes"
          + (f" ({len(data_flushes)} of the data file)" if files == 2 else "")
          + f", {len(client_flushes)} client "
          f"flushes ({sent_in_flight} sent with requests in flight): "
          + ("none corrupt, none with lost flushed data" if not failures else
             f"{len(failures)} FAILED"))
    for label, err in failures[:5]:
        print(f"  {label}: {err}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
