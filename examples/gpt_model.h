// nanoGPT's GPT written with kiln's public nn API as a user would (kiln.h only): the model of
// the GPT benchmark (bench/bench_gpt.cpp) and of the data-parallel tests and examples.
//
// Token embedding + learned position embedding, n_layer pre-norm blocks [LayerNorm -> causal
// self-attention: one Linear d->3d, split into q, k, v, heads by view + transpose,
// scaled_dot_product_attention(is_causal) or (manual) softmax(q k^T / sqrt(hs) masked by a tril
// buffer) v, Linear d->d] and [LayerNorm -> Linear d->mlp, GELU (erf), Linear mlp->d], residuals,
// final LayerNorm, lm_head Linear d->vocab without bias (or tied to the token embedding).
// nanoGPT's init: Linear and Embedding weights N(0, 0.02), the c_proj weights
// N(0, 0.02/sqrt(2 n_layer)), biases 0. Configurations: S (d 64, 2 layers, 4 heads, T 64, batch
// 16, vocab 65, MLP 256), M (d 256, 4 layers, 8 heads, T 256, batch 32, vocab 65, MLP 1024), L
// (GPT-2 small: d 768, 12 layers, 12 heads, T 1024, batch 8, vocab 50304, MLP 3072).
#pragma once
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln.h"

namespace gpt {

using kiln::Tensor;
namespace nn = kiln::nn;

struct GptConfig {
  std::string name;
  int64_t n_embd = 64, n_layer = 2, n_head = 4, block_size = 64, batch = 16, vocab = 65, mlp = 256;
};

inline GptConfig config_named(const std::string& name) {
  GptConfig c;
  c.name = name;
  if (name == "S") {
    c.n_embd = 64, c.n_layer = 2, c.n_head = 4, c.block_size = 64, c.batch = 16, c.vocab = 65, c.mlp = 256;
  } else if (name == "M") {
    c.n_embd = 256, c.n_layer = 4, c.n_head = 8, c.block_size = 256, c.batch = 32, c.vocab = 65, c.mlp = 1024;
  } else if (name == "L") {
    c.n_embd = 768, c.n_layer = 12, c.n_head = 12, c.block_size = 1024, c.batch = 8, c.vocab = 50304, c.mlp = 3072;
  } else {
    throw std::runtime_error("unknown --config '" + name + "' (S, M or L)");
  }
  return c;
}


inline bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

class CausalSelfAttention : public nn::Module {
 public:
  CausalSelfAttention(const GptConfig& c, bool manual) : n_head_(c.n_head), n_embd_(c.n_embd), manual_(manual) {
    c_attn = register_module("c_attn", std::make_shared<nn::Linear>(c.n_embd, 3 * c.n_embd));
    c_proj = register_module("c_proj", std::make_shared<nn::Linear>(c.n_embd, c.n_embd));
    if (manual_) {
      // nanoGPT's causal mask buffer: tril(ones(T, T)) viewed as [1, 1, T, T].
      const int64_t T = c.block_size;
      mask_ = register_buffer("bias", kiln::ones({T, T}).tril().view({1, 1, T, T}));
    }
  }
  Tensor forward(const Tensor& x) override {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), hs = C / n_head_;
    std::vector<Tensor> qkv = c_attn->forward(x).split(n_embd_, 2);
    Tensor q = qkv[0].view({B, T, n_head_, hs}).transpose(1, 2);  // [B, nh, T, hs]
    Tensor k = qkv[1].view({B, T, n_head_, hs}).transpose(1, 2);
    Tensor v = qkv[2].view({B, T, n_head_, hs}).transpose(1, 2);
    Tensor y;
    if (manual_) {
      Tensor att = kiln::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hs)));
      att = att.masked_fill(mask_.narrow(2, 0, T).narrow(3, 0, T) == 0, -std::numeric_limits<double>::infinity());
      att = kiln::softmax(att, -1);
      y = kiln::matmul(att, v);
    } else {
      y = kiln::scaled_dot_product_attention(q, k, v, std::nullopt, /*is_causal=*/true);
    }
    y = y.transpose(1, 2).contiguous().view({B, T, C});
    return c_proj->forward(y);
  }
  std::shared_ptr<nn::Linear> c_attn, c_proj;

 private:
  int64_t n_head_, n_embd_;
  bool manual_;
  Tensor mask_;
};

class Mlp : public nn::Module {
 public:
  explicit Mlp(const GptConfig& c) {
    c_fc = register_module("c_fc", std::make_shared<nn::Linear>(c.n_embd, c.mlp));
    c_proj = register_module("c_proj", std::make_shared<nn::Linear>(c.mlp, c.n_embd));
  }
  Tensor forward(const Tensor& x) override { return c_proj->forward(kiln::gelu(c_fc->forward(x))); }
  std::shared_ptr<nn::Linear> c_fc, c_proj;
};

class Block : public nn::Module {
 public:
  Block(const GptConfig& c, bool manual) {
    ln_1 = register_module("ln_1", std::make_shared<nn::LayerNorm>(std::vector<int64_t>{c.n_embd}));
    attn = register_module("attn", std::make_shared<CausalSelfAttention>(c, manual));
    ln_2 = register_module("ln_2", std::make_shared<nn::LayerNorm>(std::vector<int64_t>{c.n_embd}));
    mlp = register_module("mlp", std::make_shared<Mlp>(c));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x + attn->forward(ln_1->forward(x));
    return h + mlp->forward(ln_2->forward(h));
  }
  std::shared_ptr<nn::LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<Mlp> mlp;
};

class Gpt : public nn::Module {
 public:
  Gpt(const GptConfig& c, bool manual_attention, bool tie) : tie_(tie) {
    wte = register_module("wte", std::make_shared<nn::Embedding>(c.vocab, c.n_embd));
    wpe = register_module("wpe", std::make_shared<nn::Embedding>(c.block_size, c.n_embd));
    h = register_module("h", std::make_shared<nn::ModuleList>());
    for (int64_t i = 0; i < c.n_layer; ++i) h->push_back(std::make_shared<Block>(c, manual_attention));
    ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(std::vector<int64_t>{c.n_embd}));
    if (!tie_) lm_head = register_module("lm_head", std::make_shared<nn::Linear>(c.n_embd, c.vocab, /*bias=*/false));
    // nanoGPT's _init_weights, then the scaled init of the residual projections.
    const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer));
    // (LayerNorm weights stay 1 and their biases 0, as in nanoGPT.)
    for (auto& np : named_parameters()) {
      Tensor& p = np.second;
      if (p.dim() >= 2)
        nn::normal_(p, 0.0, ends_with(np.first, "c_proj.weight") ? proj_std : 0.02);
      else if (ends_with(np.first, ".bias"))
        nn::constant_(p, 0.0);
    }
  }
  // idx [B, T] int64 -> logits [B, T, vocab].
  Tensor forward(const Tensor& idx) override {
    const int64_t T = idx.size(1);
    Tensor pos = kiln::arange(0, T, 1, kiln::kInt64, idx.device());
    Tensor x = wte->forward(idx) + wpe->forward(pos);
    for (const auto& block : *h)
      x = checkpoint_blocks ? kiln::checkpoint([&](const std::vector<Tensor>& in) { return block->forward(in[0]); }, {x})
                            : block->forward(x);
    x = ln_f->forward(x);
    return tie_ ? kiln::linear(x, wte->weight) : lm_head->forward(x);
  }
  // Each block under kiln::checkpoint (its activations recomputed in the backward).
  bool checkpoint_blocks = false;
  std::shared_ptr<nn::Embedding> wte, wpe;
  std::shared_ptr<nn::ModuleList> h;
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::Linear> lm_head;

 private:
  bool tie_;
};

}  // namespace gpt
