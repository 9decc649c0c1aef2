#include "jit/diag/profile.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "runtime/exec/device_runtime.h"

namespace kiln::jit {
namespace {

struct Entry {
  uint64_t calls = 0;
  double us = 0;
  std::vector<float> samples;  // each call's time (the first kSamples), for the median
};
constexpr size_t kSamples = 1 << 16;
// A device step whose marks are queued but not yet read.
struct PendingStep {
  Device device;
  std::string label;
  std::shared_ptr<void> from, to;
};
struct Table {
  std::mutex mu;
  std::map<std::pair<std::string, std::string>, Entry> rows;  // (where, step)
  std::mutex pending_mu;
  std::vector<PendingStep> pending;
};
constexpr size_t kPendingSteps = 512;  // device steps read in one batch
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
    // (KILN_PROFILE=memory alone asks for the memory ledger: runtime/exec/memory_ledger.h)
    const bool yes = v && *v && std::strcmp(v, "0") != 0 && std::strcmp(v, "memory") != 0;
    if (yes) static AtExit at_exit;
    return yes;
  }();
  return on;
}

void profile_add(const std::string& where, const std::string& label, double us) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  Entry& e = t.rows[{where, label}];
  ++e.calls;
  e.us += us;
  if (e.samples.size() < kSamples) e.samples.push_back(static_cast<float>(us));
}

void profile_add(const std::string& label, double us) { profile_add("CPU", label, us); }

namespace {

// Reads the pending device steps' times (waiting for the device where they are not done).
void resolve_pending() {
  Table& t = table();
  std::vector<PendingStep> steps;
  {
    std::lock_guard<std::mutex> lock(t.pending_mu);
    steps.swap(t.pending);
  }
  for (const PendingStep& s : steps)
    profile_add(s.device.str(), s.label, device_runtime(s.device).elapsed_us(s.from, s.to));
}

}  // namespace

DeviceStepTimer::DeviceStepTimer(bool on, Device device) : device_(device) {
  if (!on || device.type == DeviceType::CPU) return;
  last_ = device_runtime(device).timing_mark(device.index);
  // Steps still pending at exit are read before the device runtime's statics (made before the
  // first mark) are destroyed: atexit handlers registered later run first.
  static const bool registered = [] { return std::atexit([] { resolve_pending(); }) == 0; }();
  (void)registered;
}

void DeviceStepTimer::end_step(std::string label) {
  std::shared_ptr<void> mark = device_runtime(device_).timing_mark(device_.index);
  if (!mark) return;
  Table& t = table();
  bool full = false;
  {
    std::lock_guard<std::mutex> lock(t.pending_mu);
    t.pending.push_back({device_, std::move(label), last_, mark});
    full = t.pending.size() >= kPendingSteps;
  }
  last_ = std::move(mark);
  if (full) resolve_pending();
}

std::string profile_report() {
  resolve_pending();
  Table& t = table();
  std::map<std::string, std::vector<std::pair<std::string, Entry>>> places;
  {
    std::lock_guard<std::mutex> lock(t.mu);
    for (const auto& [key, e] : t.rows) places[key.first].push_back({key.second, e});
  }
  std::string out;
  char line[512];
  for (auto& [where, rows] : places) {
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.us > b.second.us; });
    double total = 0;
    for (const auto& r : rows) total += r.second.us;
    out += where == "CPU"
               ? "[kiln:profile] CPU executor steps, by total time (wall time of each step, its threads included)\n"
               : "[kiln:profile] " + where +
                     " steps, by total time (device time between events queued around each step)\n";
    std::snprintf(line, sizeof line, "%10s %8s %12s %11s %11s  %s\n", "total ms", "share", "calls", "mean us",
                  "median us", "step");
    out += line;
    for (auto& [label, e] : rows) {
      // (the median: a first call that compiled or warmed a library is not the steady cost)
      std::nth_element(e.samples.begin(), e.samples.begin() + static_cast<long>(e.samples.size() / 2), e.samples.end());
      const double median = e.samples.empty() ? 0.0 : e.samples[e.samples.size() / 2];
      std::snprintf(line, sizeof line, "%10.3f %7.1f%% %12llu %11.2f %11.2f  %s\n", e.us / 1e3,
                    total > 0 ? 100 * e.us / total : 0.0, static_cast<unsigned long long>(e.calls),
                    e.us / static_cast<double>(e.calls), median, label.c_str());
      out += line;
    }
    std::snprintf(line, sizeof line, "%10.3f %7.1f%% %12s %11s %11s  %s\n", total / 1e3, 100.0, "", "", "",
                  "all steps");
    out += line;
  }
  return out;
}

void profile_reset() {
  resolve_pending();
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  t.rows.clear();
}
}  // namespace kiln::jit
