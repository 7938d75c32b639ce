#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# A write workload for crash tests, and the check of an image after the
# server was killed under it.
#
#   crash-workload.py client URI SEED LOG [mixed|fua]
#       Writes of random sizes at increasing offsets (each byte is written
#       at most once) and zeroes now and then.  mixed: a flush every few
#       operations and one operation in eight with FUA; fua: every
#       operation with FUA, no flush.  Before each operation it logs
#       "A INDEX KIND OFFSET LENGTH SEED" (from then on the operation may
#       be in the image); after a FUA operation returns, "D INDEX" (it is
#       durable); after a flush returns, "F" (every operation before it is
#       durable).  At the end of the disk it flushes, logs "DONE" and
#       stays connected.  It runs until the server goes away: then it
#       exits 3 ("connection lost").  Any other end (an error the server
#       replied with, such as EIO) is a failure: exit 1.
#
#   crash-workload.py verify IMAGE.raw BASE.raw LOG
#       IMAGE.raw is the disk read from the image after the kill (by
#       qemu), BASE.raw the disk before the workload.  Every durable
#       operation must be in the image exactly; every byte that no
#       operation touched must be as in BASE (the operations in flight at
#       the kill, and those not yet flushed, may be there in part or not
#       at all).  Prints a summary; on a failure, says what is wrong and
#       exits 1 (everything on stdout).

import random
import sys
import time


def client(uri, seed, log_path, mode):
    import nbd

    rng = random.Random(seed)
    h = nbd.NBD()
    h.connect_uri(uri)
    size = h.get_size()
    log = open(log_path, "w")

    def note(*fields):
        print(*fields, file=log, flush=True)

    pos = rng.randrange(0, 65536)
    index = 0
    try:
        while True:
            n = rng.randrange(1, 60000)
            if pos + n > size:
                h.flush()
                note("F")
                note("DONE")
                # Stay connected until the kill; a read notices it.
                while True:
                    h.pread(512, 0)
                    time.sleep(0.02)
            op_seed = rng.randrange(1 << 30)
            kind = "Z" if rng.randrange(6) == 0 else "W"
            fua = mode == "fua" or rng.randrange(8) == 0
            flags = nbd.CMD_FLAG_FUA if fua else 0
            note("A", index, kind, pos, n, op_seed)
            if kind == "Z":
                h.zero(n, pos, flags)
            else:
                h.pwrite(random.Random(op_seed).randbytes(n), pos, flags)
            if fua:
                note("D", index)
            index += 1
            pos += n + rng.randrange(0, 5000)
            if mode == "mixed" and rng.randrange(4) == 0:
                h.flush()
                note("F")
    except nbd.Error as e:
        if h.aio_is_dead() or h.aio_is_closed():
            print(f"connection lost after {index} operations: {e}", flush=True)
            sys.exit(3)
        print(f"operation {index} failed while the server was up: {e}", flush=True)
        sys.exit(1)


def verify(image, base, log_path):
    data = open(image, "rb").read()
    old = open(base, "rb").read()
    ops = {}
    durable = set()
    fua = 0
    for line in open(log_path):
        p = line.split()
        if p[0] == "A":
            ops[int(p[1])] = (p[2], int(p[3]), int(p[4]), int(p[5]))
        elif p[0] == "D":
            durable.add(int(p[1]))
            fua += 1
        elif p[0] == "F":
            durable.update(ops)
    if not durable:
        print("no operation was durable before the kill: nothing was tested")
        sys.exit(1)
    if len(data) != len(old):
        print(f"the disk is {len(data)} bytes, not {len(old)}")
        sys.exit(1)
    for i in sorted(durable):
        kind, off, n, s = ops[i]
        want = random.Random(s).randbytes(n) if kind == "W" else bytes(n)
        if data[off:off + n] != want:
            bad = next(k for k in range(n) if data[off + k] != want[k])
            print(f"durable operation {i} ({kind} at {off}+{n}) is not in the image "
                  f"(first wrong byte at {off + bad})")
            sys.exit(1)
    # Operations are at increasing offsets and never overlap.
    pos = 0
    untouched = 0
    for i in sorted(ops):
        _, off, n, _ = ops[i]
        if data[pos:off] != old[pos:off]:
            bad = next(k for k in range(pos, off) if data[k] != old[k])
            print(f"byte {bad} changed but no operation wrote it")
            sys.exit(1)
        untouched += off - pos
        pos = off + n
    if data[pos:] != old[pos:]:
        bad = next(k for k in range(pos, len(old)) if data[k] != old[k])
        print(f"byte {bad} changed but no operation wrote it")
        sys.exit(1)
    untouched += len(old) - pos
    print(f"{len(durable)} durable operations present ({fua} by FUA), "
          f"{len(ops) - len(durable)} not durable yet, "
          f"{untouched} untouched bytes unchanged")


if __name__ == "__main__":
    if sys.argv[1] == "client":
        client(sys.argv[2], int(sys.argv[3]), sys.argv[4],
               sys.argv[5] if len(sys.argv) > 5 else "mixed")
    else:
        verify(sys.argv[2], sys.argv[3], sys.argv[4])
