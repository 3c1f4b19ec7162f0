// A vectorizable exp for the softmax's shifted scores, shared by the sparse
// and the dense-regime attention kernels.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "simd.h"

namespace sbm_pyg {

// exp(x) for the shifted scores (x <= 0 up to rounding), written so that
// the loops calling it vectorize: Cody-Waite range reduction x = n ln2 + r,
// Cephes' polynomial (float) or Padé form (double) for e^r, and 2^n from
// the exponent bits. Results below the smallest normal number are 0.
SBM_INLINE float exp_shifted(float x) {
  const bool under = x < -87.0f;
  x = under ? -87.0f : x;
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = ((int32_t)n + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return under ? 0.0f : p * scale;
}

SBM_INLINE double exp_shifted(double x) {
  const bool under = x < -708.0;
  x = under ? -708.0 : x;
  const double n = std::floor(x * 1.4426950408889634073599 + 0.5);
  double r = x - n * 6.93145751953125e-1;
  r -= n * 1.42860682030941723212e-6;
  const double rr = r * r;
  const double p = r * ((1.26177193074810590878e-4 * rr +
                         3.02994407707441961300e-2) * rr +
                        9.99999999999999999910e-1);
  const double q = ((3.00198505138664455042e-6 * rr +
                     2.52448340349684104192e-3) * rr +
                    2.27265548208155028766e-1) * rr +
                   2.00000000000000000009e0;
  const double e = 1.0 + 2.0 * p / (q - p);
  const int64_t bits = ((int64_t)n + 1023) << 52;
  double scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return under ? 0.0 : e * scale;
}

}  // namespace sbm_pyg
