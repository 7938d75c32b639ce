/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: decoding one compressed cluster.
 *
 * A struct qcow2_decoder holds reusable decoder state (a ZSTD_DCtx, a
 * libdeflate decompressor, a zlib stream).  Create one per thread that
 * decodes, keep it for the thread's lifetime: decoding then allocates
 * nothing.  A decoder is not thread safe; different decoders are.
 */
#ifndef QCOW2_CODEC_H
#define QCOW2_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "format/header.h"

struct qcow2_decoder;

/* Returns NULL if memory runs out. */
struct qcow2_decoder *qcow2_decoder_new (void);
void qcow2_decoder_free (struct qcow2_decoder *dec);

/* Decode IN (IN_LEN bytes) into OUT, which must come out exactly OUT_LEN
 * bytes long (one cluster), as qemu requires.  IN may carry trailing bytes
 * after the end of the stream (the next compressed cluster, or zero fill).
 * Returns 0, or -1 with a sentence in ERRBUF saying what was wrong with the
 * data.  Never reads outside IN or writes outside OUT.
 */
int qcow2_decode_cluster (struct qcow2_decoder *dec,
                          enum qcow2_compression type,
                          const uint8_t *in, size_t in_len,
                          uint8_t *out, size_t out_len,
                          char *errbuf, size_t errlen);

/* Compression, the mirror of decoding: one reusable struct
 * qcow2_encoder per thread that compresses.
 */
struct qcow2_encoder;

struct qcow2_encoder *qcow2_encoder_new (void);
void qcow2_encoder_free (struct qcow2_encoder *enc);

/* Compress IN (IN_LEN bytes, one cluster) as qemu stores a compressed
 * cluster of TYPE: raw deflate with a 4 KiB window (qemu decodes with
 * windowBits -12), or one zstd frame.  LEVEL is the codec's own level.
 * Returns the compressed length, 0 if the result would not fit in
 * OUT_CAP bytes (store the cluster uncompressed), or -1 with a message
 * in ERRBUF.
 */
int64_t qcow2_encode_cluster (struct qcow2_encoder *enc,
                              enum qcow2_compression type, int level,
                              const uint8_t *in, size_t in_len,
                              uint8_t *out, size_t out_cap,
                              char *errbuf, size_t errlen);

/* The codecs are a table (format/codec.c): a compression type the table
 * does not hold is refused by every call below, never taken for
 * another.
 */

/* Default and accepted levels for TYPE (the default 0 and the range -1
 * for an unknown TYPE).
 */
int qcow2_compression_default_level (enum qcow2_compression type);
int qcow2_compression_level_range (enum qcow2_compression type,
                                   int *min, int *max);

/* The type named NAME ("zlib", "zstd"): 0, or -1 if there is none. */
int qcow2_compression_by_name (const char *name,
                               enum qcow2_compression *type);

/* "zlib,zstd": the names of the codecs built in, into BUF. */
void qcow2_codec_names (char *buf, size_t len);

/* Write "zlib=1.2.13 zstd=1.5.4 libdeflate=1.14" into BUF: the codecs
 * built in and the versions of the libraries in use.
 */
void qcow2_codec_versions (char *buf, size_t len);

/* Name of a compression type for messages, "zlib" or "zstd" ("unknown"
 * for a type the table does not hold).
 */
const char *qcow2_compression_name (enum qcow2_compression type);

#endif /* QCOW2_CODEC_H */
