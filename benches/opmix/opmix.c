/* Throughput of the 256-bit integer dot recipes kwk's AVX2 quantized kernels are built
 * from, next to the float32 FMA, on one thread: the measurement behind the rule written in
 * runners/kwk/src/kernels/x86_64/quant256.rs (which recipe a format's codes can use, and
 * what it can gain over float32 at best). Each loop runs 8 independent accumulators, inline
 * assembly so nothing is hoisted, best of 5 trials; a "step" is one multiply-accumulate
 * recipe on one register of operands:
 *   fp32 fma      vfmadd231ps                          8 MACs per step
 *   sign trick    vpsignb vpmaddubsw vpmaddwd vpaddd   32 MACs (signed 8-bit codes x int8)
 *   small codes   vpmaddubsw vpaddw                    32 MACs (codes < 16 x int8, i16 sums)
 *   i16 pairs     vpmaddwd vpaddd                      16 MACs (i16 x i16)
 * and two mixes of sign-trick steps and FMAs in one loop (4 accumulators each): f32 FMAs on
 * codes and activations converted to float compute a block's integer dot exactly (32
 * products below 2^15 sum below 2^24), so a kernel could hand part of its columns to the
 * FMA pipes; the mixes show whether the two kinds of work add up or share the pipes.
 * Build and run: scripts/opmix-microbench.sh */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define REP8(S) S(0, 8) S(1, 9) S(2, 10) S(3, 11) S(4, 8) S(5, 9) S(6, 10) S(7, 11)
/* Accumulators ymm0..7, operands ymm8..11 and ymm12 (activations), ymm13 (ones). */
#define FMA(a, w) "vfmadd231ps %%ymm12, %%ymm" #w ", %%ymm" #a "\n"
#define SIGN(a, w) "vpsignb %%ymm" #w ", %%ymm12, %%ymm14\n vpmaddubsw %%ymm14, %%ymm" #w ", %%ymm15\n" \
                   " vpmaddwd %%ymm13, %%ymm15, %%ymm15\n vpaddd %%ymm15, %%ymm" #a ", %%ymm" #a "\n"
#define SMALL(a, w) "vpmaddubsw %%ymm12, %%ymm" #w ", %%ymm14\n vpaddw %%ymm14, %%ymm" #a ", %%ymm" #a "\n"
#define PAIRS(a, w) "vpmaddwd %%ymm12, %%ymm" #w ", %%ymm14\n vpaddd %%ymm14, %%ymm" #a ", %%ymm" #a "\n"
/* Mixes: sign-trick accumulators ymm0..3, FMA accumulators ymm4..7. */
#define MIX_1_1 SIGN(0, 8) FMA(4, 10) SIGN(1, 9) FMA(5, 11) SIGN(2, 8) FMA(6, 10) SIGN(3, 9) FMA(7, 11)
#define MIX_3_1 SIGN(0, 8) SIGN(1, 9) FMA(4, 10) SIGN(2, 8) SIGN(3, 9) SIGN(0, 10) FMA(5, 11) SIGN(1, 11)

#define SETUP                                                                              \
    "vpxor %%ymm0, %%ymm0, %%ymm0\n vmovdqa %%ymm0, %%ymm1\n vmovdqa %%ymm0, %%ymm2\n"      \
    "vmovdqa %%ymm0, %%ymm3\n vmovdqa %%ymm0, %%ymm4\n vmovdqa %%ymm0, %%ymm5\n"           \
    "vmovdqa %%ymm0, %%ymm6\n vmovdqa %%ymm0, %%ymm7\n vpcmpeqb %%ymm8, %%ymm8, %%ymm8\n"  \
    "vpabsb %%ymm8, %%ymm8\n vmovdqa %%ymm8, %%ymm9\n vmovdqa %%ymm8, %%ymm10\n"           \
    "vmovdqa %%ymm8, %%ymm11\n vmovdqa %%ymm8, %%ymm12\n vpabsw %%ymm8, %%ymm13\n"

#define LOOP(NAME, STEP) LOOP_BODY(NAME, REP8(STEP))
#define LOOP_BODY(NAME, BODY)                                                              \
    static void NAME(long iters) {                                                         \
        __asm__ volatile(SETUP "1:\n" BODY "dec %0\n jnz 1b\n vzeroupper\n"                 \
                         : "+r"(iters)::"memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4",   \
                           "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",       \
                           "xmm12", "xmm13", "xmm14", "xmm15");                            \
    }
LOOP(run_fma, FMA)
LOOP(run_sign, SIGN)
LOOP(run_small, SMALL)
LOOP(run_pairs, PAIRS)
LOOP_BODY(run_mix_1_1, MIX_1_1)
LOOP_BODY(run_mix_3_1, MIX_3_1)

/* Steps per ns, the best of 5 trials (8 steps per loop iteration). */
static double best_steps_per_ns(void (*run)(long)) {
    const long iters = 20000000;
    double best = 0;
    for (int trial = 0; trial < 5; trial++) {
        double t = now();
        run(iters);
        double r = iters * 8 / (now() - t) / 1e9;
        if (r > best) best = r;
    }
    return best;
}

int main(void) {
    /* macs: multiply-adds per step, averaged over the 8 steps of a loop body. */
    struct { const char *name; void (*run)(long); double macs; } r[] = {
        {"fp32 fma     (vfmadd231ps)", run_fma, 8},
        {"sign trick   (vpsignb+vpmaddubsw+vpmaddwd+vpaddd)", run_sign, 32},
        {"small codes  (vpmaddubsw+vpaddw)", run_small, 32},
        {"i16 pairs    (vpmaddwd+vpaddd)", run_pairs, 16},
        {"sign trick + fma, 4:4 steps", run_mix_1_1, (4 * 32 + 4 * 8) / 8.0},
        {"sign trick + fma, 6:2 steps", run_mix_3_1, (6 * 32 + 2 * 8) / 8.0},
    };
    double fma = 0;
    for (int i = 0; i < 6; i++) {
        double steps = best_steps_per_ns(r[i].run);
        double gmacs = steps * r[i].macs;
        if (i == 0) fma = gmacs;
        printf("%-50s %5.2f steps/ns  %6.1f GMAC/s  %.2fx fp32\n", r[i].name, steps, gmacs,
               gmacs / fma);
    }
    return 0;
}
