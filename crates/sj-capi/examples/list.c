/*
 * SpaceJMP on Cairn from C: one process builds a linked list in a segment, another
 * (later, after a restart too) walks it. The pointers are plain C pointers: the segment
 * is at the same address in every process.
 *
 *   cc -I crates/sj-capi/include crates/sj-capi/examples/list.c \
 *      -L target/release -lcairn_sj -Wl,-rpath,$PWD/target/release -o list
 *   ./list build 1000      # makes segment "clist" and address space "clists"
 *   ./list read            # sum 500500 n 1000
 */
#include <cairn/sj.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct node {
    long value;
    struct node *next;
};

static void die(const char *what) {
    fprintf(stderr, "list: %s: %s (errno %d)\n", what, sj_strerror(), errno);
    exit(1);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: list build N | list read\n");
        return 2;
    }
    if (strcmp(argv[1], "build") == 0 && argc == 3) {
        long n = atol(argv[2]);
        sj_sid_t sid = sj_seg_alloc("clist", NULL, 8 << 20, SJ_PROT_RW, SJ_LOCKABLE);
        if (!sid) die("sj_seg_alloc");
        sj_vid_t vid = sj_vas_create("clists", 0640);
        if (!vid) die("sj_vas_create");
        if (sj_vas_ctl(SJ_VAS_ADD, vid, sid, SJ_PROT_RW) < 0) die("sj_vas_ctl");
        sj_vh_t vh = sj_vas_attach(vid, 0);
        if (vh < 0) die("sj_vas_attach");
        if (sj_vas_switch(vh) < 0) die("sj_vas_switch");
        struct node *head = NULL;
        for (long i = 1; i <= n; i++) {
            struct node *x = sj_malloc(sid, sizeof *x);
            if (!x) die("sj_malloc");
            x->value = i; /* plain stores into the segment */
            x->next = head;
            head = x;
        }
        if (sj_set_root(sid, "head", head) < 0) die("sj_set_root");
        if (sj_commit() < 0) die("sj_commit"); /* durable, all or nothing */
        if (sj_vas_switch(SJ_PRIMARY) < 0) die("sj_vas_switch");
        printf("built %ld nodes at %p\n", n, (void *)head);
        return 0;
    }
    if (strcmp(argv[1], "read") == 0) {
        sj_vid_t vid = sj_vas_find("clists");
        if (!vid) die("sj_vas_find");
        sj_vh_t vh = sj_vas_attach(vid, 0);
        if (vh < 0) die("sj_vas_attach");
        if (sj_vas_switch(vh) < 0) die("sj_vas_switch");
        sj_sid_t sid = sj_seg_find("clist");
        if (!sid) die("sj_seg_find");
        long sum = 0, n = 0;
        for (struct node *p = sj_root(sid, "head"); p; p = p->next) {
            sum += p->value;
            n++;
        }
        if (sj_vas_switch(SJ_PRIMARY) < 0) die("sj_vas_switch");
        printf("sum %ld n %ld\n", sum, n);
        return 0;
    }
    fprintf(stderr, "usage: list build N | list read\n");
    return 2;
}
