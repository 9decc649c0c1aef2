// A fresh directory under /tmp for one test, removed (with everything in it) when the test ends.
#pragma once
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace kiln::testing {

class TempDir {
 public:
  // mkdtemp("/tmp/<prefix>-XXXXXX"); path() is empty when it could not be made.
  explicit TempDir(const std::string& prefix) {
    std::string t = "/tmp/" + prefix + "-XXXXXX";
    if (mkdtemp(t.data())) path_ = t;
  }
  // Removes the directory, making it writable first (tests make cache directories read-only).
  ~TempDir() {
    if (path_.empty()) return;
    std::error_code ec;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all, ec);
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace kiln::testing
