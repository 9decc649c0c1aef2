// The torch-parity op dispatcher (see torch_ops.h).
#include "torch_ops.h"
#include "test_seed.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <set>

namespace torch_ops {

// Python's json.dumps writes NaN / Infinity / -Infinity as bare tokens, which strict JSON (and
// nlohmann) rejects; turn them into the strings the corpus uses for non-finite values.
std::string quote_nonfinite_tokens(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  bool in_str = false, esc = false;
  for (size_t i = 0; i < s.size();) {
    char c = s[i];
    if (in_str) {
      out += c;
      if (esc)
        esc = false;
      else if (c == '\\')
        esc = true;
      else if (c == '"')
        in_str = false;
      ++i;
      continue;
    }
    if (c == '"') {
      in_str = true;
      out += c;
      ++i;
    } else if (s.compare(i, 9, "-Infinity") == 0) {
      out += "\"-inf\"";
      i += 9;
    } else if (s.compare(i, 8, "Infinity") == 0) {
      out += "\"inf\"";
      i += 8;
    } else if (s.compare(i, 3, "NaN") == 0) {
      out += "\"nan\"";
      i += 3;
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// JSON values -> numbers, scalars, dtypes and tensors.

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

double number(const json& v) {
  if (v.is_number()) return v.get<double>();
  if (v.is_boolean()) return v.get<bool>() ? 1.0 : 0.0;
  if (v.is_string()) {
    std::string s = lower(v.get<std::string>());
    if (s == "nan" || s == "+nan" || s == "-nan") return std::numeric_limits<double>::quiet_NaN();
    if (s == "inf" || s == "+inf" || s == "infinity" || s == "+infinity")
      return std::numeric_limits<double>::infinity();
    if (s == "-inf" || s == "-infinity") return -std::numeric_limits<double>::infinity();
    try {
      size_t used = 0;
      double d = std::stod(s, &used);
      if (used == s.size()) return d;
    } catch (...) {
    }
  }
  throw std::runtime_error("expected a number, got " + v.dump());
}

int64_t integer(const json& v) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_array() && v.size() == 1) return integer(v[0]);  // a one-element dim list
  if (v.is_boolean()) return v.get<bool>() ? 1 : 0;
  double d = number(v);
  if (!(std::isfinite(d) && d == std::floor(d))) throw std::runtime_error("expected an integer, got " + v.dump());
  return static_cast<int64_t>(d);
}

// A Python number as a kiln Scalar, keeping its category (bool / int / float) for promotion.
Scalar scalar_of(const json& v) {
  if (v.is_boolean()) return Scalar(v.get<bool>());
  if (v.is_number_integer()) return Scalar(v.get<int64_t>());
  return Scalar(number(v));
}

DType parse_dtype(std::string s) {
  if (s.rfind("torch.", 0) == 0) s = s.substr(6);
  if (s == "float" || s == "float32") return kiln::kFloat32;
  if (s == "double" || s == "float64") return kiln::kFloat64;
  if (s == "half" || s == "float16") return kiln::kFloat16;
  if (s == "bfloat16") return kiln::kBFloat16;
  if (s == "int" || s == "int32") return kiln::kInt32;
  if (s == "long" || s == "int64") return kiln::kInt64;
  if (s == "bool") return kiln::kBool;
  throw Unsupported("dtype '" + s + "' is not supported by kiln");
}

bool is_tensor_json(const json& v) { return v.is_object() && v.contains("dtype") && v.contains("data"); }

void flatten_data(const json& d, std::vector<const json*>& out) {
  if (d.is_array()) {
    for (const auto& e : d) flatten_data(e, out);
  } else {
    out.push_back(&d);
  }
}

std::vector<int64_t> shape_of(const json& t, size_t count) {
  if (!t.contains("shape") || t["shape"].is_null()) return {static_cast<int64_t>(count)};
  std::vector<int64_t> s;
  for (const auto& d : t["shape"]) s.push_back(integer(d));
  return s;
}

Tensor make_host_tensor(const json& t) {
  DType dt = parse_dtype(t["dtype"].get<std::string>());
  std::vector<const json*> vals;
  flatten_data(t["data"], vals);
  std::vector<int64_t> shape = shape_of(t, vals.size());
  auto floats = [&] {
    std::vector<float> v;
    for (auto* e : vals) v.push_back(static_cast<float>(number(*e)));
    return v;
  };
  switch (dt) {
    case DType::Float32: return kiln::from_vector(floats(), shape);
    case DType::Float64: {
      std::vector<double> v;
      for (auto* e : vals) v.push_back(number(*e));
      return kiln::from_vector(v, shape);
    }
    case DType::Float16: {
      std::vector<kiln::Half> v;
      for (float f : floats()) v.emplace_back(f);
      return kiln::from_vector(v, shape);
    }
    case DType::BFloat16: {
      std::vector<kiln::BFloat16> v;
      for (float f : floats()) v.emplace_back(f);
      return kiln::from_vector(v, shape);
    }
    case DType::Int32: {
      std::vector<int32_t> v;
      for (auto* e : vals) v.push_back(static_cast<int32_t>(integer(*e)));
      return kiln::from_vector(v, shape);
    }
    case DType::Int64: {
      std::vector<int64_t> v;
      for (auto* e : vals) v.push_back(integer(*e));
      return kiln::from_vector(v, shape);
    }
    case DType::Bool: {
      std::vector<int32_t> v;
      for (auto* e : vals) v.push_back(number(*e) != 0 ? 1 : 0);
      return kiln::to(kiln::from_vector(v, shape), kiln::kBool);
    }
  }
  throw Unsupported("unknown dtype");
}

// ---------------------------------------------------------------------------------------------
Arg arg_of(const json& v) {
  Arg a;
  if (v.is_null()) return a;
  if (is_tensor_json(v)) {
    a.kind = Arg::T;
    a.t = make_tensor(v);
  } else if (v.is_array()) {
    a.kind = Arg::List;
    for (const auto& e : v) {
      if (!is_tensor_json(e)) throw Unsupported("input list holds a non-tensor: " + e.dump().substr(0, 80));
      a.list.push_back(make_tensor(e));
    }
  } else if (v.is_number() || v.is_boolean() || v.is_string()) {
    a.kind = Arg::S;
    a.s = scalar_of(v);
  } else {
    throw Unsupported("cannot read input " + v.dump().substr(0, 80));
  }
  return a;
}
using Unary = std::function<Tensor(const Tensor&)>;
const std::map<std::string, Unary>& unary_ops() {
  static const std::map<std::string, Unary> m = {
      {"neg", [](const Tensor& x) { return kiln::neg(x); }},
      {"negative", [](const Tensor& x) { return kiln::neg(x); }},
      {"abs", [](const Tensor& x) { return kiln::abs(x); }},
      {"absolute", [](const Tensor& x) { return kiln::abs(x); }},
      {"exp", [](const Tensor& x) { return kiln::exp(x); }},
      {"exp2", [](const Tensor& x) { return kiln::exp2(x); }},
      {"expm1", [](const Tensor& x) { return kiln::expm1(x); }},
      {"log", [](const Tensor& x) { return kiln::log(x); }},
      {"log2", [](const Tensor& x) { return kiln::log2(x); }},
      {"log1p", [](const Tensor& x) { return kiln::log1p(x); }},
      {"sqrt", [](const Tensor& x) { return kiln::sqrt(x); }},
      {"rsqrt", [](const Tensor& x) { return kiln::rsqrt(x); }},
      {"reciprocal", [](const Tensor& x) { return kiln::reciprocal(x); }},
      {"square", [](const Tensor& x) { return kiln::square(x); }},
      {"sin", [](const Tensor& x) { return kiln::sin(x); }},
      {"cos", [](const Tensor& x) { return kiln::cos(x); }},
      {"tan", [](const Tensor& x) { return kiln::tan(x); }},
      {"atan", [](const Tensor& x) { return kiln::atan(x); }},
      {"arctan", [](const Tensor& x) { return kiln::atan(x); }},
      {"tanh", [](const Tensor& x) { return kiln::tanh(x); }},
      {"sigmoid", [](const Tensor& x) { return kiln::sigmoid(x); }},
      {"relu", [](const Tensor& x) { return kiln::relu(x); }},
      {"silu", [](const Tensor& x) { return kiln::silu(x); }},
      {"erf", [](const Tensor& x) { return kiln::erf(x); }},
      {"floor", [](const Tensor& x) { return kiln::floor(x); }},
      {"ceil", [](const Tensor& x) { return kiln::ceil(x); }},
      {"sign", [](const Tensor& x) { return kiln::sign(x); }},
      {"isnan", [](const Tensor& x) { return kiln::isnan(x); }},
      {"isfinite", [](const Tensor& x) { return kiln::isfinite(x); }},
      {"logical_not", [](const Tensor& x) { return kiln::logical_not(x); }},
      {"bitwise_not", [](const Tensor& x) { return kiln::bitwise_not(x); }},
      {"contiguous", [](const Tensor& x) { return kiln::contiguous(x); }},
      {"clone", [](const Tensor& x) { return x.clone(); }},
      {"t", [](const Tensor& x) { return x.t(); }},
      {"nonzero", [](const Tensor& x) { return kiln::nonzero(x); }},
  };
  return m;
}

struct Binary {
  std::function<Tensor(const Tensor&, const Tensor&)> tt;
  std::function<Tensor(const Tensor&, Scalar)> ts;
  std::function<Tensor(Scalar, const Tensor&)> st;
};
#define KILN_PARITY_BIN(name, fn)                                      \
  {                                                                    \
    name, Binary {                                                     \
      [](const Tensor& a, const Tensor& b) { return kiln::fn(a, b); }, \
          [](const Tensor& a, Scalar b) { return kiln::fn(a, b); },    \
          [](Scalar a, const Tensor& b) { return kiln::fn(a, b); }     \
    }                                                                  \
  }
const std::map<std::string, Binary>& binary_ops() {
  static const std::map<std::string, Binary> m = {
    KILN_PARITY_BIN("add", add),
    KILN_PARITY_BIN("sub", sub),
    KILN_PARITY_BIN("subtract", sub),
    KILN_PARITY_BIN("mul", mul),
    KILN_PARITY_BIN("multiply", mul),
    KILN_PARITY_BIN("div", div),
    KILN_PARITY_BIN("divide", div),
    KILN_PARITY_BIN("true_divide", div),
    KILN_PARITY_BIN("floor_divide", div),  // rounded in run_op
    KILN_PARITY_BIN("pow", pow),
    KILN_PARITY_BIN("maximum", maximum),
    KILN_PARITY_BIN("minimum", minimum),
    KILN_PARITY_BIN("atan2", atan2),
    KILN_PARITY_BIN("arctan2", atan2),
    KILN_PARITY_BIN("remainder", remainder),
    KILN_PARITY_BIN("fmod", fmod),
    KILN_PARITY_BIN("eq", eq),
    KILN_PARITY_BIN("ne", ne),
    KILN_PARITY_BIN("not_equal", ne),
    KILN_PARITY_BIN("lt", lt),
    KILN_PARITY_BIN("less", lt),
    KILN_PARITY_BIN("le", le),
    KILN_PARITY_BIN("less_equal", le),
    KILN_PARITY_BIN("gt", gt),
    KILN_PARITY_BIN("greater", gt),
    KILN_PARITY_BIN("ge", ge),
    KILN_PARITY_BIN("greater_equal", ge),
    KILN_PARITY_BIN("logical_and", logical_and),
    KILN_PARITY_BIN("logical_or", logical_or),
    KILN_PARITY_BIN("logical_xor", logical_xor),
    KILN_PARITY_BIN("bitwise_and", bitwise_and),
    KILN_PARITY_BIN("bitwise_or", bitwise_or),
    KILN_PARITY_BIN("bitwise_xor", bitwise_xor),
  };
  return m;
}
#undef KILN_PARITY_BIN

Tensor apply_binary(const std::string& op, const Binary& f, const Arg& a, const Arg& b) {
  if (a.kind == Arg::T && b.kind == Arg::T) return f.tt(a.t, b.t);
  if (a.kind == Arg::T && b.kind == Arg::S) return f.ts(a.t, b.s);
  if (a.kind == Arg::S && b.kind == Arg::T) return f.st(a.s, b.t);
  if (a.kind == Arg::S && b.kind == Arg::S) return f.tt(kiln::scalar_tensor(a.s), kiln::scalar_tensor(b.s));
  throw Unsupported(op + ": expected two operands (tensor or number)");
}

// Ops compared with the looser tolerance (reductions, matmul and composites).
bool loose_op(const std::string& op) {
  static const std::set<std::string> s = {"sum",
                                          "mean",
                                          "prod",
                                          "amax",
                                          "amin",
                                          "max",
                                          "min",
                                          "argmax",
                                          "argmin",
                                          "all",
                                          "any",
                                          "var",
                                          "std",
                                          "logsumexp",
                                          "norm",
                                          "vector_norm",
                                          "linalg_vector_norm",
                                          "linalg.vector_norm",
                                          "linalg_norm",
                                          "linalg.norm",
                                          "cumsum",
                                          "matmul",
                                          "mm",
                                          "bmm",
                                          "linear",
                                          "outer",
                                          "ger",
                                          "dot",
                                          "softmax",
                                          "log_softmax",
                                          "layer_norm",
                                          "cross_entropy",
                                          "mse_loss",
                                          "smooth_l1_loss",
                                          "sdpa",
                                          "scaled_dot_product_attention",
                                          "conv2d",
                                          "contiguous_chain",
                                          "mlp_mse",
                                          "mlp_xent",
                                          "index_add",
                                          "scatter_add",
                                          "linspace",
                                          "cumprod",
                                          "einsum",
                                          "cdist",
                                          "index_put"};
  return s.count(op) > 0;
}

// ---------------------------------------------------------------------------------------------
// Helpers for ops whose PyTorch form kiln spells differently.

std::vector<int64_t> dims_or_all(const std::optional<std::vector<int64_t>>& d) {
  return d.value_or(std::vector<int64_t>{});
}

std::optional<DType> dtype_attr(const Ctx& c, const char* k = "dtype") {
  if (!c.has(k)) return std::nullopt;
  return parse_dtype(c.at(k).get<std::string>());
}

// torch.div(a, b, rounding_mode=...) built from kiln ops.
Tensor div_rounded(const Arg& a, const Arg& b, const std::string& mode) {
  auto tens = [](const Arg& x, const Arg& other) {
    if (x.kind == Arg::T) return x.t;
    DType t = other.kind == Arg::T ? kiln::result_type({other.t}, {x.s}) : x.s.default_dtype();
    return kiln::scalar_tensor(x.s, t);
  };
  Tensor x = tens(a, b), y = tens(b, a);
  DType t = kiln::result_type({x, y});
  if (a.kind == Arg::T && b.kind == Arg::S) t = kiln::result_type({a.t}, {b.s});
  if (a.kind == Arg::S && b.kind == Arg::T) t = kiln::result_type({b.t}, {a.s});
  x = kiln::to(x, t);
  y = kiln::to(y, t);
  if (!kiln::is_floating(t)) {
    // Exact integer division: subtract the (truncated / floored) remainder, divide exactly.
    Tensor r = mode == "trunc" ? kiln::fmod(x, y) : kiln::remainder(x, y);
    Tensor q = kiln::div(kiln::to(kiln::sub(x, r), kiln::kFloat64), kiln::to(y, kiln::kFloat64));
    return kiln::to(kiln::round(q), t);
  }
  Tensor q = kiln::div(x, y);
  if (mode == "trunc") return kiln::where(kiln::lt(q, 0), kiln::ceil(q), kiln::floor(q));
  // PyTorch's div_floor for floats: based on fmod so that it agrees with remainder.
  Tensor mod = kiln::fmod(x, y);
  Tensor dq = kiln::div(kiln::sub(x, mod), y);
  Tensor adjust = kiln::logical_and(kiln::ne(mod, 0), kiln::ne(kiln::lt(y, 0), kiln::lt(mod, 0)));
  dq = kiln::where(adjust, kiln::sub(dq, 1), dq);
  Tensor fl = kiln::floor(dq);
  fl = kiln::where(kiln::gt(kiln::sub(dq, fl), 0.5), kiln::add(fl, 1), fl);
  fl = kiln::where(kiln::eq(dq, 0), kiln::mul(kiln::sign(q), 0), fl);
  return kiln::where(kiln::eq(y, 0), q, fl);
}

// F.cross_entropy with weight / ignore_index / label_smoothing, composed from kiln ops.
Tensor cross_entropy_full(const Tensor& logits, const Tensor& target, const std::optional<Tensor>& weight,
                          int64_t ignore_index, double smoothing, const std::string& reduction) {
  int64_t cdim = logits.dim() == 1 ? 0 : 1;
  int64_t C = logits.size(cdim);
  Tensor lsm = kiln::log_softmax(logits, cdim);
  std::vector<int64_t> wshape(logits.dim(), 1);
  wshape[cdim] = C;
  auto reduce = [&](const Tensor& l, const std::optional<Tensor>& denom) {
    if (reduction == "none") return l;
    if (reduction == "sum") return kiln::sum(l);
    if (reduction != "mean") throw Unsupported("cross_entropy: reduction '" + reduction + "'");
    return denom ? kiln::div(kiln::sum(l), *denom) : kiln::mean(l);
  };
  if (kiln::is_floating(target.dtype())) {  // class probabilities
    Tensor tgt = smoothing > 0 ? kiln::add(kiln::mul(target, 1 - smoothing), smoothing / C) : target;
    Tensor prod = kiln::mul(lsm, tgt);
    if (weight) prod = kiln::mul(prod, kiln::reshape(*weight, wshape));
    Tensor l = kiln::neg(kiln::sum(prod, {cdim}));
    if (reduction == "mean") {
      int64_t n = logits.dim() == 1 ? 1 : logits.numel() / C;
      return kiln::div(kiln::sum(l), static_cast<double>(n));
    }
    return reduce(l, std::nullopt);
  }
  Tensor valid = kiln::ne(target, ignore_index);
  Tensor safe = kiln::where(valid, target, Scalar(int64_t{0}));
  Tensor picked = kiln::squeeze(kiln::gather(lsm, cdim, kiln::unsqueeze(safe, cdim)), cdim);
  Tensor w_t = weight ? kiln::index_select(*weight, 0, kiln::reshape(safe, {-1})).reshape(safe.sizes())
                      : kiln::ones_like(picked);
  w_t = kiln::where(valid, w_t, 0.0);
  Tensor nll = kiln::neg(kiln::mul(picked, w_t));
  Tensor l = nll;
  if (smoothing > 0) {
    Tensor lw = weight ? kiln::mul(lsm, kiln::reshape(*weight, wshape)) : lsm;
    Tensor smooth = kiln::where(valid, kiln::neg(kiln::sum(lw, {cdim})), 0.0);
    l = kiln::add(kiln::mul(nll, 1 - smoothing), kiln::mul(smooth, smoothing / C));
  }
  return reduce(l, kiln::sum(w_t));
}

// ---------------------------------------------------------------------------------------------
// The dispatcher: runs one case's op with kiln; returns its output(s).

std::vector<Tensor> run_op(const Ctx& c) {
  const std::string& op = c.op;
  auto one = [](Tensor t) { return std::vector<Tensor>{std::move(t)}; };

  // ---- plain unary ----
  if (auto it = unary_ops().find(op); it != unary_ops().end()) return one(it->second(c.tensor(0, {"input", "x"})));

  // ---- binary (tensor or number on either side) ----
  if (auto it = binary_ops().find(op); it != binary_ops().end()) {
    Arg a = c.arg(0, {"input", "self", "x"});
    Arg b = c.arg(1, {"other", "exponent", "y"});
    if (op == "floor_divide") return one(div_rounded(a, b, "floor"));
    if ((op == "div" || op == "divide") && c.has("rounding_mode"))
      return one(div_rounded(a, b, c.s("rounding_mode", "")));
    if (c.has("alpha") && (op == "add" || op == "sub" || op == "subtract")) {
      Scalar alpha = scalar_of(c.at("alpha"));
      if (b.kind == Arg::T) {
        if (a.kind == Arg::T) return one(op == "add" ? kiln::add(a.t, b.t, alpha) : kiln::sub(a.t, b.t, alpha));
        b.t = kiln::mul(b.t, alpha);
      } else if (b.kind == Arg::S) {
        bool fl = b.s.is_floating() || alpha.is_floating();
        b.s = fl ? Scalar(b.s.to_double() * alpha.to_double()) : Scalar(b.s.to_int() * alpha.to_int());
      }
    }
    return one(apply_binary(op, it->second, a, b));
  }

  // ---- unary with attrs ----
  if (op == "gelu") return one(kiln::gelu(c.tensor(0), c.s("approximate", "none")));
  if (op == "softplus") return one(kiln::softplus(c.tensor(0), c.d("beta", 1), c.d("threshold", 20)));
  if (op == "round") {
    Tensor x = c.tensor(0);
    int64_t dec = c.i("decimals", 0);
    if (dec == 0) return one(kiln::round(x));
    double p = std::pow(10.0, static_cast<double>(std::llabs(dec)));
    if (dec > 0) return one(kiln::div(kiln::round(kiln::mul(x, p)), p));
    return one(kiln::mul(kiln::round(kiln::div(x, p)), p));
  }
  if (op == "to" || op == "type") {
    Tensor x = c.tensor(0);
    DType t = parse_dtype(c.s("dtype", ""));
    std::string note = lower(c.s("note", ""));
    if (note.find("round trip") != std::string::npos || note.find("roundtrip") != std::string::npos)
      return one(kiln::to(kiln::to(x, t), x.dtype()));
    return one(kiln::to(x, t));
  }
  static const std::map<std::string, DType> casts = {
      {"float", kiln::kFloat32}, {"double", kiln::kFloat64}, {"half", kiln::kFloat16}, {"bfloat16", kiln::kBFloat16},
      {"int", kiln::kInt32},     {"long", kiln::kInt64},     {"bool", kiln::kBool}};
  if (auto it = casts.find(op); it != casts.end()) return one(kiln::to(c.tensor(0), it->second));
  if (op == "clamp" || op == "clip" || op == "clamp_min" || op == "clamp_max") {
    Tensor x = c.tensor(0);
    Arg mn, mx;
    if (op == "clamp_min")
      mn = c.arg(1, {"min"});
    else if (op == "clamp_max")
      mx = c.arg(1, {"max"});
    else {
      mn = c.arg(1, {"min"});
      mx = c.arg(2, {"max"});
    }
    if (mn.kind == Arg::T || mx.kind == Arg::T) {
      auto t = [&](const Arg& a) -> std::optional<Tensor> {
        if (a.kind == Arg::None) return std::nullopt;
        return a.kind == Arg::T ? a.t : kiln::scalar_tensor(a.s);
      };
      return one(kiln::clamp(x, t(mn), t(mx)));
    }
    auto s = [](const Arg& a) -> std::optional<Scalar> {
      if (a.kind == Arg::None) return std::nullopt;
      return a.s;
    };
    return one(kiln::clamp(x, s(mn), s(mx)));
  }

  // ---- ternary ----
  if (op == "where") {
    Tensor cond = c.tensor(0, {"condition", "cond"});
    Arg a = c.arg(1, {"input", "self", "x"}), b = c.arg(2, {"other", "y"});
    if (a.kind == Arg::T && b.kind == Arg::T) return one(kiln::where(cond, a.t, b.t));
    if (a.kind == Arg::T && b.kind == Arg::S) return one(kiln::where(cond, a.t, b.s));
    if (a.kind == Arg::S && b.kind == Arg::T) return one(kiln::where(cond, a.s, b.t));
    if (a.kind == Arg::S && b.kind == Arg::S) return one(kiln::where(cond, a.s, b.s));
    throw Unsupported("where: expected condition, input and other");
  }
  if (op == "lerp") {
    Tensor a = c.tensor(0), b = c.tensor(1, {"end"});
    Arg w = c.arg(2, {"weight"});
    if (w.kind == Arg::T) return one(kiln::lerp(a, b, w.t));
    if (w.kind == Arg::S) return one(kiln::lerp(a, b, w.s));
    throw Unsupported("lerp: missing weight");
  }
  if (op == "masked_fill") {
    Tensor x = c.tensor(0), mask = c.tensor(1, {"mask"});
    Arg v = c.arg(2, {"value"});
    if (v.kind == Arg::T) return one(kiln::masked_fill(x, mask, v.t));
    if (v.kind == Arg::S) return one(kiln::masked_fill(x, mask, v.s));
    throw Unsupported("masked_fill: missing value");
  }

  // ---- reductions ----
  if (op == "sum" || op == "nansum") {
    if (op == "nansum") throw Unsupported("nansum is not in kiln's API");
    return one(kiln::sum(c.tensor(0), dims_or_all(c.dims()), c.b("keepdim", false), dtype_attr(c)));
  }
  if (op == "mean") {
    Tensor x = c.tensor(0);
    if (auto t = dtype_attr(c)) x = kiln::to(x, *t);
    return one(kiln::mean(x, dims_or_all(c.dims()), c.b("keepdim", false)));
  }
  if (op == "prod") {
    Tensor x = c.tensor(0);
    if (auto t = dtype_attr(c)) x = kiln::to(x, *t);
    return one(kiln::prod(x, dims_or_all(c.dims()), c.b("keepdim", false)));
  }
  if (op == "amax") return one(kiln::amax(c.tensor(0), dims_or_all(c.dims()), c.b("keepdim", false)));
  if (op == "amin") return one(kiln::amin(c.tensor(0), dims_or_all(c.dims()), c.b("keepdim", false)));
  if (op == "max" || op == "min") {
    bool mx = op == "max";
    Arg other = c.arg(1, {"other"});
    if (other.kind == Arg::T)
      return one(mx ? kiln::maximum(c.tensor(0), other.t) : kiln::minimum(c.tensor(0), other.t));
    if (c.has("dim")) {
      auto [v, i] = mx ? kiln::max(c.tensor(0), c.i("dim", 0), c.b("keepdim", false))
                       : kiln::min(c.tensor(0), c.i("dim", 0), c.b("keepdim", false));
      return {v, i};
    }
    return one(mx ? kiln::max(c.tensor(0)) : kiln::min(c.tensor(0)));
  }
  if (op == "argmax" || op == "argmin") {
    std::optional<int64_t> dim;
    if (c.has("dim")) dim = c.i("dim", 0);
    bool k = c.b("keepdim", false);
    return one(op == "argmax" ? kiln::argmax(c.tensor(0), dim, k) : kiln::argmin(c.tensor(0), dim, k));
  }
  if (op == "all") return one(kiln::all(c.tensor(0), dims_or_all(c.dims()), c.b("keepdim", false)));
  if (op == "any") return one(kiln::any(c.tensor(0), dims_or_all(c.dims()), c.b("keepdim", false)));
  if (op == "var" || op == "std") {
    double corr = 1;
    if (c.has("correction"))
      corr = c.d("correction", 1);
    else if (c.has("unbiased"))
      corr = c.b("unbiased", true) ? 1 : 0;
    Tensor x = c.tensor(0);
    auto d = dims_or_all(c.dims());
    bool k = c.b("keepdim", false);
    return one(op == "var" ? kiln::var(x, d, corr, k) : kiln::std(x, d, corr, k));
  }
  if (op == "logsumexp") return one(kiln::logsumexp(c.tensor(0), dims_or_all(c.dims()), c.b("keepdim", false)));
  if (op == "norm" || op == "vector_norm" || op == "linalg_vector_norm" || op == "linalg.vector_norm") {
    Tensor x = c.tensor(0);
    if (auto t = dtype_attr(c)) x = kiln::to(x, *t);
    double p = 2;
    std::string pk = c.key({"ord", "p"});
    if (!pk.empty()) {
      const json& v = c.at(pk);
      if (v.is_string() && lower(v.get<std::string>()) == "fro")
        p = 2;
      else if (v.is_string() && lower(v.get<std::string>()) == "nuc")
        throw Unsupported("norm: nuclear norm");
      else
        p = number(v);
    }
    return one(kiln::norm(x, p, dims_or_all(c.dims()), c.b("keepdim", false)));
  }
  if (op == "cumsum") return one(kiln::cumsum(c.tensor(0), c.i("dim", 0), dtype_attr(c)));
  if (op == "cumprod") return one(kiln::cumprod(c.tensor(0), c.i("dim", 0), dtype_attr(c)));

  // ---- views and movement ----
  if (op == "reshape" || op == "view") {
    std::string k = c.key({"shape", "size", "sizes"});
    if (k.empty()) throw Unsupported(op + ": missing shape");
    return one(op == "view" ? c.tensor(0).view(c.ints(k)) : kiln::reshape(c.tensor(0), c.ints(k)));
  }
  if (op == "flatten") return one(kiln::flatten(c.tensor(0), c.i("start_dim", 0), c.i("end_dim", -1)));
  if (op == "squeeze") {
    Tensor x = c.tensor(0);
    auto d = c.dims();
    if (!d) return one(kiln::squeeze(x));
    return one(kiln::squeeze(x, *d));
  }
  if (op == "unsqueeze") return one(kiln::unsqueeze(c.tensor(0), c.i("dim", 0)));
  if (op == "permute") return one(kiln::permute(c.tensor(0), c.ints(c.key({"dims", "dim"}))));
  if (op == "transpose" || op == "swapaxes" || op == "swapdims") {
    return one(
        kiln::transpose(c.tensor(0), integer(c.at(c.key({"dim0", "axis0"}))), integer(c.at(c.key({"dim1", "axis1"})))));
  }
  if (op == "expand" || op == "broadcast_to") {
    std::string k = c.key({"shape", "size", "sizes"});
    return one(kiln::expand(c.tensor(0), c.ints(k)));
  }
  if (op == "broadcast_tensors") return kiln::broadcast_tensors(c.all_tensors());
  if (op == "slice") {
    Tensor x = c.tensor(0);
    if (c.has("slices")) {
      for (const auto& s : c.at("slices")) {
        auto opt = [](const json& v) -> std::optional<int64_t> {
          if (v.is_null()) return std::nullopt;
          return integer(v);
        };
        int64_t step = s.size() > 3 && !s[3].is_null() ? integer(s[3]) : 1;
        x = x.slice(integer(s[0]), opt(s[1]), s.size() > 2 ? opt(s[2]) : std::nullopt, step);
      }
      return one(x);
    }
    std::optional<int64_t> st, en;
    if (c.has("start")) st = c.i("start", 0);
    if (c.has("end"))
      en = c.i("end", 0);
    else if (c.has("stop"))
      en = c.i("stop", 0);
    return one(x.slice(c.i("dim", 0), st, en, c.i("step", 1)));
  }
  if (op == "narrow") return one(c.tensor(0).narrow(c.i("dim", 0), c.i("start", 0), c.i("length", 0)));
  if (op == "select") return one(c.tensor(0).select(c.i("dim", 0), c.i("index", 0)));
  if (op == "flip") return one(kiln::flip(c.tensor(0), c.ints(c.key({"dims", "dim"}))));
  if (op == "repeat") return one(kiln::repeat(c.tensor(0), c.ints(c.key({"repeats", "sizes"}))));
  if (op == "tril") return one(kiln::tril(c.tensor(0), c.i("diagonal", 0)));
  if (op == "triu") return one(kiln::triu(c.tensor(0), c.i("diagonal", 0)));
  if (op == "cat" || op == "concat" || op == "concatenate")
    return one(kiln::cat(c.all_tensors(), c.i(c.has("axis") ? "axis" : "dim", 0)));
  if (op == "stack") return one(kiln::stack(c.all_tensors(), c.i(c.has("axis") ? "axis" : "dim", 0)));
  if (op == "split") {
    std::string k = c.key({"sizes", "split_size_or_sections", "split_size", "split_sizes", "sections"});
    if (k.empty()) throw Unsupported("split: missing split sizes");
    Tensor x = c.tensor(0);
    int64_t dim = c.i("dim", 0);
    if (c.at(k).is_array()) return kiln::split(x, c.ints(k), dim);
    return kiln::split(x, c.i(k, 1), dim);
  }
  if (op == "chunk") return kiln::chunk(c.tensor(0), c.i("chunks", 1), c.i("dim", 0));
  if (op == "pad") {
    std::string mode = c.s("mode", "constant");
    if (mode != "constant") throw Unsupported("pad: mode '" + mode + "' is not supported by kiln");
    return one(kiln::pad(c.tensor(0), c.ints("pad"), c.d("value", 0)));
  }

  // ---- API of issue 10 (tests/parity/api_parity.jsonl) ----
  if (op == "expand_as") return one(c.tensor(0).expand_as(c.tensor(1)));
  if (op == "view_as") return one(c.tensor(0).view_as(c.tensor(1)));
  if (op == "reshape_as") return one(c.tensor(0).reshape_as(c.tensor(1)));
  if (op == "mT") return one(c.tensor(0).mT());
  if (op == "unbind") return kiln::unbind(c.tensor(0), c.i("dim", 0));
  if (op == "movedim") {
    if (c.at("source").is_array()) return one(kiln::movedim(c.tensor(0), c.ints("source"), c.ints("destination")));
    return one(kiln::movedim(c.tensor(0), c.i("source", 0), c.i("destination", 0)));
  }
  if (op == "diagonal") return one(kiln::diagonal(c.tensor(0), c.i("offset", 0), c.i("dim1", 0), c.i("dim2", 1)));
  if (op == "roll") {
    if (!c.has("dims")) return one(kiln::roll(c.tensor(0), c.ints("shifts"), {}));
    return one(kiln::roll(c.tensor(0), c.ints("shifts"), c.ints("dims")));
  }
  if (op == "sort") {
    auto [v, i] = kiln::sort(c.tensor(0), c.i("dim", -1), c.b("descending", false), c.b("stable", false));
    return {v, i};
  }
  if (op == "argsort") return one(kiln::argsort(c.tensor(0), c.i("dim", -1), c.b("descending", false)));
  if (op == "topk") {
    auto [v, i] = kiln::topk(c.tensor(0), c.i("k", 1), c.i("dim", -1), c.b("largest", true), c.b("sorted", true));
    return {v, i};
  }
  if (op == "einsum") return one(kiln::einsum(c.s("equation", ""), c.all_tensors()));
  if (op == "cdist") return one(kiln::cdist(c.tensor(0), c.tensor(1), c.d("p", 2)));
  static const std::map<std::string, Tensor& (Tensor::*)()> inplace = {
      {"exp_", &Tensor::exp_}, {"relu_", &Tensor::relu_}, {"sigmoid_", &Tensor::sigmoid_}, {"tanh_", &Tensor::tanh_},
      {"neg_", &Tensor::neg_}, {"abs_", &Tensor::abs_},   {"sqrt_", &Tensor::sqrt_},       {"log_", &Tensor::log_}};
  if (auto it = inplace.find(op); it != inplace.end()) {
    Tensor y = c.tensor(0).clone();
    (y.*(it->second))();
    return one(y);
  }
  if (op == "clamp_min_" || op == "clamp_max_") {
    Tensor y = c.tensor(0).clone();
    if (op == "clamp_min_")
      y.clamp_min_(scalar_of(c.at("min")));
    else
      y.clamp_max_(scalar_of(c.at("max")));
    return one(y);
  }
  if (op == "masked_fill_") {
    Tensor y = c.tensor(0).clone();
    y.masked_fill_(c.tensor(1), scalar_of(c.at("value")));
    return one(y);
  }
  if (op == "index" || op == "index_put") {
    // attrs.spec: ints, null (None), "...", [start, stop, step] slices, {"tensor": k} (k-th index tensor input).
    size_t first = op == "index" ? 1 : 2;
    std::vector<kiln::TensorIndex> idx;
    for (const auto& e : c.at("spec")) {
      if (e.is_object())
        idx.push_back(c.tensor(first + static_cast<size_t>(integer(e.at("tensor")))));
      else if (e.is_string())
        idx.push_back(kiln::Ellipsis);
      else if (e.is_null())
        idx.push_back(kiln::None);
      else if (e.is_array()) {
        auto b = [&](size_t k) -> kiln::SliceBound {
          if (k >= e.size() || e[k].is_null()) return kiln::None;
          return integer(e[k]);
        };
        int64_t step = e.size() > 2 && !e[2].is_null() ? integer(e[2]) : 1;
        idx.push_back(kiln::Slice(b(0), b(1), step));
      } else {
        idx.push_back(integer(e));
      }
    }
    if (op == "index") return one(c.tensor(0).index(idx));
    return one(kiln::index_put(c.tensor(0), idx, c.tensor(1), c.b("accumulate", false)));
  }

  // ---- indexing ----
  if (op == "gather") return one(kiln::gather(c.tensor(0), c.i("dim", 0), c.tensor(1, {"index"})));
  if (op == "scatter") {
    c.require_default("reduce", nullptr);
    Tensor x = c.tensor(0), idx = c.tensor(1, {"index"});
    Arg src = c.arg(2, {"src", "value"});
    if (src.kind == Arg::T) return one(kiln::scatter(x, c.i("dim", 0), idx, src.t));
    if (src.kind == Arg::S) return one(kiln::scatter(x, c.i("dim", 0), idx, src.s));
    throw Unsupported("scatter: missing src/value");
  }
  if (op == "scatter_add")
    return one(kiln::scatter_add(c.tensor(0), c.i("dim", 0), c.tensor(1, {"index"}), c.tensor(2, {"src"})));
  if (op == "index_select") return one(kiln::index_select(c.tensor(0), c.i("dim", 0), c.tensor(1, {"index"})));
  if (op == "index_add") {
    Scalar alpha = c.has("alpha") ? scalar_of(c.at("alpha")) : Scalar(int64_t{1});
    return one(
        kiln::index_add(c.tensor(0), c.i("dim", 0), c.tensor(1, {"index"}), c.tensor(2, {"source", "src"}), alpha));
  }
  if (op == "embedding") {
    c.require_default("max_norm", nullptr);
    Tensor a = c.tensor(0, {"input", "indices"}), b = c.tensor(1, {"weight"});
    // F.embedding(input, weight): the integer operand holds the indices.
    if (kiln::is_floating(a.dtype()) && !kiln::is_floating(b.dtype())) std::swap(a, b);
    return one(kiln::embedding(a, b));
  }
  if (op == "one_hot") return one(kiln::one_hot(c.tensor(0), c.i("num_classes", -1)));
  if (op == "masked_select") return one(kiln::masked_select(c.tensor(0), c.tensor(1, {"mask"})));

  // ---- linear algebra ----
  if (op == "matmul") return one(kiln::matmul(c.tensor(0), c.tensor(1, {"other"})));
  if (op == "mm") return one(kiln::mm(c.tensor(0), c.tensor(1, {"mat2"})));
  if (op == "bmm") return one(kiln::bmm(c.tensor(0), c.tensor(1, {"mat2"})));
  if (op == "outer" || op == "ger") return one(kiln::outer(c.tensor(0), c.tensor(1, {"vec2"})));
  if (op == "dot" || op == "inner" || op == "vdot") {
    Tensor a = c.tensor(0), b = c.tensor(1);
    if (a.dim() != 1 || b.dim() != 1) throw Unsupported(op + ": only 1-D operands");
    return one(kiln::matmul(a, b));
  }
  if (op == "linear") return one(kiln::linear(c.tensor(0), c.tensor(1, {"weight"}), c.opt_tensor(2, {"bias"})));

  // ---- nn functional ----
  if (op == "softmax" || op == "log_softmax") {
    Tensor x = c.tensor(0);
    if (auto t = dtype_attr(c)) x = kiln::to(x, *t);
    int64_t dim;
    if (c.has("dim"))
      dim = c.i("dim", 0);
    else
      dim = (x.dim() == 0 || x.dim() == 1 || x.dim() == 3) ? 0 : 1;  // PyTorch's legacy implicit dim
    return one(op == "softmax" ? kiln::softmax(x, dim) : kiln::log_softmax(x, dim));
  }
  if (op == "layer_norm") {
    Tensor x = c.tensor(0);
    std::vector<int64_t> ns = c.has("normalized_shape") ? c.ints("normalized_shape") : std::vector<int64_t>{x.size(-1)};
    return one(kiln::layer_norm(x, ns, c.opt_tensor(1, {"weight"}), c.opt_tensor(2, {"bias"}), c.d("eps", 1e-5)));
  }
  if (op == "cross_entropy") {
    Tensor logits = c.tensor(0), target = c.tensor(1, {"target"});
    std::optional<Tensor> weight = c.opt_tensor(2, {"weight"});
    std::string red = c.s("reduction", "mean");
    double ls = c.d("label_smoothing", 0);
    if (!weight && ls == 0 && !c.has("ignore_index")) return one(kiln::cross_entropy(logits, target, red));
    return one(cross_entropy_full(logits, target, weight, c.i("ignore_index", -100), ls, red));
  }
  if (op == "mse_loss") return one(kiln::mse_loss(c.tensor(0), c.tensor(1, {"target"}), c.s("reduction", "mean")));
  if (op == "smooth_l1_loss")
    return one(kiln::smooth_l1_loss(c.tensor(0), c.tensor(1, {"target"}), c.s("reduction", "mean"), c.d("beta", 1)));
  if (op == "dropout") {
    double p = c.d("p", 0.5);
    bool training = c.b("training", true);
    if (training && p > 0 && p < 1) throw Unsupported("dropout: random masks cannot be compared with PyTorch's");
    return one(kiln::dropout(c.tensor(0), p, training));
  }
  if (op == "sdpa" || op == "scaled_dot_product_attention") {
    c.require_default("dropout_p", 0.0);
    c.require_default("enable_gqa", false);
    std::optional<double> scale;
    if (c.has("scale")) scale = c.d("scale", 1);
    return one(kiln::scaled_dot_product_attention(c.tensor(0, {"query", "q"}), c.tensor(1, {"key", "k"}),
                                                  c.tensor(2, {"value", "v"}), c.opt_tensor(3, {"attn_mask"}),
                                                  c.b("is_causal", false), scale));
  }
  if (op == "conv2d") {
    Tensor x = c.tensor(0), w = c.tensor(1, {"weight"});
    std::optional<Tensor> bias = c.opt_tensor(2, {"bias"});
    auto pair = [&](const char* k, int64_t def) {
      std::vector<int64_t> v = c.has(k) ? c.ints(k) : std::vector<int64_t>{def};
      if (v.size() == 1) v.push_back(v[0]);
      return v;
    };
    std::vector<int64_t> stride = pair("stride", 1), dil = pair("dilation", 1), padding{0, 0};
    int64_t groups = c.i("groups", 1);
    if (c.has("padding") && c.at("padding").is_string()) {
      std::string m = c.at("padding").get<std::string>();
      if (m == "same") {
        // Total padding dilation*(k-1) per spatial dim, the extra element on the right/bottom.
        std::vector<int64_t> p;
        for (int64_t d = 1; d >= 0; --d) {
          int64_t total = dil[d] * (w.size(2 + d) - 1);
          p.push_back(total / 2);
          p.push_back(total - total / 2);
        }
        x = kiln::pad(x, p, 0);
      } else if (m != "valid") {
        throw Unsupported("conv2d: padding '" + m + "'");
      }
    } else {
      padding = pair("padding", 0);
    }
    c.require_default("padding_mode", "zeros");
    return one(kiln::conv2d(x, w, bias, stride, padding, dil, groups));
  }

  // ---- creation ----
  auto size_attr = [&]() {
    std::string k = c.key({"size", "shape", "sizes"});
    if (k.empty()) throw Unsupported(op + ": missing size");
    return c.ints(k);
  };
  if (op == "zeros" || op == "ones") {
    DType t = dtype_attr(c).value_or(kiln::kFloat32);
    return one(op == "zeros" ? kiln::zeros(size_attr(), t) : kiln::ones(size_attr(), t));
  }
  if (op == "full") return one(kiln::full(size_attr(), scalar_of(c.at("fill_value")), dtype_attr(c)));
  if (op == "zeros_like") return one(kiln::zeros_like(c.tensor(0), dtype_attr(c)));
  if (op == "ones_like") return one(kiln::ones_like(c.tensor(0), dtype_attr(c)));
  if (op == "full_like") return one(kiln::full_like(c.tensor(0), scalar_of(c.at("fill_value")), dtype_attr(c)));
  if (op == "scalar_tensor")  // torch.scalar_tensor defaults to the default float dtype, whatever the number
    return one(kiln::scalar_tensor(scalar_of(c.at(c.key({"s", "value"}))), dtype_attr(c).value_or(kiln::kFloat32)));
  if (op == "arange") {
    Scalar start = c.has("start") ? scalar_of(c.at("start")) : Scalar(int64_t{0});
    Scalar step = c.has("step") ? scalar_of(c.at("step")) : Scalar(int64_t{1});
    return one(kiln::arange(start, scalar_of(c.at("end")), step, dtype_attr(c)));
  }
  if (op == "linspace")
    return one(kiln::linspace(c.d("start", 0), c.d("end", 0), c.i("steps", 0), dtype_attr(c).value_or(kiln::kFloat32)));
  if (op == "eye") {
    std::optional<int64_t> m;
    if (c.has("m")) m = c.i("m", 0);
    return one(kiln::eye(c.i("n", 0), m, dtype_attr(c).value_or(kiln::kFloat32)));
  }

  // ---- small programs (see each case's note) ----
  if (op == "contiguous_chain") {  // (x.t() + b).exp().sum(0)
    return one(kiln::sum(kiln::exp(kiln::add(c.tensor(0).t(), c.tensor(1))), {0}));
  }
  if (op == "mlp_mse") {  // mse(linear(tanh(linear(x, w1, b1)), w2, b2), y)
    Tensor h = kiln::tanh(kiln::linear(c.tensor(0), c.tensor(1), c.tensor(2)));
    Tensor y = kiln::linear(h, c.tensor(3), c.tensor(4));
    return one(kiln::mse_loss(y, c.tensor(5), c.s("reduction", "mean")));
  }
  if (op == "mlp_xent") {  // cross_entropy(linear(relu(linear(x, w1, b1)), w2, b2), arange(N) % C)
    Tensor h = kiln::relu(kiln::linear(c.tensor(0), c.tensor(1), c.tensor(2)));
    Tensor logits = kiln::linear(h, c.tensor(3), c.tensor(4));
    Tensor target = kiln::remainder(kiln::arange(logits.size(0), std::nullopt, logits.device()), logits.size(1));
    return one(kiln::cross_entropy(logits, target, c.s("reduction", "mean")));
  }

  throw Unsupported("unknown op '" + op + "'");
}

// ---------------------------------------------------------------------------------------------
// Comparison.

Tol tolerance(const std::string& dtype, bool loose) {
  if (dtype == "float64") return {1e-10, 1e-10};
  if (dtype == "float32") return loose ? Tol{1e-4, 1e-4} : Tol{1e-5, 1e-6};
  if (dtype == "float16") return {1e-3, 1e-5};  // torch.testing defaults
  if (dtype == "bfloat16") return {1.6e-2, 1e-5};
  return {0, 0};  // integers and bool: exact
}

std::string fmt(double v) {
  std::ostringstream os;
  os.precision(9);
  os << v;
  return os.str();
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

std::string multi_index(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = shape[d] ? flat % shape[d] : 0;
    flat = shape[d] ? flat / shape[d] : 0;
  }
  return shape_str(idx);
}

// Gradient tolerances: float32 rtol 1e-4 / atol 1e-5, float64 1e-9.
Tol grad_tolerance(const std::string& dtype) {
  if (dtype == "float64") return {1e-9, 1e-9};
  if (dtype == "float32") return {1e-4, 1e-5};
  return tolerance(dtype, true);
}

// Compares one output; returns a description of the first difference, or "" when they match.
// `tol_override` replaces the forward tolerance for the expected dtype.
std::string compare(const Tensor& got, const json& exp, bool loose, std::optional<Tol> tol_override) {
  std::string edt = exp.at("dtype").get<std::string>();
  if (edt.rfind("torch.", 0) == 0) edt = edt.substr(6);
  std::vector<const json*> ev;
  flatten_data(exp.at("data"), ev);
  std::vector<int64_t> eshape = shape_of(exp, ev.size());
  std::string gdt = kiln::dtype_name(got.dtype());
  std::vector<int64_t> gshape = got.sizes();
  std::vector<std::string> problems;
  if (gdt != edt) problems.push_back("dtype: expected " + edt + ", got " + gdt);
  if (gshape != eshape) {
    problems.push_back("shape: expected " + shape_str(eshape) + ", got " + shape_str(gshape));
    return problems.size() == 1 ? problems[0] : problems[0] + "; " + problems[1];
  }
  Tol tol = tol_override ? *tol_override : tolerance(edt, loose);
  bool exact = tol.rtol == 0 && tol.atol == 0;
  int64_t n = static_cast<int64_t>(ev.size()), bad = 0, first = -1;
  std::string first_msg;
  if (exact && !kiln::is_floating(got.dtype())) {
    std::vector<int64_t> g = got.to_vector<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      int64_t e = edt == "bool" ? (number(*ev[i]) != 0) : integer(*ev[i]);
      if (g[i] != e) {
        if (first < 0) {
          first = i;
          first_msg = "expected " + std::to_string(e) + ", got " + std::to_string(g[i]) + " (exact)";
        }
        ++bad;
      }
    }
  } else {
    std::vector<double> g = got.to_vector<double>();
    for (int64_t i = 0; i < n; ++i) {
      double e = number(*ev[i]), v = g[i];
      bool ok;
      if (std::isnan(e) || std::isnan(v))
        ok = std::isnan(e) && std::isnan(v);
      else if (std::isinf(e) || std::isinf(v))
        ok = e == v;
      else
        ok = std::abs(v - e) <= tol.atol + tol.rtol * std::abs(e);
      if (!ok) {
        if (first < 0) {
          first = i;
          first_msg = "expected " + fmt(e) + ", got " + fmt(v) + " (|diff| " + fmt(std::abs(v - e)) + ", rtol " +
                      fmt(tol.rtol) + ", atol " + fmt(tol.atol) + ")";
        }
        ++bad;
      }
    }
  }
  if (bad) {
    problems.push_back("values differ at index " + multi_index(first, eshape) + " (flat " + std::to_string(first) +
                       "): " + first_msg + "; " + std::to_string(bad) + " of " + std::to_string(n) +
                       " elements differ");
  }
  std::string r;
  for (const auto& p : problems) r += (r.empty() ? "" : "; ") + p;
  return r;
}

// Every tensor a case passes (positional, then named; list elements in order).
std::vector<Tensor*> tensor_slots(Ctx& c) {
  std::vector<Tensor*> out;
  auto add = [&](Arg& a) {
    if (a.kind == Arg::T) out.push_back(&a.t);
    if (a.kind == Arg::List)
      for (auto& t : a.list) out.push_back(&t);
  };
  for (auto& a : c.pos) add(a);
  for (const auto& n : c.names) add(c.named.at(n));
  return out;
}

Tensor make_tensor(const json& t) {
  Tensor h = make_host_tensor(t);
  const kiln::Device d = kiln::testing::test_device();
  return d == kiln::cpu() ? h : h.to(d).detach();  // a leaf on the device
}

Ctx make_ctx(const json& j) {
  Ctx c;
  c.op = j.at("op").get<std::string>();
  if (j.contains("attrs") && j["attrs"].is_object()) c.attrs = j["attrs"];
  if (j.contains("inputs")) {
    const json& in = j["inputs"];
    if (in.is_array()) {
      for (const auto& v : in) c.pos.push_back(arg_of(v));
    } else if (in.is_object()) {
      for (auto it = in.begin(); it != in.end(); ++it) {
        c.names.push_back(it.key());
        c.named[it.key()] = arg_of(it.value());
      }
    }
  }
  return c;
}

}  // namespace torch_ops
