// init_process_group and the groups made from the world: where the ranks meet (rendezvous),
// sub-groups by rank list or by color, and ProcessGroup handles.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <random>
#include <thread>

#include "runtime/core/error.h"
#include "runtime/dist/group.h"

namespace kiln::dist {
namespace {

std::mutex g_world_mu;
std::shared_ptr<Group> g_world;
std::string g_owned_store_dir;  // a rendezvous directory kiln named itself (removed at destroy)
std::map<const Group*, int> g_children;  // sub-groups made from each group so far (their keys)
std::string g_owner_key;  // this job's owner record in the store (marked done at destroy)

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int env_int(const char* name, const char* fallback) {
  const char* v = env(name);
  if (!v && fallback) v = env(fallback);
  if (!v) return -1;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  KILN_CHECK(end && *end == 0 && x >= 0, "init_process_group: ", env(name) ? name : fallback,
             " must be a non-negative integer, got \"", v, "\"");
  return static_cast<int>(x);
}

bool is_local_address(const std::string& addr) {
  if (addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0) return true;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return addr == host;
}

// The store URL of the rendezvous: the given init method, else env:// (MASTER_ADDR and
// MASTER_PORT), else a directory named by mpirun's job id.
std::string store_url(const ProcessGroupOptions& o) {
  std::string m = o.init_method;
  if (m.empty()) m = env("MASTER_ADDR") || !env("OMPI_COMM_WORLD_RANK") ? "env://" : "mpi://";
  if (m.rfind("file://", 0) == 0 || m.rfind("redis://", 0) == 0) return m;
  const char* run_id = env("KILN_RUN_ID") ? env("KILN_RUN_ID") : env("TORCHELASTIC_RUN_ID");
  if (m == "mpi://") {
    const char* job = env("OMPI_MCA_ess_base_jobid") ? env("OMPI_MCA_ess_base_jobid") : env("OMPI_MCA_orte_ess_jobid");
    KILN_CHECK(job, "init_process_group: under mpirun without MASTER_ADDR kiln meets through a directory named by ",
               "Open MPI's job id (OMPI_MCA_ess_base_jobid), which is not set; set MASTER_ADDR and MASTER_PORT");
    g_owned_store_dir = std::string("/tmp/kiln-rendezvous/mpi-") + job;
    return "file://" + g_owned_store_dir;
  }
  KILN_CHECK(m == "env://", "init_process_group: init_method must be env://, file:///path or redis://host:port, got \"",
             m, "\"");
  const char* addr = env("MASTER_ADDR");
  const char* port = env("MASTER_PORT");
  KILN_CHECK(addr && port, "init_process_group: env:// needs MASTER_ADDR and MASTER_PORT (", addr ? "" : "MASTER_ADDR ",
             port ? "" : "MASTER_PORT ", "not set); start the ranks with kiln-run or torchrun, or pass init_method");
  if (!is_local_address(addr)) return std::string("redis://") + addr + ":" + port;
  // One host: a directory of files, named by the address, the port and the launcher's run id.
  g_owned_store_dir = std::string("/tmp/kiln-rendezvous/") + addr + "-" + port + (run_id ? std::string("-") + run_id : "");
  return "file://" + g_owned_store_dir;
}

// A fresh key prefix for this job. Jobs meeting through one store (a Redis server kept across
// runs, a directory a crashed run left) take numbered owner records "kiln/owner/N": rank 0
// writes the first N whose record is free, or belongs to a finished job (its "/done" marker,
// written by destroy_process_group) or to a crashed one on this host (its pid gone); the others
// take the first such N whose record is this generation's and live. A live job at the same
// store is an error.
std::string world_prefix(Store& store, int rank, std::chrono::milliseconds timeout) {
  static int generation = 0;  // init_process_group calls so far (the same on every rank)
  const int gen = generation++;
  const std::string me = host_name();
  struct Owner {
    std::string host;
    long pid = 0;
    int gen = -1;
    std::string nonce;
  };
  auto key = [](int n) { return "kiln/owner/" + std::to_string(n); };
  // Record n, once there (nullopt after `wait`).
  auto read_owner = [&](int n, std::chrono::milliseconds wait) -> std::optional<Owner> {
    if (!store.wait({key(n)}, wait)) return std::nullopt;
    Owner o;
    std::istringstream in(store.get(key(n), std::chrono::milliseconds(1)));
    in >> o.host >> o.pid >> o.gen >> o.nonce;
    return o;
  };
  auto finished = [&](int n, const Owner& o) {
    return store.wait({key(n) + "/done"}, std::chrono::milliseconds(0)) || (o.host == me && process_gone(o.pid));
  };
  if (rank == 0) {
    int n = 0;
    for (;; ++n) {
      auto o = read_owner(n, std::chrono::milliseconds(0));
      if (!o) break;
      KILN_CHECK(finished(n, *o), "init_process_group: another job (pid ", o->pid, " on ", o->host,
                 ") is meeting through the same store ", store.where(), "; give this one its own MASTER_PORT or KILN_RUN_ID");
    }
    std::random_device rd;
    const std::string nonce = std::to_string(rd()) + std::to_string(rd());
    store.set(key(n), me + " " + std::to_string(getpid()) + " " + std::to_string(gen) + " " + nonce);
    g_owner_key = key(n);
    return "kiln/world/" + nonce;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int n = 0;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    std::optional<Owner> o = left.count() > 0 ? read_owner(n, left) : std::nullopt;
    if (!o)
      throw Error(detail::cat("dist: rendezvous failed: rank 0 did not join within ", timeout.count(), " ms (store ",
                              store.where(), "); check that rank 0 started and MASTER_ADDR / MASTER_PORT"));
    if (finished(n, *o) || o->gen != gen) {
      ++n;  // an earlier job's record: rank 0 writes a later one
      continue;
    }
    g_owner_key = key(n);
    return "kiln/world/" + o->nonce;
  }
}

std::string libraries_for(const std::string& backend) {
  if (backend == "gloo" || backend == "nccl") return backend;
  KILN_CHECK(backend == "auto", "init_process_group: backend must be \"gloo\", \"nccl\" or \"auto\", got \"", backend,
             "\"");
  return backend_available("gloo") ? "gloo+nccl" : "nccl";
}

// A child of `parent` with these world-rank members (every parent rank calls this in the same
// order, members or not).
ProcessGroup make_child(Group& parent, const std::string& tag, std::vector<int> members) {
  const int n = ++g_children[&parent];
  const int me = parent.rank() < 0 ? -1 : parent.members()[static_cast<size_t>(parent.rank())];
  const auto it = std::find(members.begin(), members.end(), me);
  const int rank = me >= 0 && it != members.end() ? static_cast<int>(it - members.begin()) : -1;
  auto g = std::make_shared<Group>(parent.store(), parent.prefix() + "/" + tag + std::to_string(n), std::move(members),
                                   rank, parent.libraries(), parent.timeout());
  g->connect();
  return ProcessGroup(g);
}

}  // namespace

std::shared_ptr<Group> world_group() {
  std::lock_guard<std::mutex> lock(g_world_mu);
  return g_world;
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Product: return "product";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

int local_rank() {
  int r = env_int("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK");
  return r < 0 ? 0 : r;
}

void init_process_group(const ProcessGroupOptions& o) {
  KILN_CHECK(!is_initialized(), "init_process_group: already initialized (call destroy_process_group first)");
  const int rank = o.rank >= 0 ? o.rank : env_int("RANK", "OMPI_COMM_WORLD_RANK");
  const int size = o.world_size >= 0 ? o.world_size : env_int("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE");
  KILN_CHECK(rank >= 0 && size > 0, "init_process_group: the rank and world size are not known (RANK / WORLD_SIZE ",
             "or mpirun's OMPI_COMM_WORLD_RANK / _SIZE not set); start the ranks with kiln-run, torchrun or mpirun, ",
             "or pass ProcessGroupOptions::rank and world_size");
  KILN_CHECK(rank < size, "init_process_group: rank ", rank, " is out of range for world size ", size);
  KILN_CHECK(o.timeout.count() > 0, "init_process_group: timeout must be positive");
  const std::string libraries = libraries_for(o.backend);
  std::string why;
  for (const char* lib : {"gloo", "nccl"})
    if (libraries.find(lib) != std::string::npos && o.backend != "auto")
      KILN_CHECK(backend_available(lib, &why), "init_process_group: backend ", lib, " is unavailable: ", why);
  // A peer that dies leaves its sockets closed: a write to one would raise SIGPIPE, whose default
  // action ends this process silently (Gloo's writev does not pass MSG_NOSIGNAL). Ignored unless
  // the program installed a handler of its own, so the write fails and becomes a kiln::Error
  // naming the dead rank.
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);
  g_owned_store_dir.clear();
  const std::string url = store_url(o);
  if (!g_owned_store_dir.empty()) std::filesystem::create_directories(g_owned_store_dir);
  std::vector<int> members(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) members[static_cast<size_t>(r)] = r;
  // One process per GPU: kiln's kernels run on this rank's LOCAL_RANK device (as a PyTorch user
  // calls torch.cuda.set_device(local_rank)); left alone when kernels already run elsewhere.
  if (libraries.find("nccl") != std::string::npos && cuda::is_available() && local_rank() < cuda::device_count()) try {
      cuda::set_device(local_rank());
    } catch (const Error&) {
    }
  std::shared_ptr<Store> store = make_store(url);
  const std::string prefix = world_prefix(*store, rank, o.timeout);
  auto g = std::make_shared<Group>(store, prefix, std::move(members), rank, libraries, o.timeout);
  g->connect();
  if (libraries == "nccl") g->run("init", cuda(local_rank()), [](Backend&) -> CompletionPtr { return nullptr; });
  std::lock_guard<std::mutex> lock(g_world_mu);
  g_world = std::move(g);
}

void destroy_process_group() {
  std::shared_ptr<Group> g;
  {
    std::lock_guard<std::mutex> lock(g_world_mu);
    g = std::move(g_world);
  }
  if (!g) return;
  // Once every rank is done: rank 0 marks the job's owner record finished (a later job at the
  // same store, a Redis server kept across runs, takes the next record) and removes a rendezvous
  // directory kiln named.
  bool all_here = false;
  try {
    g->run("barrier", g->libraries().find("gloo") != std::string::npos ? cpu() : cuda(local_rank()),
           [](Backend& b) -> CompletionPtr {
             b.barrier();
             return nullptr;
           });
    all_here = true;
    if (g->rank() == 0 && !g_owner_key.empty()) g->store()->set(g_owner_key + "/done", "1");
  } catch (const Error&) {
  }
  g->shutdown(false);
  if (all_here && g->rank() == 0 && !g_owned_store_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(g_owned_store_dir, ec);
  }
  g_children.clear();
}

bool is_initialized() { return world_group() != nullptr; }

ProcessGroup world() {
  auto g = world_group();
  KILN_CHECK(g, "dist: no process group; call kiln::dist::init_process_group() first");
  return ProcessGroup(g);
}

Group& ProcessGroup::impl() const {
  if (g_) return *g_;
  auto w = world_group();
  KILN_CHECK(w, "dist: no process group; call kiln::dist::init_process_group() first");
  return *w;
}
int ProcessGroup::rank() const { return impl().rank(); }
int ProcessGroup::size() const { return impl().size(); }
const std::vector<int>& ProcessGroup::ranks() const { return impl().members(); }
std::string ProcessGroup::backend() const { return impl().libraries(); }

int get_rank(const ProcessGroup& group) { return group.rank(); }
int get_world_size(const ProcessGroup& group) { return group.size(); }

ProcessGroup new_group(std::vector<int> ranks, const ProcessGroup& parent) {
  Group& p = parent.impl();
  std::sort(ranks.begin(), ranks.end());
  KILN_CHECK(std::adjacent_find(ranks.begin(), ranks.end()) == ranks.end(), "new_group: ranks repeat");
  for (int r : ranks)
    KILN_CHECK(std::find(p.members().begin(), p.members().end(), r) != p.members().end(), "new_group: rank ", r,
               " is not in the parent group of ", p.size(), " ranks");
  return make_child(p, "g", std::move(ranks));
}

ProcessGroup split_group(int color, int key, const ProcessGroup& parent) {
  Group& p = parent.impl();
  KILN_CHECK(p.rank() >= 0, "split_group: this process is not a member of the parent group");
  // Every member publishes (color, key) in the store; all read all.
  const int n = g_children[&p] + 1;
  const std::string base = p.prefix() + "/split" + std::to_string(n) + "/";
  p.store()->set(base + std::to_string(p.rank()), std::to_string(color) + " " + std::to_string(key));
  struct Entry {
    int color, key, world;
  };
  std::vector<Entry> all;
  for (int r = 0; r < p.size(); ++r) {
    const std::string v = p.store()->get(base + std::to_string(r), p.timeout());
    const auto sp = v.find(' ');
    all.push_back({std::stoi(v.substr(0, sp)), std::stoi(v.substr(sp + 1)), p.members()[static_cast<size_t>(r)]});
  }
  std::vector<Entry> mine;
  for (const Entry& e : all)
    if (color >= 0 && e.color == color) mine.push_back(e);
  std::stable_sort(mine.begin(), mine.end(),
                   [](const Entry& a, const Entry& b) { return a.key != b.key ? a.key < b.key : a.world < b.world; });
  std::vector<int> members;
  for (const Entry& e : mine) members.push_back(e.world);
  ++g_children[&p];
  auto g = std::make_shared<Group>(p.store(), base + "c" + std::to_string(color), members,
                                   color < 0 ? -1 : static_cast<int>(std::find_if(mine.begin(), mine.end(), [&](const Entry& e) {
                                                      return e.world == p.members()[static_cast<size_t>(p.rank())];
                                                    }) - mine.begin()),
                                   p.libraries(), p.timeout());
  if (color >= 0) g->connect();
  return ProcessGroup(g);
}

}  // namespace kiln::dist
