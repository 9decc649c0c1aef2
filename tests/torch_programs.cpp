// Replaying torch-programs (see torch_programs.h).
#include "torch_programs.h"

#include <stdexcept>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <set>

namespace torch_programs {
namespace {

using kiln::Scalar;
using torch_ops::Arg;
using torch_ops::cat;
using torch_ops::Ctx;
using torch_ops::Tol;
using torch_ops::Unsupported;

// Reductions whose corpus attr `dims` is the dispatcher's `dim` ([] = every dim).
const std::set<std::string>& dim_list_reductions() {
  static const std::set<std::string> s = {"sum", "mean", "prod", "amax",      "amin", "all",
                                          "any", "std",  "var",  "logsumexp", "norm"};
  return s;
}

// Ops whose index tensor (attrs `index` / `target`) is a positional argument of the dispatcher,
// at the position given.
int index_position(const std::string& op) {
  static const std::map<std::string, int> m = {{"gather", 1},       {"scatter", 1},      {"scatter_add", 1},
                                               {"index_select", 1}, {"index_add", 1},    {"embedding", 0},
                                               {"one_hot", 0},      {"cross_entropy", 1}};
  auto it = m.find(op);
  return it == m.end() ? -1 : it->second;
}

Arg arg_value(const json& a, const std::vector<Tensor>& vals) {
  Arg r;
  const std::string kind = a.at(0).get<std::string>();
  if (kind == "v") {
    r.kind = Arg::T;
    r.t = vals.at(a.at(1).get<size_t>());
    if (!r.t.defined()) throw std::runtime_error(cat("value ", a.at(1).get<int64_t>(), " is not defined"));
  } else if (kind == "f") {
    r.kind = Arg::S;
    r.s = Scalar(torch_ops::number(a.at(1)));
  } else if (kind == "i") {
    r.kind = Arg::S;
    r.s = Scalar(a.at(1).get<int64_t>());
  } else if (kind == "b") {
    r.kind = Arg::S;
    r.s = Scalar(a.at(1).get<bool>());
  } else if (kind != "n") {
    throw Unsupported("argument kind '" + kind + "'");
  }
  return r;
}

std::vector<kiln::TensorIndex> index_items(const json& items) {
  std::vector<kiln::TensorIndex> r;
  for (const auto& it : items) {
    const std::string k = it.at(0).get<std::string>();
    if (k == "e")
      r.emplace_back(kiln::Ellipsis);
    else if (k == "n")
      r.emplace_back(kiln::None);
    else if (k == "i")
      r.emplace_back(it.at(1).get<int64_t>());
    else if (k == "s") {
      auto bound = [](const json& v) -> kiln::SliceBound {
        if (v.is_null()) return kiln::None;
        return v.get<int64_t>();
      };
      r.emplace_back(kiln::Slice(bound(it.at(1)), bound(it.at(2)), it.at(3).is_null() ? 1 : it.at(3).get<int64_t>()));
    } else {
      throw Unsupported("index item '" + k + "'");
    }
  }
  return r;
}

std::optional<Scalar> opt_scalar(const Arg& a) {
  if (a.kind == Arg::None) return std::nullopt;
  if (a.kind != Arg::S) throw Unsupported("expected a number or None");
  return a.s;
}

// An in-place op on `t` (a handle in the value table: every alias sees the write).
void run_inplace(const std::string& op, Tensor& t, const std::vector<Arg>& a, const json& attrs) {
  auto other = [&]() -> const Arg& {
    if (a.size() < 2) throw Unsupported(op + ": missing operand");
    return a[1];
  };
  if (op == "add_" || op == "sub_") {
    Scalar alpha = attrs.contains("alpha") ? torch_ops::scalar_of(attrs["alpha"]) : Scalar(int64_t{1});
    const Arg& o = other();
    if (o.kind == Arg::T)
      op == "add_" ? t.add_(o.t, alpha) : t.sub_(o.t, alpha);
    else
      op == "add_" ? t.add_(o.s) : t.sub_(o.s);
  } else if (op == "mul_" || op == "div_") {
    const Arg& o = other();
    if (o.kind == Arg::T)
      op == "mul_" ? t.mul_(o.t) : t.div_(o.t);
    else
      op == "mul_" ? t.mul_(o.s) : t.div_(o.s);
  } else if (op == "clamp_") {
    t.clamp_(opt_scalar(a.size() > 1 ? a[1] : Arg{}), opt_scalar(a.size() > 2 ? a[2] : Arg{}));
  } else if (op == "fill_") {
    const Arg& o = other();
    if (o.kind == Arg::T)
      t.copy_(o.t);
    else
      t.fill_(o.s);
  } else if (op == "zero_") {
    t.zero_();
  } else if (op == "copy_") {
    t.copy_(other().t);
  } else if (op == "index_put_") {
    const Arg& o = other();
    auto idx = index_items(attrs.at("items"));
    if (o.kind == Arg::T)
      t.index_put_(idx, o.t);
    else
      t.index_put_(idx, o.s);
  } else {
    throw Unsupported("in-place op '" + op + "'");
  }
}

// The dispatcher's context for a functional op.
Ctx context(const std::string& name, const json& args, const json& attrs, const std::vector<Tensor>& attr_tensors,
            const std::vector<Tensor>& vals) {
  Ctx c;
  c.op = name;
  for (auto it = attrs.begin(); it != attrs.end(); ++it)
    if (!torch_ops::is_tensor_json(it.value())) c.attrs[it.key()] = it.value();
  for (const auto& a : args) c.pos.push_back(arg_value(a, vals));
  if (dim_list_reductions().count(name) && c.attrs.contains("dims")) {
    if (!c.attrs["dims"].empty()) c.attrs["dim"] = c.attrs["dims"];
    c.attrs.erase("dims");
  }
  if (name == "flatten") {
    if (c.attrs.contains("start")) c.attrs["start_dim"] = c.attrs["start"];
    if (c.attrs.contains("end")) c.attrs["end_dim"] = c.attrs["end"];
  }
  if (name == "split" && c.attrs.contains("size")) c.attrs["split_size"] = c.attrs["size"];
  if (name == "max_all" || name == "min_all") c.op = name.substr(0, 3);
  if (name == "max_dim" || name == "min_dim") c.op = name.substr(0, 3);
  if (int p = index_position(name); p >= 0) {
    if (attr_tensors.empty()) throw Unsupported(name + ": missing index tensor");
    Arg idx;
    idx.kind = Arg::T;
    idx.t = attr_tensors[0];
    c.pos.insert(c.pos.begin() + std::min<size_t>(p, c.pos.size()), idx);
  }
  return c;
}

}  // namespace

Program parse_program(const json& j) {
  Program p;
  p.id = j.at("id").get<std::string>();
  p.grad = j.value("grad", false);
  p.ops = j.at("ops");
  p.nvalues = static_cast<int64_t>(j.at("inputs").size());
  for (const auto& op : p.ops) {
    std::vector<Tensor> ts;
    for (auto it = op.at("attrs").begin(); it != op.at("attrs").end(); ++it)
      if (torch_ops::is_tensor_json(it.value())) ts.push_back(torch_ops::make_tensor(it.value()));
    p.attr_tensors.push_back(std::move(ts));
    for (const auto& o : op.at("outs")) p.nvalues = std::max(p.nvalues, o.get<int64_t>() + 1);
  }
  for (const auto& o : j.at("outputs")) p.outputs.push_back(o.get<int64_t>());
  for (const auto& t : j.at("tol")) p.tol.push_back(t.get<std::string>());
  p.sets = j.at("sets");
  return p;
}

std::vector<Tensor> run_program(const Program& p, const std::vector<Tensor>& inputs) {
  std::vector<Tensor> vals(static_cast<size_t>(p.nvalues));
  for (size_t i = 0; i < inputs.size(); ++i) vals[i] = inputs[i];
  for (size_t k = 0; k < p.ops.size(); ++k) {
    const json& op = p.ops[k];
    const std::string name = op.at("op").get<std::string>();
    const json& args = op.at("args");
    const json& attrs = op.at("attrs");
    const json& outs = op.at("outs");
    if (name.back() == '_') {
      std::vector<Arg> a;
      for (const auto& x : args) a.push_back(arg_value(x, vals));
      Tensor& t = vals.at(args.at(0).at(1).get<size_t>());
      run_inplace(name, t, a, attrs);
      vals.at(outs.at(0).get<size_t>()) = t;
      continue;
    }
    std::vector<Tensor> r;
    if (name == "index") {
      r.push_back(arg_value(args.at(0), vals).t.index(index_items(attrs.at("items"))));
    } else if (name == "expand_as") {
      r.push_back(kiln::expand_as(arg_value(args.at(0), vals).t, arg_value(args.at(1), vals).t));
    } else {
      r = torch_ops::run_op(context(name, args, attrs, p.attr_tensors[k], vals));
    }
    if (r.size() != outs.size())
      throw std::runtime_error(cat(name, ": expected ", outs.size(), " results, got ", r.size()));
    for (size_t i = 0; i < r.size(); ++i) vals.at(outs[i].get<size_t>()) = r[i];
  }
  std::vector<Tensor> res;
  for (int64_t o : p.outputs) res.push_back(vals.at(static_cast<size_t>(o)));
  return res;
}

namespace {

Tol tol_of(const std::string& t) {
  if (t == "f32") return {1e-4, 1e-5};
  if (t == "f64") return {1e-9, 1e-10};
  return {0, 0};
}

std::vector<Tensor> set_inputs(const Program& p, size_t s, bool leaves) {
  std::vector<Tensor> xs;
  for (const auto& t : p.sets.at(s).at("inputs")) {
    Tensor x = torch_ops::make_tensor(t);
    if (leaves && kiln::is_floating(x.dtype())) x.requires_grad_();
    xs.push_back(x);
  }
  return xs;
}

std::vector<std::vector<int64_t>> set_shapes(const Program& p, size_t s) {
  std::vector<std::vector<int64_t>> r;
  for (const auto& t : p.sets.at(s).at("inputs")) {
    std::vector<int64_t> sh;
    for (const auto& d : t.at("shape")) sh.push_back(d.get<int64_t>());
    r.push_back(sh);
  }
  return r;
}

// sum_j sum(out_j * gout_j) over the results that need grad; undefined when none does.
Tensor loss_of(const Program& p, size_t s, const std::vector<Tensor>& outs) {
  const json& gouts = p.sets.at(s).at("gouts");
  Tensor loss;
  for (size_t j = 0; j < outs.size(); ++j) {
    if (j >= gouts.size() || gouts[j].is_null() || !outs[j].requires_grad()) continue;
    Tensor term = kiln::sum(kiln::mul(outs[j], torch_ops::make_tensor(gouts[j])));
    loss = loss.defined() ? kiln::add(loss, term) : term;
  }
  return loss;
}

struct Checker {
  const Program& p;
  Outcome& o;

  void fail(const std::string& what) { o.failures.push_back(what); }

  void outputs(const std::string& mode, size_t s, const std::vector<Tensor>& outs) {
    const json& exp = p.sets.at(s).at("outputs");
    if (outs.size() != exp.size())
      return fail(cat(mode, " set ", s, ": expected ", exp.size(), " results, got ", outs.size()));
    kiln::eval(outs);
    for (size_t j = 0; j < outs.size(); ++j) {
      std::string d = torch_ops::compare(outs[j], exp[j], false, tol_of(p.tol.at(j)));
      if (!d.empty()) fail(cat(mode, " set ", s, " result ", j, ": ", d));
    }
  }

  void grads(const std::string& mode, size_t s, const std::vector<Tensor>& xs) {
    std::vector<Tensor> gs;
    for (const Tensor& x : xs) gs.push_back(x.grad().defined() ? x.grad() : kiln::zeros_like(x));
    grad_values(mode, s, gs);
  }

  // The gradients `gs` of the inputs (whole) against the corpus.
  void grad_values(const std::string& mode, size_t s, const std::vector<Tensor>& gs) {
    const json& exp = p.sets.at(s).at("grads");
    for (size_t i = 0; i < gs.size() && i < exp.size(); ++i) {
      if (exp[i].is_null()) continue;
      const Tensor& g = gs[i];
      // A gradient through a result that went through float32 values (marked "f32") went
      // through them too: float32 tolerance, as for that result.
      std::string dt = exp[i].at("dtype").get<std::string>();
      bool f32 = dt == "float32" || std::count(p.tol.begin(), p.tol.end(), "f32") > 0;
      std::string d = torch_ops::compare(g, exp[i], false, tol_of(f32 ? "f32" : "f64"));
      if (!d.empty()) fail(cat(mode, " set ", s, " grad of input ", i, ": ", d));
    }
  }

  // Runs `body`, turning an exception into a failure of `mode`.
  void guarded(const std::string& mode, const std::function<void()>& body) {
    try {
      body();
    } catch (const std::exception& e) {
      fail(mode + ": threw " + e.what());
    }
  }
};

}  // namespace

Outcome replay(const Program& p) {
  Outcome o;
  Checker ck{p, o};
  const size_t nsets = p.sets.size();
  auto fn = [&p](const std::vector<Tensor>& xs) { return run_program(p, xs); };
  std::vector<size_t> order = nsets == 3 ? std::vector<size_t>{0, 1, 2, 0} : std::vector<size_t>{0, 0};
  if (nsets == 3) {
    auto s0 = set_shapes(p, 0), s1 = set_shapes(p, 1), s2 = set_shapes(p, 2);
    o.polymorphic = s0 != s1 && s1 != s2 && s0 != s2;
    // A dim becomes symbolic when it first changes (as in PyTorch), at any size it changes to
    // (a symbol the second set sees as 0 or 1 stays symbolic unless the trace asks about that
    // value): the third set can reuse the second entry when every dim it changes was already
    // changed by the second set.
    o.coverable = o.polymorphic;
    for (size_t i = 0; i < s0.size() && o.coverable; ++i)
      for (size_t d = 0; d < s0[i].size() && d < s2[i].size() && o.coverable; ++d)
        o.coverable = s0[i].size() == s2[i].size() && (s2[i][d] == s1[i][d] || s0[i][d] != s1[i][d]);
  }

  // 1. eager, every set.
  for (size_t s = 0; s < nsets; ++s)
    ck.guarded(cat("eager set ", s), [&] { ck.outputs("eager", s, fn(set_inputs(p, s, false))); });

  // 2. compiled on each set in turn and back; then with every size dynamic from the start.
  ck.guarded("compiled", [&] {
    auto f = kiln::compile(fn, {.name = p.id});
    int before_third = 0;
    for (size_t k = 0; k < order.size(); ++k) {
      if (k == 2) before_third = f.stats().entries;
      ck.outputs(cat("compiled call ", k), order[k], f(set_inputs(p, order[k], false)));
      if (k == 2) {
        o.third_size_reused = f.stats().entries == before_third && f.stats().eager_calls == 0;
        if (!o.third_size_reused) o.third_size_miss = f.stats().eager_calls ? "runs eager" : f.stats().last_miss;
      }
    }
  });
  ck.guarded("dynamic", [&] {
    kiln::CompileOptions opt{.name = p.id};
    opt.dynamic = kiln::CompileOptions::Dynamic::Always;
    auto f = kiln::compile(fn, opt);
    for (size_t s = 0; s < nsets; ++s) ck.outputs("dynamic", s, f(set_inputs(p, s, false)));
  });
  if (!p.grad) return o;

  // 3. gradients: eager; forward compiled with backward() outside; backward() inside.
  auto backward = [&](size_t s, const std::vector<Tensor>& outs) {
    Tensor loss = loss_of(p, s, outs);
    if (loss.defined()) loss.backward();
  };
  for (size_t s = 0; s < nsets; ++s) {
    ck.guarded(cat("grad eager set ", s), [&] {
      auto xs = set_inputs(p, s, true);
      backward(s, fn(xs));
      ck.grads("grad eager", s, xs);
    });
  }
  ck.guarded("grad compiled forward", [&] {
    auto f = kiln::compile(fn, {.name = p.id});
    for (size_t s : order) {
      auto xs = set_inputs(p, s, true);
      backward(s, f(xs));
      ck.grads("grad compiled forward", s, xs);
    }
  });
  ck.guarded("grad inside compile", [&] {
    // The upstream gradients of the results that have one are arguments (they change size
    // with the inputs); `with_gout` names those results.
    std::vector<size_t> with_gout;
    const json& g0 = p.sets.at(0).at("gouts");
    for (size_t j = 0; j < g0.size(); ++j)
      if (!g0[j].is_null()) with_gout.push_back(j);
    auto f = kiln::compile(
        [&](const std::vector<Tensor>& xs, const std::vector<Tensor>& gs) {
          std::vector<Tensor> outs = run_program(p, xs);
          Tensor loss;
          for (size_t k = 0; k < with_gout.size(); ++k) {
            const Tensor& out = outs.at(with_gout[k]);
            if (!out.requires_grad()) continue;
            Tensor term = kiln::sum(kiln::mul(out, gs.at(k)));
            loss = loss.defined() ? kiln::add(loss, term) : term;
          }
          if (loss.defined()) loss.backward();
          return outs;
        },
        {.name = p.id});
    for (size_t s : order) {
      auto xs = set_inputs(p, s, true);
      std::vector<Tensor> gs;
      for (size_t j : with_gout) gs.push_back(torch_ops::make_tensor(p.sets.at(s).at("gouts").at(j)));
      f(xs, gs);
      ck.grads("grad inside compile", s, xs);
    }
  });
  return o;
}

Outcome replay_placed(const Program& p, const Placer& placer) {
  Outcome o;
  Checker ck{p, o};
  auto placed_inputs = [&](size_t s, bool leaves) {
    std::vector<Tensor> xs = set_inputs(p, s, false);
    for (size_t i = 0; i < xs.size(); ++i) {
      xs[i] = placer.place(xs[i], i);
      if (leaves && kiln::is_floating(xs[i].dtype())) xs[i].requires_grad_();
    }
    return xs;
  };
  auto gathered = [&](std::vector<Tensor> ts) {
    for (Tensor& t : ts) t = placer.gather(t);
    return ts;
  };
  auto fn = [&p](const std::vector<Tensor>& xs) { return run_program(p, xs); };
  for (size_t s = 0; s < p.sets.size(); ++s)
    ck.guarded(cat("placed eager set ", s), [&] { ck.outputs("placed eager", s, gathered(fn(placed_inputs(s, false)))); });
  ck.guarded("placed compiled", [&] {
    auto f = kiln::compile(fn, {.name = p.id});
    ck.outputs("placed compiled", 0, gathered(f(placed_inputs(0, false))));
  });
  if (!p.grad) return o;
  for (size_t s = 0; s < p.sets.size(); ++s)
    ck.guarded(cat("placed grad set ", s), [&] {
      std::vector<Tensor> xs = placed_inputs(s, true);
      Tensor loss = loss_of(p, s, fn(xs));
      if (loss.defined()) loss.backward();
      std::vector<Tensor> gs;
      for (const Tensor& x : xs) gs.push_back(placer.gather(x.grad().defined() ? x.grad() : kiln::zeros_like(x)));
      ck.grad_values("placed grad", s, gs);
    });
  return o;
}

namespace fs = std::filesystem;

std::optional<fs::path> find_corpus(std::string& tried) {
  const char* rel = "shared/torch-programs/programs.jsonl.gz";
  auto check = [&](const fs::path& p) {
    tried += (tried.empty() ? "" : ", ") + p.string();
    return fs::exists(p);
  };
  if (const char* e = std::getenv("KILN_PROGRAMS_FILE"); e && *e)
    return check(e) ? std::optional<fs::path>(e) : std::nullopt;
  if (const char* s = std::getenv("KILN_SOURCE_DIR"); s && *s)
    if (fs::path p = fs::path(s) / ".." / rel; check(p)) return p;
  for (const char* up : {"..", "../..", "../../.."})
    if (fs::path p = fs::path(up) / rel; check(p)) return p;
  return std::nullopt;
}

std::vector<std::string> read_corpus(const fs::path& path) {
  std::string cmd = "gzip -dc '" + path.string() + "'";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) throw std::runtime_error("cannot run " + cmd);
  std::vector<std::string> lines;
  std::string line;
  char buf[1 << 16];
  while (size_t n = fread(buf, 1, sizeof buf, f)) {
    for (size_t i = 0; i < n; ++i) {
      if (buf[i] == '\n') {
        if (!line.empty()) lines.push_back(std::move(line));
        line.clear();
      } else {
        line += buf[i];
      }
    }
  }
  if (!line.empty()) lines.push_back(std::move(line));
  int rc = pclose(f);
  if (rc != 0) throw std::runtime_error(cmd + " failed");
  return lines;
}


}  // namespace torch_programs
