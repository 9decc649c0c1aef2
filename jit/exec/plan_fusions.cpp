// The fusions make_plan chooses across scheduled steps: GEMM epilogues on the host, GEMM + bias
// (+ ReLU) on a device, a device split reduction's 0-d tail in its combine kernel, and
// horizontal kernels of independent pointwise steps.
#include <algorithm>
#include <set>
#include <string>

#include "jit/diag/diagnostics.h"
#include "jit/exec/launch.h"
#include "jit/exec/plan_passes.h"
#include "jit/exec/tiering.h"
#include "jit/loop/compose.h"

namespace kiln::jit {
namespace {

// Most kernels in one horizontal kernel, and most arguments (buffers and params: a CUDA
// kernel's parameters must fit in 4 KiB).
constexpr size_t kMaxBatch = 32;
constexpr int kMaxBatchArgs = 448;

void log_fusion(const std::string& what) {
  if (log_enabled("fusion")) log_line("fusion", what);
}

// Step i is a 2-D GEMM and step i + 1 a pointwise kernel over exactly its output shape.
bool gemm_then_pointwise(const Planning& p, size_t i) {
  const std::vector<Step>& steps = p.steps;
  if (steps[i].kind != Step::Kind::Opaque || steps[i + 1].kind != Step::Kind::Kernel) return false;
  const Node* m = steps[i].node;
  const Group& g = steps[i + 1].group;
  return m->op == OpKind::Matmul && m->shape.size() == 2 && !g.split && g.reduce_dims.empty() &&
         same_shape(g.domain, m->shape);
}

// Whether the product of GEMM step i is read by anything but step i + 1: another step, or
// (needed) a tensor or node outside the segment.
bool product_read_elsewhere(const Planning& p, size_t i) {
  const Node* m = p.steps[i].node;
  auto reads = [&](const Node* n) {
    for (const auto& in : n->inputs)
      if (in.get() == m) return true;
    return false;
  };
  for (size_t j = 0; j < p.steps.size(); ++j) {
    if (j == i + 1) continue;
    if (p.steps[j].kind == Step::Kind::Kernel) {
      for (const Node* n : p.steps[j].group.nodes)
        if (reads(n)) return true;
    } else if (reads(p.steps[j].node)) {
      return true;
    }
  }
  for (size_t k = 0; k < p.target->nodes.size(); ++k)
    if (p.target->nodes[k] == m && p.target->needed[k]) return true;
  return false;
}

// Whether kernel `g` reads the product `m` only element for element (no view of it, no node
// of another shape reading it): it can then run on the product's row blocks.
bool reads_product_elementwise(const Group& g, const Node* m) {
  if (std::find(g.nodes.begin(), g.nodes.end(), m) != g.nodes.end()) return false;
  for (const Node* n : g.nodes)
    for (const auto& in : n->inputs)
      if (in.get() == m && (is_view_op(n->op) || !same_shape(n->shape, m->shape))) return false;
  return true;
}

// Whether `g`'s one output (of the product's type and shape) may be written over the product:
// every value derived from the product is read at the element it is written to — elementwise
// nodes over the product's shape only (no views, no inline sums, which read a row's others).
bool writes_over_product(const Group& g, const Node* m) {
  if (g.outputs.size() != 1 || g.outputs[0]->dtype != m->dtype || !same_shape(g.outputs[0]->shape, m->shape))
    return false;
  std::set<const Node*> derived{m};
  for (const Node* n : g.nodes) {  // (topological order)
    bool from_m = false;
    for (const auto& in : n->inputs) from_m = from_m || derived.count(in.get()) > 0;
    if (!from_m) continue;
    derived.insert(n);
    if (classify(*n) != NodeClass::Pointwise || is_reduction_op(n->op) || !same_shape(n->shape, m->shape)) return false;
  }
  return true;
}

// The bias add (+ ReLU) of a device GEMM's pointwise step: `g` is exactly add(product, row
// vector) [then relu], its one output; false otherwise.
bool bias_epilogue(const Group& g, const Node* m, const Node*& bias, const Node*& relu) {
  if (m->dtype != DType::Float32 || g.outputs.size() != 1) return false;
  const Node* add = nullptr;
  relu = nullptr;
  for (const Node* n : g.nodes) {
    if (n->op == OpKind::Add && !add)
      add = n;
    else if (n->op == OpKind::Relu && !relu)
      relu = n;
    else
      return false;
  }
  if (!add || add->inputs.size() != 2 || !same_shape(add->shape, m->shape) || add->dtype != DType::Float32)
    return false;
  if (relu && (relu->inputs[0].get() != add || g.outputs[0] != relu)) return false;
  if (!relu && g.outputs[0] != add) return false;
  const int mi = add->inputs[0].get() == m ? 0 : add->inputs[1].get() == m ? 1 : -1;
  if (mi < 0) return false;
  bias = add->inputs[1 - mi].get();
  return bias->dtype == DType::Float32 && !bias->shape.empty() && same_shape({bias->shape.back()}, {m->shape[1]});
}

}  // namespace

// GEMM epilogues: a 2-D GEMM followed by a pointwise kernel over exactly its output that reads
// it element for element runs as one step (row blocks, epilogue while in cache). When the
// kernel has one output of the product's type and nothing else reads the product, that output
// is written over the product (one buffer instead of two: half the memory traffic).
void fuse_gemm_epilogues(Planning& p) {
  for (size_t i = 0; p.device == DeviceType::CPU && i + 1 < p.steps.size(); ++i) {
    if (!gemm_then_pointwise(p, i) || !p.kernels[i + 1]) continue;
    const Node* m = p.steps[i].node;
    const Group& g = p.steps[i + 1].group;
    if ((m->dtype != DType::Float32 && m->dtype != DType::Float64) || !reads_product_elementwise(g, m)) continue;
    p.plan.steps[i].epilogue = true;
    p.plan.steps[i + 1].fused = true;
    p.plan.steps[i].in_place = writes_over_product(g, m) && !product_read_elsewhere(p, i);
    log_fusion("step " + std::to_string(i + 1) + " runs as the epilogue of GEMM step " + std::to_string(i) +
               (p.plan.steps[i].in_place ? ", writing over the product" : ""));
  }
}

// GEMM + bias (+ ReLU) on a device: a pointwise step after a 2-D float32 GEMM that only adds a
// row vector to the product (then applies ReLU) becomes the GEMM's epilogue, when nothing else
// reads the bare product (in this segment or after it).
void fuse_gemm_bias(Planning& p) {
  for (size_t i = 0; p.device != DeviceType::CPU && p.tgt && i + 1 < p.steps.size(); ++i) {
    if (!gemm_then_pointwise(p, i)) continue;
    const Node* m = p.steps[i].node;
    const Group& g = p.steps[i + 1].group;
    const Node* bias = nullptr;
    const Node* relu = nullptr;
    if (!bias_epilogue(g, m, bias, relu) || product_read_elsewhere(p, i) || !p.pos.count(bias)) continue;
    PlanStep& ps = p.plan.steps[i];
    ps.gemm_bias = true;
    ps.relu = relu != nullptr;
    ps.bias = p.pos.at(bias);
    ps.bias_out = p.pos.at(g.outputs[0]);
    p.plan.steps[i + 1].fused = true;
    log_fusion("step " + std::to_string(i + 1) + " (+ bias" + (relu ? ", ReLU" : "") +
               ") runs as the epilogue of GEMM step " + std::to_string(i));
  }
}

// Device split reductions: a 0-d pointwise step reading the reduction (`sum() * 0.5`) runs in
// the combine kernel of the partials, one launch instead of two.
void fuse_split_tails(Planning& p) {
  for (size_t i = 0; p.device != DeviceType::CPU && i + 1 < p.steps.size(); ++i) {
    const std::vector<Step>& steps = p.steps;
    if (steps[i].kind != Step::Kind::Kernel || steps[i + 1].kind != Step::Kind::Kernel || !p.kernels[i] ||
        !p.kernels[i + 1])
      continue;
    const Lowered& L = *p.kernels[i]->lowered;
    const Group& e = steps[i + 1].group;
    if (!L.split || L.split_columns || L.partial_ops.size() != 1 || !e.domain.empty() || !e.reduce_dims.empty())
      continue;
    const OpKind op = L.partial_ops[0];
    if (is_arg_reduction(op)) continue;
    const Node* red = nullptr;
    for (const Node* o : steps[i].group.outputs)
      if (classify(*o) == NodeClass::Reduction) red = o;
    const std::vector<Node*> eins = canonical_inputs(e);
    const auto at = std::find(eins.begin(), eins.end(), red);
    if (!red || at == eins.end()) continue;
    const int epi_in = static_cast<int>(at - eins.begin());
    const DType pdt = L.kernel.buffers[static_cast<size_t>(L.num_inputs + L.num_outputs)].dtype;
    try {
      if (!find_backend(p.device, Tier::Optimizing)) continue;
      Kernel k = combine_with_epilogue(combine_kernel(op, pdt, red->dtype), p.kernels[i + 1]->lowered->kernel, epi_in);
      p.plan.steps[i].combine = get_built_kernel(k, p.device);
    } catch (const std::exception& ex) {
      log_line("jit", std::string("combine with epilogue not built (") + ex.what() + "); running them apart");
      continue;
    }
    p.plan.steps[i].epilogue = true;
    p.plan.steps[i + 1].fused = true;
    log_fusion("step " + std::to_string(i + 1) + " runs in the combine kernel of split step " + std::to_string(i));
  }
}

std::vector<bool> horizontal_candidates(const std::vector<Step>& steps) {
  std::vector<bool> d(steps.size(), false);
  size_t n = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& st = steps[i];
    if (st.kind != Step::Kind::Kernel || !st.group.reduce_dims.empty() || st.group.split) continue;
    if (i > 0 && ((steps[i - 1].kind == Step::Kind::Opaque && steps[i - 1].node->op == OpKind::Matmul) ||
                  (steps[i - 1].kind == Step::Kind::Kernel && steps[i - 1].group.split)))
      continue;
    d[i] = true;
    ++n;
  }
  if (n < 2) d.assign(steps.size(), false);
  return d;
}

namespace {

// Where horizontal-batch candidates may run: each deferred step's own lowering, whether it may
// join a batch, and its window (it may run right after step t for lo <= t <= hi).
struct Windows {
  std::vector<std::shared_ptr<Lowered>> lowered;
  std::vector<bool> cand;
  std::vector<int> lo, hi;
};

// Each candidate may run anywhere after the steps producing what it reads and before the first
// step reading what it writes; a candidate whose output another candidate reads stays in place.
Windows horizontal_windows(const Planning& p) {
  const std::vector<Step>& steps = p.steps;
  const int N = static_cast<int>(steps.size());
  // Where each stored value is computed, and what each step reads (view chains walked to their
  // stored roots). A step run as the previous one's epilogue reads at that step.
  std::unordered_map<const Node*, int> producer;
  for (int i = 0; i < N; ++i) {
    if (steps[i].kind == Step::Kind::Kernel)
      for (const Node* o : steps[i].group.outputs) producer[o] = i;
    else
      producer[steps[i].node] = i;
  }
  auto for_each_read = [&](int i, const auto& f) {
    std::vector<Node*> ins;
    if (steps[i].kind == Step::Kind::Kernel)
      ins = canonical_inputs(steps[i].group);
    else
      for (const auto& in : steps[i].node->inputs) ins.push_back(in.get());
    for (const Node* in : ins)
      for (const Node* v = in;; v = v->inputs[0].get()) {
        auto it = producer.find(v);
        if (it != producer.end() && it->second != i) f(it->second);
        if (!is_view_op(v->op) || v->inputs.empty()) break;
      }
  };
  Windows w{std::vector<std::shared_ptr<Lowered>>(steps.size()), std::vector<bool>(steps.size(), false),
            std::vector<int>(steps.size(), -1), std::vector<int>(steps.size(), N - 1)};
  // On a device a horizontal kernel runs an element of its members a thread (the member picked
  // by the index), so members are lowered without row tiles.
  Target member = *p.tgt;
  if (member.parallel == Target::Parallel::DeviceGrid) member.tile = 1;
  for (int j = 0; j < N; ++j) {
    if (!p.deferred[j]) continue;
    try {
      w.lowered[j] = lower(steps[j].group, member);
    } catch (const std::exception&) {
    }  // (compiled alone, where the error is handled)
    w.cand[j] = w.lowered[j] && horizontal_member(*w.lowered[j]);
  }
  for (int j = 0; j < N; ++j)  // a candidate another candidate reads stays in place
    if (p.deferred[j]) for_each_read(j, [&](int r) { w.cand[r] = false; });
  for (int i = 0; i < N; ++i) {
    const int at = p.plan.steps[i].fused ? i - 1 : i;
    for_each_read(i, [&](int r) {
      if (w.cand[i]) w.lo[i] = std::max(w.lo[i], r);
      if (w.cand[r]) w.hi[r] = std::min(w.hi[r], at - 1);
    });
  }
  return w;
}

// Builds the horizontal kernel of `members` (step order) and runs it after step `t`; false
// (after logging why) when it cannot be built.
bool add_batch(Planning& p, std::vector<int> members, int t, const Windows& w) {
  std::vector<const Kernel*> ks;
  for (int j : members) ks.push_back(&w.lowered[j]->kernel);
  Batch b;
  try {
    b.ck = get_built_kernel(horizontal_kernel(ks), p.device);
  } catch (const std::exception& ex) {
    log_line("jit", std::string("horizontal kernel not built (") + ex.what() + "); running its kernels apart");
    return false;
  }
  std::string list;
  for (int j : members) {
    p.plan.steps[j].batched = true;
    p.plan.steps[j].lowered = w.lowered[j];
    list += (list.empty() ? "" : ", ") + std::to_string(j);
  }
  b.members = std::move(members);
  p.plan.steps[t].batches_after.push_back(static_cast<int>(p.plan.batches.size()));
  p.plan.batches.push_back(std::move(b));
  log_fusion("steps " + list + " (independent pointwise kernels) run as one horizontal kernel after step " +
             std::to_string(t));
  return true;
}

}  // namespace

// Horizontal kernels: independent pointwise kernel steps of different domains (an optimizer's
// update of each parameter) run as one launch. Each batch runs at the latest point its members
// allow (fewest batches: greedy by deadline). Candidates that join no batch are compiled alone.
void batch_horizontal(Planning& p) {
  if (!p.tgt) return;
  const int N = static_cast<int>(p.steps.size());
  auto args = [](const Kernel& k) { return static_cast<int>(k.buffers.size()) + k.num_params + k.num_fparams; };
  const Windows w = horizontal_windows(p);
  std::vector<int> order;
  for (int j = 0; j < N; ++j)
    if (w.cand[j]) order.push_back(j);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return w.hi[a] < w.hi[b]; });
  std::vector<bool> taken(p.steps.size(), false);
  for (size_t k = 0; k < order.size(); ++k) {
    const int first = order[k];
    if (taken[first]) continue;
    const int t = w.hi[first];
    std::vector<int> members{first};
    int a = args(w.lowered[first]->kernel);
    taken[first] = true;
    for (size_t m = k + 1; m < order.size() && members.size() < kMaxBatch; ++m) {
      const int j = order[m];
      const int aj = args(w.lowered[j]->kernel);
      if (taken[j] || w.lo[j] > t || a + aj > kMaxBatchArgs) continue;
      members.push_back(j);
      a += aj;
      taken[j] = true;
    }
    if (members.size() < 2) continue;
    std::sort(members.begin(), members.end());
    add_batch(p, std::move(members), t, w);
  }
  for (int j = 0; j < N; ++j)
    if (p.deferred[j] && !p.plan.steps[j].batched)
      p.plan.steps[j].ck = kernel_or_null(p.steps[j].group, group_key(p.steps[j].group, *p.tgt), p.device);
}

}  // namespace kiln::jit
