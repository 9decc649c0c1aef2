// The JIT executor: finds (or makes) the plan of each segment by its signature and runs it;
// PreparedSegment keeps a plan bound to one segment's nodes. Installed as the default executor
// unless KILN_JIT=interp. Planning is in make_plan.cpp, running in launch.cpp.
#include <algorithm>
#include <array>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include "jit/diag/profile.h"
#include "jit/exec/jit_executor.h"
#include "jit/exec/launch.h"
#include "jit/exec/segment_signature.h"
#include "jit/graph/passes.h"
#include "runtime/core/error.h"
#include "runtime/exec/device_runtime.h"

namespace kiln::jit {
namespace {

// The plans made, by signature hash (all threads), bounded.
std::mutex g_plan_mu;
std::unordered_map<uint64_t, std::vector<std::shared_ptr<const Plan>>> g_plans;
constexpr size_t kMaxPlans = 4096;

thread_local RunScratch t_scratch;
// The plans this thread ran last, most recent first (a hit takes no lock).
thread_local std::array<std::pair<uint64_t, std::shared_ptr<const Plan>>, 8> t_recent;

// This thread's recent plans, then every thread's: the plan of the segment whose signature
// (hash `h`) is in `sc` and whose guarded constants hold, or null.
std::shared_ptr<const Plan> cached_plan(uint64_t h, const Segment& seg, const RunScratch& sc) {
  for (const auto& [ch, p] : t_recent)  // no lock
    if (ch == h && p->sig == sc.sig && guards_hold(p->guards, seg)) return p;
  std::lock_guard<std::mutex> lock(g_plan_mu);
  auto it = g_plans.find(h);
  if (it != g_plans.end())
    for (auto& p : it->second)
      if (p->sig == sc.sig && guards_hold(p->guards, seg)) return p;
  return nullptr;
}

// The plan for `seg`: a cached one with its rewrites applied, or a new one (then cached).
// Either way `sc.ext` names the node of every position.
std::shared_ptr<const Plan> plan_for(Segment& seg, RunScratch& sc) {
  signature(seg, sc);
  const uint64_t h = hash_sig(sc.sig);
  std::shared_ptr<const Plan> plan = cached_plan(h, seg, sc);
  if (plan) {
    apply_rewrites(*plan, seg, sc);
  } else {
    plan = make_plan(seg, sc);
    std::lock_guard<std::mutex> lock(g_plan_mu);
    if (g_plans.size() > kMaxPlans) g_plans.clear();
    g_plans[h].push_back(plan);
  }
  if (t_recent[0].second != plan) {
    std::move_backward(t_recent.begin(), t_recent.end() - 1, t_recent.end());
    t_recent[0] = {h, plan};
  }
  return plan;
}

class JitExecutor final : public Executor {
 public:
  void run(Segment& seg) override {
    std::unique_ptr<RunScratch> own;  // a nested run on this thread gets fresh buffers
    RunScratch& sc = t_scratch.busy ? *(own = std::make_unique<RunScratch>()) : t_scratch;
    struct Busy {
      RunScratch& s;
      explicit Busy(RunScratch& r) : s(r) { s.busy = true; }
      ~Busy() { s.busy = false; }
    } busy(sc);
    std::shared_ptr<const Plan> plan;
    {
      ProfileScope lookup(profile_enabled() && !seg.nodes.empty() && seg.nodes[0]->device.type == DeviceType::CPU, [] {
        return std::string("(executor: segment signature, plan lookup or planning, rewrites)");
      });
      plan = plan_for(seg, sc);
    }
    execute(*plan, seg, sc, /*release_inputs=*/true);
  }
  const char* name() const override {
    switch (jit_mode()) {
      case JitMode::Asmjit: return "asmjit";
      case JitMode::Tiered: return "tiered";
      default: return "llvm";
    }
  }
};

}  // namespace

struct PreparedSegment::Impl {
  Segment* seg;
  std::shared_ptr<const Plan> plan;  // null: the interpreter, or the parts below
  RunScratch sc;
  // Nodes on several devices: one prepared part per device and phase, run in order (the
  // passes of a per-run split would rewrite these persistent nodes).
  std::vector<DevicePart> parts;
  std::vector<std::unique_ptr<PreparedSegment>> prepared_parts;
};

PreparedSegment::PreparedSegment(Segment& seg) : impl_(std::make_unique<Impl>()) {
  impl_->seg = &seg;
  bool devices = false;
  for (Node* n : seg.nodes) devices = devices || n->device != seg.nodes[0]->device;
  if (devices) {
    impl_->parts = split_by_device(seg);
    for (DevicePart& p : impl_->parts) impl_->prepared_parts.push_back(std::make_unique<PreparedSegment>(p.seg));
    return;
  }
  if (jit_mode() == JitMode::Interp) return;
  signature(seg, impl_->sc);  // also fixes the external inputs (the same node objects every run)
  // No passes: their rewrite relinks edges on each run, and these nodes persist.
  impl_->plan = make_plan(seg, impl_->sc, false);
  impl_->sc.ext.assign(seg.nodes.begin(), seg.nodes.end());
}

PreparedSegment::~PreparedSegment() = default;

void PreparedSegment::run() {
  if (!impl_->prepared_parts.empty()) {
    for (auto& p : impl_->prepared_parts) p->run();
    return;
  }
  if (!impl_->plan) {
    interpreter()->run(*impl_->seg);
    return;
  }
  execute(*impl_->plan, *impl_->seg, impl_->sc, /*release_inputs=*/false);
}

std::shared_ptr<Executor> jit_executor() {
  static auto ex = std::make_shared<JitExecutor>();
  return ex;
}

JitMode jit_mode() {
  static const JitMode m = [] {
    const char* v = std::getenv("KILN_JIT");
    std::string s = v ? v : "";
    if (s == "interp") return JitMode::Interp;
    if (s == "llvm") return JitMode::Llvm;
    if (s == "asmjit") return JitMode::Asmjit;
    if (s.empty() || s == "tiered") return JitMode::Tiered;
    throw Error("KILN_JIT must be interp, llvm, asmjit or tiered; got '" + s + "'");
  }();
  return m;
}

namespace {
// Installs the JIT as the default executor when the library loads.
const bool g_installed = [] {
  if (jit_mode() != JitMode::Interp) {
    set_executor(jit_executor());
    set_device_executor(DeviceType::CUDA, jit_executor());  // the plan reads the segment's device
  }
  return true;
}();
}  // namespace

}  // namespace kiln::jit
