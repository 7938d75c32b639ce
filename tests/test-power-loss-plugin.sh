#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# test-power-loss.sh for the plugin form (tests/record-shim.c preloaded
# into nbdkit logs what the plugin does to its own file, and to the
# image's data file if it has one): a test of its own, so that make
# check runs the two forms at once.  Its sections are named
# test-power-loss-plugin:plugin-... in QCOW2ZSTD_SECTIONS.
POWER_LOSS_FORMS=plugin
source "${top_srcdir:-.}/tests/test-power-loss.sh"
