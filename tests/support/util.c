/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd unit tests: small helpers. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>

#include "util.h"

void *
xmalloc (size_t len)
{
  void *p = malloc (len ? len : 1);

  if (p == NULL) {
    perror ("malloc");
    exit (1);
  }
  return p;
}

void *
xcalloc (size_t n, size_t size)
{
  void *p = calloc (n ? n : 1, size);

  if (p == NULL) {
    perror ("calloc");
    exit (1);
  }
  return p;
}

void *
xgrow (void *array, size_t count, size_t *cap, size_t elem, size_t first)
{
  if (count < *cap)
    return array;
  *cap = *cap ? 2 * *cap : first;
  array = realloc (array, *cap * elem);
  if (array == NULL) {
    perror ("realloc");
    exit (1);
  }
  return array;
}

void
put32 (uint8_t *p, uint32_t v)
{
  for (int i = 3; i >= 0; --i, v >>= 8)
    p[i] = v & 0xff;
}

void
put64 (uint8_t *p, uint64_t v)
{
  for (int i = 7; i >= 0; --i, v >>= 8)
    p[i] = v & 0xff;
}

uint32_t
get32 (const uint8_t *p)
{
  uint32_t v = 0;

  for (int i = 0; i < 4; ++i)
    v = v << 8 | p[i];
  return v;
}

uint64_t
get64 (const uint8_t *p)
{
  uint64_t v = 0;

  for (int i = 0; i < 8; ++i)
    v = v << 8 | p[i];
  return v;
}

uint64_t
rng (uint64_t *state)
{
  *state ^= *state >> 12;
  *state ^= *state << 25;
  *state ^= *state >> 27;
  return *state * UINT64_C (0x2545f4914f6cdd1d);
}

void
fill_pattern (uint8_t *buf, uint64_t len, uint32_t seed)
{
  static const char hex[] = "0123456789abcdef";

  for (uint64_t i = 0; i < len; ++i) {
    uint64_t record = i / 16;
    unsigned col = i % 16;

    if (col < 6)
      buf[i] = hex[(seed >> (4 * (5 - col))) & 15];
    else if (col == 6)
      buf[i] = ':';
    else if (col < 14)
      buf[i] = hex[(record >> (4 * (13 - col))) & 15];
    else
      buf[i] = col == 14 ? ';' : '\n';
  }
}
