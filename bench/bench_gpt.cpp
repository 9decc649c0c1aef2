// The GPT training step users will judge kiln by (issue 34): nanoGPT's model written with kiln's
// public nn/optim API as a user would write it (kiln.h only), one training step = zero_grad,
// forward, cross_entropy, backward, clip_grad_norm_(1.0), AdamW step, the loss read with item()
// every step; in lazy eager mode and with the whole step inside kiln::compile. PyTorch's twin is
// bench/torch_gpt.py (same model, data, step, JSON fields); bench/run_gpt.sh runs both and prints
// one table. One JSON object per line.
//
//   bench_gpt [--config S|M|L] [--dtype fp32|bf16|all] [--mode eager|compiled|all]
//             [--steps N] [--warmup N] [--device cpu|cuda] [--seed N] [--attn sdpa|manual]
//             [--batches N] [--tie-weights] [--matmul-precision highest|high|medium]
//             [--peak-flops F] [--batch B] [--seq T] [--d D] [--layers L] [--heads H]
//             [--vocab V] [--mlp M]                 (options also as --name=value)
//
// The model (nanoGPT's GPT, dropout 0, bias on): token embedding + learned position embedding,
// n_layer pre-norm blocks [LayerNorm -> causal self-attention: one Linear d->3d, split into q, k, v,
// heads by view + transpose, scaled_dot_product_attention(is_causal) or (--attn manual) softmax(q
// k^T / sqrt(hs) masked by a tril buffer) v, Linear d->d] and [LayerNorm -> Linear d->mlp, GELU
// (erf), Linear mlp->d], residuals, final LayerNorm, lm_head Linear d->vocab without bias. No weight
// tying unless --tie-weights (then the logits are linear(x, wte.weight)). nanoGPT's init: Linear
// and Embedding weights N(0, 0.02), the c_proj weights N(0, 0.02/sqrt(2 n_layer)), biases 0.
// AdamW as nanoGPT's configure_optimizers: lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1
// on the 2-D parameters and 0 on the others (two parameter groups).
//
// Configurations: S (d 64, 2 layers, 4 heads, T 64, batch 16, vocab 65, MLP 256), M (d 256,
// 4 layers, 8 heads, T 256, batch 32, vocab 65, MLP 1024), L (GPT-2 small: d 768, 12 layers,
// 12 heads, T 1024, batch 8, vocab 50304, MLP 3072).
//
// Data (the same for every mode and for torch_gpt.py): --batches (default 8) fixed batches cycled
// through, made by splitmix64 from --seed: each row starts at a random token and goes on by a
// random step of 1, 2 or 3 (mod vocab), so the loss can fall from ln(vocab) towards ln(3) ~ 1.10;
// targets are the inputs shifted by one. The model's init comes from kiln::manual_seed(seed),
// the same for eager and compiled.
//
// Timing: wall time of each step including item() (which waits for the device), median over
// --steps steps after --warmup untimed ones (the compile and the CUDA-graph recording fall in the
// warmup). flops per step use nanoGPT's estimate_mfu: (6 N + 12 L H Q T) per token, N the
// parameters that take part in GEMMs (all but the position embedding, and but the token embedding
// when it is not tied to lm_head). MFU against the H100 SXM dense peak: 494.7e12 (TF32) for fp32
// rows, 989e12 (BF16) for bf16 rows (the row says which: "peak_name", "peak_flops").
//
// bf16 means autocast (torch.autocast(device_type, torch.bfloat16) around forward + loss): built
// only when KILN_HAS_AUTOCAST is defined (kiln::autocast lands with issue 34 item 4); until then
// a bf16 row prints "skipped": "kiln::autocast not built".
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "examples/gpt_model.h"
#include "kiln.h"
#include "runtime/parallel/tensor_parallel.h"

using kiln::Tensor;
namespace nn = kiln::nn;
namespace optim = kiln::optim;
using Clock = std::chrono::steady_clock;

namespace {

// ---------------- configuration ----------------
using gpt::GptConfig;
using gpt::Gpt;
using gpt::config_named;

struct Options {
  std::string config = "S", dtype = "fp32", mode = "all", device = "cuda", attn = "sdpa", precision = "highest";
  int steps = -1, warmup = -1, batches = 8;
  uint64_t seed = 1337;
  bool tie = false;
  bool checkpoint = false;  // --checkpoint: every block under kiln::checkpoint
  bool graphs = true;  // --no-graphs: compiled steps run kernel by kernel (KILN_PROFILE sees each)
  bool ddp = false;  // --ddp: nn::DistributedDataParallel over kiln-run's ranks (NCCL on CUDA, Gloo on the CPU)
  bool fsdp = false;  // --fsdp: dist::fully_shard over kiln-run's ranks, each rank its own batches (eager)
  bool tp = false;  // --tp: the MLPs tensor parallel (c_fc colwise, c_proj rowwise), every rank the same batches
  double peak_flops = 0;  // 0: the H100 figure for the dtype
  // Overrides of the configuration (-1: the configuration's).
  int64_t batch = -1, seq = -1, d = -1, layers = -1, heads = -1, vocab = -1, mlp = -1;
};

// ---------------- data: the same batches as bench/torch_gpt.py ----------------
struct SplitMix64 {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

struct Batch {
  Tensor x, y;  // [B, T] int64 each: inputs and next tokens
};

// FNV-1a over every input token of every batch, printed in each row ("data_checksum") as
// torch_gpt.py prints its own: equal values say both ran on the same data.
std::string g_data_checksum = "none";

std::vector<Batch> make_batches(const GptConfig& c, uint64_t seed, int count, kiln::Device dev) {
  SplitMix64 rng{seed};
  uint64_t fnv = 14695981039346656037ull;
  const uint64_t V = static_cast<uint64_t>(c.vocab);
  const int64_t B = c.batch, T = c.block_size;
  std::vector<Batch> out;
  for (int b = 0; b < count; ++b) {
    std::vector<int64_t> xs, ys;
    xs.reserve(B * T);
    ys.reserve(B * T);
    for (int64_t r = 0; r < B; ++r) {
      std::vector<int64_t> row(T + 1);
      uint64_t t = rng.next() % V;
      row[0] = static_cast<int64_t>(t);
      for (int64_t j = 1; j <= T; ++j) {
        t = (t + 1 + rng.next() % 3) % V;
        row[j] = static_cast<int64_t>(t);
      }
      for (int64_t j = 0; j < T; ++j) fnv = (fnv ^ static_cast<uint64_t>(row[j])) * 1099511628211ull;
      xs.insert(xs.end(), row.begin(), row.end() - 1);
      ys.insert(ys.end(), row.begin() + 1, row.end());
    }
    Batch bt;
    bt.x = kiln::from_vector(xs, std::vector<int64_t>{B, T}, dev);
    bt.y = kiln::from_vector(ys, std::vector<int64_t>{B, T}, dev);
    kiln::eval({bt.x, bt.y});
    out.push_back(std::move(bt));
  }
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(fnv));
  g_data_checksum = buf;
  return out;
}

// ---------------- output ----------------
std::string json_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    const unsigned char u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      o += '\\';
      o += ch;
    } else if (ch == '\n') {
      o += "\\n";
    } else if (ch == '\t') {
      o += "\\t";
    } else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      o += buf;
    } else {
      o += ch;
    }
  }
  return o;
}

// One JSON object per line, fields in the order added.
class Row {
 public:
  Row(const std::string& workload, const std::string& impl) {
    s_ = "{\"workload\": \"" + json_escape(workload) + "\", \"impl\": \"" + json_escape(impl) + "\"";
  }
  Row& str(const char* k, const std::string& v) {
    s_ += std::string(", \"") + k + "\": \"" + json_escape(v) + "\"";
    return *this;
  }
  Row& num(const char* k, double v) {
    char buf[64];
    if (std::isfinite(v))
      std::snprintf(buf, sizeof buf, "%.6g", v);
    else
      std::snprintf(buf, sizeof buf, "null");
    s_ += std::string(", \"") + k + "\": " + buf;
    return *this;
  }
  Row& integer(const char* k, long long v) {
    s_ += std::string(", \"") + k + "\": " + std::to_string(v);
    return *this;
  }
  Row& boolean(const char* k, bool v) {
    s_ += std::string(", \"") + k + "\": " + (v ? "true" : "false");
    return *this;
  }
  void print() {
    if (kiln::dist::is_initialized() && kiln::dist::get_rank() != 0) return;  // (rank 0 speaks for all)
    if (kiln::dist::is_initialized()) integer("world_size", kiln::dist::get_world_size());
    std::printf("%s}\n", s_.c_str());
    std::fflush(stdout);
  }

 private:
  std::string s_;
};

// The fields every row of one (config, dtype, mode) carries, results or not.
Row head_row(const Options& o, const GptConfig& c, const std::string& dtype, const std::string& impl) {
  Row r("GPT-" + c.name, impl);
  r.str("framework", "kiln").str("config", c.name).str("dtype", dtype).str("device", o.device).str("attn", o.attn);
  r.integer("batch", c.batch).integer("seq", c.block_size).integer("d_model", c.n_embd).integer("n_layer", c.n_layer);
  r.integer("n_head", c.n_head).integer("vocab", c.vocab).integer("mlp", c.mlp).boolean("tie_weights", o.tie).boolean("checkpoint", o.checkpoint);
  r.integer("seed", static_cast<long long>(o.seed)).str("data_checksum", g_data_checksum);
  r.str("parallel", o.fsdp ? "fully_shard" : o.tp ? "tensor_parallel_mlp" : o.ddp ? "ddp" : "none");
  if (o.ddp) r.integer("world_size", kiln::dist::get_world_size());
  return r;
}

// ---------------- the training step ----------------
// Forward and loss, under autocast for bf16 (as torch.autocast wraps forward + loss; backward and
// the optimizer run outside it).
Tensor forward_loss(Gpt& model, const Tensor& idx, const Tensor& tgt, int64_t vocab, bool bf16, kiln::Device dev) {
#ifdef KILN_HAS_AUTOCAST
  if (bf16) {
    kiln::autocast guard(dev.type, kiln::DType::BFloat16);
    Tensor logits = model.forward(idx);
    return kiln::cross_entropy(logits.view({-1, vocab}), tgt.view({-1}));
  }
#else
  (void)bf16;
  (void)dev;
#endif
  Tensor logits = model.forward(idx);
  return kiln::cross_entropy(logits.view({-1, vocab}), tgt.view({-1}));
}

struct LoopResult {
  std::vector<double> ms;  // timed steps
  double first_ms = 0;  // the first step (trace and compile included when compiled)
  float first_loss = NAN, final_loss = NAN;
};

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// warmup + steps calls of `step` on the batches in turn, each followed by item() of its loss.
template <class Step>
LoopResult run_loop(Step&& step, const std::vector<Batch>& data, int warmup, int steps) {
  LoopResult r;
  const int total = warmup + steps;
  for (int i = 0; i < total; ++i) {
    const Batch& b = data[static_cast<size_t>(i) % data.size()];
    const auto a = Clock::now();
    float loss;
    {
      Tensor l = step(b.x, b.y);
      loss = l.item<float>();
    }  // (a compiled step's result belongs to its CUDA graph until dropped)
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - a).count();
    if (i == 0) {
      r.first_ms = ms;
      r.first_loss = loss;
    }
    if (i >= warmup) r.ms.push_back(ms);
    r.final_loss = loss;
  }
  return r;
}

void run_mode(const Options& o, const GptConfig& c, const std::string& dtype, bool compiled, kiln::Device dev,
              const std::vector<Batch>& data) {
  const std::string impl = compiled ? "kiln-compiled" : "kiln-eager";
  const bool bf16 = dtype == "bf16";
  const bool cuda = dev.type == kiln::DeviceType::CUDA;
#ifndef KILN_HAS_AUTOCAST
  if (bf16) {
    std::fprintf(stderr, "bench_gpt: GPT-%s bf16 %s skipped: kiln::autocast not built\n", c.name.c_str(), impl.c_str());
    head_row(o, c, dtype, impl).str("skipped", "kiln::autocast not built").print();
    return;
  }
#endif
  if (cuda) {
    kiln::cuda::synchronize();
    kiln::cuda::empty_cache();
    kiln::cuda::reset_peak_memory_stats(dev.index);
  } else {
    kiln::reset_peak_host_memory_stats();
  }
  kiln::manual_seed(o.seed);
  auto model = std::make_shared<Gpt>(c, o.attn == "manual", o.tie);
  model->checkpoint_blocks = o.checkpoint;
  model->to(dev);
  // Data parallel: the model's gradients are averaged over the ranks during the backward.
  std::shared_ptr<nn::DistributedDataParallel> ddp;
  std::optional<kiln::dist::DeviceMesh> mesh;  // --fsdp: parameters Shard(0), each rank's batch a Shard(0) piece
  if (o.fsdp) {
    mesh = kiln::dist::init_device_mesh(cuda ? "cuda" : "cpu", {kiln::dist::get_world_size()});
    kiln::dist::fully_shard(*model, *mesh);
  } else if (o.tp) {  // Megatron's MLP split, as bench/torch_gpt.py --tp
    kiln::dist::DeviceMesh tp_mesh = kiln::dist::init_device_mesh(cuda ? "cuda" : "cpu", {kiln::dist::get_world_size()});
    kiln::dist::parallelize_module(*model, tp_mesh,
                                   {{"h.*.mlp.c_fc", kiln::dist::ColwiseParallel()},
                                    {"h.*.mlp.c_proj", kiln::dist::RowwiseParallel()}});
  } else if (o.ddp) {
    ddp = std::make_shared<nn::DistributedDataParallel>(model);
  }
  kiln::eval(model->parameters());
  int64_t params = 0, wpe = model->wpe->weight.numel(), wte = model->wte->weight.numel();  // (global sizes)
  for (const Tensor& p : model->parameters()) params += p.numel();
  // nanoGPT's estimate_mfu: N = get_num_params() (non-embedding: without wpe; with tying, wte is
  // lm_head and counts), flops per token 6 N + 12 L H Q T, per step that times B T tokens.
  const int64_t n_flops = params - wpe - (o.tie ? 0 : wte);
  const double flops_per_token =
      6.0 * static_cast<double>(n_flops) +
      12.0 * static_cast<double>(c.n_layer * c.n_head * (c.n_embd / c.n_head) * c.block_size);
  const double world = o.ddp && !o.tp ? kiln::dist::get_world_size() : 1;  // (tensor parallel: one batch)
  const double tokens = static_cast<double>(c.batch * c.block_size) * world;  // (every rank's batch)
  const double flops_per_step = flops_per_token * tokens;

  // AdamW as nanoGPT's configure_optimizers: weight decay on 2-D parameters only.
  optim::AdamParamGroup decay, no_decay;
  for (const Tensor& p : model->parameters()) (p.dim() >= 2 ? decay : no_decay).params.push_back(p);
  decay.options.weight_decay = 0.1;
  no_decay.options.weight_decay = 0.0;
  optim::AdamOptions defaults;
  defaults.lr = 3e-4;
  defaults.beta1 = 0.9;
  defaults.beta2 = 0.95;
  defaults.eps = 1e-8;
  defaults.weight_decay = 0.1;
  optim::AdamW opt(std::vector<optim::AdamParamGroup>{decay, no_decay}, defaults);

  Gpt& m = *model;
  const int64_t vocab = c.vocab;
  auto step = [&](const Tensor& idx, const Tensor& tgt) {
    opt.zero_grad();
    Tensor loss = mesh ? forward_loss(m, kiln::dist::DTensor::from_local(idx, *mesh, {kiln::dist::Shard(0)}),
                                      kiln::dist::DTensor::from_local(tgt, *mesh, {kiln::dist::Shard(0)}), vocab, bf16, dev)
                       : forward_loss(m, idx, tgt, vocab, bf16, dev);
    loss.backward();
    optim::clip_grad_norm_(m.parameters(), 1.0);
    opt.step();
    return loss.detach();
  };

  LoopResult lr;
  kiln::CompileStats cs;
  if (compiled) {
    kiln::CompileOptions copts{"gpt_step"};
    copts.cuda_graphs = o.graphs;
    auto f = kiln::compile(step, copts);
    lr = run_loop([&](const Tensor& a, const Tensor& b) { return f(a, b); }, data, o.warmup, o.steps);
    cs = f.stats();
  } else {
    lr = run_loop(step, data, o.warmup, o.steps);
    kiln::eval(model->parameters());  // the last step's updates (untimed)
  }
  if (cuda) kiln::cuda::synchronize();

  const double ms = median(lr.ms);
  const double ms_min = lr.ms.empty() ? NAN : *std::min_element(lr.ms.begin(), lr.ms.end());
  double mean = 0;
  for (double t : lr.ms) mean += t;
  mean = lr.ms.empty() ? NAN : mean / static_cast<double>(lr.ms.size());
  const double peak = o.peak_flops > 0 ? o.peak_flops : bf16 ? 989e12 : 494.7e12;
  const std::string peak_name = o.peak_flops > 0 ? "user"
                                : bf16           ? "H100 SXM dense BF16 989 TFLOPS"
                                                 : "H100 SXM dense TF32 494.7 TFLOPS";
  const double sps = 1e3 / ms;
  Row r = head_row(o, c, dtype, impl);
  r.str("mode", compiled ? "compiled" : "eager").integer("steps", o.steps).integer("warmup", o.warmup);
  r.num("ms", ms).num("ms_min", ms_min).num("ms_mean", mean).num("steps_per_s", sps).num("tokens_per_s", sps * tokens);
  r.num("first_step_ms", lr.first_ms).num("first_loss", lr.first_loss).num("final_loss", lr.final_loss);
  r.integer("params", params).integer("params_flops", n_flops).num("flops_per_step", flops_per_step);
  r.num("tflops", flops_per_step * sps / 1e12).num("mfu", cuda ? flops_per_step * sps / peak : NAN);
  r.num("peak_flops", peak).str("peak_name", peak_name).str("matmul_precision", kiln::get_float32_matmul_precision());
  r.str("optimizer", "AdamW(lr 3e-4, betas 0.9/0.95, wd 0.1 on 2-D params)");
  {  // (on the CPU: the host memory of tensor data, kiln's buffer pool)
    const kiln::MemoryStats s = cuda ? kiln::cuda::memory_stats(dev.index) : kiln::host_memory_stats();
    r.num("peak_alloc_mib", s.peak_allocated_bytes / 1048576.0)
        .num("peak_reserved_mib", s.peak_reserved_bytes / 1048576.0);
  }
  if (compiled) {
    r.integer("compiles", cs.entries).num("compile_ms", cs.compile_ms).integer("hits", cs.hits);
    r.integer("misses", cs.misses).integer("eager_calls", cs.eager_calls).integer("graphs", cs.graphs);
    r.integer("graph_replays", cs.graph_replays).integer("ungraphed_runs", cs.ungraphed_runs);
    r.num("graph_mib", cs.graph_bytes / 1048576.0);
    if (cs.eager_calls > 0 || cs.entries > 1) r.str("last_miss", cs.last_miss);
  }
  r.print();
}

// ---------------- command line ----------------
void usage() {
  std::fprintf(stderr,
               "usage: bench_gpt [--config S|M|L] [--dtype fp32|bf16|all] [--mode eager|compiled|all] [--steps N]\n"
               "                 [--warmup N] [--device cpu|cuda] [--seed N] [--attn sdpa|manual] [--batches N]\n"
               "                 [--tie-weights] [--matmul-precision highest|high|medium] [--peak-flops F]\n"
               "                 [--batch B] [--seq T] [--d D] [--layers L] [--heads H] [--vocab V] [--mlp M]\n");
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string key = argv[i], val;
    bool has_val = false;
    if (const size_t eq = key.find('='); key.rfind("--", 0) == 0 && eq != std::string::npos) {
      val = key.substr(eq + 1);
      key = key.substr(0, eq);
      has_val = true;
    }
    auto value = [&]() -> std::string {
      if (has_val) return val;
      if (i + 1 >= argc) throw std::runtime_error("option " + key + " needs a value");
      return argv[++i];
    };
    auto int_value = [&]() -> int64_t {
      const std::string s = value();
      char* end = nullptr;
      const long long v = std::strtoll(s.c_str(), &end, 10);
      if (s.empty() || *end != '\0')
        throw std::runtime_error("option " + key + ": expected an integer, got '" + s + "'");
      return v;
    };
    if (key == "--config")
      o.config = value();
    else if (key == "--dtype")
      o.dtype = value();
    else if (key == "--mode")
      o.mode = value();
    else if (key == "--steps")
      o.steps = static_cast<int>(int_value());
    else if (key == "--warmup")
      o.warmup = static_cast<int>(int_value());
    else if (key == "--device")
      o.device = value();
    else if (key == "--seed")
      o.seed = static_cast<uint64_t>(int_value());
    else if (key == "--attn")
      o.attn = value();
    else if (key == "--batches")
      o.batches = static_cast<int>(int_value());
    else if (key == "--tie-weights")
      o.tie = true;
    else if (key == "--checkpoint")
      o.checkpoint = true;
    else if (key == "--no-graphs")
      o.graphs = false;
    else if (key == "--ddp")
      o.ddp = true;
    else if (key == "--fsdp")
      o.fsdp = o.ddp = true;  // (the same ranks and batches as --ddp)
    else if (key == "--tp")
      o.tp = o.ddp = true;  // (the same ranks; every rank the same batches)
    else if (key == "--matmul-precision")
      o.precision = value();
    else if (key == "--peak-flops")
      o.peak_flops = std::atof(value().c_str());
    else if (key == "--batch")
      o.batch = int_value();
    else if (key == "--seq")
      o.seq = int_value();
    else if (key == "--d")
      o.d = int_value();
    else if (key == "--layers")
      o.layers = int_value();
    else if (key == "--heads")
      o.heads = int_value();
    else if (key == "--vocab")
      o.vocab = int_value();
    else if (key == "--mlp")
      o.mlp = int_value();
    else if (key == "-h" || key == "--help") {
      usage();
      std::exit(0);
    } else {
      throw std::runtime_error("unknown option " + key);
    }
  }
  auto one_of = [](const std::string& v, std::initializer_list<const char*> allowed, const char* what) {
    for (const char* a : allowed)
      if (v == a) return;
    throw std::runtime_error(std::string("bad ") + what + " '" + v + "'");
  };
  one_of(o.dtype, {"fp32", "bf16", "all"}, "--dtype");
  one_of(o.mode, {"eager", "compiled", "all"}, "--mode");
  one_of(o.device, {"cpu", "cuda"}, "--device");
  one_of(o.attn, {"sdpa", "manual"}, "--attn");
  one_of(o.precision, {"highest", "high", "medium"}, "--matmul-precision");
  if (o.batches < 1) throw std::runtime_error("--batches must be >= 1");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  GptConfig c;
  try {
    o = parse(argc, argv);
    c = config_named(o.config);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpt: %s\n", e.what());
    usage();
    return 2;
  }
  if (o.batch > 0) c.batch = o.batch;
  if (o.seq > 0) c.block_size = o.seq;
  if (o.d > 0) c.n_embd = o.d;
  if (o.layers > 0) c.n_layer = o.layers;
  if (o.heads > 0) c.n_head = o.heads;
  if (o.vocab > 0) c.vocab = o.vocab;
  if (o.mlp > 0)
    c.mlp = o.mlp;
  else if (o.d > 0)
    c.mlp = 4 * c.n_embd;
  if (c.n_embd % c.n_head != 0) {
    std::fprintf(stderr, "bench_gpt: d_model %lld is not a multiple of n_head %lld\n", static_cast<long long>(c.n_embd),
                 static_cast<long long>(c.n_head));
    return 2;
  }
  // Defaults by size: enough timed steps for a stable median, warmup past compile and graph capture.
  if (o.steps < 0) o.steps = c.name == "L" ? 30 : c.name == "M" ? 100 : 200;
  if (o.warmup < 0) o.warmup = c.name == "L" ? 5 : c.name == "M" ? 10 : 20;
  if (o.steps < 1) o.steps = 1;

  const bool cuda = o.device == "cuda";
  if (cuda && !kiln::cuda::is_available()) {
    std::fprintf(stderr, "bench_gpt: no usable CUDA device\n");
    return 2;
  }
  kiln::Device dev = kiln::cpu();
  if (cuda) dev = kiln::cuda(0);
  if (o.ddp) {  // one process per GPU, started by kiln-run; each rank trains on its own batches
    kiln::dist::init_process_group();
    if (cuda) dev = kiln::cuda(kiln::dist::local_rank());
  }
  std::vector<std::string> dtypes =
      o.dtype == "all" ? std::vector<std::string>{"fp32", "bf16"} : std::vector<std::string>{o.dtype};
  std::vector<bool> modes;
  if (o.mode == "eager" || o.mode == "all") modes.push_back(false);
  if (o.mode == "compiled" || o.mode == "all") modes.push_back(true);

  int failures = 0;
  std::vector<Batch> data;
  try {
    kiln::set_float32_matmul_precision(o.precision);
    data = make_batches(c, o.seed + (o.ddp && !o.tp ? 1000 * kiln::dist::get_rank() : 0), o.batches, dev);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpt: setup: %s\n", e.what());
    return 1;
  }
  for (const std::string& dt : dtypes) {
    for (bool compiled : modes) {
      const std::string impl = compiled ? "kiln-compiled" : "kiln-eager";
      try {
        run_mode(o, c, dt, compiled, dev, data);
      } catch (const std::exception& e) {
        ++failures;
        std::fprintf(stderr, "bench_gpt: GPT-%s %s %s: %s\n", c.name.c_str(), dt.c_str(), impl.c_str(), e.what());
        head_row(o, c, dt, impl).str("error", e.what()).print();
        try {
          if (cuda) kiln::cuda::synchronize();
        } catch (const std::exception&) {
        }
      }
    }
  }
  if (o.ddp) kiln::dist::destroy_process_group();
  return failures ? 1 : 0;
}
