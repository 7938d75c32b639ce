/* SPDX-License-Identifier: BSD-3-Clause */
/* Writes a LUKS area for the fuzz-luks seed corpus: CIPHER MODE KEY_BYTES
 * HASH STRIPES OUT.  One iteration and few stripes keep it small and
 * quick to unlock with the passphrase "fuzz".  Built and run by
 * make-corpus.sh against the engine's sources.
 */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>

#include "format/luks.h"

int
main (int argc, char *argv[])
{
  struct qcow2_luks_create_params p = {
    .spec_set = true, .hash_set = true,
    .slot_iterations = 1, .mk_iterations = 1,
  };
  uint8_t *area, mk[QCOW2_CRYPTO_MAX_KEY_BYTES];
  size_t len;
  char err[256];
  FILE *fp;

  if (argc != 7) {
    fprintf (stderr, "usage: make-luks-seed CIPHER MODE KEY_BYTES HASH "
             "STRIPES OUT\n");
    return 2;
  }
  p.stripes = atoi (argv[5]);
  if (qcow2_cipher_spec_parse (argv[1], argv[2], atoi (argv[3]), &p.spec,
                               err, sizeof err) != 0 ||
      qcow2_hash_parse (argv[4], &p.hash) != 0 ||
      qcow2_luks_create (&p, "fuzz", 4, &area, &len, mk,
                         err, sizeof err) != 0) {
    fprintf (stderr, "make-luks-seed: %s\n", err);
    return 1;
  }
  fp = fopen (argv[6], "wb");
  if (fp == NULL || fwrite (area, 1, len, fp) != len || fclose (fp) != 0) {
    perror (argv[6]);
    return 1;
  }
  return 0;
}
