// Faults across real processes, as users hit them: collectives from several threads of each
// rank, collectives the ranks disagree on (with and without KILN_DIST_DEBUG), a rank that dies
// (exit, abort, kill -9) before a collective or inside a DDP step, and DDP replicas that differ.
// Gloo on the CPU; with KILN_TEST_DEVICE=cuda and KILN_TEST_GPUS >= 2, NCCL. Each case asserts
// the exact values or the error text (tests/dist_fault_worker.cpp) and a time bound.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>

#include "rank_launcher.h"

namespace {

using kiln::testing::RankOutcome;
using kiln::testing::run_ranks;

bool on_gpus() {
  const char* dev = std::getenv("KILN_TEST_DEVICE");
  return dev && std::string(dev).rfind("cuda", 0) == 0;
}

int gpus() {
  const char* count = std::getenv("KILN_TEST_GPUS");
  return count ? std::atoi(count) : 1;
}

std::map<std::string, std::string> env_with(int timeout_ms, std::map<std::string, std::string> extra = {}) {
  extra["KILN_TEST_TIMEOUT_MS"] = std::to_string(timeout_ms);
  if (on_gpus()) extra["KILN_TEST_BACKEND"] = extra.count("KILN_TEST_BACKEND") ? extra["KILN_TEST_BACKEND"] : "nccl";
  return extra;
}

void expect_ok(const std::vector<RankOutcome>& out, size_t ranks) {
  for (size_t r = 0; r < ranks && r < out.size(); ++r)
    EXPECT_EQ(out[r].status, 0) << "rank " << r << " output:\n" << out[r].output;
}

class DistFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    if (on_gpus() && gpus() < 2) GTEST_SKIP() << "fewer than 2 GPUs";
  }
};

TEST_F(DistFaults, CollectivesFromManyThreadsAreExact) {
  for (int ranks : {2, 4}) {
    if (on_gpus() && gpus() < ranks) continue;
    SCOPED_TRACE(ranks);
    expect_ok(run_ranks("dist_fault_worker", {"threads"}, ranks, ranks, env_with(60000)), ranks);
  }
}

TEST_F(DistFaults, MismatchedCollectivesRaiseOnEveryRank) {
  for (const char* debug : {"1", "0"})
    for (const char* what : {"kind", "size", "dtype"}) {
      SCOPED_TRACE(std::string(what) + " KILN_DIST_DEBUG=" + debug);
      const auto start = std::chrono::steady_clock::now();
      auto out = run_ranks("dist_fault_worker", {"mismatch"}, 2, 2,
                           env_with(6000, {{"KILN_TEST_MISMATCH", what}, {"KILN_DIST_DEBUG", debug}}),
                           std::chrono::seconds(60));
      expect_ok(out, 2);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_LT(s, 40.0) << "the ranks took " << s << " s to fail";
    }
}

TEST_F(DistFaults, ADeadRankIsNamedOnEveryOther) {
  for (const char* when : {"before", "ddp"})
    for (const char* how : {"exit", "abort", "kill"}) {
      SCOPED_TRACE(std::string(how) + " " + when);
      const auto start = std::chrono::steady_clock::now();
      auto out = run_ranks("dist_fault_worker", {"rank_exits"}, 2, 2,
                           env_with(20000, {{"KILN_TEST_DEATH", how}, {"KILN_TEST_WHEN", when}}),
                           std::chrono::seconds(60));
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_EQ(out[0].status, 0) << out[0].output;
      EXPECT_NE(out[1].status, 0) << out[1].output;
      EXPECT_LT(s, 15.0) << "the surviving rank took " << s << " s to name the dead one (timeout 20 s)";
    }
}

TEST_F(DistFaults, DdpRefusesReplicasThatDiffer) {
  for (const char* how : {"shape", "count", "dtype", "dims"}) {
    SCOPED_TRACE(how);
    expect_ok(run_ranks("dist_fault_worker", {"ddp_shapes"}, 2, 2, env_with(20000, {{"KILN_TEST_REPLICA", how}})), 2);
  }
}

}  // namespace
