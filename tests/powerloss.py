# SPDX-License-Identifier: BSD-3-Clause
# The power-loss harness, shared by its client (power-loss-workload.py)
# and its checker (power-loss-check.py).
#
# Guest data is written in 512-byte sectors whose content names the write
# that put it there and the sector: "W<id>S<sector><kind>" and then a fill
# that is text (kind C, compresses well) or bytes from a random pool
# (kind R, does not).  So any sector of a crash state says which write
# it came from, or that it is garbage; the checker never has to trust
# what the server under test reads back.
#
# The client (Shadow below) sends its requests in batches, at once, over
# several connections: a batch's writes, zeroes and trims have disjoint
# ranges (requests to the same bytes are always in different batches, so
# their order is known), some have FUA, and a flush is either sent while
# the batch's requests are in flight (it covers only those that had
# returned when it was sent) or after all of them returned.  Its shadow
# log, one JSON object a line, in the order the requests returned, says
# what it did:
#   {"op": "W", "id": N, "off": O, "len": L, "c": 0|1, "fua": 0|1, "pos": P}
#                                        a write returned
#   {"op": "Z", "off": O, "len": L, "fua": 0|1, "pos": P}
#                                        a zero (or a trim of whole
#                                        clusters) returned: reads zeros
#   {"op": "F", "covers": N, "pos": P}   a flush returned; it makes the
#                                        first N entries durable (those
#                                        that had returned when it was
#                                        sent)
# where P is the size of the storage's write log when the request had
# returned: every record of the request is in the log by then.

import functools
import json
import os
import random
import re
import select

SECTOR = 512
ZERO_SECTOR = bytes(SECTOR)
_POOL = random.Random(0x5EC7).randbytes(1 << 20)
_TEXT = b" the quick power loss test sector %d" * 20
_HEAD = re.compile(rb"W(\d{9})S(\d{11})([CR])")


@functools.lru_cache(maxsize=256)
def _text_fill(wid):
    return _TEXT % ((wid,) * 20)


def sector_data(wid, sector, compressible):
    head = b"W%09dS%011d%s" % (wid, sector, b"C" if compressible else b"R")
    if compressible:
        fill = _text_fill(wid)
    else:
        slot = (wid * 2654435761 + sector * 40503) % ((len(_POOL) - SECTOR) // 8)
        fill = _POOL[slot * 8:slot * 8 + SECTOR]
    return (head + fill)[:SECTOR]


def write_data(wid, offset, length, compressible):
    assert offset % SECTOR == 0 and length % SECTOR == 0
    first = offset // SECTOR
    return b"".join(sector_data(wid, s, compressible)
                    for s in range(first, first + length // SECTOR))


def identify(data, sector):
    """'Z' for zeros, the write id whose sector SECTOR this is, or None."""
    if data == ZERO_SECTOR:
        return "Z"
    m = _HEAD.match(data)
    if not m or int(m.group(2)) != sector:
        return None
    wid = int(m.group(1))
    if data != sector_data(wid, sector, m.group(3) == b"C"):
        return None
    return wid


class Shadow:
    """The client of a workload: requests gathered into batches and sent
    at once over CONNS connections to URI, each logged to the shadow as
    it returns (see the top of this file).  A batch closes when it has
    BATCH requests (a number drawn for each batch, from 1 up), when a
    request would overlap one of it, or when the workload ends.
    """

    def __init__(self, path, device_log, uri, seed, conns=3, batch=6):
        import nbd
        self.nbd = nbd
        self.f = open(path, "w")
        self.device_log = device_log
        self.rng = random.Random(seed * 7919 + 17)
        self.next_id = 1
        self.entries = 0
        self.handles = []
        for _ in range(conns):
            h = nbd.NBD()
            h.connect_uri(uri)
            self.handles.append(h)
        if conns > 1 and not self.handles[0].can_multi_conn():
            raise SystemExit("the server does not advertise multi-conn: a "
                             "flush would not cover the other connections")
        self.size = self.handles[0].get_size()
        self.max_batch = batch
        self.pending = []
        self.limit = self._draw_limit()
        self.failures = []
        self.batches = 0
        self.in_flight_flushes = 0

    def _draw_limit(self):
        return self.rng.randrange(1, self.max_batch + 1)

    # ------------------------------------------------ what workloads call
    def write(self, offset, length, compressible):
        wid = self.next_id
        self.next_id += 1
        self._add({"op": "W", "id": wid, "off": offset, "len": length,
                   "c": int(compressible)})
        return wid

    def zero(self, offset, length):
        self._add({"op": "Z", "how": "zero", "off": offset, "len": length})

    def trim(self, offset, length):
        """Only for whole clusters, which then read as zeros."""
        self._add({"op": "Z", "how": "trim", "off": offset, "len": length})

    def flush(self):
        """Sent with the batch's requests in flight (and the batch goes
        on after it), or after they all returned.
        """
        if self.pending and self.rng.random() < 0.6:
            self.pending.append({"op": "F"})
        else:
            self._run_batch()
            self.pending.append({"op": "F"})
            self._run_batch()

    def close(self):
        self._run_batch()
        self.pending.append({"op": "F"})
        self._run_batch()
        for h in self.handles:
            h.shutdown()
        self.f.close()
        return self.batches, self.in_flight_flushes

    # ------------------------------------------------ batches
    def _add(self, req):
        lo, hi = req["off"], req["off"] + req["len"]
        overlaps = any(r["op"] != "F" and r["off"] < hi and lo < r["off"] + r["len"]
                       for r in self.pending)
        if overlaps or self._requests() >= self.limit:
            self._run_batch()
        req["fua"] = int(self.rng.random() < 0.2)
        self.pending.append(req)

    def _requests(self):
        return sum(1 for r in self.pending if r["op"] != "F")

    def _log(self, **rec):
        rec["pos"] = os.stat(self.device_log).st_size
        print(json.dumps(rec), file=self.f, flush=True)
        self.entries += 1

    def _returned(self, req, err):
        if err.value != 0:
            self.failures.append(f"{req['op']} at {req.get('off')}: "
                                 f"{os.strerror(err.value)}")
        elif req["op"] == "W":
            self._log(op="W", id=req["id"], off=req["off"], len=req["len"],
                      c=req["c"], fua=req["fua"])
        elif req["op"] == "Z":
            self._log(op="Z", off=req["off"], len=req["len"], fua=req["fua"])
        else:
            self._log(op="F", covers=req["covers"])
        req["done"] = True
        return 1

    def _send(self, req):
        nbd = self.nbd
        h = self.rng.choice(self.handles)
        done = lambda err, req=req: self._returned(req, err)
        flags = nbd.CMD_FLAG_FUA if req.get("fua") else 0
        if req["op"] == "W":
            req["buf"] = write_data(req["id"], req["off"], req["len"], req["c"])
            h.aio_pwrite(req["buf"], req["off"], completion=done, flags=flags)
        elif req["op"] == "Z" and req["how"] == "zero":
            h.aio_zero(req["len"], req["off"], completion=done, flags=flags)
        elif req["op"] == "Z":
            h.aio_trim(req["len"], req["off"], completion=done, flags=flags)
        else:
            req["covers"] = self.entries
            h.aio_flush(completion=done)

    def _poll(self, timeout):
        """Let the connections make progress for up to TIMEOUT seconds."""
        nbd = self.nbd
        readers, writers = {}, {}
        for h in self.handles:
            if h.aio_in_flight() == 0:
                continue
            d = h.aio_get_direction()
            if d & nbd.AIO_DIRECTION_READ:
                readers[h.aio_get_fd()] = h
            if d & nbd.AIO_DIRECTION_WRITE:
                writers[h.aio_get_fd()] = h
        if not readers and not writers:
            return
        r, w, _ = select.select(list(readers), list(writers), [], timeout)
        for fd in r:
            readers[fd].aio_notify_read()
        for fd in w:
            writers[fd].aio_notify_write()

    def _run_batch(self):
        batch, self.pending = self.pending, []
        self.limit = self._draw_limit()
        if not batch:
            return
        self.batches += 1
        for i, req in enumerate(batch):
            if req["op"] == "F" and i > 0:
                # Give the requests before it a moment, so that some have
                # returned and some are still in flight when it is sent.
                self._poll(0.002)
                if any(not r.get("done") for r in batch[:i]):
                    self.in_flight_flushes += 1
            self._send(req)
        while not all(r.get("done") for r in batch):
            self._poll(1.0)
        if self.failures:
            raise SystemExit("requests failed: " + "; ".join(self.failures))


def read_shadow(path):
    return [json.loads(line) for line in open(path)]
