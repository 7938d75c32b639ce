/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2zstd engine: decoders and encoders for zlib-type and zstd-type
 * clusters.
 */

#include <config.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>
#define ZSTD_STATIC_LINKING_ONLY   /* ZSTD_getCParams */
#include <zstd.h>
#include <zstd_errors.h>
#ifdef HAVE_LIBDEFLATE
#include <libdeflate.h>
#endif

#include "format/codec.h"

struct qcow2_decoder {
  ZSTD_DCtx *zstd;
  z_stream zlib;
  bool zlib_ready;
#ifdef HAVE_LIBDEFLATE
  struct libdeflate_decompressor *deflate;
#endif
};

struct qcow2_decoder *
qcow2_decoder_new (void)
{
  struct qcow2_decoder *dec = calloc (1, sizeof *dec);

  if (dec == NULL)
    return NULL;
  dec->zstd = ZSTD_createDCtx ();
  if (dec->zstd == NULL)
    goto fail;
#ifdef HAVE_LIBDEFLATE
  dec->deflate = libdeflate_alloc_decompressor ();
  if (dec->deflate == NULL)
    goto fail;
#endif
  /* qemu writes and reads raw deflate with a 4 KiB window (-12).  Using
   * the same window makes us refuse exactly the streams qemu refuses.
   */
  if (inflateInit2 (&dec->zlib, -12) != Z_OK)
    goto fail;
  dec->zlib_ready = true;
  return dec;

 fail:
  qcow2_decoder_free (dec);
  return NULL;
}

void
qcow2_decoder_free (struct qcow2_decoder *dec)
{
  if (dec == NULL)
    return;
  ZSTD_freeDCtx (dec->zstd);
#ifdef HAVE_LIBDEFLATE
  if (dec->deflate)
    libdeflate_free_decompressor (dec->deflate);
#endif
  if (dec->zlib_ready)
    inflateEnd (&dec->zlib);
  free (dec);
}

/* qemu's rule: inflate with Z_FINISH must fill the cluster exactly; the
 * stream may end there or go on (the descriptor's sector count is coarse,
 * so the input can hold more than the stream).
 */
static int
decode_zlib (struct qcow2_decoder *dec, const uint8_t *in, size_t in_len,
             uint8_t *out, size_t out_len, char *errbuf, size_t errlen)
{
  z_stream *zs = &dec->zlib;
  int r;

  if (inflateReset (zs) != Z_OK) {
    snprintf (errbuf, errlen, "zlib: cannot reset the inflate stream");
    return -1;
  }
  zs->next_in = (Bytef *) in;
  zs->avail_in = in_len;
  zs->next_out = out;
  zs->avail_out = out_len;
  r = inflate (zs, Z_FINISH);
  if ((r == Z_STREAM_END || r == Z_BUF_ERROR) && zs->avail_out == 0)
    return 0;
  if (r == Z_STREAM_END || r == Z_BUF_ERROR)
    snprintf (errbuf, errlen,
              "zlib: compressed data yields %zu bytes, not a whole cluster "
              "of %zu", out_len - zs->avail_out, out_len);
  else
    snprintf (errbuf, errlen, "zlib: corrupt compressed data (%s)",
              zs->msg ? zs->msg : zError (r));
  return -1;
}

static int
decode_deflate (struct qcow2_decoder *dec, const uint8_t *in, size_t in_len,
                uint8_t *out, size_t out_len, char *errbuf, size_t errlen)
{
#ifdef HAVE_LIBDEFLATE
  size_t in_used, out_made;
  enum libdeflate_result r;

  /* libdeflate decodes a whole terminated stream in one call, about twice
   * as fast as zlib.  It stops at the final block, so trailing bytes are
   * fine.  Anything it does not like (an unterminated stream that fills
   * the cluster, which qemu accepts) goes to zlib for qemu's exact rule.
   */
  r = libdeflate_deflate_decompress_ex (dec->deflate, in, in_len,
                                        out, out_len, &in_used, &out_made);
  if (r == LIBDEFLATE_SUCCESS && out_made == out_len)
    return 0;
#endif
  return decode_zlib (dec, in, in_len, out, out_len, errbuf, errlen);
}

/* qemu's rule for zstd: decode frame after frame until the cluster is
 * full; the last frame must end exactly there.
 */
static int
decode_zstd_stream (struct qcow2_decoder *dec,
                    const uint8_t *in, size_t in_len,
                    uint8_t *out, size_t out_len, char *errbuf, size_t errlen)
{
  ZSTD_inBuffer input = { .src = in, .size = in_len, .pos = 0 };
  ZSTD_outBuffer output = { .dst = out, .size = out_len, .pos = 0 };
  size_t r = 0;

  ZSTD_DCtx_reset (dec->zstd, ZSTD_reset_session_only);
  while (output.pos < output.size) {
    size_t in_before = input.pos, out_before = output.pos;

    r = ZSTD_decompressStream (dec->zstd, &output, &input);
    if (ZSTD_isError (r)) {
      snprintf (errbuf, errlen, "zstd: corrupt compressed data (%s)",
                ZSTD_getErrorName (r));
      return -1;
    }
    if (input.pos <= in_before && output.pos <= out_before) {
      snprintf (errbuf, errlen,
                "zstd: compressed data yields %zu bytes, not a whole "
                "cluster of %zu", output.pos, out_len);
      return -1;
    }
  }
  if (r != 0) {
    snprintf (errbuf, errlen,
              "zstd: compressed data yields more than a cluster of %zu bytes",
              out_len);
    return -1;
  }
  return 0;
}

static int
decode_zstd (struct qcow2_decoder *dec, const uint8_t *in, size_t in_len,
             uint8_t *out, size_t out_len, char *errbuf, size_t errlen)
{
  size_t frame_len, r;

  /* The common case, one frame holding the whole cluster: decode it in
   * one call straight into OUT.  The range usually has trailing bytes,
   * so the frame must be measured first.
   */
  frame_len = ZSTD_findFrameCompressedSize (in, in_len);
  if (!ZSTD_isError (frame_len)) {
    r = ZSTD_decompressDCtx (dec->zstd, out, out_len, in, frame_len);
    if (!ZSTD_isError (r) && r == out_len)
      return 0;
  }
  return decode_zstd_stream (dec, in, in_len, out, out_len, errbuf, errlen);
}

struct qcow2_encoder {
  ZSTD_CCtx *zstd;
  int zstd_level;               /* what zstd is set up for, 0 if nothing */
  size_t zstd_in_len;
  z_stream zlib;
  bool zlib_ready;
  int zlib_level;
};

struct qcow2_encoder *
qcow2_encoder_new (void)
{
  struct qcow2_encoder *enc = calloc (1, sizeof *enc);

  if (enc == NULL)
    return NULL;
  enc->zstd = ZSTD_createCCtx ();
  if (enc->zstd == NULL) {
    free (enc);
    return NULL;
  }
  return enc;
}

void
qcow2_encoder_free (struct qcow2_encoder *enc)
{
  if (enc == NULL)
    return;
  ZSTD_freeCCtx (enc->zstd);
  if (enc->zlib_ready)
    deflateEnd (&enc->zlib);
  free (enc);
}

static int64_t
encode_zlib (struct qcow2_encoder *enc, int level,
             const uint8_t *in, size_t in_len, uint8_t *out, size_t out_cap,
             char *errbuf, size_t errlen)
{
  z_stream *zs = &enc->zlib;
  int r;

  if (enc->zlib_ready && enc->zlib_level != level) {
    deflateEnd (zs);
    enc->zlib_ready = false;
  }
  if (!enc->zlib_ready) {
    memset (zs, 0, sizeof *zs);
    /* A 4 KiB window (-12): qemu inflates with windowBits -12, so a
     * longer match distance would make the cluster unreadable to it.
     */
    if (deflateInit2 (zs, level, Z_DEFLATED, -12, 9,
                      Z_DEFAULT_STRATEGY) != Z_OK) {
      snprintf (errbuf, errlen, "zlib: cannot set up the compressor");
      return -1;
    }
    enc->zlib_ready = true;
    enc->zlib_level = level;
  }
  else if (deflateReset (zs) != Z_OK) {
    snprintf (errbuf, errlen, "zlib: cannot reset the compressor");
    return -1;
  }
  zs->next_in = (Bytef *) in;
  zs->avail_in = in_len;
  zs->next_out = out;
  zs->avail_out = out_cap;
  r = deflate (zs, Z_FINISH);
  if (r == Z_STREAM_END)
    return out_cap - zs->avail_out;
  if (r == Z_OK || r == Z_BUF_ERROR)
    return 0;                   /* ran out of room: does not shrink */
  snprintf (errbuf, errlen, "zlib: compression failed (%d)", r);
  return -1;
}

/* Hash tables for cluster-sized inputs.  zstd's rows for small inputs
 * give levels 3 and up (double-fast and beyond) hash and chain tables
 * smaller than a cluster can use; tables sized to the cluster compress a
 * little smaller at no cost in speed.  Levels 1-2 (the fast strategy)
 * only get slower with larger tables.  Capped so that 2 MiB clusters do
 * not get tables that fall out of the CPU caches.
 */
#define ZSTD_HASH_LOG_MAX 17
#define ZSTD_CHAIN_LOG_MAX 16

static int
setup_zstd (struct qcow2_encoder *enc, int level, size_t in_len,
            char *errbuf, size_t errlen)
{
  ZSTD_compressionParameters row = ZSTD_getCParams (level, in_len, 0);
  unsigned in_bits = 0, hash_log = row.hashLog, chain_log = row.chainLog;
  size_t r;

  while (in_bits < 31 && ((size_t) 1 << in_bits) < in_len)
    in_bits++;
  if (level >= 3) {
    unsigned want_hash = in_bits + 1, want_chain = in_bits;
    if (want_hash > ZSTD_HASH_LOG_MAX)
      want_hash = ZSTD_HASH_LOG_MAX;
    if (want_chain > ZSTD_CHAIN_LOG_MAX)
      want_chain = ZSTD_CHAIN_LOG_MAX;
    if (hash_log < want_hash)
      hash_log = want_hash;
    if (chain_log < want_chain)
      chain_log = want_chain;
  }
  enc->zstd_level = 0;
  r = ZSTD_CCtx_reset (enc->zstd, ZSTD_reset_session_and_parameters);
  if (!ZSTD_isError (r))
    r = ZSTD_CCtx_setParameter (enc->zstd, ZSTD_c_compressionLevel, level);
  if (!ZSTD_isError (r))
    r = ZSTD_CCtx_setParameter (enc->zstd, ZSTD_c_hashLog, hash_log);
  if (!ZSTD_isError (r))
    r = ZSTD_CCtx_setParameter (enc->zstd, ZSTD_c_chainLog, chain_log);
  /* Every reader knows the size (one cluster), so the frame need not say
   * it: a byte to three smaller per cluster.  qemu decodes such frames
   * as it decodes its own (streaming, to a full cluster).
   */
  if (!ZSTD_isError (r))
    r = ZSTD_CCtx_setParameter (enc->zstd, ZSTD_c_contentSizeFlag, 0);
  if (ZSTD_isError (r)) {
    snprintf (errbuf, errlen, "zstd: cannot set up the compressor (%s)",
              ZSTD_getErrorName (r));
    return -1;
  }
  enc->zstd_level = level;
  enc->zstd_in_len = in_len;
  return 0;
}

static int64_t
encode_zstd (struct qcow2_encoder *enc, int level,
             const uint8_t *in, size_t in_len, uint8_t *out, size_t out_cap,
             char *errbuf, size_t errlen)
{
  size_t r;

  if ((enc->zstd_level != level || enc->zstd_in_len != in_len) &&
      setup_zstd (enc, level, in_len, errbuf, errlen) == -1)
    return -1;
  r = ZSTD_compress2 (enc->zstd, out, out_cap, in, in_len);
  if (!ZSTD_isError (r))
    return r;
  if (ZSTD_getErrorCode (r) == ZSTD_error_dstSize_tooSmall)
    return 0;
  snprintf (errbuf, errlen, "zstd: compression failed (%s)",
            ZSTD_getErrorName (r));
  return -1;
}

/* ------------------------------------------------------------ the table */

static int
zlib_max_level (void)
{
  return 9;
}

static int
zstd_max_level (void)
{
  return ZSTD_maxCLevel ();
}

/* One compression type as qcow2 names it (the header's compression_type),
 * and how the engine decodes and encodes its clusters.  The default
 * levels are qemu's: zlib's 6 then deflates each cluster to the very
 * bytes qemu would (same zlib, same window), so that an image made here
 * is never larger than qemu's; level 5 is about a fifth faster for about
 * half a percent more.
 */
struct codec {
  enum qcow2_compression type;
  const char *name;
  int min_level, default_level;
  int (*max_level) (void);
  int (*decode) (struct qcow2_decoder *dec, const uint8_t *in, size_t in_len,
                 uint8_t *out, size_t out_len, char *errbuf, size_t errlen);
  int64_t (*encode) (struct qcow2_encoder *enc, int level, const uint8_t *in,
                     size_t in_len, uint8_t *out, size_t out_cap,
                     char *errbuf, size_t errlen);
};

static const struct codec codecs[] = {
  { QCOW2_COMPRESSION_ZLIB, "zlib", 1, 6, zlib_max_level,
    decode_deflate, encode_zlib },
  { QCOW2_COMPRESSION_ZSTD, "zstd", 1, 3, zstd_max_level,
    decode_zstd, encode_zstd },
};

static const struct codec *
codec_of (enum qcow2_compression type)
{
  size_t i;

  for (i = 0; i < sizeof codecs / sizeof codecs[0]; ++i)
    if (codecs[i].type == type)
      return &codecs[i];
  return NULL;
}

int
qcow2_decode_cluster (struct qcow2_decoder *dec, enum qcow2_compression type,
                      const uint8_t *in, size_t in_len,
                      uint8_t *out, size_t out_len,
                      char *errbuf, size_t errlen)
{
  const struct codec *c = codec_of (type);

  if (c == NULL) {
    snprintf (errbuf, errlen, "unknown compression type %d", (int) type);
    return -1;
  }
  return c->decode (dec, in, in_len, out, out_len, errbuf, errlen);
}

int64_t
qcow2_encode_cluster (struct qcow2_encoder *enc, enum qcow2_compression type,
                      int level, const uint8_t *in, size_t in_len,
                      uint8_t *out, size_t out_cap,
                      char *errbuf, size_t errlen)
{
  const struct codec *c = codec_of (type);

  if (c == NULL) {
    snprintf (errbuf, errlen, "unknown compression type %d", (int) type);
    return -1;
  }
  return c->encode (enc, level, in, in_len, out, out_cap, errbuf, errlen);
}

int
qcow2_compression_default_level (enum qcow2_compression type)
{
  const struct codec *c = codec_of (type);

  return c ? c->default_level : 0;
}

int
qcow2_compression_level_range (enum qcow2_compression type,
                               int *min, int *max)
{
  const struct codec *c = codec_of (type);

  if (c == NULL)
    return -1;
  *min = c->min_level;
  *max = c->max_level ();
  return 0;
}

const char *
qcow2_compression_name (enum qcow2_compression type)
{
  const struct codec *c = codec_of (type);

  return c ? c->name : "unknown";
}

int
qcow2_compression_by_name (const char *name, enum qcow2_compression *type)
{
  size_t i;

  for (i = 0; i < sizeof codecs / sizeof codecs[0]; ++i)
    if (strcmp (codecs[i].name, name) == 0) {
      *type = codecs[i].type;
      return 0;
    }
  return -1;
}

void
qcow2_codec_names (char *buf, size_t len)
{
  size_t i, used = 0;

  if (len)
    buf[0] = '\0';
  for (i = 0; i < sizeof codecs / sizeof codecs[0] && used < len; ++i)
    used += snprintf (buf + used, len - used, "%s%s", i ? "," : "",
                      codecs[i].name);
}

void
qcow2_codec_versions (char *buf, size_t len)
{
#ifdef HAVE_LIBDEFLATE
  snprintf (buf, len, "zlib=%s zstd=%s libdeflate=%s",
            zlibVersion (), ZSTD_versionString (), LIBDEFLATE_VERSION_STRING);
#else
  snprintf (buf, len, "zlib=%s zstd=%s", zlibVersion (), ZSTD_versionString ());
#endif
}
