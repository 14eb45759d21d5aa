// kerntune's host SIMT runtime: the GPU kernels of kernels/hip/ compiled as plain C++ and run
// on the CPU, so every GPU config is verified against the reference on machines without a GPU.
//
// A launch runs its blocks one after another on the calling thread. Each thread of a block is
// a fiber with its own stack; a barrier parks the fiber and the block moves on once every
// thread has parked at the same barrier. Warp-wide operations (shuffles, NVIDIA's mma.sync
// and ldmatrix, AMD's MFMA) exchange their operands through the block and park the wave until
// all its lanes arrive, so they are computed from what every lane passed, in the layout the
// vendor documents, and not from what the kernel meant to pass. A block whose threads reach different barriers, or whose
// threads leave while others wait, is an error naming both, where a GPU would hang or compute
// garbage. Hopper's mbarriers park only the waiting thread, until the phase it waits for
// completes (its arrivals, and the bytes of its TMA copies, which land then); a wait that
// nothing can complete is an error naming it.
//
// Shared memory (`KT_SHARED`) is `static thread_local`: one copy per OS thread, shared by the
// fibers of the block it runs. Waves run one at a time between barriers, in alternating order
// (forward, then backward), so a read of shared memory that misses a barrier sees a different
// writer in some phase.
//
// Compiled two ways. With KT_HOST_RUNTIME, once for each set of the macros a unit shares, it
// is the runtime: `launch` and the scheduler under it (running blocks, switching fibers,
// completing barriers, copies and asynchronous products), its other symbols hidden. Without
// it, at the head of every unit of kernels, which links that runtime's object: the unit
// compiles the operations its kernels call and none of the scheduler, which was most of a
// small unit's compile (0.2 of 0.25 s for a unit of one build).
//
// Hand-written rather than a library: no maintained crate or C++ package runs CUDA/HIP-style
// kernel source on a CPU with warp collectives; ucontext (in every glibc) or a few lines of
// assembly switch the fibers.
#pragma once

// The runtime optimized as g++ -O2 does, the kernels after it as the unit's options say (-Og):
// the emulator's time is the runtime's (scheduling fibers, the matrix instructions), a
// unit's compile the kernels'. Clang ignores the pragma and compiles the runtime as the rest.
#pragma GCC push_options
#pragma GCC optimize("O2")

// No standard headers: parsing <cmath> and friends was half of every candidate's compile. The
// few C library functions used are declared here (they are in libc and libm, which every C++
// shared object links), and the compiler treats the math ones as builtins.
extern "C" {
float fmaf(float, float, float);
float fmaxf(float, float);
float exp2f(float);
float tanhf(float);
void* calloc(decltype(sizeof 0), decltype(sizeof 0));
void* malloc(decltype(sizeof 0));
void free(void*);
[[noreturn]] void abort();
int snprintf(char*, decltype(sizeof 0), const char*, ...);
}
#define INFINITY (__builtin_inff())

#ifndef KT_HOST_WAVE
#error "KT_HOST_WAVE (the emulated wave / warp width) must be defined"
#endif

template <typename T>
static inline T min(T a, T b) {
    return b < a ? b : a;
}
template <typename T>
static inline T max(T a, T b) {
    return a < b ? b : a;
}

namespace kt_host {

typedef decltype(sizeof 0) size_t;

constexpr int kMaxThreads = 1024;
// Kernel locals are small arrays (register tiles, one score row): 64 KiB is ample.
constexpr size_t kStack = 64 * 1024;

// Barrier kinds other than a source line's KT_SYNC().
constexpr int kShuffle = -1;
constexpr int kMma = -2;
constexpr int kMfma = -3;
constexpr int kLdmatrix = -4;
constexpr int kWgmma = -5;
// A thread's own wait on an mbarrier phase (not a warp-wide operation).
constexpr int kMbarrier = -6;
// A thread's wgmma.wait_group, parked until every thread of its warpgroup has committed the
// groups it waits for (a warpgroup's products start only once all four warps issued them).
constexpr int kWgmmaWait = -7;

// A thread's barrier.cluster: parked until every thread of every block of its cluster has
// arrived.
constexpr int kClusterSync = -8;

// Sites where a thread waits on its own condition, not for its wave or its block.
constexpr bool own_wait(int site) {
    return site == kMbarrier || site == kWgmmaWait || site == kClusterSync;
}

// Blocks a thread-block cluster may take.
constexpr int kMaxCluster = 2;

// mbarrier objects a block may initialize.
constexpr int kMaxMbarriers = 32;

// wgmma operations a thread may have issued and not yet waited for.
constexpr int kMaxWgmma = 32;

struct Copy {
    void* dst;
    const void* src;
    int bytes;
    int group;
};

// A wgmma k step's depth and its elements' bytes: 16 of 16 bits, or (fp8 builds, m64nNk32)
// 32 bytes, the same 32 bytes of each row.
#if KT_DTYPE == 3 || KT_DTYPE == 4
constexpr int kWgK = 32, kWgBytes = 1;
#else
constexpr int kWgK = 16, kWgBytes = 2;
#endif

// An issued wgmma.mma_async: its accumulators (`n / 2` of this thread's), N, the operand
// descriptors and its commit group; with A from registers (`reg_a`), the thread's two rows
// of A (g and g + 8 of its warp's 16) as its warp's registers held them at the issue, and
// whether B is n-major.
struct Wgmma {
    float* d;
    int n;
    unsigned long long a, b;
    int group;
    bool reg_a;
    bool trans_b;
    float a_rows[2][kWgK];
};

// Rows of A and columns of B of the wgmma operands a wait computes, each decoded from shared
// memory once: every row of A feeds the 4 threads of a warp's quad and every column of B the
// 32 threads of 8 groups in 4 warps, and decoding each element for each of them (its
// descriptor, swizzle and bounds) was most of the wgmma tests' emulated time. `layout` 0 is
// wgmma_elem's k-major reading, 1 wgmma_elem_mn's n-major one; `have[i]` marks line i
// decoded, so only lines some thread reads are read, as each thread would read them. A slot
// for each operand of each operation a thread may have in flight.
constexpr int kWgLines = 256, kWgSlots = 2 * kMaxWgmma;
struct WgDecoded {
    unsigned long long desc;
    int layout;
    bool have[kWgLines];
    float v[kWgLines][kWgK];
};

// A warp's mma.sync operands as values: A's 16 rows and B's 8 columns, K (up to 32) each.
struct MmaOperands {
    float a[16][32];
    float b[8][32];
};

// An mbarrier object, by its shared-window address: arrivals a phase expects, those still
// missing from the current one, and the phases completed so far (the current one's parity is
// `completed & 1`).
struct Mbar {
    unsigned addr;
    int expected;
    int pending;
    int completed;
    // Bytes the phase still expects from the copy engine (arrive.expect_tx adds, landed
    // copies subtract): a phase completes with its arrivals and its bytes.
    long tx;
};

// A TMA box copy issued and not yet landed: its mbarrier, destination, the tensor map's
// description (kt_tmap's words) and the box's coordinates (innermost first; a 2D map's
// third and fourth are 0).
struct Tma {
    unsigned bar;
    unsigned char* dst;
    unsigned long long map[16];
    int at[4];
};

// Bytes of a tensor map's box: words 4, 5, 12 and 13 are its extents (a 2D map's last two
// are 1), word 7 the element's bytes.
inline size_t box_bytes(const unsigned long long* map) {
    return (size_t)(map[4] * map[5] * map[12] * map[13] * map[7]);
}

// TMA copies a block may have in flight.
constexpr int kMaxTma = 64;

enum class State : unsigned char { Ready, Waiting, Done };

}  // namespace kt_host

// Switching fibers. glibc's swapcontext saves the signal mask with a system call on every
// switch, which made barriers the emulator's main cost; on x86-64 a switch saves the
// callee-saved registers on the fiber's stack and swaps stack pointers, nothing more (the
// kernels change no floating-point control state). Elsewhere ucontext does it.
#if defined(__x86_64__) && !defined(KT_HOST_UCONTEXT)
#define KT_HOST_FAST_SWITCH 1
extern "C" void kt_host_switch(void** save_sp, void* load_sp);
asm(R"(
    .text
    .p2align 4
    .hidden kt_host_switch
    .globl kt_host_switch
    .type kt_host_switch, @function
kt_host_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size kt_host_switch, .-kt_host_switch
)");
#else
#define KT_HOST_FAST_SWITCH 0
#include <ucontext.h>
#endif

namespace kt_host {

struct Entry {
    void* fn;
    void (*call)(void* fn, void** params);
};

struct Block;

// What the blocks of one cluster share: each other, and the count of barrier.cluster
// arrivals (a generation ends once every thread of every block has arrived).
struct Cluster {
    Block* blocks[kMaxCluster];
    int size;
    int arrived;
    int generation;
};

struct Block {
    const Entry* entry;
    void** params;
    int threads;
    unsigned bid[3];
    int current;
    bool failed;
    char message[512];
    // Its cluster (a cluster of one without clusters) and its rank there.
    Cluster* cluster;
    int rank;
    // The kernel's dynamic shared memory, this block's own (blocks of a cluster run at once).
    unsigned char* dyn;
    size_t dyn_bytes;
    // Rounds run, and fiber switches so far (a cluster's blocks stop when none switched).
    int phase;
    unsigned long switches;
    // The barrier.cluster generation each thread parked at kClusterSync waits to end.
    int cluster_gen[kMaxThreads];
#if KT_HOST_FAST_SWITCH
    void* sched;
    void* ctx[kMaxThreads];  // each parked fiber's stack pointer
#else
    ucontext_t sched;
    ucontext_t ctx[kMaxThreads];
#endif
    State state[kMaxThreads];
    int site[kMaxThreads];
    char* stacks;
    // Operands of warp-wide operations, one slot per thread.
    float xf[kMaxThreads];
    unsigned xa[kMaxThreads][4];
    unsigned xb[kMaxThreads][4];
    const unsigned short* xp[kMaxThreads];
    // Each thread's cp.async copies not yet waited for (`copy_cap` a thread, allocated at the
    // first and doubled as needed), and its commit groups so far.
    Copy* copies;
    int copy_cap;
    int pending[kMaxThreads];
    int groups[kMaxThreads];
    // The dynamic shared memory the kernel declared (descriptors address into it), and each
    // thread's wgmma operations not yet waited for, commit groups and fence.
    unsigned char* shared_base;
    size_t shared_bytes;
    // Its decoded operand lines (kWgSlots) and operations in flight (kMaxWgmma a thread:
    // wg_op), allocated at the block's first wgmma and never cleared (the counts say which
    // entries hold something): inside the block they were 5 to 10 MB that every launch's
    // calloc cleared, kernels without wgmma too (memset was 1.4% of the GPU emulator tests'
    // time, 0.6% since).
    WgDecoded* wg_decoded;
    Wgmma* wg_ops;
    int wg_pending[kMaxThreads];
    int wg_groups[kMaxThreads];
    bool wg_fenced[kMaxThreads];
    // The groups a thread parked at kWgmmaWait waits for: those numbered below this.
    int wg_target[kMaxThreads];
    // Operand lines decoded by the running wait so far (slots of wg_decoded, taken in turn).
    int wg_decoded_count;
    // The block's mbarriers, and what each thread parked at kMbarrier waits for: a phase of
    // the parity given completed on the mbarrier at that address.
    Mbar mbar[kMaxMbarriers];
    int mbar_count;
    Tma tma[kMaxTma];
    int tma_count;
    unsigned mbar_addr[kMaxThreads];
    int mbar_parity[kMaxThreads];
    // Each warp's mma.sync operands, decoded by its first lane to resume (mma_16x8), and
    // whether they are for the running instruction. Allocated at the block's first mma.
    MmaOperands* mma;
    bool mma_decoded[kMaxThreads / 32];
};

// The running block of this OS thread: set by the runtime's launch, read by the kernels'
// operations in every unit. `__thread` (no dynamic initialisation) so that a unit reads it
// directly, not through the call C++ makes for an extern `thread_local`.
#ifdef KT_HOST_RUNTIME
__attribute__((visibility("default"))) __thread Block* tl_block = nullptr;
#else
extern __thread Block* tl_block;
#endif

inline Block& block() { return *tl_block; }

// Parks the running fiber and resumes the scheduler.
inline void to_scheduler(Block& b) {
#if KT_HOST_FAST_SWITCH
    kt_host_switch(&b.ctx[b.current], b.sched);
#else
    swapcontext(&b.ctx[b.current], &b.sched);
#endif
}
inline int tid() { return tl_block->current; }
inline int bid(int axis) { return (int)tl_block->bid[axis]; }

inline void describe(int site, char* out, size_t len) {
    switch (site) {
    case kShuffle: snprintf(out, len, "a wave shuffle"); break;
    case kMma: snprintf(out, len, "an mma.sync"); break;
    case kMfma: snprintf(out, len, "an MFMA"); break;
    case kLdmatrix: snprintf(out, len, "an ldmatrix"); break;
    case kWgmma: snprintf(out, len, "a wgmma"); break;
    case kMbarrier: snprintf(out, len, "an mbarrier wait"); break;
    case kWgmmaWait: snprintf(out, len, "a wgmma.wait_group"); break;
    case kClusterSync: snprintf(out, len, "a barrier.cluster"); break;
    default: snprintf(out, len, "the barrier at line %d", site); break;
    }
}

// Stops the block with `message`; the calling fiber never resumes.
[[noreturn]] inline void fail(const char* message) {
    Block& b = block();
    if (!b.failed) {
        b.failed = true;
        snprintf(b.message, sizeof b.message, "block (%u,%u,%u), thread %d: %s", b.bid[0],
                      b.bid[1], b.bid[2], b.current, message);
    }
    b.state[b.current] = State::Done;
    to_scheduler(b);
    abort();  // unreachable: a failed block's fibers are never resumed
}

// Parks the calling thread at barrier `site` until every thread of the block is there.
inline void wait(int site) {
    Block& b = block();
    b.state[b.current] = State::Waiting;
    b.site[b.current] = site;
    to_scheduler(b);
}

inline void sync(int line) { wait(line); }

inline void fiber_main() {
    Block& b = block();
    b.entry->call(b.entry->fn, b.params);
    // A GPU would write these accumulators after the thread stopped reading them.
    if (b.wg_pending[b.current] > 0) fail("left the kernel with wgmma operations not waited for");
    b.state[b.current] = State::Done;
#if KT_HOST_FAST_SWITCH
    to_scheduler(b);  // never resumed
    abort();
#endif
    // With ucontext, returning resumes uc_link, the scheduler.
}

// A fresh fiber for thread i, starting in fiber_main.
inline void start_fiber(Block& b, int i) {
    char* stack = b.stacks + (size_t)i * kStack;
#if KT_HOST_FAST_SWITCH
    // The frame kt_host_switch pops: six registers, then fiber_main as the return address,
    // above it a null return address for fiber_main, which leaves the stack aligned as at
    // a call.
    void** top = reinterpret_cast<void**>(stack + kStack);
    top -= 2;
    top[1] = nullptr;
    top[0] = reinterpret_cast<void*>(&fiber_main);
    top -= 6;
    for (int r = 0; r < 6; ++r) top[r] = nullptr;
    b.ctx[i] = top;
#else
    getcontext(&b.ctx[i]);
    b.ctx[i].uc_stack.ss_sp = stack;
    b.ctx[i].uc_stack.ss_size = kStack;
    b.ctx[i].uc_link = &b.sched;
    makecontext(&b.ctx[i], fiber_main, 0);
#endif
}

inline void to_fiber(Block& b, int i) {
    b.current = i;
    ++b.switches;
#if KT_HOST_FAST_SWITCH
    kt_host_switch(&b.sched, b.ctx[i]);
#else
    swapcontext(&b.sched, &b.ctx[i]);
#endif
}

// Why the block cannot go on (no thread can resume, some still wait), into b.message.
inline void deadlock(Block& b) {
    int waiting = -1, other = -1, done = -1;
    for (int i = 0; i < b.threads; ++i) {
        if (b.state[i] == State::Done) {
            if (done < 0) done = i;
        } else if (waiting < 0) {
            waiting = i;
        } else if (other < 0 && b.site[i] != b.site[waiting]) {
            other = i;
        }
    }
    // An mbarrier wait no arrival can complete names itself: threads that left are no fault
    // of its (producers leave when their copies are issued).
    for (int i = 0; i < b.threads; ++i)
        if (b.state[i] == State::Waiting && b.site[i] == kMbarrier) {
            waiting = i;
            other = -1;
            done = -1;
            break;
        }
    char x[64], y[64];
    describe(b.site[waiting], x, sizeof x);
    if (other < 0 && done < 0) {
        snprintf(b.message, sizeof b.message,
                 "block (%u,%u,%u): every thread waits, thread %d at %s, which nothing completes",
                 b.bid[0], b.bid[1], b.bid[2], waiting, x);
    } else if (other >= 0) {
        describe(b.site[other], y, sizeof y);
        snprintf(b.message, sizeof b.message,
                 "block (%u,%u,%u): thread %d waits at %s, thread %d at %s", b.bid[0], b.bid[1],
                 b.bid[2], waiting, x, other, y);
    } else {
        snprintf(b.message, sizeof b.message,
                 "block (%u,%u,%u): thread %d left the kernel while thread %d waits at %s",
                 b.bid[0], b.bid[1], b.bid[2], done, waiting, x);
    }
}

// Runs one block to completion; false with b.message set when it cannot complete.
//
// Waves run one at a time, each as far as it can go: its warp-wide operations (negative
// sites) resume once its own threads all wait at one, whatever the other waves do; a barrier
// (a positive site, a source line) once every thread of the block waits at it. Between
// barriers the waves take turns first to last, then last to first (and threads within a wave
// likewise), so a wave reads what others wrote before a barrier only where the kernel has the
// barrier: a missing one shows as a wrong result.
inline bool mbar_done(Block& b, int i);
inline bool wg_committed(const Block& b, int i);

// Whether thread i, parked at a wait of its own, may go on.
inline bool own_wait_done(Block& b, int i) {
    if (b.site[i] == kClusterSync) return b.cluster->generation != b.cluster_gen[i];
    return b.site[i] == kMbarrier ? mbar_done(b, i) : wg_committed(b, i);
}

// A block's fibers started and its state cleared, ready for its first round.
inline void begin_block(Block& b) {
    b.mbar_count = 0;
    b.tma_count = 0;
    b.phase = 0;
    for (int i = 0; i < b.threads; ++i) {
        start_fiber(b, i);
        b.state[i] = State::Ready;
        b.pending[i] = 0;
        b.groups[i] = 0;
        b.wg_pending[i] = 0;
        b.wg_groups[i] = 0;
        b.wg_fenced[i] = false;
    }
}

enum class Round { Done, Moved, Stuck, Failed };

// One round of a block: every wave's turn, then its barrier released if every thread waits
// there. Stuck: no thread can go on by itself (a block alone is then deadlocked; a block of
// a cluster may wait for another's arrivals).
inline Round run_round(Block& b) {
    const int waves = b.threads / KT_HOST_WAVE;  // launch() refuses partial waves
    const bool back = b.phase++ & 1;
    for (int v = 0; v < waves; ++v) {
        const int w = KT_HOST_WAVE * (back ? waves - 1 - v : v);
        for (bool resumed = true; resumed;) {
            for (int n = 0; n < KT_HOST_WAVE; ++n) {
                const int i = w + (back ? KT_HOST_WAVE - 1 - n : n);
                if (b.state[i] == State::Waiting && own_wait(b.site[i]) && own_wait_done(b, i))
                    b.state[i] = State::Ready;
                if (b.state[i] != State::Ready) continue;
                to_fiber(b, i);
                if (b.failed) return Round::Failed;
            }
            resumed = b.state[w] == State::Waiting && b.site[w] < 0 && !own_wait(b.site[w]);
            for (int i = w; resumed && i < w + KT_HOST_WAVE; ++i)
                resumed = b.state[i] == State::Waiting && b.site[i] == b.site[w];
            for (int i = w; resumed && i < w + KT_HOST_WAVE; ++i) b.state[i] = State::Ready;
        }
    }
    bool all_done = true, together = true, woken = false;
    for (int i = 0; i < b.threads; ++i) {
        all_done = all_done && b.state[i] == State::Done;
        together = together && b.state[i] == State::Waiting && b.site[i] > 0 &&
                   b.site[i] == b.site[0];
        // A phase completed after its waiter's turn: the waiter runs in the next round.
        woken = woken || (b.state[i] == State::Waiting && own_wait(b.site[i]) &&
                          own_wait_done(b, i));
    }
    if (all_done) return Round::Done;
    if (woken) return Round::Moved;
    if (!together) return Round::Stuck;
    for (int i = 0; i < b.threads; ++i) b.state[i] = State::Ready;
    return Round::Moved;
}

// Runs the blocks of one cluster (one block without clusters) to completion, round by round
// in turn, as their SMs would at once; false with the failing block's message in the first
// block's. They are deadlocked once every block still running is stuck and no thread of any
// ran in a whole turn.
inline bool run_cluster(Cluster& cl) {
    for (int r = 0; r < cl.size; ++r) {
        tl_block = cl.blocks[r];
        begin_block(*cl.blocks[r]);
    }
    cl.arrived = 0;
    cl.generation = 0;
    for (;;) {
        bool all_done = true, all_stuck = true;
        unsigned long before = 0, after = 0;
        for (int r = 0; r < cl.size; ++r) before += cl.blocks[r]->switches;
        for (int r = 0; r < cl.size; ++r) {
            Block& b = *cl.blocks[r];
            tl_block = &b;
            bool done = true;
            for (int i = 0; i < b.threads && done; ++i) done = b.state[i] == State::Done;
            if (done) continue;
            const Round round = run_round(b);
            if (round == Round::Failed) {
                if (r != 0) snprintf(cl.blocks[0]->message, sizeof b.message, "%s", b.message);
                return false;
            }
            all_done = all_done && round == Round::Done;
            all_stuck = all_stuck && round == Round::Stuck;
        }
        if (all_done) return true;
        for (int r = 0; r < cl.size; ++r) after += cl.blocks[r]->switches;
        if (all_stuck && (cl.size == 1 || after == before)) {
            for (int r = 0; r < cl.size; ++r) {
                Block& b = *cl.blocks[r];
                bool done = true;
                for (int i = 0; i < b.threads && done; ++i) done = b.state[i] == State::Done;
                if (done) continue;
                tl_block = &b;
                deadlock(b);
                if (r != 0) snprintf(cl.blocks[0]->message, sizeof b.message, "%s", b.message);
                return false;
            }
        }
    }
}

// Runs a launch of `entries[entry]` over the grid; 0, or 1 with the error in `err`. Defined in
// the runtime's own object only: a unit declares it, so none of the scheduler is compiled there.
#ifndef KT_HOST_RUNTIME
int launch(const Entry* entries, int count, int entry, const unsigned grid[4], unsigned threads,
           void** params, char* err, size_t err_len);
#else
__attribute__((visibility("default"))) int launch(const Entry* entries, int count, int entry,
                                                  const unsigned grid[4], unsigned threads,
                                                  void** params, char* err, size_t err_len) {
    auto refuse = [&](const char* what) {
        snprintf(err, err_len, "%s", what);
        return 1;
    };
    if (entry < 0 || entry >= count) return refuse("no such entry point in this build");
    if (threads == 0 || threads > (unsigned)kMaxThreads)
        return refuse("threads per block must be 1 to 1024");
    if (threads % KT_HOST_WAVE != 0)
        return refuse("threads per block must be a multiple of the wave");
    const unsigned size = grid[3];
    if (size < 1 || size > (unsigned)kMaxCluster) return refuse("clusters take 1 or 2 blocks");
    if (grid[0] % size != 0) return refuse("a grid of whole clusters along x");
    Cluster cl{};
    cl.size = (int)size;
    bool ok = true;
    for (unsigned r = 0; r < size; ++r) {
        Block* b = static_cast<Block*>(calloc(1, sizeof(Block)));
        cl.blocks[r] = b;
        if (b == nullptr) {
            ok = false;
            break;
        }
        b->stacks = static_cast<char*>(malloc(kStack * threads));
        b->entry = &entries[entry];
        b->params = params;
        b->threads = (int)threads;
        b->cluster = &cl;
        b->rank = (int)r;
        ok = ok && b->stacks != nullptr;
    }
    Block* outer = tl_block;
    if (!ok) {
        snprintf(err, err_len, "out of memory for the blocks' state and stacks");
    } else {
        for (unsigned z = 0; ok && z < grid[2]; ++z)
            for (unsigned y = 0; ok && y < grid[1]; ++y)
                for (unsigned x = 0; ok && x < grid[0]; x += size) {
                    for (unsigned r = 0; r < size; ++r) {
                        cl.blocks[r]->bid[0] = x + r;
                        cl.blocks[r]->bid[1] = y;
                        cl.blocks[r]->bid[2] = z;
                    }
                    ok = run_cluster(cl);
                }
        if (!ok) snprintf(err, err_len, "%s", cl.blocks[0]->message);
    }
    tl_block = outer;
    for (unsigned r = 0; r < size; ++r) {
        if (cl.blocks[r] == nullptr) continue;
        free(cl.blocks[r]->copies);
        free(cl.blocks[r]->wg_decoded);
        free(cl.blocks[r]->wg_ops);
        free(cl.blocks[r]->mma);
        free(cl.blocks[r]->stacks);
        free(cl.blocks[r]->dyn);
        free(cl.blocks[r]);
    }
    return ok ? 0 : 1;
}
#endif

// Calls a kernel with its arguments unpacked from `params`, as cuLaunchKernel and
// hipModuleLaunchKernel take them: one pointer to each argument's value.
// std::index_sequence and std::remove_cv/remove_reference, without <utility>.
template <size_t... I>
struct indices {};
template <size_t N, size_t... I>
struct make_indices : make_indices<N - 1, N - 1, I...> {};
template <size_t... I>
struct make_indices<0, I...> {
    typedef indices<I...> type;
};
template <typename T>
struct bare {
    typedef T type;
};
template <typename T>
struct bare<const T> : bare<T> {};
template <typename T>
struct bare<T&> : bare<T> {};

template <typename... A, size_t... I>
void call_unpacked(void (*f)(A...), void** params, indices<I...>) {
    f(*static_cast<typename bare<A>::type*>(params[I])...);
}

template <typename... A>
void call_kernel(void* fn, void** params) {
    call_unpacked(reinterpret_cast<void (*)(A...)>(fn), params,
                  typename make_indices<sizeof...(A)>::type{});
}

template <typename... A>
Entry entry_of(void (*f)(A...)) {
    return Entry{reinterpret_cast<void*>(f), &call_kernel<A...>};
}

inline float bits_f32(unsigned u) {
    float f;
    __builtin_memcpy(&f, &u, sizeof f);
    return f;
}

inline float bf16_f32(unsigned short x) { return bits_f32((unsigned)x << 16); }

// IEEE binary16 to f32, subnormals, infinities and NaN included.
inline float f16_f32(unsigned short h) {
    const unsigned sign = (unsigned)(h & 0x8000u) << 16;
    const unsigned exp = (h >> 10) & 0x1fu;
    const unsigned man = h & 0x3ffu;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp != 0) return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
    // Subnormal (or zero): man · 2^-24, exact in f32 (a normal number there). Zeros are
    // common in the inputs (padding), and ldexpf is a library call.
    const float mag = (float)man * 0x1p-24f;
    return sign ? -mag : mag;
}

// A 16-bit matrix-core operand (KT_DTYPE 2: bf16; 1: f16, and 3, 4: an fp8 byte's f16
// reading) as f32.
inline float half_f32(unsigned short x) {
#if KT_DTYPE != 2
    return f16_f32(x);
#else
    return bf16_f32(x);
#endif
}

// f32 to bf16, to nearest even (NaN stays NaN).
inline unsigned short f32_bf16(float f) {
    unsigned u;
    __builtin_memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

// f32 to IEEE binary16, to nearest even: overflow to infinity, subnormals, NaN.
inline unsigned short f32_f16(float f) {
    unsigned u;
    __builtin_memcpy(&u, &f, sizeof u);
    const unsigned sign = (u >> 16) & 0x8000u;
    const unsigned a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return (unsigned short)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0));
    if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // rounds past 65504
    if (a < 0x38800000u) {
        // Below 2^-14: a multiple of 2^-24, rounded by the float addition itself.
        const float scaled = bits_f32(a) * 16777216.0f;
        const float big = 8388608.0f;
        volatile float sum = scaled + big;  // volatile: keep the rounding step
        return (unsigned short)(sign | (unsigned)(sum - big));
    }
    unsigned r = a - 0x38000000u;  // exponent bias 127 to 15
    r += 0xfffu + ((r >> 13) & 1u);
    return (unsigned short)(sign | (r >> 13));
}

// Two f32 values as one register of the input type's 16-bit values, `lo` in the low half.
inline unsigned pack2(float lo, float hi) {
#if KT_DTYPE != 2
    return (unsigned)f32_f16(lo) | ((unsigned)f32_f16(hi) << 16);
#else
    return (unsigned)f32_bf16(lo) | ((unsigned)f32_bf16(hi) << 16);
#endif
}

// Element `i` (0: low half) of a register holding two 16-bit values.
inline float pair_elem(unsigned r, int i) { return half_f32((unsigned short)(r >> (16 * i))); }

// The calling thread's lane and the first thread of its wave; an error when the wave is not
// whole (a warp-wide operation in a block that ends mid-wave).
inline int wave_base(const char* what) {
    Block& b = block();
    const int base = b.current & ~(KT_HOST_WAVE - 1);
    if (base + KT_HOST_WAVE > b.threads) fail(what);
    return base;
}

inline float shfl_xor(float v, int mask) {
    Block& b = block();
    const int me = b.current;
    const int base = wave_base("a shuffle in a wave the block does not fill");
    if (mask < 0 || mask >= KT_HOST_WAVE) fail("a shuffle mask outside the wave");
    b.xf[me] = v;
    wait(kShuffle);
    const float r = b.xf[base + ((me - base) ^ mask)];
    wait(kShuffle);
    return r;
}

// Lane `src`'s value (of the caller's wave), as __shfl / __shfl_sync read it.
inline float shfl(float v, int src) {
    Block& b = block();
    const int me = b.current;
    const int base = wave_base("a shuffle in a wave the block does not fill");
    if (src < 0 || src >= KT_HOST_WAVE) fail("a shuffle from a lane outside the wave");
    b.xf[me] = v;
    wait(kShuffle);
    const float r = b.xf[base + src];
    wait(kShuffle);
    return r;
}

// mma.sync.aligned.m16n8kK: d += A·B over a 32-thread warp, with the fragments of the PTX
// ISA ("Matrix Fragments for mma.m16n8k16", and m16n8k32's for 8-bit types). Lane = 4·group
// + t; a register holds PER = K / 8 consecutive k values, `value(r, i)` the i-th of register r.
// A (16×K, row-major): register r of lane (g, t) holds row g + 8·(r % 2), k PER·t + (K / 2)·(r
// / 2) onward. B (K×8, column-major): register r holds column g, k PER·t + (K / 2)·r onward.
// D: element e holds row g + 8·(e / 2), column 2t + e % 2.
template <int K, class Value>
inline void mma_16x8(float (&d)[4], const unsigned (&a)[4], const unsigned (&bv)[2], Value value) {
    constexpr int per = K / 8, half = K / 2;
    static_assert(K <= 32, "MmaOperands holds 32 values of k");
    Block& b = block();
    const int me = b.current;
    const int base = wave_base("an mma.sync in a warp the block does not fill");
    if (b.mma == nullptr) {
        b.mma = static_cast<MmaOperands*>(malloc(sizeof(MmaOperands) * (size_t)(b.threads / 32)));
        if (b.mma == nullptr) fail("out of memory for the block's mma.sync operands");
    }
    for (int r = 0; r < 4; ++r) b.xa[me][r] = a[r];
    for (int r = 0; r < 2; ++r) b.xb[me][r] = bv[r];
    const int warp = base / 32;
    b.mma_decoded[warp] = false;
    wait(kMma);
    // The warp's rows of A and columns of B, read from its registers by the first lane to
    // resume: each row feeds the 4 lanes of a group, each column 8 groups' lanes (decoding
    // them in every lane was most of the mma.sync tests' emulated time). The second wait
    // keeps them, as the registers, until every lane has read them.
    MmaOperands& o = b.mma[warp];
    if (!b.mma_decoded[warp]) {
        for (int row = 0; row < 16; ++row)
            for (int k = 0; k < K; ++k)
                o.a[row][k] = value(b.xa[base + 4 * (row % 8) + (k % half) / per][row / 8 + 2 * (k / half)],
                                    k % per);
        for (int col = 0; col < 8; ++col)
            for (int k = 0; k < K; ++k)
                o.b[col][k] = value(b.xb[base + 4 * col + (k % half) / per][k / half], k % per);
        b.mma_decoded[warp] = true;
    }
    const int lane = me - base, g = lane / 4, t = lane % 4;
    float out[4];
    for (int e = 0; e < 4; ++e) {
        const float* av = o.a[g + 8 * (e / 2)];
        const float* bcol = o.b[2 * t + e % 2];
        float acc = d[e];
        for (int k = 0; k < K; ++k) acc = fmaf(av[k], bcol[k], acc);
        out[e] = acc;
    }
    wait(kMma);
    for (int e = 0; e < 4; ++e) d[e] = out[e];
}

// m16n8k16 on 16-bit values (f16 or bf16, two a register).
inline void mma_16x8x16(float (&d)[4], const unsigned (&a)[4], const unsigned (&bv)[2]) {
    mma_16x8<16>(d, a, bv, pair_elem);
}

// The value of an fp8 byte (KT_DTYPE 4: E5M2, else OCP E4M3): its f16 reading times the
// format's factor, exact.
inline float fp8_f32(unsigned x) {
#if KT_DTYPE == 4
    return f16_f32((unsigned short)(x << 8));
#else
    return f16_f32((unsigned short)(((x & 0x7fu) << 7) | ((x & 0x80u) << 8))) * 256.0f;
#endif
}

// m16n8k32 on fp8 bytes (four a register, low byte first).
inline void mma_16x8x32_fp8(float (&d)[4], const unsigned (&a)[4], const unsigned (&bv)[2]) {
    mma_16x8<32>(d, a, bv, [](unsigned r, int i) { return fp8_f32((r >> (8 * i)) & 0xffu); });
}

inline bool aligned16(const void* p) { return ((decltype(sizeof 0))p & 15) == 0; }

// A 16-byte vector load from global memory, which faults on the device when misaligned.
template <class T>
inline T load16(const void* p) {
    if (!aligned16(p)) fail("a 16-byte load from an address not 16-byte aligned");
    T v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}

// An 8-byte vector load from global memory, which faults on the device when misaligned.
template <class T>
inline T load8(const void* p) {
    if (((decltype(sizeof 0))p & 7) != 0) fail("an 8-byte load from an address not 8-byte aligned");
    T v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}

// Two floats stored as one 8-byte vector, which the device requires 8-byte aligned.
inline void store8(float* p, float x, float y) {
    if (((decltype(sizeof 0))p & 7) != 0) fail("an 8-byte store to an address not 8-byte aligned");
    p[0] = x;
    p[1] = y;
}

// cp.async.cg.shared.global of 16 bytes, `bytes` of them from `src`, the rest zeros. The copy
// happens at the wait that covers its group; until then its destination holds 0xff bytes (NaN
// in every input type), so reading it early, or copying into a tile others still read, shows.
inline void cp_async(void* dst, const void* src, int bytes) {
    Block& b = block();
    const int me = b.current;
    if (bytes < 0 || bytes > 16) fail("a cp.async reading more than its 16 bytes");
    if (!aligned16(dst) || (bytes > 0 && !aligned16(src)))
        fail("a 16-byte cp.async from or to an address not 16-byte aligned");
    if (b.pending[me] == b.copy_cap) {
        // Room for twice as many a thread; each thread's pending copies move to its new slots.
        const int cap = b.copy_cap == 0 ? 64 : 2 * b.copy_cap;
        Copy* grown = static_cast<Copy*>(malloc(sizeof(Copy) * (size_t)cap * (size_t)b.threads));
        if (grown == nullptr) fail("out of memory for cp.async copies");
        for (int t = 0; t < b.threads; ++t)
            for (int i = 0; i < b.pending[t]; ++i)
                grown[t * cap + i] = b.copies[t * b.copy_cap + i];
        free(b.copies);
        b.copies = grown;
        b.copy_cap = cap;
    }
    b.copies[me * b.copy_cap + b.pending[me]++] = Copy{dst, src, bytes, b.groups[me]};
    __builtin_memset(dst, 0xff, 16);
}

inline void cp_commit() { ++block().groups[block().current]; }

// cp.async.wait_group n: every copy but those of the newest n committed groups (and any not
// yet committed) completes.
inline void cp_wait(int n) {
    Block& b = block();
    const int me = b.current;
    Copy* mine = b.copies + me * b.copy_cap;
    int kept = 0;
    for (int i = 0; i < b.pending[me]; ++i) {
        const Copy c = mine[i];
        if (c.group < b.groups[me] - n) {
            __builtin_memcpy(c.dst, c.src, c.bytes);
            __builtin_memset(static_cast<char*>(c.dst) + c.bytes, 0, 16 - c.bytes);
        } else {
            mine[kept++] = c;
        }
    }
    b.pending[me] = kept;
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8q .. 8q + 7 pass the rows of 8×8
// matrix q (16-byte aligned); register q of lane l receives elements 2·(l % 4) and + 1 of row
// l / 4 of it, or with `trans` those rows' elements in column l / 4.
inline void ldmatrix_x4(unsigned (&r)[4], const unsigned short* p, bool trans) {
    Block& b = block();
    const int me = b.current;
    const int base = wave_base("an ldmatrix in a warp the block does not fill");
    if (!aligned16(p)) fail("an ldmatrix row address not 16-byte aligned");
    b.xp[me] = p;
    wait(kLdmatrix);
    const int lane = me - base;
    unsigned out[4];
    for (int q = 0; q < 4; ++q) {
        const unsigned short* const* rows = &b.xp[base + 8 * q];
        unsigned short lo, hi;
        if (trans) {
            lo = rows[2 * (lane % 4)][lane / 4];
            hi = rows[2 * (lane % 4) + 1][lane / 4];
        } else {
            lo = rows[lane / 4][2 * (lane % 4)];
            hi = rows[lane / 4][2 * (lane % 4) + 1];
        }
        out[q] = (unsigned)lo | ((unsigned)hi << 16);
    }
    wait(kLdmatrix);
    for (int q = 0; q < 4; ++q) r[q] = out[q];
}

// The block's dynamic shared memory of `bytes` (what the launch passes): allocated at the
// block's first use and kept for the launch's later blocks, as a device reuses an SM's.
inline unsigned char* dynamic_shared(size_t bytes) {
    Block& b = block();
    if (b.dyn == nullptr || b.dyn_bytes < bytes) {
        free(b.dyn);
        b.dyn = static_cast<unsigned char*>(calloc(1, bytes));
        if (b.dyn == nullptr) fail("out of memory for the block's dynamic shared memory");
        b.dyn_bytes = bytes;
    }
    b.shared_base = b.dyn;
    b.shared_bytes = bytes;
    return b.dyn;
}

// The shared-window address of the dynamic shared memory's first byte. A device may place it
// after static shared memory, so it is 16-byte aligned and no more: a kernel that needs a
// coarser alignment (swizzled wgmma tiles: 1024 bytes) must round up itself, and one that
// assumes it is caught here.
constexpr unsigned kSharedWindow = 0x410;

// `p` in the block's dynamic shared memory as the 32-bit shared-window address the device's
// instructions take.
inline unsigned smem_offset(const void* p) {
    Block& b = block();
    const unsigned char* c = static_cast<const unsigned char*>(p);
    if (b.shared_base == nullptr || c < b.shared_base || c >= b.shared_base + b.shared_bytes)
        fail("a shared-memory address outside the kernel's dynamic shared memory");
    return kSharedWindow + (unsigned)(c - b.shared_base);
}

// The byte of the block's dynamic shared memory at shared-window address `at` (smem_offset's
// inverse), for the instructions that take addresses rather than pointers.
inline const void* smem_at(unsigned at) {
    Block& b = block();
    if (b.shared_base == nullptr || at < kSharedWindow || at - kSharedWindow >= b.shared_bytes)
        fail("a shared-memory address outside the kernel's dynamic shared memory");
    return b.shared_base + (at - kSharedWindow);
}

inline void wgmma_fence() { block().wg_fenced[block().current] = true; }

inline void wgmma_commit() { ++block().wg_groups[block().current]; }

// A wgmma descriptor's fields: start address, leading and stride byte offsets, and the
// swizzle mode's row width W (128, 64, 32 bytes for modes 1, 2, 3; 0 without swizzling).
struct WgmmaDesc {
    size_t start, lbo, sbo, w;
};

inline WgmmaDesc wgmma_desc(unsigned long long desc) {
    if ((desc >> 49 & 7u) != 0) fail("a wgmma descriptor with a base offset: not emulated");
    const unsigned mode = (unsigned)(desc >> 62);
    return WgmmaDesc{(size_t)(desc & 0x3fffu) << 4, (size_t)(desc >> 16 & 0x3fffu) << 4,
                     (size_t)(desc >> 32 & 0x3fffu) << 4,
                     (size_t)(mode == 0 ? 0 : mode == 1 ? 128 : mode == 2 ? 64 : 32)};
}

// The operand element at shared address `addr` (a swizzled layout's address before its
// swizzle: the 16-byte piece, bits 4 up, XORed with bits 7 up, as many bits as a row of W
// bytes has pieces): a 16-bit value, or an fp8 byte's value.
inline float wgmma_read(Block& b, size_t addr, size_t w) {
    if (w > 0) addr ^= ((addr >> 7) & (w / 16 - 1)) << 4;
    if (addr < kSharedWindow || addr - kSharedWindow + kWgBytes > b.shared_bytes)
        fail("a wgmma operand element outside dynamic shared memory");
#if KT_DTYPE == 3 || KT_DTYPE == 4
    return fp8_f32(b.shared_base[addr - kSharedWindow]);
#else
    unsigned short x;
    __builtin_memcpy(&x, b.shared_base + (addr - kSharedWindow), sizeof x);
    return half_f32(x);
#endif
}

// Element (row, k < kWgK) of a wgmma operand, k-major (see kt_wgmma_desc). Without
// swizzling: core matrices of 8 rows of 16 bytes, `lbo` apart in k and `sbo` in rows. Swizzled (mode 1,
// 2, 3: rows of W = 128, 64, 32 bytes): row r of each 8 at r·W, groups of 8 rows `sbo`
// apart, the step's 32 bytes of k within one row, the address swizzled (wgmma_read): a
// function of the address, so a tile must start on a boundary of the pattern (8·W bytes)
// for its rows to line up.
inline float wgmma_elem(Block& b, unsigned long long desc, int row, int k) {
    const WgmmaDesc d = wgmma_desc(desc);
    if (d.w == 0)
        return wgmma_read(b, d.start + (size_t)(row / 8) * d.sbo +
                                 (size_t)(k * kWgBytes / 16) * d.lbo + (size_t)(row % 8) * 16 +
                                 (size_t)(k * kWgBytes % 16),
                          0);
    if (d.start % d.w + 32 > d.w) fail("a wgmma k step that crosses a swizzled row");
    return wgmma_read(b, d.start + (size_t)(row / 8) * d.sbo + (size_t)(row % 8) * d.w +
                             (size_t)k * kWgBytes,
                      d.w);
}

// Element (k < 16, col) of a wgmma B operand, n-major (the instruction's imm-trans-b 1;
// swizzled layouts only): B's rows of k hold the N values contiguous, in swizzle atoms of
// W / 2 values `lbo` apart along N, row k of each 8 at k·W, groups of 8 rows `sbo` apart.
inline float wgmma_elem_mn(Block& b, unsigned long long desc, int k, int col) {
    const WgmmaDesc d = wgmma_desc(desc);
    if (d.w == 0) fail("an n-major wgmma operand without swizzling: not emulated");
    const size_t atom = d.w / 2;
    return wgmma_read(b, d.start + (col / atom) * d.lbo + (size_t)(k / 8) * d.sbo +
                             (size_t)(k % 8) * d.w + (col % atom) * 2,
                      d.w);
}

// Line `i` (a row of A or k-major B, a column of n-major B) of the operand at `desc`, its
// kWgK values decoded by the first thread of the running wait to read it (see WgDecoded).
// The pointer holds until the next call, which may take its slot.
inline const float* wgmma_line(Block& b, unsigned long long desc, int layout, int i) {
    if (i < 0 || i >= kWgLines) fail("a wgmma with N over 256, more than the instruction takes");
    WgDecoded* s = nullptr;
    const int used = b.wg_decoded_count < kWgSlots ? b.wg_decoded_count : kWgSlots;
    for (int n = 0; n < used && s == nullptr; ++n)
        if (b.wg_decoded[n].desc == desc && b.wg_decoded[n].layout == layout) s = &b.wg_decoded[n];
    if (s == nullptr) {
        s = &b.wg_decoded[b.wg_decoded_count++ % kWgSlots];
        s->desc = desc;
        s->layout = layout;
        for (bool& h : s->have) h = false;
    }
    if (!s->have[i]) {
        for (int k = 0; k < kWgK; ++k)
            s->v[i][k] = layout == 0 ? wgmma_elem(b, desc, i, k) : wgmma_elem_mn(b, desc, k, i);
        s->have[i] = true;
    }
    return s->v[i];
}

// The checks every wgmma.mma_async passes at its issue: whole warpgroups, a wgmma.fence
// before it, a full warp. Returns the warp's first thread.
inline int wgmma_issue(Block& b, int me) {
    if (b.threads % 128 != 0) fail("a wgmma in a block that is not whole warpgroups");
    if (!b.wg_fenced[me]) fail("a wgmma without a wgmma.fence before it");
    const int base = wave_base("a wgmma in a warp the block does not fill");
    if (b.wg_pending[me] == kMaxWgmma) fail("too many wgmma operations in flight");
    if (b.wg_ops == nullptr) {
        b.wg_decoded = static_cast<WgDecoded*>(malloc(sizeof(WgDecoded) * kWgSlots));
        b.wg_ops = static_cast<Wgmma*>(malloc(sizeof(Wgmma) * (size_t)b.threads * kMaxWgmma));
        if (b.wg_decoded == nullptr || b.wg_ops == nullptr)
            fail("out of memory for the block's wgmma operations");
    }
    return base;
}

// Operation `i` in flight of thread `t` (the block has issued one, so wg_ops is allocated).
inline Wgmma& wg_op(Block& b, int t, int i) { return b.wg_ops[t * kMaxWgmma + i]; }

// Every lane of the warp passed the same two 64-bit words (descriptors).
inline void wgmma_same(Block& b, int me, int base, unsigned long long x, unsigned long long y) {
    b.xa[me][0] = (unsigned)x;
    b.xa[me][1] = (unsigned)(x >> 32);
    b.xa[me][2] = (unsigned)y;
    b.xa[me][3] = (unsigned)(y >> 32);
    wait(kWgmma);
    for (int r = 0; r < 4; ++r)
        if (b.xa[base][r] != b.xa[me][r]) fail("lanes of one warp passed different wgmma descriptors");
    wait(kWgmma);
}

// wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16} (fp8 builds: m64nNk32.f32 on
// E4M3 or E5M2 bytes), both operands from shared memory,
// neither transposed (k-major): recorded, and computed at the wgmma.wait_group covering it.
// The warp's lanes must pass one pair of descriptors.
inline void wgmma(float* d, int n, unsigned long long da, unsigned long long db) {
    Block& b = block();
    const int me = b.current;
    const int base = wgmma_issue(b, me);
    wgmma_same(b, me, base, da, db);
    Wgmma op{d, n, da, db, b.wg_groups[me], false, false, {}};
    wg_op(b, me, b.wg_pending[me]++) = op;
}

// The same with A from registers: each thread's four registers of two 16-bit values, the
// m16n8k16 A fragment of its warp's 16 rows (register r of lane (g, t): row g + 8·(r % 2),
// k 2t + 8·(r / 2) and + 1); B k-major or, with `trans_b`, n-major. A's values are taken at
// the issue (the device reads the registers before the wait; changing them in between is
// a race the emulator does not see).
inline void wgmma_rs(float* d, int n, const unsigned (&a)[4], unsigned long long db, int trans_b) {
    if (kWgK != 16) fail("a wgmma with A from registers on fp8: not emulated");
    Block& b = block();
    const int me = b.current;
    const int base = wgmma_issue(b, me);
    wgmma_same(b, me, base, db, (unsigned long long)trans_b);
    for (int r = 0; r < 4; ++r) b.xa[me][r] = a[r];
    wait(kWgmma);
    Wgmma op{d, n, 0, db, b.wg_groups[me], true, trans_b != 0, {}};
    const int g = (me - base) / 4;
    for (int h = 0; h < 2; ++h)
        for (int k = 0; k < 16; ++k)
            op.a_rows[h][k] = pair_elem(b.xa[base + 4 * g + (k % 8) / 2][h + 2 * (k / 8)], k % 2);
    wait(kWgmma);
    wg_op(b, me, b.wg_pending[me]++) = op;
}

// Whether every thread of thread i's warpgroup has committed the groups i waits for.
inline bool wg_committed(const Block& b, int i) {
    const int base = i / 128 * 128;
    for (int j = base; j < base + 128; ++j)
        if (b.wg_groups[j] < b.wg_target[i]) return false;
    return true;
}

// Thread j's operations in groups numbered below `target`, computed into its accumulators
// (in issue order) and no longer pending.
inline void wgmma_complete(Block& b, int j, int target) {
    const int w = (j / 32) % 4, g = (j % 32) / 4, t = j % 4;
    int kept = 0;
    for (int i = 0; i < b.wg_pending[j]; ++i) {
        const Wgmma op = wg_op(b, j, i);
        if (op.group >= target) {
            wg_op(b, j, kept++) = op;
            continue;
        }
        // The thread's two rows of A, then each pair of its columns of B, read once (a row
        // feeds every column, a column both rows).
        float a_rows[2][kWgK];
        for (int h = 0; h < 2; ++h) {
            const float* row = op.reg_a ? op.a_rows[h] : wgmma_line(b, op.a, 0, 16 * w + g + 8 * h);
            for (int k = 0; k < kWgK; ++k) a_rows[h][k] = row[k];
        }
        for (int c = 0; c < op.n / 8; ++c) {
            float cols[2][kWgK];
            for (int h = 0; h < 2; ++h) {
                const float* col = wgmma_line(b, op.b, op.trans_b ? 1 : 0, 8 * c + 2 * t + h);
                for (int k = 0; k < kWgK; ++k) cols[h][k] = col[k];
            }
            for (int e = 0; e < 4; ++e) {
                float acc = op.d[4 * c + e];
                for (int k = 0; k < kWgK; ++k) acc = fmaf(a_rows[e / 2][k], cols[e % 2][k], acc);
                op.d[4 * c + e] = acc;
            }
        }
    }
    b.wg_pending[j] = kept;
}

// wgmma.wait_group n: the thread's operations but those of the newest n committed groups (and
// any not committed) complete, in issue order. Products are the warpgroup's, not a thread's:
// the wait parks until all 128 threads have committed those groups, then completes them for
// every thread of the warpgroup, as the device does. A stage handed back by one thread once
// its wait returns is read by no product after that, whichever warp issued it. Computed at
// the wait, before any other wave runs: products that read a stage before its copies land
// read the poison those left; a stage handed back before the wait for its products is a race
// the emulator does not see.
inline void wgmma_wait(int n) {
    Block& b = block();
    const int me = b.current;
    b.wg_target[me] = b.wg_groups[me] - n;
    if (!wg_committed(b, me)) wait(kWgmmaWait);
    // Shared memory changes between waits, never during one.
    b.wg_decoded_count = 0;
    const int base = me / 128 * 128;
    for (int j = base; j < base + 128; ++j) wgmma_complete(b, j, b.wg_target[me]);
}

// mbarrier.init.shared.b64: an mbarrier at `p` expecting `count` arrivals a phase, in phase 0.
inline void mbar_init(const void* p, int count) {
    Block& b = block();
    const unsigned addr = smem_offset(p);
    if (addr % 8 != 0) fail("an mbarrier not 8-byte aligned");
    if (count < 1) fail("an mbarrier initialized to expect no arrivals");
    int i = 0;
    while (i < b.mbar_count && b.mbar[i].addr != addr) ++i;
    if (i == b.mbar_count) {
        if (b.mbar_count == kMaxMbarriers) fail("more mbarriers than the emulator holds");
        ++b.mbar_count;
    }
    b.mbar[i] = Mbar{addr, count, count, 0, 0};
}

inline Mbar& mbar_of(Block& b, unsigned addr) {
    for (int i = 0; i < b.mbar_count; ++i)
        if (b.mbar[i].addr == addr) return b.mbar[i];
    fail("an mbarrier used before mbarrier.init");
}

inline void mbar_complete(Mbar& m) {
    ++m.completed;
    m.pending = m.expected;
}

inline void tma_land(Block& b, const Tma& t);

// Whether thread i, parked at kMbarrier, may go on: the phase of its parity has completed
// (the current phase has the other parity). A phase whose arrivals are in but whose bytes
// are not lands its TMA copies now: they land no earlier than someone waits for them, so a
// read that does not wait finds the poison they left. Called by the scheduler too, so it
// never fails: tma_load refuses bytes the phase does not expect.
inline bool mbar_done(Block& b, int i) {
    Mbar& m = mbar_of(b, b.mbar_addr[i]);
    if (m.pending == 0 && m.tx > 0) {
        int kept = 0;
        for (int t = 0; t < b.tma_count; ++t) {
            if (b.tma[t].bar == m.addr)
                tma_land(b, b.tma[t]);
            else
                b.tma[kept++] = b.tma[t];
        }
        b.tma_count = kept;
        if (m.tx == 0) mbar_complete(m);
    }
    return (m.completed & 1) != b.mbar_parity[i];
}

inline void mbar_arrive_at(Block& b, unsigned addr) {
    Mbar& m = mbar_of(b, addr);
    if (--m.pending == 0 && m.tx == 0) mbar_complete(m);
}

// mbarrier.arrive.expect_tx.shared.b64: the phase expects `bytes` more from the copy engine,
// and this is one of its arrivals.
inline void mbar_expect_tx(const void* p, int bytes) {
    Block& b = block();
    const unsigned addr = smem_offset(p);
    mbar_of(b, addr).tx += bytes;
    mbar_arrive_at(b, addr);
}

// cp.async.bulk.tensor.{2d,4d}.shared::cluster.global.mbarrier::complete_tx::bytes of a
// kt_tmap (words: address, dims 0 and 1, stride 1 in bytes, boxes 0 and 1, swizzle bytes,
// element bytes, dims 2 and 3, strides 2 and 3, boxes 2 and 3): the box at coordinates
// x, y, z, w (innermost first), recorded with its mbarrier; its destination holds 0xff
// bytes until it lands.
inline void tma_load_4d(void* dst, const unsigned long long* map, int x, int y, int z, int w,
                        const void* bar) {
    Block& b = block();
    const unsigned at = smem_offset(dst);
    if (at % 128 != 0) fail("a TMA destination not 128-byte aligned");
    if (map[6] != 128 || map[7] != 2 || map[4] * 2 != 128)
        fail("a tensor map other than 16-bit boxes of 128-byte swizzled rows: not emulated");
    if (map[12] == 0 || map[13] == 0) fail("a tensor map without its third and fourth boxes");
    const size_t bytes = box_bytes(map);
    if (at - kSharedWindow + bytes > b.shared_bytes)
        fail("a TMA box past the kernel's dynamic shared memory");
    if (b.tma_count == kMaxTma) fail("more TMA copies in flight than the emulator holds");
    // The phase must expect these bytes (arrive.expect_tx first), beside those in flight.
    const unsigned bar_at = smem_offset(bar);
    long flying = (long)bytes;
    for (int i = 0; i < b.tma_count; ++i)
        if (b.tma[i].bar == bar_at) flying += (long)box_bytes(b.tma[i].map);
    if (flying > mbar_of(b, bar_at).tx)
        fail("a TMA box whose bytes its mbarrier's phase does not expect (expect_tx first)");
    Tma& t = b.tma[b.tma_count++];
    t.bar = bar_at;
    t.dst = static_cast<unsigned char*>(dst);
    for (int i = 0; i < 16; ++i) t.map[i] = map[i];
    t.at[0] = x;
    t.at[1] = y;
    t.at[2] = z;
    t.at[3] = w;
    __builtin_memset(dst, 0xff, bytes);
}

inline void tma_load(void* dst, const unsigned long long* map, int x, int y, const void* bar) {
    tma_load_4d(dst, map, x, y, 0, 0, bar);
}

// Lands a TMA box: element (i3, i2, r, c) of the box, at coordinates (x + c, y + r, z + i2,
// w + i3) of the tensor or zero past its edges, at element ((i3·box2 + i2)·box1 + r)·box0 +
// c of the box (rows of 128 bytes), swizzled by its shared address.
inline void tma_land(Block& b, const Tma& t) {
    const unsigned char* src = reinterpret_cast<const unsigned char*>(t.map[0]);
    const long dims[4] = {(long)t.map[1], (long)t.map[2], (long)t.map[8], (long)t.map[9]};
    const long strides[4] = {2, (long)t.map[3], (long)t.map[10], (long)t.map[11]};
    const int boxes[4] = {(int)t.map[4], (int)t.map[5], (int)t.map[12], (int)t.map[13]};
    const unsigned base = smem_offset(t.dst);
    unsigned e = 0;  // the box's element, in its order
    for (int i3 = 0; i3 < boxes[3]; ++i3)
        for (int i2 = 0; i2 < boxes[2]; ++i2)
            for (int r = 0; r < boxes[1]; ++r)
                for (int c = 0; c < boxes[0]; ++c, ++e) {
                    const long g[4] = {(long)t.at[0] + c, (long)t.at[1] + r, (long)t.at[2] + i2,
                                       (long)t.at[3] + i3};
                    bool in = true;
                    long off = 0;
                    for (int d = 0; d < 4; ++d) {
                        in = in && g[d] >= 0 && g[d] < dims[d];
                        off += g[d] * strides[d];
                    }
                    unsigned short v = 0;
                    if (in) __builtin_memcpy(&v, src + off, 2);
                    unsigned addr = base + e * 2;
                    addr ^= ((addr >> 7) & 7u) << 4;
                    __builtin_memcpy(b.shared_base + (addr - kSharedWindow), &v, 2);
                }
    mbar_of(b, t.bar).tx -= (long)box_bytes(t.map);
}

// mbarrier.arrive.shared.b64: one arrival on the current phase.
inline void mbar_arrive(const void* p) { mbar_arrive_at(block(), smem_offset(p)); }

// cp.async.mbarrier.arrive.noinc.shared.b64: one arrival (counted among those expected) once
// every cp.async this thread issued so far has landed; the emulator lands them now.
inline void cp_mbar_arrive(const void* p) {
    Block& b = block();
    const int me = b.current;
    Copy* mine = b.copies + me * b.copy_cap;
    for (int i = 0; i < b.pending[me]; ++i) {
        __builtin_memcpy(mine[i].dst, mine[i].src, mine[i].bytes);
        __builtin_memset(static_cast<char*>(mine[i].dst) + mine[i].bytes, 0, 16 - mine[i].bytes);
    }
    b.pending[me] = 0;
    mbar_arrive_at(b, smem_offset(p));
}

// mbarrier.try_wait.parity.shared.b64 until it succeeds: returns once the phase of `parity`
// (the current one's, or the one before it) has completed, parking the thread until then.
inline void mbar_wait(const void* p, int parity) {
    Block& b = block();
    const int me = b.current;
    b.mbar_addr[me] = smem_offset(p);
    b.mbar_parity[me] = parity & 1;
    if (mbar_done(b, me)) return;
    wait(kMbarrier);
}

// %cluster_ctarank: the block's rank in its cluster (0 without clusters).
inline int cluster_rank() { return block().rank; }

// barrier.cluster.arrive.release then barrier.cluster.wait.acquire: parks the thread until
// every thread of every block of the cluster has arrived (a thread that left never does).
inline void cluster_sync(int line) {
    (void)line;
    Block& b = block();
    Cluster& cl = *b.cluster;
    const int me = b.current;
    b.cluster_gen[me] = cl.generation;
    if (++cl.arrived == cl.size * b.threads) {
        cl.arrived = 0;
        ++cl.generation;
        return;
    }
    wait(kClusterSync);
}

// The block of rank `rank` in the caller's cluster, which must not have left: its shared
// memory and mbarriers are gone on a device once its threads have all returned.
inline Block& cluster_block(int rank) {
    Block& b = block();
    if (rank < 0 || rank >= b.cluster->size) fail("a rank outside the block's cluster");
    Block& to = *b.cluster->blocks[rank];
    bool left = true;
    for (int i = 0; i < to.threads && left; ++i) left = to.state[i] == State::Done;
    if (left) fail("an arrival or a copy into a block of the cluster that has left");
    return to;
}

// mapa.shared::cluster then mbarrier.arrive.release.cluster.shared::cluster.b64: one arrival
// on the mbarrier at `p`'s offset in the shared memory of block `rank` of the cluster.
inline void mbar_arrive_remote(const void* p, int rank) {
    const unsigned addr = smem_offset(p);
    mbar_arrive_at(cluster_block(rank), addr);
}

// cp.async.bulk.tensor...multicast::cluster: the box of tma_load into every block of the
// cluster whose bit is set in `ranks`, at `dst`'s offset there, its bytes counted on the
// mbarrier at `bar`'s offset there. Bytes may reach another block before its phase expects
// them (a device counts them against the phase's expectation when that arrives), so only
// this block's own copy is checked against its phase's expectation.
inline void tma_load_multicast(void* dst, const unsigned long long* map, int x, int y,
                               const void* bar, unsigned short ranks) {
    Block& me = block();
    const unsigned at = smem_offset(dst), bar_at = smem_offset(bar);
    if (ranks == 0 || ranks >> me.cluster->size != 0)
        fail("a multicast to blocks outside the cluster (or to none)");
    for (int r = 0; r < me.cluster->size; ++r) {
        if (!(ranks >> r & 1)) continue;
        Block& to = cluster_block(r);
        if (&to == &me) {
            tma_load(dst, map, x, y, bar);
            continue;
        }
        if (to.dyn == nullptr || at - kSharedWindow >= to.shared_bytes)
            fail("a multicast into a block without that shared memory");
        unsigned char* const there = to.dyn + (at - kSharedWindow);
        const size_t bytes = box_bytes(map);
        if (at - kSharedWindow + bytes > to.shared_bytes)
            fail("a TMA box past the kernel's dynamic shared memory");
        if (to.tma_count == kMaxTma) fail("more TMA copies in flight than the emulator holds");
        mbar_of(to, bar_at);  // initialized there
        Tma& t = to.tma[to.tma_count++];
        t.bar = bar_at;
        t.dst = there;
        for (int i = 0; i < 16; ++i) t.map[i] = map[i];
        t.at[0] = x;
        t.at[1] = y;
        t.at[2] = t.at[3] = 0;
        __builtin_memset(there, 0xff, bytes);
    }
}

typedef float f32x16 __attribute__((vector_size(64)));
typedef unsigned short frag4 __attribute__((vector_size(8)));

// Four f32 values as one fragment of the input type's 16-bit values.
inline frag4 pack4(float a, float b, float c, float d) {
#if KT_DTYPE != 2
    const frag4 f = {f32_f16(a), f32_f16(b), f32_f16(c), f32_f16(d)};
#else
    const frag4 f = {f32_bf16(a), f32_bf16(b), f32_bf16(c), f32_bf16(d)};
#endif
    return f;
}

typedef float f32x4 __attribute__((vector_size(16)));

// v_mfma_f32_NxNxK: acc += A·B over a 64-lane wave, in the layout of AMD's CDNA ISA guides
// (CK's tables say the same): lane l passes A row l % N and B column l % N, each PER = K·N / 64
// consecutive values at k = PER·(l / N) onward (eight bytes: `value(bytes, i)` reads the i-th);
// accumulator element e of lane l is column l % N, row 4·(l / N) + (256 / N)·(e / 4) + e % 4
// (32×32: 8·(e / 4) + 4·(l / 32) + e % 4; 16×16: 4·(l / 16) + e).
template <int N, int K, typename Acc, class Value>
inline Acc mfma(frag4 a, frag4 bv, Acc acc, Value value) {
    constexpr int per = K * N / 64;
    Block& b = block();
    const int me = b.current;
    const int base = wave_base("an MFMA in a wave the block does not fill");
    __builtin_memcpy(b.xa[me], &a, sizeof a);
    __builtin_memcpy(b.xb[me], &bv, sizeof bv);
    wait(kMfma);
    const int lane = me - base, col = lane % N;
    // The lane's column of B, read once: it feeds every one of the lane's N·N / 64 sums.
    float bcol[K];
    for (int k = 0; k < K; ++k) {
        unsigned char y[8];
        __builtin_memcpy(y, b.xb[base + N * (k / per) + col], sizeof y);
        bcol[k] = value(y, k % per);
    }
    Acc out;
    for (int e = 0; e < N * N / 64; ++e) {
        const int row = 4 * (lane / N) + (256 / N) * (e / 4) + e % 4;
        float sum = acc[e];
        for (int k = 0; k < K; ++k) {
            unsigned char x[8];
            __builtin_memcpy(x, b.xa[base + N * (k / per) + row], sizeof x);
            sum = fmaf(value(x, k % per), bcol[k], sum);
        }
        out[e] = sum;
    }
    wait(kMfma);
    return out;
}

// The i-th 16-bit value (f16 or bf16) of a lane's eight bytes.
inline float half_at(const unsigned char* p, int i) {
    unsigned short v;
    __builtin_memcpy(&v, p + 2 * i, sizeof v);
    return half_f32(v);
}
inline f32x16 mfma_32x32x8(frag4 a, frag4 bv, f32x16 acc) {
    return mfma<32, 8>(a, bv, acc, half_at);
}
inline f32x4 mfma_16x16x16(frag4 a, frag4 bv, f32x4 acc) {
    return mfma<16, 16>(a, bv, acc, half_at);
}

// The value of an E4M3 FNUZ byte (gfx942's fp8: bias 8): its f16 reading times 2^7, exact.
inline float fnuz_f32(unsigned x) {
    return f16_f32((unsigned short)(((x & 0x7fu) << 7) | ((x & 0x80u) << 8))) * 128.0f;
}

// v_mfma_f32_32x32x16_fp8_fp8 on E4M3 FNUZ bytes: a lane's eight bytes where 32x32x8 has its
// four 16-bit values.
inline f32x16 mfma_32x32x16_fp8(frag4 a, frag4 bv, f32x16 acc) {
    return mfma<32, 16>(a, bv, acc, [](const unsigned char* p, int i) { return fnuz_f32(p[i]); });
}

}  // namespace kt_host
#pragma GCC pop_options

// The exported launcher of a build, `name`; the rest of the arguments are its kernels in entry
// order. A unit holds several builds, each with a launcher of its own name.
#define KT_HOST_ENTRIES(name, ...)                                                              \
    static const kt_host::Entry name##_entries[] = {__VA_ARGS__};                               \
    extern "C" int name(int entry, const unsigned* grid, unsigned threads, void** params,       \
                        char* err, kt_host::size_t err_len) {                                   \
        return kt_host::launch(name##_entries,                                                  \
                               (int)(sizeof name##_entries / sizeof name##_entries[0]), entry,  \
                               grid, threads, params, err, err_len);                            \
    }
