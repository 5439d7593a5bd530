/*
 * cairn-kv from C (libcairn_kv.so): a persistent key-value store that several processes
 * open at once and use in their own process, with no server between them.
 * docs/KV.md describes it.
 *
 * Every put and del is durable when it returns (on the medium's persistence model: with
 * the pool on /dev/shm, it survives the process, not the machine). A process killed at
 * any point loses nothing the store acknowledged, and holds the others back in nothing.
 *
 * Errors: functions return -1 (or NULL) and set errno; cairn_kv_strerror() gives the
 * calling thread's last error message. ENOSPC: the pool (or its index) is full; EINVAL:
 * an empty key, a key over 64 KiB or a value over the largest a record holds;
 * EWOULDBLOCK: a process has the pool open on its own (not shared); ENOENT: no such key.
 */
#ifndef CAIRN_KV_H
#define CAIRN_KV_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cairn_kv cairn_kv;

/* Open the pool `pool` shared with the other processes that open it so (`cairn kv
 * serve --shared` among them), creating it with `size` bytes (0: 256 MiB) if it does
 * not exist. `pool` is a path, or a name without '/': the pool /dev/shm/<name>.pool. */
cairn_kv *cairn_kv_open_shared(const char *pool, uint64_t size);
/* Let go of the store (the handle is not valid after). */
void cairn_kv_close(cairn_kv *kv);

/* Set `key` to `value`, durably. 0, or -1. */
int cairn_kv_put(cairn_kv *kv, const void *key, size_t key_len, const void *value,
                 size_t value_len);
/* Copy `key`'s value (at most `cap` bytes of it) into `buf`; its length (more than
 * `cap`: the copy is cut short), or -1 (ENOENT: no such key). */
ssize_t cairn_kv_get(cairn_kv *kv, const void *key, size_t key_len, void *buf, size_t cap);
/* Remove `key`, durably: 1, 0 when it was not there, or -1. */
int cairn_kv_del(cairn_kv *kv, const void *key, size_t key_len);
/* Keys present. */
uint64_t cairn_kv_len(cairn_kv *kv);

/* The calling thread's last error message. */
const char *cairn_kv_strerror(void);

#ifdef __cplusplus
}
#endif

#endif
