/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd glue: nbdkit's command line, as nbdkit read it.
 *
 * nbdkit 1.32 tells a plugin whether it is read-only only in .open (and
 * a filter in .open and .prepare), that is when a client connects: too
 * late to refuse qcow2-create or qcow2-force-share with a message on
 * nbdkit's stderr.  Nor does it tell a filter what is under it.  There
 * is no public call for either, and nbdkit's own variables are not
 * exported.  What can be known at start-up is nbdkit's command line, in
 * /proc/self/cmdline, so it is read here the way nbdkit's getopt_long
 * reads it: with GNU argument permutation (an option may follow the
 * plugin's name), short options grouped, long options abbreviated, and
 * the options that take a value skipping it.  The plugin is the first
 * word that is not an option.  The tables are nbdkit 1.32's (nbdkit
 * --short-options, --long-options, server/options.h).
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmdline.h"

/* nbdkit 1.32's short options that take a value ("D:e:g:i:p:P:t:u:U:"). */
static const char short_with_value[] = "DegipPtuU";

/* KIND: 'v' takes a value, 'f' is --filter (which does), 'r' is -r,
 * 'd' is --dump-plugin, '-' none of these.
 */
struct long_option {
  const char *name;
  char kind;
};

static const struct long_option long_options[] = {
  { "debug", 'v' }, { "dump-config", '-' }, { "dump-plugin", 'd' },
  { "exit-with-parent", '-' }, { "export", 'v' }, { "export-name", 'v' },
  { "exportname", 'v' }, { "filter", 'f' }, { "foreground", '-' },
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

/* The name nbdkit knows a plugin or filter by: a short name is one
 * already (nbdkit takes a name with a '/' or a '.' as a path); of a path
 * .../nbdkit-NAME-plugin.so or .../nbdkit-NAME-filter.so, NAME.
 */
static char *
short_name (const char *arg)
{
  const char *base = strrchr (arg, '/');
  size_t len;

  base = base ? base + 1 : arg;
  if (strncmp (base, "nbdkit-", 7) == 0)
    base += 7;
  len = strlen (base);
  if (len > 10 && (strcmp (base + len - 10, "-plugin.so") == 0 ||
                   strcmp (base + len - 10, "-filter.so") == 0))
    len -= 10;
  else if (len > 3 && strcmp (base + len - 3, ".so") == 0)
    len -= 3;
  return strndup (base, len);
}

/* The NUL-separated words of /proc/self/cmdline, NUL-terminated once
 * more; *LEN their length.  NULL if it cannot be read.
 */
static char *
read_words (size_t *lenp)
{
  FILE *fp = fopen ("/proc/self/cmdline", "r");
  char *args = NULL;
  size_t cap = 0, len = 0, n;

  if (fp == NULL)
    return NULL;
  do {
    char *p;
    if (len + 4096 + 1 > cap) {
      cap = cap ? 2 * cap : 8192;
      p = realloc (args, cap);
      if (p == NULL) {
        free (args);
        fclose (fp);
        return NULL;
      }
      args = p;
    }
    n = fread (args + len, 1, cap - len - 1, fp);
    len += n;
  } while (n > 0);
  fclose (fp);
  if (args)
    args[len] = '\0';
  *lenp = len;
  return args;
}

static int
add_filter (struct nbdkit_cmdline *cl, const char *value)
{
  char **more = realloc (cl->filters, (cl->nr_filters + 1) * sizeof *more);

  if (more == NULL)
    return -1;
  cl->filters = more;
  if ((cl->filters[cl->nr_filters] = short_name (value)) == NULL)
    return -1;
  cl->nr_filters++;
  return 0;
}

int
cmdline_read (struct nbdkit_cmdline *cl)
{
  size_t len, i;
  char *args = read_words (&len);
  bool first = true, options_end = false;
  bool permute = getenv ("POSIXLY_CORRECT") == NULL;
  char value_of = 0;            /* the next word is the value of: */

  memset (cl, 0, sizeof *cl);
  cl->readonly = -1;
  if (args == NULL)
    return -1;
  cl->readonly = 0;
  for (i = 0; i < len; i += strlen (args + i) + 1) {
    const char *arg = args + i;

    if (first) {                /* argv[0] */
      first = false;
      continue;
    }
    if (value_of) {
      if (value_of == 'f' && add_filter (cl, arg) == -1)
        goto fail;
      value_of = 0;
      continue;
    }
    if (!options_end && strcmp (arg, "--") == 0) {
      options_end = true;
      continue;
    }
    if (options_end || arg[0] != '-' || arg[1] == '\0') {
      /* The plugin, then its KEY=VALUE parameters. */
      if (cl->plugin == NULL && (cl->plugin = short_name (arg)) == NULL)
        goto fail;
      if (!permute)
        options_end = true;
      continue;
    }
    if (arg[1] == '-') {
      const char *eq = strchr (arg + 2, '=');
      size_t name_len = eq ? (size_t) (eq - (arg + 2)) : strlen (arg + 2);
      const struct long_option *o = find_long (arg + 2, name_len);
      if (o == NULL)
        continue;
      if (o->kind == 'r')
        cl->readonly = 1;
      else if (o->kind == 'd')
        cl->dump_plugin = true;
      else if (o->kind == 'f' && eq && add_filter (cl, eq + 1) == -1)
        goto fail;
      if ((o->kind == 'v' || o->kind == 'f') && eq == NULL)
        value_of = o->kind;
      continue;
    }
    for (const char *c = arg + 1; *c; ++c) {
      if (*c == 'r')
        cl->readonly = 1;
      if (strchr (short_with_value, *c)) {
        /* The rest of the word is the value, or else the next word. */
        if (c[1] == '\0')
          value_of = 'v';
        break;
      }
    }
  }
  free (args);
  return 0;

 fail:
  free (args);
  cmdline_free (cl);
  return -1;
}

void
cmdline_free (struct nbdkit_cmdline *cl)
{
  size_t i;

  for (i = 0; i < cl->nr_filters; i++)
    free (cl->filters[i]);
  free (cl->filters);
  free (cl->plugin);
  memset (cl, 0, sizeof *cl);
  cl->readonly = -1;
}

int
cmdline_under (const struct nbdkit_cmdline *cl, const char *filter,
               size_t *first_between, size_t *nr_between)
{
  size_t i, found = 0, at = 0;

  if (cl->plugin == NULL)
    return -1;
  for (i = 0; i < cl->nr_filters; i++)
    if (strcmp (cl->filters[i], filter) == 0) {
      found++;
      at = i;
    }
  if (found != 1)
    return -1;
  *first_between = at + 1;
  *nr_between = cl->nr_filters - (at + 1);
  return 0;
}
