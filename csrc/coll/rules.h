/* The rules of algorithm choice, as data: the sizes at which coll/select.c
 * switches algorithms and the single-copy thresholds coll/cma_common.c
 * applies.  Both read them; neither owns them.  A group holds one pd_rules
 * (zero: the defaults below); pyddp.tools.tune measures a host's own and
 * the group loads them at creation (pd_group_set_rules). */
#ifndef PD_COLL_RULES_H
#define PD_COLL_RULES_H

#include <stddef.h>

#include "../util/kinds.h"

/* Messages up to this many bytes use the latency-optimal direct algorithms
 * over the transport; larger ones the rings and the chain (the default of
 * pd_rules.small_bytes). */
#define PD_SMALL_BYTES (64u << 10)

/* Never (a threshold no message reaches); the same value as cma.h's
 * PD_CMA_DEFAULT. */
#define PD_RULE_NEVER ((size_t)-1)

typedef struct pd_rules {
    /* single copies from this many bytes of one rank's block (all_reduce:
     * the message); 0: the default of coll/rules.c; PD_RULE_NEVER: never */
    size_t cma_from[PD_NKINDS];
    /* the banks again in [cma_gap_lo, cma_gap_hi) bytes, above cma_from (a
     * machine whose banks win in a middle band; 0, 0: no gap) */
    size_t cma_gap_lo[PD_NKINDS];
    size_t cma_gap_hi[PD_NKINDS];
    /* over the transport, direct algorithms up to this many bytes; 0: the
     * default PD_SMALL_BYTES */
    size_t small_bytes[PD_NKINDS];
} pd_rules;

/* The default single-copy threshold of a collective kind (coll/rules.c):
 * bytes of one rank's block (all_reduce: the message); PD_CMA_DEFAULT:
 * never. */
size_t pd_coll_cma_threshold(int kind);

/* The single-copy threshold in force: PYDDP_CMA_THRESHOLD when set, else
 * the group's rule for the kind, else the default (r may be NULL). */
size_t pd_rules_cma_from(const pd_rules *r, int kind);

/* Whether a message of `bytes` (one rank's block; all_reduce: the message)
 * moves by single copies: from the threshold in force, outside the rule's
 * gap (PYDDP_CMA_THRESHOLD has none). */
int pd_rules_cma(const pd_rules *r, int kind, size_t bytes);

/* The gap in force for the kind ([*lo, *hi); 0, 0: none). */
void pd_rules_cma_gap(const pd_rules *r, int kind, size_t *lo, size_t *hi);

/* The direct/ring crossover in force over the transport for the kind. */
size_t pd_rules_small(const pd_rules *r, int kind);

#endif
