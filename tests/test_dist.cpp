// Process groups across real processes: the test starts 2 and 4 ranks of tests/dist_worker on
// loopback (Gloo on the CPU; with KILN_TEST_DEVICE=cuda and several GPUs, NCCL), each checking
// its results against the single-process computation.
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "kiln.h"
#include "rank_launcher.h"
#include "temp_dir.h"

namespace {

using kiln::testing::RankOutcome;
using kiln::testing::run_ranks;

std::map<std::string, std::string> base_env(int timeout_ms = 60000) {
  std::map<std::string, std::string> env = {{"KILN_TEST_TIMEOUT_MS", std::to_string(timeout_ms)}};
  const char* dev = std::getenv("KILN_TEST_DEVICE");
  if (dev && std::string(dev).rfind("cuda", 0) == 0) env["KILN_TEST_BACKEND"] = "nccl";
  return env;
}

// The number of ranks a device run can have (one GPU each: $KILN_TEST_GPUS, else the GPUs this
// host has), or n on the CPU.
int ranks_available(int n) {
  const char* dev = std::getenv("KILN_TEST_DEVICE");
  if (!dev || std::string(dev).rfind("cuda", 0) != 0) return n;
  const char* count = std::getenv("KILN_TEST_GPUS");
  return count && *count ? std::atoi(count) : kiln::cuda::device_count();
}

// Skips a test that starts `n` ranks on a host with fewer GPUs (a device run).
#define KILN_NEEDS_RANKS(n) \
  if (ranks_available(n) < (n)) GTEST_SKIP() << "needs " << (n) << " GPUs, one a rank; this host has " << ranks_available(n)

void expect_all_ok(const std::vector<RankOutcome>& out) {
  for (size_t r = 0; r < out.size(); ++r)
    EXPECT_EQ(out[r].status, 0) << "rank " << r << " output:\n" << out[r].output;
}

class Dist : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    KILN_NEEDS_RANKS(GetParam());
  }
};

TEST_P(Dist, EveryCollectiveDtypeAndSizeMatchesOneProcess) {
  expect_all_ok(run_ranks("dist_worker", {"collectives"}, GetParam(), GetParam(), base_env()));
}

TEST_P(Dist, SubGroupsSplitsAndMeshes) {
  expect_all_ok(run_ranks("dist_worker", {"groups"}, GetParam(), GetParam(), base_env()));
}

// Under KILN_DIST_DEBUG every collective is checked across its group's members: a rank outside a
// sub-group makes none of its collectives, so the checks number each group's calls on their own.
TEST_P(Dist, SubGroupsUnderDebugChecks) {
  auto env = base_env();
  env["KILN_DIST_DEBUG"] = "1";
  expect_all_ok(run_ranks("dist_worker", {"groups"}, GetParam(), GetParam(), env));
}

TEST_P(Dist, FunctionalCollectivesDifferentiateAndCompile) {
  expect_all_ok(run_ranks("dist_worker", {"functional"}, GetParam(), GetParam(), base_env()));
}

TEST_P(Dist, BadInputIsRefusedOnEveryRank) {
  expect_all_ok(run_ranks("dist_worker", {"bad_input"}, GetParam(), GetParam(), base_env()));
}

TEST_P(Dist, DTensorEveryTransitionUnevenAndDifferentiable) {
  expect_all_ok(run_ranks("dist_worker", {"dtensor"}, GetParam(), GetParam(), base_env()));
}

TEST_P(Dist, DTensorEmptyShardsAndInPlaceViewsEqualOneProcess) {
  expect_all_ok(run_ranks("dist_worker", {"dtensor_edges"}, GetParam(), GetParam(), base_env()));
}

TEST_P(Dist, DTensorProgramsUnderRandomPlacementsEqualPyTorch) {
  expect_all_ok(run_ranks("dist_worker", {"dtensor_programs"}, GetParam(), GetParam(), base_env()));
}

TEST_P(Dist, TensorSequenceAndFullyShardedGptEqualsOneProcess) {
  expect_all_ok(run_ranks("dist_worker", {"dtensor_gpt"}, GetParam(), GetParam(), base_env()));
}

TEST_P(Dist, FullyShardedRanksHoldTheirShareOfParametersGradientsAndMoments) {
  auto env = base_env();
  env["KILN_PROFILE"] = "memory";
  expect_all_ok(run_ranks("dist_worker", {"fsdp_memory"}, GetParam(), GetParam(), env));
}

TEST_P(Dist, ContextParallelRingAttentionEqualsOneProcess) {
  expect_all_ok(run_ranks("dist_worker", {"context_parallel"}, GetParam(), GetParam(), base_env()));
}

TEST_P(Dist, DataParallelMlpEqualsOneProcess) {
  for (const char* mode : {"eager", "accumulate", "unused", "compiled"}) {
    auto env = base_env();
    env["KILN_TEST_DDP_MODE"] = mode;
    SCOPED_TRACE(mode);
    expect_all_ok(run_ranks("dist_worker", {"ddp_mlp"}, GetParam(), GetParam(), env));
  }
}

TEST_P(Dist, DataParallelGptEqualsOneProcess) {
  for (const char* mode : {"eager", "compiled"}) {
    auto env = base_env();
    env["KILN_TEST_DDP_MODE"] = mode;
    SCOPED_TRACE(mode);
    expect_all_ok(run_ranks("dist_worker", {"ddp_gpt"}, GetParam(), GetParam(), env));
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, Dist, ::testing::Values(2, 4), [](const auto& p) {
  return std::to_string(p.param) + "ranks";
});

TEST(DistFaults, ARankThatDiesIsNamedWithinTheTimeout) {
  KILN_NEEDS_RANKS(2);
  const auto start = std::chrono::steady_clock::now();
  auto out = run_ranks("dist_worker", {"rank_dies"}, 2, 2, base_env(8000), std::chrono::seconds(60));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(out[0].status, 0) << out[0].output;
  EXPECT_EQ(out[1].status, 128 + SIGKILL) << out[1].output;
  EXPECT_LT(s, 30.0) << "the surviving rank took " << s << " s to fail";
}

TEST(DistFaults, ARankThatNeverJoinsIsNamed) {
  auto out = run_ranks("dist_worker", {"never_joins"}, 2, 1, base_env(2000), std::chrono::seconds(60));
  EXPECT_EQ(out[0].status, 0) << out[0].output;
  EXPECT_NE(out[0].output.find("rank 1 did not join"), std::string::npos) << out[0].output;
}

// A crashed run leaves its rendezvous files; the next run at the same address and run id (as
// torchrun's default id gives) must not take them for its own.
TEST(DistFaults, ARunAfterACrashAtTheSameAddressStarts) {
  KILN_NEEDS_RANKS(2);
  auto env = base_env(8000);
  env["MASTER_PORT"] = std::to_string(20000 + getpid() % 9000);
  env["KILN_RUN_ID"] = "none";
  auto crashed = run_ranks("dist_worker", {"rank_dies"}, 2, 2, env, std::chrono::seconds(60));
  EXPECT_EQ(crashed[1].status, 128 + SIGKILL);
  auto next = run_ranks("dist_worker", {"groups"}, 2, 2, env, std::chrono::seconds(60));
  expect_all_ok(next);
  std::error_code ec;
  std::filesystem::remove_all("/tmp/kiln-rendezvous/127.0.0.1-" + env["MASTER_PORT"] + "-none", ec);
}

TEST(DistFaults, MismatchedShapesAreReportedOnEveryRank) {
  KILN_NEEDS_RANKS(2);
  auto env = base_env(10000);
  env["KILN_TEST_BACKEND"] = "auto";  // (CUDA collectives are checked through Gloo, off their path)
  expect_all_ok(run_ranks("dist_worker", {"mismatch"}, 2, 2, env, std::chrono::seconds(60)));
}

// Other ways to start and meet: an explicit file:// store, a real Redis server, and mpirun.
TEST(DistLaunch, ExplicitFileStore) {
  KILN_NEEDS_RANKS(2);
  kiln::testing::TempDir dir("kiln-store");
  auto env = base_env();
  env["KILN_TEST_INIT_METHOD"] = "file://" + dir.path();
  env["MASTER_ADDR"] = "";  // (not needed: the store is given)
  expect_all_ok(run_ranks("dist_worker", {"groups"}, 2, 2, env));
}

TEST(DistLaunch, RedisStore) {
  if (std::system("command -v redis-server > /dev/null 2>&1") != 0) GTEST_SKIP() << "no redis-server";
  KILN_NEEDS_RANKS(2);
  const int port = 21000 + static_cast<int>(getpid() % 20000);
  const std::string start = "redis-server --port " + std::to_string(port) +
                            " --save '' --appendonly no --daemonize yes --pidfile /tmp/kiln-redis-" +
                            std::to_string(port) + ".pid > /dev/null";
  ASSERT_EQ(std::system(start.c_str()), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto env = base_env();
  env["KILN_TEST_INIT_METHOD"] = "redis://127.0.0.1:" + std::to_string(port);
  auto out = run_ranks("dist_worker", {"groups"}, 2, 2, env);
  std::system(("kill $(cat /tmp/kiln-redis-" + std::to_string(port) + ".pid) 2> /dev/null").c_str());
  expect_all_ok(out);
}

TEST(DistLaunch, Mpirun) {
  if (std::system("command -v mpirun > /dev/null 2>&1") != 0) GTEST_SKIP() << "no mpirun";
  KILN_NEEDS_RANKS(2);
  auto env = base_env();
  // Only mpirun's variables: no torchrun-style ones.
  for (const char* k : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) env[k] = "";
  auto out = run_ranks("mpirun", {"--allow-run-as-root", "--oversubscribe", "-np", "2",
                                  kiln::testing::binary_dir() + "/dist_worker", "groups"},
                       1, 1, env);
  EXPECT_EQ(out[0].status, 0) << out[0].output;
}

// The launcher users start jobs with: kiln-run --nproc N prog args.
TEST(DistLauncher, KilnRunStartsTheRanks) {
  const std::string launcher = kiln::testing::binary_dir() + "/../examples/kiln-run";
  if (!std::filesystem::exists(launcher)) GTEST_SKIP() << "no " << launcher;
  const int n = std::min(3, ranks_available(3));  // (one GPU a rank on a device run)
  if (n < 2) GTEST_SKIP() << "fewer than 2 GPUs";
  auto out = run_ranks(launcher, {"--nproc", std::to_string(n), kiln::testing::binary_dir() + "/dist_worker", "groups"},
                       1, 1, base_env());
  EXPECT_EQ(out[0].status, 0) << out[0].output;
  EXPECT_EQ(std::count(out[0].output.begin(), out[0].output.end(), '\n') >= n, true) << out[0].output;
}

}  // namespace
