// A process group's internals: its members, its backends (Gloo for CPU tensors, NCCL for CUDA
// tensors) and how a failure becomes a kiln::Error that names the collective and the ranks.
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <thread>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/dist/backend.h"
#include "runtime/dist/dist.h"

namespace kiln::dist {

class Group : public std::enable_shared_from_this<Group> {
 public:
  // `members`: world ranks in group order; `rank`: this process's group rank (-1: not one).
  Group(std::shared_ptr<Store> store, std::string prefix, std::vector<int> members, int rank, std::string libraries,
        std::chrono::milliseconds timeout);
  ~Group();
  int rank() const { return rank_; }
  int size() const { return static_cast<int>(members_.size()); }
  const std::vector<int>& members() const { return members_; }
  int64_t id() const { return id_; }
  const std::string& libraries() const { return libraries_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  const std::shared_ptr<Store>& store() const { return store_; }
  const std::string& prefix() const { return prefix_; }

  // Connects the backends named by `libraries` that are made eagerly (rendezvous: every member
  // announces itself; those missing after the timeout are named in the error).
  void connect();
  // Runs `op` (a collective called `what`) on the backend for `device`, under the group's lock;
  // a failure becomes a kiln::Error naming `what`, this rank and the ranks that are gone.
  CompletionPtr run(const char* what, Device device, const std::function<CompletionPtr(Backend&)>& op);
  // Checks every member called the same collective with the same sizes (a host exchange of
  // `words`); throws kiln::Error listing what each rank passed when they differ. A CUDA
  // collective is checked off the calling thread wherever kiln has Gloo (no latency on its path):
  // a disagreement aborts the NCCL communicator and is raised at the group's next call and at the
  // next host read of the device.
  // With `before` (KILN_DIST_DEBUG) the check of a CUDA collective completes before it runs.
  void check_same(const char* what, Device device, const std::vector<int64_t>& words, bool before = false);
  // Whether CUDA collectives are checked off their path (NCCL in the group, Gloo in the build).
  bool checks_off_path() const { return checker_ != nullptr; }
  // Waits until the checks queued so far are done; raises a disagreement they found.
  void settle_checks();
  // The number of this group's next checked collective (KILN_DIST_DEBUG compares it across
  // ranks: a rank that skipped or added a collective of the group is named). Per group, since a
  // rank outside a sub-group makes none of its collectives.
  int64_t next_check_number() { return check_number_++; }
  // settle_checks() when this thread queued checks on the group since it last settled them.
  void settle_checks_queued_here();
  // The group with id `id` (the node attribute of a collective), or Error.
  static std::shared_ptr<Group> find(int64_t id);
  // Releases the backends (aborting them when `abort`).
  void shutdown(bool abort);

 private:
  struct Checker;
  Backend& backend_for(Device device);
  void raise_disagreement();
  std::string disagreement_found();
  void start_checker(const GroupSpec& spec);
  void abort_nccl(const std::string& why);
  // "; rank 1 has exited" for peers on this host whose process is gone ("" when none); with
  // `patience`, looks again for up to a second (a peer that closed its sockets may be exiting).
  std::string gone_ranks(bool patience = true);
  std::vector<std::pair<int, long>> local_peers();
  void announce();

  std::shared_ptr<Store> store_;
  std::string prefix_;
  std::vector<int> members_;
  int rank_;
  std::string libraries_;
  std::chrono::milliseconds timeout_;
  int64_t id_;
  std::recursive_mutex mu_;
  std::unique_ptr<Backend> gloo_, nccl_;
  std::mutex nccl_mu_;  // nccl_'s pointer between its maker and the checker's abort
  std::shared_ptr<Checker> checker_;
  int nccl_device_ = -1;
  std::atomic<int64_t> check_number_{0};
  std::mutex peers_mu_;
  std::vector<std::pair<int, long>> peers_;  // (world rank, pid) of the members on this host
  bool peers_known_ = false;
};

// This host's name, and whether process `pid` on it has exited (gone, or a zombie not reaped).
std::string host_name();
bool process_gone(long pid);

// The world group (null before init_process_group).
std::shared_ptr<Group> world_group();

}  // namespace kiln::dist
