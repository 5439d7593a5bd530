// `cairn bench spacejmp`: pointer chasing and commits in the systems a user would use
// instead of a Cairn segment, with the same code for each: a linked list walked in a
// random order and a B-tree searched for random keys, over
//   dram     memory from malloc,
//   segment  a Cairn segment (libcairn_sj: plain pointers),
//   pmdk     a PMDK pool (libpmemobj: PMEMoid, pmemobj_direct on every dereference),
//   boost    a Boost.Interprocess managed_mapped_file (offset_ptr);
// and PMDK transactions (TX_BEGIN / TX_ADD_RANGE) for the commit comparison.
//
// Usage: pointers SYSTEM list|btree NODES LOOKUPS DIR   -> "ns_per_op X"
//        pointers pmdk-commit UPDATES BYTES PAGES TXS DIR -> "tx_per_s X p50_ns Y"
//        pointers boost-lock DIR hold|try                  (lock held by a killed process)
#include <algorithm>
#include <boost/interprocess/managed_mapped_file.hpp>
#include <boost/interprocess/offset_ptr.hpp>
#include <boost/interprocess/sync/named_mutex.hpp>
#include <boost/date_time/posix_time/posix_time_types.hpp>
#include <cairn/sj.h>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <libpmemobj.h>
#include <random>
#include <string>
#include <vector>
#include <unistd.h>

namespace bi = boost::interprocess;

static uint64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

static void die(const char *what) {
    fprintf(stderr, "pointers: %s\n", what);
    exit(1);
}

// A pointer kind: raw (dram, segment), PMDK's PMEMoid, Boost's offset_ptr.
template <class T> struct Raw {
    T *p = nullptr;
    T *get() const { return p; }
    void set(T *v) { p = v; }
};
static PMEMobjpool *pop;
template <class T> struct Pmem {
    PMEMoid oid = OID_NULL;
    T *get() const { return (T *)pmemobj_direct(oid); }
    void set(T *v) { oid = pmemobj_oid(v); }
};
template <class T> struct Off {
    bi::offset_ptr<T> p;
    T *get() const { return p.get(); }
    void set(T *v) { p = v; }
};

enum Sys { DRAM, SEGMENT, PMDK, BOOST };
static bi::managed_mapped_file *bseg;
static sj_sid_t sid;

static void *alloc(Sys s, size_t n) {
    void *p = nullptr;
    switch (s) {
    case DRAM:
        p = malloc(n);
        break;
    case SEGMENT:
        p = sj_malloc(sid, n);
        break;
    case PMDK: {
        PMEMoid o;
        if (pmemobj_zalloc(pop, &o, n, 1) != 0) die("pmemobj_zalloc");
        p = pmemobj_direct(o);
        break;
    }
    case BOOST:
        p = bseg->allocate(n);
        break;
    }
    if (!p) die("allocation failed");
    memset(p, 0, n);
    return p;
}

template <template <class> class P> struct Node {
    uint64_t value;
    P<Node> next;
    char pad[40];
};

template <template <class> class P> double list(Sys s, size_t n, size_t hops) {
    std::vector<Node<P> *> nodes(n);
    for (auto &x : nodes) x = (Node<P> *)alloc(s, sizeof(Node<P>));
    std::mt19937_64 rng(42);
    std::shuffle(nodes.begin(), nodes.end(), rng);
    for (size_t i = 0; i < n; i++) {
        nodes[i]->value = i;
        nodes[i]->next.set(nodes[(i + 1) % n]);
    }
    Node<P> *p = nodes[0];
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) p = p->next.get(); // warm
    uint64_t t = now_ns();
    for (size_t i = 0; i < hops; i++) {
        sum += p->value;
        p = p->next.get();
    }
    double ns = (double)(now_ns() - t) / hops;
    if (sum == 42) printf("#");
    return ns;
}

const int FAN = 16;
template <template <class> class P> struct BNode {
    int n;
    int leaf;
    uint64_t keys[FAN];
    P<BNode> child[FAN + 1];
};

// Bulk-load a B-tree over keys 0, 2, 4, ...: leaves, then levels up.
template <template <class> class P> BNode<P> *build(Sys s, size_t n) {
    std::vector<BNode<P> *> level;
    for (size_t i = 0; i < n; i += FAN) {
        auto *b = (BNode<P> *)alloc(s, sizeof(BNode<P>));
        b->leaf = 1;
        b->n = (int)std::min<size_t>(FAN, n - i);
        for (int k = 0; k < b->n; k++) b->keys[k] = 2 * (i + k);
        level.push_back(b);
    }
    while (level.size() > 1) {
        std::vector<BNode<P> *> up;
        for (size_t i = 0; i < level.size(); i += FAN + 1) {
            auto *b = (BNode<P> *)alloc(s, sizeof(BNode<P>));
            size_t m = std::min<size_t>(FAN + 1, level.size() - i);
            b->leaf = 0;
            b->n = (int)m - 1;
            for (size_t k = 0; k < m; k++) {
                b->child[k].set(level[i + k]);
                if (k > 0) {
                    BNode<P> *c = level[i + k];
                    while (!c->leaf) c = c->child[0].get();
                    b->keys[k - 1] = c->keys[0];
                }
            }
            up.push_back(b);
        }
        level = up;
    }
    return level[0];
}

template <template <class> class P> double btree(Sys s, size_t n, size_t lookups) {
    BNode<P> *root = build<P>(s, n);
    std::mt19937_64 rng(7);
    uint64_t found = 0;
    uint64_t t = now_ns();
    for (size_t i = 0; i < lookups; i++) {
        uint64_t key = 2 * (rng() % n);
        BNode<P> *b = root;
        while (!b->leaf) {
            int k = 0;
            while (k < b->n && key >= b->keys[k]) k++;
            b = b->child[k].get();
        }
        for (int k = 0; k < b->n; k++) found += b->keys[k] == key;
    }
    double ns = (double)(now_ns() - t) / lookups;
    if (found != lookups) die("btree lookup missed a key");
    return ns;
}

template <template <class> class P> double run(Sys s, const char *what, size_t n, size_t ops) {
    return strcmp(what, "list") == 0 ? list<P>(s, n, ops) : btree<P>(s, n, ops);
}

static void pmdk_open(const std::string &dir, size_t bytes) {
    std::string path = dir + "/pool.pmdk";
    unlink(path.c_str());
    pop = pmemobj_create(path.c_str(), "cairn-bench", bytes, 0600);
    if (!pop) die(pmemobj_errormsg());
}

// PMDK transactions: UPDATES ranges of BYTES each (or PAGES whole pages) per transaction.
static void pmdk_commit(int updates, size_t bytes, int pages, int txs, const std::string &dir) {
    pmdk_open(dir, 256 << 20);
    PMEMoid o;
    size_t area = 64 << 20;
    if (pmemobj_zalloc(pop, &o, area, 1) != 0) die("pmemobj_zalloc");
    char *base = (char *)pmemobj_direct(o);
    std::mt19937_64 rng(3);
    std::vector<uint64_t> lat;
    uint64_t t0 = now_ns();
    for (int i = 0; i < txs; i++) {
        uint64_t t = now_ns();
        TX_BEGIN(pop) {
            if (pages > 0) {
                for (int p = 0; p < pages; p++) {
                    char *at = base + (rng() % (area / 4096)) * 4096;
                    pmemobj_tx_add_range_direct(at, 4096);
                    memcpy(at, &t, 8);
                }
            } else {
                for (int u = 0; u < updates; u++) {
                    char *at = base + (rng() % (area / bytes)) * bytes;
                    pmemobj_tx_add_range_direct(at, bytes);
                    memset(at, (int)i, bytes);
                }
            }
        }
        TX_ONABORT { die("transaction aborted"); }
        TX_END
        lat.push_back(now_ns() - t);
    }
    double secs = (double)(now_ns() - t0) / 1e9;
    std::sort(lat.begin(), lat.end());
    printf("tx_per_s %.0f p50_ns %llu\n", txs / secs, (unsigned long long)lat[lat.size() / 2]);
    pmemobj_close(pop);
}

int main(int argc, char **argv) {
    if (argc >= 7 && strcmp(argv[1], "pmdk-commit") == 0) {
        pmdk_commit(atoi(argv[2]), atol(argv[3]), atoi(argv[4]), atoi(argv[5]), argv[6]);
        return 0;
    }
    if (argc >= 4 && strcmp(argv[1], "boost-lock") == 0) {
        std::string name = std::string("cairn-bench-") + argv[2];
        if (strcmp(argv[3], "hold") == 0) {
            bi::named_mutex::remove(name.c_str());
            bi::named_mutex m(bi::create_only, name.c_str());
            m.lock();
            printf("held\n");
            fflush(stdout);
            pause();
        }
        bi::named_mutex m(bi::open_only, name.c_str());
        auto until = boost::posix_time::microsec_clock::universal_time() +
                     boost::posix_time::seconds(2);
        bool got = m.timed_lock(until);
        printf("%s\n", got ? "acquired" : "deadlock");
        if (got) m.unlock();
        bi::named_mutex::remove(name.c_str());
        return 0;
    }
    if (argc < 6) die("usage: pointers SYSTEM list|btree NODES OPS DIR");
    std::string sys = argv[1], dir = argv[5];
    const char *what = argv[2];
    size_t n = atol(argv[3]), ops = atol(argv[4]);
    double ns;
    if (sys == "dram") {
        ns = run<Raw>(DRAM, what, n, ops);
    } else if (sys == "segment") {
        sid = sj_seg_alloc("bench-pointers", NULL, 1UL << 28, SJ_PROT_RW, 0);
        if (!sid) die(sj_strerror());
        if (sj_seg_attach(SJ_CURRENT, sid, SJ_PROT_RW) < 0) die(sj_strerror());
        ns = run<Raw>(SEGMENT, what, n, ops);
        sj_abort();
        sj_seg_detach(SJ_CURRENT, sid);
        sj_seg_free("bench-pointers");
    } else if (sys == "pmdk") {
        pmdk_open(dir, 1UL << 30);
        ns = run<Pmem>(PMDK, what, n, ops);
        pmemobj_close(pop);
    } else if (sys == "boost") {
        std::string path = dir + "/pool.boost";
        bi::file_mapping::remove(path.c_str());
        bseg = new bi::managed_mapped_file(bi::create_only, path.c_str(), 1UL << 30);
        ns = run<Off>(BOOST, what, n, ops);
        delete bseg;
        bi::file_mapping::remove(path.c_str());
    } else {
        die("unknown system");
    }
    printf("ns_per_op %.3f\n", ns);
    return 0;
}
