/* qcow2zstd engine: state shared by the engine's own files. */
#ifndef QCOW2_INTERNAL_H
#define QCOW2_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "qcow2.h"
#include "qcow2-cache.h"
#include "qcow2-entries.h"
#include "qcow2-hostio.h"
#include "qcow2-map.h"
#include "qcow2-backing.h"
#include "qcow2-conn.h"
#include "qcow2-writeback.h"
#include "qcow2-refcount.h"
#include "qcow2-alloc.h"
#include "qcow2-compress.h"
#include "qcow2-dedup.h"
#include "qcow2-tablemap.h"
#include "qcow2-types.h"
#include <pthread.h>
#include <inttypes.h>

#endif /* QCOW2_INTERNAL_H */
