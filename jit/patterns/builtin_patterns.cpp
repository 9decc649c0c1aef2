// kiln's own rewrites (kiln::patterns), registered on first use of the matcher.
#include "jit/compile/patterns.h"
#include "runtime/ops/ops.h"

namespace kiln::jit {

void register_attention_patterns();  // attention_patterns.cpp
void register_loss_patterns();  // loss_patterns.cpp
void register_gemm_patterns();  // gemm_patterns.cpp
void register_norm_patterns();  // norm_patterns.cpp

void register_builtin_patterns() {
  using patterns::register_replacement;
  // log(softmax(x)) -> log_softmax(x): one pass fewer, and finite where softmax underflows to 0
  // (its log would be -inf). Softmax over the last dim, ranks 1 to 4.
  for (int rank = 1; rank <= 4; ++rank) {
    register_replacement(
        "log_softmax_of_softmax_rank" + std::to_string(rank),
        [](const std::vector<Tensor>& t, const std::vector<double>&) { return log(softmax(t[0], -1)); },
        [](const std::vector<Tensor>& t, const std::vector<double>&) { return log_softmax(t[0], -1); },
        {empty(std::vector<int64_t>(static_cast<size_t>(rank), 3))});
  }
  register_attention_patterns();
  register_loss_patterns();
  register_gemm_patterns();
  register_norm_patterns();
}

}  // namespace kiln::jit
