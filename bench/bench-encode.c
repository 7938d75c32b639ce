/* SPDX-License-Identifier: BSD-3-Clause */
/* The encode bound of image creation: the engine's own encoder
 * (format/codec.c) compressing every cluster of a raw disk that is not
 * all zeros, on one thread per online CPU (as the filter's compressor
 * pool runs), from memory (the file is mapped, all of it read in, before
 * the clock starts).  No NBD, no placing, no writing: what bench-compress's
 * copies cost beyond this is the rest of the job.
 *
 *   bench-encode RAW TYPE LEVEL CLUSTER_SIZE [THREADS]
 *
 * Prints one line: "seconds clusters bytes_in bytes_out threads".
 * Clusters that do not shrink count their own size out, as the image
 * stores them.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/zeros.h"
#include "format/codec.h"

struct job {
  const uint8_t *disk;
  size_t disk_len;
  size_t cluster_size;
  enum qcow2_compression type;
  int level;
  atomic_size_t next;           /* the next cluster index to take */
  atomic_size_t clusters, bytes_out;
  atomic_int failed;
};

static void *
worker (void *arg)
{
  struct job *job = arg;
  struct qcow2_encoder *enc = qcow2_encoder_new ();
  uint8_t *out = malloc (job->cluster_size);
  size_t clusters = 0, bytes_out = 0, i;
  char err[256];

  if (enc == NULL || out == NULL) {
    fprintf (stderr, "bench-encode: out of memory\n");
    atomic_store (&job->failed, 1);
    goto done;
  }
  while ((i = atomic_fetch_add (&job->next, 1)) * job->cluster_size
         < job->disk_len) {
    const uint8_t *in = job->disk + i * job->cluster_size;
    size_t len = job->disk_len - i * job->cluster_size;
    int64_t r;

    if (len < job->cluster_size)
      continue;                 /* the partial last cluster: not timed */
    if (qcow2_all_zero (in, job->cluster_size))
      continue;
    r = qcow2_encode_cluster (enc, job->type, job->level, in,
                              job->cluster_size, out, job->cluster_size - 1,
                              err, sizeof err);
    if (r < 0) {
      fprintf (stderr, "bench-encode: %s\n", err);
      atomic_store (&job->failed, 1);
      break;
    }
    clusters++;
    bytes_out += r ? (size_t) r : job->cluster_size;
  }
 done:
  atomic_fetch_add (&job->clusters, clusters);
  atomic_fetch_add (&job->bytes_out, bytes_out);
  qcow2_encoder_free (enc);
  free (out);
  return NULL;
}

int
main (int argc, char *argv[])
{
  struct job job = { 0 };
  struct timespec t0, t1;
  struct stat st;
  pthread_t *threads;
  long nthreads;
  size_t i;
  int fd;

  if (argc < 5 || argc > 6) {
    fprintf (stderr, "usage: %s RAW TYPE LEVEL CLUSTER_SIZE [THREADS]\n",
             argv[0]);
    return 2;
  }
  if (qcow2_compression_by_name (argv[2], &job.type) == -1) {
    fprintf (stderr, "bench-encode: unknown compression type %s\n", argv[2]);
    return 2;
  }
  job.level = atoi (argv[3]);
  job.cluster_size = strtoul (argv[4], NULL, 0);
  nthreads = argc == 6 ? atol (argv[5]) : sysconf (_SC_NPROCESSORS_ONLN);
  if (nthreads < 1 || job.cluster_size < 512) {
    fprintf (stderr, "bench-encode: bad thread count or cluster size\n");
    return 2;
  }
  fd = open (argv[1], O_RDONLY);
  if (fd == -1 || fstat (fd, &st) == -1) {
    fprintf (stderr, "bench-encode: %s: %s\n", argv[1], strerror (errno));
    return 1;
  }
  job.disk_len = st.st_size;
  /* MAP_POPULATE: every page read in and mapped before the clock starts. */
  job.disk = mmap (NULL, job.disk_len, PROT_READ, MAP_PRIVATE | MAP_POPULATE,
                   fd, 0);
  if (job.disk == MAP_FAILED) {
    fprintf (stderr, "bench-encode: mmap: %s\n", strerror (errno));
    return 1;
  }
  threads = calloc (nthreads, sizeof *threads);
  if (threads == NULL)
    return 1;
  clock_gettime (CLOCK_MONOTONIC, &t0);
  for (i = 0; i < (size_t) nthreads; ++i)
    if (pthread_create (&threads[i], NULL, worker, &job) != 0) {
      fprintf (stderr, "bench-encode: pthread_create failed\n");
      return 1;
    }
  for (i = 0; i < (size_t) nthreads; ++i)
    pthread_join (threads[i], NULL);
  clock_gettime (CLOCK_MONOTONIC, &t1);
  if (atomic_load (&job.failed))
    return 1;
  printf ("%.3f %zu %zu %zu %ld\n",
          (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9,
          atomic_load (&job.clusters),
          atomic_load (&job.clusters) * job.cluster_size,
          atomic_load (&job.bytes_out), nthreads);
  return 0;
}
