/* SPDX-License-Identifier: BSD-3-Clause */
/* Runs a fuzz target over files named on the command line, for make check
 * and for reproducing a crash without libFuzzer.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

int
main (int argc, char *argv[])
{
  for (int i = 1; i < argc; ++i) {
    FILE *fp = fopen (argv[i], "rb");
    long len;
    uint8_t *data;

    if (fp == NULL || fseek (fp, 0, SEEK_END) != 0 || (len = ftell (fp)) < 0) {
      perror (argv[i]);
      return 1;
    }
    rewind (fp);
    data = malloc (len ? len : 1);
    if (data == NULL || fread (data, 1, len, fp) != (size_t) len) {
      perror (argv[i]);
      return 1;
    }
    fclose (fp);
    LLVMFuzzerTestOneInput (data, len);
    free (data);
  }
  printf ("%d inputs ran\n", argc - 1);
  return 0;
}
