// make_plan: a segment's plan as a pipeline of named planning passes —
//   rewrite_segment → choose_target → schedule_and_compile → record_steps →
//   fuse_gemm_epilogues → fuse_gemm_bias → fuse_split_tails → batch_horizontal → plan_releases →
//   plan_last_readers
// (the fusions across steps are in plan_fusions.cpp, the release schedule in plan_lifetimes.cpp).
#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <tuple>

#include "jit/diag/diagnostics.h"
#include "jit/exec/jit_executor.h"
#include "jit/exec/launch.h"
#include "jit/exec/plan_passes.h"
#include "jit/exec/tiering.h"
#include "jit/loop/row_cache.h"
#include "jit/patterns/pattern_matcher.h"
#include "kernels/cpu/parallel.h"
#include "runtime/tensor/trace.h"

namespace kiln::jit {
namespace {

bool passes_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_PASSES");
    return !(v && std::string(v) == "off");
  }();
  return on;
}

// The segment a plan's passes and schedule see: `seg` with the registered rewrites' replacements
// made and their readers relinked (Plan::patterns), or `seg` itself.
Segment& patterned(const Plan& plan, Segment& seg, RunScratch& sc) {
  if (plan.patterns.identity) return seg;
  apply_rewrite(plan.patterns, seg, sc.patterned_ext, seg.keep_alive);
  // A replacement's random op (sdpa's dropout words) draws fresh numbers on every run, as the
  // op it replaced did when it was recorded.
  for (size_t j = 0; j < plan.patterns.made.size(); ++j)
    if (plan.patterns.made[j].random) {
      Node& r = *sc.patterned_ext[seg.nodes.size() + j];
      std::tie(r.attrs.seed, r.attrs.counter) = detail::rng_reserve(static_cast<uint64_t>(numel(r.shape).as_int()));
    }
  sc.patterned.nodes.clear();
  for (int p : plan.patterns.order) sc.patterned.nodes.push_back(sc.patterned_ext[static_cast<size_t>(p)]);
  sc.patterned.needed = plan.patterns.needed;
  return sc.patterned;
}

// Whether every reduction kernel of `steps` reduces rows (the last dim) kept in the target's
// row cache.
bool row_cached(const std::vector<Step>& steps, const Target& t) {
  for (const Step& st : steps) {
    const Group& g = st.group;
    if (st.kind != Step::Kind::Kernel || g.reduce_dims.empty()) continue;
    const bool rows = std::find(g.reduce_dims.begin(), g.reduce_dims.end(),
                                static_cast<int64_t>(g.domain.size()) - 1) != g.reduce_dims.end();
    if (!rows || !row_cache_fits(g, t)) return false;
  }
  return true;
}

// Bytes the kernel steps of a schedule read and write (each canonical input once per kernel).
double kernel_traffic(const std::vector<Step>& steps) {
  auto bytes = [](const Node* n) {
    double e = static_cast<double>(itemsize(n->dtype));
    for (const auto& d : n->shape) e *= static_cast<double>(d.maybe_int().value_or(1));
    return e;
  };
  double total = 0;
  for (const Step& st : steps) {
    if (st.kind != Step::Kind::Kernel) continue;
    for (const Node* n : canonical_inputs(st.group)) total += bytes(n);
    for (const Node* n : st.group.outputs) total += bytes(n);
  }
  return total;
}

// The registered rewrites and the graph passes (when `passes`) on the segment, applied: the plan
// keeps both rewrites and the constant values they rely on (in the segment's positions);
// `p.target` is what the schedule sees and `p.pos` the position of each of its nodes.
void rewrite_segment(Planning& p, bool passes) {
  Plan& plan = p.plan;
  if (passes) plan.patterns = segment_patterns(p.seg);
  Segment& base = patterned(plan, p.seg, p.sc);
  if (passes && passes_enabled()) plan.rw = run_passes(base);
  plan.guards = plan.patterns.guards;  // (a constant the patterns made is the plan's own)
  for (const Rewrite::Guard& g : plan.rw.guards) {
    const int at = plan.patterns.identity ? g.pos : plan.patterns.order[static_cast<size_t>(g.pos)];
    if (at < static_cast<int>(p.seg.nodes.size())) plan.guards.push_back({at, g.f0, g.i0, g.has_i0});
  }
  p.target = &base;
  if (plan.rw.identity) {
    p.sc.ext.assign(base.nodes.begin(), base.nodes.end());
  } else {
    apply_rewrite(plan.rw, base, p.sc.ext, p.seg.keep_alive);
    for (int at : plan.rw.order) p.rewritten.nodes.push_back(p.sc.ext[at]);
    p.rewritten.needed = plan.rw.needed;
    p.target = &p.rewritten;
  }
  for (size_t i = 0; i < p.sc.ext.size(); ++i) p.pos[p.sc.ext[i]] = static_cast<int>(i);
  for (size_t k = 0; k < p.sc.externals.size(); ++k) p.pos.emplace(p.sc.externals[k], -static_cast<int>(k) - 1);
}

// The device's JIT target, or none (its kernels then run on the interpreter): no backend for the
// device, or a device ordinal other than the first (generated device kernels are loaded and
// launched there only; other ordinals run their nodes through the device runtime).
void choose_target(Planning& p) {
  try {
    p.tgt = &target_for(p.device);
  } catch (const std::exception& e) {
    static std::once_flag told;
    std::call_once(told, [&] { log_line("jit", std::string(e.what()) + "; running kernels on the interpreter"); });
  }
  const int jit_index = p.device == DeviceType::CUDA ? cuda::current_device() : 0;
  if (p.tgt && p.device != DeviceType::CPU && p.seg.nodes[0]->device.index != jit_index) {
    static std::once_flag told;
    std::call_once(told, [&] {
      log_line("jit", "generated kernels run on " + Device{p.device, jit_index}.str() + " only; " +
                          p.seg.nodes[0]->device.str() + " runs its ops one by one through the device runtime");
    });
    p.tgt = nullptr;
  }
}

ScheduleOptions schedule_options(const Target* tgt) {
  ScheduleOptions opts;
  opts.half_kernels = tgt && tgt->half_kernels;
  opts.merge_row_stages = tgt && tgt->merge_row_stages;
  opts.max_merged_reductions = tgt ? tgt->max_merged_reductions : 0;
  if (tgt && tgt->recompute_in_row_cache_only)  // a host row kernel computes a cached value once
    opts.keeps_rows = [tgt](const Group& g) {
      return g.reduce_dims.size() == 1 && g.reduce_dims[0] + 1 == static_cast<int64_t>(g.domain.size()) &&
             row_cache_fits(g, *tgt);
    };
  return opts;
}

// The schedule of `p.target`; where the target prefers recomputation, the recomputing schedule
// when it moves fewer bytes (and, on a host, keeps its reductions' rows in the row cache).
std::vector<Step> pick_schedule(const Planning& p, const std::vector<const Node*>& stored,
                                const ScheduleOptions& opts) {
  std::vector<Step> steps = schedule(*p.target, stored, opts);
  if (p.tgt && !p.tgt->store_expensive) {
    ScheduleOptions recompute = opts;
    recompute.store_expensive = false;
    std::vector<Step> alt = schedule(*p.target, stored, recompute);
    if (kernel_traffic(alt) < kernel_traffic(steps) && (!p.tgt->recompute_in_row_cache_only || row_cached(alt, *p.tgt)))
      steps = std::move(alt);
  }
  return steps;
}

// Device kernels compile in parallel (NVRTC is slow per kernel): the code cache is filled for
// every kernel step at once, and compile_steps finds them (and their errors).
void precompile_device_kernels(const Planning& p) {
  if (!p.tgt || p.device == DeviceType::CPU) return;
  std::vector<size_t> ks;
  for (size_t i = 0; i < p.steps.size(); ++i)
    if (p.steps[i].kind == Step::Kind::Kernel && !p.deferred[i]) ks.push_back(i);
  if (ks.size() < 2) return;
  kernels::parallel_for(0, static_cast<int64_t>(ks.size()), [&](int64_t j) {
    const Group& g = p.steps[ks[static_cast<size_t>(j)]].group;
    try {
      prepare_combines(*get_kernel(group_key(g, *p.tgt), g, p.device), g, p.device);
    } catch (const std::exception&) {
    }  // (met again in compile_steps, where it is handled)
  });
}

// Compiles the kernel steps not deferred. False when the schedule must be made again: a merged
// row stage the kernel cannot express (then not merged), or reductions inside kernels that
// cannot be formed around them (then stored; every step is still tried, to store them all).
bool compile_steps(Planning& p, ScheduleOptions& opts, std::vector<const Node*>& stored, int attempt) {
  bool again = false;
  for (size_t i = 0; p.tgt && i < p.steps.size(); ++i) {
    if (p.steps[i].kind != Step::Kind::Kernel || p.deferred[i]) continue;
    const Group& g = p.steps[i].group;
    const std::string key = group_key(g, *p.tgt);
    try {
      p.kernels[i] = get_kernel(key, g, p.device);
    } catch (const LowerError&) {
      if (opts.merge_row_stages) {
        opts.merge_row_stages = false;
        return false;
      }
      if (attempt < 3)
        for (Node* n : g.nodes)
          if (classify(*n) == NodeClass::Reduction &&
              std::find(g.outputs.begin(), g.outputs.end(), n) == g.outputs.end()) {
            stored.push_back(n);
            again = true;
          }
      if (!again) p.kernels[i] = kernel_or_null(g, key, p.device);
    } catch (const std::exception&) {
      p.kernels[i] = kernel_or_null(g, key, p.device);
    }
  }
  return !again;
}

// Schedules the target and compiles its kernels; a kernel that cannot be formed around a
// reduction gets that reduction stored, and the schedule is made again.
void schedule_and_compile(Planning& p) {
  std::vector<const Node*> stored;
  ScheduleOptions opts = schedule_options(p.tgt);
  for (int attempt = 0;; ++attempt) {
    p.steps = pick_schedule(p, stored, opts);
    split_wide_kernels(p);
    order_steps_for_memory(p);
    p.kernels.assign(p.steps.size(), nullptr);
    p.deferred = horizontal_candidates(p.steps);
    precompile_device_kernels(p);
    if (compile_steps(p, opts, stored, attempt)) break;
  }
  if (log_enabled("fusion"))
    log_line("fusion", "segment of " + std::to_string(p.target->nodes.size()) + " nodes:\n" + describe(p.steps));
}

// The schedule in positions (the plan outlives this run's nodes).
void record_steps(Planning& p) {
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const Step& st = p.steps[i];
    PlanStep ps{st.kind};
    if (st.kind != Step::Kind::Kernel) {
      ps.node = p.pos.at(st.node);
    } else {
      for (Node* n : st.group.nodes) ps.nodes.push_back(p.pos.at(n));
      for (Node* n : st.group.outputs) ps.outputs.push_back(p.pos.at(n));
      for (Node* n : canonical_inputs(st.group)) ps.inputs.push_back(p.pos.at(n));
      ps.domain = concrete(st.group.domain);
      for (int64_t d : ps.domain) ps.work *= d;
      ps.reduce_dims = st.group.reduce_dims;
      ps.split = st.group.split;
      ps.ck = p.kernels[i];
    }
    p.plan.steps.push_back(std::move(ps));
  }
}

// The fusions across steps, in order (each decides where it applies).
constexpr struct {
  const char* name;
  void (*run)(Planning&);
} kFusions[] = {
    {"gemm epilogues", fuse_gemm_epilogues},
    {"gemm bias", fuse_gemm_bias},
    {"split tails", fuse_split_tails},
    {"horizontal batches", batch_horizontal},
};

}  // namespace

void apply_rewrites(const Plan& plan, Segment& seg, RunScratch& sc) {
  Segment& base = patterned(plan, seg, sc);
  if (plan.rw.identity)
    sc.ext.assign(base.nodes.begin(), base.nodes.end());
  else
    apply_rewrite(plan.rw, base, sc.ext, seg.keep_alive);
}

namespace {
std::mutex g_peak_mu;
double g_planned_peak = 0;
}  // namespace

double planned_live_peak() {
  std::lock_guard<std::mutex> lock(g_peak_mu);
  return g_planned_peak;
}

void reset_planned_live_peak() {
  std::lock_guard<std::mutex> lock(g_peak_mu);
  g_planned_peak = 0;
}

std::shared_ptr<const Plan> make_plan(Segment& seg, RunScratch& sc, bool passes) {
  auto plan = std::make_shared<Plan>();
  plan->sig = sc.sig;
  Planning p{*plan, seg, sc, seg.nodes.empty() ? DeviceType::CPU : seg.nodes[0]->device.type};
  rewrite_segment(p, passes);
  choose_target(p);
  schedule_and_compile(p);
  record_steps(p);
  for (const auto& fusion : kFusions) fusion.run(p);
  plan_releases(p);
  plan_last_readers(p);
  {
    std::lock_guard<std::mutex> lock(g_peak_mu);
    g_planned_peak = std::max(g_planned_peak, plan->live_peak_bytes);
  }
  return plan;
}

}  // namespace kiln::jit
