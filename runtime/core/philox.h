// Philox4x32-10: a counter-based generator. Element i of a random op is a pure function of
// (seed, counter + i), so results do not depend on threading or evaluation order.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>

namespace kiln {

// Four 32-bit random words for (key, counter).
inline std::array<uint32_t, 4> philox4x32(uint64_t key, uint64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = 0xD2511F53ull * c0, p1 = 0xCD9E8D57ull * c2;
    uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {c0, c1, c2, c3};
}

// Uniform double in [0, 1) with 53 random bits.
inline double philox_uniform(uint64_t key, uint64_t counter) {
  auto r = philox4x32(key, counter);
  uint64_t bits = (static_cast<uint64_t>(r[0]) << 32 | r[1]) >> 11;
  return static_cast<double>(bits) * (1.0 / 9007199254740992.0);
}

// Standard normal via Box-Muller on two independent uniforms.
inline double philox_normal(uint64_t key, uint64_t counter) {
  auto r = philox4x32(key, counter);
  uint64_t b0 = (static_cast<uint64_t>(r[0]) << 32 | r[1]) >> 11;
  uint64_t b1 = (static_cast<uint64_t>(r[2]) << 32 | r[3]) >> 11;
  double u1 = (static_cast<double>(b0) + 1.0) * (1.0 / 9007199254740993.0);  // (0, 1]
  double u2 = static_cast<double>(b1) * (1.0 / 9007199254740992.0);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Uniform 64-bit word.
inline uint64_t philox_u64(uint64_t key, uint64_t counter) {
  auto r = philox4x32(key, counter);
  return static_cast<uint64_t>(r[0]) << 32 | r[1];
}

}  // namespace kiln
