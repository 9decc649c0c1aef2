// Collective nodes: attributes, recording (run at once in lazy eager, traced inside compile)
// and the runner that computes one on its group's backend.
#include "runtime/dist/collective_node.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/autograd/autograd.h"
#include "runtime/exec/collective_hook.h"
#include "runtime/tensor/record.h"
#include "runtime/tensor/trace.h"

namespace kiln::dist {
namespace {

thread_local InFlight t_in_flight;
// Set while record_collective runs its own node in lazy eager: only then may an async
// collective stay in flight (its Work waits for it). Anywhere else (a compiled program, a node
// materialized later) kiln's stream waits for it at once, before any consumer runs.
thread_local bool t_eager_call = false;

bool debug_checks() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_DIST_DEBUG");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

std::vector<size_t> as_sizes(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

// KILN_LOG=dist (or all): one line per collective run, in the user's terms.
bool log_dist() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_LOG");
    return v && (std::strstr(v, "dist") || std::strstr(v, "all"));
  }();
  return on;
}

// Every member agrees on what it is about to run: always on the host path (Gloo), where the
// exchange costs little next to the collective; on CUDA through the group's Gloo checker off the
// collective's path (settled at the next host sync of the device, before a value is read), and
// before the collective runs under KILN_DIST_DEBUG=1.
void check_agreement(Group& g, const CollAttrs& c, const Node& n, const Node& in) {
  if (n.device.type != DeviceType::CPU && !debug_checks() && !g.checks_off_path()) return;
  std::vector<int64_t> words = {static_cast<int64_t>(c.kind), static_cast<int64_t>(n.dtype),
                                static_cast<int64_t>(c.op), c.root};
  if (c.kind == CollKind::AllToAll) {
    words.push_back(static_cast<int64_t>(c.in_counts.size()));
  } else {
    words.push_back(numel(in.shape).as_int());
  }
  if (debug_checks()) {
    words.push_back(g.next_check_number());
    words.push_back(static_cast<int64_t>(in.shape.size()));
  }
  g.check_same(coll_name(c.kind), n.device, words, debug_checks());
}

// Computes Collective node `n` on its group's backend into fresh storage.
void run(Node& n) {
  const CollAttrs c = from_attrs(n.attrs);
  std::shared_ptr<Group> g = Group::find(c.group);
  const Node& in = *n.inputs[0];
  KILN_CHECK(is_contiguous_layout(in.shape, in.strides), "collective: input is not dense (internal)");
  check_agreement(*g, c, n, in);
  const size_t isz = itemsize(n.dtype);
  const size_t in_count = static_cast<size_t>(numel(in.shape).as_int());
  const size_t out_count = static_cast<size_t>(numel(n.shape).as_int());
  auto out = Storage::allocate(out_count * isz, n.device, op_name(n.op));
  const void* src = static_cast<const char*>(in.storage->data) + in.offset.as_int() * static_cast<int64_t>(isz);
  void* dst = out->data;
  const int size = g->size();
  const auto t0 = std::chrono::steady_clock::now();
  CompletionPtr done;
  // Nothing to move anywhere: skipped (every member has the same sizes, except in an all_to_all,
  // where a rank with nothing to send or receive still takes part in the others' exchange).
  if (in_count != 0 || out_count != 0 || c.kind == CollKind::AllToAll)
    done = g->run(coll_name(c.kind), n.device, [&](Backend& b) -> CompletionPtr {
      switch (c.kind) {
        case CollKind::AllReduce: return b.all_reduce(src, dst, in_count, n.dtype, c.op);
        case CollKind::Broadcast: return b.broadcast(src, dst, in_count, n.dtype, c.root);
        case CollKind::AllGather: return b.all_gather(src, dst, in_count, n.dtype);
        case CollKind::ReduceScatter:
          return b.reduce_scatter(src, dst, in_count / static_cast<size_t>(size), n.dtype, c.op);
        case CollKind::AllToAll:
          return b.all_to_all(src, as_sizes(c.in_counts), dst, as_sizes(c.out_counts), n.dtype);
      }
      return nullptr;
    });
  if (log_dist()) {
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "[kiln:dist] %s%s%s %s %s -> %s on %s, group of %d (rank %d of it): %s %.3f ms%s\n",
                 coll_name(c.kind), c.kind == CollKind::AllReduce || c.kind == CollKind::ReduceScatter ? " " : "",
                 c.kind == CollKind::AllReduce || c.kind == CollKind::ReduceScatter ? reduce_op_name(c.op) : "",
                 dtype_name(n.dtype), kiln::detail::str(in.shape).c_str(), kiln::detail::str(n.shape).c_str(),
                 n.device.str().c_str(), size, g->rank(), done ? "queued in" : "done in", ms,
                 done && c.async && t_eager_call ? " (async: its Work waits)" : "");
  }
  InFlight f{done, {in.storage, out}};
  if (done && !(c.async && t_eager_call)) {
    done->wait();  // kiln's stream waits for it; later frees are ordered after it
    f = {};
  }
  t_in_flight = std::move(f);
  n.set_storage(std::move(out), false);
}

struct RegisterRunner {
  RegisterRunner() { kiln::detail::set_collective_runner(&run); }
} g_register_runner;

}  // namespace

const char* coll_name(CollKind k) {
  switch (k) {
    case CollKind::AllReduce: return "all_reduce";
    case CollKind::Broadcast: return "broadcast";
    case CollKind::AllGather: return "all_gather";
    case CollKind::ReduceScatter: return "reduce_scatter";
    case CollKind::AllToAll: return "all_to_all";
  }
  return "collective";
}

Attrs to_attrs(const CollAttrs& c) {
  Attrs a;
  a.ints = {static_cast<int64_t>(c.kind), c.group, static_cast<int64_t>(c.op), c.root, c.async ? 1 : 0,
            static_cast<int64_t>(c.in_counts.size())};
  a.ints.insert(a.ints.end(), c.in_counts.begin(), c.in_counts.end());
  a.ints.insert(a.ints.end(), c.out_counts.begin(), c.out_counts.end());
  return a;
}

CollAttrs from_attrs(const Attrs& a) {
  CollAttrs c;
  c.kind = static_cast<CollKind>(a.ints[0]);
  c.group = a.ints[1];
  c.op = static_cast<ReduceOp>(a.ints[2]);
  c.root = static_cast<int>(a.ints[3]);
  c.async = a.ints[4] != 0;
  const auto n = static_cast<size_t>(a.ints[5]);
  c.in_counts.assign(a.ints.begin() + 6, a.ints.begin() + 6 + static_cast<std::ptrdiff_t>(n));
  c.out_counts.assign(a.ints.begin() + 6 + static_cast<std::ptrdiff_t>(n), a.ints.end());
  return c;
}

Tensor record_collective(const CollAttrs& c, const Tensor& input, Shape out_shape) {
  Tensor x = input.contiguous();
  Tensor out;
  {
    NoGradGuard no_grad;  // the functional forms attach their own gradients
    out = kiln::detail::record(OpKind::Collective, {x}, to_attrs(c), x.dtype(), std::move(out_shape));
  }
  if (!kiln::detail::trace_observer()) {
    t_in_flight = {};
    struct EagerCall {
      EagerCall() { t_eager_call = true; }
      ~EagerCall() { t_eager_call = false; }
    } eager;
    out.eval();  // lazy eager: run now, in call order (every rank makes the same calls)
  }
  return out;
}

InFlight take_in_flight() { return std::exchange(t_in_flight, {}); }

}  // namespace kiln::dist
