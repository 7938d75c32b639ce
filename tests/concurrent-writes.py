#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# Overlapping requests from several connections at once, and a check that
# the final disk is what some order of them would have made.
#
#   concurrent-writes.py initial RAW CLUSTER_SIZE SIZE
#   concurrent-writes.py run URI LOG SEED WHO OPS CLUSTER_SIZE REGION
#   concurrent-writes.py check FINAL INITIAL CLUSTER_SIZE LOG...
#
# initial: a disk of SIZE bytes whose clusters are, two of every three,
# tagged as written by request 0, the third all zeros.
#
# run: one connection (process WHO) sends OPS requests, up to 8 in
# flight, all inside the first REGION bytes, so that every connection's
# requests hit the same clusters: writes of whole and partial clusters
# (every 512-byte sector of a write carries a tag naming the request and
# the sector), zeroes, trims, some with FUA, and flushes.  Each request
# is logged with the time it was sent and the time its reply came
# (CLOCK_MONOTONIC, the same clock in every process).
#
# check: FINAL is the final disk, read by qemu, INITIAL the disk before
# (sectors tagged as written by request 0, or zeros).  Every sector
# holds zeros or the tag of a request that wrote it there (anything else
# is corruption).
# Two rules must hold, and either breaks on a lost, torn, stale or
# misplaced write:
#   1. per sector: the request whose value the sector holds covered it,
#      and no request covering it with another value was sent after that
#      one's reply came (it would have had to come later in any order);
#   2. per cluster: there is one order of all the requests touching the
#      cluster, consistent with real time (A's reply before B was sent:
#      A first), in which every sector ends with the value it holds: the
#      request that left a tag comes after every other request covering
#      that sector.  (A request over several clusters is not atomic as a
#      whole, as it is not in qemu: each cluster's part is.)
# The initial content counts as a request that came before all others.

import json
import random
import struct
import sys
import time

SECTOR = 512
MAGIC = b"QZ15"


def tag(rid, index, sector):
    head = struct.pack("<4sIIQ", MAGIC, rid, index, sector)
    fill = bytes([(rid * 31 + index * 7 + sector) % 251 + 1]) * (SECTOR - len(head))
    return head + fill


def parse(data, sector):
    """(rid, index) of a tagged sector, None for zeros; raises if neither."""
    if data == bytes(SECTOR):
        return None
    magic, rid, index, where = struct.unpack_from("<4sIIQ", data)
    if magic != MAGIC or where != sector or data != tag(rid, index, sector):
        raise SystemExit("sector %d holds neither zeros nor a tag written "
                         "there: %r" % (sector, data[:24]))
    return rid, index


def run(uri, log, seed, who, nops, cs, region):
    import nbd
    rng = random.Random(seed * 100 + who)
    h = nbd.NBD()
    h.connect_uri(uri)
    nsect = region // SECTOR
    done = []
    pending = {}
    counts = {}

    def finished(rid, err):
        if err.value:
            raise SystemExit("request %d failed: errno %d" % (rid, err.value))
        req = pending.pop(rid)
        req["end"] = time.monotonic_ns()
        done.append(req)
        return 1

    for i in range(nops):
        while len(pending) >= 8:
            h.poll(-1)
        rid = who * 1000000 + i + 1
        kind = rng.choices(["write", "zero", "trim", "flush"],
                           [60, 15, 12, 8])[0]
        # Whole clusters, parts of one, or runs over cluster boundaries.
        shape = rng.randrange(3)
        if shape == 0:
            first = rng.randrange(region // cs)
            count = rng.randrange(1, 3) * cs
            off = first * cs
        elif shape == 1:
            off = rng.randrange(nsect) * SECTOR
            count = rng.randrange(1, cs // SECTOR + 1) * SECTOR
        else:
            off = rng.randrange(nsect) * SECTOR
            count = rng.randrange(1, 3 * cs // SECTOR) * SECTOR
        count = min(count, region - off)
        flags = nbd.CMD_FLAG_FUA if kind != "flush" and rng.randrange(6) == 0 else 0
        req = {"rid": rid, "kind": kind, "off": off, "len": count,
               "fua": bool(flags)}
        pending[rid] = req
        counts[kind] = counts.get(kind, 0) + 1
        cb = (lambda r: lambda err: finished(r, err))(rid)
        req["start"] = time.monotonic_ns()
        if kind == "write":
            buf = b"".join(tag(rid, k, off // SECTOR + k)
                           for k in range(count // SECTOR))
            h.aio_pwrite(buf, off, completion=cb, flags=flags)
        elif kind == "zero":
            h.aio_zero(count, off, completion=cb, flags=flags)
        elif kind == "trim":
            h.aio_trim(count, off, completion=cb, flags=flags)
        else:
            h.aio_flush(completion=cb)
    while pending:
        h.poll(-1)
    h.flush()
    h.shutdown()
    with open(log, "w") as f:
        json.dump(done, f)
    print("connection %d: %s" % (who, ", ".join(
        "%d %ss" % (n, k) for k, n in sorted(counts.items()))))


def effect(req, cs, size):
    """The sectors REQ sets, and to what: {sector: value}, None = zeros."""
    off, end = req["off"], req["off"] + req["len"]
    if req["kind"] == "write":
        return {off // SECTOR + k: (req["rid"], k)
                for k in range(req["len"] // SECTOR)}
    if req["kind"] == "zero":
        return {s: None for s in range(off // SECTOR, end // SECTOR)}
    if req["kind"] == "trim":
        # Whole clusters read as zeros afterwards; parts stay as they are.
        out = {}
        c = (off + cs - 1) // cs * cs
        while c < end:
            cend = min(c + cs, size)
            if cend <= end:
                out.update({s: None for s in range(c // SECTOR, cend // SECTOR)})
            c += cs
        return out
    return {}


def has_cycle(nodes, edges):
    color = {n: 0 for n in nodes}
    for root in nodes:
        if color[root]:
            continue
        stack = [(root, iter(edges.get(root, ())))]
        color[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                color[node] = 2
                stack.pop()
            elif color[nxt] == 1:
                return True
            elif color[nxt] == 0:
                color[nxt] = 1
                stack.append((nxt, iter(edges.get(nxt, ()))))
    return False


def check(final_path, initial_path, cs, logs):
    data = open(final_path, "rb").read()
    before = open(initial_path, "rb").read()
    size = len(data)
    if len(before) != size:
        raise SystemExit("the disks differ in size")
    reqs = []
    for log in logs:
        reqs += json.load(open(log))
    reqs = [r for r in reqs if r["kind"] != "flush"]
    # The initial content: a request before every other.
    initial = {"rid": 0, "kind": "initial", "start": -1, "end": -1,
               "effect": {s: parse(before[s * SECTOR:(s + 1) * SECTOR], s)
                          for s in range(size // SECTOR)}}
    for r in reqs:
        r["effect"] = effect(r, cs, size)
    reqs.append(initial)
    by_rid = {r["rid"]: r for r in reqs}
    cover = {}
    for r in reqs:
        for s, v in r["effect"].items():
            cover.setdefault(s, []).append((r, v))

    # Rule 1, sector by sector.
    bad = 0
    final = {}
    for s in range(size // SECTOR):
        got = parse(data[s * SECTOR:(s + 1) * SECTOR], s)
        final[s] = got
        if got is None:
            cands = [r for r, v in cover[s] if v is None]
        else:
            r = by_rid.get(got[0])
            cands = [r] if r is not None and r["effect"].get(s) == got else []
        ok = any(all(not (o["start"] > c["end"] and v != got)
                     for o, v in cover[s]) for c in cands)
        if not ok:
            bad += 1
            if bad <= 10:
                print("sector %d holds %s: %s" % (
                    s, "zeros" if got is None else "the tag of request %d"
                    % got[0], "no request covering it left that" if not cands
                    else "a request with other data for it was sent after "
                    "that one had returned"))

    # Rule 2, cluster by cluster.
    clusters = {}
    for r in reqs:
        for s in r["effect"]:
            clusters.setdefault(s * SECTOR // cs, set()).add(r["rid"])
    cycles = 0
    for c, rids in sorted(clusters.items()):
        nodes = sorted(rids)
        edges = {n: set() for n in nodes}
        for s in range(c * cs // SECTOR, min((c + 1) * cs, size) // SECTOR):
            if final[s] is None:
                continue
            for o, v in cover[s]:
                if o["rid"] != final[s][0]:
                    edges[o["rid"]].add(final[s][0])
        for a in nodes:
            for b in nodes:
                if by_rid[b]["start"] > by_rid[a]["end"]:
                    edges[a].add(b)
        if has_cycle(nodes, edges):
            cycles += 1
            if cycles <= 5:
                print("cluster %d: no single order of its %d requests "
                      "explains its content" % (c, len(nodes) - 1))
    tagged = sum(1 for v in final.values() if v is not None and v[0] != 0)
    print("%d requests over %d clusters: %d sectors end with a request's "
          "tag, %d with zeros; %d sectors wrong, %d clusters without an "
          "order" % (len(reqs) - 1, len(clusters), tagged,
                     sum(1 for v in final.values() if v is None), bad, cycles))
    return 1 if bad or cycles else 0


def initial(raw, cs, size):
    out = bytearray()
    for s in range(size // SECTOR):
        out += tag(0, s, s) if (s * SECTOR // cs) % 3 != 2 else bytes(SECTOR)
    with open(raw, "wb") as f:
        f.write(out)


if __name__ == "__main__":
    if sys.argv[1] == "initial":
        initial(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif sys.argv[1] == "run":
        uri, log, seed, who, nops, cs, region = sys.argv[2:9]
        run(uri, log, int(seed), int(who), int(nops), int(cs), int(region))
    else:
        sys.exit(check(sys.argv[2], sys.argv[3], int(sys.argv[4]),
                       sys.argv[5:]))
