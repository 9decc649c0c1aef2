// Baselines of the workload suite, each in its own translation unit (own compile flags, no
// kiln headers): hand-written loops (-O3 -march=native), xtensor expressions, LibTorch eager.
#pragma once
#include <string>

#include "bench_common.h"

namespace bench::hand {
// Single pass over the particles (1 thread, or split in `threads` static chunks over TBB).
Runner<W1Result> w1(const W1Data& d, int threads);
// The pairwise loop: per particle i, one pass over every j (x, y, z in registers, one sqrt and
// one division per pair), rows split over `threads`.
Runner<W7Result> w7(const W7Data& d, int threads);
// Row by row: mean/var, normalize+affine+gelu+running max, exp+sum, scale (one row in L1).
Runner<W3Result> w3_fwd(const W3Data& d, int threads);
// The same in explicit AVX-512 with glibc libmvec's erf/exp (needs AVX-512 and cols % 16 == 0).
bool have_mvec();
Runner<W3Result> w3_fwd_mvec(const W3Data& d, int threads);
// Memory bandwidth in GB/s over buffers of `floats` elements (STREAM byte counting:
// copy 2 x 4 bytes per element, triad a = b + s c 3 x 4 bytes per element).
double copy_gbs(int64_t floats, int threads, int reps);
double triad_gbs(int64_t floats, int threads, int reps);
}  // namespace bench::hand

namespace bench::xt {
bool available();
std::string info();
Runner<W1Result> w1(const W1Data& d);
Runner<W3Result> w3_fwd(const W3Data& d);
}  // namespace bench::xt

namespace bench::torchb {
bool available();
std::string info();
void set_threads(int n);
Runner<W1Result> w1(const W1Data& d);
Runner<W2Result> w2(const W2Data& d);
Runner<W3Result> w3_fwd(const W3Data& d);
Runner<W3Result> w3_fwdbwd(const W3Data& d);
// relu(2x + 1) on a 16-element tensor; result() returns the last output in W3Result::y.
Runner<W3Result> w5(const std::vector<float>& x);
}  // namespace bench::torchb
