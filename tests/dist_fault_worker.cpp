// One rank of the fault tests (tests/test_dist_faults.cpp starts N of these): collectives issued
// from many threads at once, collectives the ranks disagree on, a rank that dies before or during
// a collective or a DDP step, and DDP replicas of different shapes. `dist_fault_worker SCENARIO`;
// each scenario checks exact values or the error text, prints "ok" and exits 0.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <regex>
#include <thread>

#include "dist_worker_common.h"
#include "runtime/parallel/data_parallel.h"

using namespace kiln;
using kiln::testing::fail;
using kiln::testing::test_device;

namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Rank r, thread t, step s, element i: a small integer (sums of a few ranks are exact).
double value(int r, int t, int s, int64_t i) { return static_cast<double>((r * 13 + t * 7 + s * 3 + i) % 17); }

Tensor input(int r, int t, int s, int64_t n) {
  // Built lazily from an arange (a pending producer the collective computes first).
  Tensor i = arange(0, static_cast<double>(n), 1.0).to(test_device());
  return ((i + (r * 13 + t * 7 + s * 3)) - ((i + (r * 13 + t * 7 + s * 3)) / 17.0).floor() * 17.0).to(kFloat32);
}

// Threads x groups x collective kinds x sizes: each of T threads owns a group of every rank and
// runs all_reduce, all_gather, broadcast and reduce_scatter of several sizes on it, concurrently
// with the others; every result is checked exactly against what the ranks' inputs give.
void threads() {
  kiln::testing::init_from_env();
  const int rank = dist::get_rank(), size = dist::get_world_size();
  const int T = std::stoi(env_or("KILN_TEST_THREADS", "4")), steps = 6;
  std::vector<int> all(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) all[static_cast<size_t>(r)] = r;
  std::vector<dist::ProcessGroup> groups;
  for (int t = 0; t < T; ++t) groups.push_back(dist::new_group(all));
  std::atomic<int> bad{0};
  std::mutex mu;
  std::string first;
  auto note = [&](const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    if (bad++ == 0) first = what;
  };
  auto work = [&](int t) {
    try {
      const dist::ProcessGroup& g = groups[static_cast<size_t>(t)];
      for (int s = 0; s < steps; ++s)
        for (int64_t n : {1, 7, 1000, 1 << 16}) {
          const int64_t m = n * size;
          Tensor a = input(rank, t, s, n);
          dist::all_reduce(a, dist::ReduceOp::Sum, g);
          Tensor b = input(rank, t, s, n);
          dist::broadcast(b, (t + s) % size, g);
          Tensor c = dist::functional::all_gather(input(rank, t, s, n), 0, g);
          Tensor d = dist::functional::reduce_scatter(input(rank, t, s, m), dist::ReduceOp::Sum, 0, g);
          const auto va = a.cpu().to_vector<float>(), vb = b.cpu().to_vector<float>(), vc = c.cpu().to_vector<float>(),
                     vd = d.cpu().to_vector<float>();
          for (int64_t i = 0; i < n; ++i) {
            double sum = 0, rs = 0;
            for (int r = 0; r < size; ++r) {
              sum += value(r, t, s, i);
              rs += value(r, t, s, rank * n + i);
              if (vc[static_cast<size_t>(r * n + i)] != value(r, t, s, i))
                return note(kiln::detail::cat("thread ", t, " step ", s, " n ", n, ": all_gather block ", r, "[", i,
                                              "] = ", vc[static_cast<size_t>(r * n + i)], ", expected ", value(r, t, s, i)));
            }
            if (va[static_cast<size_t>(i)] != sum)
              return note(kiln::detail::cat("thread ", t, " step ", s, " n ", n, ": all_reduce[", i, "] = ",
                                            va[static_cast<size_t>(i)], ", expected ", sum));
            if (vb[static_cast<size_t>(i)] != value((t + s) % size, t, s, i))
              return note(kiln::detail::cat("thread ", t, " step ", s, " n ", n, ": broadcast[", i, "] = ",
                                            vb[static_cast<size_t>(i)], ", expected ", value((t + s) % size, t, s, i)));
            if (vd[static_cast<size_t>(i)] != rs)
              return note(kiln::detail::cat("thread ", t, " step ", s, " n ", n, ": reduce_scatter[", i, "] = ",
                                            vd[static_cast<size_t>(i)], ", expected ", rs));
          }
        }
    } catch (const std::exception& e) {
      note(kiln::detail::cat("thread ", t, ": ", e.what()));
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < T; ++t) pool.emplace_back(work, t);
  for (auto& th : pool) th.join();
  EXPECT(bad == 0, bad.load(), " thread(s) saw a wrong value or an error; first: ", first);
  std::cout << "threads: " << T << " threads x 4 kinds x 4 sizes x " << steps << " steps exact" << std::endl;
  dist::destroy_process_group();
}

// The ranks call collectives that differ (KILN_TEST_MISMATCH: kind = all_reduce on rank 0,
// broadcast elsewhere; size; dtype). Every rank must raise kiln::Error (naming the ranks and what
// each passed, when KILN_DIST_DEBUG=1 checks before the collective), never return a value and
// never crash.
void mismatch() {
  kiln::testing::init_from_env();
  const int rank = dist::get_rank();
  const std::string what = env_or("KILN_TEST_MISMATCH", "kind");
  const bool debug = env_or("KILN_DIST_DEBUG", "0") != "0";
  Tensor t = full({what == "size" ? 1000 + rank : 1000}, 1.0, what == "dtype" && rank ? kFloat64 : kFloat32)
                 .to(test_device());
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    if (what == "kind" && rank != 0) {
      dist::broadcast(t, 0);
    } else {
      dist::all_reduce(t);
    }
    std::cout << "value: " << t.sum().item<double>() << std::endl;  // (reading it must raise)
    dist::barrier();
    fail("the mismatched collective returned a value");
  } catch (const Error& e) {
    message = e.what();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "error after " << s << " s: " << message << std::endl;
  EXPECT(contains(message, "disagree") || contains(message, "abort") || contains(message, "did not finish"),
         "the error says what went wrong: ", message);
  if (debug) {
    EXPECT(contains(message, "disagree") && contains(message, "rank 0") && contains(message, "rank 1"),
           "under KILN_DIST_DEBUG the error names each rank and what it passed: ", message);
    EXPECT(s < 5.0, "the check before the collective answered in ", s, " s");
  }
  // Checked before the collective (Gloo always, NCCL under KILN_DIST_DEBUG): every rank raised
  // and nothing was sent, so the group goes on. A mismatch that reached NCCL aborted its
  // communicator: the group refuses further calls with that error (no hang, no crash).
  const bool checked_before = test_device().type == DeviceType::CPU || debug;
  try {
    Tensor u = ones({4}).to(test_device());
    dist::all_reduce(u);
    const double got = u.sum().item<double>();
    EXPECT(checked_before, "a collective after the aborted one returned ", got);
    EXPECT(got == 4.0 * dist::get_world_size(), "the next all_reduce gave ", got);
  } catch (const Error& e) {
    std::cout << "next call: " << e.what() << std::endl;
    EXPECT(!checked_before, "the group refused a call after a mismatch checked before it ran: ", e.what());
  }
  std::cout << "ok" << std::endl;
  std::_Exit(0);  // (the group is broken: no destroy)
}

// Rank 1 dies (KILN_TEST_DEATH: exit, abort, kill) at a point of the program (KILN_TEST_WHEN:
// before = before a collective the others enter; ddp = in the backward of a DDP step, after its
// first bucket). Every other rank ends in kiln::Error naming rank 1 within the timeout.
void rank_exits() {
  kiln::testing::init_from_env();
  const int rank = dist::get_rank();
  const std::string how = env_or("KILN_TEST_DEATH", "exit"), when = env_or("KILN_TEST_WHEN", "before");
  // The ranks that die (KILN_TEST_DYING: a comma-separated list; default rank 1; "2,3": a node).
  std::vector<int> dying;
  for (const std::string& r : [](std::string l) {
         std::vector<std::string> out;
         for (size_t at; (at = l.find(',')) != std::string::npos; l = l.substr(at + 1)) out.push_back(l.substr(0, at));
         out.push_back(l);
         return out;
       }(env_or("KILN_TEST_DYING", "1")))
    dying.push_back(std::stoi(r));
  const bool dies = std::find(dying.begin(), dying.end(), rank) != dying.end();
  auto die = [&] {
    std::cout << "rank " << rank << " dies (" << how << ")" << std::endl;
    if (how == "exit") std::exit(1);
    if (how == "abort") std::abort();
    kill(getpid(), SIGKILL);
  };
  Tensor w = ones({4}).to(test_device());
  dist::all_reduce(w);  // everyone alive
  w.sum().item<double>();
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    if (when == "ddp") {
      manual_seed(7);
      auto model = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
          std::make_shared<nn::Linear>(64, 64), std::make_shared<nn::Tanh>(), std::make_shared<nn::Linear>(64, 4)});
      model->to(test_device());
      nn::DistributedDataParallelOptions o;
      o.bucket_cap_mb = 0.001;  // (several buckets: rank 1 dies with some in flight)
      nn::DistributedDataParallel ddp(model, o);
      for (int step = 0; step < 3; ++step) {
        Tensor loss = ddp.forward(randn({8, 64}).to(test_device())).square().mean();
        if (dies && step == 1) die();
        loss.backward();
        for (auto& p : model->parameters()) p.grad().sum().item<double>();
      }
    } else {
      if (dies) die();
      Tensor u = full({1000}, 5.0).to(test_device());
      dist::all_reduce(u);
      std::cout << "value: " << u.sum().item<double>() << std::endl;
      dist::barrier();
    }
    fail("collectives with a dead rank returned");
  } catch (const Error& e) {
    message = e.what();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "error after " << s << " s: " << message << std::endl;
  bool named = false;  // ("rank 2 has exited", "ranks 1, 2, 3 have exited")
  for (int r : dying)
    named |= std::regex_search(message, std::regex("ranks? ([0-9]+, )*" + std::to_string(r) + "\\b"));
  EXPECT(named, "the error names a dead rank: ", message);
  std::cout << "ok" << std::endl;
  std::_Exit(0);
}

// DDP replicas that differ: same element count in another shape (KILN_TEST_REPLICA=shape), a
// different count (count), another dtype (dtype). Construction fails on every rank naming the
// parameter and each rank's shape.
void ddp_shapes() {
  kiln::testing::init_from_env();
  const int rank = dist::get_rank();
  const std::string how = env_or("KILN_TEST_REPLICA", "shape");
  // (a [16, 8] weight on rank 0; [8, 16] on rank 1 holds as many elements; "dims": a layer of
  // as many parameters with fewer dims on rank 1, whose description is shorter than rank 0's)
  std::shared_ptr<nn::Module> last = std::make_shared<nn::Linear>(8, 16);
  if (rank == 1 && how == "shape") last = std::make_shared<nn::Linear>(16, 8);
  if (rank == 1 && how == "count") last = std::make_shared<nn::Linear>(8, 12);
  if (rank == 1 && how == "dims") last = std::make_shared<nn::LayerNorm>(std::vector<int64_t>{16});
  auto model = std::make_shared<nn::Sequential>(
      std::vector<std::shared_ptr<nn::Module>>{std::make_shared<nn::Linear>(8, 8), std::make_shared<nn::Tanh>(), last});
  model->to(test_device());
  if (how == "dtype" && rank == 1) {
    NoGradGuard ng;
    for (auto& p : model->parameters()) p.set_data(p.detach().to(kFloat64));
  }
  try {
    nn::DistributedDataParallel ddp(model, {});
    fail("DDP accepted replicas that differ");
  } catch (const Error& e) {
    const std::string m = e.what();
    std::cout << "error: " << m << std::endl;
    EXPECT(contains(m, "rank 0") && contains(m, "rank 1"), "names each rank: ", m);
    if (how == "count") {
      EXPECT(contains(m, "[12, 8]") && contains(m, "[16, 8]"), "names both shapes: ", m);
    } else if (how == "dims") {
      EXPECT(contains(m, "[16, 8]") && contains(m, "[16]") && contains(m, "2.weight"), "names both shapes: ", m);
    } else if (how == "shape") {
      EXPECT(contains(m, "[16, 8]") && contains(m, "[8, 16]") && contains(m, "2.weight"), "names the parameter: ", m);
    } else {
      EXPECT(contains(m, "float64") && contains(m, "float32"), "names both dtypes: ", m);
    }
  }
  dist::destroy_process_group();
}

}  // namespace

int main(int argc, char** argv) {
  const std::map<std::string, std::function<void()>> scenarios = {
      {"threads", threads}, {"mismatch", mismatch}, {"rank_exits", rank_exits}, {"ddp_shapes", ddp_shapes}};
  return kiln::testing::run_scenario("dist_fault_worker", argc, argv, scenarios);
}
