/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd glue: was nbdkit started with -r?
 *
 * nbdkit 1.32 tells a plugin whether it is read-only only in .open (and
 * a filter in .open and .prepare), that is when a client connects: too
 * late to refuse qcow2-create or qcow2-force-share with a message on
 * nbdkit's stderr.  There is no public call for it, and nbdkit's own
 * read_only variable is not exported.  What can be known at start-up is
 * nbdkit's command line, in /proc/self/cmdline, so it is read here the
 * way nbdkit's getopt_long reads it: with GNU argument permutation (an
 * option may follow the plugin's name), short options grouped, long
 * options abbreviated, and the options that take a value skipping it.
 * The tables are nbdkit 1.32's (nbdkit --short-options, --long-options,
 * server/options.h).
 */

#include <config.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmdline.h"

/* nbdkit 1.32's short options that take a value ("D:e:g:i:p:P:t:u:U:"). */
static const char short_with_value[] = "DegipPtuU";

/* KIND: 'v' takes a value, 'r' is -r, '-' neither. */
struct long_option {
  const char *name;
  char kind;
};

static const struct long_option long_options[] = {
  { "debug", 'v' }, { "dump-config", '-' }, { "dump-plugin", '-' },
  { "exit-with-parent", '-' }, { "export", 'v' }, { "export-name", 'v' },
  { "exportname", 'v' }, { "filter", 'v' }, { "foreground", '-' },
  { "no-fork", '-' }, { "group", 'v' }, { "help", '-' },
  { "ip-addr", 'v' }, { "ipaddr", 'v' }, { "ipv4-only", '-' },
  { "ipv6-only", '-' }, { "log", 'v' }, { "long-options", '-' },
  { "mask-handshake", 'v' }, { "new-style", '-' }, { "newstyle", '-' },
  { "no-sr", '-' }, { "old-style", '-' }, { "oldstyle", '-' },
  { "pid-file", 'v' }, { "pidfile", 'v' }, { "port", 'v' },
  { "read-only", 'r' }, { "readonly", 'r' }, { "run", 'v' },
  { "selinux-label", 'v' }, { "short-options", '-' }, { "single", '-' },
  { "stdin", '-' }, { "swap", '-' }, { "threads", 'v' }, { "tls", 'v' },
  { "tls-certificates", 'v' }, { "tls-psk", 'v' },
  { "tls-verify-peer", '-' }, { "unix", 'v' }, { "user", 'v' },
  { "verbose", '-' }, { "version", '-' }, { "vsock", '-' },
};

/* The option "--NAME" (LEN bytes of it) stands for: the exact name, or
 * else the one option it abbreviates (getopt_long accepts a prefix that
 * several options share when they all mean the same).
 */
static const struct long_option *
find_long (const char *name, size_t len)
{
  const struct long_option *found = NULL;
  size_t i;

  for (i = 0; i < sizeof long_options / sizeof long_options[0]; ++i) {
    const struct long_option *o = &long_options[i];
    if (strncmp (o->name, name, len) != 0)
      continue;
    if (o->name[len] == '\0')
      return o;
    if (found == NULL)
      found = o;
    else if (found->kind != o->kind)
      return NULL;             /* ambiguous: nbdkit refuses it anyway */
  }
  return found;
}

int
cmdline_readonly (void)
{
  FILE *fp = fopen ("/proc/self/cmdline", "r");
  char *args = NULL;
  size_t cap = 0, len = 0, n, i;
  bool first = true, skip_value = false, readonly = false;
  bool permute = getenv ("POSIXLY_CORRECT") == NULL;

  if (fp == NULL)
    return -1;
  do {
    char *p;
    if (len + 4096 + 1 > cap) {
      cap = cap ? 2 * cap : 8192;
      p = realloc (args, cap);
      if (p == NULL) {
        free (args);
        fclose (fp);
        return -1;
      }
      args = p;
    }
    n = fread (args + len, 1, cap - len - 1, fp);
    len += n;
  } while (n > 0);
  fclose (fp);
  if (args == NULL)
    return -1;
  args[len] = '\0';

  for (i = 0; i < len; i += strlen (args + i) + 1) {
    const char *arg = args + i;

    if (first) {                /* argv[0] */
      first = false;
      continue;
    }
    if (skip_value) {
      skip_value = false;
      continue;
    }
    if (strcmp (arg, "--") == 0)
      break;
    if (arg[0] != '-' || arg[1] == '\0') {
      if (!permute)
        break;
      continue;                 /* the plugin, a KEY=VALUE: not options */
    }
    if (arg[1] == '-') {
      const char *eq = strchr (arg + 2, '=');
      size_t name_len = eq ? (size_t) (eq - (arg + 2)) : strlen (arg + 2);
      const struct long_option *o = find_long (arg + 2, name_len);
      if (o == NULL)
        continue;
      readonly |= o->kind == 'r';
      skip_value = o->kind == 'v' && eq == NULL;
      continue;
    }
    for (const char *c = arg + 1; *c; ++c) {
      if (*c == 'r')
        readonly = true;
      if (strchr (short_with_value, *c)) {
        /* The rest of the word is the value, or else the next word. */
        skip_value = c[1] == '\0';
        break;
      }
    }
  }
  free (args);
  return readonly;
}
