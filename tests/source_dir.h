// Where a test finds the project's own files (tests/data, tests/parity): under $KILN_SOURCE_DIR
// when it is set — a GPU host runs programs built on another machine, whose source tree it does
// not have — else under the source tree the program was built from (KILN_TEST_SOURCE_DIR, set for
// every suite by tests/CMakeLists.txt).
#pragma once
#include <cstdlib>
#include <filesystem>
#include <string>

namespace kiln::testing {

inline std::filesystem::path source_path(const std::string& relative) {
  const char* s = std::getenv("KILN_SOURCE_DIR");
  const std::filesystem::path root = s && *s ? std::filesystem::path(s) : std::filesystem::path(KILN_TEST_SOURCE_DIR);
  return root / relative;
}

}  // namespace kiln::testing
