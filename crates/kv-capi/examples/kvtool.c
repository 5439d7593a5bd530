/*
 * kvtool: cairn-kv's shared store from C (include/cairn/kv.h).
 *
 *   kvtool POOL put KEY VALUE     set a key
 *   kvtool POOL get KEY           print its value
 *   kvtool POOL del KEY           remove it
 *   kvtool POOL fill PREFIX N     set PREFIX0 .. PREFIX<N-1> to "value of PREFIX<i>"
 *   kvtool POOL check PREFIX N    check what fill set (prints "ok N")
 *   kvtool POOL churn PREFIX N    set PREFIX<i mod N> for i = 0, 1, ... until killed
 *
 * Build: cc -I crates/kv-capi/include kvtool.c -L target/release -lcairn_kv
 */
#include <cairn/kv.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what) {
    fprintf(stderr, "kvtool: %s: %s (errno %d)\n", what, cairn_kv_strerror(), errno);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: kvtool POOL put|get|del|fill|check ARGS\n");
        return 2;
    }
    cairn_kv *kv = cairn_kv_open_shared(argv[1], 64 << 20);
    if (!kv)
        return fail("open");
    const char *op = argv[2], *key = argv[3];
    int rc = 0;
    if (!strcmp(op, "put") && argc == 5) {
        if (cairn_kv_put(kv, key, strlen(key), argv[4], strlen(argv[4])) != 0)
            rc = fail("put");
    } else if (!strcmp(op, "get")) {
        char buf[4096];
        ssize_t n = cairn_kv_get(kv, key, strlen(key), buf, sizeof buf);
        if (n < 0)
            rc = fail("get");
        else
            fwrite(buf, 1, (size_t)n < sizeof buf ? (size_t)n : sizeof buf, stdout);
    } else if (!strcmp(op, "del")) {
        int was = cairn_kv_del(kv, key, strlen(key));
        if (was < 0)
            rc = fail("del");
        else if (!was)
            rc = 1;
    } else if ((!strcmp(op, "fill") || !strcmp(op, "check")) && argc == 5) {
        long n = atol(argv[4]);
        for (long i = 0; i < n && !rc; i++) {
            char k[256], want[300], got[300];
            snprintf(k, sizeof k, "%s%ld", key, i);
            int len = snprintf(want, sizeof want, "value of %s", k);
            if (op[0] == 'f') {
                if (cairn_kv_put(kv, k, strlen(k), want, (size_t)len) != 0)
                    rc = fail("put");
            } else {
                ssize_t m = cairn_kv_get(kv, k, strlen(k), got, sizeof got);
                if (m != len || memcmp(got, want, (size_t)len) != 0) {
                    fprintf(stderr, "kvtool: %s holds %.*s\n", k, m < 0 ? 0 : (int)m, got);
                    rc = 1;
                }
            }
        }
        if (!rc && op[0] == 'c')
            printf("ok %ld\n", n);
    } else if (!strcmp(op, "churn") && argc == 5) {
        long n = atol(argv[4]);
        for (unsigned long i = 0; n > 0 && !rc; i++) {
            char k[256], v[64];
            snprintf(k, sizeof k, "%s%lu", key, i % (unsigned long)n);
            int len = snprintf(v, sizeof v, "round %lu", i / (unsigned long)n);
            if (cairn_kv_put(kv, k, strlen(k), v, (size_t)len) != 0)
                rc = fail("put");
        }
    } else {
        fprintf(stderr, "kvtool: %s: not an operation (or its arguments are missing)\n", op);
        rc = 2;
    }
    cairn_kv_close(kv);
    return rc;
}
