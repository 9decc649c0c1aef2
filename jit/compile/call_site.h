// Which of kiln's public functions the current thread is inside: names a size guard after the
// op that relied on it ("specialized by mean()").
#pragma once
#include <string>

namespace kiln::jit {

// The public kiln functions on this thread's stack, outermost first ("Tensor.backward() >
// reshape()"; at most three: the outermost two and the innermost); "" when none can be named
// (static or inlined frames have no symbol).
std::string kiln_call_site();

}  // namespace kiln::jit
