/* Growable arrays: vec_grow() gives an array room for `need` elements,
 * doubling, for the server and blkperf alike. */
#ifndef BLKD_COMMON_VECTOR_H
#define BLKD_COMMON_VECTOR_H

#include <stddef.h>

/* vec_grow (V, &CAP, NEED, sizeof *V, FIRST): V itself if it already holds
 * NEED elements, else V realloc'd to the larger of twice CAP, FIRST and
 * NEED, with CAP updated.  NULL with errno ENOMEM (V untouched, still the
 * caller's) when memory or size_t runs out.  Returns the new pointer rather
 * than writing through a void ** so that any element type works without
 * breaking aliasing rules: NV = vec_grow (...); if (!NV) fail; V = NV; */
void *vec_grow (void *v, size_t *cap, size_t need, size_t elem, size_t first);

#endif
