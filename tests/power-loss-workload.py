#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# The client side of the power-loss harness: one of a few workloads,
# written through libnbd to the server under test in batches of requests
# sent at once over three connections (some with FUA, flushes sent while
# requests are in flight), with every request logged to the shadow as it
# returns (see powerloss.py).
#
#   power-loss-workload.py WORKLOAD URI DEVICE_LOG SHADOW CLUSTER_SIZE SEED [SPAN]
#
# WORKLOAD:
#   random     writes of 512 bytes to three clusters anywhere, text and
#              random data, some zeroes, a flush every few operations
#   cow        writes of parts of clusters (into a compressed image: the
#              copy-on-write of compressed clusters)
#   compress   whole clusters and runs of them, text and random, some
#              overwritten, some parts of clusters (for qcow2-compress)
#   sequential SPAN bytes from the start, 64 KiB at a time (enough of
#              them grow the refcount table)
#   reuse      SPAN bytes written, trimmed and written elsewhere, twice
#              over (with SPAN near the room in the file: the freed
#              clusters must be reused)
#   discard    runs of clusters written (text and random), then trims
#              and zero requests of whole clusters and rewrites of parts
#              of clusters (of compressed ones: copy-on-write), which
#              release clusters to be discarded, three rounds; then the
#              whole disk trimmed (the plugin form cuts its file) and
#              written again
#   mixed      writes of 512 bytes to three clusters anywhere, zeroes of
#              such ranges and trims of whole clusters, a flush every few
#              operations (for an image with persistent bitmaps: each
#              operation marks them; with an external data file: data
#              written in place there, whole clusters zeroed or trimmed
#              given back, parts written with zeros)

import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from powerloss import SECTOR, Shadow  # noqa: E402

name, uri, device_log, shadow_path = sys.argv[1:5]
cluster, seed = int(sys.argv[5]), int(sys.argv[6])
span = int(sys.argv[7]) if len(sys.argv) > 7 else 0
rng = random.Random(seed)
sh = Shadow(shadow_path, device_log, uri, seed)
size = sh.size


def some_range(max_len):
    n = rng.randrange(1, max_len // SECTOR + 1) * SECTOR
    off = rng.randrange(0, (size - n) // SECTOR + 1) * SECTOR
    return off, n


if name == "random":
    for i in range(36):
        if rng.randrange(8) == 0:
            sh.zero(*some_range(3 * cluster))
        else:
            sh.write(*some_range(min(3 * cluster, 192 << 10)),
                     rng.randrange(2) == 0)
        if i % 4 == 3:
            sh.flush()
elif name == "cow":
    for i in range(30):
        c = rng.randrange(size // cluster)
        n = rng.randrange(1, cluster // SECTOR) * SECTOR
        start = rng.randrange(0, (cluster - n) // SECTOR + 1) * SECTOR
        sh.write(c * cluster + start, n, rng.randrange(2) == 0)
        if i % 3 == 2:
            sh.flush()
elif name == "compress":
    done = []
    for i in range(30):
        kind = rng.randrange(10)
        if kind < 6 or not done:
            n = rng.randrange(1, 9) * cluster
            off = rng.randrange(0, (size - n) // cluster + 1) * cluster
        elif kind < 8:
            off, n = rng.choice(done)           # overwrite compressed data
        else:
            off, n = some_range(cluster)        # part of a cluster
        sh.write(off, n, rng.randrange(10) < 7)
        done.append((off, n))
        if i % 3 == 2:
            sh.flush()
elif name == "sequential":
    chunk = 64 << 10
    for i, off in enumerate(range(0, span, chunk)):
        sh.write(off, chunk, rng.randrange(2) == 0)
        if i % 8 == 7:
            sh.flush()
elif name == "reuse":
    chunk = 64 << 10
    areas = [0, size // 2]
    for rnd in range(3):
        area = areas[rnd % 2]
        for i, off in enumerate(range(area, area + span, chunk)):
            sh.write(off, chunk, False)
            if i % 6 == 5:
                sh.flush()
        sh.flush()
        # Whole clusters: they read as zeros, and their clusters are free
        # once the metadata that dropped them is on disk.
        sh.trim(area, span)
        sh.flush()
elif name == "discard":
    clusters = size // cluster

    def some_clusters():
        n = rng.randrange(1, 5)
        return rng.randrange(0, clusters - n + 1) * cluster, n * cluster

    for rnd in range(3):
        for i in range(10):
            sh.write(*some_clusters(), rng.randrange(3) != 0)
            if i % 4 == 3:
                sh.flush()
        sh.flush()
        for i in range(9):
            off, n = some_clusters()
            kind = rng.randrange(3)
            if kind == 0:
                sh.trim(off, n)
            elif kind == 1:
                sh.zero(off, n)
            else:
                part = rng.randrange(1, cluster // SECTOR) * SECTOR
                sh.write(off + part, SECTOR, rng.randrange(2) == 0)
            if i % 3 == 2:
                sh.flush()
        sh.flush()
    sh.trim(0, clusters * cluster)
    sh.flush()
    for i in range(4):
        sh.write(*some_clusters(), True)
    sh.flush()
elif name == "mixed":
    clusters = size // cluster
    for i in range(40):
        kind = rng.randrange(6)
        if kind == 0:
            sh.zero(*some_range(3 * cluster))
        elif kind == 1:
            n = rng.randrange(1, 4)
            sh.trim(rng.randrange(0, clusters - n + 1) * cluster, n * cluster)
        else:
            sh.write(*some_range(3 * cluster), rng.randrange(2) == 0)
        if i % 5 == 4:
            sh.flush()
else:
    sys.exit(f"unknown workload {name}")
batches, in_flight_flushes = sh.close()
print(f"{name}: {sh.entries} requests returned in {batches} batches over "
      f"{len(sh.handles)} connections, {in_flight_flushes} flushes sent "
      "with requests in flight")
