/*
 * SpaceJMP on Cairn: the C interface (libcairn_sj.so). docs/SPACEJMP.md describes it.
 *
 * Segments are named files of a Cairn store that live at one virtual address forever;
 * address spaces are named sets of segments that processes attach and threads switch
 * into. Pointers inside segments are plain pointers, valid in every process and after
 * every restart. A commit makes a writer's stores durable and visible, all or nothing.
 *
 * Errors: functions return -1 (ints), 0 (ids) or NULL (pointers) and set errno;
 * sj_strerror() gives the calling thread's last error message.
 *
 * The store is $CAIRN_STORE, else the default store, unless sj_open() names one first.
 */
#ifndef CAIRN_SJ_H
#define CAIRN_SJ_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint64_t sj_sid_t; /* a segment's id (0: error) */
typedef uint64_t sj_vid_t; /* an address space's id (0: error) */
typedef int32_t sj_vh_t;   /* a handle of an attached address space (-1: error) */

/* The process's own address space, for sj_vas_switch(). */
#define SJ_PRIMARY ((sj_vh_t)0)
/* The calling thread's current address space, for sj_seg_attach()/sj_seg_detach(). */
#define SJ_CURRENT ((sj_vid_t)UINT64_MAX)

/* Protections. */
#define SJ_PROT_READ 1
#define SJ_PROT_RW 3
/* Segment flags (sj_seg_alloc). */
#define SJ_LOCKABLE 1 /* switching in takes its lock: readers or one writer */
#define SJ_OVERLAP 2  /* may share addresses with other SJ_OVERLAP segments */
/* sj_vas_attach() flags. */
#define SJ_EXPLICIT 1 /* writes are declared with sj_tx_add() (else found at commit) */
/* sj_vas_ctl() commands. */
#define SJ_VAS_ADD 1
#define SJ_VAS_REMOVE 2
#define SJ_VAS_SET_PROT 3

/* Use the store at `store` (before any other call; optional). */
int sj_open(const char *store);

/* Make segment `name` (a name, or a path of the store) of `len` bytes at `base`
 * (NULL: the first free range). */
sj_sid_t sj_seg_alloc(const char *name, void *base, size_t len, int prot, int flags);
sj_sid_t sj_seg_find(const char *name);
/* Remove a segment (EBUSY while a process has it attached). */
int sj_seg_free(const char *name);
/* Add `sid` to address space `vid` (or SJ_CURRENT), granting `prot`. */
int sj_seg_attach(sj_vid_t vid, sj_sid_t sid, int prot);
int sj_seg_detach(sj_vid_t vid, sj_sid_t sid);

sj_vid_t sj_vas_create(const char *name, mode_t mode);
sj_vid_t sj_vas_find(const char *name);
/* A new address space `name` with the segments of `vid`. */
sj_vid_t sj_vas_clone(sj_vid_t vid, const char *name);
/* SJ_VAS_ADD / SJ_VAS_REMOVE / SJ_VAS_SET_PROT `sid` (with `prot`) in `vid`. */
int sj_vas_ctl(int cmd, sj_vid_t vid, sj_sid_t sid, int prot);
/* Attach `vid` (map its segments at their bases): a handle. EBUSY if attached. */
sj_vh_t sj_vas_attach(sj_vid_t vid, int flags);
int sj_vas_detach(sj_vh_t vh);
/* Switch the calling thread into `vh` (SJ_PRIMARY: back), waiting for its locks.
 * Stores to a segment whose writer lock the thread gives up are committed first. */
int sj_vas_switch(sj_vh_t vh);
/* The same, but fail with EWOULDBLOCK instead of waiting (the thread stays). */
int sj_vas_try_switch(sj_vh_t vh);

/* Run fn in the helper process of `vh` (forked from this process at the first call,
 * so fn's code is there), while this process's threads may be in address spaces that
 * conflict with vh (overlapping segments). As if the helper's thread did
 * sj_vas_switch(vh); fn(copy, len); sj_vas_switch(SJ_PRIMARY): fn may call sj_commit()
 * and the other sj_ functions, which act in the helper. fn gets a copy of the `len`
 * bytes at `buf` (at most SJ_CALL_MAX; pointers in them may point into segments, not
 * into buf), copied back into buf afterwards; its value goes to *result.
 * EIO if the helper died (the next call starts another), EMSGSIZE if len is too
 * large, EINVAL for the primary address space. */
#define SJ_CALL_MAX ((1 << 20) - 16)
typedef int64_t (*sj_call_fn)(void *buf, size_t len);
int sj_vas_call(sj_vh_t vh, sj_call_fn fn, void *buf, size_t len, int64_t *result);

/* Memory in segment `sid` of the current address space (its heap lives inside it). */
void *sj_malloc(sj_sid_t sid, size_t n);
void sj_free(void *p);
/* Named roots: find a structure again after a restart. NULL (errno 0): not set. */
void *sj_root(sj_sid_t sid, const char *name);
int sj_set_root(sj_sid_t sid, const char *name, void *p);

/* Make the calling thread's stores durable and visible, all or nothing. */
int sj_commit(void);
/* Drop them. */
int sj_abort(void);
/* Explicit mode: declare [p, p + n) before storing there. */
int sj_tx_add(void *p, size_t n);

/* The calling thread's last error, as a message. */
const char *sj_strerror(void);

#ifdef __cplusplus
}
#endif

#endif
