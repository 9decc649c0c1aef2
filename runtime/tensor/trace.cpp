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

}  // namespace kiln::detail
