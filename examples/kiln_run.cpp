// kiln-run: starts the ranks of a distributed kiln program on this host, as torchrun does.
//
//   kiln-run --nproc 4 ./train --steps 100
//   kiln-run --nnodes 2 --node-rank 0 --master-addr host0 --master-port 29500 --nproc 8 ./train
//
// Each process gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
// KILN_RUN_ID (kiln::dist::init_process_group reads them). When a rank fails, the others get
// --grace seconds to report their own errors, then SIGTERM; kiln-run exits with the first
// failing rank's status.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: kiln-run [--nproc N] [--nnodes M --node-rank K] [--master-addr A] [--master-port P]\n"
               "                [--grace SECONDS] program [args...]\n");
  return 2;
}

// A port nobody listens on now (the kernel's pick).
int free_port() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 29500;
  if (s >= 0 && bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  if (s >= 0) close(s);
  return port;
}

std::vector<pid_t> g_children;
void forward(int sig) {
  for (pid_t p : g_children) kill(p, sig);
}

}  // namespace

int main(int argc, char** argv) {
  int nproc = 1, nnodes = 1, node_rank = 0, port = 0, grace = 5;
  std::string addr = "127.0.0.1";
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage();
    const char* v = argv[++i];
    if (a == "--nproc" || a == "--nproc-per-node" || a == "--nproc_per_node") nproc = std::atoi(v);
    else if (a == "--nnodes") nnodes = std::atoi(v);
    else if (a == "--node-rank" || a == "--node_rank") node_rank = std::atoi(v);
    else if (a == "--master-addr" || a == "--master_addr") addr = v;
    else if (a == "--master-port" || a == "--master_port") port = std::atoi(v);
    else if (a == "--grace") grace = std::atoi(v);
    else return usage();
  }
  if (i >= argc || nproc < 1 || nnodes < 1 || node_rank < 0 || node_rank >= nnodes) return usage();
  if (port == 0) {
    if (nnodes > 1) {
      std::fprintf(stderr, "kiln-run: --master-port is needed with several nodes\n");
      return 2;
    }
    port = free_port();
  }
  std::random_device rd;
  const char* given_id = std::getenv("KILN_RUN_ID");
  const std::string run_id = nnodes > 1 && given_id ? given_id : std::to_string(getpid()) + "-" + std::to_string(rd());
  const int world = nproc * nnodes;
  signal(SIGINT, forward);
  signal(SIGTERM, forward);
  for (int local = 0; local < nproc; ++local) {
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("kiln-run: fork");
      forward(SIGTERM);
      return 1;
    }
    if (pid == 0) {
      setenv("RANK", std::to_string(node_rank * nproc + local).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      setenv("GROUP_RANK", std::to_string(node_rank).c_str(), 1);
      setenv("MASTER_ADDR", addr.c_str(), 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      setenv("KILN_RUN_ID", run_id.c_str(), 1);
      execvp(argv[i], argv + i);
      std::perror(("kiln-run: " + std::string(argv[i])).c_str());
      _exit(127);
    }
    g_children.push_back(pid);
  }
  int first_failure = 0, left = nproc;
  std::chrono::steady_clock::time_point kill_at{};
  bool killing = false;
  while (left > 0) {
    int st = 0;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p > 0) {
      --left;
      const int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      if (code != 0 && first_failure == 0) {
        first_failure = code;
        int rank = 0;
        for (size_t k = 0; k < g_children.size(); ++k)
          if (g_children[k] == p) rank = node_rank * nproc + static_cast<int>(k);
        std::fprintf(stderr, "kiln-run: rank %d exited with status %d\n", rank, code);
        kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(grace);
      }
      continue;
    }
    if (first_failure && !killing && std::chrono::steady_clock::now() >= kill_at) {
      killing = true;
      forward(SIGTERM);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return first_failure;
}
