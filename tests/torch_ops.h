// The torch-parity op dispatcher shared by the corpus tests: PyTorch op names, arguments and
// attrs (JSON, PyTorch's keyword names) run through kiln's public API, and the comparison of a
// kiln result with PyTorch's expected tensor.
#pragma once
#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln.h"

namespace torch_ops {

using json = nlohmann::json;
using kiln::DType;
using kiln::Scalar;
using kiln::Tensor;

// Thrown for an op or attribute variant the dispatcher does not know; fails the case.
struct Unsupported : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// Python's bare NaN / Infinity / -Infinity tokens as the strings the corpora use.
std::string quote_nonfinite_tokens(const std::string& s);
// Lower-case copy.
std::string lower(std::string s);
// A JSON number, bool or non-finite string ("nan", "inf", "-inf") as a double.
double number(const json& v);
// A JSON integer (or a one-element list, or an integral float).
int64_t integer(const json& v);
// A Python number as a kiln Scalar, keeping its category (bool / int / float) for promotion.
Scalar scalar_of(const json& v);
// "float32", "torch.int64", "long" ... as a kiln dtype.
DType parse_dtype(std::string s);
// Whether v is a tensor object ({"dtype", "data"}).
bool is_tensor_json(const json& v);
// The leaves of a nested data list, row-major.
void flatten_data(const json& d, std::vector<const json*>& out);
// A tensor object's shape (1-D of `count` when absent).
std::vector<int64_t> shape_of(const json& t, size_t count);
// A tensor object as a kiln tensor.
Tensor make_tensor(const json& t);

// One case's arguments: positional inputs (tensors, numbers, tensor lists) and attrs.

struct Arg {
  enum Kind { None, T, S, List } kind = None;
  Tensor t;
  Scalar s;
  std::vector<Tensor> list;
};
// A case input (tensor, number, tensor list or null) as an Arg.
Arg arg_of(const json& v);

struct Ctx {
  std::string op;
  json attrs = json::object();
  std::vector<Arg> pos;  // positional inputs
  std::map<std::string, Arg> named;  // inputs given as an object
  std::vector<std::string> names;  // order of named inputs

  bool has(const std::string& k) const { return attrs.contains(k) && !attrs[k].is_null(); }
  bool present(const std::string& k) const { return attrs.contains(k); }
  const json& at(const std::string& k) const { return attrs.at(k); }
  int64_t i(const std::string& k, int64_t def) const { return has(k) ? integer(at(k)) : def; }
  double d(const std::string& k, double def) const { return has(k) ? number(at(k)) : def; }
  bool b(const std::string& k, bool def) const { return has(k) ? number(at(k)) != 0 : def; }
  std::string s(const std::string& k, const std::string& def) const { return has(k) ? at(k).get<std::string>() : def; }
  // An int or a list of ints.
  std::vector<int64_t> ints(const std::string& k) const {
    const json& v = at(k);
    std::vector<int64_t> r;
    if (v.is_array()) {
      for (const auto& e : v) r.push_back(integer(e));
    } else {
      r.push_back(integer(v));
    }
    return r;
  }
  // First of `keys` present (non-null), else "".
  std::string key(std::initializer_list<const char*> keys) const {
    for (const char* k : keys)
      if (has(k)) return k;
    return "";
  }
  // Reduction dims: missing or null = all dims (nullopt).
  std::optional<std::vector<int64_t>> dims(std::initializer_list<const char*> keys = {"dim", "axis"}) const {
    std::string k = key(keys);
    if (k.empty()) return std::nullopt;
    return ints(k);
  }
  // Positional input `p`, else a named input or attr under one of `keys`.
  Arg arg(size_t p, std::initializer_list<const char*> keys = {}) const {
    if (p < pos.size() && pos[p].kind != Arg::None) return pos[p];
    for (const char* k : keys) {
      auto it = named.find(k);
      if (it != named.end() && it->second.kind != Arg::None) return it->second;
    }
    for (const char* k : keys)
      if (has(k)) return arg_of(at(k));
    if (p < names.size()) {
      auto it = named.find(names[p]);
      if (it != named.end()) return it->second;
    }
    return Arg{};
  }
  Tensor tensor(size_t p, std::initializer_list<const char*> keys = {}) const {
    Arg a = arg(p, keys);
    if (a.kind != Arg::T) throw Unsupported(cat(op, ": expected a tensor for argument ", p));
    return a.t;
  }
  std::optional<Tensor> opt_tensor(size_t p, std::initializer_list<const char*> keys = {}) const {
    Arg a = arg(p, keys);
    if (a.kind == Arg::None) return std::nullopt;
    if (a.kind != Arg::T) throw Unsupported(cat(op, ": expected a tensor or None for argument ", p));
    return a.t;
  }
  // Every tensor among the positional (or named) inputs, lists flattened, in order.
  std::vector<Tensor> all_tensors() const {
    std::vector<Tensor> r;
    auto add = [&](const Arg& a) {
      if (a.kind == Arg::T) r.push_back(a.t);
      if (a.kind == Arg::List) r.insert(r.end(), a.list.begin(), a.list.end());
    };
    for (const auto& a : pos) add(a);
    for (const auto& n : names) add(named.at(n));
    return r;
  }
  // Rejects an attr that kiln has no way to honour unless it holds its PyTorch default.
  void require_default(const std::string& k, const json& def) const {
    if (present(k) && !(at(k) == def) && !(at(k).is_null() && def.is_null()))
      throw Unsupported(cat(op, ": attr ", k, "=", at(k).dump(), " is not supported"));
  }
};

// ---------------------------------------------------------------------------------------------
// Op tables.

// Ops compared with the looser float32 tolerance (reductions, matmul and composites).
bool loose_op(const std::string& op);
// Runs one op with kiln; returns its output(s).
std::vector<Tensor> run_op(const Ctx& c);

struct Tol {
  double rtol, atol;
};
// Forward tolerance for a dtype name (exact for integers and bool).
Tol tolerance(const std::string& dtype, bool loose);
// Gradient tolerances: float32 rtol 1e-4 / atol 1e-5, float64 1e-9.
Tol grad_tolerance(const std::string& dtype);
// A double with 9 significant digits.
std::string fmt(double v);
// "[2, 3]".
std::string shape_str(const std::vector<int64_t>& s);
// Compares one output with an expected tensor object; "" when they match, else the first
// difference. `tol_override` replaces the forward tolerance.
std::string compare(const Tensor& got, const json& exp, bool loose, std::optional<Tol> tol_override = std::nullopt);
// A case's op name, attrs and inputs (its "op", "attrs" and "inputs" fields).
Ctx make_ctx(const json& j);
// Every tensor a case passes (positional, then named; list elements in order).
std::vector<Tensor*> tensor_slots(Ctx& c);

}  // namespace torch_ops
