/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd glue: what nbdkit's own command line says, for the checks at
 * start-up that nbdkit 1.32 gives no call for (cmdline.c says how).
 */
#ifndef QCOW2ZSTD_CMDLINE_H
#define QCOW2ZSTD_CMDLINE_H

#include <stdbool.h>
#include <stddef.h>

struct nbdkit_cmdline {
  /* 1 if nbdkit was started with -r (--readonly, --read-only), 0 if
   * not, -1 if its command line cannot be read (then nobody knows until
   * a client connects).
   */
  int readonly;
  bool dump_plugin;             /* --dump-plugin */
  /* The plugin and the filters, each by the short name nbdkit knows it
   * by ("file" for file and for .../nbdkit-file-plugin.so); the filters
   * in command line order, which is from the top of the stack down.
   * NULL and none when the command line cannot be read.
   */
  char *plugin;
  char **filters;
  size_t nr_filters;
};

/* Read nbdkit's command line into CL.  0, or -1 if it cannot be read
 * (CL then knows nothing, and readonly is -1).  Free with cmdline_free.
 */
int cmdline_read (struct nbdkit_cmdline *cl);
void cmdline_free (struct nbdkit_cmdline *cl);

/* What is under the filter FILTER (a short name) in CL's stack: its
 * plugin, and the filters between the two (*FIRST_BETWEEN is the index
 * in CL->filters of the first, *NR_BETWEEN how many).  0, or -1 when
 * that is not known: the command line was not read, or FILTER is not
 * in the stack exactly once.
 */
int cmdline_under (const struct nbdkit_cmdline *cl, const char *filter,
                   size_t *first_between, size_t *nr_between);

#endif /* QCOW2ZSTD_CMDLINE_H */
