// Function multiversioning for the vectorized loops: each marked function is
// compiled for AVX-512, AVX2 and the baseline, and the loader picks the best
// the CPU has, so the build needs no -march and runs on any x86-64.
#pragma once

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
    defined(__linux__)
#define SBM_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SBM_CLONES
#endif

// A second build of a function for AVX2 with fused multiply-add, taken at
// run time where the CPU has both (target_clones cannot name the pair, and
// its "arch=" clones test the CPU model, not its features).
#if defined(__GNUC__) && defined(__x86_64__)
#define SBM_AVX2_FMA __attribute__((target("avx2,fma")))
inline bool sbm_cpu_has_avx2_fma() {
  static const bool yes =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}
#else
#define SBM_AVX2_FMA
inline bool sbm_cpu_has_avx2_fma() { return false; }
#endif

#define SBM_INLINE inline __attribute__((always_inline))
