// Process groups: membership, rendezvous, the backend per device and failures as kiln::Error.
#include "runtime/dist/group.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <map>

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

std::string host_name() {
  char buf[256] = {};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

// Whether process `pid` on this host has exited (gone, or a zombie not yet reaped).
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
    nccl_ = make_backend("nccl", spec);
    nccl_device_ = device.index;
  }
  KILN_CHECK(device.index == nccl_device_, "dist: the group's NCCL communicator is on cuda:", nccl_device_,
             ", the tensor is on ", device.str(), "; one process drives one GPU");
  return *nccl_;
}

std::string Group::gone_ranks() {
  const std::string me = host_name();
  std::vector<int> gone;
  for (int r = 0; r < size(); ++r) {
    if (r == rank_) continue;
    std::string who;
    try {
      who = store_->get(prefix_ + "/member/" + std::to_string(r), std::chrono::milliseconds(0));
    } catch (...) {
      continue;
    }
    const auto sp = who.rfind(' ');
    if (sp == std::string::npos || who.substr(0, sp) != me) continue;
    if (process_gone(std::stol(who.substr(sp + 1)))) gone.push_back(members_[r]);
  }
  if (gone.empty()) return "";
  return detail::cat("; rank", gone.size() > 1 ? "s " : " ", join(gone), gone.size() > 1 ? " have" : " has",
                     " exited");
}

CompletionPtr Group::run(const char* what, Device device, const std::function<CompletionPtr(Backend&)>& op) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Backend& b = backend_for(device);
  try {
    return op(b);
  } catch (const std::exception& e) {
    throw Error(detail::cat("dist: ", what, " on rank ", members_[rank_], " (", b.name(), ", group of ", size(),
                            ", timeout ", timeout_.count(), " ms) failed: ", e.what(), gone_ranks()));
  }
}

void Group::check_same(const char* what, Device device, const std::vector<int64_t>& words) {
  std::vector<int64_t> all;
  run(what, device.type == DeviceType::CPU || !gloo_ ? device : cpu(), [&](Backend& b) -> CompletionPtr {
    all = b.exchange(words);
    return nullptr;
  });
  if (all.empty()) return;
  const size_t n = words.size();
  for (int r = 0; r < size(); ++r)
    if (!std::equal(words.begin(), words.end(), all.begin() + static_cast<std::ptrdiff_t>(r * n))) {
      std::string s;
      for (int q = 0; q < size(); ++q) {
        s += detail::cat(q ? "; " : "", "rank ", members_[q], ": [");
        for (size_t i = 0; i < n; ++i) s += detail::cat(i ? ", " : "", all[q * n + i]);
        s += "]";
      }
      throw Error(detail::cat("dist: ", what, ": the ranks disagree on the collective (kind, dtype, element counts ",
                              "per rank): ", s, "; every rank must make the same collectives with matching tensors"));
    }
}

void Group::shutdown(bool abort) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (abort) {
    if (nccl_) nccl_->abort();
    if (gloo_) gloo_->abort();
  }
  nccl_.reset();
  gloo_.reset();
}

}  // namespace kiln::dist
