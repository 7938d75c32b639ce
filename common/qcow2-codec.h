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

#include "qcow2-header.h"

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

/* Write "zlib=1.2.13 zstd=1.5.4 libdeflate=1.14" into BUF: the codecs
 * built in and the versions of the libraries in use.
 */
void qcow2_codec_versions (char *buf, size_t len);

/* Name of a compression type for messages, "zlib" or "zstd". */
const char *qcow2_compression_name (enum qcow2_compression type);

#endif /* QCOW2_CODEC_H */
