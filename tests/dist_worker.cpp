// One rank of the multi-process tests (tests/test_dist.cpp starts N of these, or kiln-run does):
// `dist_worker SCENARIO`. Each scenario joins the process group from the environment, checks
// its results against what a single process computes from every rank's inputs, prints "ok" and
// exits 0; any mismatch prints what differed and exits 1.
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <functional>
#include <iostream>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "examples/gpt_model.h"
#include "dist_worker_common.h"
#include "kiln.h"
#include "runtime/dtensor/dtensor.h"
#include "runtime/parallel/data_parallel.h"
#include "runtime/parallel/tensor_parallel.h"
#include "torch_programs.h"

using namespace kiln;
namespace dist = kiln::dist;

namespace {

using kiln::testing::fail;
Device device() { return kiln::testing::test_device(); }
// A two-layer GPT of 4 heads over 16 positions, batch 4, of the given width, vocabulary and MLP.
gpt::GptConfig tiny_gpt(int64_t n_embd, int64_t vocab, int64_t mlp) {
  gpt::GptConfig c;
  c.n_embd = n_embd, c.n_layer = 2, c.n_head = 4, c.block_size = 16, c.batch = 4, c.vocab = vocab, c.mlp = mlp;
  return c;
}
// A device mesh of `shape` (dims named `names`) over this run's device type.
dist::DeviceMesh test_mesh(std::vector<int64_t> shape, std::vector<std::string> names = {}) {
  return dist::init_device_mesh(device().type == DeviceType::CPU ? "cpu" : "cuda", std::move(shape), std::move(names));
}
void init() { kiln::testing::init_from_env(); }

// Rank r's input of `n` elements: small integers (sums, products and means of a few ranks are
// exact in every dtype, so results compare bit for bit).
std::vector<double> input_values(int r, int64_t n, DType dt, int salt) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int64_t x = (r * 7 + i * 3 + salt) % 5 - 2;  // -2..2
    if (dt == kBool) x = (r + i + salt) % 3 == 0;
    v[static_cast<size_t>(i)] = static_cast<double>(x);
  }
  return v;
}

Tensor make(const std::vector<double>& v, DType dt) {
  // Built lazily (a pending producer the collective must compute first).
  Tensor t = from_vector(v, std::vector<int64_t>{static_cast<int64_t>(v.size())}).to(device());
  return (t * 1.0).to(dt);
}

std::vector<double> values(const Tensor& t) { return t.cpu().to(kFloat64).reshape({-1}).to_vector<double>(); }

void expect_equal(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  EXPECT(got.size() == want.size(), what, ": ", got.size(), " elements, expected ", want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i])), what, ": element ", i, " is ", got[i],
           ", expected ", want[i]);
}

std::vector<double> reduce_all(int size, int64_t n, DType dt, int salt, dist::ReduceOp op) {
  std::vector<double> acc = input_values(0, n, dt, salt);
  for (int r = 1; r < size; ++r) {
    auto v = input_values(r, n, dt, salt);
    for (size_t i = 0; i < acc.size(); ++i) {
      switch (op) {
        case dist::ReduceOp::Sum:
        case dist::ReduceOp::Avg: acc[i] = dt == kBool ? (acc[i] || v[i]) : acc[i] + v[i]; break;
        case dist::ReduceOp::Product: acc[i] = dt == kBool ? (acc[i] && v[i]) : acc[i] * v[i]; break;
        case dist::ReduceOp::Min: acc[i] = std::min(acc[i], v[i]); break;
        case dist::ReduceOp::Max: acc[i] = std::max(acc[i], v[i]); break;
      }
    }
  }
  if (op == dist::ReduceOp::Avg)
    for (auto& x : acc) x /= size;
  return acc;
}

// Every collective x dtype x size against the single-process result.
void collectives() {
  init();
  const int rank = dist::get_rank(), size = dist::get_world_size();
  const std::vector<DType> dtypes = {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kBool};
  int salt = 0;
  for (DType dt : dtypes)
    for (int64_t n : {0, 1, 7, 1000}) {
      ++salt;
      const std::string tag = kiln::detail::cat(dtype_name(dt), " n=", n);
      for (auto op : {dist::ReduceOp::Sum, dist::ReduceOp::Avg, dist::ReduceOp::Product, dist::ReduceOp::Min,
                      dist::ReduceOp::Max}) {
        if (op == dist::ReduceOp::Avg && !is_floating(dt)) continue;
        Tensor t = make(input_values(rank, n, dt, salt), dt);
        dist::all_reduce(t, op);
        EXPECT(t.dtype() == dt, "all_reduce changed the dtype");
        expect_equal(values(t), reduce_all(size, n, dt, salt, op),
                     "all_reduce " + std::string(dist::reduce_op_name(op)) + " " + tag);
      }
      for (int src = 0; src < size; ++src) {
        Tensor t = make(input_values(rank, n, dt, salt + src), dt);
        dist::broadcast(t, src);
        expect_equal(values(t), input_values(src, n, dt, salt + src), "broadcast " + tag);
      }
      // all_gather (one tensor, and a list)
      std::vector<double> gathered;
      for (int r = 0; r < size; ++r) {
        auto v = input_values(r, n, dt, salt);
        gathered.insert(gathered.end(), v.begin(), v.end());
      }
      Tensor in = make(input_values(rank, n, dt, salt), dt);
      Tensor out = zeros({size, n}, dt).to(device());
      dist::all_gather_into_tensor(out, in);
      expect_equal(values(out), gathered, "all_gather_into_tensor " + tag);
      std::vector<Tensor> list;
      dist::all_gather(list, in);
      EXPECT(static_cast<int>(list.size()) == size, "all_gather list size");
      for (int r = 0; r < size; ++r) expect_equal(values(list[r]), input_values(r, n, dt, salt), "all_gather " + tag);
      // reduce_scatter: rank r keeps block r of the sum of every rank's [size * n] input
      if (dt != kBool) {
        Tensor big = make(input_values(rank, n * size, dt, salt), dt);
        Tensor mine = zeros({n}, dt).to(device());
        dist::reduce_scatter_tensor(mine, big, dist::ReduceOp::Sum);
        auto all = reduce_all(size, n * size, dt, salt, dist::ReduceOp::Sum);
        expect_equal(values(mine), std::vector<double>(all.begin() + rank * n, all.begin() + (rank + 1) * n),
                     "reduce_scatter " + tag);
      }
    }
  // all_to_all, equal and uneven (rank r sends (r + q) % 3 rows of 2 to rank q; empty blocks too)
  for (bool uneven : {false, true}) {
    auto rows_to = [&](int from, int to) -> int64_t { return uneven ? (from + to) % 3 : 2; };
    std::vector<int64_t> in_splits, out_splits;
    std::vector<double> in_vals, want;
    for (int q = 0; q < size; ++q) {
      in_splits.push_back(rows_to(rank, q));
      out_splits.push_back(rows_to(q, rank));
      for (int64_t k = 0; k < rows_to(rank, q) * 2; ++k) in_vals.push_back(rank * 1000 + q * 100 + k);
      for (int64_t k = 0; k < rows_to(q, rank) * 2; ++k) want.push_back(q * 1000 + rank * 100 + k);
    }
    const int64_t in_rows = std::accumulate(in_splits.begin(), in_splits.end(), int64_t{0});
    const int64_t out_rows = std::accumulate(out_splits.begin(), out_splits.end(), int64_t{0});
    Tensor in = from_vector(in_vals, std::vector<int64_t>{in_rows, 2}).to(device());
    Tensor out = zeros({out_rows, 2}, kFloat64).to(device());
    if (uneven)
      dist::all_to_all_single(out, in, out_splits, in_splits);
    else
      dist::all_to_all_single(out, in);
    expect_equal(values(out), want, uneven ? "all_to_all uneven" : "all_to_all equal");
  }
  // send / recv around the ring
  {
    Tensor mine = full({3}, static_cast<double>(rank)).to(device());
    Tensor got = zeros({3}).to(device());
    const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    if (rank % 2 == 0) {
      dist::send(mine, next).wait();
      dist::recv(got, prev);
    } else {
      dist::recv(got, prev);
      dist::send(mine, next).wait();
    }
    expect_equal(values(got), std::vector<double>(3, prev), "send/recv");
  }
  // async: the tensor holds the result after wait()
  {
    Tensor t = full({4}, static_cast<double>(rank + 1)).to(device());
    dist::Work w = dist::all_reduce(t, dist::ReduceOp::Sum, {}, true);
    w.wait();
    EXPECT(w.is_completed(), "work not completed after wait");
    expect_equal(values(t), std::vector<double>(4, size * (size + 1) / 2.0), "async all_reduce");
  }
  dist::barrier();
  dist::destroy_process_group();
}

// Sub-groups, color splits and a device mesh.
void groups() {
  init();
  const int rank = dist::get_rank(), size = dist::get_world_size();
  // new_group of the even ranks: every rank calls it.
  std::vector<int> evens;
  for (int r = 0; r < size; r += 2) evens.push_back(r);
  dist::ProcessGroup g = dist::new_group(evens);
  EXPECT(g.is_member() == (rank % 2 == 0), "membership");
  if (g.is_member()) {
    Tensor t = full({2}, static_cast<double>(rank)).to(device());
    dist::all_reduce(t, dist::ReduceOp::Sum, g);
    double want = 0;
    for (int r : evens) want += r;
    expect_equal(values(t), {want, want}, "new_group all_reduce");
  }
  // split by color: odd and even ranks, ordered by descending key
  dist::ProcessGroup s = dist::split_group(rank % 2, -rank);
  EXPECT(s.size() == (size + 1 - rank % 2) / 2, "split size ", s.size());
  EXPECT(s.ranks().front() > s.ranks().back() || s.size() == 1, "split order by key");
  Tensor t = full({1}, static_cast<double>(rank)).to(device());
  dist::all_reduce(t, dist::ReduceOp::Max, s);
  expect_equal(values(t), {static_cast<double>(s.ranks().front())}, "split_group all_reduce max");
  // A 2-d mesh when the world has 4 ranks (2 x 2), else 1-d.
  std::vector<int64_t> shape = size == 4 ? std::vector<int64_t>{2, 2} : std::vector<int64_t>{size};
  std::vector<std::string> names = size == 4 ? std::vector<std::string>{"dp", "tp"} : std::vector<std::string>{"dp"};
  dist::DeviceMesh mesh = test_mesh(shape, names);
  for (int64_t d = 0; d < mesh.ndim(); ++d) {
    dist::ProcessGroup pg = mesh.get_group(d);
    EXPECT(pg.size() == shape[d], "mesh group size");
    EXPECT(mesh.get_local_rank(d) == mesh.coordinate()[d], "mesh local rank vs coordinate");
    Tensor x = full({1}, static_cast<double>(rank)).to(device());
    dist::all_reduce(x, dist::ReduceOp::Sum, pg);
    double want = 0;
    for (int r : pg.ranks()) want += r;
    expect_equal(values(x), {want}, "mesh dim " + std::to_string(d));
  }
  if (size == 4) {
    EXPECT(mesh.get_group("tp").ranks() == (rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3}), "tp group");
    EXPECT(mesh.get_group("dp").ranks() == (rank % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3}),
           "dp group");
  }
  dist::destroy_process_group();
}

// Functional collectives: lazy, differentiable, and traced by kiln::compile.
void functional() {
  init();
  const int rank = dist::get_rank(), size = dist::get_world_size();
  Tensor x = (arange(0, 6).to(kFloat64) + rank).reshape({2, 3}).to(device()).requires_grad_();
  // loss on each rank: sum(all_reduce(x) * w_r); d loss_total / dx_r = sum over ranks of w_q
  Tensor w = full({2, 3}, static_cast<double>(rank + 1)).to(kFloat64).to(device());
  Tensor y = dist::functional::all_reduce(x * 2, dist::ReduceOp::Sum);
  (y * w).sum().backward();
  const double wsum = size * (size + 1) / 2.0;
  expect_equal(values(x.grad()), std::vector<double>(6, 2 * wsum), "all_reduce backward");
  // all_gather along dim 1, reduce_scatter along dim 1
  Tensor g = dist::functional::all_gather(x.detach(), 1);
  EXPECT(g.size(1) == 3 * size, "all_gather dim 1 size");
  std::vector<double> want;
  for (int i = 0; i < 2; ++i)
    for (int r = 0; r < size; ++r)
      for (int j = 0; j < 3; ++j) want.push_back(i * 3 + j + r);
  expect_equal(values(g), want, "all_gather dim 1");
  Tensor rs = dist::functional::reduce_scatter(g, dist::ReduceOp::Sum, 1);
  std::vector<double> want_rs;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) want_rs.push_back(size * (i * 3 + j + rank));
  expect_equal(values(rs), want_rs, "reduce_scatter dim 1");
  // compiled: the collective is a node of the traced graph; two calls, same bits as eager
  auto fn = [](const Tensor& a) {
    Tensor s = dist::functional::all_reduce(a.exp() * 0.5, dist::ReduceOp::Avg);
    return s.tanh() + dist::functional::all_gather(a, 0).sum(0);
  };
  auto compiled = kiln::compile(fn);
  Tensor a = (arange(0, 8).to(kFloat32) * 0.1 + rank).reshape({2, 4}).to(device());
  Tensor eager = fn(a);
  for (int k = 0; k < 2; ++k) {
    Tensor c = compiled(a);
    expect_equal(values(c), values(eager), "compiled call " + std::to_string(k));
  }
  dist::destroy_process_group();
}

// A rank that dies: the others get a kiln::Error naming it within the timeout, and can still
// compute on their own. On the CPU the failed collective raises and leaves its tensor as it was;
// on CUDA (NCCL runs asynchronously) the watchdog aborts the communicator after the timeout and
// the error surfaces at the next collective, wait or barrier.
void rank_dies() {
  init();
  const int rank = dist::get_rank();
  Tensor t = full({4}, 1.0).to(device());
  dist::all_reduce(t);  // everyone alive
  if (rank == 1) {
    std::cout << "rank 1 exits" << std::endl;
    kill(getpid(), SIGKILL);
  }
  Tensor u;
  bool raised_at_the_collective = false;
  try {
    try {
      // (NCCL: the check of the last collective, run off its path, may find rank 1 gone first;
      // it is raised at this rank's next host read of the device, wherever that is)
      u = full({4}, 5.0).to(device());
      u.sum().item<double>();
      dist::all_reduce(u);
    } catch (const Error&) {
      raised_at_the_collective = true;
      throw;
    }
    dist::barrier();
    fail("collectives with a dead rank returned");
  } catch (const Error& e) {
    const std::string m = e.what();
    std::cout << "error: " << m << std::endl;
    // (NCCL: raised at the barrier's host wait, naming the all_reduce the dead rank never joined)
    EXPECT(m.find("all_reduce") != std::string::npos || (!raised_at_the_collective && m.find("barrier") != std::string::npos),
           "message names the collective: ", m);
    EXPECT(m.find("rank 1") != std::string::npos, "message names the dead rank: ", m);
  }
  if (device().type == DeviceType::CPU) {
    EXPECT(raised_at_the_collective, "Gloo raises at the collective itself");
    expect_equal(values(u), std::vector<double>(4, 5.0), "input after the failed collective");
  }
  Tensor v = full({4}, 5.0).to(device());
  expect_equal(values((v * 2).sum({})), {40.0}, "single-device work after the failure");
  std::cout << "ok" << std::endl;
  std::_Exit(0);  // (the group is broken: no destroy, no static destructors waiting on it)
}

// Ranks pass different sizes: each gets an Error saying the ranks disagree (on the CPU at the
// collective, its tensor unchanged; on CUDA, checked off the collective's path, at the next
// barrier at the latest).
void mismatch() {
  init();
  const int rank = dist::get_rank();
  Tensor t = ones({4 + rank}).to(device());
  try {
    dist::all_reduce(t);
    dist::barrier();
    fail("mismatched all_reduce returned");
  } catch (const Error& e) {
    const std::string m = e.what();
    std::cout << "error: " << m << std::endl;
    EXPECT(m.find("disagree") != std::string::npos, "message says the ranks disagree: ", m);
  }
  if (device().type == DeviceType::CPU) expect_equal(values(t), std::vector<double>(4 + rank, 1.0), "input after the failed collective");
  std::cout << "ok" << std::endl;
  std::_Exit(0);  // (the group is broken: no destroy)
}

// WORLD_SIZE ranks are expected, fewer started: init fails naming the missing ones.
void never_joins() {
  try {
    init();
    fail("init_process_group returned without every rank");
  } catch (const Error& e) {
    const std::string m = e.what();
    std::cout << "error: " << m << std::endl;
    EXPECT(m.find("did not join") != std::string::npos && m.find("rank") != std::string::npos,
           "message names the missing rank: ", m);
  }
}

// Bad input: clear errors, nothing changed.
void bad_input() {
  init();
  Tensor i = ones({3}, kInt32).to(device());
  bool threw = false;
  try {
    dist::all_reduce(i, dist::ReduceOp::Avg);
  } catch (const Error& e) {
    threw = std::string(e.what()).find("floating") != std::string::npos;
  }
  EXPECT(threw, "Avg on int32 is refused");
  threw = false;
  try {
    Tensor t = ones({3}).to(device());
    dist::broadcast(t, 7);
  } catch (const Error& e) {
    threw = std::string(e.what()).find("out of range") != std::string::npos;
  }
  EXPECT(threw, "broadcast from a rank out of range is refused");
  threw = false;
  try {
    Tensor out = zeros({5}).to(device()), in = ones({3}).to(device());
    dist::all_gather_into_tensor(out, in);
  } catch (const Error& e) {
    threw = std::string(e.what()).find("expected") != std::string::npos;
  }
  EXPECT(threw, "all_gather_into_tensor with a wrong output size is refused");
  dist::barrier();
  dist::destroy_process_group();
}


// A two-layer MLP with a second head that a rank may skip (unused parameters).
class TwoHead : public nn::Module {
 public:
  TwoHead() {
    a = register_module("a", std::make_shared<nn::Linear>(8, 16));
    b = register_module("b", std::make_shared<nn::Linear>(16, 4));
    c = register_module("c", std::make_shared<nn::Linear>(16, 4));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = a->forward(x).tanh();
    return use_c ? b->forward(h) + c->forward(h) : b->forward(h);
  }
  std::shared_ptr<nn::Linear> a, b, c;
  bool use_c = true;
};

void copy_params(nn::Module& from, nn::Module& to) {
  NoGradGuard ng;
  auto a = from.parameters(), b = to.parameters();
  for (size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
}

double max_diff(nn::Module& x, nn::Module& y) {
  auto a = x.parameters(), b = y.parameters();
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, (a[i] - b[i]).abs().amax({}).cpu().item<double>());
  return m;
}

// DDP of an MLP for 20 steps equals one process training on the concatenated batch: eager,
// with gradient accumulation under no_sync, with a head rank 1 skips (find_unused_parameters),
// and with the whole step compiled. Parameters agree within 2e-5 (float32, SGD with momentum).
void ddp_mlp() {
  init();
  const int rank = dist::get_rank(), size = dist::get_world_size();
  const std::string mode = std::getenv("KILN_TEST_DDP_MODE") ? std::getenv("KILN_TEST_DDP_MODE") : "eager";
  const bool unused = mode == "unused";
  manual_seed(1234 + rank);  // different inits: DDP must broadcast rank 0's
  auto model = std::make_shared<TwoHead>();
  model->to(device());
  nn::DistributedDataParallelOptions o;
  o.find_unused_parameters = unused;
  o.bucket_cap_mb = 0.0002;  // several buckets (~200 bytes)
  auto ddp = std::make_shared<nn::DistributedDataParallel>(model, o);
  EXPECT(ddp->bucket_indices().size() > 1, "expected several buckets");
  TwoHead ref;
  ref.to(device());
  copy_params(*model, ref);
  optim::SGD opt(model->parameters(), optim::SGDOptions{0.05, 0.9});
  optim::SGD opt_ref(ref.parameters(), optim::SGDOptions{0.05, 0.9});
  const int64_t B = 6;
  manual_seed(99);
  Tensor X = randn({B * size, 8}).to(device()), Y = randn({B * size, 4}).to(device());
  Tensor x = X.narrow(0, rank * B, B), y = Y.narrow(0, rank * B, B);
  if (unused) model->use_c = rank != 1;
  auto step = [&](const Tensor& xb, const Tensor& yb) {
    opt.zero_grad();
    Tensor loss = mse_loss((*ddp)(xb), yb);
    loss.backward();
    opt.step();
    return loss.detach();
  };
  auto compiled = kiln::compile(step);
  for (int it = 0; it < 20; ++it) {
    if (mode == "accumulate") {
      opt.zero_grad();
      {
        auto guard = ddp->no_sync();
        (mse_loss((*ddp)(x.narrow(0, 0, B / 2)), y.narrow(0, 0, B / 2)) * 0.5).backward();
      }
      (mse_loss((*ddp)(x.narrow(0, B / 2, B / 2)), y.narrow(0, B / 2, B / 2)) * 0.5).backward();
      opt.step();
    } else if (mode == "compiled" && it > 0) {  // (step 0 eager: SGD makes its momentum there)
      compiled(x, y);
    } else {
      step(x, y);
    }
    // The reference: the mean of every rank's loss, on one process.
    opt_ref.zero_grad();
    Tensor total = zeros({}).to(device());
    for (int r = 0; r < size; ++r) {
      ref.use_c = !(unused && r == 1);
      total = total + mse_loss(ref.forward(X.narrow(0, r * B, B)), Y.narrow(0, r * B, B));
    }
    (total / static_cast<double>(size)).backward();
    opt_ref.step();
    const double d = max_diff(*model, ref);
    EXPECT(d < 2e-5, "step ", it, " (", mode, "): parameters differ from one process by ", d);
  }
  if (unused && rank == 1) EXPECT(model->c->weight.grad().defined(), "rank 1 gets rank 0's average for c");
  dist::destroy_process_group();
}

// DDP of a small GPT (AdamW, as nanoGPT) for 20 steps equals one process on the concatenated
// batch: eager or compiled (KILN_TEST_DDP_MODE), parameters within 1e-4.
void ddp_gpt() {
  init();
  const int rank = dist::get_rank(), size = dist::get_world_size();
  const std::string mode = std::getenv("KILN_TEST_DDP_MODE") ? std::getenv("KILN_TEST_DDP_MODE") : "eager";
  gpt::GptConfig c;
  c.n_embd = 32, c.n_layer = 2, c.n_head = 2, c.block_size = 16, c.batch = 4, c.vocab = 65, c.mlp = 64;
  manual_seed(7);
  auto model = std::make_shared<gpt::Gpt>(c, false, false);
  model->to(device());
  auto ddp = std::make_shared<nn::DistributedDataParallel>(model);
  manual_seed(7);
  gpt::Gpt ref(c, false, false);
  ref.to(device());
  copy_params(*model, ref);
  optim::AdamOptions ao;
  ao.lr = 3e-3;
  ao.weight_decay = 0.1;
  optim::AdamW opt(model->parameters(), ao), opt_ref(ref.parameters(), ao);
  manual_seed(11);
  Tensor X = randint(0, c.vocab, {c.batch * size, c.block_size}).to(device());
  Tensor Y = randint(0, c.vocab, {c.batch * size, c.block_size}).to(device());
  Tensor x = X.narrow(0, rank * c.batch, c.batch), y = Y.narrow(0, rank * c.batch, c.batch);
  auto loss_of = [&](nn::Module& m, const Tensor& xb, const Tensor& yb) {
    return cross_entropy(m.forward(xb).reshape({-1, c.vocab}), yb.reshape({-1}));
  };
  auto step = [&](const Tensor& xb, const Tensor& yb) {
    opt.zero_grad();
    Tensor loss = loss_of(*ddp, xb, yb);
    loss.backward();
    optim::clip_grad_norm_(model->parameters(), 1.0);
    opt.step();
    return loss.detach();
  };
  auto compiled = kiln::compile(step);
  for (int it = 0; it < 20; ++it) {
    Tensor loss = mode == "compiled" ? compiled(x, y) : step(x, y);
    opt_ref.zero_grad();
    Tensor ref_loss = loss_of(ref, X, Y);
    ref_loss.backward();
    optim::clip_grad_norm_(ref.parameters(), 1.0);
    opt_ref.step();
    const double d = max_diff(*model, ref);
    EXPECT(d < 1e-4, "step ", it, " (", mode, "): parameters differ from one process by ", d);
  }
  dist::destroy_process_group();
}

// DTensor: every placement -> placement transition on a 1-d mesh (and a 2 x 2 mesh with 4
// ranks), uneven and empty pieces, against the full tensor every rank knows; values are small
// integers, so results compare exactly. Gradients follow DTensor's rules.
void dtensor() {
  init();
  const int rank = dist::get_rank(), size = dist::get_world_size();
  std::vector<std::vector<int64_t>> mesh_shapes = {{size}};
  if (size == 4) mesh_shapes.push_back({2, 2});
  for (const auto& ms : mesh_shapes) {
    dist::DeviceMesh mesh = test_mesh(ms);
    // Placements of one mesh dim, and all combinations over the mesh's dims.
    const std::vector<dist::Placement> one = {dist::Replicate(), dist::Shard(0), dist::Shard(1), dist::Partial()};
    std::vector<std::vector<dist::Placement>> all = {{}};
    for (size_t d = 0; d < ms.size(); ++d) {
      std::vector<std::vector<dist::Placement>> next;
      for (auto& p : all)
        for (auto& q : one) {
          auto r = p;
          r.push_back(q);
          next.push_back(r);
        }
      all = next;
    }
    // Uneven pieces, a dim smaller than the mesh (empty pieces), an empty tensor, even pieces; on
    // the 2-d mesh (256 transitions a shape) the uneven and the empty ones.
    std::vector<std::vector<int64_t>> shapes = {{5, 7}, {1, 3}, {0, 4}, {8, 2}};
    if (ms.size() > 1) shapes = {{5, 7}, {1, 3}};
    for (const std::vector<int64_t>& shape : shapes) {
      const int64_t n = shape[0] * shape[1];
      std::vector<double> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<double>((i * 7) % 11 - 5);
      Tensor full = from_vector(v, shape).to(device());
      for (const auto& src : all)
        for (const auto& dst : all) {
          auto name = [&] {
            auto dims = [](const std::vector<int64_t>& v) {
              std::string r = "[";
              for (size_t i = 0; i < v.size(); ++i) r += (i ? ", " : "") + std::to_string(v[i]);
              return r + "]";
            };
            std::string s = dims(shape) + " mesh " + dims(ms) + ": ";
            for (auto& p : src) s += p.str() + " ";
            s += "->";
            for (auto& p : dst) s += " " + p.str();
            return s;
          };
          // The source: shards of `full`; a Partial mesh dim holds the value on its coordinate 0.
          std::vector<dist::Placement> src_no_partial = src;
          for (auto& p : src_no_partial)
            if (p.is_partial()) p = dist::Replicate();
          Tensor local = dist::distribute_tensor(full, mesh, src_no_partial).to_local();
          for (size_t d = 0; d < src.size(); ++d)
            if (src[d].is_partial() && mesh.coordinate()[d] != 0) local = zeros_like(local);
          dist::DTensor x = dist::DTensor::from_local(local, mesh, src, shape);
          dist::DTensor y = x.redistribute(dst);
          EXPECT(y.sizes() == shape, name(), ": global shape");
          EXPECT(y.to_local().sizes() == dist::DTensor::local_shape(shape, y.placements(), mesh, mesh.coordinate()),
                 name(), ": local shape");
          expect_equal(values(y.full_tensor()), v, name());
          bool has_partial = false;
          for (auto& p : dst) has_partial |= p.is_partial();
          if (!has_partial) {
            std::vector<dist::Placement> dst_copy = dst;
            expect_equal(values(y.to_local()), values(dist::distribute_tensor(full, mesh, dst_copy).to_local()),
                         name() + " (local piece)");
          }
        }
    }
  }
  // Gradients: Shard(0) -> Replicate, a loss every rank computes alike; the shard's gradient is
  // its rows of the weights (not size times them, as a sum over ranks would give).
  dist::DeviceMesh mesh = test_mesh({size});
  Tensor W = (arange(0, 7 * 3).to(kFloat64).reshape({7, 3}) * 0.5).to(device());
  const dist::ChunkRange mine = dist::chunk_range(7, size, rank);
  Tensor local = zeros({mine.length, 3}, kFloat64).to(device()).requires_grad_();
  dist::DTensor x = dist::DTensor::from_local(local, mesh, {dist::Shard(0)}, std::vector<int64_t>{7, 3});
  (x.full_tensor() * W).sum({}).backward();
  expect_equal(values(local.grad()), values(W.narrow(0, mine.start, mine.length)), "S(0) -> R backward");
  // Partial -> Replicate: the gradient comes back replicated.
  Tensor p = ones({2, 2}, kFloat64).to(device()).requires_grad_();
  dist::DTensor px = dist::DTensor::from_local(p, mesh, {dist::Partial()});
  (px.full_tensor() * 3.0).sum({}).backward();
  expect_equal(values(p.grad()), std::vector<double>(4, 3.0), "P -> R backward");
  // Random numbers on a DTensor are the numbers the whole tensor gets (dropout's mask included).
  {
    Tensor whole = ones({7, 5}, kFloat32).to(device());
    manual_seed(9);
    const std::vector<double> want = values(dropout(whole, 0.5, true) + rand_like(whole));
    manual_seed(9);
    dist::DTensor d = dist::distribute_tensor(whole, mesh, {dist::Shard(0)});
    Tensor r = dropout(d, 0.5, true) + rand_like(d);
    EXPECT(dist::is_dtensor(r), "dropout of a DTensor is a DTensor");
    expect_equal(values(dist::DTensor(r).full_tensor()), want, "dropout and rand_like of a DTensor");
  }
  // Bad input.
  bool threw = false;
  try {
    dist::DTensor::from_local(ones({3, 3}).to(device()), mesh, {dist::Shard(0)}, std::vector<int64_t>{7, 3});
  } catch (const Error& e) {
    threw = std::string(e.what()).find("shard") != std::string::npos;
  }
  EXPECT(threw || mine.length == 3, "a wrong local shape is refused");
  dist::destroy_process_group();
}

// The GPT (tiny config) trained for 6 steps with each kind of DTensor parallelism equals one
// process training on the same batch: tensor parallel (attention and MLP Linears colwise /
// rowwise), sequence parallel on top (LayerNorms cut along the sequence, row-wise outputs
// reduce-scattered to it), fully sharded (every parameter Shard(0), the batch cut over ranks),
// Losses and parameters agree within 1e-4 (float32, AdamW, gradient clipping).
void dtensor_gpt() {
  init();
  const int size = dist::get_world_size();
  const gpt::GptConfig c = tiny_gpt(32, 65, 64);
  dist::DeviceMesh mesh = test_mesh({size});
  const std::vector<std::pair<std::string, dist::ParallelStyle>> tp = {
      {"h.*.attn.c_attn", dist::ColwiseParallel()}, {"h.*.attn.c_proj", dist::RowwiseParallel()},
      {"h.*.mlp.c_fc", dist::ColwiseParallel()},    {"h.*.mlp.c_proj", dist::RowwiseParallel()}};
  const std::vector<std::pair<std::string, dist::ParallelStyle>> sp = {
      {"h.*.ln_1", dist::SequenceParallel()},
      {"h.*.ln_2", dist::SequenceParallel()},
      {"h.*.attn.c_attn", dist::ColwiseParallel()},
      {"h.*.attn.c_proj", dist::RowwiseParallel(dist::Shard(-1), dist::Shard(1))},
      {"h.*.mlp.c_fc", dist::ColwiseParallel()},
      {"h.*.mlp.c_proj", dist::RowwiseParallel(dist::Shard(-1), dist::Shard(1))}};
  // Vocabulary parallel on top of tensor parallel: the token embedding's rows and the head's
  // outputs cut over the vocabulary, the loss computed on vocabulary-cut logits.
  std::vector<std::pair<std::string, dist::ParallelStyle>> vocab = tp;
  vocab.push_back({"wte", dist::RowwiseParallel()});
  vocab.push_back({"lm_head", dist::ColwiseParallel(dist::Replicate(), dist::Shard(-1))});
  std::vector<std::string> modes = {"tensor", "vocab", "sequence", "fully_sharded"};
  if (size == 4) modes.push_back("2d");  // fully sharded over "dp" x tensor parallel over "tp" (2 x 2)
  dist::DeviceMesh mesh2;
  if (size == 4) mesh2 = test_mesh({2, 2}, {"dp", "tp"});
  for (const std::string& mode : modes) {
    manual_seed(7);
    auto model = std::make_shared<gpt::Gpt>(c, false, false);
    model->to(device());
    manual_seed(7);
    gpt::Gpt ref(c, false, false);
    ref.to(device());
    copy_params(*model, ref);
    if (mode == "tensor") dist::parallelize_module(*model, mesh, tp);
    if (mode == "vocab") dist::parallelize_module(*model, mesh, vocab);
    if (mode == "sequence") dist::parallelize_module(*model, mesh, sp);
    if (mode == "fully_sharded") dist::fully_shard(*model, mesh);
    if (mode == "2d") {
      dist::parallelize_module(*model, mesh2, tp, 1);
      dist::fully_shard(*model, mesh2, 0);
    }
    for (const Tensor& p : model->parameters())
      EXPECT(dist::is_dtensor(p) || (mode != "fully_sharded" && mode != "2d"), mode, ": a parameter is not a DTensor");
    optim::AdamOptions ao;
    ao.lr = 3e-3;
    ao.weight_decay = 0.1;
    optim::AdamW opt(model->parameters(), ao), opt_ref(ref.parameters(), ao);
    manual_seed(11);
    Tensor X = randint(0, c.vocab, {c.batch * 2, c.block_size}).to(device());
    Tensor Y = randint(0, c.vocab, {c.batch * 2, c.block_size}).to(device());
    // Fully sharded is data parallel too: each rank runs its rows of the batch.
    Tensor x = X, y = Y;
    if (mode == "fully_sharded") {
      x = dist::distribute_tensor(X, mesh, {dist::Shard(0)});
      y = dist::distribute_tensor(Y, mesh, {dist::Shard(0)});
    } else if (mode == "2d") {  // the batch cut over "dp", whole on "tp"
      x = dist::distribute_tensor(X, mesh2, {dist::Shard(0), dist::Replicate()});
      y = dist::distribute_tensor(Y, mesh2, {dist::Shard(0), dist::Replicate()});
    }
    for (int it = 0; it < 6; ++it) {
      opt.zero_grad();
      Tensor loss = cross_entropy(model->forward(x).reshape({-1, c.vocab}), y.reshape({-1}));
      loss.backward();
      optim::clip_grad_norm_(model->parameters(), 1.0);
      opt.step();
      opt_ref.zero_grad();
      Tensor ref_loss = cross_entropy(ref.forward(X).reshape({-1, c.vocab}), Y.reshape({-1}));
      ref_loss.backward();
      optim::clip_grad_norm_(ref.parameters(), 1.0);
      opt_ref.step();
      const double l = loss.item<double>(), lr = ref_loss.item<double>();
      EXPECT(std::abs(l - lr) < 1e-4, mode, " step ", it, ": loss ", l, ", one process ", lr);
      const double d = max_diff(*model, ref);
      EXPECT(d < 1e-4, mode, " step ", it, ": parameters differ from one process by ", d);
    }
    // State dicts: whole (equal to one process's), loaded back into the sharded model; each
    // rank's shards, loaded back.
    const std::map<std::string, Tensor> full = dist::full_state_dict(*model), want = ref.state_dict();
    for (auto& [name, t] : want) {
      EXPECT(full.count(name) && !dist::is_dtensor(full.at(name)), mode, ": full state dict entry ", name);
      const double d = (full.at(name) - t).abs().amax({}).cpu().item<double>();
      EXPECT(d < 1e-4, mode, ": full state dict ", name, " differs by ", d);
    }
    const std::map<std::string, Tensor> local = dist::local_state_dict(*model);
    {
      NoGradGuard ng;
      for (Tensor& p : model->parameters()) p.mul_(0.0);
    }
    dist::load_full_state_dict(*model, full);
    EXPECT(max_diff(*model, ref) < 1e-4, mode, ": after load_full_state_dict");
    for (const Tensor& p : model->parameters())
      EXPECT(dist::is_dtensor(p) || (mode != "fully_sharded" && mode != "2d"), mode, ": load made a parameter plain");
    {
      NoGradGuard ng;
      for (Tensor& p : model->parameters()) p.mul_(0.0);
    }
    dist::load_local_state_dict(*model, local);
    EXPECT(max_diff(*model, ref) < 1e-4, mode, ": after load_local_state_dict");
    bool threw = false;
    try {
      std::map<std::string, Tensor> bad = full;
      bad.begin()->second = zeros({3});
      dist::load_full_state_dict(*model, bad);
    } catch (const Error& e) {
      threw = std::string(e.what()).find("shape") != std::string::npos;
    }
    EXPECT(threw, mode, ": a wrong shape is refused");
    EXPECT(max_diff(*model, ref) < 1e-4, mode, ": a refused load changed the model");
    if (dist::get_rank() == 0) std::cout << "dtensor_gpt " << mode << ": 6 steps and state dicts equal one process\n";
  }
  dist::destroy_process_group();
}

// fully_shard's memory, as the memory profile names it: after AdamW steps each rank holds its
// shard of the parameters, of their gradients and of the two moments (1/world of the whole
// model's, within uneven shards' rounding), not the whole model's.
void fsdp_memory() {
  init();
  const int size = dist::get_world_size();
  const gpt::GptConfig c = tiny_gpt(64, 64, 256);
  dist::DeviceMesh mesh = test_mesh({size});
  manual_seed(7);
  auto model = std::make_shared<gpt::Gpt>(c, false, false);
  model->to(device());
  double whole = 0;
  for (const Tensor& p : model->parameters()) whole += static_cast<double>(p.numel() * 4);
  dist::fully_shard(*model, mesh);
  optim::AdamW opt(model->parameters(), optim::AdamOptions{});
  manual_seed(11);
  Tensor x = dist::distribute_tensor(randint(0, c.vocab, {c.batch * size, c.block_size}).to(device()), mesh, {dist::Shard(0)});
  Tensor y = dist::distribute_tensor(randint(0, c.vocab, {c.batch * size, c.block_size}).to(device()), mesh, {dist::Shard(0)});
  for (int it = 0; it < 2; ++it) {
    opt.zero_grad();
    Tensor loss = cross_entropy(model->forward(x).reshape({-1, c.vocab}), y.reshape({-1}));
    loss.backward();
    opt.step();
    loss.item<double>();
  }
  std::vector<Tensor> all;
  for (const Tensor& p : model->parameters()) all.insert(all.end(), {p, p.grad()});
  kiln::eval(all);
  // (KILN_PROFILE=memory: after a peak reset the snapshot lists the blocks live now)
  const std::string path = "/tmp/kiln-fsdp-memory-" + std::to_string(getpid()) + ".json";
  if (device().type == DeviceType::CPU) {
    reset_peak_host_memory_stats();
    host_memory_snapshot(path);
  } else {
    cuda::reset_peak_memory_stats(device().index);
    cuda::memory_snapshot(path, device().index);
  }
  std::map<std::string, double> held;
  {
    std::ifstream f(path);
    std::stringstream text;
    text << f.rdbuf();
    const std::string s = text.str();
    for (size_t at = s.find("{\"bytes\": "); at != std::string::npos; at = s.find("{\"bytes\": ", at + 1)) {
      const double bytes = std::stod(s.substr(at + 10));
      const size_t r = s.find("\"role\": \"", at) + 9;
      held[s.substr(r, s.find('"', r) - r)] += bytes;
    }
  }
  std::remove(path.c_str());
  const double share = whole / size;
  for (const auto& [role, times] : std::vector<std::pair<std::string, double>>{
           {"parameters", 1}, {"gradients", 1}, {"optimizer state", 2}}) {
    const double got = held[role], want = times * share;
    EXPECT(got >= 0.9 * want && got <= 1.1 * want + 4096, role, " on rank ", dist::get_rank(), ": ", got,
           " bytes, 1/", size, " of the model's is ", want);
  }
  if (dist::get_rank() == 0)
    std::cout << "fsdp_memory: each rank holds 1/" << size << " of parameters, gradients and moments ("
              << held["parameters"] << " of " << whole << " parameter bytes)\n";
  dist::destroy_process_group();
}

// Context parallelism: scaled_dot_product_attention on q, k, v cut along the sequence runs ring
// attention (uneven pieces, causal and not), equal to one process's output and gradients within
// 1e-5; and an attention module (the GPT's) put through distribute_module with its input cut
// along the sequence gives one process's output and parameter gradients.
void context_parallel() {
  init();
  const int size = dist::get_world_size();
  dist::DeviceMesh mesh = test_mesh({size});
  auto diff = [](const Tensor& a, const Tensor& b) { return (a - b).abs().amax({}).cpu().item<double>(); };
  // Ring attention of q, k, v [2, 2, T, 8] of dtype `dt` against one process: output and
  // gradients, each compared by `measure` (their difference, absolute or relative) within `tol`
  // (`grad_tol` for the gradients).
  auto ring_equals_one_process = [&](bool causal, int64_t T, DType dt, const char* what,
                                     const std::function<double(const Tensor&, const Tensor&)>& measure, double tol,
                                     double grad_tol) {
    auto mk = [&] { return randn({2, 2, T, 8}).to(device()).to(dt); };
    Tensor Q = mk(), K = mk(), V = mk(), W = mk();
    Tensor q = Q.clone().requires_grad_(), k = K.clone().requires_grad_(), v = V.clone().requires_grad_();
    Tensor want = scaled_dot_product_attention(q, k, v, std::nullopt, causal);
    (want * W).sum({}).backward();
    Tensor qd = dist::distribute_tensor(Q, mesh, {dist::Shard(2)}), kd = dist::distribute_tensor(K, mesh, {dist::Shard(2)}),
           vd = dist::distribute_tensor(V, mesh, {dist::Shard(2)});
    qd.requires_grad_(), kd.requires_grad_(), vd.requires_grad_();
    Tensor got = scaled_dot_product_attention(qd, kd, vd, std::nullopt, causal);
    EXPECT(got.dtype() == dt, what, " output dtype, got ", dtype_name(got.dtype()));
    EXPECT(dist::DTensor(got).placements()[0] == dist::Shard(2), "ring attention keeps the sequence cut, got ",
           dist::DTensor(got).str());
    EXPECT(measure(dist::DTensor(got).full_tensor(), want) < tol, what, " output (causal ", causal, ")");
    (got * W).sum({}).backward();
    EXPECT(measure(dist::DTensor(qd.grad()).full_tensor(), q.grad()) < grad_tol, what, " dq (causal ", causal, ")");
    EXPECT(measure(dist::DTensor(kd.grad()).full_tensor(), k.grad()) < grad_tol, what, " dk (causal ", causal, ")");
    EXPECT(measure(dist::DTensor(vd.grad()).full_tensor(), v.grad()) < grad_tol, what, " dv (causal ", causal, ")");
  };
  for (const auto& [causal, T] : std::vector<std::pair<bool, int64_t>>{{false, 7}, {true, 7}, {true, 3}, {false, 1}}) {
    manual_seed(3);  // (T 7: uneven pieces over 2 and 4 ranks; 3 over 4: an empty one; 1: ranks
                     // passing and receiving nothing, which must still take part)
    ring_equals_one_process(causal, T, kFloat32, "ring attention", diff, 1e-5, 1e-5);
  }
  // bfloat16: the blocks' float32 outputs and log-sum-exps merge in float32 (the node's dtype) and
  // round once, as the one-process kernel does: within bfloat16's rounding of it (2^-7 of the
  // largest magnitude, doubled for the gradients' partial sums).
  auto rdiff = [&](const Tensor& a, const Tensor& b) {
    const Tensor a32 = a.to(kFloat32), b32 = b.to(kFloat32);
    return diff(a32, b32) / std::max(1.0, b32.abs().amax({}).cpu().item<double>());
  };
  for (const bool causal : {false, true}) {
    manual_seed(4);
    ring_equals_one_process(causal, 7, kBFloat16, "bfloat16 ring attention", rdiff, 1e-2, 2e-2);
  }
  // The GPT's attention module, context parallel through distribute_module.
  gpt::GptConfig c;
  c.n_embd = 32, c.n_head = 4, c.block_size = 16;
  manual_seed(5);
  auto attn = std::make_shared<gpt::CausalSelfAttention>(c, false);
  attn->to(device());
  manual_seed(5);
  gpt::CausalSelfAttention ref(c, false);
  ref.to(device());
  copy_params(*attn, ref);
  std::shared_ptr<nn::Module> cp = dist::distribute_module(
      attn, mesh, nullptr,
      [](nn::Module&, const Tensor& x, const dist::DeviceMesh& m) {
        return Tensor(dist::distribute_tensor(x, m, {dist::Shard(1)}));
      },
      [](nn::Module&, const Tensor& y, const dist::DeviceMesh&) { return dist::DTensor(y).full_tensor(); });
  manual_seed(6);
  Tensor x = randn({2, c.block_size, c.n_embd}).to(device());
  Tensor y = cp->forward(x), y_ref = ref.forward(x);
  EXPECT(!dist::is_dtensor(y) && diff(y, y_ref) < 1e-5, "context-parallel attention module output");
  y.square().sum({}).backward();
  y_ref.square().sum({}).backward();
  auto a = attn->parameters(), b = ref.parameters();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT(diff(dist::DTensor(a[i].grad()).full_tensor(), b[i].grad()) < 1e-4, "context-parallel gradient ", i);
  if (dist::get_rank() == 0) std::cout << "context_parallel: ring attention equals one process\n";
  dist::destroy_process_group();
}

// The torch-programs corpus replayed with every input a DTensor under random placements (Shard
// of any dim, Replicate, Partial for floating inputs: rank 0 of the mesh dim holds the value,
// the others zeros) on a 1-d mesh of every rank and, with 4 ranks, a 2 x 2 mesh: the whole of
// every result and gradient must equal PyTorch's at the corpus tolerances. Every rank draws the
// same placements (seeded by program id and KILN_TEST_SEED). KILN_DT_PROGRAMS: how many
// programs (a deterministic sample, every k-th; default 40 on 2 ranks, 20 on more; "all").
void dtensor_programs() {
  init();
  if (device().type != DeviceType::CPU) {  // (the corpus' index constants are CPU tensors; see README)
    if (dist::get_rank() == 0) std::cout << "dtensor_programs: runs on the CPU (Gloo) only\n";
    dist::destroy_process_group();
    return;
  }
  const int size = dist::get_world_size();
  std::string tried;
  const auto path = torch_programs::find_corpus(tried);
  if (!path) {
    if (dist::get_rank() == 0) std::cout << "dtensor_programs: corpus not found (looked at " << tried << ")\n";
    dist::destroy_process_group();
    return;
  }
  const std::vector<std::string> lines = torch_programs::read_corpus(*path);
  const char* want = std::getenv("KILN_DT_PROGRAMS");
  size_t n = lines.size();
  // (default: 40 programs on 2 ranks, 20 on more: each replays on two meshes there)
  if (!(want && std::string(want) == "all")) n = std::min<size_t>(n, want ? std::stoul(want) : size > 2 ? 20 : 40);
  const uint64_t seed = std::getenv("KILN_TEST_SEED") ? std::stoull(std::getenv("KILN_TEST_SEED")) : 1;
  std::vector<std::vector<int64_t>> meshes = {{size}};
  if (size == 4) meshes.push_back({2, 2});
  std::vector<dist::DeviceMesh> mesh_of;
  for (const auto& ms : meshes) mesh_of.push_back(test_mesh(ms));
  size_t pass = 0, total = 0;
  std::vector<std::string> fails;
  for (size_t k = 0; k < n; ++k) {
    const torch_programs::Program prog = torch_programs::parse_program(torch_programs::json::parse(lines[k * lines.size() / n]));
    for (size_t mi = 0; mi < meshes.size(); ++mi) {
      const dist::DeviceMesh& mesh = mesh_of[mi];
      uint64_t h = seed * 0x9E3779B97F4A7C15ull + std::hash<std::string>{}(prog.id) + mi;
      auto next = [&h](uint64_t m) {
        h ^= h >> 33;
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 29;
        return m ? h % m : 0;
      };
      std::string placed_as;
      torch_programs::Placer placer;
      placer.place = [&](const Tensor& x, size_t i) {
        if (i == 0) placed_as += " |";  // (a new call: its inputs' placements follow)
        std::vector<dist::Placement> pl;
        bool partial = false;
        for (size_t d = 0; d < meshes[mi].size(); ++d) {
          const uint64_t c = next(x.dim() + 2);
          if (c == 0 || (c == 1 && !is_floating(x.dtype())) || x.dim() == 0) {
            pl.push_back(dist::Replicate());
          } else if (c == 1) {
            pl.push_back(dist::Partial());
            partial = true;
          } else {
            pl.push_back(dist::Shard(static_cast<int64_t>(c - 2)));
          }
        }
        placed_as += " x" + std::to_string(i) + "[";
        for (auto& q : pl) placed_as += q.str() + (&q == &pl.back() ? "" : ",");
        placed_as += "]";
        Tensor xd = x.to(device());
        if (!partial) return Tensor(dist::distribute_tensor(xd, mesh, pl));
        std::vector<dist::Placement> no_partial = pl;
        for (auto& q : no_partial)
          if (q.is_partial()) q = dist::Replicate();
        Tensor local = dist::distribute_tensor(xd, mesh, no_partial).to_local();
        // (the other parts -0.0: x + -0.0 is x for every x, -0.0 included; + 0.0 would make
        // -0.0 a 0.0)
        for (size_t d = 0; d < pl.size(); ++d)
          if (pl[d].is_partial() && mesh.coordinate()[d] != 0) local = zeros_like(local).neg();
        return Tensor(dist::DTensor::from_local(local, mesh, pl, x.sizes()));
      };
      placer.gather = [](const Tensor& t) { return (dist::is_dtensor(t) ? dist::DTensor(t).full_tensor() : t).cpu(); };
      ++total;
      torch_programs::Outcome o;
      try {
        o = torch_programs::replay_placed(prog, placer);
      } catch (const std::exception& e) {
        o.failures.push_back(std::string("setup: ") + e.what());
      }
      if (o.failures.empty()) {
        ++pass;
      } else {
        fails.push_back(prog.id + " mesh " + std::to_string(mi) + placed_as + ": " + o.failures[0]);
        if (dist::get_rank() == 0) std::cout << "  FAIL " << fails.back().substr(0, 500) << std::endl;  // (as found)
      }
    }
  }
  if (dist::get_rank() == 0) {
    std::cout << "dtensor_programs: " << pass << " of " << total << " (program, mesh) replays equal PyTorch's ("
              << n << " programs; meshes:";
    for (auto& ms : meshes) {
      std::cout << " [";
      for (size_t i = 0; i < ms.size(); ++i) std::cout << (i ? " x " : "") << ms[i];
      std::cout << "]";
    }
    std::cout << ")\n";
  }
  EXPECT(fails.empty(), fails.size(), " replays differ from PyTorch's; first: ", fails.empty() ? "" : fails[0].substr(0, 800));
  dist::destroy_process_group();
}

// Shards that are empty or views, under every reduction and an in-place write, against one
// process: every reduction (sum, prod, amax/amin, max/min, argmax/argmin, mean, var, std) of an
// int32, int64, float32 and bool tensor under placements that leave shards empty (a dim smaller
// than the mesh, cut on two mesh dims), exact (var/std to 1e-6); and an in-place write through a
// sharded view of a bool, int32 and float32 tensor (the view's shard is strided, one rank's may
// be empty) equal to the same write on the whole tensor, with no rank raising.
std::string dims_str(const std::vector<int64_t>& v) {
  std::string r = "[";
  for (size_t i = 0; i < v.size(); ++i) r += (i ? ", " : "") + std::to_string(v[i]);
  return r + "]";
}

void dtensor_edges() {
  init();
  const int size = dist::get_world_size();
  std::vector<std::vector<int64_t>> meshes = {{size}};
  if (size == 4) meshes.push_back({2, 2});
  const std::vector<DType> dtypes = {kInt32, kInt64, kFloat32, kBool};
  for (const auto& ms : meshes) {
    auto mesh = test_mesh(ms);
    std::vector<std::vector<dist::Placement>> placements = {std::vector<dist::Placement>(ms.size(), dist::Shard(1)),
                                                            std::vector<dist::Placement>(ms.size(), dist::Shard(0))};
    if (ms.size() == 2) placements.push_back({dist::Shard(0), dist::Shard(1)});
    for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{2, 1}, {3, 2}, {1, 5}})
      for (DType dt : dtypes)
        for (const auto& pl : placements) {
          const int64_t n = shape[0] * shape[1];
          std::vector<double> v(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<double>((i * 5) % 7 - 4);
          Tensor whole = from_vector(v, shape).to(device()).to(dt);
          Tensor x = dist::distribute_tensor(whole, mesh, pl);
          std::string where = kiln::detail::cat(dtype_name(dt), " ", dims_str(whole.sizes()), " on ",
                                                dims_str(mesh.shape()), " ", pl[0].str(),
                                                pl.size() > 1 ? " " + pl[1].str() : std::string());
          auto same = [&](const Tensor& got, const Tensor& want, const std::string& what, double tol) {
            auto g = values(dist::full_tensor(got)), w = values(want);
            EXPECT(g.size() == w.size(), what, " ", where, ": ", g.size(), " values, expected ", w.size());
            for (size_t i = 0; i < g.size(); ++i)
              EXPECT(std::abs(g[i] - w[i]) <= tol * (1 + std::abs(w[i])) || (std::isnan(g[i]) && std::isnan(w[i])),
                     what, " ", where, ": element ", i, " is ", g[i], ", expected ", w[i]);
          };
          same(amax(x), amax(whole), "amax", 0);
          same(amin(x), amin(whole), "amin", 0);
          same(max(x), max(whole), "max", 0);
          same(min(x), min(whole), "min", 0);
          for (int64_t d : {0, 1}) {
            same(amax(x, {d}), amax(whole, {d}), "amax(dim)", 0);
            same(amin(x, {d}), amin(whole, {d}), "amin(dim)", 0);
            if (dt != kBool) {
              same(argmax(x, d), argmax(whole, d), "argmax", 0);
              same(argmin(x, d), argmin(whole, d), "argmin", 0);
              same(max(x, d).first, max(whole, d).first, "max(dim)", 0);
            }
          }
          if (dt != kBool) {
            same(sum(x), sum(whole), "sum", 0);
            same(prod(x, {1}), prod(whole, {1}), "prod", 0);
          }
          if (dt == kFloat32) {
            same(mean(x, {1}), mean(whole, {1}), "mean", 1e-6);
            same(var(x, {0}, 0.0), var(whole, {0}, 0.0), "var", 1e-6);
            same(kiln::std(x, {1}, 0.0), kiln::std(whole, {1}, 0.0), "std", 1e-6);
          }
        }
    // In-place through a sharded view: b = (x > 0)[:, 1:]; b += false; and for int32/float32 a
    // window of the tensor itself.
    for (DType dt : {kBool, kInt32, kFloat32}) {
      manual_seed(5);
      Tensor whole = randn({6, 2, 6}).to(device());
      Tensor x = dist::distribute_tensor(whole, mesh, std::vector<dist::Placement>(ms.size(), dist::Shard(0)));
      try {
        Tensor b = dt == kBool ? gt(x, 0) : x.to(dt);
        Tensor bw = dt == kBool ? gt(whole, 0) : whole.to(dt);
        Tensor view = b.index({Slice(), Slice(1, None)});
        Tensor vw = bw.index({Slice(), Slice(1, None)});
        if (dt == kBool) {
          view.add_(false);
          vw.add_(false);
        } else {
          view.add_(3);
          vw.add_(3);
        }
        auto g = values(dist::full_tensor(b)), w = values(bw);
        EXPECT(g == w, "in-place through a sharded view of ", dtype_name(dt), " on mesh ", dims_str(mesh.shape()),
               " differs from one process");
      } catch (const Error& e) {
        fail(kiln::detail::cat("in-place through a sharded view of ", dtype_name(dt), " raised: ", e.what()));
      }
    }
  }
  if (dist::get_rank() == 0) std::cout << "dtensor_edges: every reduction and in-place view matched" << std::endl;
  dist::destroy_process_group();
}

}  // namespace

int main(int argc, char** argv) {
  const std::map<std::string, std::function<void()>> scenarios = {
      {"collectives", collectives}, {"groups", groups},     {"functional", functional}, {"rank_dies", rank_dies},
      {"mismatch", mismatch},       {"never_joins", never_joins}, {"bad_input", bad_input},
      {"ddp_mlp", ddp_mlp},         {"ddp_gpt", ddp_gpt},       {"dtensor", dtensor},
      {"dtensor_programs", dtensor_programs}, {"dtensor_gpt", dtensor_gpt}, {"context_parallel", context_parallel},
      {"dtensor_edges", dtensor_edges},         {"fsdp_memory", fsdp_memory},
  };
  return kiln::testing::run_scenario("dist_worker", argc, argv, scenarios);
}
