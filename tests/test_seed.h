// Seeds and mixing shared by the randomized tests (KILN_TEST_SEED reproduces a run).
#pragma once
#include <cstdint>
#include <cstdlib>
#include <string>

#include "runtime/core/device.h"
#include "fake_device.h"

namespace kiln::testing {

// SplitMix64 finalizer: a well-mixed 64-bit hash of x.
inline uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// KILN_TEST_SEED if set, else `fallback`.
inline uint64_t test_seed(uint64_t fallback) {
  const char* s = std::getenv("KILN_TEST_SEED");
  return (s && *s) ? std::strtoull(s, nullptr, 0) : fallback;
}

// KILN_JIT=interp: every segment runs on the reference interpreter (no JIT, no lazy-eager rewrites).
inline bool interpreted() {
  const char* v = std::getenv("KILN_JIT");
  return v && std::string(v) == "interp";
}

// KILN_TEST_DEVICE: "cpu" (default), "cuda" / "cuda:N", or "fake-cuda" (cuda:0 simulated in
// host memory, tests/fake_device.h), the device tests put their inputs on.
inline Device test_device() {
  const char* s = std::getenv("KILN_TEST_DEVICE");
  const std::string v = s ? s : "";
  if (v == "fake-cuda") {
    install_fake_cuda();
    return kiln::cuda(0);
  }
  if (v.rfind("cuda", 0) == 0) return kiln::cuda(v.size() > 5 ? std::atoi(v.c_str() + 5) : 0);
  return cpu();
}

}  // namespace kiln::testing
