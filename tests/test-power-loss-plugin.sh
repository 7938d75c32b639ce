#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# test-power-loss.sh for the plugin form (tests/record-shim.c preloaded
# into nbdkit logs what the plugin does to its own file): a test of its
# own, so that make check runs the two forms at once.
POWER_LOSS_FORMS=plugin
source "${top_srcdir:-.}/tests/test-power-loss.sh"
