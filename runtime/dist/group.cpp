// Process groups: membership, rendezvous, the backend per device and failures as kiln::Error.
#include "runtime/dist/group.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>
#include <thread>

#include "runtime/core/error.h"

namespace kiln::dist {
namespace {

// Never destroyed: groups still alive at exit (no destroy_process_group) unregister after
// static destruction has begun.
std::mutex& g_registry_mu = *new std::mutex;
std::map<int64_t, std::weak_ptr<Group>>& registry() {
  static auto* r = new std::map<int64_t, std::weak_ptr<Group>>;
  return *r;
}
std::atomic<int64_t> g_next_id{1};

}  // namespace

std::string host_name() {
  char buf[256] = {};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

bool process_gone(long pid) {
  if (kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string skip, comm, state;
  if (!(stat >> skip)) return true;
  // The command name is in parentheses and may hold spaces: skip to the last ')'.
  std::string rest((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto close = rest.rfind(')');
  if (close == std::string::npos) return false;
  const auto st = rest.find_first_not_of(' ', close + 1);
  return st != std::string::npos && (rest[st] == 'Z' || rest[st] == 'X');
}

namespace {

std::string join(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

}  // namespace

Group::Group(std::shared_ptr<Store> store, std::string prefix, std::vector<int> members, int rank,
             std::string libraries, std::chrono::milliseconds timeout)
    : store_(std::move(store)),
      prefix_(std::move(prefix)),
      members_(std::move(members)),
      rank_(rank),
      libraries_(std::move(libraries)),
      timeout_(timeout),
      id_(g_next_id++) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  registry()[id_] = std::weak_ptr<Group>();
}

Group::~Group() {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  registry().erase(id_);
}

std::shared_ptr<Group> Group::find(int64_t id) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  auto it = registry().find(id);
  std::shared_ptr<Group> g = it == registry().end() ? nullptr : it->second.lock();
  KILN_CHECK(g, "dist: a collective refers to a process group that was destroyed (group ", id,
             "); destroy_process_group() ends every group");
  return g;
}

void Group::announce() {
  store_->set(prefix_ + "/member/" + std::to_string(rank_), host_name() + " " + std::to_string(getpid()));
}

void Group::connect() {
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    registry()[id_] = weak_from_this();
  }
  if (rank_ < 0) return;
  announce();
  std::vector<std::string> keys;
  for (int r = 0; r < size(); ++r) keys.push_back(prefix_ + "/member/" + std::to_string(r));
  if (!store_->wait(keys, timeout_)) {
    std::vector<int> missing;
    for (int r = 0; r < size(); ++r)
      if (!store_->wait({keys[static_cast<size_t>(r)]}, std::chrono::milliseconds(0))) missing.push_back(members_[r]);
    throw Error(detail::cat("dist: rendezvous failed: rank", missing.size() > 1 ? "s " : " ", join(missing),
                            " did not join within ", timeout_.count(), " ms (", size(), " expected, store ",
                            store_->where(), "); check WORLD_SIZE and that every rank started"));
  }
  GroupSpec spec{store_, prefix_, rank_, size(), timeout_, cpu()};
  try {
    if (libraries_.find("gloo") != std::string::npos) gloo_ = make_backend("gloo", spec);
    // CUDA collectives are checked off their path through a Gloo context of their own wherever
    // kiln has Gloo, also for a group whose backend is "nccl" alone.
    if (libraries_.find("nccl") != std::string::npos && backend_available("nccl") && backend_available("gloo"))
      start_checker(spec);
  } catch (const Error& e) {
    throw Error(detail::cat("dist: connecting rank ", members_[rank_], " to the group of ", size(), " failed: ",
                            e.what(), gone_ranks()));
  }
}

Backend& Group::backend_for(Device device) {
  KILN_CHECK(rank_ >= 0, "dist: this process is not a member of the group of ranks [", join(members_),
             "]; only members call its collectives");
  if (device.type == DeviceType::CPU) {
    KILN_CHECK(gloo_, "dist: the process group's backend is ", libraries_,
               ", which has no CPU collectives; init_process_group with backend \"gloo\" or \"auto\"");
    return *gloo_;
  }
  KILN_CHECK(libraries_.find("nccl") != std::string::npos, "dist: the process group's backend is ", libraries_,
             ", which has no CUDA collectives; init_process_group with backend \"nccl\" or \"auto\"");
  if (!nccl_) {
    // NCCL's communicator is made at the first CUDA collective (every member calls it), on
    // the device of that tensor.
    GroupSpec spec{store_, prefix_ + "/nccl", rank_, size(), timeout_, device};
    spec.peers_gone = [w = weak_from_this()]() -> std::string {
      auto g = w.lock();
      if (!g) return "";
      const std::string gone = g->gone_ranks(false);
      return gone.empty() ? gone : gone.substr(2);  // (without the leading "; ")
    };
    spec.settle_checks = [w = weak_from_this()] {
      if (auto g = w.lock()) g->settle_checks_queued_here();
    };
    auto made = make_backend("nccl", spec);
    std::lock_guard<std::mutex> lock(nccl_mu_);
    nccl_ = std::move(made);
    nccl_device_ = device.index;
    // A disagreement the checker found while the communicator was being made aborts it now.
    const std::string found = disagreement_found();
    if (!found.empty()) nccl_->abort(found + "; the communicator was aborted");
  }
  KILN_CHECK(device.index == nccl_device_, "dist: the group's NCCL communicator is on cuda:", nccl_device_,
             ", the tensor is on ", device.str(), "; one process drives one GPU");
  return *nccl_;
}

std::vector<std::pair<int, long>> Group::local_peers() {
  std::lock_guard<std::mutex> lock(peers_mu_);
  if (peers_known_) return peers_;
  const std::string me = host_name();
  bool all = true;
  std::vector<std::pair<int, long>> peers;
  for (int r = 0; r < size(); ++r) {
    if (r == rank_) continue;
    std::string who;
    try {
      who = store_->get(prefix_ + "/member/" + std::to_string(r), std::chrono::milliseconds(1));
    } catch (...) {
      all = false;
      continue;
    }
    const auto sp = who.rfind(' ');
    if (sp != std::string::npos && who.substr(0, sp) == me) peers.emplace_back(members_[r], std::stol(who.substr(sp + 1)));
  }
  if (all) {  // (kept once every member's record was read)
    peers_ = peers;
    peers_known_ = true;
  }
  return peers;
}

std::string Group::gone_ranks(bool patience) {
  const std::vector<std::pair<int, long>> peers = local_peers();
  // A peer that closed its connections may still be exiting: look again for up to a second.
  std::vector<int> gone;
  for (int attempt = 0; attempt < (patience ? 50 : 1) && gone.empty() && !peers.empty(); ++attempt) {
    if (attempt) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (const auto& [rank, pid] : peers)
      if (process_gone(pid)) gone.push_back(rank);
  }
  if (gone.empty()) return "";
  return detail::cat("; rank", gone.size() > 1 ? "s " : " ", join(gone), gone.size() > 1 ? " have" : " has",
                     " exited");
}

namespace {

// A backend's completion whose failure, found when it is waited for (Gloo's worker, NCCL's
// watchdog), is worded like a failure at the call: the collective, the rank, the ranks gone.
class Worded final : public Completion {
 public:
  Worded(CompletionPtr inner, std::function<std::string(const std::exception&)> word)
      : inner_(std::move(inner)), word_(std::move(word)) {}
  void wait() override {
    try {
      inner_->wait();
    } catch (const std::exception& e) {
      throw Error(word_(e));
    }
  }
  bool done() override { return inner_->done(); }

 private:
  CompletionPtr inner_;
  std::function<std::string(const std::exception&)> word_;
};

}  // namespace

CompletionPtr Group::run(const char* what, Device device, const std::function<CompletionPtr(Backend&)>& op) {
  // Two threads calling one group's collectives at once meet the ranks in no agreed order (one
  // rank's first call may pair with another's second): refused. Each thread takes its own group.
  std::unique_lock<std::recursive_mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock())
    throw Error(detail::cat("dist: ", what, ": the group of ", size(), " ranks is in use by another thread; the order "
                            "of its collectives across ranks cannot be guaranteed when threads share a group: give "
                            "each thread its own (new_group)"));
  raise_disagreement();
  Backend& b = backend_for(device);
  const char* lib = b.name();
  auto word = [what, lib, g = weak_from_this()](const std::exception& e) {
    auto self = g.lock();
    if (!self) return detail::cat("dist: ", what, " (", lib, ") failed: ", e.what());
    const std::string why = e.what();
    const bool named = why.find(" exited") != std::string::npos;  // (the watchdog named the dead ranks already)
    return detail::cat("dist: ", what, " on rank ", self->members_[self->rank_], " (", lib, ", group of ", self->size(),
                       ", timeout ", self->timeout_.count(), " ms) failed: ", why, named ? "" : self->gone_ranks());
  };
  try {
    CompletionPtr c = op(b);
    return c ? std::make_shared<Worded>(std::move(c), word) : nullptr;
  } catch (const std::exception& e) {
    throw Error(word(e));
  }
}

namespace {

// What each rank passed, when they differ ("" when they agree).
std::string disagreement(const char* what, const std::vector<int64_t>& words, const std::vector<int64_t>& all,
                         const std::vector<int>& members) {
  const size_t n = words.size();
  if (all.size() != n * members.size()) return "";
  bool same = true;
  for (size_t r = 0; r < members.size() && same; ++r)
    same = std::equal(words.begin(), words.end(), all.begin() + static_cast<std::ptrdiff_t>(r * n));
  if (same) return "";
  std::string s;
  for (size_t q = 0; q < members.size(); ++q) {
    s += detail::cat(q ? "; " : "", "rank ", members[q], ": [");
    for (size_t i = 0; i < n; ++i) s += detail::cat(i ? ", " : "", all[q * n + i]);
    s += "]";
  }
  return detail::cat("dist: ", what, ": the ranks disagree on the collective (kind, dtype, element counts per rank): ",
                     s, "; every rank must make the same collectives with matching tensors");
}

}  // namespace

// The checks of CUDA collectives, on a thread and a Gloo context of their own.
struct Group::Checker {
  std::unique_ptr<Backend> gloo;
  std::vector<int> members;
  std::weak_ptr<Group> group;
  std::mutex mu;
  std::condition_variable cv;
  struct Check {
    const char* what;
    std::vector<int64_t> words;
    bool before;  // checked before the collective (KILN_DIST_DEBUG): a disagreement is raised, not kept
  };
  std::deque<Check> queue;
  std::string error;  // a disagreement found after its collective ran (kept: the group is broken)
  std::string refused;  // one found before its collective ran (raised once by its caller)
  bool busy = false, stop = false;

  void loop() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return stop || !queue.empty(); });
      if (stop) return;
      auto [what, words, before] = std::move(queue.front());
      queue.pop_front();
      busy = true;
      lock.unlock();
      std::string found;
      bool broken = false;
      try {
        found = disagreement(what, words, gloo->exchange(words), members);
      } catch (const std::exception& e) {
        // A peer is gone (its connection closed): that is the collective's failure too.
        auto g = group.lock();
        found = detail::cat("dist: ", what, " failed: the agreement check could not reach every rank (", e.what(),
                            ")", g ? g->gone_ranks() : std::string());
        broken = true;
      }
      lock.lock();
      busy = false;
      if (!found.empty() && before && !broken) {
        refused = found;  // (nothing was sent: the group goes on)
      } else if (!found.empty() && error.empty()) {
        error = found;
        lock.unlock();
        if (auto g = group.lock()) g->abort_nccl(found);
        lock.lock();
      }
      cv.notify_all();
      if (broken) {
        stop = true;
        return;
      }
    }
  }
};

void Group::start_checker(const GroupSpec& spec) {
  GroupSpec cs = spec;
  cs.prefix += "/check";
  auto c = std::make_shared<Checker>();
  c->gloo = make_backend("gloo", cs);
  c->members = members_;
  c->group = weak_from_this();
  std::thread([c] { c->loop(); }).detach();
  checker_ = std::move(c);
}

void Group::abort_nccl(const std::string& why) {
  std::lock_guard<std::mutex> lock(nccl_mu_);
  if (nccl_) nccl_->abort(why + "; the communicator was aborted");
}

std::string Group::disagreement_found() {
  if (!checker_) return "";
  std::lock_guard<std::mutex> lock(checker_->mu);
  return checker_->error;
}

void Group::raise_disagreement() {
  if (!checker_) return;
  std::lock_guard<std::mutex> lock(checker_->mu);
  if (!checker_->error.empty()) throw Error(checker_->error);
}

namespace {
// The groups whose CUDA collectives this thread queued checks for since it last settled them.
// A host sync settles only these: settling another thread's groups would make this thread wait
// for collectives that thread issues, and two threads doing so on two ranks wait for each other.
thread_local std::vector<int64_t> t_unsettled;
}  // namespace

void Group::settle_checks_queued_here() {
  auto it = std::find(t_unsettled.begin(), t_unsettled.end(), id_);
  if (it == t_unsettled.end()) return;
  t_unsettled.erase(it);
  settle_checks();
}

void Group::settle_checks() {
  std::shared_ptr<Checker> c = checker_;
  if (!c) return;
  {
    std::unique_lock<std::mutex> lock(c->mu);
    if (!c->cv.wait_for(lock, timeout_, [&] { return c->stop || !c->error.empty() || (c->queue.empty() && !c->busy); }))
      throw Error(detail::cat("dist: the agreement check of a collective did not finish within ", timeout_.count(),
                              " ms (a rank stopped taking part)", gone_ranks()));
  }
  raise_disagreement();
}

void Group::check_same(const char* what, Device device, const std::vector<int64_t>& words, bool before) {
  if (device.type != DeviceType::CPU && checker_) {
    raise_disagreement();
    {
      std::lock_guard<std::mutex> lock(checker_->mu);
      checker_->queue.push_back({what, words, before});
    }
    checker_->cv.notify_all();
    if (std::find(t_unsettled.begin(), t_unsettled.end(), id_) == t_unsettled.end()) t_unsettled.push_back(id_);
    if (before) {
      settle_checks();
      std::lock_guard<std::mutex> lock(checker_->mu);
      if (!checker_->refused.empty()) throw Error(std::exchange(checker_->refused, std::string()));
    }
    return;
  }
  std::vector<int64_t> all;
  run(what, device.type == DeviceType::CPU || !gloo_ ? device : cpu(), [&](Backend& b) -> CompletionPtr {
    all = b.exchange(words);
    return nullptr;
  });
  const std::string found = disagreement(what, words, all, members_);
  if (!found.empty()) throw Error(found);
}

void Group::shutdown(bool abort) {
  if (checker_) {
    {
      std::lock_guard<std::mutex> lock(checker_->mu);
      checker_->stop = true;
    }
    checker_->cv.notify_all();
    checker_.reset();  // (its thread holds it until it returns)
  }
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (abort) {
    if (nccl_) nccl_->abort();
    if (gloo_) gloo_->abort();
  }
  {
    std::lock_guard<std::mutex> nlock(nccl_mu_);
    nccl_.reset();
  }
  gloo_.reset();
}

}  // namespace kiln::dist
