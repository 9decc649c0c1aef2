// The DTensor dispatcher: an op with a DTensor input runs on the shards. For every mesh dim the
// op family's rule offers strategies (rules/), the all-Replicate one is added, each is costed
// by the bytes its redistributions move (ties: the fewest changed placements) and the cheapest
// is taken; the inputs are redistributed to it (collectives recorded on the shards), the op is
// recorded on the shards and the result placed with the strategy's output placements.
// Installed as the tensor layer's placed hooks (runtime/tensor/placed_hooks.h).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>

#include "runtime/dtensor/layout.h"
#include "runtime/ops/ops.h"
#include "runtime/dtensor/placed.h"
#include "runtime/dtensor/rules/rule.h"
#include "runtime/tensor/placed_hooks.h"
#include "runtime/tensor/record.h"
#include "runtime/tensor/trace.h"

namespace kiln::dist::detail_dt {
namespace {

// KILN_LOG=dtensor (or dist, all): one line per op on DTensors, with the placements chosen.
bool log_dtensor() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_LOG");
    return v && (std::strstr(v, "dtensor") || std::strstr(v, "dist") || std::strstr(v, "all"));
  }();
  return on;
}

std::string placements_str(const std::vector<Placement>& p) {
  std::string s = "[";
  for (size_t i = 0; i < p.size(); ++i) s += (i ? ", " : "") + p[i].str();
  return s + "]";
}

// An op with no rule, said once per op kind (only when inputs had to be gathered for it).
void warn_no_rule(OpKind op) {
  static std::mutex mu;
  static std::set<OpKind> said;
  std::lock_guard<std::mutex> lock(mu);
  if (!said.insert(op).second) return;
  std::fprintf(stderr,
               "[kiln] warning: DTensor: %s has no sharding rule; its inputs are replicated (gathered on every "
               "rank) to run it. Not said again for %s.\n",
               op_name(op), op_name(op));
}

// Bytes moved to bring one input from `from` to `to` along a mesh dim of `n` ranks.
double move_cost(const Placement& from, const Placement& to, double bytes, int64_t n) {
  if (from == to || n == 1) return 0;
  const double f = static_cast<double>(n - 1) / static_cast<double>(n);
  if (from.is_replicate()) return 0;  // a local cut or a local division
  if (to.is_replicate()) return from.is_partial() ? 2 * f * bytes : f * bytes;  // all_reduce / all_gather
  if (to.is_shard()) return f * bytes;  // reduce_scatter, or Shard(i)->Shard(j) through a gather
  return from.is_partial() ? 2 * f * bytes : f * bytes;  // to another Partial: through Replicate
}

// The placements chosen for one op: per input, and the output's.
struct Plan {
  std::vector<std::vector<Placement>> inputs;
  std::vector<Placement> output;
  bool replicated_without_rule = false;
  rules::LocalFn local = nullptr;  // a strategy computing the shard its own way (on mesh dim local_dim)
  size_t local_dim = 0;
};

Plan plan_op(const rules::OpView& v) {
  const std::vector<std::vector<Placement>>& current = v.in_placements;
  const DeviceMesh& mesh = v.mesh;
  const size_t n_in = v.in_shapes.size(), n_mesh = static_cast<size_t>(mesh.ndim());
  const rules::Rule rule = rules::rule_for(v.op);
  std::vector<double> bytes(n_in);
  for (size_t i = 0; i < n_in; ++i) {
    double e = static_cast<double>(itemsize(v.in_dtypes[i]));
    for (int64_t s : v.in_shapes[i]) e *= static_cast<double>(s);
    bytes[i] = e;
  }
  Plan plan;
  plan.inputs.assign(n_in, std::vector<Placement>(n_mesh, Replicate()));
  plan.output.assign(n_mesh, Replicate());
  for (size_t m = 0; m < n_mesh; ++m) {
    rules::Strategies options = rule ? rule(v, m) : rules::Strategies{};
    options.push_back({rules::all(n_in, Replicate()), Replicate()});
    double best = 0;
    const rules::Strategy* chosen = nullptr;
    for (const rules::Strategy& s : options) {
      double cost = 0;
      int changes = 0;
      for (size_t i = 0; i < n_in; ++i) {
        cost += move_cost(current[i][m], s.inputs[i], bytes[i], mesh.shape()[m]);
        changes += current[i][m] != s.inputs[i] ? 1 : 0;
      }
      cost += 1e-3 * changes;  // equal bytes: keep what is there
      if (!chosen || cost < best) {
        best = cost;
        chosen = &s;
      }
    }
    for (size_t i = 0; i < n_in; ++i) plan.inputs[i][m] = chosen->inputs[i];
    plan.output[m] = chosen->output;
    if (chosen->local) {
      plan.local = chosen->local;
      plan.local_dim = m;
    }
    if (!rule)
      for (size_t i = 0; i < n_in; ++i) plan.replicated_without_rule |= current[i][m] != chosen->inputs[i];
  }
  return plan;
}

// The mesh of the placed inputs (kiln::Error when they differ).
const DeviceMesh& mesh_of(const NodeList& inputs, OpKind op) {
  const PlacedLayout* first = nullptr;
  for (const NodePtr& n : inputs)
    if (const PlacedLayout* l = layout_of(*n)) {
      if (!first) first = l;
      KILN_CHECK(l->mesh.mesh() == first->mesh.mesh() && l->mesh.shape() == first->mesh.shape(), op_name(op),
                 ": DTensor inputs on different meshes (", kiln::detail::str(first->mesh.shape()), " and ",
                 kiln::detail::str(l->mesh.shape()), "); redistribute them onto one mesh first");
    }
  return first->mesh;
}

// The reason is the same for every op (compile says it once per function; the op that met it
// is in KILN_LOG=dtensor).
void stop_any_trace(OpKind op) {
  if (auto* o = kiln::detail::trace_observer()) {
    if (log_dtensor()) std::fprintf(stderr, "[kiln] dtensor: %s met while tracing\n", op_name(op));
    o->cannot_trace("a DTensor (kiln::compile does not trace DTensor programs yet)");
  }
}

// Everything an op on placed inputs needs: global shapes, placements, and the plan.
struct Prepared {
  OpKind op;
  Attrs attrs;
  DType dtype;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<DType> dtypes;
  std::vector<std::vector<Placement>> current;
  std::vector<int64_t> out_shape;
  Plan plan;
  // What the rules see of the op.
  rules::OpView view(const DeviceMesh& mesh) const {
    return {op, attrs, shapes, dtypes, out_shape, dtype, current, mesh};
  }
};

Prepared prepare(OpKind op, const NodeList& inputs, const Attrs& attrs, DType dtype, const Shape& shape,
                 const DeviceMesh& mesh) {
  Prepared p{.op = op, .attrs = attrs, .dtype = dtype};
  const std::vector<Placement> whole(static_cast<size_t>(mesh.ndim()), Replicate());
  for (const NodePtr& n : inputs) {
    p.shapes.push_back(constant_sizes(n->shape, op_name(op)));
    p.dtypes.push_back(n->dtype);
    const PlacedLayout* l = layout_of(*n);
    p.current.push_back(l ? l->placements : whole);  // a plain tensor reads as Replicate
  }
  p.out_shape = constant_sizes(shape, op_name(op));
  p.plan = plan_op(p.view(mesh));
  if (p.plan.replicated_without_rule) warn_no_rule(op);
  if (log_dtensor()) {
    std::string line = std::string("[kiln] dtensor: ") + op_name(op);
    for (size_t i = 0; i < inputs.size(); ++i)
      line += (i ? ", " : " ") + placements_str(p.current[i]) + (p.current[i] != p.plan.inputs[i]
                                                                      ? "->" + placements_str(p.plan.inputs[i])
                                                                      : std::string());
    std::fprintf(stderr, "%s => %s %s\n", line.c_str(), placements_str(p.plan.output).c_str(),
                 kiln::detail::str(p.out_shape).c_str());
  }
  return p;
}

// Input `i` as the shard its plan asks for.
Tensor shard_for(const NodePtr& n, const Prepared& p, size_t i, const DeviceMesh& mesh) {
  const PlacedLayout* l = layout_of(*n);
  Tensor local = l ? Tensor::from_node(l->local) : Tensor::from_node(n);
  return redistribute_local(local, p.shapes[i], p.current[i], p.plan.inputs[i], mesh);
}

// The value a reduction gives over no elements, per op and dtype: what an empty shard
// contributes to a Partial result (its all_reduce must not see a 0 where max/min/product meet).
std::optional<Scalar> reduction_identity(OpKind op, DType dt) {
  const bool fl = is_floating(dt);
  const double inf = std::numeric_limits<double>::infinity();
  switch (op) {
    case OpKind::Sum: return Scalar(0);
    case OpKind::Prod: return dt == kBool ? Scalar(true) : Scalar(1);
    case OpKind::Amax:
      if (dt == kBool) return Scalar(false);
      if (fl) return Scalar(-inf);
      return dt == kInt32 ? Scalar(std::numeric_limits<int32_t>::min()) : Scalar(std::numeric_limits<int64_t>::min());
    case OpKind::Amin:
      if (dt == kBool) return Scalar(true);
      if (fl) return Scalar(inf);
      return dt == kInt32 ? Scalar(std::numeric_limits<int32_t>::max()) : Scalar(std::numeric_limits<int64_t>::max());
    default: return std::nullopt;
  }
}

Shape local_shape_of(const Prepared& p, const DeviceMesh& mesh) {
  const std::vector<int64_t> s = DTensor::local_shape(p.out_shape, p.plan.output, mesh, mesh.coordinate());
  return make_shape(s);
}

NodePtr record_placed(OpKind op, const NodeList& inputs, const Attrs& attrs, DType dtype, const Shape& shape,
                      Device device) {
  stop_any_trace(op);
  KILN_CHECK(op != OpKind::Collective, "a collective got a DTensor; pass its to_local() shard");
  const DeviceMesh& mesh = mesh_of(inputs, op);
  if (op == OpKind::ToDevice && inputs[0]->device.type != device.type) {
    // Off the mesh's device (x.cpu()): the whole tensor, plain (its collectives stay on the
    // mesh's device; the CPU side of a NCCL mesh has none).
    Tensor whole = DTensor(Tensor::from_node(inputs[0])).full_tensor();
    return kiln::detail::record(op, NodeList{whole.node()}, attrs, dtype, whole.shape(), device).node();
  }
  const Prepared p = prepare(op, inputs, attrs, dtype, shape, mesh);
  std::vector<Tensor> shards;  // (held until recorded)
  NodeList local;
  for (size_t i = 0; i < inputs.size(); ++i) {
    shards.push_back(shard_for(inputs[i], p, i, mesh));
    local.push_back(shards.back().node());
  }
  Tensor out;
  const auto identity = reduction_identity(op, dtype);
  if (p.plan.local) {  // the strategy's own computation of the shard
    out = p.plan.local(p.view(mesh), p.plan.local_dim, shards);
  } else if (identity && shards.size() == 1 && shards[0].numel() == 0) {
    // An empty shard (another mesh dim may cut the reduced dim to nothing) holds the identity.
    out = kiln::full(constant_sizes(local_shape_of(p, mesh), op_name(op)), *identity, dtype, device);
  } else {
    out = kiln::detail::record(op, std::move(local), attrs, dtype, local_shape_of(p, mesh), device);
  }
  return make_placed(out.node(), mesh, p.plan.output, shape);
}

NodePtr view_placed(OpKind op, const NodePtr& in, const Attrs& attrs, const Shape& shape, const Shape& strides,
                    const SymInt& offset) {
  stop_any_trace(op);
  const DeviceMesh& mesh = layout_of(*in)->mesh;
  NodeList inputs;
  inputs.push_back(in);
  const Prepared p = prepare(op, inputs, attrs, in->dtype, shape, mesh);
  Tensor local = shard_for(in, p, 0, mesh);
  ViewStep step{op, attrs, local_shape_of(p, mesh)};
  if (op == OpKind::View || op == OpKind::AsStrided) local = local.contiguous();  // their layouts assume a dense input
  if (op == OpKind::View) step.attrs.strides = contiguous_strides(step.shape);  // the shard's own
  return make_placed(kiln::detail::apply_view(local.node(), step), mesh, p.plan.output, shape, strides, offset);
}

Tensor full(const Tensor& t) { return DTensor(t).full_tensor(); }

Tensor as_placed_like(const Tensor& grad, const Tensor& leaf) {
  const PlacedLayout* l = layout_of(*leaf.node());
  return as_placed(grad, l->mesh).redistribute(l->placements);
}

}  // namespace

void install_placed_hooks() {
  static const bool installed = [] {
    kiln::detail::PlacedHooks& h = kiln::detail::placed_hooks();
    h.record = record_placed;
    h.view = view_placed;
    h.full = full;
    h.as_placed_like = as_placed_like;
    return true;
  }();
  (void)installed;
}

}  // namespace kiln::dist::detail_dt
