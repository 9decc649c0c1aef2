#include "jit/diag/profile.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

namespace kiln::jit {
namespace {

struct Entry {
  uint64_t calls = 0;
  double us = 0;
};
struct Table {
  std::mutex mu;
  std::map<std::string, Entry> rows;
};
Table& table() {
  static Table* t = new Table;  // never destroyed: steps may finish during static teardown
  return *t;
}

// Prints the table when the process exits.
struct AtExit {
  ~AtExit() {
    if (profile_enabled()) std::fputs(profile_report().c_str(), stderr);
  }
};

}  // namespace

bool profile_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_PROFILE");
    const bool yes = v && *v && std::strcmp(v, "0") != 0;
    if (yes) static AtExit at_exit;
    return yes;
  }();
  return on;
}

void profile_add(const std::string& label, double us) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  Entry& e = t.rows[label];
  ++e.calls;
  e.us += us;
}

std::string profile_report() {
  Table& t = table();
  std::vector<std::pair<std::string, Entry>> rows;
  {
    std::lock_guard<std::mutex> lock(t.mu);
    rows.assign(t.rows.begin(), t.rows.end());
  }
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.us > b.second.us; });
  double total = 0;
  for (const auto& r : rows) total += r.second.us;
  std::string out = "[kiln:profile] CPU executor steps, by total time (wall time of each step, its threads included)\n";
  char line[512];
  std::snprintf(line, sizeof line, "%10s %8s %12s %11s  %s\n", "total ms", "share", "calls", "mean us", "step");
  out += line;
  for (const auto& [label, e] : rows) {
    std::snprintf(line, sizeof line, "%10.3f %7.1f%% %12llu %11.2f  %s\n", e.us / 1e3,
                  total > 0 ? 100 * e.us / total : 0.0, static_cast<unsigned long long>(e.calls),
                  e.us / static_cast<double>(e.calls), label.c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "%10.3f %7.1f%% %12s %11s  %s\n", total / 1e3, 100.0, "", "", "all steps");
  out += line;
  return out;
}

void profile_reset() {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  t.rows.clear();
}

}  // namespace kiln::jit
