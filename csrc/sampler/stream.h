// The counter-based random stream of the sampler's rows: SplitMix64
// (Steele, Lea & Flood 2014), one stream per (row, purpose), derived from one
// 64-bit seed. The Triton kernels (sbm_pyg/sampling/fastrg_triton.py) read the
// same streams at the same counters, so one seed gives one graph on every
// device; the dense-regime attention (attention/dense.cpp) reads a dense
// row's stream as the sampler does.
#pragma once

#include <cstdint>

namespace sbm_pyg {

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

struct Rng {
  uint64_t state;
  Rng(uint64_t seed, uint64_t row, uint64_t purpose)
      : state(mix64(seed ^ mix64(row * 4 + purpose + 0x632BE59BD9B4E019ULL))) {}
  inline uint64_t next() {
    state += 0x9E3779B97F4A7C15ULL;
    return mix64(state);
  }
  // Uniform in [0, 1) with 53 random bits.
  inline double uniform() { return (next() >> 11) * 0x1.0p-53; }
};

// The purposes of a row's streams: its degree, its draws (and a dense row's
// Bernoulli trials, the t-th key at counter t + 1), and the attention
// dropout of its weights (key column c at counter c + 1,
// sbm_pyg/ops/dropout.py).
constexpr uint64_t kStreamDegree = 0;
constexpr uint64_t kStreamDraws = 1;
constexpr uint64_t kStreamDropout = 2;

// Whether the attention weight of (row stream state, column c) is kept:
// the top 53 bits of the stream's output at counter c + 1 reach the
// threshold ceil(p 2^53).
inline bool dropout_keep(uint64_t state, uint64_t c, uint64_t threshold) {
  return (mix64(state + (c + 1) * 0x9E3779B97F4A7C15ULL) >> 11) >= threshold;
}

}  // namespace sbm_pyg
