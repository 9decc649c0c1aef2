#include "guards/guard_set.h"

#include <map>
#include <sstream>

#include "runtime/autograd/autograd.h"
#include "runtime/ir/sym_facts.h"
#include "runtime/ops/attention_policy.h"
#include "runtime/ops/autocast_policy.h"

namespace kiln::guards {
namespace {

const char* kind_name(size_t k) {
  static const char* names[] = {"a tensor", "an int", "a double", "a bool"};
  return k < 4 ? names[k] : "?";
}

const char* backend_name(uint8_t b) {
  static const char* names[] = {"Auto", "Math", "Fused"};
  return b < 3 ? names[b] : "?";
}

template <class... A>
bool fail(std::string* why, const A&... parts) {
  if (why) {
    std::ostringstream os;
    (os << ... << parts);
    *why = os.str();
  }
  return false;
}

bool same_scalar(const Value& a, const Value& b) {
  if (a.index() != b.index()) return false;
  if (auto* i = std::get_if<int64_t>(&a)) return *i == std::get<int64_t>(b);
  if (auto* d = std::get_if<double>(&a)) return *d == std::get<double>(b);
  if (auto* x = std::get_if<bool>(&a)) return *x == std::get<bool>(b);
  return false;
}

std::string value_str(const Value& v) {
  std::ostringstream os;
  if (auto* i = std::get_if<int64_t>(&v))
    os << *i;
  else if (auto* d = std::get_if<double>(&v))
    os << *d;
  else if (auto* b = std::get_if<bool>(&v))
    os << (*b ? "true" : "false");
  else
    os << "tensor";
  return os.str();
}

std::string tensor_str(const TensorGuard& g, const std::vector<std::string>& names) {
  std::ostringstream os;
  os << dtype_name(g.dtype) << " " << g.device.str() << " [";
  for (size_t d = 0; d < g.sizes.size(); ++d)
    os << (d ? ", " : "") << (g.symbols[d] >= 0 ? names[g.symbols[d]] : std::to_string(g.sizes[d]));
  os << "]" << (g.contiguous ? " contiguous" : " strided") << (g.requires_grad ? " requires_grad" : "");
  return os.str();
}

bool check_captured(const CapturedTensor& c, std::vector<int64_t>& syms, size_t k, std::string* why) {
  auto impl = c.impl.lock();
  if (!impl) return fail(why, "captured tensor ", k, ": it was destroyed");
  if (c.watch_grad && (impl->grad != nullptr) != c.has_grad)
    return fail(why, "captured tensor ", k, ": expected .grad() ", c.has_grad ? "defined" : "undefined");
  TensorImpl* src = impl.get();
  if (c.grad_of) {
    if (!impl->grad) return fail(why, "captured gradient ", k, ": expected .grad() defined");
    src = impl->grad.get();
  }
  return check_tensor(c.guard, *src->node(), src->requires_grad, syms, "captured tensor", static_cast<int>(k), why);
}

// Says which relation failed: a specialized size in the user's terms ("arg 0 dim 0: expected
// 16, got 24, specialized by mean()"), other relations as written. `origin` names each symbol
// ("arg 0 dim 0"; empty when unknown).
bool check_relations(const std::vector<SizeRelation>& relations, const std::vector<std::string>& names,
                     const std::vector<int64_t>& syms, std::string* why, const std::vector<std::string>& origin = {}) {
  if (relations.empty()) return true;
  std::map<std::string, int64_t> env;
  for (size_t s = 0; s < names.size(); ++s) env[names[s]] = syms[s];
  for (const auto& r : relations) {
    int64_t v = r.expr.evaluate(env);
    if (rel_holds(v, r.rel)) continue;
    if (!why) return false;
    std::vector<std::string> used = r.expr.symbols();
    if (r.rel == SymRel::Eq && used.size() == 1) {
      size_t s = std::find(names.begin(), names.end(), used[0]) - names.begin();
      std::optional<int64_t> c = (r.expr - SymInt::symbol(used[0])).maybe_int();
      if (c && s < names.size()) {
        std::string who = s < origin.size() && !origin[s].empty() ? origin[s] : "size " + used[0];
        return fail(why, who, ": expected ", -*c, ", got ", syms[s],
                    r.by.empty() ? std::string(" (specialized while tracing)") : ", specialized by " + r.by);
      }
    }
    return fail(why, "size relation ", r.expr.str(), " ", rel_str(r.rel), " 0: got ", v,
                r.by.empty() ? std::string() : " (relied on by " + r.by + ")");
  }
  return true;
}

std::string captured_str(const CapturedTensor& c, const std::vector<std::string>& names, size_t k) {
  return "captured " + std::to_string(k) + (c.grad_of ? " (a .grad())" : "") + ": " + tensor_str(c.guard, names) + "\n";
}

}  // namespace

bool check_tensor(const TensorGuard& g, const Node& n, bool requires_grad, std::vector<int64_t>& syms, const char* what,
                  int index, std::string* why) {
  if (n.dtype != g.dtype)
    return fail(why, what, " ", index, ": expected dtype ", dtype_name(g.dtype), ", got ", dtype_name(n.dtype));
  if (!(n.device == g.device))
    return fail(why, what, " ", index, ": expected device ", g.device.str(), ", got ", n.device.str());
  if (n.shape.size() != g.sizes.size())
    return fail(why, what, " ", index, ": expected rank ", g.sizes.size(), ", got ", n.shape.size());
  // Sizes, and (for contiguous guards) the dense row-major strides they imply, in one pass.
  int64_t expected = 1;
  bool dense = true, empty = false;
  for (size_t d = g.sizes.size(); d-- > 0;) {
    int64_t v = n.shape[d].as_int();
    int s = g.symbols[d];
    if (s < 0) {
      if (v != g.sizes[d]) return fail(why, what, " ", index, " dim ", d, ": expected ", g.sizes[d], ", got ", v);
    } else if (syms[s] < 0) {
      syms[s] = v;
    } else if (syms[s] != v) {
      return fail(why, what, " ", index, " dim ", d, ": expected s", s, " (= ", syms[s], " from an earlier dim), got ",
                  v);
    }
    if (g.contiguous && v != 1) {
      empty |= v == 0;
      dense = dense && n.strides[d].as_int() == expected;
      expected *= v;
    }
  }
  if (g.contiguous) {
    if (!dense && !empty) return fail(why, what, " ", index, ": expected a contiguous tensor, got a strided one");
  } else {
    for (size_t d = 0; d < g.strides.size(); ++d)
      if (n.strides[d].as_int() != g.strides[d])
        return fail(why, what, " ", index, " stride ", d, ": expected ", g.strides[d], ", got ", n.strides[d].as_int());
  }
  if (requires_grad != g.requires_grad)
    return fail(why, what, " ", index, ": expected requires_grad=", g.requires_grad ? "true" : "false", ", got ",
                requires_grad ? "true" : "false");
  return true;
}

bool GuardSet::check(const std::vector<Value>& args, const std::vector<int64_t>& arg_spec, std::vector<int64_t>& syms,
                     std::string* why) const {
  if (args.size() != kinds.size() || arg_spec != spec)
    return fail(why, "argument structure: expected ", kinds.size(), " values, got ", args.size(),
                " (or container lengths changed)");
  if (grad_enabled() != grad_mode)
    return fail(why, "grad mode: expected ", grad_mode ? "enabled" : "disabled", ", got ",
                grad_mode ? "disabled" : "enabled");
  if (const uint32_t ac = detail::autocast_key(); ac != autocast)
    return fail(why, "autocast: expected ", detail::autocast_key_str(autocast), ", got ", detail::autocast_key_str(ac));
  if (const uint8_t sb = detail::sdpa_backend_key(); sb != sdpa_backend)
    return fail(why, "sdpa_kernel: expected ", backend_name(sdpa_backend), ", got ", backend_name(sb));
  syms.assign(symbol_names.size(), -1);
  for (size_t i = 0; i < args.size(); ++i) {
    if (value_kind(args[i]) != kinds[i])
      return fail(why, "arg ", i, ": expected ", kind_name(kinds[i]), ", got ", kind_name(value_kind(args[i])));
    if (kinds[i] == 0) {
      const Tensor& t = *as_tensor(args[i]);
      if (!t.defined()) return fail(why, "arg ", i, ": expected a tensor, got an undefined one");
      TensorImpl& impl = *t.impl();
      const Node& n = impl.base ? *impl.node() : *impl.node_;  // a view may need rebuilding first
      if (!check_tensor(tensors[tensor_slot[i]], n, impl.requires_grad, syms, "arg", static_cast<int>(i), why))
        return false;
    } else if (!same_scalar(args[i], scalars[i])) {
      return fail(why, "arg ", i, ": expected ", value_str(scalars[i]), ", got ", value_str(args[i]));
    }
  }
  for (size_t k = 0; k < captured.size(); ++k)
    if (!check_captured(captured[k], syms, k, why)) return false;
  if (!why) return check_relations(relations, symbol_names, syms, why);
  std::vector<std::string> origin(symbol_names.size());
  for (size_t i = 0; i < tensor_slot.size(); ++i) {
    if (tensor_slot[i] < 0) continue;
    const TensorGuard& g = tensors[tensor_slot[i]];
    for (size_t d = 0; d < g.symbols.size(); ++d)
      if (g.symbols[d] >= 0 && origin[g.symbols[d]].empty())
        origin[g.symbols[d]] = "arg " + std::to_string(i) + " dim " + std::to_string(d);
  }
  return check_relations(relations, symbol_names, syms, why, origin);
}

bool BranchGuards::check(std::vector<int64_t>& syms, const std::vector<std::string>& names, size_t first,
                         std::string* why) const {
  for (size_t k = 0; k < captured.size(); ++k)
    if (!check_captured(captured[k], syms, first + k, why)) return false;
  return check_relations(relations, names, syms, why);
}

std::string BranchGuards::str(const std::vector<std::string>& names, size_t first) const {
  std::ostringstream os;
  for (size_t k = 0; k < captured.size(); ++k) os << captured_str(captured[k], names, first + k);
  for (const auto& r : relations) os << r.expr.str() << " " << rel_str(r.rel) << " 0\n";
  return os.str();
}

std::string GuardSet::str() const {
  std::ostringstream os;
  os << "grad mode " << (grad_mode ? "on" : "off") << "\n";
  if (autocast) os << "autocast " << detail::autocast_key_str(autocast) << "\n";
  if (sdpa_backend) os << "sdpa_kernel " << backend_name(sdpa_backend) << "\n";
  for (size_t i = 0; i < kinds.size(); ++i) {
    os << "arg " << i << ": ";
    if (kinds[i] == 0)
      os << tensor_str(tensors[tensor_slot[i]], symbol_names);
    else
      os << "== " << value_str(scalars[i]);
    os << "\n";
  }
  for (size_t k = 0; k < captured.size(); ++k) os << captured_str(captured[k], symbol_names, k);
  for (const auto& r : relations) os << r.expr.str() << " " << rel_str(r.rel) << " 0\n";
  return os.str();
}

}  // namespace kiln::guards
