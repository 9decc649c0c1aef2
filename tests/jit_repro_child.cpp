// Child process of tests/test_jit.cpp's JitReproducible tests: evaluates the JIT differential
// random graphs (tests/jit_random_graphs.h) on the current executor (KILN_JIT, KILN_CACHE_DIR
// from the environment, read once per process) and writes one line per output:
//
//   jit_repro_child OUT FIRST COUNT      graphs FIRST..FIRST+COUNT-1 (family g/4, variant g%4)
//
//   OUT lines: "<graph> <pass> <output> <dtype> <numel> <fnv1a of the values' bits>"
//
// Each graph is evaluated twice (pass 0 and 1; between them the tiered JIT may have swapped in
// LLVM code for kernels the first pass ran on asmjit). Inputs are regenerated per pass from the
// graph's seed, so both passes and every process compute from the same bits.
#include <cinttypes>
#include <cmath>
#include <limits>

#include "jit_random_graphs.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: jit_repro_child OUT FIRST COUNT\n");
    return 2;
  }
  FILE* out = std::fopen(argv[1], "w");
  if (!out) return 3;
  const int first = std::atoi(argv[2]), count = std::atoi(argv[3]);
  const uint64_t seed = test_seed();
  for (int g = first; g < first + count; ++g) {
    Program p = make_program(seed, g / 4, g % 4);
    for (int pass = 0; pass < 2; ++pass) {
      std::vector<Result> rs;
      try {
        rs = evaluate(p);
      } catch (const std::exception& e) {
        std::fprintf(out, "%d %d threw\n", g, pass);
        continue;
      }
      for (size_t o = 0; o < rs.size(); ++o) {
        uint64_t h = 1469598103934665603ull;
        auto mix = [&](const void* data, size_t n) {
          const unsigned char* c = static_cast<const unsigned char*>(data);
          for (size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 1099511628211ull;
        };
        // Floats as their own dtype's bits (float32 values were widened exactly), every NaN as
        // one quiet NaN: a NaN's sign and payload are not part of the result (LLVM's LangRef
        // leaves them unspecified and may commute an fmul; x86 returns the first operand's NaN,
        // and a negation inside silu flips its sign), so tiers agree on all other bits.
        for (double d : rs[o].f) {
          if (std::isnan(d)) d = std::numeric_limits<double>::quiet_NaN();
          if (rs[o].dt == kF32) {
            float f = static_cast<float>(d);
            mix(&f, sizeof f);
          } else {
            mix(&d, sizeof d);
          }
        }
        for (int64_t i : rs[o].i) mix(&i, sizeof i);
        std::fprintf(out, "%d %d %zu %s %zu %016" PRIx64 "\n", g, pass, o, kiln::dtype_name(rs[o].dt),
                     rs[o].f.size() + rs[o].i.size(), h);
      }
    }
  }
  kiln::jit::wait_background_compiles();
  std::fclose(out);
  std::printf("ok graphs=%d\n", count);
  return 0;
}
