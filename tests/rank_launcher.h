// Starts the ranks of a multi-process test: N copies of a program found next to the test binary,
// each with the environment a launcher gives (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT on
// loopback, a fresh run id), output captured per rank, all killed after a deadline.
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace kiln::testing {

struct RankOutcome {
  int status = -1;  // exit code, or 128 + signal; -1: killed at the deadline
  std::string output;  // stdout and stderr
};

// The directory holding the running test binary (children live next to it).
inline std::string binary_dir() {
  return std::filesystem::canonical("/proc/self/exe").parent_path().string();
}

// Runs `program` (a path, or a name next to the test binary) as ranks 0..started-1 of a world of
// `world` ranks, each with `args` and the extra environment; waits up to `deadline`.
inline std::vector<RankOutcome> run_ranks(const std::string& program, const std::vector<std::string>& args,
                                          int world, int started, const std::map<std::string, std::string>& env,
                                          std::chrono::seconds deadline = std::chrono::seconds(120)) {
  // A bare name is a program next to the test binary, else one on the PATH (mpirun).
  std::string exe = program;
  if (program.find('/') == std::string::npos && std::filesystem::exists(binary_dir() + "/" + program))
    exe = binary_dir() + "/" + program;
  std::random_device rd;
  const int port = 20000 + static_cast<int>(rd() % 30000);
  const std::string run_id = std::to_string(getpid()) + "-" + std::to_string(rd());
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  for (int r = 0; r < started; ++r) {
    logs.push_back("/tmp/kiln-rank-" + run_id + "-" + std::to_string(r) + ".log");
    pid_t pid = fork();
    if (pid == 0) {
      int fd = open(logs.back().c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      setenv("KILN_RUN_ID", run_id.c_str(), 1);
      for (auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> argv;
      argv.push_back(const_cast<char*>(exe.c_str()));
      for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execvp(exe.c_str(), argv.data());
      _exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<RankOutcome> out(static_cast<size_t>(started));
  std::vector<bool> done(static_cast<size_t>(started), false);
  const auto end = std::chrono::steady_clock::now() + deadline;
  int left = started;
  while (left > 0 && std::chrono::steady_clock::now() < end) {
    for (int r = 0; r < started; ++r) {
      if (done[r]) continue;
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        out[r].status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        done[r] = true;
        --left;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < started; ++r)
    if (!done[r]) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], nullptr, 0);
    }
  for (int r = 0; r < started; ++r) {
    std::ifstream f(logs[r]);
    std::stringstream ss;
    ss << f.rdbuf();
    out[r].output = ss.str();
    std::filesystem::remove(logs[r]);
  }
  std::error_code ec;
  std::filesystem::remove_all("/tmp/kiln-rendezvous/127.0.0.1-" + std::to_string(port) + "-" + run_id, ec);
  return out;
}

}  // namespace kiln::testing
