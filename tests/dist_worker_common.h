// What every multi-process test rank shares: failing with a message (no static destructors: a
// broken group's threads may still run), the device and timeout the test asked for, and joining
// the process group from the environment the launcher gave.
#pragma once
#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <string>

#include "kiln.h"

namespace kiln::testing {

[[noreturn]] inline void fail(const std::string& what) {
  std::cerr << "rank " << (dist::is_initialized() ? dist::get_rank() : -1) << ": FAIL: " << what << std::endl;
  std::_Exit(1);
}

inline Device test_device() {
  const char* d = std::getenv("KILN_TEST_DEVICE");
  return d && std::string(d).rfind("cuda", 0) == 0 ? Device(kiln::cuda(dist::local_rank())) : cpu();
}

inline std::chrono::milliseconds test_timeout() {
  const char* t = std::getenv("KILN_TEST_TIMEOUT_MS");
  return std::chrono::milliseconds(t ? std::atol(t) : 60000);
}

// init_process_group with the test's timeout, backend (KILN_TEST_BACKEND) and init method.
inline void init_from_env() {
  dist::ProcessGroupOptions o;
  o.timeout = test_timeout();
  if (const char* b = std::getenv("KILN_TEST_BACKEND")) o.backend = b;
  if (const char* m = std::getenv("KILN_TEST_INIT_METHOD")) o.init_method = m;
  dist::init_process_group(o);
}

// A worker's main: runs the scenario argv[1] names (an uncaught error fails the rank), prints
// "ok" and returns 0; a missing or unknown name prints the usage and returns 2.
inline int run_scenario(const char* program, int argc, char** argv,
                        const std::map<std::string, std::function<void()>>& scenarios) {
  if (argc < 2 || !scenarios.count(argv[1])) {
    std::cerr << "usage: " << program << " SCENARIO (";
    for (auto& [k, _] : scenarios) std::cerr << k << " ";
    std::cerr << ")\n";
    return 2;
  }
  try {
    scenarios.at(argv[1])();
  } catch (const std::exception& e) {
    fail(std::string("uncaught: ") + e.what());
  }
  std::cout << "ok" << std::endl;
  return 0;
}

}  // namespace kiln::testing

#define EXPECT(cond, ...)                                                          \
  do {                                                                             \
    if (!(cond)) kiln::testing::fail(kiln::detail::cat(#cond, ": ", __VA_ARGS__)); \
  } while (0)
