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
# The client's shadow log, one JSON object a line, says what it did:
#   {"op": "W", "id": N, "off": O, "len": L, "c": 0|1}   a write returned
#   {"op": "Z", "off": O, "len": L}      a zero (or a trim of whole
#                                        clusters) returned: reads zeros
#   {"op": "F", "pos": P}                a flush returned, when the
#                                        storage's write log was P bytes

import functools
import json
import random
import re

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
    """The client's record of its operations, written as they return."""

    def __init__(self, path, device_log):
        self.f = open(path, "w")
        self.device_log = device_log
        self.next_id = 1

    def write(self, h, offset, length, compressible):
        wid = self.next_id
        self.next_id += 1
        h.pwrite(write_data(wid, offset, length, compressible), offset)
        self._log(op="W", id=wid, off=offset, len=length, c=int(compressible))
        return wid

    def zero(self, h, offset, length):
        h.zero(length, offset)
        self._log(op="Z", off=offset, len=length)

    def trim(self, h, offset, length):
        """Only for whole clusters, which then read as zeros."""
        h.trim(length, offset)
        self._log(op="Z", off=offset, len=length)

    def flush(self, h):
        import os
        h.flush()
        # Every record of this flush is in the log by now.
        self._log(op="F", pos=os.stat(self.device_log).st_size)

    def _log(self, **rec):
        print(json.dumps(rec), file=self.f, flush=True)


def read_shadow(path):
    return [json.loads(line) for line in open(path)]
