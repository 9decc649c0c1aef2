#include "runtime/trace.h"

namespace kiln::detail {
namespace {
thread_local TraceObserver* t_observer = nullptr;
}

TraceObserver* trace_observer() { return t_observer; }

TraceObserver* set_trace_observer(TraceObserver* o) {
  TraceObserver* prev = t_observer;
  t_observer = o;
  return prev;
}

}  // namespace kiln::detail
