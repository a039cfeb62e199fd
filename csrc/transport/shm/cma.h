/* Cross-memory attach: single copies between the ranks' own memory.
 *
 * Large shared-memory collectives move bytes with process_vm_readv /
 * process_vm_writev straight from one rank's user buffer into another's (one
 * copy), instead of through the shared banks (two).  Linux allows it between
 * processes of one user unless ptrace is restricted (Yama's ptrace_scope,
 * containers without CAP_SYS_PTRACE, seccomp): the group probes it once at
 * set-up, reading every peer's probe word (pd_shm_ctrl.cma_addr), and falls
 * back to the banks unless every rank succeeded.
 *
 * PYDDP_CMA=0 turns it off; PYDDP_CMA_THRESHOLD (bytes, "256K", "1M") is the
 * smallest message that uses it in every collective (read once, here);
 * unset, each collective's measured threshold (coll/rules.c).
 */
#ifndef PD_CMA_H
#define PD_CMA_H

#include <stddef.h>
#include <stdint.h>

#include "shm.h"

/* 0 when PYDDP_CMA=0 (forced off), else 1. */
int pd_cma_wanted(void);
/* PYDDP_CMA_THRESHOLD: messages of at least this many bytes use single
 * copies, whatever the collective; PD_CMA_DEFAULT when unset (each
 * collective's own threshold then, coll/rules.c). */
#define PD_CMA_DEFAULT ((size_t)-1)
size_t pd_cma_threshold(void);

/* Forget the cached PYDDP_CMA / PYDDP_CMA_THRESHOLD (pd_shm_env_forget). */
void pd_cma_env_forget(void);

/* Read every peer's probe word.  PD_OK: every read returned the word the
 * peer published; else the status and message say why (the caller falls
 * back: it is not an error of the group). */
pd_status pd_cma_probe(pd_shm *s);

/* len bytes from peer p's address src into dst (this process), or from src
 * (this process) to peer p's address dst.  what names the operation in the
 * message; a peer that died or left gives PD_ENETWORK naming it (p is the
 * rank: the shared-memory collectives run with every rank local). */
pd_status pd_cma_read(pd_shm *s, int p, void *dst, uint64_t src, size_t len,
                      const char *what);
pd_status pd_cma_write(pd_shm *s, int p, uint64_t dst, const void *src,
                       size_t len, const char *what);

#endif
