/* The rules of algorithm choice, as data: the sizes at which coll/select.c
 * switches algorithms and the single-copy thresholds coll/cma_common.c
 * applies.  Both read them; neither owns them. */
#ifndef PD_COLL_RULES_H
#define PD_COLL_RULES_H

#include <stddef.h>

/* Messages up to this many bytes use the latency-optimal direct algorithms
 * over the transport; larger ones the rings and the chain. */
#define PD_SMALL_BYTES (64u << 10)

/* The default single-copy threshold of a collective kind (coll/rules.c):
 * bytes of one rank's block (all_reduce: the message); PD_CMA_DEFAULT:
 * never.  PYDDP_CMA_THRESHOLD, when set, replaces it for every kind. */
size_t pd_coll_cma_threshold(int kind);

#endif
