/* qgemv_emulate.cc — runs the dp4a GEMV of src/backend/cuda/qgemv.cu (pass 1 k_qx_digits and
 * pass 2 k_qgemv_dp4a: plain, q/k/v in one launch, the fused RMSNorm, residual add and
 * norm + gate/up + SiLU/GELU, digits from pass 1 or made in the blocks) on the CPU, through the
 * backend's own host code (qg_plan, qg_run, the kcu_qgemv_dp4a_* entry points): the file is
 * compiled as C++ with QG_HOST_EMU, every CUDA thread of a block is a fiber (all on one OS thread,
 * switched at __syncthreads and shuffles, which are warp-collective; between two meetings thread 0
 * runs first, or on every other launch last), dp4a is modelled from the PTX ISA (dp4a.u32.s32:
 * unsigned bytes of a times signed bytes of b), and the outputs are compared with the CPU
 * reference ops (src/backend/cpu: kiln_cpu_rmsnorm_ref, kiln_cpu_matmul_ref, SiLU / GELU, add)
 * within test_cuda_ops' tolerances, over the shapes of its check_qfused_case.
 *
 * What it catches besides wrong values: every device buffer (weights, x, outputs, pass 1's
 * scratch) ends at a guard page and starts after one (a read or write past either end is a
 * SIGSEGV, reported with the buffer and the thread), its slack bytes are checked after each launch;
 * outputs, scratch and shared memory start as NaN (0xff bytes: a -1 digit, a NaN float); dynamic
 * shared memory ends at a guard page; 16-byte loads must be aligned; reads through kcu_ld / the
 * streaming load before griddepcontrol.wait must touch weights only (PDL); __syncthreads and
 * shuffles must be reached by all threads / lanes at the same place (else reported, or a
 * deadlock); every output finite.
 *
 * A development check for machines without a GPU (no races, timing or real hardware); run by
 * tests/test_qgemv_emulate.sh (CTest). Arguments: `quick` (the small shapes only), `all` (also the
 * large cases a default run skips: it takes the Qwen3-0.6B-like shapes at every n only for group
 * 32, the 4096+2G and 8192 columns for one group each). */
#include <cmath>
#include <csignal>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

extern "C" {
#include "backend/cpu/cpu_ops.h"
#include "util/half.h"
}

#include "cuda_shim.h"

/* ---- errors ---- */

static int qe_errors = 0; /* in the current case */
static char qe_label[200];
static void qe_error(const char *fmt, ...) {
    if (qe_errors++ < 8) {
        va_list ap;
        va_start(ap, fmt);
        printf("  error (%s, block %u thread %u): ", qe_label, blockIdx.x, threadIdx.x);
        vprintf(fmt, ap);
        printf("\n");
        va_end(ap);
    }
}

/* ---- fibers: the threads of one block ---- */

#if defined(__x86_64__) && !defined(QE_UCONTEXT)
/* saves the callee-saved registers on the current stack, stores its pointer in *save, switches
 * to the stack `to` and pops its registers (System V x86-64) */
extern "C" void qe_switch_sp(void **save, void *to);
asm(".text\n"
    ".globl qe_switch_sp\n"
    ".type qe_switch_sp, @function\n"
    "qe_switch_sp:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size qe_switch_sp, .-qe_switch_sp\n");
struct qe_ctx {
    void *sp;
};
static void qe_ctx_init(qe_ctx &c, char *stack, size_t size, void (*entry)()) {
    void **sp = (void **)(((uintptr_t)(stack + size)) & ~(uintptr_t)15);
    *--sp = nullptr;                             /* entry's return address: it never returns */
    *--sp = (void *)entry;                       /* where the first switch returns to */
    for (int i = 0; i < 6; i++) *--sp = nullptr; /* rbp rbx r12..r15 */
    c.sp = sp;
}
static void qe_ctx_switch(qe_ctx &from, qe_ctx &to) {
    qe_switch_sp(&from.sp, to.sp);
}
#else
#include <ucontext.h>
struct qe_ctx {
    ucontext_t uc;
};
static void qe_ctx_init(qe_ctx &c, char *stack, size_t size, void (*entry)()) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack;
    c.uc.uc_stack.ss_size = size;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, entry, 0);
}
static void qe_ctx_switch(qe_ctx &from, qe_ctx &to) {
    swapcontext(&from.uc, &to.uc);
}
#endif

#define QE_THREADS 256 /* most threads per block */
#define QE_STACK   (256 << 10)
struct qe_fiber {
    qe_ctx ctx;
    char *stack;
    bool done;
    bool waited;               /* passed griddepcontrol.wait */
    int shfl_side;             /* which of the two shuffle buffers the next shuffle uses */
    int cl_arrived, cl_waited; /* cluster barrier: arrivals and waits so far */
};
static qe_fiber qe_fib[QE_THREADS];
static qe_ctx qe_sched;
static int qe_cur;
static bool qe_progress;
static void (*qe_body_fn)(void *);
static void *qe_body_ctx;

struct qe_bar {
    int expected, count, site;
    unsigned gen;
};
static qe_bar qe_block_bar, qe_warp_bar[QE_THREADS / 32];

static void qe_yield() {
    qe_ctx_switch(qe_fib[qe_cur].ctx, qe_sched);
}

/* arrive at b (from call site `site`) and wait until expected threads have */
static void qe_bar_wait(qe_bar &b, int site, const char *what) {
    if (b.count == 0)
        b.site = site;
    else if (b.site != site)
        qe_error("%s reached at different places (%d, %d) by the threads meeting there", what,
                 b.site, site);
    qe_progress = true;
    const unsigned gen = b.gen;
    if (++b.count == b.expected) {
        b.count = 0, b.gen++;
        return;
    }
    while (b.gen == gen) qe_yield();
    qe_progress = true;
}

static void qe_release_if_complete(qe_bar &b) {
    if (b.count > 0 && b.count == b.expected) b.count = 0, b.gen++;
}

static void qe_thread_exit() {
    qe_bar &w = qe_warp_bar[t_warp];
    w.expected--;
    if (w.count > 0) qe_error("a lane exits while its warp waits in a shuffle");
    qe_release_if_complete(w);
    qe_block_bar.expected--; /* exited threads no longer count at __syncthreads */
    qe_release_if_complete(qe_block_bar);
}

static void qe_entry() {
    qe_body_fn(qe_body_ctx);
    qe_thread_exit();
    qe_fib[qe_cur].done = true;
    qe_yield();
    abort(); /* never resumed */
}

static void __syncthreads_at(int line) {
    qe_bar_wait(qe_block_bar, line, "__syncthreads");
}
#define __syncthreads() __syncthreads_at(__LINE__)

/* __shfl_xor_sync: two buffers per warp, used alternately, so one meeting per shuffle suffices (a
 * lane cannot write a buffer again before every lane has read it: that takes the next meeting) */
static float qe_shfl[QE_THREADS / 32][2][32];
static float __shfl_xor_sync(unsigned mask, float v, int m) {
    const int w = t_warp, l = t_lane, side = qe_fib[threadIdx.x].shfl_side;
    if (mask != 0xffffffffu) qe_error("shuffle with mask %08x", mask);
    if (qe_warp_bar[w].expected != 32) qe_error("full-mask shuffle in a warp with exited lanes");
    if (m < 0 || m > 31) qe_error("shuffle xor %d", m);
    qe_shfl[w][side][l] = v;
    qe_bar_wait(qe_warp_bar[w], m, "shuffle (site: its xor mask)");
    qe_fib[threadIdx.x].shfl_side = side ^ 1;
    return qe_shfl[w][side][l ^ (m & 31)];
}

/* ---- device memory: guarded, poisoned buffers ---- */

enum qe_kind { QE_WEIGHTS, QE_DATA };
struct qe_alloc {
    char *map;
    size_t map_len;
    char *lo, *hi; /* the writable pages */
    char *p;
    size_t n;
    qe_kind kind;
    const char *name;
};
static std::vector<qe_alloc> qe_allocs;
static size_t qe_page;

/* n bytes aligned to `align` that end at a guard page (less the alignment slack) and start after
 * one; the whole writable span is 0xff, then init (if any) is copied in */
static void *qe_dev_alloc(size_t n, size_t align, qe_kind kind, const char *name,
                          const void *init = nullptr) {
    const size_t span = (n + align + qe_page - 1) / qe_page * qe_page;
    char *map = (char *)mmap(nullptr, span + 2 * qe_page, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    mprotect(map, qe_page, PROT_NONE);
    mprotect(map + qe_page + span, qe_page, PROT_NONE);
    qe_alloc a;
    a.map = map, a.map_len = span + 2 * qe_page;
    a.lo = map + qe_page, a.hi = map + qe_page + span;
    a.p = (char *)(((uintptr_t)a.hi - n) & ~(uintptr_t)(align - 1));
    a.n = n, a.kind = kind, a.name = name;
    memset(a.lo, 0xff, span);
    if (init) memcpy(a.p, init, n);
    qe_allocs.push_back(a);
    return a.p;
}
static void qe_dev_free(const void *p) {
    for (size_t i = 0; i < qe_allocs.size(); i++)
        if (qe_allocs[i].p == p) {
            munmap(qe_allocs[i].map, qe_allocs[i].map_len);
            qe_allocs.erase(qe_allocs.begin() + (long)i);
            return;
        }
}
static const qe_alloc *qe_find(const void *p) {
    for (auto &a : qe_allocs)
        if ((const char *)p >= a.map && (const char *)p < a.map + a.map_len) return &a;
    return nullptr;
}
/* the slack around every buffer still 0xff (nothing wrote outside a buffer) */
static void qe_check_slack(const char *kernel) {
    for (auto &a : qe_allocs) {
        for (const char *c = a.lo; c < a.p; c++)
            if ((unsigned char)*c != 0xff) {
                qe_error("%s wrote %td bytes before %s", kernel, a.p - c, a.name);
                break;
            }
        for (const char *c = a.p + a.n; c < a.hi; c++)
            if ((unsigned char)*c != 0xff) {
                qe_error("%s wrote %td bytes past the end of %s", kernel, c - (a.p + a.n), a.name);
                break;
            }
    }
}

/* shared memory: the dynamic array ends at a guard page; the static ones register themselves and
 * are poisoned before every block */
static char *qe_smem_map, *qe_smem_end;
static uint4 *qe_smem;
static size_t qe_smem_bytes;
#define QE_SMEM_MAX (64 << 10)
struct qe_shared_reg {
    void *p;
    size_t n;
};
static std::vector<qe_shared_reg> qe_shared_regs;
static bool qe_register_shared(void *p, size_t n) {
    memset(p, 0xff, n);
    qe_shared_regs.push_back({p, n});
    return true;
}
#define QG_SHARED(type, name, dims)                                                                \
    alignas(16) static type name dims;                                                             \
    static const bool name##_qe_reg = qe_register_shared(name, sizeof name);                       \
    (void)name##_qe_reg
#define QG_DYN_SHARED(name) uint4 *const name = qe_smem
/* the groups qg_emit digitized since the last qe_emits_once: a block of each, once */
static std::vector<int> qe_emitted;
#define QG_EMITS_GROUP(grp)                                                                        \
    do {                                                                                           \
        if ((size_t)(grp) >= qe_emitted.size()) qe_emitted.resize((size_t)(grp) + 1, 0);           \
        qe_emitted[(size_t)(grp)]++;                                                               \
    } while (0)

static const char *qe_kernel = "";
static void qe_on_segv(int, siginfo_t *si, void *) {
    const char *addr = (const char *)si->si_addr;
    char msg[400];
    const char *what = "an unknown address";
    char buf[200];
    if (const qe_alloc *a = qe_find(addr)) {
        snprintf(buf, sizeof buf, "%td bytes %s %s (%zu bytes)",
                 addr < a->p ? a->p - addr : addr - (a->p + a->n),
                 addr < a->p ? "before" : "past the end of", a->name, a->n);
        what = buf;
    } else if (addr >= qe_smem_end && addr < qe_smem_end + qe_page) {
        snprintf(buf, sizeof buf, "%td bytes past the %zu bytes of dynamic shared memory",
                 addr - qe_smem_end, qe_smem_bytes);
        what = buf;
    }
    const int len =
        snprintf(msg, sizeof msg, "FAIL %s: %s (block %u thread %u) touched %s: out of bounds\n",
                 qe_label, qe_kernel, blockIdx.x, threadIdx.x, what);
    if (len > 0) (void)!write(1, msg, (size_t)len);
    _exit(1);
}

/* ---- the device functions the kernel file takes from cuda_common.cuh / gemv.cuh ---- */

static float rsqrtf(float x) {
    return 1.0f / sqrtf(x);
}

/* a read through the read-only paths: aligned, and before griddepcontrol.wait only of weights */
static void qe_ro_read(const void *p, size_t bytes, const char *how) {
    if ((uintptr_t)p % bytes) qe_error("%s of %zu bytes at %p: misaligned", how, bytes, p);
    if (!qe_fib[threadIdx.x].waited) {
        const qe_alloc *a = qe_find(p);
        if (!a || a->kind != QE_WEIGHTS)
            qe_error("%s before griddepcontrol.wait reads %s", how, a ? a->name : "unknown memory");
    }
}
/* cuda_common.cuh's coherent load of what earlier kernels wrote (activations, scratch) */
template <typename T> static T kcu_ld(const T *p) {
    qe_ro_read(p, sizeof(T), "ld.global");
    return *p;
}
static uint4 kcu_load_stream16(const void *p) {
    qe_ro_read(p, 16, "ld.global.nc.v4");
    uint4 v;
    memcpy(&v, p, 16);
    return v;
}
static float kcu_bf16(uint16_t h) {
    return kiln_bf16_to_f32(h);
}
static float kcu_f16(uint16_t h) {
    return kiln_f16_to_f32(h);
}
static int min(int a, int b) {
    return a < b ? a : b;
}
static void kcu_pdl_wait() {
    qe_fib[threadIdx.x].waited = true;
}
static void kcu_pdl_trigger() {}
#define KCU_PDL_ENTER()                                                                            \
    do {                                                                                           \
        kcu_pdl_wait();                                                                            \
        kcu_pdl_trigger();                                                                         \
    } while (0)
static float kcu_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static float kcu_tanh(float x) { /* as cuda_common.cuh, with expf for __expf */
    float a = fabsf(x);
    float t = a > 9.0f ? 1.0f : 1.0f - 2.0f / (expf(2.0f * a) + 1.0f);
    if (a < 0.004f) t = a * (1.0f - a * a * (1.0f / 3.0f));
    return copysignf(t, x);
}
static float kcu_glu_act(float g, int act) { /* as gemv.cuh */
    if (act == KILN_GLU_GELU_TANH) {
        const float k0 = 0.7978845608028654f;
        return 0.5f * g * (1.0f + kcu_tanh(k0 * (g + 0.044715f * g * g * g)));
    }
    return g / (1.0f + expf(-g));
}
/* dp4a.u32.s32 d, a, b, c: d = c + sum over bytes i of (unsigned) a_i * (signed) b_i */
static int qg_dp4a(uint32_t a, uint32_t b, int acc) {
    int64_t d = acc;
    for (int i = 0; i < 4; i++) d += (int64_t)((a >> 8 * i) & 0xff) * (int8_t)(b >> 8 * i);
    return (int)(uint32_t)d; /* 32-bit wrap, as the hardware */
}

/* the arrival count and L2 read of qg_emit (blocks run one after another here) */
static unsigned qg_arrive_acq_rel(unsigned *p) {
    return (*p)++;
}
static float __ldcg(const float *p) {
    return kcu_ld(p);
}

/* Thread-block clusters (qg_emit_cluster). Blocks run one after another here, a cluster's from
 * its last rank down to its leader (rank 0), so the leader's wait for the others' arrivals (with
 * release semantics, after their stores) finds them all, and a leader run before the others
 * would deadlock (reported). The leader's array that every block of the cluster stores into is
 * one buffer, poisoned when the cluster's first block starts. Each thread must alternate arrive
 * and wait, starting with an arrival; a store to the leader only after the first wait. */
static int qe_cluster_dim = 1, qe_cluster_launches = 0;
static int qe_spanning_emits = 0; /* launches emitting groups that span blocks */
static float qe_cluster_vals[8][32];
static int qe_cluster_arrivals; /* second arrivals in the current cluster */
static unsigned qg_cluster_rank() {
    return blockIdx.x % (unsigned)qe_cluster_dim;
}
static void qe_cluster_arrive() {
    qe_fiber &f = qe_fib[threadIdx.x];
    if (f.cl_arrived != f.cl_waited) qe_error("cluster barrier: arrives again before waiting");
    if (++f.cl_arrived == 2) qe_cluster_arrivals++;
    qe_progress = true;
}
static void qg_cluster_arrive_relaxed() {
    qe_cluster_arrive();
}
static void qg_cluster_arrive_release() {
    qe_cluster_arrive();
}
static void qg_cluster_wait() {
    qe_fiber &f = qe_fib[threadIdx.x];
    if (f.cl_arrived != f.cl_waited + 1) qe_error("cluster barrier: waits without arriving");
    if (f.cl_arrived == 2) /* every thread of the cluster's blocks (none exits before arriving) */
        while (qe_cluster_arrivals < qe_cluster_dim * (int)blockDim.x) qe_yield();
    f.cl_waited++;
    qe_progress = true;
}
static void qg_cluster_store(float *p, unsigned rank, float v) {
    if (qe_cluster_dim < 2) qe_error("distributed shared memory store outside a cluster launch");
    if (rank != 0) qe_error("store to block %u of the cluster (only the leader is modelled)", rank);
    if (qe_fib[threadIdx.x].cl_waited < 1) qe_error("store to the leader before the first wait");
    if (p < &qe_cluster_vals[0][0] || p >= &qe_cluster_vals[0][0] + 8 * 32)
        qe_error("store outside the leader's array");
    else
        *p = v;
}
#define QG_CLUSTER_SHARED(type, name, dims) type(&name) dims = qe_cluster_vals

/* ---- the host side the kernel file takes from cuda_common.cuh ---- */

struct qg_link;
struct kcu_state {
    int n_sms;
    bool pdl_on;
    bool sm90 = true;
    unsigned long long launch_seq = 0; /* bumped by the driver to model a CUDA call between ops */
    struct qg_link *qg_link = nullptr;
};
static bool qe_qfused = true;
bool kcu_qfused_enabled(void) {
    return qe_qfused;
}
static bool qe_fast =
    false; /* fast mode: one int8 digit of x (~1e-2 relative, as Q8_1; tolerance 5e-2) */
bool kcu_fast_math(void) {
    return qe_fast;
}
static void *qe_scratch;
void *kcu_scratch(kcu_state *, size_t bytes) { /* fresh and poisoned at every call */
    if (qe_scratch) qe_dev_free(qe_scratch);
    qe_scratch = qe_dev_alloc(bytes ? bytes : 1, 256, QE_DATA, "kcu_scratch");
    return qe_scratch;
}
/* the hand-off buffers of qg_link: kept between calls, poisoned (or zeroed) when they grow */
void *kcu_grow(kcu_state *, void **buf, size_t *cap, size_t bytes, bool zeroed) {
    if (bytes <= *cap) return *buf;
    if (*buf) qe_dev_free(*buf);
    *buf = qe_dev_alloc(bytes, 256, QE_DATA, zeroed ? "qg_link counts" : "qg_link digits");
    if (zeroed) memset(*buf, 0, bytes);
    *cap = bytes;
    return *buf;
}
static void kcu_report(kcu_state *, const char *op, const char *msg, const char *file, int line) {
    qe_error("kcu_report %s: %s (%s:%d)", op, msg, file, line);
}
static int qe_launches = 0;
/* threads run in order between meetings, 0 first or (every other launch) last first: a read of
 * what another thread writes in the same phase then sees the poison in one of the two orders */
static bool qe_reverse = false;

/* Runs fn as every thread of every block of a grid of `blocks` blocks of nt threads. */
template <typename Fn>
static void qe_launch(const char *name, unsigned blocks, int nt, size_t smem, Fn fn) {
    if (nt < 32 || nt > QE_THREADS || nt % 32) {
        qe_error("%s: %d threads per block", name, nt);
        return;
    }
    if (smem > QE_SMEM_MAX) {
        qe_error("%s: %zu bytes of dynamic shared memory", name, smem);
        return;
    }
    qe_kernel = name;
    qe_launches++;
    qe_reverse = qe_launches % 2 == 0;
    gridDim = {blocks, 1, 1};
    blockDim = {(unsigned)nt, 1, 1};
    qe_smem_bytes = smem;
    qe_smem = (uint4 *)(qe_smem_end - ((smem + 15) & ~(size_t)15));
    qe_body_fn = [](void *p) { (*(Fn *)p)(); };
    qe_body_ctx = &fn;
    const unsigned C = (unsigned)qe_cluster_dim;
    if (blocks % C) qe_error("%s: %u blocks in clusters of %u", name, blocks, C);
    qe_cluster_launches += C > 1;
    for (unsigned i = 0; i < blocks; i++) {
        const unsigned b = i / C * C + (C - 1 - i % C); /* a cluster's leader last */
        if (i % C == 0) {
            memset(qe_cluster_vals, 0xff, sizeof qe_cluster_vals);
            qe_cluster_arrivals = 0;
        }
        memset(qe_smem_map, 0xff, (size_t)(qe_smem_end - qe_smem_map));
        for (auto &r : qe_shared_regs) memset(r.p, 0xff, r.n);
        qe_block_bar = {nt, 0, -1, 0};
        for (int w = 0; w < nt / 32; w++) qe_warp_bar[w] = {32, 0, -1, 0};
        for (int t = 0; t < nt; t++) {
            qe_fib[t].done = qe_fib[t].waited = false;
            qe_fib[t].shfl_side = qe_fib[t].cl_arrived = qe_fib[t].cl_waited = 0;
            qe_ctx_init(qe_fib[t].ctx, qe_fib[t].stack, QE_STACK, qe_entry);
        }
        blockIdx = {b, 0, 0};
        for (int live = nt; live > 0;) {
            bool moved = false;
            for (int i = 0; i < nt; i++) {
                const int t = qe_reverse ? nt - 1 - i : i;
                if (qe_fib[t].done) continue;
                threadIdx = {(unsigned)t, 0, 0};
                t_warp = t >> 5, t_lane = t & 31;
                qe_cur = t;
                qe_progress = false;
                qe_ctx_switch(qe_sched, qe_fib[t].ctx);
                if (qe_fib[t].done) live--;
                moved |= qe_progress || qe_fib[t].done;
            }
            if (!moved) {
                printf("FAIL %s: %s block %u: deadlock (threads wait at a barrier or shuffle that "
                       "others never reach)\n",
                       qe_label, name, b);
                exit(1);
            }
        }
    }
    qe_check_slack(name);
}
#define KCU_LAUNCH(st, kernel, grid, block, smem, ...)                                             \
    ((void)(st), qe_launch(#kernel, (unsigned)(grid), (int)(block), (size_t)(smem),                \
                           [&] { kernel(__VA_ARGS__); }))
#define KCU_LAUNCHED(st) ((void)(st))

/* The tensor-core kernel's warp-collective instructions, as PTX defines them: every lane
 * publishes its operand, the warp meets, each lane computes its part from all lanes' operands
 * (buffers alternate sides with the shuffles', so one meeting per instruction suffices). */
static const char *qm_ptr[QE_THREADS / 32][2][32];
static uint32_t qm_frag[QE_THREADS / 32][2][32][6];
/* ldmatrix.sync.aligned.m8n8.x4.shared.b16: lane i addresses row i & 7 of matrix i >> 3 (16
 * bytes, 16-byte aligned, in shared memory); thread (g, t) gets bytes 4t..4t+3 of row g of each */
static void qm_ldmatrix_x4(uint32_t (&r)[4], const void *p) {
    const int w = t_warp, l = t_lane, side = qe_fib[threadIdx.x].shfl_side;
    if (qe_warp_bar[w].expected != 32) qe_error("ldmatrix in a warp with exited lanes");
    if ((uintptr_t)p % 16) qe_error("ldmatrix row address %p not 16-byte aligned", p);
    if ((const char *)p < (const char *)qe_smem || (const char *)p + 16 > qe_smem_end)
        qe_error("ldmatrix row address %p outside dynamic shared memory", p);
    qm_ptr[w][side][l] = (const char *)p;
    qe_bar_wait(qe_warp_bar[w], 1000, "ldmatrix");
    qe_fib[threadIdx.x].shfl_side = side ^ 1;
    const int g = l >> 2, t = l & 3;
    for (int j = 0; j < 4; j++) memcpy(&r[j], qm_ptr[w][side][j * 8 + g] + 4 * t, 4);
}
/* mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32, d += A B: A (16x32 u8) from a0 (row g, k
 * 4t..4t+3), a1 (row g+8, same k), a2 (row g, k 16+4t..), a3 (row g+8, k 16+4t..); B (32x8 s8)
 * from b0 (k 4t.., column g), b1 (k 16+4t..); d0 / d1 row g columns 2t / 2t+1, d2 / d3 row g+8 */
static void qm_mma(int (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    const int w = t_warp, l = t_lane, side = qe_fib[threadIdx.x].shfl_side;
    if (qe_warp_bar[w].expected != 32) qe_error("mma in a warp with exited lanes");
    uint32_t *f = qm_frag[w][side][l];
    f[0] = a[0], f[1] = a[1], f[2] = a[2], f[3] = a[3], f[4] = b[0], f[5] = b[1];
    qe_bar_wait(qe_warp_bar[w], 1001, "mma");
    qe_fib[threadIdx.x].shfl_side = side ^ 1;
    const int g = l >> 2, t = l & 3;
    for (int i = 0; i < 4; i++) {
        const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
        int sum = 0;
        for (int k = 0; k < 32; k++) {
            const uint32_t *fa = qm_frag[w][side][(row & 7) * 4 + (k & 15) / 4];
            const uint32_t *fb = qm_frag[w][side][col * 4 + (k & 15) / 4];
            const uint8_t av =
                (uint8_t)(fa[(row >= 8 ? 1 : 0) + (k >= 16 ? 2 : 0)] >> (8 * (k & 3)));
            const int8_t bv = (int8_t)(uint8_t)(fb[4 + (k >= 16 ? 1 : 0)] >> (8 * (k & 3)));
            sum += (int)av * (int)bv;
        }
        d[i] += sum;
    }
}
#define QM_SYNCWARP() qe_bar_wait(qe_warp_bar[t_warp], 1002, "__syncwarp")

#define QG_HOST_EMU 1
#include "backend/cuda/qgemv.cu"

/* ---- driver ---- */

static uint64_t rng = 0x5eed0f9e17u;
static uint64_t rnd_u64() { /* splitmix64 */
    uint64_t x = rng += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static float rnd_uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)((rnd_u64() >> 40) / 16777216.0);
}
static float rnd_normal() {
    const double u1 = ((rnd_u64() >> 11) + 1.0) / 9007199254740993.0;
    const double u2 = (rnd_u64() >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
static std::vector<float> rand_f32(int64_t n, float scale) {
    std::vector<float> v((size_t)n);
    for (auto &f : v) f = scale * rnd_normal();
    return v;
}

/* a quantized matrix on the host (the reference's) and on the "device" (guarded copies) */
struct qe_matrix {
    kiln_matrix host, dev;
    std::vector<uint32_t> codes;
    std::vector<uint16_t> scales, biases;
    std::vector<float> bias;
};
static void make_quant(qe_matrix &m, int bits, int group, kiln_dtype sdt, int64_t rows,
                       int64_t cols, bool with_bias) {
    m.codes.resize((size_t)(rows * cols * bits / 32));
    for (auto &w : m.codes) w = (uint32_t)rnd_u64();
    const size_t groups = (size_t)(rows * (cols / group));
    m.scales.resize(groups), m.biases.resize(groups);
    for (size_t g = 0; g < groups; g++) {
        const float s = rnd_uniform(0.005f, 0.02f);
        const float b = -s * (float)(1 << (bits - 1)) * rnd_uniform(0.8f, 1.2f);
        m.scales[g] = sdt == KILN_DT_BF16 ? kiln_f32_to_bf16(s) : kiln_f32_to_f16(s);
        m.biases[g] = sdt == KILN_DT_BF16 ? kiln_f32_to_bf16(b) : kiln_f32_to_f16(b);
    }
    if (with_bias) m.bias = rand_f32(rows, 0.5f);
    memset(&m.host, 0, sizeof m.host);
    m.host.dtype = KILN_DT_U32;
    m.host.rows = rows, m.host.cols = cols;
    m.host.data = m.codes.data();
    m.host.bits = bits, m.host.group_size = group, m.host.scale_dtype = sdt;
    m.host.scales = m.scales.data(), m.host.biases = m.biases.data();
    m.host.bias = with_bias ? m.bias.data() : nullptr;
    m.dev = m.host;
    m.dev.data = qe_dev_alloc(m.codes.size() * 4, 16, QE_WEIGHTS, "codes", m.codes.data());
    m.dev.scales = qe_dev_alloc(groups * 2, 2, QE_WEIGHTS, "scales", m.scales.data());
    m.dev.biases = qe_dev_alloc(groups * 2, 2, QE_WEIGHTS, "biases", m.biases.data());
    m.dev.bias = with_bias ? (const float *)qe_dev_alloc((size_t)rows * 4, 4, QE_WEIGHTS,
                                                         "output bias", m.bias.data())
                           : nullptr;
}
static void free_quant(qe_matrix &m) {
    qe_dev_free(m.dev.data), qe_dev_free(m.dev.scales), qe_dev_free(m.dev.biases);
    if (m.dev.bias) qe_dev_free(m.dev.bias);
}
static float *dev_copy(const std::vector<float> &v, const char *name) {
    return (float *)qe_dev_alloc(v.size() * 4, 4, QE_DATA, name, v.data());
}
static float *dev_poisoned(int64_t n, const char *name) {
    return (float *)qe_dev_alloc((size_t)n * 4, 4, QE_DATA, name);
}

static int n_cases = 0, n_failed = 0, n_checks = 0;
static double worst_err = 0;
static char results[1024];
static bool case_ok;

/* dev[n] against ref: every element finite, rel L2 <= tol */
static void compare(const char *what, const float *dev, const std::vector<float> &ref, double tol) {
    n_checks++;
    int64_t bad = 0;
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        if (!std::isfinite(dev[i])) bad++;
        const double d = (double)dev[i] - ref[i];
        num += d * d, den += (double)ref[i] * ref[i];
    }
    const double err = bad ? INFINITY : den > 0 ? sqrt(num / den) : sqrt(num);
    const bool ok = bad == 0 && err <= tol;
    if (!ok) {
        case_ok = false;
        printf("  FAIL %s %s: %lld non-finite, rel err %.3g (tol %.1g)\n", what, qe_label,
               (long long)bad, err, tol);
        for (size_t i = 0; i < ref.size() && i < 4; i++)
            printf("    [%zu] got %.9g want %.9g\n", i, dev[i], ref[i]);
    }
    if (std::isfinite(err) && err > worst_err) worst_err = err;
    const size_t l = strlen(results);
    snprintf(results + l, sizeof results - l, " %s %.1e", what, err);
}

static kcu_state g_st = {132, true}; /* an H200 */

/* check_qfused_case of tests/test_cuda_ops.c: matmul_norm over three matrices, the fused and the
 * unfused plain multi-matmul, matmul_norm_glu, matmul_add (its matrix takes the GLU output, padded
 * to whole groups) */
static void qe_case(int bits, int G, kiln_dtype sdt, int64_t cols, const int64_t rows[3], int64_t F,
                    int64_t O, int64_t n, int k) {
    const bool plus_one = k % 2 == 1, bias = k % 3 == 1, no_norm_w = k % 7 == 3;
    const kiln_glu_act act = (k / 2) % 2 ? KILN_GLU_GELU_TANH : KILN_GLU_SILU;
    const int inl = k % 3, pdl = (k / 3) % 2;
    kiln_cuda_set_qgemv_inline(inl);
    kiln_cuda_set_qgemv_dp4a(0, 0, pdl);
    snprintf(qe_label, sizeof qe_label, "%sq%dg%d/%s cols=%lld n=%lld inline=%d pdl=%d",
             qe_fast ? "fast " : "", bits, G, sdt == KILN_DT_BF16 ? "BF16" : "F16", (long long)cols,
             (long long)n, inl, pdl);
    const double tol = qe_fast ? 5e-2 : 1e-5, tol_glu = qe_fast ? 5e-2 : 2e-5;
    qe_errors = 0;
    case_ok = true;
    results[0] = 0;
    const int launches0 = qe_launches;
    const int64_t Fo = (F + G - 1) / G * G; /* matmul_add's cols: whole groups */
    qe_matrix m[3], g, u, o;
    for (int i = 0; i < 3; i++) make_quant(m[i], bits, G, sdt, rows[i], cols, bias && i == 1);
    make_quant(g, bits, G, sdt, F, cols, bias);
    make_quant(u, bits, G, sdt, F, cols, false);
    make_quant(o, bits, G, sdt, O, Fo, bias);
    const std::vector<float> x = rand_f32(n * cols, 1.5f);
    const std::vector<float> nw = no_norm_w ? std::vector<float>() : rand_f32(cols, 0.5f);
    std::vector<float> hn((size_t)(n * cols));
    kiln_cpu_rmsnorm_ref(hn.data(), x.data(), no_norm_w ? nullptr : nw.data(), n, cols, 1e-6f,
                         plus_one);
    float *dx = dev_copy(x, "x");
    float *dnw =
        no_norm_w ? nullptr
                  : (float *)qe_dev_alloc(nw.size() * 4, 4, QE_WEIGHTS, "norm weight", nw.data());
    /* matmul_norm; the fused multi-matmul of x; the same unfused (pass 1, a launch per matrix) */
    for (int mode = 0; mode < 3; mode++) {
        std::vector<float> ref[3];
        float *dy[3];
        const kiln_matrix *ws[3];
        for (int i = 0; i < 3; i++) {
            ref[i].resize((size_t)(n * rows[i]));
            kiln_cpu_matmul_ref(ref[i].data(), mode ? x.data() : hn.data(), n, &m[i].host);
            dy[i] = dev_poisoned(n * rows[i], "y");
            ws[i] = &m[i].dev;
        }
        qe_qfused = mode < 2;
        const bool ran = mode == 0
                             ? kcu_qgemv_dp4a_norm(&g_st, 3, dy, dx, n, ws, dnw, 1e-6f, plus_one)
                             : kcu_qgemv_dp4a_multi(&g_st, 3, dy, dx, n, ws);
        qe_qfused = true;
        if (!ran) qe_error("%s did not apply", mode ? "multi" : "norm");
        for (int i = 0; i < 3; i++) {
            char what[40];
            snprintf(what, sizeof what, "%s%d",
                     mode == 0   ? "norm"
                     : mode == 1 ? "multi"
                                 : "plain",
                     i);
            compare(what, dy[i], ref[i], tol);
            qe_dev_free(dy[i]);
        }
    }
    /* matmul_norm_glu */
    std::vector<float> gr((size_t)(n * F)), ur((size_t)(n * F));
    kiln_cpu_matmul_ref(gr.data(), hn.data(), n, &g.host);
    kiln_cpu_matmul_ref(ur.data(), hn.data(), n, &u.host);
    if (act == KILN_GLU_GELU_TANH)
        kiln_cpu_gelu_tanh_mul(gr.data(), gr.data(), ur.data(), n * F);
    else
        kiln_cpu_silu_mul(gr.data(), gr.data(), ur.data(), n * F);
    float *dout = dev_poisoned(n * F, "glu out");
    if (!kcu_qgemv_dp4a_norm_glu(&g_st, dout, dx, n, &g.dev, &u.dev, dnw, 1e-6f, plus_one,
                                 (int)act))
        qe_error("norm_glu did not apply");
    compare("glu", dout, gr, tol_glu);
    /* matmul_add: y += a @ o^T, a = the GLU output (repeated to Fo columns), with (every third
     * case) a zero 32-column block and blocks scaled by 1e4 and 1e-4 in the first and last token */
    std::vector<float> a((size_t)(n * Fo));
    for (int64_t t = 0; t < n; t++)
        for (int64_t j = 0; j < Fo; j++) a[(size_t)(t * Fo + j)] = gr[(size_t)(t * F + j % F)];
    for (int64_t t = 0; k % 3 == 0 && Fo >= 96 && t < n; t++)
        for (int64_t j = 0; (t == 0 || t == n - 1) && j < 96; j++)
            a[(size_t)(t * Fo + j)] *= j < 32 ? 0.0f : j < 64 ? 1e4f : 1e-4f;
    const std::vector<float> y0 = rand_f32(n * O, 1.0f);
    std::vector<float> yr((size_t)(n * O));
    kiln_cpu_matmul_ref(yr.data(), a.data(), n, &o.host);
    kiln_cpu_add(yr.data(), yr.data(), y0.data(), n * O);
    float *dy0 = dev_copy(y0, "y (add)"), *da = dev_copy(a, "a");
    if (!kcu_qgemv_dp4a_add(&g_st, dy0, da, n, &o.dev)) qe_error("add did not apply");
    compare("add", dy0, yr, tol);
    qe_dev_free(dx), qe_dev_free(dout), qe_dev_free(dy0), qe_dev_free(da);
    if (dnw) qe_dev_free(dnw);
    for (int i = 0; i < 3; i++) free_quant(m[i]);
    free_quant(g), free_quant(u), free_quant(o);
    kiln_cuda_set_qgemv_inline(-1);
    kiln_cuda_set_qgemv_dp4a(-1, -1, -1);
    if (qe_errors) case_ok = false;
    n_cases++;
    n_failed += !case_ok;
    printf("%s %s (%d launches):%s\n", case_ok ? "ok  " : "FAIL", qe_label, qe_launches - launches0,
           results);
    fflush(stdout);
}

/* After a GEMV that may hand its output on (qg_emit): each of its rows/32 groups digitized by
 * exactly one block, or none by any. Blocks run one after another here, so a group whose blocks
 * all digitize (an arrival count too small) still ends with the right digits; the count is what
 * shows it. */
static void qe_emits_once(const char *what, int64_t rows) {
    const size_t groups = (size_t)(rows / 32);
    bool any = false, ok = qe_emitted.size() <= groups;
    for (size_t g = 0; g < qe_emitted.size(); g++) any = any || qe_emitted[g] != 0;
    for (size_t g = 0; ok && any && g < groups; g++)
        ok = g < qe_emitted.size() && qe_emitted[g] == 1;
    n_checks++;
    if (!ok) {
        case_ok = false;
        printf("  FAIL %s %s: its 32-row groups were not each digitized once\n", what, qe_label);
    }
    qe_emitted.clear();
}

/* A link case's end: the pass-1 launches its hinted run skipped against want (when
 * check_launches), the inline mode back to its default, the tally and the case's line. */
static void qe_link_case_end(const int (&launches)[2], int want, bool check_launches) {
    n_checks++;
    if (check_launches && launches[0] - launches[1] != want) {
        case_ok = false;
        printf("  FAIL %s: %d launches unhinted, %d hinted (want %d fewer)\n", qe_label,
               launches[0], launches[1], want);
    }
    const size_t l = strlen(results);
    snprintf(results + l, sizeof results - l, " launches %d -> %d", launches[0], launches[1]);
    kiln_cuda_set_qgemv_inline(-1);
    if (qe_errors) case_ok = false;
    n_cases++;
    n_failed += !case_ok;
    printf("%s %s:%s\n", case_ok ? "ok  " : "FAIL", qe_label, results);
    fflush(stdout);
}

/* qg_link: a Llama decode layer's GEMV chain (o + residual, norm + gate/up, down + residual, the
 * next layer's norm + q/k/v) with the feeds_next hints, against the same chain without them:
 * the outputs must be the same bits (the handed-on digits are pass 1's), and the hinted chain
 * must skip pass 1 where it may (`link` launches fewer). drop: a CUDA call between producer and
 * consumer (launch_seq bumped) must make the consumer run pass 1 again. */
static void qe_link_case(int bits, int G, kiln_dtype sdt, int64_t H, int64_t F, int64_t n, int inl,
                         bool drop) {
    snprintf(qe_label, sizeof qe_label, "%sq%dg%d/%s link %d H=%lld F=%lld n=%lld inline=%d%s",
             qe_fast ? "fast " : "", bits, G, sdt == KILN_DT_BF16 ? "BF16" : "F16", g_qg_link,
             (long long)H, (long long)F, (long long)n, inl, drop ? " dropped" : "");
    qe_errors = 0;
    case_ok = true;
    results[0] = 0;
    kiln_cuda_set_qgemv_inline(inl);
    qe_matrix wo, wg, wu, wd, wq[3];
    make_quant(wo, bits, G, sdt, H, H, false);
    make_quant(wg, bits, G, sdt, F, H, false);
    make_quant(wu, bits, G, sdt, F, H, true);
    make_quant(wd, bits, G, sdt, H, F, false);
    const int64_t qrows[3] = {H, H / 4, H / 4};
    for (int i = 0; i < 3; i++) make_quant(wq[i], bits, G, sdt, qrows[i], H, i == 0);
    const std::vector<float> h0 = rand_f32(n * H, 1.0f), attn = rand_f32(n * H, 0.5f);
    const std::vector<float> n1 = rand_f32(H, 0.5f), n2 = rand_f32(H, 0.5f);
    float *dn1 = (float *)qe_dev_alloc(H * 4, 4, QE_WEIGHTS, "ffn norm", n1.data());
    float *dn2 = (float *)qe_dev_alloc(H * 4, 4, QE_WEIGHTS, "attn norm", n2.data());
    float *dattn = dev_copy(attn, "attn");
    std::vector<float> out[2][5]; /* per run: h after o, gate out, h after down, q, k */
    int launches[2];
    for (int hinted = 0; hinted < 2; hinted++) {
        float *dh = dev_copy(h0, "h"), *dgate = dev_poisoned(n * F, "gate out");
        float *dq[3];
        for (int i = 0; i < 3; i++) dq[i] = dev_poisoned(n * qrows[i], "q/k/v");
        const kiln_matrix *qw[3] = {&wq[0].dev, &wq[1].dev, &wq[2].dev};
        const int l0 = qe_launches;
        qe_cluster_launches = qe_spanning_emits = 0;
        if (hinted) kcu_qg_hint(&g_st, dh, dn1, false);
        qe_emitted.clear();
        bool ok = kcu_qgemv_dp4a_add(&g_st, dh, dattn, n, &wo.dev);
        qe_emits_once("o", H);
        out[hinted][0].assign(dh, dh + n * H);
        if (hinted) kcu_qg_hint(&g_st, dgate, nullptr, false);
        if (drop) g_st.launch_seq++;
        ok = ok && kcu_qgemv_dp4a_norm_glu(&g_st, dgate, dh, n, &wg.dev, &wu.dev, dn1, 1e-6f, false,
                                           KILN_GLU_SILU);
        qe_emits_once("gate/up", F);
        out[hinted][1].assign(dgate, dgate + n * F);
        if (hinted) kcu_qg_hint(&g_st, dh, dn2, true);
        ok = ok && kcu_qgemv_dp4a_add(&g_st, dh, dgate, n, &wd.dev);
        qe_emits_once("down", H);
        out[hinted][2].assign(dh, dh + n * H);
        ok = ok && kcu_qgemv_dp4a_norm(&g_st, 3, dq, dh, n, qw, dn2, 1e-6f, true);
        out[hinted][3].assign(dq[0], dq[0] + n * qrows[0]);
        out[hinted][4].assign(dq[1], dq[1] + n * qrows[1]);
        launches[hinted] = qe_launches - l0;
        /* link 2: every emitting GEMV whose 32-row groups span blocks ran in clusters, and
         * nothing else did */
        n_checks++;
        const int want_clusters = g_qg_link == 2 ? qe_spanning_emits : 0;
        if (qe_cluster_launches != want_clusters ||
            (hinted && g_qg_link == 2 && n == 1 && want_clusters == 0)) {
            case_ok = false;
            printf("  FAIL %s: %d launches in clusters, want %d\n", qe_label, qe_cluster_launches,
                   want_clusters);
        }
        qe_cluster_launches = qe_spanning_emits = 0;
        if (!ok) qe_error("a GEMV of the chain did not apply");
        qe_dev_free(dh), qe_dev_free(dgate);
        for (int i = 0; i < 3; i++) qe_dev_free(dq[i]);
    }
    static const char *names[5] = {"h+o", "glu", "h+down", "q", "k"};
    for (int i = 0; i < 5; i++) {
        n_checks++;
        if (out[0][i].size() != out[1][i].size() ||
            memcmp(out[0][i].data(), out[1][i].data(), out[0][i].size() * 4) != 0) {
            case_ok = false;
            printf("  FAIL %s %s: the hinted chain's output differs\n", names[i], qe_label);
        }
    }
    qe_dev_free(dn1), qe_dev_free(dn2), qe_dev_free(dattn);
    free_quant(wo), free_quant(wg), free_quant(wu), free_quant(wd);
    for (int i = 0; i < 3; i++) free_quant(wq[i]);
    /* pass 1 launches skipped, with the digits never made in the blocks (inline 0; else a
     * consumer may make its own, by grid size): all three; the call dropped before glu also
     * voids the hint given before it (glu's output is not handed on to down), which leaves
     * down -> q/k/v */
    qe_link_case_end(launches, drop ? 1 : 3, inl == 0);
}

/* qg_link with a producer that is not a GEMV (decode attention: kcu_qg_link_claim /
 * kcu_qg_link_emitted; attention_emulate.cc checks that the kernel's digits are pass 1's bits, so
 * pass 1's kernel stands in for it here), then o = x @ W^T, against the same GEMV unhinted:
 * the same bits, and pass 1 skipped exactly when the hand-off holds. mode 0: it holds; 1: a CUDA
 * call between producer and o voids it; 2: the cache's store launch between hint and attention,
 * carried (kcu_qg_hint_carry); 3: the same not carried (nothing claimed); 4: the GEMV before
 * attention (whose digit order the producer takes) of the other bit width. */
static void qe_claim_case(int bits, int G, kiln_dtype sdt, int64_t H, int64_t n, int mode) {
    static const char *modes[] = {"holds", "call between", "store carried", "store not carried",
                                  "other order"};
    snprintf(qe_label, sizeof qe_label, "%sq%dg%d attention -> o H=%lld n=%lld: %s",
             qe_fast ? "fast " : "", bits, G, (long long)H, (long long)n, modes[mode]);
    qe_errors = 0;
    case_ok = true;
    results[0] = 0;
    kiln_cuda_set_qgemv_inline(0);
    qe_matrix wo, wprev;
    make_quant(wo, bits, G, sdt, H, H, false);
    make_quant(wprev, mode == 4 ? 12 - bits : bits, G, sdt, 64, H, false);
    const std::vector<float> attn = rand_f32(n * H, 0.5f), xprev = rand_f32(n * H, 1.0f);
    float *dattn = dev_copy(attn, "attn"), *dxprev = dev_copy(xprev, "x before");
    std::vector<float> out[2];
    int launches[2];
    bool claimed = false;
    for (int hinted = 0; hinted < 2; hinted++) {
        float *dy = dev_poisoned(n * H, "o out"), *dprev = dev_poisoned(n * 64, "q out");
        const kiln_matrix *prev = &wprev.dev, *o = &wo.dev;
        kcu_qg_hint(&g_st, nullptr, nullptr, false); /* qg_link exists before the GEMV below */
        bool ok = kcu_qgemv_dp4a_multi(&g_st, 1, &dprev, dxprev, n, &prev);
        if (hinted) {
            kcu_qg_hint(&g_st, dattn, nullptr, false);
            const unsigned long long seq0 = g_st.launch_seq;
            if (mode == 2 || mode == 3) g_st.launch_seq++; /* the cache's store */
            if (mode == 2) kcu_qg_hint_carry(&g_st, dattn, seq0);
            kcu_qx_emit e;
            claimed = kcu_qg_link_claim(&g_st, dattn, n, (int)H, &e);
            if (claimed) {
                const int64_t warps = n * (H / 32);
                KCU_LAUNCH(&g_st, k_qx_digits, (unsigned)((warps + 7) / 8), 256, 0, e.dig, e.E,
                           e.sx16, (const float *)dattn, (int)n, (int)H, e.perm4,
                           (const float *)nullptr, 0, (float *)nullptr, e.nd);
                g_st.launch_seq++; /* the attention launch */
                kcu_qg_link_emitted(&g_st, dattn, n, (int)H, &e);
            }
            if (mode == 1) g_st.launch_seq++;
        }
        const int l0 = qe_launches;
        ok = ok && kcu_qgemv_dp4a_multi(&g_st, 1, &dy, dattn, n, &o);
        launches[hinted] = qe_launches - l0;
        if (!ok) qe_error("a GEMV did not apply");
        out[hinted].assign(dy, dy + n * H);
        qe_dev_free(dy), qe_dev_free(dprev);
    }
    n_checks += 2;
    if (claimed != (mode != 3)) {
        case_ok = false;
        printf("  FAIL %s: the producer %s a hand-off buffer\n", qe_label,
               claimed ? "claimed" : "did not claim");
    }
    if (memcmp(out[0].data(), out[1].data(), out[0].size() * 4) != 0) {
        case_ok = false;
        printf("  FAIL %s: o's output differs from the unhinted GEMV's\n", qe_label);
    }
    qe_dev_free(dattn), qe_dev_free(dxprev);
    free_quant(wo), free_quant(wprev);
    qe_link_case_end(launches, mode == 0 || mode == 2 ? 1 : 0, true);
}

/* where the dp4a kernel does not apply, the entry points return false and launch nothing (the
 * caller composes plain ops): gate and up of different formats; a matrix whose cols are not whole
 * groups (upload_matrix refuses it; test_cuda_ops' matmul_add used one, 77 columns at group 32,
 * before its cols were rounded up) */
static void qe_declines() {
    snprintf(qe_label, sizeof qe_label, "does not apply");
    qe_errors = 0;
    qe_matrix g, u, o;
    make_quant(g, 4, 32, KILN_DT_F16, 64, 256, false);
    make_quant(u, 8, 64, KILN_DT_BF16, 64, 256, false);
    make_quant(o, 4, 32, KILN_DT_BF16, 41, 77, false);
    const std::vector<float> x = rand_f32(256, 1.0f);
    float *dx = dev_copy(x, "x"), *dout = dev_poisoned(64, "out");
    const int l0 = qe_launches;
    const bool glu =
        kcu_qgemv_dp4a_norm_glu(&g_st, dout, dx, 1, &g.dev, &u.dev, nullptr, 1e-6f, false, 0);
    const bool add = kcu_qgemv_dp4a_add(&g_st, dout, dx, 1, &o.dev);
    const bool ok = !glu && !add && qe_launches == l0 && qe_errors == 0;
    n_cases++, n_checks += 2;
    n_failed += !ok;
    printf("%s q4 gate + q8 up norm_glu: %s; q4g32 77-column add: %s\n", ok ? "ok  " : "FAIL",
           glu ? "ran" : "declined", add ? "ran" : "declined");
    qe_dev_free(dx), qe_dev_free(dout);
    free_quant(g), free_quant(u), free_quant(o);
}

int main(int argc, char **argv) {
    const bool quick = argc > 1 && strcmp(argv[1], "quick") == 0;
    const bool all = argc > 1 && strcmp(argv[1], "all") == 0;
    qe_page = (size_t)sysconf(_SC_PAGESIZE);
    /* fiber stacks (a guard page below each), dynamic shared memory (a guard page after) */
    for (auto &f : qe_fib) {
        char *s = (char *)mmap(nullptr, QE_STACK + qe_page, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (s == MAP_FAILED) return perror("mmap"), 2;
        mprotect(s, qe_page, PROT_NONE);
        f.stack = s + qe_page;
    }
    qe_smem_map = (char *)mmap(nullptr, QE_SMEM_MAX + qe_page, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (qe_smem_map == MAP_FAILED) return perror("mmap"), 2;
    qe_smem_end = qe_smem_map + QE_SMEM_MAX;
    mprotect(qe_smem_end, qe_page, PROT_NONE);
    static char altstack[1 << 16];
    stack_t ss = {};
    ss.ss_sp = altstack, ss.ss_size = sizeof altstack;
    sigaltstack(&ss, nullptr);
    struct sigaction sa = {};
    sa.sa_sigaction = qe_on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigaction(SIGSEGV, &sa, nullptr);
    sigaction(SIGBUS, &sa, nullptr);

    /* test_qgemv_fused's cases, in its order (k: its case counter, which picks the inline mode,
     * PDL, (1 + w), biases, absent norm weights and the activation) */
    static const int bits[] = {4, 8};
    static const int groups[] = {32, 64, 128};
    const kiln_dtype sdts[] = {KILN_DT_BF16, KILN_DT_F16};
    int k = 0;
    for (int b = 0; b < 2; b++)
        for (int gi = 0; gi < 3; gi++) {
            const int G = groups[gi];
            const kiln_dtype sdt = sdts[(b + gi) % 2];
            const int64_t small[3] = {13, 7, 130};
            for (int64_t n = 1; n <= 8; n++, k++)
                qe_case(bits[b], G, sdt, 3 * G, small, 77, 41, n, k);
            const int64_t qkv[3] = {2048, 1024, 1024};
            const int64_t odd[3] = {259, 61, 3};
            for (int i = 0; i < 5; i++, k++)
                if (!quick && (all || G == 32 || i == 1))
                    qe_case(bits[b], G, sdt, 1024, qkv, 3072, 1024, i < 3 ? 1 : 2 + 3 * (i - 3), k);
            if (!quick && (all || gi == 0))
                qe_case(bits[b], G, sdt, 4096 + 2 * G, odd, 515, 129, 1, k);
            k++;
            if (!quick && (all || gi == 1)) qe_case(bits[b], G, sdt, 8192, odd, 33, 17, 1, k);
            k++;
            if (!quick) qe_case(bits[b], G, sdt, 4 * G, odd, 33, 17, 3, k);
            k++;
        }
    /* fast mode (--fast-math: x as one int8 digit per 32 columns), the small cases again */
    qe_fast = true;
    k = 0;
    for (int b = 0; b < 2; b++)
        for (int gi = 0; gi < 3; gi++) {
            const int64_t small[3] = {13, 7, 130};
            for (int64_t n = 1; n <= 8; n++, k++)
                qe_case(bits[b], groups[gi], sdts[(b + gi) % 2], 3 * groups[gi], small, 77, 41, n,
                        k);
        }
    qe_fast = false;
    /* the tensor-core variant (KILN_CUDA_QGEMV_MMA=1; n = 1 only), exact and fast */
    kiln_cuda_set_qgemv_mma(1);
    for (int fast = 0; fast < 2; fast++) {
        qe_fast = fast == 1;
        k = 0;
        for (int b = 0; b < 2; b++)
            for (int gi = 0; gi < 3; gi++) {
                const int G = groups[gi];
                const int64_t small[3] = {13, 7, 130}, odd[3] = {259, 61, 3};
                const int64_t qkv[3] = {2048, 1024, 1024};
                qe_case(bits[b], G, sdts[(b + gi) % 2], 3 * G, small, 77, 41, 1, k++);
                qe_case(bits[b], G, sdts[(b + gi) % 2], 5 * G, small, 77, 41, 1, k++);
                if (!quick && !fast)
                    qe_case(bits[b], G, sdts[(b + gi) % 2], 4096 + 2 * G, odd, 515, 129, 1, k++);
                if (!quick && !fast && gi == 0)
                    qe_case(bits[b], G, sdts[(b + gi) % 2], 1024, qkv, 3072, 1024, 1, k++);
            }
    }
    qe_fast = false;
    kiln_cuda_set_qgemv_mma(-1);
    /* qg_link: the chain with and without hints, exact and fast, at 1..8 tokens; the groups'
     * blocks meeting in global memory (link 1) and as clusters (link 2) */
    for (int link = 1; link <= 2; link++)
        for (int fast = 0; fast < 2; fast++) {
            kiln_cuda_set_qgemv_link(link);
            qe_fast = fast == 1;
            for (int b = 0; b < 2; b++) {
                const kiln_dtype sdt = b ? KILN_DT_F16 : KILN_DT_BF16;
                qe_link_case(bits[b], 64, sdt, 256, 512, 1, 0, false);
                qe_link_case(bits[b], 32, sdt, 256, 512, 3, 0, false);
                qe_link_case(bits[b], 128, sdt, 256, 512, 8, 0, true);
                qe_link_case(bits[b], 64, sdt, 256, 512, 1, 2, false);
                if (!quick && !fast) qe_link_case(bits[b], 64, sdt, 1024, 2048, 1, 2, false);
                if (link == 2) continue; /* attention's emission does not meet in clusters */
                for (int mode = 0; mode < 5; mode++)
                    qe_claim_case(bits[b], 64, sdt, 256, mode == 1 ? 3 : 1 + (mode & 1), mode);
                qe_claim_case(bits[b], 32, sdt, 512, 5, 0);
            }
        }
    qe_fast = false;
    kiln_cuda_set_qgemv_link(-1);
    qe_declines();
    printf("%d cases (%d checks), worst rel err %.2e: %s\n", n_cases, n_checks, worst_err,
           n_failed ? "FAILED" : "all passed");
    return n_failed != 0;
}
