#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# A randomized write workload against an NBD export, mirrored into a raw
# file that receives the same operations.
#
#   write-workload.py URI RAW SEED CONNECTIONS OPS CLUSTER_SIZE
#
# Each connection is a separate process with its own libnbd handle and its
# own random stream.  The disk is cut into stripes of STRIPE bytes owned
# round-robin by the connections; every operation stays inside stripes of
# its own connection, so the final content does not depend on how the
# server orders the connections' requests, while connections still share
# clusters and L2 tables (stripes are not cluster aligned).
#
# Operations: writes of random sizes and offsets, zeroes (with and
# without FUA and fast-zero), trims and flushes.  A trim of whole
# clusters makes them read as zeros (what the filter and qemu do); a trim
# of part of a cluster leaves it unchanged.  The mirror models exactly
# that.

import os
import random
import sys

import nbd

uri, raw, seed, nconn, nops, cluster_size = sys.argv[1:7]
seed, nconn, nops, cluster_size = int(seed), int(nconn), int(nops), int(cluster_size)
STRIPE = 3 * 4096 + 1000


def owned_range(rng, size, who, max_len):
    """A random range inside one stripe owned by connection WHO."""
    nstripes = (size + STRIPE - 1) // STRIPE
    mine = list(range(who, nstripes, nconn))
    s = rng.choice(mine)
    start, end = s * STRIPE, min(size, (s + 1) * STRIPE)
    # Sometimes take a run of the connection's stripes when they touch:
    # with one connection every stripe is ours, so ops may be large.
    if nconn == 1 and rng.randrange(4) == 0:
        end = min(size, start + rng.randrange(1, max_len + 1))
    off = rng.randrange(start, end)
    length = rng.randrange(1, min(max_len, end - off) + 1)
    return off, length


def trim_effect(off, length):
    """The whole clusters inside [off, off+length), which read as zeros."""
    first = (off + cluster_size - 1) // cluster_size * cluster_size
    last = (off + length) // cluster_size * cluster_size
    return first, last


def run(who):
    rng = random.Random(seed * 1000 + who)
    h = nbd.NBD()
    h.connect_uri(uri)
    size = h.get_size()
    fd = os.open(raw, os.O_RDWR)
    counts = {}
    for i in range(nops):
        kind = rng.choices(["write", "zero", "trim", "flush", "read"],
                           [60, 15, 10, 5, 10])[0]
        counts[kind] = counts.get(kind, 0) + 1
        if kind == "flush":
            h.flush()
            continue
        off, length = owned_range(rng, size, who, 3 * cluster_size + 5000)
        if kind == "write":
            if rng.randrange(3) == 0:
                data = bytes([rng.randrange(256)]) * length
            else:
                data = rng.randbytes(length)
            flags = nbd.CMD_FLAG_FUA if rng.randrange(10) == 0 else 0
            h.pwrite(data, off, flags)
            os.pwrite(fd, data, off)
        elif kind == "zero":
            flags = nbd.CMD_FLAG_FUA if rng.randrange(8) == 0 else 0
            if rng.randrange(2) == 0:
                flags |= nbd.CMD_FLAG_NO_HOLE
            fast = rng.randrange(5) == 0
            try:
                h.zero(length, off, flags | (nbd.CMD_FLAG_FAST_ZERO if fast else 0))
            except nbd.Error as e:
                # A fast zero may be refused, and then nothing changed.
                if fast and e.errno in ("ENOTSUP", "EOPNOTSUPP"):
                    continue
                raise
            os.pwrite(fd, bytes(length), off)
        elif kind == "trim":
            h.trim(length, off)
            first, last = trim_effect(off, length)
            # The disk's last cluster is whole when the trim reaches the end.
            if off + length == size and last < size and off <= last:
                last = size
            if last > first:
                os.pwrite(fd, bytes(last - first), first)
        else:
            got = h.pread(length, off)
            want = os.pread(fd, length, off)
            if got != want:
                print(f"connection {who}: read at {off}+{length} differs",
                      file=sys.stderr)
                os._exit(1)
    h.flush()
    h.shutdown()
    os.close(fd)
    print(f"connection {who}: {counts}")


pids = []
for who in range(nconn):
    pid = os.fork()
    if pid == 0:
        try:
            run(who)
        except Exception as e:
            print(f"connection {who}: {e!r}", file=sys.stderr)
            os._exit(1)
        os._exit(0)
    pids.append(pid)
status = 0
for pid in pids:
    _, st = os.waitpid(pid, 0)
    if st != 0:
        status = 1
sys.exit(status)
