// A reference computed with the registered rewrites (kiln::patterns) off: what a hand-written graph
// computes as written (lazy eager would rewrite a hand-written reference too).
#pragma once
#include <type_traits>
#include <vector>

#include "kiln.h"

namespace kiln::testing {

// fn() evaluated with the rewrites off, then on again; fn returns a Tensor or a vector of them.
template <class F>
auto unrewritten(F fn) {
  patterns::set_enabled(false);
  auto r = fn();
  if constexpr (std::is_same_v<decltype(r), Tensor>)
    r.eval();
  else
    eval(r);
  patterns::set_enabled(true);
  return r;
}

}  // namespace kiln::testing
