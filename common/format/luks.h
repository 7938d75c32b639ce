/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: the LUKS1 header of an encrypted qcow2 image.
 *
 * An image with crypt_method 2 keeps a LUKS1 header and its key material
 * in its own clusters; the full disk encryption header extension (type
 * 0x0537be77) gives their host offset and length.  The caller reads those
 * bytes (the "area": the 592-byte LUKS header at offset 0, then the key
 * slots' material at the sector offsets the header gives, relative to the
 * area) and hands them here:
 *
 *   qcow2_luks_parse ()   checks the header against the area, with errors
 *                         that name the field or key slot;
 *   qcow2_luks_unlock ()  derives the master key from a passphrase: PBKDF2
 *                         with the slot's salt and iterations, decrypt the
 *                         slot's material, AF-merge it, check the master
 *                         key digest.  This costs what qemu-img's iter-time
 *                         made it cost (2 s by default): do it once per
 *                         image, never per connection;
 *   qcow2_luks_create ()  makes the area for a new image: a random master
 *                         key, key slot 0 for the passphrase, PBKDF2 tuned
 *                         to a time as qemu's iter-time does.
 *
 * The master key and the header's cipher spec then make the per-thread
 * sector ciphers of format/crypto.h.  The IV of a data sector comes from
 * its HOST offset (qcow2.txt: "the physical disk sector as the input
 * tweak"), not its guest offset, and the LUKS payload offset plays no
 * part.  Nothing here does I/O or calls nbdkit; the area is never
 * written to.
 */
#ifndef QCOW2_LUKS_H
#define QCOW2_LUKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/crypto.h"

#define QCOW2_LUKS_HEADER_BYTES 592
#define QCOW2_LUKS_SLOTS 8
#define QCOW2_LUKS_DIGEST_BYTES 20
#define QCOW2_LUKS_SALT_BYTES 32
#define QCOW2_LUKS_STRIPES 4000             /* what qemu and cryptsetup use */
#define QCOW2_LUKS_DEFAULT_ITER_TIME_MS 2000 /* qemu's iter-time default */

/* Returned by qcow2_luks_unlock when no active key slot takes the
 * passphrase: distinct from -1 (a broken header or a library failure).
 */
#define QCOW2_LUKS_WRONG_PASSPHRASE (-2)

struct qcow2_luks_slot {
  bool active;
  uint32_t iterations;
  uint8_t salt[QCOW2_LUKS_SALT_BYTES];
  uint32_t key_offset;              /* in 512-byte sectors, in the area */
  uint32_t stripes;
};

struct qcow2_luks_header {
  char cipher_name[33];             /* "aes" */
  char cipher_mode[33];             /* "xts-plain64" */
  char hash_spec[33];               /* "sha256" */
  char uuid[41];
  uint32_t payload_offset;          /* sectors; unused inside qcow2 */
  uint32_t key_bytes;               /* master key length */
  uint8_t mk_digest[QCOW2_LUKS_DIGEST_BYTES];
  uint8_t mk_salt[QCOW2_LUKS_SALT_BYTES];
  uint32_t mk_iterations;
  struct qcow2_luks_slot slots[QCOW2_LUKS_SLOTS];

  /* Derived. */
  struct qcow2_cipher_spec spec;    /* of the data and of the key slots */
  enum qcow2_hash hash;             /* PBKDF2 and AF splitter */
  unsigned active_slots;
};

/* Parse and check the LUKS1 header at the start of AREA (AREA_LEN bytes:
 * the length the qcow2 extension gives).  Refuses, naming the field or the
 * key slot: a bad magic, a LUKS version other than 1, strings without a
 * terminating NUL, a cipher, mode, IV generator or hash it cannot use
 * (naming the cipher, as "serpent-256-xts-plain64"), zero iterations, a
 * key slot in neither state, with no stripes, overlapping the header,
 * another slot or the payload (qemu's checks), or an active slot whose
 * material runs past AREA_LEN.  Returns 0, or -1 with a sentence in
 * ERRBUF.  Reads only AREA, allocates nothing.
 */
int qcow2_luks_parse (const uint8_t *area, size_t area_len,
                      struct qcow2_luks_header *h,
                      char *errbuf, size_t errlen);

/* Try PASS (PASS_LEN bytes, no terminator needed) on every active key
 * slot in turn, as qemu does.  On success writes H->key_bytes bytes of
 * master key into MASTER_KEY (room for QCOW2_CRYPTO_MAX_KEY_BYTES; wipe it
 * with qcow2_wipe when done), the slot number into *SLOT if SLOT is not
 * NULL, and returns 0.  Returns QCOW2_LUKS_WRONG_PASSPHRASE with a sentence
 * saying that the passphrase is wrong if no slot takes it, or -1 with a
 * message for anything else (no active slot at all, out of memory, a
 * library failure).  H must come from qcow2_luks_parse of this AREA.
 */
int qcow2_luks_unlock (const struct qcow2_luks_header *h,
                       const uint8_t *area, size_t area_len,
                       const char *pass, size_t pass_len,
                       uint8_t *master_key, int *slot,
                       char *errbuf, size_t errlen);

/* What a new LUKS area looks like.  Zero fields take qemu's defaults. */
struct qcow2_luks_create_params {
  /* Cipher spec as from qcow2_cipher_spec_parse; spec_set false means
   * aes-256-xts-plain64.
   */
  bool spec_set;
  struct qcow2_cipher_spec spec;
  bool hash_set;                    /* false: sha256 */
  enum qcow2_hash hash;
  uint32_t iter_time_ms;            /* 0: 2000, as qemu's iter-time */
  /* Fixed iteration counts instead of tuning them to iter_time_ms (at
   * least 1; for tests and benchmarks).
   */
  uint32_t slot_iterations;
  uint32_t mk_iterations;
  uint32_t stripes;                 /* 0: 4000 */
};

/* Make the area of a new LUKS image: the header with key slot 0 holding
 * the master key under PASS, slots 1-7 inactive, the layout qemu-img
 * writes (key material at sector 8, each slot's material rounded to 4 KiB,
 * payload offset after the eighth slot).  The iterations are tuned like
 * qemu's: slot 0 takes ITER_TIME_MS of this thread's CPU, the master key
 * digest an eighth of that, each at least 1000.  This takes 1.125 times
 * ITER_TIME_MS to run PBKDF2, plus twice the smaller of ITER_TIME_MS and
 * 250 ms to measure its rate.
 *
 * On success returns 0, sets *AREA to a malloc'd buffer of *AREA_LEN
 * bytes to place at a cluster-aligned host offset (the extension's length
 * is *AREA_LEN; the clusters' tail stays zero), and copies the master key
 * (KEY_BYTES of the spec) into MASTER_KEY.  Refuses a spec whose key
 * material is not a whole number of sectors (24-byte keys outside XTS),
 * which qemu cannot open.  Returns -1 with a message otherwise.
 */
int qcow2_luks_create (const struct qcow2_luks_create_params *params,
                       const char *pass, size_t pass_len,
                       uint8_t **area, size_t *area_len,
                       uint8_t *master_key, char *errbuf, size_t errlen);

/* The refusal for a crypt_method this engine does not serve: 1 (qcow2's
 * legacy AES-CBC, with what it is and how to convert it) or an unknown
 * value.  Writes the sentence into BUF.
 */
void qcow2_crypt_method_refusal (uint32_t crypt_method,
                                 char *buf, size_t len);

#endif /* QCOW2_LUKS_H */
