#include "runtime/tensor/trace.h"

#include "runtime/core/error.h"

namespace kiln::detail {
thread_local TraceObserver* t_trace_observer __attribute__((tls_model("initial-exec"))) = nullptr;

TraceObserver* set_trace_observer(TraceObserver* o) {
  TraceObserver* prev = t_trace_observer;
  t_trace_observer = o;
  return prev;
}

void TraceObserver::cannot_trace(const std::string& why) { throw Error(why); }

Untraced::Untraced() : observer_(set_trace_observer(this)), oracle_(set_shape_oracle(nullptr)) {}
Untraced::~Untraced() {
  set_trace_observer(observer_);
  set_shape_oracle(oracle_);
}
bool Untraced::on_materialize(const std::vector<Node*>&, const NodePtr*, size_t) {
  throw Error("a graph recorded apart from the program (a pattern's search, a gradient rule's probe) needs data");
}

}  // namespace kiln::detail
