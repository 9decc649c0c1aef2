// torch-parity: kiln's forward results against PyTorch's own outputs on fixed inputs.
//
// Reads the corpus described in shared/torch-parity/README.md (one JSON case a line: op name,
// input tensors, attrs in PyTorch's terms, expected output), runs each case through kiln's
// public API and compares dtype, shape and values (TorchParity.AllCases). TorchParity.Gradients
// runs every case that has `grads` again with its floating inputs as leaves that require grad,
// takes kiln::grad of sum(out * gout) and compares with PyTorch's gradients (float32: rtol 1e-4,
// atol 1e-5; float64: 1e-9).
//
// The file is found through $KILN_PARITY_FILE, else $KILN_SOURCE_DIR/../shared/torch-parity/,
// else ../shared/torch-parity/ relative to the working directory. A missing file skips the
// test, unless KILN_REQUIRE_PARITY=1, which makes it fail.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln.h"
#include "torch_ops.h"
#include "test_seed.h"
#include "source_dir.h"

namespace {

using namespace torch_ops;

// ---------------------------------------------------------------------------------------------
// Locating and reading the corpus.

// The corpus path, or nullopt; `tried` lists the places looked at.
std::optional<std::filesystem::path> find_parity_file(std::string& tried) {
  namespace fs = std::filesystem;
  const char* rel = "shared/torch-parity/torch_parity.jsonl";
  auto check = [&](const fs::path& p) {
    tried += (tried.empty() ? "" : ", ") + p.string();
    return fs::exists(p);
  };
  if (const char* e = std::getenv("KILN_PARITY_FILE"); e && *e) {
    if (check(e)) return fs::path(e);
    return std::nullopt;
  }
  if (const char* s = std::getenv("KILN_SOURCE_DIR"); s && *s) {
    fs::path p = fs::path(s) / ".." / rel;
    if (check(p)) return p;
  }
  for (const char* up : {"..", "../..", "../../.."}) {
    fs::path p = fs::path(up) / rel;
    if (check(p)) return p;
  }
  return std::nullopt;
}

// Whether cases run through kiln::compile (the *Compiled tests).
bool g_compiled = false;

// The op of a case, eagerly or through kiln::compile: the tensors become the compiled
// function's arguments (attrs and scalars are constants of the trace). The compiled function
// is called twice, so the checked results come from a replay, not from the trace.
std::vector<Tensor> run_op_mode(const Ctx& c) {
  if (!g_compiled) return run_op(c);
  Ctx base = c;
  std::vector<Tensor> ins;
  for (Tensor* t : tensor_slots(base)) ins.push_back(*t);
  auto f = kiln::compile([base](const std::vector<Tensor>& xs) {
    Ctx k = base;
    std::vector<Tensor*> slots = tensor_slots(k);
    for (size_t i = 0; i < slots.size(); ++i) *slots[i] = xs[i];
    return run_op(k);
  });
  kiln::eval(f(ins));
  std::vector<Tensor> outs = f(ins);
  if (f.stats().entries == 1 && f.stats().hits != 1) throw std::runtime_error("compiled function did not replay");
  return outs;
}

// Runs one case; returns "" on a pass, else what went wrong.
std::string run_case(const json& j) {
  Ctx c = make_ctx(j);
  std::vector<Tensor> outs = run_op_mode(c);
  const json& out = j.at("out");
  std::vector<const json*> expected;
  if (out.is_array()) {
    for (const auto& e : out) expected.push_back(&e);
  } else {
    expected.push_back(&out);
  }
  if (outs.size() != expected.size()) return cat("expected ", expected.size(), " outputs, got ", outs.size());
  kiln::eval(outs);
  bool loose = loose_op(c.op);
  std::string r;
  for (size_t k = 0; k < outs.size(); ++k) {
    std::string d = compare(outs[k], *expected[k], loose);
    if (!d.empty()) r += (r.empty() ? "" : "; ") + (expected.size() > 1 ? cat("out[", k, "] ") : std::string()) + d;
  }
  return r;
}

// Whether a case carries expected gradients for at least one input.
bool has_grads(const json& j) {
  if (!j.contains("grads") || !j["grads"].is_array()) return false;
  for (const auto& g : j["grads"]) {
    if (g.is_null()) continue;
    if (!g.is_array()) return true;
    for (const auto& e : g)
      if (!e.is_null()) return true;
  }
  return false;
}

// Whether every element of an expected tensor is zero.
bool all_zero(const json& exp) {
  std::vector<const json*> ev;
  flatten_data(exp.at("data"), ev);
  return std::all_of(ev.begin(), ev.end(), [](const json* e) { return number(*e) == 0; });
}

// Runs one case with its floating inputs as leaves that require grad, backpropagates
// sum(out * gout) (summed over outputs when gout is a list; with a single gout and several
// outputs, the first output) and compares kiln::grad's results with `grads`.
// Returns "" on a pass, else what went wrong.
std::string run_grad_case(const json& j) {
  Ctx c = make_ctx(j);
  const json& grads = j.at("grads");

  // Input i (positional, else named in order) pairs with grads[i]; a tensor-list input pairs
  // with a list of grads.
  std::vector<Arg*> inputs;
  if (!c.pos.empty()) {
    for (auto& a : c.pos) inputs.push_back(&a);
  } else {
    for (const auto& n : c.names) inputs.push_back(&c.named.at(n));
  }
  if (grads.size() != inputs.size()) return cat("corpus has ", grads.size(), " grads for ", inputs.size(), " inputs");
  struct Want {
    Tensor leaf;
    const json* exp;
    std::string label;
  };
  std::vector<Want> wants;
  auto want = [&](Tensor& t, const json& g, const std::string& label) {
    if (g.is_null()) return;
    if (!is_tensor_json(g)) throw Unsupported(label + ": expected gradient is not a tensor");
    if (!kiln::is_floating(t.dtype())) throw Unsupported(label + ": expected a gradient for a non-floating input");
    t.requires_grad_();
    wants.push_back({t, &g, label});
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    Arg& a = *inputs[i];
    const json& g = grads[i];
    if (g.is_null()) continue;
    if (a.kind == Arg::T) {
      want(a.t, g, cat("grad[", i, "]"));
    } else if (a.kind == Arg::List && g.is_array() && g.size() == a.list.size()) {
      for (size_t k = 0; k < a.list.size(); ++k) want(a.list[k], g[k], cat("grad[", i, "][", k, "]"));
    } else {
      throw Unsupported(cat("grad[", i, "]: input ", i, " is not a tensor the gradient can pair with"));
    }
  }

  std::vector<Tensor> outs = run_op_mode(c);
  const json& gout = j.at("gout");
  std::vector<std::pair<size_t, const json*>> pairs;  // (output index, upstream gradient)
  if (gout.is_array()) {
    if (gout.size() != outs.size()) return cat("corpus has ", gout.size(), " gouts for ", outs.size(), " outputs");
    for (size_t k = 0; k < gout.size(); ++k)
      if (!gout[k].is_null()) pairs.push_back({k, &gout[k]});
  } else {
    pairs.push_back({0, &gout});
  }
  Tensor loss;
  for (auto [k, gj] : pairs) {
    Tensor go = make_tensor(*gj);
    if (go.sizes() != outs[k].sizes())
      return cat("gout", gout.is_array() ? cat("[", k, "]") : std::string(), " has shape ", shape_str(go.sizes()),
                 ", out[", k, "] has ", shape_str(outs[k].sizes()));
    Tensor term = kiln::sum(kiln::mul(outs[k], go));
    loss = loss.defined() ? kiln::add(loss, term) : term;
  }
  if (!loss.defined()) return "no upstream gradient";
  std::vector<Tensor> leaves;
  for (const auto& w : wants) leaves.push_back(w.leaf);
  std::vector<Tensor> got = kiln::grad({loss}, leaves, {}, false, false, /*allow_unused=*/true);
  if (got.size() != wants.size()) return cat("kiln::grad returned ", got.size(), " gradients for ", wants.size());
  std::string r;
  for (size_t i = 0; i < wants.size(); ++i) {
    const json& exp = *wants[i].exp;
    std::string d;
    if (!got[i].defined()) {
      if (all_zero(exp)) continue;  // an unused input: torch's zeros
      d = "undefined gradient (the output does not depend on this input in kiln's graph)";
    } else {
      std::string edt = exp.at("dtype").get<std::string>();
      if (edt.rfind("torch.", 0) == 0) edt = edt.substr(6);
      d = compare(got[i], exp, true, grad_tolerance(edt));
    }
    if (!d.empty()) r += (r.empty() ? "" : "; ") + wants[i].label + " " + d;
  }
  return r;
}

// Where the corpus is, or a skip / failure message when it is missing.
std::optional<std::filesystem::path> corpus_or_message(std::string& msg, bool& required) {
  std::string tried;
  auto path = find_parity_file(tried);
  if (!path) {
    const char* req = std::getenv("KILN_REQUIRE_PARITY");
    msg = "torch-parity corpus not found (looked at: " + tried +
          "); set KILN_PARITY_FILE to torch_parity.jsonl to run it";
    required = req && std::string(req) == "1";
  }
  return path;
}

// Runs `run` on every case of the corpus; it returns nullopt to skip a case, "" on success,
// else what differed.
struct CorpusResult {
  int total = 0, passed = 0;
  std::vector<std::string> failures;
};
CorpusResult run_corpus(const std::filesystem::path& path,
                        const std::function<std::optional<std::string>(const json&)>& run) {
  CorpusResult r;
  std::ifstream in(path);
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r\n") == std::string::npos) continue;
    std::string id = cat("line ", lineno);
    std::optional<std::string> err;
    try {
      json j = json::parse(quote_nonfinite_tokens(line));
      if (j.contains("id")) id = j["id"].is_string() ? j["id"].get<std::string>() : j["id"].dump();
      err = run(j);
      if (!err) continue;
    } catch (const Unsupported& e) {
      err = cat("unsupported: ", e.what());
    } catch (const kiln::Error& e) {
      err = cat("kiln::Error: ", e.what());
    } catch (const std::exception& e) {
      err = cat("exception: ", e.what());
    }
    ++r.total;
    if (err->empty())
      ++r.passed;
    else
      r.failures.push_back(id + ": " + *err);
  }
  return r;
}

// The corpus path, or skips (fails under KILN_REQUIRE_PARITY=1) when it is missing.
#define KILN_PARITY_CORPUS(path)                                \
  std::string msg_;                                             \
  bool required_ = false;                                       \
  auto path = corpus_or_message(msg_, required_);               \
  if (!path) {                                                  \
    if (required_) FAIL() << msg_ << "; KILN_REQUIRE_PARITY=1"; \
    GTEST_SKIP() << msg_;                                       \
  }                                                             \
  ASSERT_TRUE(std::ifstream(*path)) << "cannot open " << *path

}  // namespace

namespace {
// Runs the forward cases (or those with gradients) eagerly or through kiln::compile, prints a
// summary line and the failures, and fails the test on any failure.
void check_corpus(const std::filesystem::path& path, bool grads, bool compiled) {
  const kiln::Device dev = kiln::testing::test_device();
  if (dev != kiln::cpu() && !kiln::cuda::is_available())
    GTEST_SKIP() << "KILN_TEST_DEVICE=" << dev.str() << ": no usable CUDA device";
  g_compiled = compiled;
  CorpusResult r = run_corpus(path, [grads](const json& j) -> std::optional<std::string> {
    if (!grads) return run_case(j);
    if (!has_grads(j)) return std::nullopt;
    return run_grad_case(j);
  });
  g_compiled = false;
  std::cout << "torch-parity" << (compiled ? " compiled" : "") << (grads ? " grads" : "") << ": " << r.passed << "/"
            << r.total << " cases passed" << std::endl;
  for (const auto& f : r.failures) std::cout << "  FAIL " << f << std::endl;
  EXPECT_GT(r.total, 0) << "no " << (grads ? "cases with gradients" : "cases") << " in " << path;
  EXPECT_EQ(r.failures.size(), 0u) << r.failures.size() << " of " << r.total << (compiled ? " compiled" : "")
                                   << " torch-parity " << (grads ? "gradient " : "") << "cases failed (listed above)";
}
}  // namespace

// The project-owned corpus of the API of issue 10 (tests/parity/api_parity.jsonl, written by
// tests/parity/make_api_parity.py with PyTorch 2.11): always present, so required.
std::filesystem::path api_corpus() {
  return kiln::testing::source_path("tests/parity/api_parity.jsonl");
}
#define KILN_API_CORPUS(path)                                                      \
  auto path = api_corpus();                                                        \
  ASSERT_TRUE(std::filesystem::exists(path)) << "missing project corpus " << path; \
  ASSERT_TRUE(std::ifstream(path)) << "cannot open " << path

TEST(TorchParityApi, AllCases) {
  KILN_API_CORPUS(path);
  check_corpus(path, false, false);
}
TEST(TorchParityApi, Gradients) {
  KILN_API_CORPUS(path);
  check_corpus(path, true, false);
}
TEST(TorchParityApi, AllCasesCompiled) {
  KILN_API_CORPUS(path);
  check_corpus(path, false, true);
}
TEST(TorchParityApi, GradientsCompiled) {
  KILN_API_CORPUS(path);
  check_corpus(path, true, true);
}

TEST(TorchParity, AllCases) {
  KILN_PARITY_CORPUS(path);
  check_corpus(*path, false, false);
}

TEST(TorchParity, Gradients) {
  KILN_PARITY_CORPUS(path);
  check_corpus(*path, true, false);
}

// The same corpus through kiln::compile: compiled equals eager at the same tolerances. The
// gradients come from the compiled backward (min-cut partition) where a case has one
// differentiable output; functions with several run eagerly (and must still match).
TEST(TorchParity, AllCasesCompiled) {
  KILN_PARITY_CORPUS(path);
  check_corpus(*path, false, true);
}

TEST(TorchParity, GradientsCompiled) {
  KILN_PARITY_CORPUS(path);
  check_corpus(*path, true, true);
}
