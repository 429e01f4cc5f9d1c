/* Standalone twin of kwk's roofline peaks (runners/kwk/src/kernels/peaks.rs), written
 * independently in C so the figures kwk-eval reports can be checked against a second
 * program: float32 FMA, int8 dot and bf16 dot throughput (12 independent accumulators,
 * inline assembly so nothing is hoisted) and read bandwidth over a buffer (READ_STREAMS
 * lock-step streams per thread, as kwk reads it), with N threads, best of 5 trials.
 * Counting as in kwk: FMA = 2 ops, a byte product added = 2, a vdpbf16ps lane = 4.
 *
 * Build and run: scripts/peaks-microbench.sh [TIER] [THREADS]
 * TIER: amx | vnni | avx512bw | avxvnni | avx2 | sse2 (the int8 instruction and the vector
 * width; amx is tdpbssd on full 16x64 tiles, 16384 multiply-adds each, with zmm floats;
 * avxvnni is vpdpbusd on ymm, VEX-encoded where the CPU has AVX-VNNI, else EVEX as kwk's
 * tier takes it from AVX512-VNNI+VL; sse2 is kwk's scalar tier on x86-64: mulps+addps, and
 * pmaddwd+paddd for its quantized dots). */
#define _GNU_SOURCE
#include <pthread.h>

#define READ_STREAMS 4
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define REP12(I) I(0) I(1) I(2) I(3) I(4) I(5) I(6) I(7) I(8) I(9) I(10) I(11)

/* Each loop: iters x 12 instructions on registers zmm/ymm 0..11 with operands in 12..14. */
#define LOOP(NAME, SETUP, INSTR)                                                         \
    static void NAME(long iters) {                                                     \
        __asm__ volatile(SETUP ::: "memory");                                          \
        for (long i = 0; i < iters; i++) {                                             \
            __asm__ volatile(REP12(INSTR)                                              \
                             ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5",       \
                             "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11");         \
        }                                                                              \
    }

#define FMA_Z(k) "vfmadd231ps %%zmm13, %%zmm12, %%zmm" #k "\n"
#define FMA_Y(k) "vfmadd231ps %%ymm13, %%ymm12, %%ymm" #k "\n"
#define DPB_Z(k) "vpdpbusd %%zmm13, %%zmm12, %%zmm" #k "\n"
#define DPB_YV(k) "%{vex%} vpdpbusd %%ymm13, %%ymm12, %%ymm" #k "\n"
#define DPB_YE(k) "%{evex%} vpdpbusd %%ymm13, %%ymm12, %%ymm" #k "\n"
#define BF_Z(k) "vdpbf16ps %%zmm13, %%zmm12, %%zmm" #k "\n"
#define MADD_Z(k) "vpmaddubsw %%zmm13, %%zmm12, %%zmm15\n vpmaddwd %%zmm14, %%zmm15, %%zmm15\n vpaddd %%zmm15, %%zmm" #k ", %%zmm" #k "\n"
#define MADD_Y(k) "vpmaddubsw %%ymm13, %%ymm12, %%ymm15\n vpmaddwd %%ymm14, %%ymm15, %%ymm15\n vpaddd %%ymm15, %%ymm" #k ", %%ymm" #k "\n"

/* SSE2's two-operand forms: copy, multiply, add (a pmaddwd lane adds 2 i16 products). */
#define FMA_X(k) "movaps %%xmm12, %%xmm15\n mulps %%xmm13, %%xmm15\n addps %%xmm15, %%xmm" #k "\n"
#define MADD_X(k) "movdqa %%xmm12, %%xmm15\n pmaddwd %%xmm13, %%xmm15\n paddd %%xmm15, %%xmm" #k "\n"

#define ZSET "vpxord %%zmm12, %%zmm12, %%zmm12\n vpxord %%zmm13, %%zmm13, %%zmm13\n vpternlogd $0xff, %%zmm14, %%zmm14, %%zmm14\n"
#define YSET "vpxor %%ymm12, %%ymm12, %%ymm12\n vpxor %%ymm13, %%ymm13, %%ymm13\n vpcmpeqd %%ymm14, %%ymm14, %%ymm14\n"
#define XSET "pxor %%xmm12, %%xmm12\n pxor %%xmm13, %%xmm13\n"

LOOP(fma_z, ZSET, FMA_Z)
LOOP(fma_y, YSET, FMA_Y)
LOOP(dpb_z, ZSET, DPB_Z)
LOOP(dpb_yv, YSET, DPB_YV)
LOOP(dpb_ye, YSET, DPB_YE)
LOOP(bf_z, ZSET, BF_Z)
LOOP(madd_z, ZSET, MADD_Z)
LOOP(madd_y, YSET, MADD_Y)
LOOP(fma_x, XSET, FMA_X)
LOOP(madd_x, XSET, MADD_X)

/* AMX: 8 tiles of 16 rows x 64 bytes; tmm4-5 A (3s), tmm6-7 B (5s), tmm0-3 accumulators.
 * Each thread loads the configuration (tile state is per thread). */
static void amx_loop(long iters) {
    static const unsigned char cfg[64] __attribute__((aligned(64))) = {
        1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        64, 0, 64, 0, 64, 0, 64, 0, 64, 0, 64, 0, 64, 0, 64, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        16, 16, 16, 16, 16, 16, 16, 16};
    static signed char a[16 * 64], b[16 * 64];
    for (int i = 0; i < 16 * 64; i++) { a[i] = 3; b[i] = 5; }
    __asm__ volatile("ldtilecfg (%0)\n"
                     "tilezero %%tmm0\n tilezero %%tmm1\n tilezero %%tmm2\n tilezero %%tmm3\n"
                     "tileloadd (%1,%3,1), %%tmm4\n tileloadd (%1,%3,1), %%tmm5\n"
                     "tileloadd (%2,%3,1), %%tmm6\n tileloadd (%2,%3,1), %%tmm7\n"
                     :: "r"(cfg), "r"(a), "r"(b), "r"(64L) : "memory");
    for (long i = 0; i < iters; i++)
        __asm__ volatile(
            "tdpbssd %%tmm6, %%tmm4, %%tmm0\n tdpbssd %%tmm7, %%tmm4, %%tmm1\n"
            "tdpbssd %%tmm6, %%tmm5, %%tmm2\n tdpbssd %%tmm7, %%tmm5, %%tmm3\n"
            "tdpbssd %%tmm7, %%tmm5, %%tmm0\n tdpbssd %%tmm6, %%tmm5, %%tmm1\n"
            "tdpbssd %%tmm7, %%tmm4, %%tmm2\n tdpbssd %%tmm6, %%tmm4, %%tmm3\n"
            "tdpbssd %%tmm7, %%tmm4, %%tmm0\n tdpbssd %%tmm7, %%tmm5, %%tmm1\n"
            "tdpbssd %%tmm6, %%tmm4, %%tmm2\n tdpbssd %%tmm6, %%tmm5, %%tmm3\n" ::: "memory");
    __asm__ volatile("tilerelease" ::: "memory");
}

/* The read loops: READ_STREAMS lock-step streams over equal parts, 256 bytes of a stream per
 * step in vector loads of the tier's width (kwk's read_zmm / read_ymm / scalar walk). */
__attribute__((target("avx512f"))) static uint64_t read_z(const uint64_t *d, size_t part) {
    __m512i a[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    for (size_t i = 0; i < part; i += 32)
        for (size_t s = 0; s < READ_STREAMS; s++) {
            const __m512i *p = (const __m512i *)(d + s * part + i);
            for (int k = 0; k < 4; k++) a[k] = _mm512_xor_si512(a[k], _mm512_loadu_si512(p + k));
        }
    __m512i x = _mm512_xor_si512(_mm512_xor_si512(a[0], a[1]), _mm512_xor_si512(a[2], a[3]));
    uint64_t o[8];
    _mm512_storeu_si512(o, x);
    return o[0] ^ o[1] ^ o[2] ^ o[3] ^ o[4] ^ o[5] ^ o[6] ^ o[7];
}
__attribute__((target("avx2"))) static uint64_t read_y(const uint64_t *d, size_t part) {
    __m256i a[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    for (size_t i = 0; i < part; i += 32)
        for (size_t s = 0; s < READ_STREAMS; s++) {
            const __m256i *p = (const __m256i *)(d + s * part + i);
            for (int k = 0; k < 8; k++) a[k % 4] = _mm256_xor_si256(a[k % 4], _mm256_loadu_si256(p + k));
        }
    __m256i x = _mm256_xor_si256(_mm256_xor_si256(a[0], a[1]), _mm256_xor_si256(a[2], a[3]));
    uint64_t o[4];
    _mm256_storeu_si256((__m256i *)o, x);
    return o[0] ^ o[1] ^ o[2] ^ o[3];
}
static uint64_t read_x(const uint64_t *d, size_t part) {
    uint64_t a = 0, b = 0, c = 0, e = 0;
    for (size_t i = 0; i < part; i += 32)
        for (size_t s = 0; s < READ_STREAMS; s++) {
            const uint64_t *p = d + s * part + i;
            for (int k = 0; k < 32; k += 4) { a ^= p[k]; b ^= p[k + 1]; c ^= p[k + 2]; e ^= p[k + 3]; }
        }
    return a ^ b ^ c ^ e;
}
static int read_width = 0; /* 512, 256, or 0 for the scalar tier */

typedef void (*loop_fn)(long);

struct job {
    loop_fn fn;
    long iters;
    const uint64_t *data;
    size_t n;
    uint64_t out;
    double t0, t1;
    pthread_barrier_t *bar;
};

static void *run_job(void *arg) {
    struct job *j = arg;
    pthread_barrier_wait(j->bar);
    j->t0 = now();
    if (j->fn) {
        j->fn(j->iters);
    } else {
        /* One stream per core under-reads some memory systems; see the read loops. */
        size_t part = j->n / (READ_STREAMS * 32) * 32;
        j->out = read_width == 512 ? read_z(j->data, part)
               : read_width == 256 ? read_y(j->data, part) : read_x(j->data, part);
    }
    j->t1 = now();
    return NULL;
}

/* Seconds from the first start to the last end of `threads` jobs. */
static double parallel(int threads, loop_fn fn, long iters, const uint64_t *data, size_t per) {
    pthread_t th[256];
    struct job jobs[256];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, threads);
    for (int t = 0; t < threads; t++) {
        jobs[t] = (struct job){fn, iters, data ? data + t * per : NULL, per, 0, 0, 0, &bar};
        pthread_create(&th[t], NULL, run_job, &jobs[t]);
    }
    double t0 = 1e300, t1 = 0;
    uint64_t sink = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(th[t], NULL);
        if (jobs[t].t0 < t0) t0 = jobs[t].t0;
        if (jobs[t].t1 > t1) t1 = jobs[t].t1;
        sink ^= jobs[t].out;
    }
    pthread_barrier_destroy(&bar);
    if (sink == 42) fprintf(stderr, " ");
    return t1 - t0;
}

/* Best ops/s of `fn` (ops per iteration `ops`) over 5 trials of about 40 ms. */
static double peak(int threads, loop_fn fn, double ops) {
    long iters = 1 << 12;
    for (;;) {
        double t = now();
        fn(iters);
        double dt = now() - t;
        if (dt > 0.005) { iters = (long)(iters * 0.040 / dt); break; }
        iters *= 4;
    }
    double best = 0;
    for (int k = 0; k < 5; k++) {
        double r = iters * ops * threads / parallel(threads, fn, iters, NULL, 0);
        if (r > best) best = r;
    }
    return best;
}

int main(int argc, char **argv) {
    const char *tier = argc > 1 ? argv[1] : "vnni";
    int threads = argc > 2 ? atoi(argv[2]) : 2;
    size_t mib = argc > 3 ? (size_t)atol(argv[3]) : 256;
    if (threads < 1 || threads > 256) { fprintf(stderr, "error: THREADS must be 1..256\n"); return 2; }
    int sse2 = !strcmp(tier, "sse2");
    int avxvnni = !strcmp(tier, "avxvnni");
    int amx = !strcmp(tier, "amx");
    /* Linux hands out the AMX tile state only when asked (ARCH_REQ_XCOMP_PERM, XTILEDATA). */
    if (amx && syscall(SYS_arch_prctl, 0x1023, 18) != 0) {
        fprintf(stderr, "error: the OS refused AMX tile data (arch_prctl)\n");
        return 2;
    }
    int z = strcmp(tier, "avx2") != 0 && !avxvnni && !sse2;
    if (strcmp(tier, "vnni") && strcmp(tier, "avx512bw") && strcmp(tier, "avx2") && !avxvnni && !sse2 && !amx) {
        fprintf(stderr, "error: TIER must be amx, vnni, avx512bw, avxvnni, avx2 or sse2, got %s\n", tier);
        return 2;
    }
    double c = 12;
    read_width = sse2 ? 0 : z ? 512 : 256;
    printf("tier %s threads %d\n", tier, threads);
    if (sse2) {
        printf("fp32 %.1f GFLOP/s (mulps+addps xmm)\n", peak(threads, fma_x, c * 8) / 1e9);
        printf("int8 %.1f GOP/s (pmaddwd+paddd xmm)\n", peak(threads, madd_x, c * 16) / 1e9);
    } else
        printf("fp32 %.1f GFLOP/s\n", peak(threads, z ? fma_z : fma_y, c * (z ? 32 : 16)) / 1e9);
    if (sse2)
        ;
    else if (amx)
        printf("int8 %.1f GOP/s (tdpbssd amx)\n", peak(threads, amx_loop, 12.0 * 16 * 16 * 64 * 2) / 1e9);
    else if (!strcmp(tier, "vnni"))
        printf("int8 %.1f GOP/s (vpdpbusd zmm)\n", peak(threads, dpb_z, c * 128) / 1e9);
    else if (avxvnni && __builtin_cpu_supports("avxvnni"))
        printf("int8 %.1f GOP/s (vpdpbusd ymm, VEX)\n", peak(threads, dpb_yv, c * 64) / 1e9);
    else if (avxvnni)
        printf("int8 %.1f GOP/s (vpdpbusd ymm, EVEX)\n", peak(threads, dpb_ye, c * 64) / 1e9);
    else
        printf("int8 %.1f GOP/s (vpmaddubsw+vpmaddwd+vpaddd)\n", peak(threads, z ? madd_z : madd_y, c * (z ? 128 : 64)) / 1e9);
    if ((!strcmp(tier, "vnni") || amx) && __builtin_cpu_supports("avx512bf16"))
        printf("bf16 %.1f GFLOP/s\n", peak(threads, bf_z, c * 64) / 1e9);
    size_t per = (mib << 20) / 8 / threads / 32 * 32;
    uint64_t *data = malloc(per * threads * 8);
    if (!data) { fprintf(stderr, "error: cannot allocate %zu MiB\n", mib); return 2; }
    for (size_t i = 0; i < per * threads; i++) data[i] = i * 0x9e3779b97f4a7c15ull;
    double best = 0;
    for (int k = 0; k < 5; k++) {
        double r = per * threads * 8.0 / parallel(threads, NULL, 0, data, per);
        if (r > best) best = r;
    }
    printf("read %.1f GB/s (%zu MiB buffer)\n", best / 1e9, mib);
    free(data);
    return 0;
}
