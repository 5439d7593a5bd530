// `cairn bench spacejmp`: pointer chasing and commits in the systems a user would use
// instead of a Cairn segment, with the same code for each: a linked list walked in a
// random order and a B-tree searched for random keys, over
//   dram     memory from malloc,
//   segment  a Cairn segment (libcairn_sj: plain pointers),
//   pmdk     a PMDK pool (libpmemobj: PMEMoid, pmemobj_direct on every dereference),
//   boost    a Boost.Interprocess managed_mapped_file (offset_ptr);
// and PMDK transactions (TX_BEGIN / TX_ADD_RANGE) for the commit comparison.
//
// And GUPS (HPCC RandomAccess over windows of 1 GiB, the dissertation's Figure 48), with
// the same update code for each system:
//   flat     every window a Cairn segment at its own address, in one address space,
//   switch   the windows Cairn segments at one address (SJ_OVERLAP), one address space
//            each, switched into per window change (page tables moved with mremap),
//   mp       a process per window (a tmpfs file each), update sets handed over with a
//            futex on one CPU,
//   map      one process that munmaps the window it leaves and mmaps (MAP_POPULATE) the
//            tmpfs file of the one it enters.
//
// Usage: pointers SYSTEM list|btree NODES LOOKUPS DIR   -> "ns_per_op X"
//        pointers gups SYSTEM WINDOWS U1,U2.. SECONDS DIR
//                         -> "mups_U X changes_per_s_U Y check_U Z" for each update set size U
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
#include <atomic>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <cerrno>
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

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


// ---- GUPS ---------------------------------------------------------------------------

static const size_t WIN = 1UL << 30;
// The table of a window: past a segment's header and heap pages (64 KiB).
static const size_t TAB_OFF = 64 << 10;
static const size_t TAB_WORDS = (WIN - TAB_OFF) / 8;
static const uintptr_t FLAT_BASE = 0x100000000000UL + (256UL << 30);
static const uintptr_t SWITCH_BASE = 0x100000000000UL + (512UL << 30);

static inline uint64_t xorshift(uint64_t &x) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
}

// One update set of `u` updates in the table at `t`, from random state `r`; the sum of
// the values written (the same for every system: the same sets over tables that start
// at zero).
static inline uint64_t update_set(uint64_t *t, int u, uint64_t &r) {
    uint64_t sum = 0;
    for (int i = 0; i < u; i++) {
        uint64_t v = xorshift(r);
        uint64_t &w = t[v % TAB_WORDS];
        w ^= v;
        sum += w;
    }
    return sum;
}

// Every system implements enter(w) (make window w's table reachable) and apply(w, u, r).
struct GupsSys {
    virtual ~GupsSys() {}
    virtual void enter(int w) = 0;
    virtual uint64_t apply(int w, int u, uint64_t &r) = 0;
};

static void touch(uint64_t *t) {
    for (size_t i = 0; i < TAB_WORDS; i += 512) t[i] = 0;
}

struct Segments : GupsSys {
    std::vector<sj_vh_t> vhs;
    std::vector<std::string> names;
    std::vector<uint64_t *> tabs;
    bool overlap;
    Segments(int windows, bool ov) : overlap(ov) {
        std::string tag = std::to_string(getpid());
        sj_vid_t one = 0;
        if (!ov) {
            one = sj_vas_create(("gups-flat-" + tag).c_str(), 0600);
            if (!one) die(sj_strerror());
        }
        for (int w = 0; w < windows; w++) {
            std::string n = std::string(ov ? "gups-sw-" : "gups-flat-") + tag + "-" +
                            std::to_string(w);
            uintptr_t base = ov ? SWITCH_BASE : FLAT_BASE + (uintptr_t)w * WIN;
            sj_sid_t sid = sj_seg_alloc(n.c_str(), (void *)base, WIN, SJ_PROT_RW,
                                        ov ? SJ_OVERLAP : 0);
            if (!sid) die(sj_strerror());
            names.push_back(n);
            sj_vid_t vid = one;
            if (ov) {
                vid = sj_vas_create(n.c_str(), 0600);
                if (!vid) die(sj_strerror());
            }
            if (sj_vas_ctl(SJ_VAS_ADD, vid, sid, SJ_PROT_RW) < 0) die(sj_strerror());
            if (ov) {
                // Explicit mode: stores go to the resident copy (nothing is committed:
                // GUPS measures reaching the data, not persisting it).
                sj_vh_t vh = sj_vas_attach(vid, SJ_EXPLICIT);
                if (vh < 0) die(sj_strerror());
                vhs.push_back(vh);
            }
            tabs.push_back((uint64_t *)(base + TAB_OFF));
        }
        if (!ov) {
            sj_vh_t vh = sj_vas_attach(one, SJ_EXPLICIT);
            if (vh < 0) die(sj_strerror());
            vhs.push_back(vh);
            if (sj_vas_switch(vh) < 0) die(sj_strerror());
        }
        for (int w = 0; w < windows; w++) {
            enter(w);
            touch(tabs[w]);
        }
    }
    void enter(int w) override {
        if (overlap && sj_vas_switch(vhs[w]) < 0) die(sj_strerror());
    }
    uint64_t apply(int w, int u, uint64_t &r) override { return update_set(tabs[w], u, r); }
    ~Segments() {
        sj_vas_switch(SJ_PRIMARY);
        for (sj_vh_t vh : vhs) sj_vas_detach(vh);
        for (auto &n : names) sj_seg_free(n.c_str());
    }
};

// The tmpfs file of window `w` (named for the process that runs the experiment).
static std::string window_file(const std::string &dir, int w) {
    static const pid_t owner = getpid();
    return dir + "/cairn-bench-gups-" + std::to_string(owner) + "-" + std::to_string(w);
}

// A new window file, filled and collapsed into 2 MiB folios as Cairn's resident copies
// are (mapping it costs then what mapping a segment costs).
static void make_window(const std::string &path);

static uint64_t *map_window(const std::string &path, bool create) {
    int fd = open(path.c_str(), O_RDWR | (create ? O_CREAT | O_TRUNC : 0), 0600);
    if (fd < 0) die("open a window file");
    if (create && ftruncate(fd, WIN) < 0) die("ftruncate");
    void *p = mmap(nullptr, WIN, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) die("mmap a window");
    return (uint64_t *)((char *)p + TAB_OFF);
}

static void make_window(const std::string &path) {
    uint64_t *t = map_window(path, true);
    touch(t);
    char *m = (char *)t - TAB_OFF;
    for (size_t at = 0; at < WIN; at += 2 << 20) madvise(m + at, 2 << 20, MADV_COLLAPSE);
    munmap(m, WIN);
}

struct Map : GupsSys {
    std::string dir;
    int windows, cur = -1;
    uint64_t *tab = nullptr;
    Map(int n, const std::string &d) : dir(d), windows(n) {
        for (int w = 0; w < n; w++) make_window(window_file(dir, w));
    }
    void enter(int w) override {
        if (w == cur) return;
        if (tab) munmap((char *)tab - TAB_OFF, WIN);
        tab = map_window(window_file(dir, w), false);
        cur = w;
    }
    uint64_t apply(int, int u, uint64_t &r) override { return update_set(tab, u, r); }
    ~Map() {
        if (tab) munmap((char *)tab - TAB_OFF, WIN);
        for (int w = 0; w < windows; w++) unlink(window_file(dir, w).c_str());
    }
};

static long futex(std::atomic<uint32_t> *a, int op, uint32_t v,
                  const struct timespec *t = nullptr) {
    return syscall(SYS_futex, (uint32_t *)a, op, v, t, nullptr, 0);
}

// A process per window; a master hands each update set to the window's owner.
struct Mp : GupsSys {
    struct Mail {
        std::atomic<uint32_t> go, done;
        int u;
        uint64_t r, sum;
        char pad[40];
    };
    Mail *mail;
    std::vector<pid_t> kids;
    std::string dir;
    int windows;
    Mp(int n, const std::string &d) : dir(d), windows(n) {
        mail = (Mail *)mmap(nullptr, sizeof(Mail) * n, PROT_READ | PROT_WRITE,
                            MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (mail == MAP_FAILED) die("mmap");
        for (int w = 0; w < n; w++) {
            new (&mail[w]) Mail();
            make_window(window_file(dir, w));
        }
        for (int w = 0; w < n; w++) {
            pid_t p = fork();
            if (p < 0) die("fork");
            if (p == 0) {
                uint64_t *t = map_window(window_file(dir, w), false);
                Mail &m = mail[w];
                uint32_t seen = 0;
                for (;;) {
                    while (m.go.load() == seen) futex(&m.go, FUTEX_WAIT, seen);
                    seen = m.go.load();
                    if (m.u < 0) _exit(0);
                    m.sum = update_set(t, m.u, m.r);
                    m.done.store(seen);
                    futex(&m.done, FUTEX_WAKE, 1);
                }
            }
            kids.push_back(p);
        }
    }
    void enter(int) override {}
    uint64_t apply(int w, int u, uint64_t &r) override {
        Mail &m = mail[w];
        m.u = u;
        m.r = r;
        uint32_t seq = m.go.load() + 1;
        m.go.store(seq);
        futex(&m.go, FUTEX_WAKE, 1);
        while (m.done.load() != seq) {
            struct timespec second = {1, 0};
            if (futex(&m.done, FUTEX_WAIT, m.done.load(), &second) < 0 && errno == ETIMEDOUT &&
                waitpid(kids[w], nullptr, WNOHANG) != 0)
                die("a window's process died");
        }
        r = m.r;
        return m.sum;
    }
    ~Mp() {
        for (int w = 0; w < windows; w++) {
            mail[w].u = -1;
            mail[w].go.fetch_add(1);
            futex(&mail[w].go, FUTEX_WAKE, 1);
        }
        for (pid_t p : kids) waitpid(p, nullptr, 0);
        for (int w = 0; w < windows; w++) unlink(window_file(dir, w).c_str());
    }
};

// Sets of `u` updates (for each `u` of `us`), each in a window chosen at random (another
// than the last when there are several): a fixed number of sets first, for the check sum
// every system must agree on (all of them first, over tables that start at zero), then
// as many as `secs` seconds allow, timed.
static void gups(const std::string &sys, int windows, const std::vector<int> &us, double secs,
                 const std::string &dir) {
    // One CPU for every process of every system (MP's hand-off as the brief measured it:
    // a futex wake-up on the same CPU costs microseconds, across this VM's vCPUs tens).
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(0, &one);
    sched_setaffinity(0, sizeof one, &one);
    GupsSys *s;
    if (sys == "flat" || sys == "switch") {
        s = new Segments(windows, sys == "switch");
    } else if (sys == "map") {
        s = new Map(windows, dir);
    } else if (sys == "mp") {
        s = new Mp(windows, dir);
    } else {
        die("unknown GUPS system");
    }
    uint64_t r = 88172645463325252ULL;
    int cur = -1;
    auto next = [&]() {
        int w = windows == 1 ? 0 : (int)(xorshift(r) % (windows - 1));
        if (windows > 1 && cur >= 0 && w >= cur) w++;
        if (w != cur) s->enter(w);
        cur = w;
        return w;
    };
    std::vector<uint64_t> checks;
    for (int u : us) {
        uint64_t check = 0;
        for (int i = 0; i < 2000; i++) {
            int w = next();
            check += s->apply(w, u, r);
        }
        checks.push_back(check);
    }
    for (size_t k = 0; k < us.size(); k++) {
        int u = us[k];
        uint64_t sets = 0, changes = 0, t0 = now_ns(), t1;
        do {
            for (int i = 0; i < 16; i++) {
                int before = cur;
                int w = next();
                changes += w != before;
                s->apply(w, u, r);
            }
            sets += 16;
            t1 = now_ns();
        } while ((double)(t1 - t0) < secs * 1e9);
        double el = (double)(t1 - t0) / 1e9;
        // The check sum's low 52 bits (a double holds them exactly).
        printf("mups_%d %.4f changes_per_s_%d %.1f check_%d %llu\n", u,
               (double)sets * u / el / 1e6, u, (double)changes / el, u,
               (unsigned long long)(checks[k] & ((1ULL << 52) - 1)));
    }
    delete s;
}

int main(int argc, char **argv) {
    if (argc >= 7 && strcmp(argv[1], "pmdk-commit") == 0) {
        pmdk_commit(atoi(argv[2]), atol(argv[3]), atoi(argv[4]), atoi(argv[5]), argv[6]);
        return 0;
    }
    if (argc >= 7 && strcmp(argv[1], "gups") == 0) {
        std::vector<int> us;
        for (char *p = argv[4]; *p;) {
            us.push_back((int)strtol(p, &p, 10));
            if (*p == ',') p++;
        }
        gups(argv[2], atoi(argv[3]), us, atof(argv[5]), argv[6]);
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
