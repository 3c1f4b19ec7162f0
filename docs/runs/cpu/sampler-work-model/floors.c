// The machine's floors for the sampler's work model (floors.py compiles and
// runs this): on the OpenMP threads at once, each over its own share,
//   stream   - sum a 256 MiB buffer of uint32 (read), copy it (read + write);
//   gather   - sum table[idx[i]] over 2^24 random indices into a table of S
//              bytes (independent reads: the core overlaps them, as the
//              sampler's prefetched draws let it), S = 192 KiB (one key
//              table, the L2), 24 MiB (one head's tables), 48 MiB (both);
//   chase    - i = table[i] around one random cycle of S bytes (each read
//              waits for the one before: the latency);
//   scatter  - out[perm[i]] = i over a random permutation of 2^20 slots
//              (4 MiB: a chunk's slots on 2 threads, the L3) and of 2^24
//              (64 MiB: an edge-sized buffer, past it).
// Prints one JSON object: GB/s for the streams, ns an element (wall time
// over the elements of all threads) for the rest; medians of 7 runs.
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint32_t *buf, *dst, *idx, *out;
static size_t nbuf = (size_t)64 << 20, n = (size_t)1 << 24, m, steps;
static volatile uint64_t sink;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

static uint64_t mix(uint64_t z) {  // SplitMix64
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median(void (*fn)(void)) {
  double t[7];
  fn();  // warm-up
  for (int r = 0; r < 7; ++r) {
    double s = now();
    fn();
    t[r] = now() - s;
  }
  qsort(t, 7, sizeof(double), cmp);
  return t[3];
}

static void stream_read(void) {
  uint64_t acc = 0;
#pragma omp parallel for reduction(+ : acc)
  for (size_t i = 0; i < nbuf; ++i) acc += buf[i];
  sink = acc;
}

static void stream_copy(void) {
#pragma omp parallel for
  for (size_t i = 0; i < nbuf; ++i) dst[i] = buf[i];
}

static void gather(void) {
  uint64_t acc = 0;
#pragma omp parallel for reduction(+ : acc)
  for (size_t i = 0; i < n; ++i) acc += buf[idx[i]];
  sink = acc;
}

static void chase(void) {
  uint64_t acc = 0;
#pragma omp parallel reduction(+ : acc)
  {
    uint32_t p = (uint32_t)((size_t)omp_get_thread_num() * 977 % m);
    size_t mine = steps / omp_get_num_threads();
    for (size_t i = 0; i < mine; ++i) p = buf[p];
    acc += p;
  }
  sink = acc;
}

static size_t slots;

static void scatter(void) {
  // The n stores over the first `slots` entries of the permutation's
  // targets, folded into range.
#pragma omp parallel for
  for (size_t i = 0; i < n; ++i) out[idx[i] & (slots - 1)] = (uint32_t)i;
}

int main(void) {
  buf = malloc(nbuf * 4);
  dst = malloc(nbuf * 4);
  for (size_t i = 0; i < nbuf; ++i) buf[i] = (uint32_t)mix(i);
  memset(dst, 0, nbuf * 4);
  printf("{\"threads\": %d", omp_get_max_threads());
  printf(", \"stream_read_GBps\": %.3f", nbuf * 4 / median(stream_read) / 1e9);
  printf(", \"stream_copy_GBps\": %.3f", 2.0 * nbuf * 4 / median(stream_copy) / 1e9);
  idx = malloc(n * 4);
  const size_t sizes[3] = {192 << 10, 24 << 20, 48 << 20};
  const char* names[3] = {"192KiB", "24MiB", "48MiB"};
  for (int k = 0; k < 3; ++k) {
    m = sizes[k] / 4;
    for (size_t i = 0; i < n; ++i) idx[i] = (uint32_t)(mix(i + 7 * (size_t)k) % m);
    printf(", \"gather_%s_ns\": %.3f", names[k], 1e9 * median(gather) / n);
    // One random cycle over the table (Sattolo's shuffle).
    for (size_t i = 0; i < m; ++i) buf[i] = (uint32_t)i;
    for (size_t i = m - 1; i > 0; --i) {
      size_t j = mix(i * 31 + (size_t)k) % i;
      uint32_t t = buf[i];
      buf[i] = buf[j];
      buf[j] = t;
    }
    steps = n / 8;
    printf(", \"chase_%s_ns\": %.3f", names[k], 1e9 * median(chase) / steps);
  }
  for (size_t i = 0; i < n; ++i) idx[i] = (uint32_t)i;
  for (size_t i = n - 1; i > 0; --i) {
    size_t j = mix(i) % (i + 1);
    uint32_t t = idx[i];
    idx[i] = idx[j];
    idx[j] = t;
  }
  out = calloc(n, 4);
  slots = (size_t)1 << 20;
  printf(", \"scatter_4MiB_ns\": %.3f", 1e9 * median(scatter) / n);
  slots = n;
  printf(", \"scatter_64MiB_ns\": %.3f}\n", 1e9 * median(scatter) / n);
  return 0;
}
