// LibTorch (CPU, eager) baselines for every workload.
#include <torch/torch.h>

#include <memory>

#include "baselines.h"

namespace bench::torchb {
namespace {
torch::Tensor from(const std::vector<float>& v, std::vector<int64_t> shape) {
  return torch::from_blob(const_cast<float*>(v.data()), shape, torch::kFloat32).clone();
}
std::vector<float> vec(const torch::Tensor& t) {
  torch::Tensor c = t.detach().contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}
}  // namespace

bool available() { return true; }

std::string info() {
  return "LibTorch " + std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH) + ", " + std::to_string(at::get_num_threads()) + " intra-op threads";
}

void set_threads(int n) { at::set_num_threads(n); }

Runner<W1Result> w1(const W1Data& d) {
  struct S {
    torch::Tensor p, v, g, p2, v2, e;
  };
  auto s = std::make_shared<S>();
  s->p = from(d.p, {d.n, 3});
  s->v = from(d.v, {d.n, 3});
  s->g = from(std::vector<float>(d.g, d.g + 3), {3});
  const double k = d.k, c = d.c, dt = d.dt;
  Runner<W1Result> r;
  r.step = [s, k, c, dt] {
    torch::Tensor a = s->g - k * s->p - c * s->v;
    s->v2 = s->v + dt * a;
    s->p2 = s->p + dt * s->v2;
    s->e = 0.5 * (s->v2 * s->v2).sum();
  };
  r.result = [s] { return W1Result{vec(s->p2), vec(s->v2), s->e.item<double>()}; };
  return r;
}

Runner<W2Result> w2(const W2Data& d) {
  struct S {
    torch::nn::Sequential net{nullptr};
    std::unique_ptr<torch::optim::Adam> opt;
    torch::Tensor x, y, loss;
  };
  auto s = std::make_shared<S>();
  const auto& dims = d.dims;
  s->net =
      torch::nn::Sequential(torch::nn::Linear(dims[0], dims[1]), torch::nn::Tanh(), torch::nn::Linear(dims[1], dims[2]),
                            torch::nn::Tanh(), torch::nn::Linear(dims[2], dims[3]));
  {
    torch::NoGradGuard ng;
    size_t l = 0;
    for (auto& m : s->net->children()) {
      if (auto* lin = m->as<torch::nn::Linear>()) {
        lin->weight.copy_(from(d.weights[l], {dims[l + 1], dims[l]}));
        lin->bias.copy_(from(d.biases[l], {dims[l + 1]}));
        ++l;
      }
    }
  }
  s->opt = std::make_unique<torch::optim::Adam>(s->net->parameters(), torch::optim::AdamOptions(d.lr));
  s->x = from(d.x, {d.batch, dims.front()});
  s->y = from(d.y, {d.batch, dims.back()});
  Runner<W2Result> r;
  r.step = [s] {
    s->net->zero_grad(/*set_to_none=*/true);
    torch::Tensor out = s->net->forward(s->x);
    s->loss = torch::mse_loss(out, s->y);
    s->loss.backward();
    s->opt->step();
  };
  r.result = [s] {
    W2Result res;
    for (auto& m : s->net->children())
      if (auto* lin = m->as<torch::nn::Linear>()) {
        auto w = vec(lin->weight), b = vec(lin->bias);
        res.params.insert(res.params.end(), w.begin(), w.end());
        res.params.insert(res.params.end(), b.begin(), b.end());
      }
    res.loss = s->loss.item<double>();
    return res;
  };
  return r;
}

namespace {
struct W3S {
  torch::Tensor x, w, b, gy, y, gx, gw, gb;
  int64_t cols;
  double eps;
};
std::shared_ptr<W3S> w3_state(const W3Data& d, bool grad) {
  auto s = std::make_shared<W3S>();
  s->x = from(d.x, {d.rows, d.cols}).requires_grad_(grad);
  s->w = from(d.w, {d.cols}).requires_grad_(grad);
  s->b = from(d.b, {d.cols}).requires_grad_(grad);
  s->gy = from(d.gy, {d.rows, d.cols});
  s->cols = d.cols;
  s->eps = d.eps;
  return s;
}
torch::Tensor w3_forward(const W3S& s) {
  return torch::softmax(torch::gelu(torch::layer_norm(s.x, {s.cols}, s.w, s.b, s.eps)), -1);
}
}  // namespace

Runner<W3Result> w3_fwd(const W3Data& d) {
  auto s = w3_state(d, false);
  Runner<W3Result> r;
  r.step = [s] { s->y = w3_forward(*s); };
  r.result = [s] {
    W3Result res;
    res.y = vec(s->y);
    return res;
  };
  return r;
}

Runner<W3Result> w3_fwdbwd(const W3Data& d) {
  auto s = w3_state(d, true);
  Runner<W3Result> r;
  r.step = [s] {
    s->y = w3_forward(*s);
    auto g = torch::autograd::grad({s->y}, {s->x, s->w, s->b}, {s->gy});
    s->gx = g[0];
    s->gw = g[1];
    s->gb = g[2];
  };
  r.result = [s] { return W3Result{vec(s->y), vec(s->gx), vec(s->gw), vec(s->gb)}; };
  return r;
}

Runner<W3Result> w5(const std::vector<float>& x) {
  struct S {
    torch::Tensor x, y;
  };
  auto s = std::make_shared<S>();
  s->x = from(x, {static_cast<int64_t>(x.size())});
  Runner<W3Result> r;
  r.step = [s] { s->y = torch::relu(2 * s->x + 1); };
  r.result = [s] {
    W3Result res;
    res.y = vec(s->y);
    return res;
  };
  return r;
}

}  // namespace bench::torchb
