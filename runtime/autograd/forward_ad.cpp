// Dual levels and tangent bookkeeping of forward-mode AD (the rules are in jvp_rules.cpp).
//
// Levels are per thread and nest like functorch's: the tangent of level L is computed with L and
// every newer level hidden, so its formula's ops carry the older levels' tangents along (the
// tangent of an inner level is itself a dual of the outer ones), never their own.
#include "runtime/autograd/forward_ad.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/autograd/autograd.h"
#include "runtime/autograd/autograd_rules.h"
#include "runtime/autograd/jvp_rules.h"
#include "runtime/ops/autocast_policy.h"
#include "runtime/tensor/record.h"

namespace kiln {
namespace {

std::atomic<uint64_t> g_next_level{1};

// One live level: its id and the tensors given a tangent at it (to drop those at exit).
struct Level {
  uint64_t id;
  std::vector<std::weak_ptr<TensorImpl>> holders;
  size_t compact_at = 256;
  int64_t tangents = 0;  // tangents recorded at this level (KILN_LOG=fwad)
};

struct Levels {
  std::vector<Level> stack;
  size_t visible = 0;  // levels [0, visible) propagate tangents
};
thread_local Levels t_levels;

Level* find_level(uint64_t id) {
  for (auto& l : t_levels.stack)
    if (l.id == id) return &l;
  return nullptr;
}

// Index of level `id` on the stack when it is visible.
std::optional<size_t> visible_index(uint64_t id) {
  for (size_t i = 0; i < t_levels.visible; ++i)
    if (t_levels.stack[i].id == id) return i;
  return std::nullopt;
}

// Drops dead and repeated holders once the list has doubled since the last sweep.
void remember(Level& l, const std::shared_ptr<TensorImpl>& impl) {
  l.holders.push_back(impl);
  if (l.holders.size() < l.compact_at) return;
  std::vector<std::weak_ptr<TensorImpl>> live;
  std::vector<const TensorImpl*> seen;
  for (auto& w : l.holders)
    if (auto p = w.lock(); p && std::find(seen.begin(), seen.end(), p.get()) == seen.end()) {
      seen.push_back(p.get());
      live.push_back(w);
    }
  l.holders = std::move(live);
  l.compact_at = std::max<size_t>(256, 2 * l.holders.size());
}

const std::shared_ptr<TensorImpl>* tangent_at(const TensorImpl& impl, uint64_t level) {
  for (const auto& t : impl.tangents)
    if (t.level == level) return &t.value;
  return nullptr;
}

void set_tangent(const std::shared_ptr<TensorImpl>& impl, uint64_t level, std::shared_ptr<TensorImpl> value) {
  Level* l = find_level(level);
  if (!l) return;
  for (auto& t : impl->tangents)
    if (t.level == level) {
      t.value = std::move(value);
      return;
    }
  impl->tangents.push_back({level, std::move(value)});
  ++l->tangents;
  remember(*l, impl);
}

void drop_tangents_from(TensorImpl& impl, size_t first_index) {
  std::erase_if(impl.tangents, [&](const TensorImpl::Tangent& t) {
    for (size_t i = first_index; i < t_levels.stack.size(); ++i)
      if (t_levels.stack[i].id == t.level) return true;
    return find_level(t.level) == nullptr;  // a level that has exited
  });
}

uint64_t resolve_level(int64_t level, const char* op) {
  KILN_CHECK(!t_levels.stack.empty(), op,
             ": no dual level is live on this thread; enter one first (kiln::fwad::DualLevel level;)");
  if (level < 0) return t_levels.stack.back().id;
  KILN_CHECK(find_level(static_cast<uint64_t>(level)) != nullptr, op, ": dual level ", level,
             " is not live on this thread");
  return static_cast<uint64_t>(level);
}

// Hides levels [index, end) while a tangent formula of level `index` records.
struct HideFrom {
  size_t saved;
  explicit HideFrom(size_t index) : saved(t_levels.visible) { t_levels.visible = index; }
  ~HideFrom() { t_levels.visible = saved; }
};

// A tangent as the output needs it: the output's dtype and shape.
Tensor fit(Tensor t, const Tensor& out) {
  if (t.dtype() != out.dtype()) t = detail::cast(t, out.dtype());
  if (!identical_shape(t.shape(), out.shape())) t = detail::expand_to(t, out.shape());
  return t;
}

}  // namespace

namespace fwad {

DualLevel::DualLevel() : level_(g_next_level.fetch_add(1)) {
  const bool all_visible = t_levels.visible == t_levels.stack.size();
  t_levels.stack.push_back(Level{level_, {}});
  if (all_visible) t_levels.visible = t_levels.stack.size();
}

DualLevel::~DualLevel() {
  auto& st = t_levels.stack;
  auto it = std::find_if(st.begin(), st.end(), [&](const Level& l) { return l.id == level_; });
  if (it == st.end()) return;
  if (detail::log_forward_ad())
    std::fprintf(stderr, "[kiln fwad] dual level %llu (depth %zu) exits: %lld tangents recorded\n",
                 static_cast<unsigned long long>(level_), static_cast<size_t>(it - st.begin()) + 1,
                 static_cast<long long>(it->tangents));
  for (auto& w : it->holders)
    if (auto p = w.lock())
      std::erase_if(p->tangents, [&](const TensorImpl::Tangent& t) { return t.level == level_; });
  const size_t index = static_cast<size_t>(it - st.begin());
  st.erase(it);
  if (t_levels.visible > index) --t_levels.visible;
}

int64_t current_level() { return t_levels.stack.empty() ? -1 : static_cast<int64_t>(t_levels.stack.back().id); }

Tensor make_dual(const Tensor& primal, const Tensor& tangent, int64_t level) {
  const uint64_t l = resolve_level(level, "make_dual");
  KILN_CHECK(primal.defined() && tangent.defined(), "make_dual: got an undefined tensor");
  KILN_CHECK(!primal.node()->placed && !tangent.node()->placed,
             "make_dual: forward-mode AD on DTensors is not supported; use plain tensors");
  KILN_CHECK(is_floating(primal.dtype()), "make_dual: expected a floating point primal, got ",
             dtype_name(primal.dtype()));
  KILN_CHECK(tangent.dtype() == primal.dtype(), "make_dual: expected a tangent of the primal's dtype ",
             dtype_name(primal.dtype()), ", got ", dtype_name(tangent.dtype()));
  KILN_CHECK(same_shape(tangent.shape(), primal.shape()), "make_dual: expected a tangent of the primal's shape ",
             detail::str(primal.shape()), ", got ", detail::str(tangent.shape()));
  KILN_CHECK(tangent.device() == primal.device(), "make_dual: expected a tangent on the primal's device ",
             primal.device().str(), ", got ", tangent.device().str());
  Tensor r = detail::snapshot(primal);
  set_tangent(r.impl(), l, tangent.impl());
  return r;
}

UnpackedDual unpack_dual(const Tensor& t, int64_t level) {
  KILN_CHECK(t.defined(), "unpack_dual: got an undefined tensor");
  if (t_levels.stack.empty()) return {t, Tensor()};
  const uint64_t l = resolve_level(level, "unpack_dual");
  UnpackedDual r;
  const auto* tan = tangent_at(*t.impl(), l);
  if (tan) r.tangent = Tensor(*tan);
  r.primal = detail::snapshot(t);
  size_t index = 0;
  while (t_levels.stack[index].id != l) ++index;
  drop_tangents_from(*r.primal.impl(), index);
  return r;
}

}  // namespace fwad

namespace detail {

bool forward_ad_visible() { return t_levels.visible > 0; }

bool log_forward_ad() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_LOG");
    return v && (std::strstr(v, "fwad") || std::strstr(v, "all"));
  }();
  return on;
}

bool has_visible_tangent(const Tensor& t) {
  if (!t.defined() || t.impl()->tangents.empty()) return false;
  for (const auto& tg : t.impl()->tangents)
    if (visible_index(tg.level)) return true;
  return false;
}

bool wants_derivative(const Tensor& t) {
  return t.defined() && ((grad_enabled() && t.requires_grad()) || (forward_ad_visible() && has_visible_tangent(t)));
}

void attach_tangents(Tensor& out, OpKind op, const Attrs& attrs, const Tensor* const* inputs, size_t count,
                     const Shape& view_shape) {
  if (!is_differentiable(op) || !is_floating(out.dtype())) return;
  const size_t visible = t_levels.visible;
  for (size_t li = 0; li < visible; ++li) {
    const uint64_t level = t_levels.stack[li].id;
    std::vector<Tensor> tin(count);
    bool any = false;
    for (size_t i = 0; i < count; ++i)
      if (const auto* v = tangent_at(*inputs[i]->impl(), level)) {
        tin[i] = Tensor(*v);
        any = true;
      }
    if (!any) continue;
    Tensor t;
    {
      HideFrom hide(li);
      AutocastOff autocast_off;  // the tangent takes the dtypes the primal op was recorded with
      std::vector<Tensor> in;
      in.reserve(count);
      for (size_t i = 0; i < count; ++i) in.push_back(*inputs[i]);
      t = jvp(op, attrs, in, tin, out, view_shape);
      if (t.defined()) t = fit(t, out);
    }
    if (t.defined()) set_tangent(out.impl(), level, t.impl());
  }
}

void copy_tangents(TensorImpl& dst, const TensorImpl& src) {
  if (dst.tangents.empty() && src.tangents.empty()) return;
  dst.tangents.clear();
  for (const auto& t : src.tangents)
    if (find_level(t.level)) dst.tangents.push_back(t);
}

void copy_tangents(const std::shared_ptr<TensorImpl>& dst, const TensorImpl& src) {
  copy_tangents(*dst, src);
  for (const auto& t : dst->tangents) remember(*find_level(t.level), dst);
}

}  // namespace detail
}  // namespace kiln
