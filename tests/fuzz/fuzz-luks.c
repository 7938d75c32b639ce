/* SPDX-License-Identifier: BSD-3-Clause */
/* Fuzz target: a LUKS1 header and its key material (the area the qcow2
 * crypto extension points at), as arbitrary bytes.  What parses is then
 * unlocked with the passphrase "fuzz" (the seeds are made with it), so
 * the fuzzer reaches PBKDF2, the slot cipher, the AF merge and the digest
 * check; a master key that comes out is used on a sector run both ways.
 */
#include <config.h>

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/crypto.h"
#include "format/luks.h"

/* PBKDF2 costs what the header says, up to 2^32 iterations: cap it so
 * one input stays fast (the seeds use fewer, so they still unlock).
 */
#define MAX_ITERATIONS 4

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  struct qcow2_luks_header h;
  uint8_t mk[QCOW2_CRYPTO_MAX_KEY_BYTES];
  char err[256], name[80];
  int slot;

  if (qcow2_luks_parse (data, size, &h, err, sizeof err) != 0)
    return 0;
  qcow2_cipher_spec_describe (&h.spec, name, sizeof name);
  if (h.mk_iterations > MAX_ITERATIONS)
    h.mk_iterations = MAX_ITERATIONS;
  for (int i = 0; i < QCOW2_LUKS_SLOTS; ++i)
    if (h.slots[i].iterations > MAX_ITERATIONS)
      h.slots[i].iterations = MAX_ITERATIONS;

  if (qcow2_luks_unlock (&h, data, size, "fuzz", 4, mk, &slot,
                         err, sizeof err) != 0)
    return 0;

  struct qcow2_sector_cipher *c =
    qcow2_sector_cipher_new (&h.spec, mk, err, sizeof err);
  if (c) {
    uint8_t buf[1024], copy[1024];
    for (size_t i = 0; i < sizeof buf; ++i)
      buf[i] = i;
    memcpy (copy, buf, sizeof buf);
    if (qcow2_sectors_encrypt (c, 12345, buf, sizeof buf, err,
                               sizeof err) != 0 ||
        qcow2_sectors_decrypt (c, 12345, buf, sizeof buf, err,
                               sizeof err) != 0 ||
        memcmp (buf, copy, sizeof buf) != 0)
      abort ();
    qcow2_sector_cipher_free (c);
  }
  qcow2_wipe (mk, sizeof mk);
  return 0;
}
