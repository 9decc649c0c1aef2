// torch-programs replay: 4497 random multi-op programs with PyTorch 2.11's outputs and gradients
// (../shared/torch-programs/README.md), rebuilt with kiln's public API and run in every mode
// (eager; compiled on three sizes and back; all-dynamic; gradients eager, outside and inside
// compile).
//
// Each program runs in a worker process (this binary, re-executed with --replay-worker), so a
// crash or a hang fails that program only: the parent records it and starts a new worker on the
// programs after it. KILN_REPLAY_JOBS workers run at once (default 2).
//
// Which programs: a deterministic sample of KILN_PROGRAMS programs (default 450, every k-th),
// or the whole corpus with KILN_PROGRAMS=all. The file is $KILN_PROGRAMS_FILE, else
// $KILN_SOURCE_DIR/../shared/torch-programs/programs.jsonl.gz, else ../shared/... from the
// working directory; missing, the test skips unless KILN_REQUIRE_PARITY=1.
//
// Printed: programs passed per mode, and among size-polymorphic programs (three input sets of
// different sizes) how many ran the third set on the symbolic entry without a new compile.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "torch_programs.h"

namespace {

namespace fs = std::filesystem;
using torch_programs::find_corpus;
using torch_programs::json;
using torch_programs::read_corpus;

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

// ---- worker: runs the programs at the given indices, reporting on fd 3 ----
int run_worker(const std::string& path, const std::vector<size_t>& indices) {
  std::vector<std::string> lines = read_corpus(path);
  FILE* out = fdopen(3, "w");
  if (!out) return 2;
  for (size_t i : indices) {
    std::fprintf(out, "S %zu\n", i);
    std::fflush(out);
    torch_programs::Outcome o;
    try {
      o = torch_programs::replay(torch_programs::parse_program(json::parse(lines.at(i))));
    } catch (const std::exception& e) {
      o.failures.push_back(std::string("setup: ") + e.what());
    }
    std::string msg;
    for (const auto& f : o.failures) msg += (msg.empty() ? "" : " | ") + one_line(f);
    if (o.polymorphic && !o.third_size_reused) std::fprintf(out, "M %zu %s\n", i, one_line(o.third_size_miss).c_str());
    std::fprintf(out, "R %zu %d %d %d %d %s\n", i, o.failures.empty() ? 1 : 0, o.polymorphic ? 1 : 0,
                 o.third_size_reused ? 1 : 0, o.coverable ? 1 : 0, msg.c_str());
    std::fflush(out);
  }
  return 0;
}

// ---- parent ----
struct Result {
  bool done = false, pass = false, poly = false, reused = false, coverable = false;
  std::string msg;
  std::string miss;  // polymorphic, third size not reused: why
};

struct Worker {
  pid_t pid = -1;
  int fd = -1;
  std::deque<size_t> queue;  // programs not yet reported, in order
  std::optional<size_t> current;
  std::chrono::steady_clock::time_point started;
  std::string buf;
};

void spawn(Worker& w, const std::string& path) {
  int p[2];
  if (pipe(p) != 0) throw std::runtime_error("pipe failed");
  std::vector<std::string> args = {"/proc/self/exe", "--replay-worker", path};
  for (size_t i : w.queue) args.push_back(std::to_string(i));
  pid_t pid = fork();
  if (pid == 0) {
    if (p[0] != 3) close(p[0]);  // (if it is fd 3, dup2 replaces it)
    if (p[1] != 3) {
      dup2(p[1], 3);
      close(p[1]);
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  close(p[1]);
  w.pid = pid;
  w.fd = p[0];
  w.current.reset();
  w.buf.clear();
  w.started = std::chrono::steady_clock::now();
}

std::string status_text(int status) {
  if (WIFSIGNALED(status)) return std::string("crashed (") + strsignal(WTERMSIG(status)) + ")";
  return "worker exited with status " + std::to_string(WEXITSTATUS(status));
}

std::map<size_t, Result> run_parallel(const std::string& path, const std::vector<size_t>& sel, int jobs,
                                      double timeout_s) {
  std::map<size_t, Result> res;
  std::map<size_t, std::string> misses;
  std::vector<Worker> ws(static_cast<size_t>(std::max(1, jobs)));
  for (size_t k = 0; k < sel.size(); ++k) ws[k % ws.size()].queue.push_back(sel[k]);
  for (auto& w : ws)
    if (!w.queue.empty()) spawn(w, path);
  auto line_of = [&](Worker& w, const std::string& line) {
    if (line.rfind("S ", 0) == 0) {
      w.current = std::stoul(line.substr(2));
      w.started = std::chrono::steady_clock::now();
      return;
    }
    if (line.rfind("M ", 0) == 0) {
      size_t sp = line.find(' ', 2);
      misses[std::stoul(line.substr(2, sp - 2))] = sp == std::string::npos ? "" : line.substr(sp + 1);
      return;
    }
    if (line.rfind("R ", 0) != 0) return;
    size_t i;
    int pass, poly, reused, cov, used = 0;
    if (std::sscanf(line.c_str(), "R %zu %d %d %d %d %n", &i, &pass, &poly, &reused, &cov, &used) < 5) return;
    res[i] = Result{true, pass != 0, poly != 0, reused != 0, cov != 0, line.substr(static_cast<size_t>(used))};
    if (!w.queue.empty() && w.queue.front() == i) w.queue.pop_front();
    w.current.reset();
  };
  auto finish = [&](Worker& w, const std::string& why) {
    int status = 0;
    if (why.empty()) waitpid(w.pid, &status, 0);
    close(w.fd);
    w.fd = -1;
    if (!w.queue.empty()) {
      size_t i = w.current.value_or(w.queue.front());
      res[i] = Result{true, false, false, false, false, why.empty() ? status_text(status) : why};
      while (!w.queue.empty() && w.queue.front() != i) w.queue.pop_front();
      if (!w.queue.empty()) w.queue.pop_front();
    }
    if (!w.queue.empty()) spawn(w, path);
  };
  for (;;) {
    std::vector<pollfd> pf;
    std::vector<Worker*> who;
    for (auto& w : ws)
      if (w.fd >= 0) {
        pf.push_back({w.fd, POLLIN, 0});
        who.push_back(&w);
      }
    if (pf.empty()) break;
    poll(pf.data(), pf.size(), 1000);
    for (size_t k = 0; k < pf.size(); ++k) {
      Worker& w = *who[k];
      if (pf[k].revents & (POLLIN | POLLHUP | POLLERR)) {
        char buf[4096];
        ssize_t n = read(w.fd, buf, sizeof buf);
        if (n > 0) {
          w.buf.append(buf, static_cast<size_t>(n));
          for (size_t nl; (nl = w.buf.find('\n')) != std::string::npos;) {
            std::string line = w.buf.substr(0, nl);
            w.buf.erase(0, nl + 1);
            line_of(w, line);
          }
          continue;
        }
        finish(w, "");
        continue;
      }
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - w.started).count();
      if (w.current && secs > timeout_s) {
        kill(w.pid, SIGKILL);
        waitpid(w.pid, nullptr, 0);
        finish(w, "timed out after " + std::to_string(static_cast<int>(timeout_s)) + " s");
      }
    }
  }
  for (auto& [i, m] : misses) res[i].miss = m;
  return res;
}

TEST(TorchPrograms, Replay) {
  std::string tried;
  auto path = find_corpus(tried);
  const char* req = std::getenv("KILN_REQUIRE_PARITY");
  if (!path) {
    if (req && std::string(req) == "1") FAIL() << "torch-programs corpus not found (looked at " << tried << ")";
    GTEST_SKIP() << "torch-programs corpus not found (looked at " << tried << ")";
  }
  std::vector<std::string> lines = read_corpus(*path);
  ASSERT_GT(lines.size(), 0u);
  const char* want = std::getenv("KILN_PROGRAMS");
  size_t n = lines.size();
  if (!(want && std::string(want) == "all")) n = std::min<size_t>(n, want ? std::stoul(want) : 450);
  std::vector<size_t> sel;
  for (size_t k = 0; k < n; ++k) sel.push_back(k * lines.size() / n);
  int jobs = 2;
  if (const char* j = std::getenv("KILN_REPLAY_JOBS")) jobs = std::max(1, std::atoi(j));
  auto t0 = std::chrono::steady_clock::now();
  auto res = run_parallel(path->string(), sel, jobs, 120);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  size_t pass = 0, poly = 0, reused = 0, cov = 0, cov_reused = 0;
  std::vector<std::string> fails;
  for (size_t i : sel) {
    const Result& r = res[i];
    std::string id = json::parse(lines[i]).at("id").get<std::string>();
    if (!r.done)
      fails.push_back(id + ": no result");
    else if (r.pass)
      ++pass;
    else
      fails.push_back(id + ": " + r.msg);
    if (r.poly) {
      ++poly;
      reused += r.reused ? 1 : 0;
    }
    if (r.coverable) {
      ++cov;
      cov_reused += r.reused ? 1 : 0;
    }
  }
  std::cout << "torch-programs: " << pass << " of " << sel.size() << " programs pass every mode (" << secs << " s, "
            << jobs << " workers)\n"
            << "third size served by the symbolic entry: " << reused << " of " << poly << " size-polymorphic programs ("
            << (poly ? 100.0 * static_cast<double>(reused) / static_cast<double>(poly) : 100.0) << "%)\n"
            << "  ... of the " << cov << " whose third set changes only dims the second set changed: " << cov_reused
            << " (" << (cov ? 100.0 * static_cast<double>(cov_reused) / static_cast<double>(cov) : 100.0)
            << "%); the others must recompile (a dim first changing at the third set is specialized, as in "
            << "PyTorch)\n";
  std::map<std::string, std::vector<std::string>> why;  // third-size misses by reason
  for (size_t i : sel)
    if (res[i].poly && !res[i].reused) {
      std::string m = res[i].miss;
      size_t by = m.find(", specialized by ");
      std::string key = by != std::string::npos ? m.substr(by + 2) : m.substr(0, m.find(':'));
      why[key].push_back(json::parse(lines[i]).at("id").get<std::string>() + ": " + m);
    }
  std::vector<std::pair<size_t, std::string>> ranked;
  for (auto& [k, v] : why) ranked.push_back({v.size(), k});
  std::sort(ranked.rbegin(), ranked.rend());
  for (size_t k = 0; k < ranked.size() && k < 40; ++k)
    std::cout << "  new compile for the third size (" << ranked[k].first
              << "): " << why[ranked[k].second][0].substr(0, 300) << "\n";
  for (size_t k = 0; k < fails.size() && k < 60; ++k) std::cout << "  FAIL " << fails[k].substr(0, 600) << "\n";
  if (const char* rep = std::getenv("KILN_REPLAY_REPORT")) {  // every failure, whole
    std::ofstream f(rep);
    for (const auto& x : fails) f << x << "\n";
  }
  EXPECT_EQ(fails.size(), 0u);
  EXPECT_GE(static_cast<double>(reused), 0.97 * static_cast<double>(poly));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "--replay-worker") {
    std::vector<size_t> idx;
    for (int k = 3; k < argc; ++k) idx.push_back(std::stoul(argv[k]));
    return run_worker(argv[2], idx);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
