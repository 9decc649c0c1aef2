#include "jit/diag/diagnostics.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

namespace kiln::jit {

bool log_enabled(const char* category) {
  static const std::string env = [] {
    const char* v = std::getenv("KILN_LOG");
    return std::string(v ? v : "");
  }();
  if (env.empty()) return false;
  if (env == "all") return true;
  std::stringstream ss(env);
  std::string item;
  while (std::getline(ss, item, ','))
    if (item == category) return true;
  return false;
}

void log_line(const char* category, const std::string& msg) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "[kiln:%s] %s\n", category, msg.c_str());
}

const std::string& dump_dir() {
  static const std::string dir = [] {
    const char* v = std::getenv("KILN_DUMP");
    std::string d = v ? v : "";
    if (!d.empty()) std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

void dump_file(const std::string& name, const std::string& text) {
  if (dump_dir().empty()) return;
  std::ofstream(dump_dir() + "/" + name) << text;
}

}  // namespace kiln::jit
