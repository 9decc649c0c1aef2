#include "runtime/tensor/trace.h"

namespace kiln::detail {
thread_local TraceObserver* t_trace_observer __attribute__((tls_model("initial-exec"))) = nullptr;

TraceObserver* set_trace_observer(TraceObserver* o) {
  TraceObserver* prev = t_trace_observer;
  t_trace_observer = o;
  return prev;
}

}  // namespace kiln::detail
