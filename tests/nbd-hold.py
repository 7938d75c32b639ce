#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# A client that holds an NBD connection open: it connects, optionally
# writes a pattern and flushes, creates READY, and stays connected until
# STOP exists (or it is killed).  A connection the server refuses exits 1
# with libnbd's error on stderr, and READY never appears.
#
#   nbd-hold.py URI READY STOP [OFFSET LENGTH BYTE]

import os
import sys
import time

import nbd

uri, ready, stop = sys.argv[1:4]
h = nbd.NBD()
try:
    h.connect_uri(uri)
    if len(sys.argv) > 4:
        offset, length, byte = (int(a, 0) for a in sys.argv[4:7])
        h.pwrite(bytes([byte]) * length, offset)
        h.flush()
except nbd.Error as e:
    sys.exit(f"nbd-hold: {e}")
open(ready, "w").close()
while not os.path.exists(stop):
    time.sleep(0.02)
h.shutdown()
