// Forward-mode AD: dual tensors (levels, views, in-place), every jvp rule against central finite
// differences and against PyTorch's torch.func.jvp, Hessian-vector products against PyTorch's,
// the function transforms (jvp, vjp, jacfwd, jacrev, hessian, hvp) eager, compiled, on threads
// and on the test device (KILN_TEST_DEVICE), and a Newton-CG solver built on hvp.
//
// The cases are tests/parity/jvp_parity.jsonl, written by tests/parity/make_jvp_parity.py with
// PyTorch 2.11 in float64 (run through tests/torch_ops.cpp like the torch-parity corpus).
#include <gtest/gtest.h>

#include <limits>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kiln.h"
#include "test_seed.h"
#include "source_dir.h"
#include "torch_ops.h"
#include "torch_programs.h"

namespace {
using namespace torch_ops;
using kiln::Tensor;
using V = std::vector<Tensor>;
namespace fwad = kiln::fwad;

kiln::Device dev() { return kiln::testing::test_device(); }
bool device_usable() { return dev() == kiln::cpu() || kiln::cuda::is_available(); }
#define KILN_NEED_DEVICE() \
  if (!device_usable()) GTEST_SKIP() << "KILN_TEST_DEVICE=" << dev().str() << ": no usable CUDA device"

Tensor on_dev(const Tensor& t) { return t.to(dev()); }
Tensor vec(std::vector<double> v, std::vector<int64_t> shape) { return on_dev(kiln::from_vector(v, shape)); }
Tensor rnd(std::vector<int64_t> shape, uint64_t seed) {
  kiln::manual_seed(seed);
  return on_dev(kiln::randn(shape, kiln::kFloat64));
}

// Largest |a - b| - (atol + rtol |b|) over the elements (<= 0: close).
double excess(const Tensor& a, const Tensor& b, double atol, double rtol) {
  auto x = a.to(kiln::kFloat64).to_vector<double>(), y = b.to(kiln::kFloat64).to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double worst = -1;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i)
    worst = std::max(worst, std::abs(x[i] - y[i]) - (atol + rtol * std::abs(y[i])));
  return worst;
}
#define EXPECT_CLOSE(a, b, atol, rtol) EXPECT_LE(excess((a), (b), (atol), (rtol)), 0.0)

// ---------------------------------------------------------------------------------------------
// The jvp corpus.

std::filesystem::path corpus_path() {
  return kiln::testing::source_path("tests/parity/jvp_parity.jsonl");
}

std::vector<json> corpus() {
  std::vector<json> cases;
  std::ifstream in(corpus_path());
  std::string line;
  while (std::getline(in, line))
    if (line.find_first_not_of(" \t\r\n") != std::string::npos) cases.push_back(json::parse(quote_nonfinite_tokens(line)));
  return cases;
}

// The tensor of each positional input slot's tangent (undefined where the case has none).
V tangents_of(const json& j) {
  V t;
  for (const auto& e : j.at("tangents")) t.push_back(e.is_null() ? Tensor() : make_tensor(e));
  return t;
}

// Every op of the graph behind `t` (before it is computed): the ops whose jvp rules ran.
void collect_ops(const kiln::NodePtr& n, std::set<kiln::OpKind>& ops, std::set<const kiln::Node*>& seen) {
  if (!n || !seen.insert(n.get()).second) return;
  ops.insert(n->op);
  for (const auto& i : n->inputs) collect_ops(i, ops, seen);
}

std::set<kiln::OpKind>& covered() {
  static std::set<kiln::OpKind> ops;
  return ops;
}

// Outputs and their tangents of a case's op run on duals of its inputs with `tans`.
struct DualRun {
  V out, tan;
};
DualRun run_dual(Ctx c, const V& tans) {
  fwad::DualLevel level;
  for (size_t i = 0; i < tans.size(); ++i)
    if (tans[i].defined()) c.pos.at(i).t = fwad::make_dual(c.pos[i].t, tans[i]);
  V outs = run_op(c);
  DualRun r;
  std::set<const kiln::Node*> seen;
  for (const Tensor& o : outs) {
    auto [p, t] = fwad::unpack_dual(o);
    if (t.defined()) collect_ops(o.node(), covered(), seen);
    r.out.push_back(p);
    r.tan.push_back(t.defined() ? t : kiln::zeros_like(p));
  }
  kiln::eval(r.tan);
  return r;
}

// The case's inputs moved by h·tangent.
Ctx shifted(const Ctx& c, const V& tans, double h) {
  Ctx s = c;
  for (size_t i = 0; i < tans.size(); ++i)
    if (tans[i].defined()) s.pos[i].t = kiln::add(c.pos[i].t, kiln::mul(tans[i], h));
  return s;
}

// The jvp of one case against central differences: "" or what differs. Elements where the
// one-sided differences disagree (a kink or jump within h: abs at 0, round at .5) are skipped.
std::string check_fd(const json& j) {
  Ctx c = make_ctx(j);
  V tans = tangents_of(j);
  DualRun d = run_dual(c, tans);
  bool all_f64 = true;
  for (const Tensor& o : d.out) all_f64 = all_f64 && o.dtype() == kiln::kFloat64;
  const double h = all_f64 ? 1e-6 : 1e-3;  // (float32 outputs: a step well above their eps)
  V plus = run_op(shifted(c, tans, h)), minus = run_op(shifted(c, tans, -h)), mid = run_op(c);
  std::string r;
  for (size_t k = 0; k < d.tan.size(); ++k) {
    const bool f64 = d.out[k].dtype() == kiln::kFloat64;
    const double atol = f64 ? 1e-6 : 1e-3, rtol = f64 ? 1e-5 : 1e-3;
    auto p = plus[k].to(kiln::kFloat64).to_vector<double>(), m = minus[k].to(kiln::kFloat64).to_vector<double>();
    auto z = mid[k].to(kiln::kFloat64).to_vector<double>(), t = d.tan[k].to(kiln::kFloat64).to_vector<double>();
    for (size_t e = 0; e < t.size(); ++e) {
      const double fd = (p[e] - m[e]) / (2 * h), right = (p[e] - z[e]) / h, left = (z[e] - m[e]) / h;
      if (std::abs(right - left) > (f64 ? 1e-3 : 1e-1) * (1 + std::abs(fd))) continue;
      if (!(std::abs(t[e] - fd) <= atol + rtol * std::abs(fd)))
        return cat("out[", k, "] element ", e, ": jvp ", fmt(t[e]), ", central difference ", fmt(fd));
    }
  }
  return r;
}

// The jvp of one case against PyTorch's (float64: rtol 1e-9, atol 1e-10).
std::string check_torch_jvp(const json& j) {
  DualRun d = run_dual(make_ctx(j), tangents_of(j));
  const json& exp = j.at("jvp");
  std::vector<const json*> e;
  if (exp.is_array())
    for (const auto& x : exp) e.push_back(&x);
  else
    e.push_back(&exp);
  if (e.size() != d.tan.size()) return cat("expected ", e.size(), " tangents, got ", d.tan.size());
  std::string r;
  for (size_t k = 0; k < e.size(); ++k) {
    const bool f64 = (*e[k]).at("dtype").get<std::string>() == "float64";
    std::string diff = compare(d.tan[k], *e[k], true, f64 ? Tol{1e-9, 1e-10} : Tol{1e-5, 1e-6});
    if (!diff.empty()) r += cat(r.empty() ? "" : "; ", "tangent[", k, "] ", diff);
  }
  return r;
}

// kiln::hvp of sum(op(x) * w) against PyTorch's forward-over-reverse (float64: rtol 1e-8).
std::string check_torch_hvp(const json& j, bool compiled) {
  Ctx c = make_ctx(j);
  V tans = tangents_of(j);
  Tensor w = make_tensor(j.at("w"));
  std::vector<size_t> slots;
  V primals, tangents;
  for (size_t i = 0; i < tans.size(); ++i)
    if (tans[i].defined()) {
      slots.push_back(i);
      primals.push_back(c.pos[i].t);
      tangents.push_back(tans[i]);
    }
  auto loss = [c, slots, w](const V& xs) {
    Ctx k = c;
    for (size_t i = 0; i < slots.size(); ++i) k.pos[slots[i]].t = xs[i];
    return V{kiln::sum(kiln::mul(run_op(k)[0], w))};
  };
  V got;
  if (compiled) {
    const size_t n = primals.size();
    auto f = kiln::compile([loss, n](const V& a) {
      V p(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(n)), t(a.begin() + static_cast<std::ptrdiff_t>(n), a.end());
      return kiln::hvp(loss, p, t).hvp;
    });
    V args = primals;
    args.insert(args.end(), tangents.begin(), tangents.end());
    kiln::eval(f(args));
    got = f(args);
    if (f.stats().hits < 1) return "the compiled hvp did not replay";
  } else {
    got = kiln::hvp(loss, primals, tangents).hvp;
  }
  std::string r;
  for (size_t i = 0; i < slots.size(); ++i) {
    std::string diff = compare(got[i], j.at("hvp")[slots[i]], true, Tol{1e-8, 1e-9});
    if (!diff.empty()) r += cat(r.empty() ? "" : "; ", "hvp[", slots[i], "] ", diff);
  }
  return r;
}

// Runs `check` on every case (those `want` selects), listing failures.
void over_corpus(const std::function<bool(const json&)>& want, const std::function<std::string(const json&)>& check,
                 const char* what) {
  auto cases = corpus();
  ASSERT_GT(cases.size(), 100u) << "missing or short project corpus " << corpus_path();
  int n = 0, passed = 0;
  std::vector<std::string> failures;
  for (const auto& j : cases) {
    if (!want(j)) continue;
    ++n;
    std::string err;
    try {
      err = check(j);
    } catch (const std::exception& e) {
      err = cat("exception: ", e.what());
    }
    if (err.empty())
      ++passed;
    else
      failures.push_back(j.at("id").get<std::string>() + ": " + err);
  }
  std::cout << what << ": " << passed << "/" << n << " cases\n";
  for (const auto& f : failures) ADD_FAILURE() << f;
}

bool any(const json&) { return true; }
bool has_hvp(const json& j) { return j.contains("hvp"); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Every jvp rule.

TEST(JvpRules, FiniteDifferences) {
  KILN_NEED_DEVICE();
  over_corpus(any, check_fd, "jvp vs central differences (float64)");
}

TEST(JvpRules, AgainstPyTorch) {
  KILN_NEED_DEVICE();
  over_corpus(any, check_torch_jvp, "jvp vs torch.func.jvp");
}

TEST(JvpRules, HessianVectorProductsAgainstPyTorch) {
  KILN_NEED_DEVICE();
  over_corpus(has_hvp, [](const json& j) { return check_torch_hvp(j, false); }, "hvp vs torch.func (forward-over-reverse)");
}

TEST(JvpRules, HessianVectorProductsCompiled) {
  KILN_NEED_DEVICE();
  over_corpus(has_hvp, [](const json& j) { return check_torch_hvp(j, true); }, "compiled hvp vs torch.func");
}

// Ops the corpus cannot reach through PyTorch names, run on duals here so that their rules run
// (and are checked against central differences like the corpus).
namespace {
struct ExtraCase {
  const char* name;
  std::function<Tensor(const Tensor&)> f;
};
std::vector<ExtraCase> extra_cases() {
  std::vector<ExtraCase> cases = {
      {"in-place slice write (ViewScatter)",
       [](const Tensor& a) {
         Tensor b = kiln::zeros({3, 4}, kiln::kFloat64, a.device());
         b.slice(1, 1, 3).copy_(a.slice(1, 0, 2).sin());
         return b;
       }},
      {"cumsum", [](const Tensor& a) { return kiln::cumsum(a, 1); }},
      {"conv2d", [](const Tensor& a) { return kiln::conv2d(a.reshape({1, 1, 3, 4}), rnd({2, 1, 2, 2}, 3)); }},
      {"conv2d's input gradient (Col2Im)", [](const Tensor& a) {
         Tensor w = rnd({2, 1, 2, 2}, 3);
         auto conv = [&](const V& b) { return V{kiln::conv2d(b[0].reshape({1, 1, 3, 4}), w)}; };
         auto r = kiln::vjp(conv, {a});
         return r.vjp_fn({r.outputs[0]})[0];  // (the gradient of |conv(a)|²/2: the tangent crosses col2im)
       }}};
  // (small scores on a GPU run materialized by default: the fused node, asked for, on every device)
  cases.push_back({"fused attention", [](const Tensor& a) {
                     kiln::sdpa_kernel fused(kiln::SdpaBackend::Fused);
                     Tensor q = a.reshape({1, 3, 4});
                     return kiln::scaled_dot_product_attention(q, rnd({1, 5, 4}, 4), q.sin().sum(1, true).expand({1, 5, 4}),
                                                               std::nullopt, false);
                   }});
  if (dev().type != kiln::DeviceType::CPU)
    cases.push_back({"to(cpu)", [](const Tensor& a) { return a.to(kiln::cpu()).exp(); }});
  return cases;
}

// The tangent of c.f at a 3x4 input against central differences ("" or what differs).
std::string check_extra(const ExtraCase& c) {
  Tensor x = rnd({3, 4}, 1), t = rnd({3, 4}, 7);
  Tensor tan;
  {
    fwad::DualLevel level;
    Tensor y = c.f(fwad::make_dual(x, t));
    std::set<const kiln::Node*> seen;
    collect_ops(y.node(), covered(), seen);
    tan = fwad::unpack_dual(y).tangent;
    if (!tan.defined()) return "no tangent";
    tan.eval();
  }
  const double h = 1e-6;
  Tensor fd = kiln::div(kiln::sub(c.f(kiln::add(x, kiln::mul(t, h))), c.f(kiln::sub(x, kiln::mul(t, h)))), 2 * h);
  const double e = excess(tan, fd, 1e-6, 1e-5);
  return e <= 0 ? "" : cat("tangent off central differences by ", fmt(e), " beyond tolerance");
}
}  // namespace

TEST(JvpRules, OpsOutsideTheCorpus) {
  KILN_NEED_DEVICE();
  for (const auto& c : extra_cases()) {
    std::string err = check_extra(c);
    EXPECT_TRUE(err.empty()) << c.name << ": " << err;
  }
}

// At the points where an op is not differentiable, forward mode takes the value PyTorch's
// gradient takes there (kiln's backward does too), so uᵀ(J v) = (Jᵀ u)ᵀ v holds at them: norm
// (p = 2, 3, 0.5) of an all-zero tensor, std and var over identical values, amax/max/maximum/
// minimum over ties, clamp at its bounds, abs and pow at 0. Each case of
// tests/parity/fwad_conventions.json (PyTorch 2.11: torch.func.jvp and the gradient along v, made
// by make_fwad_conventions.py) is checked twice: kiln's tangent against PyTorch's jvp, kiln's
// gradient · v against PyTorch's.
TEST(JvpRules, NonDifferentiablePointsFollowTheGradientConvention) {
  KILN_NEED_DEVICE();
  using F = std::function<Tensor(const Tensor&)>;
  const Tensor other = kiln::tensor({2.0, 1.0, -1.0, 5.0}, kiln::kFloat64, dev());
  const std::map<std::string, F> fns = {
      {"norm(p=2) at 0", [](const Tensor& a) { return kiln::norm(a, 2); }},
      {"norm(p=3) at 0", [](const Tensor& a) { return kiln::norm(a, 3); }},
      {"norm(p=0.5) at 0", [](const Tensor& a) { return kiln::norm(a, 0.5); }},
      {"std(correction=0) of equal values", [](const Tensor& a) { return kiln::std(a, {0}, 0.0); }},
      {"std(correction=1) of equal values", [](const Tensor& a) { return kiln::std(a, {0}, 1.0); }},
      {"var(correction=0) of equal values", [](const Tensor& a) { return kiln::var(a, {0}, 0.0); }},
      {"amax over ties", [](const Tensor& a) { return kiln::amax(a); }},
      {"max(dim) over ties", [](const Tensor& a) { return kiln::max(a, 0).first; }},
      {"clamp at its bounds", [](const Tensor& a) { return kiln::sum(kiln::clamp(a, -1.0, 1.0)); }},
      {"abs at 0", [](const Tensor& a) { return kiln::sum(kiln::abs(a)); }},
      {"maximum over ties", [&](const Tensor& a) { return kiln::sum(kiln::maximum(a, other)); }},
      {"minimum over ties", [&](const Tensor& a) { return kiln::sum(kiln::minimum(a, other)); }},
      {"pow(x, 2) at 0", [](const Tensor& a) { return kiln::sum(kiln::pow(a, 2.0)); }},
  };
  std::ifstream in(kiln::testing::source_path("tests/parity/fwad_conventions.json"));
  ASSERT_TRUE(in) << "tests/parity/fwad_conventions.json is missing";
  const nlohmann::json cases = nlohmann::json::parse(in)["cases"];
  ASSERT_EQ(cases.size(), fns.size());
  for (const auto& [name, c] : cases.items()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(fns.count(name)) << "no kiln function for this case";
    const F& f = fns.at(name);
    const Tensor x = kiln::from_vector(c["x"].get<std::vector<double>>()).to(dev());
    const Tensor v = kiln::from_vector(c["v"].get<std::vector<double>>()).to(dev());
    auto j = kiln::jvp([&](const V& a) { return V{f(a[0])}; }, {x}, {v});
    const double tangent = j.tangents[0].cpu().item<double>();
    Tensor xg = x.clone();
    xg.requires_grad_(true);
    f(xg).backward();
    const double grad_v = kiln::sum(kiln::mul(xg.grad(), v)).cpu().item<double>();
    EXPECT_NEAR(tangent, c["jvp"].get<double>(), 1e-12) << "kiln's tangent differs from PyTorch's jvp";
    EXPECT_NEAR(grad_v, c["grad_v"].get<double>(), 1e-12) << "kiln's gradient differs from PyTorch's";
  }
}

// The torch-programs corpus' gradient programs (../shared/torch-programs; float64 DAGs of 4-20
// ops, in-place writes and views included): forward and reverse mode agree, uᵀ(J v) = (Jᵀ u)ᵀ v
// with random v over the floating inputs and u over the floating results (rtol 1e-9; 1e-4 where
// a program computes in float32). A sample of KILN_JVP_PROGRAMS (default 60; "all") programs.
// Left out, with PyTorch's reason, programs where PyTorch's own two modes disagree (kiln gives
// PyTorch's answer in each): clamp(x, min=m, max=m) with one tensor as both bounds (PyTorch 2.11:
// the jvp along m is 1 everywhere, the vjp gives m the gradient only where x < m), and results
// with NaN or inf (maximum(NaN, y): the jvp takes y's tangent, the vjp sends the gradient to
// both operands).
TEST(JvpRules, DirectionalDerivativesOnTorchPrograms) {
  KILN_NEED_DEVICE();
  std::string tried;
  auto path = torch_programs::find_corpus(tried);
  if (!path) {
    const char* req = std::getenv("KILN_REQUIRE_PARITY");
    if (req && std::string(req) == "1") FAIL() << "torch-programs corpus not found (looked at " << tried << ")";
    GTEST_SKIP() << "torch-programs corpus not found (looked at " << tried << ")";
  }
  std::vector<json> progs;
  for (const auto& line : torch_programs::read_corpus(*path)) {
    json j = json::parse(quote_nonfinite_tokens(line));
    if (j.value("grad", false)) progs.push_back(std::move(j));
  }
  ASSERT_GT(progs.size(), 100u);
  const char* want = std::getenv("KILN_JVP_PROGRAMS");
  size_t n = want && std::string(want) == "all" ? progs.size() : std::min<size_t>(progs.size(), want ? std::stoul(want) : 60);
  auto clamp_to_one_tensor = [](const json& j) {
    for (const auto& op : j.at("ops"))
      if (op.at("op") == "clamp" && op.at("args").size() == 3 && op["args"][1] == op["args"][2] &&
          op["args"][1][0] == "v")
        return true;
    return false;
  };
  int checked = 0, skipped = 0;
  std::vector<std::string> failures;
  for (size_t k = 0; k < n; ++k) {
    const json& j = progs[k * progs.size() / n];
    const std::string id = j.at("id").get<std::string>();
    if (clamp_to_one_tensor(j)) {
      ++skipped;
      continue;
    }
    try {
      torch_programs::Program p = torch_programs::parse_program(j);
      V all;
      for (const auto& t : p.sets.at(0).at("inputs")) all.push_back(make_tensor(t));
      std::vector<size_t> fl;
      V primals, tangents;
      kiln::manual_seed(1000 + k);
      for (size_t i = 0; i < all.size(); ++i)
        if (kiln::is_floating(all[i].dtype())) {
          fl.push_back(i);
          primals.push_back(all[i]);
          tangents.push_back(kiln::sub(kiln::mul(kiln::rand(all[i].sizes(), all[i].dtype(), all[i].device()), 2.0), 1.0));
        }
      if (primals.empty()) continue;
      auto f = [&p, all, fl](const V& xs) {
        V in = all;
        for (size_t i = 0; i < fl.size(); ++i) in[fl[i]] = xs[i];
        return torch_programs::run_program(p, in);
      };
      auto jr = kiln::jvp(f, primals, tangents);
      bool finite = true;
      for (const Tensor& o : jr.outputs)
        if (kiln::is_floating(o.dtype()) && o.numel() > 0)
          finite = finite && kiln::all(kiln::isfinite(o)).item<bool>();
      if (!finite) {
        ++skipped;
        continue;
      }
      auto vr = kiln::vjp(f, primals);
      V us;
      for (const Tensor& o : vr.outputs)
        us.push_back(kiln::is_floating(o.dtype())
                         ? kiln::sub(kiln::mul(kiln::rand(o.sizes(), o.dtype(), o.device()), 2.0), 1.0)
                         : kiln::zeros_like(o));
      V gs = vr.vjp_fn(us);
      double lhs = 0, rhs = 0, mag = 0;
      for (size_t o = 0; o < us.size(); ++o) {
        if (!kiln::is_floating(us[o].dtype())) continue;
        Tensor term = kiln::mul(us[o].to(kiln::kFloat64), jr.tangents[o].to(kiln::kFloat64));
        lhs += kiln::sum(term).item<double>();
        mag += kiln::sum(kiln::abs(term)).item<double>();
      }
      for (size_t i = 0; i < gs.size(); ++i) {
        Tensor term = kiln::mul(gs[i].to(kiln::kFloat64), tangents[i].to(kiln::kFloat64));
        rhs += kiln::sum(term).item<double>();
        mag += kiln::sum(kiln::abs(term)).item<double>();
      }
      if (!std::isfinite(lhs) || !std::isfinite(rhs) || !std::isfinite(mag)) {
        ++skipped;  // non-finite derivatives (a pole hit): no identity to check
        continue;
      }
      const bool f32 = std::count(p.tol.begin(), p.tol.end(), "f32") > 0;
      ++checked;
      if (!(std::abs(lhs - rhs) <= (f32 ? 1e-4 : 1e-9) * mag + 1e-12))
        failures.push_back(cat(id, ": u.(J v) = ", fmt(lhs), ", (J^T u).v = ", fmt(rhs)));
    } catch (const std::exception& e) {
      failures.push_back(cat(id, ": exception: ", e.what()));
    }
  }
  std::cout << "jvp vs vjp on torch-programs: " << checked - static_cast<int>(failures.size()) << "/" << checked
            << " programs agree (" << skipped << " left out: non-finite values or clamp to one tensor)\n";
  for (const auto& f : failures) ADD_FAILURE() << f;
}

// Every primitive with a vjp rule has a jvp rule, run here on the corpus and the extra cases: a
// new op without one fails here until it gets one (or joins the list of ops without derivatives,
// with its reason).
TEST(JvpRules, EveryDifferentiableOpIsCovered) {
  KILN_NEED_DEVICE();
  for (const auto& j : corpus()) run_dual(make_ctx(j), tangents_of(j));
  for (const auto& c : extra_cases()) check_extra(c);
  using kiln::OpKind;
  const std::set<OpKind> no_derivative = {
      // sources and ops with integer or boolean results
      OpKind::Leaf, OpKind::Full, OpKind::Arange, OpKind::RandUniform, OpKind::RandNormal, OpKind::RandInt,
      OpKind::IsNan, OpKind::IsFinite, OpKind::LogicalNot, OpKind::BitwiseNot, OpKind::Eq, OpKind::Ne, OpKind::Lt,
      OpKind::Le, OpKind::Gt, OpKind::Ge, OpKind::LogicalAnd, OpKind::LogicalOr, OpKind::LogicalXor,
      OpKind::BitwiseAnd, OpKind::BitwiseOr, OpKind::BitwiseXor, OpKind::ArgMax, OpKind::ArgMin,
      // no vjp rule either: the fused attention's backward (sdpa's double backward runs unfused)
      // and collectives (each functional collective has its own gradient, runtime/dist)
      OpKind::AttentionBackward, OpKind::Collective};
  std::vector<std::string> missing;
  for (int k = 0; k < static_cast<int>(OpKind::NumOps); ++k) {
    auto op = static_cast<OpKind>(k);
    if (no_derivative.count(op) || covered().count(op)) continue;
    if (op == OpKind::ToDevice && dev().type == kiln::DeviceType::CPU) continue;  // needs a second device
    missing.push_back(kiln::op_name(op));
  }
  EXPECT_TRUE(missing.empty()) << "ops whose jvp rule no test ran: " << ::testing::PrintToString(missing);
}

// ---------------------------------------------------------------------------------------------
// Dual tensors.

TEST(DualTensors, MakeAndUnpack) {
  KILN_NEED_DEVICE();
  Tensor x = rnd({2, 3}, 1), t = rnd({2, 3}, 2);
  EXPECT_EQ(fwad::current_level(), -1);
  {
    fwad::DualLevel level;
    EXPECT_EQ(fwad::current_level(), static_cast<int64_t>(level.level()));
    Tensor d = fwad::make_dual(x, t);
    auto u = fwad::unpack_dual(d);
    EXPECT_CLOSE(u.primal, x, 0, 0);
    EXPECT_CLOSE(u.tangent, t, 0, 0);
    EXPECT_FALSE(fwad::unpack_dual(u.primal).tangent.defined());
    EXPECT_FALSE(fwad::unpack_dual(x).tangent.defined());  // the primal itself is untouched
    Tensor y = kiln::mul(d, d);
    EXPECT_CLOSE(fwad::unpack_dual(y).tangent, kiln::mul(kiln::mul(x, t), 2.0), 1e-15, 1e-15);
    Tensor c = kiln::sum(kiln::gt(d, 0));  // integer results carry no tangent
    EXPECT_FALSE(fwad::unpack_dual(c).tangent.defined());
    Tensor det = d.detach();
    EXPECT_FALSE(fwad::unpack_dual(det).tangent.defined());
    // the level exits with this scope: y keeps its value, loses its tangent
    x = y;
  }
  EXPECT_EQ(fwad::current_level(), -1);
  fwad::DualLevel again;
  EXPECT_FALSE(fwad::unpack_dual(x).tangent.defined());
}

TEST(DualTensors, ClearErrors) {
  KILN_NEED_DEVICE();
  Tensor x = rnd({2, 3}, 1);
  EXPECT_THROW(fwad::make_dual(x, x), kiln::Error);  // no level
  fwad::DualLevel level;
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const kiln::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { fwad::make_dual(x, rnd({3, 2}, 2)); }).find("shape [2, 3], got [3, 2]"), std::string::npos);
  EXPECT_NE(message([&] { fwad::make_dual(x, x.to(kiln::kFloat32)); }).find("dtype float64, got float32"),
            std::string::npos);
  EXPECT_NE(message([&] { fwad::make_dual(x.to(kiln::kInt64), x.to(kiln::kInt64)); }).find("floating point"),
            std::string::npos);
  EXPECT_NE(message([&] { fwad::make_dual(x, x, 999999); }).find("not live"), std::string::npos);
  auto f = [](const V& a) { return V{kiln::sum(kiln::mul(a[0], a[0]))}; };
  EXPECT_NE(message([&] { kiln::jvp(f, {x}, {}); }).find("one tangent per primal"), std::string::npos);
  EXPECT_NE(message([&] { kiln::hvp([](const V& a) { return V{a[0]}; }, {x}, {x}); }).find("one element"),
            std::string::npos);
  auto r = kiln::vjp(f, {x});
  EXPECT_NE(message([&] { r.vjp_fn({x}); }).find("expected its output's shape"), std::string::npos);
  // nothing changed: x has no tangent and the level still works
  EXPECT_FALSE(fwad::unpack_dual(x).tangent.defined());
  EXPECT_TRUE(fwad::unpack_dual(fwad::make_dual(x, x)).tangent.defined());
}

TEST(DualTensors, ViewsAndInPlaceKeepTangentsConsistent) {
  KILN_NEED_DEVICE();
  Tensor x = rnd({4, 5}, 1), t = rnd({4, 5}, 2);
  fwad::DualLevel level;
  Tensor d = fwad::make_dual(x, t);
  // a view's tangent is the same view of the tangent
  EXPECT_CLOSE(fwad::unpack_dual(d.slice(1, 1, 4).transpose(0, 1)).tangent, t.slice(1, 1, 4).transpose(0, 1), 0, 0);
  // writing a dual into a window of a plain tensor gives the tensor a tangent there, zeros elsewhere
  Tensor base = kiln::zeros({4, 5}, kiln::kFloat64, dev());
  Tensor win = base.slice(0, 1, 3);
  win.copy_(d.slice(0, 0, 2));
  Tensor want = kiln::zeros({4, 5}, kiln::kFloat64, dev());
  want.slice(0, 1, 3).copy_(t.slice(0, 0, 2));
  EXPECT_CLOSE(fwad::unpack_dual(base).tangent, want, 0, 0);
  EXPECT_CLOSE(fwad::unpack_dual(win).tangent, t.slice(0, 0, 2), 0, 0);  // the view follows its base
  // in-place ops on a dual update its tangent; an overwrite with a constant drops it
  Tensor y = d.clone();
  y.mul_(3.0);
  y.add_(d);
  EXPECT_CLOSE(fwad::unpack_dual(y).tangent, kiln::mul(t, 4.0), 1e-15, 1e-15);
  y.fill_(1.0);
  EXPECT_FALSE(fwad::unpack_dual(y).tangent.defined());
  // an in-place write through a view of a dual updates the base's tangent in that window
  Tensor z = d.clone();
  z.slice(1, 0, 2).mul_(2.0);
  Tensor tz = t.clone();
  tz.slice(1, 0, 2).mul_(2.0);
  EXPECT_CLOSE(fwad::unpack_dual(z).tangent, tz, 0, 0);
}

TEST(DualTensors, NestedLevelsGiveSecondDerivatives) {
  KILN_NEED_DEVICE();
  Tensor x = rnd({6}, 3);
  Tensor one = kiln::ones_like(x);
  // d²/dx² sin(x) by jvp of jvp: -sin(x)
  auto dsin = [&](const V& a) { return V{kiln::jvp([](const V& b) { return V{kiln::sin(b[0])}; }, a, {one}).tangents[0]}; };
  auto r = kiln::jvp(dsin, {x}, {one});
  EXPECT_CLOSE(r.outputs[0], kiln::cos(x), 1e-15, 1e-14);
  EXPECT_CLOSE(r.tangents[0], kiln::neg(kiln::sin(x)), 1e-15, 1e-14);
  // and through an op whose rule reads its output (exp): d²/dx² exp = exp
  auto dexp = [&](const V& a) { return V{kiln::jvp([](const V& b) { return V{kiln::exp(b[0])}; }, a, {one}).tangents[0]}; };
  EXPECT_CLOSE(kiln::jvp(dexp, {x}, {one}).tangents[0], kiln::exp(x), 1e-15, 1e-14);
}

// Second derivatives at a composite's seam: softplus at 0 is sigmoid'(0) = 1/4 (a max/abs
// decomposition would give 0 there: Newton's first step from w = 0 was wrong).
TEST(DualTensors, SecondDerivativeOfSoftplusAtZero) {
  KILN_NEED_DEVICE();
  Tensor x = vec({0.0, 0.0, 1.0, -2.0}, {4}), v = kiln::ones_like(x);
  auto f = [](const V& a) { return V{kiln::sum(kiln::softplus(a[0]))}; };
  auto h = kiln::hvp(f, {x}, {v}).hvp[0].to_vector<double>();
  auto s = [](double z) { return 1 / (1 + std::exp(-z)); };
  for (int i = 0; i < 4; ++i) {
    const double z = i < 2 ? 0.0 : (i == 2 ? 1.0 : -2.0);
    EXPECT_NEAR(h[static_cast<size_t>(i)], s(z) * (1 - s(z)), 1e-15) << z;
  }
}

TEST(DualTensors, ReverseOverForward) {
  KILN_NEED_DEVICE();
  // d/dx of the tangent cos(x)·t is -sin(x)·t
  Tensor x = rnd({5}, 1).requires_grad_(), t = rnd({5}, 2);
  Tensor tan;
  {
    fwad::DualLevel level;
    tan = fwad::unpack_dual(kiln::sin(fwad::make_dual(x, t))).tangent;
  }
  Tensor g = kiln::grad({kiln::sum(tan)}, {x})[0];
  EXPECT_CLOSE(g, kiln::mul(kiln::neg(kiln::sin(x.detach())), t), 1e-15, 1e-14);
}

// ---------------------------------------------------------------------------------------------
// Transforms.

namespace {
// f(x, y) = {sin(x)·sum(y²), x @ y}: two outputs, two inputs.
V two_by_two(const V& a) {
  return {kiln::mul(kiln::sin(a[0]), kiln::sum(kiln::mul(a[1], a[1]))), kiln::matmul(a[0], a[1])};
}
// Logistic regression loss with an L2 term: mean(softplus(-y·(X w))) + λ/2 |w|².
V logistic_loss(const Tensor& X, const Tensor& y, double lambda, const V& w) {
  Tensor margin = kiln::mul(kiln::neg(y), kiln::matmul(X, w[0]));
  Tensor l = kiln::add(kiln::mean(kiln::softplus(margin)), kiln::mul(kiln::sum(kiln::mul(w[0], w[0])), lambda / 2));
  return {l};
}
}  // namespace

TEST(Transforms, JacfwdEqualsJacrev) {
  KILN_NEED_DEVICE();
  V xs = {rnd({2, 3}, 1), rnd({3, 2}, 2)};
  V f = kiln::jacfwd(two_by_two)(xs), r = kiln::jacrev(two_by_two)(xs);
  ASSERT_EQ(f.size(), 4u);
  ASSERT_EQ(r.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(f[i].sizes(), r[i].sizes()) << i;
    EXPECT_CLOSE(f[i], r[i], 1e-13, 1e-12);
  }
  // d(x @ y)/dy[k, l] at [i, j] is x[i, k] δ(j, l)
  auto x = xs[0].to_vector<double>();
  auto b = r[3].to_vector<double>();  // [2, 2, 3, 2]
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 3; ++k)
        for (int l = 0; l < 2; ++l) EXPECT_DOUBLE_EQ(b[((i * 2 + j) * 3 + k) * 2 + l], j == l ? x[i * 3 + k] : 0.0);
}

TEST(Transforms, VjpAndJvpAgree) {
  KILN_NEED_DEVICE();
  // uᵀ(J v) = (Jᵀ u)ᵀ v for every output/input pair
  V xs = {rnd({2, 3}, 1), rnd({3, 2}, 2)}, vs = {rnd({2, 3}, 3), rnd({3, 2}, 4)};
  auto j = kiln::jvp(two_by_two, xs, vs);
  auto r = kiln::vjp(two_by_two, xs);
  V us = {rnd({2, 3}, 5), rnd({2, 2}, 6)};
  V g = r.vjp_fn(us);
  V g2 = r.vjp_fn(us);  // callable again
  double lhs = 0, rhs = 0;
  for (size_t i = 0; i < 2; ++i) lhs += kiln::sum(kiln::mul(us[i], j.tangents[i])).item<double>();
  for (size_t i = 0; i < 2; ++i) rhs += kiln::sum(kiln::mul(g[i], vs[i])).item<double>();
  EXPECT_NEAR(lhs, rhs, 1e-12 * (1 + std::abs(lhs)));
  EXPECT_CLOSE(g2[0], g[0], 0, 0);
  // a function returning one tensor is a function returning a list of one
  auto one = kiln::jvp([](const V& a) { return kiln::sin(a[0]); }, {xs[0]}, {vs[0]});
  ASSERT_EQ(one.tangents.size(), 1u);
  EXPECT_CLOSE(one.tangents[0], kiln::mul(kiln::cos(xs[0]), vs[0]), 1e-15, 1e-14);
  EXPECT_EQ(kiln::hessian([](const V& a) { return kiln::sum(kiln::exp(a[0])); })({xs[0]})[0].sizes(),
            (std::vector<int64_t>{2, 3, 2, 3}));
  // an input the outputs ignore gets zeros
  auto u = kiln::vjp([](const V& a) { return V{kiln::exp(a[0])}; }, {xs[0], xs[1]});
  V gu = u.vjp_fn({kiln::ones_like(xs[0])});
  EXPECT_CLOSE(gu[1], kiln::zeros_like(xs[1]), 0, 0);
}

TEST(Transforms, HessianAndHvp) {
  KILN_NEED_DEVICE();
  Tensor x = rnd({4}, 1);
  // sum(x³): H = diag(6x)
  auto cube = [](const V& a) { return V{kiln::sum(kiln::mul(kiln::mul(a[0], a[0]), a[0]))}; };
  V h = kiln::hessian(cube)({x});
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].sizes(), (std::vector<int64_t>{4, 4}));
  EXPECT_CLOSE(h[0], kiln::mul(kiln::eye(4, std::nullopt, kiln::kFloat64, dev()), kiln::mul(x, 6.0)), 1e-13, 1e-13);
  // logistic loss: H symmetric, H·v = hvp, and both against a difference of gradients
  Tensor X = rnd({20, 4}, 2), y = kiln::sign(rnd({20}, 3)), v = rnd({4}, 4);
  auto loss = [&](const V& w) { return logistic_loss(X, y, 0.1, w); };
  Tensor H = kiln::hessian(loss)({x})[0];
  EXPECT_CLOSE(H, H.transpose(0, 1), 1e-14, 1e-12);
  auto hv = kiln::hvp(loss, {x}, {v});
  // hvp's primal output comes from a program fused with the derivatives, loss(x) from one of its
  // own: the mean's reduction may be vectorized differently in each (AVX-512 hosts split it into
  // other lanes than AVX2 ones), so the two agree to rounding, not bit for bit (1.1e-16 seen).
  EXPECT_CLOSE(hv.outputs[0], loss({x})[0], 0, 8 * std::numeric_limits<double>::epsilon());
  EXPECT_CLOSE(hv.hvp[0], kiln::matmul(H, v), 1e-13, 1e-11);
  auto gradient = [&](const Tensor& w) { return kiln::vjp(loss, {w}).vjp_fn({kiln::ones({}, kiln::kFloat64, dev())})[0]; };
  const double e = 1e-6;
  Tensor fd = kiln::div(kiln::sub(gradient(kiln::add(x, kiln::mul(v, e))), gradient(kiln::sub(x, kiln::mul(v, e)))), 2 * e);
  EXPECT_CLOSE(hv.hvp[0], fd, 1e-7, 1e-6);
}

TEST(Transforms, CompiledEqualsEagerWhileTheBatchChanges) {
  KILN_NEED_DEVICE();
  kiln::nn::Linear lin(4, 3, true, kiln::kFloat64);
  lin.to(dev());
  auto model = [&](const V& a) { return V{kiln::tanh(lin.forward(a[0]))}; };
  auto step = [&](const V& a) {
    auto j = kiln::jvp(model, {a[0]}, {a[1]});
    auto h = kiln::hvp([&](const V& b) { return V{kiln::sum(kiln::mul(model(b)[0], model(b)[0]))}; }, {a[0]}, {a[1]});
    return V{j.outputs[0], j.tangents[0], h.hvp[0]};
  };
  auto compiled = kiln::compile(step);
  for (int64_t batch : {5, 8, 5, 13, 8}) {
    Tensor x = rnd({batch, 4}, static_cast<uint64_t>(batch)), t = rnd({batch, 4}, 100 + static_cast<uint64_t>(batch));
    V e = step({x, t}), c = compiled(V{x, t});
    for (size_t i = 0; i < e.size(); ++i) EXPECT_CLOSE(c[i], e[i], 1e-14, 1e-13) << "batch " << batch << " out " << i;
  }
  EXPECT_GE(compiled.stats().hits, 2);
  EXPECT_LE(compiled.stats().entries, 3);
  EXPECT_EQ(compiled.stats().eager_calls, 0);
}

// jacfwd, jacrev and hessian traced into one compiled graph: equal to eager, replayed.
TEST(Transforms, JacobiansAndHessianCompiled) {
  KILN_NEED_DEVICE();
  auto f = [](const V& a) { return V{kiln::mul(kiln::tanh(a[0]), kiln::sum(kiln::exp(a[1])))}; };
  auto scalar = [](const V& a) { return V{kiln::sum(kiln::mul(kiln::softplus(a[0]), kiln::sin(a[0])))}; };
  auto cf = kiln::compile([&](const V& a) { return kiln::jacfwd(f)(a); });
  auto cr = kiln::compile([&](const V& a) { return kiln::jacrev(f)(a); });
  auto ch = kiln::compile([&](const V& a) { return kiln::hessian(scalar)(a); });
  for (int call = 0; call < 2; ++call) {
    V xs = {rnd({3}, 1 + static_cast<uint64_t>(call)), rnd({2}, 5)};
    V ef = kiln::jacfwd(f)(xs), er = kiln::jacrev(f)(xs), gf = cf(xs), gr = cr(xs);
    ASSERT_EQ(gf.size(), ef.size());
    for (size_t i = 0; i < ef.size(); ++i) {
      EXPECT_CLOSE(gf[i], ef[i], 1e-14, 1e-13);
      EXPECT_CLOSE(gr[i], er[i], 1e-14, 1e-13);
      EXPECT_CLOSE(ef[i], er[i], 1e-14, 1e-13);
    }
    EXPECT_CLOSE(ch(V{xs[0]})[0], kiln::hessian(scalar)({xs[0]})[0], 1e-14, 1e-13);
  }
  EXPECT_EQ(cf.stats().hits, 1);
  EXPECT_EQ(cr.stats().hits, 1);
  EXPECT_EQ(ch.stats().hits, 1);
}

TEST(Transforms, DualArgumentsToACompiledFunctionRunEagerly) {
  KILN_NEED_DEVICE();
  auto f = kiln::compile([](const V& a) { return V{kiln::exp(a[0])}; });
  Tensor x = rnd({3}, 1), t = rnd({3}, 2);
  fwad::DualLevel level;
  Tensor y = f(V{fwad::make_dual(x, t)})[0];
  EXPECT_CLOSE(fwad::unpack_dual(y).tangent, kiln::mul(kiln::exp(x), t), 1e-15, 1e-14);
  EXPECT_EQ(f.stats().eager_calls, 1);
}

TEST(Transforms, ThreadsSharingAModule) {
  KILN_NEED_DEVICE();
  kiln::nn::Sequential net;
  net.push_back(std::make_shared<kiln::nn::Linear>(6, 8, true, kiln::kFloat64));
  net.push_back(std::make_shared<kiln::nn::Tanh>());
  net.push_back(std::make_shared<kiln::nn::Linear>(8, 2, true, kiln::kFloat64));
  net.to(dev());
  auto f = [&](const V& a) { return V{net.forward(a[0])}; };
  const int threads = 6, iters = 20;
  std::vector<Tensor> xs, ts, want;
  for (int i = 0; i < threads; ++i) {
    xs.push_back(rnd({3, 6}, 10 + static_cast<uint64_t>(i)));
    ts.push_back(rnd({3, 6}, 50 + static_cast<uint64_t>(i)));
    auto r = kiln::jvp(f, {xs[i]}, {ts[i]});
    want.push_back(r.tangents[0]);
    want.back().eval();
  }
  std::vector<int> wrong(threads, 0);
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i)
    pool.emplace_back([&, i] {
      for (int k = 0; k < iters; ++k) {
        auto r = kiln::jvp(f, {xs[i]}, {ts[i]});
        if (excess(r.tangents[0], want[i], 0, 0) > 0) wrong[i]++;
      }
    });
  for (auto& t : pool) t.join();
  for (int i = 0; i < threads; ++i) EXPECT_EQ(wrong[i], 0) << "thread " << i;
}

// Newton-CG on an L2-regularized logistic regression: conjugate gradients on H p = -g with
// Hessian-vector products only. It reaches the gradient tolerance in far fewer iterations than
// gradient descent, and the compiled solver takes exactly the eager one's iterates.
TEST(Transforms, NewtonCgBeatsGradientDescent) {
  KILN_NEED_DEVICE();
  Tensor X = rnd({200, 5}, 1);
  Tensor w_true = vec({1.5, -2.0, 0.5, 0.0, 1.0}, {5});
  Tensor y = kiln::sign(kiln::add(kiln::matmul(X, w_true), kiln::mul(rnd({200}, 2), 0.3)));
  auto loss = [&](const V& w) { return logistic_loss(X, y, 1e-2, w); };
  auto gradient = [&](const V& w) { return kiln::vjp(loss, w).vjp_fn({kiln::ones({}, kiln::kFloat64, dev())}); };
  // one Newton step: w - p with H p = g solved by CG from 0 (5 iterations: exact in 5 dims)
  auto newton = [&](const V& a) {
    Tensor w = a[0], g = gradient({w})[0];
    Tensor p = kiln::zeros_like(w), r = g, d = r;
    Tensor rr = kiln::sum(kiln::mul(r, r));
    for (int k = 0; k < 5; ++k) {
      Tensor hd = kiln::hvp(loss, {w}, {d}).hvp[0];
      Tensor alpha = kiln::div(rr, kiln::sum(kiln::mul(d, hd)));
      p = kiln::add(p, kiln::mul(alpha, d));
      r = kiln::sub(r, kiln::mul(alpha, hd));
      Tensor rr2 = kiln::sum(kiln::mul(r, r));
      d = kiln::add(r, kiln::mul(kiln::div(rr2, rr), d));
      rr = rr2;
    }
    return V{kiln::sub(w, p)};
  };
  auto compiled = kiln::compile(newton);
  auto gnorm = [&](const Tensor& w) { return kiln::norm(gradient({w})[0]).item<double>(); };
  const double tol = 1e-8;
  Tensor w = kiln::zeros({5}, kiln::kFloat64, dev()), wc = w;
  int newton_iters = 0;
  while (gnorm(w) > tol && newton_iters < 20) {
    w = newton({w})[0];
    wc = compiled(V{wc})[0];
    ++newton_iters;
    EXPECT_CLOSE(wc, w, 1e-13, 1e-12) << "iteration " << newton_iters;
  }
  EXPECT_LE(gnorm(w), tol);
  EXPECT_EQ(compiled.stats().eager_calls, 0);
  // gradient descent with the step 1/L (L bounds the Hessian: |X|²/(4n) + λ)
  const double L = kiln::sum(kiln::mul(X, X)).item<double>() / (4 * 200) + 1e-2;
  Tensor wg = kiln::zeros({5}, kiln::kFloat64, dev());
  int gd_iters = 0;
  while (gd_iters < 500) {
    Tensor g = gradient({wg})[0];
    if (kiln::norm(g).item<double>() <= tol) break;
    wg = kiln::sub(wg, kiln::mul(g, 1.0 / L));
    ++gd_iters;
  }
  std::cout << "Newton-CG: " << newton_iters << " iterations; gradient descent: " << gd_iters
            << (gd_iters == 500 ? "+ (not converged)" : "") << " iterations\n";
  EXPECT_LT(newton_iters * 5, gd_iters);
}
