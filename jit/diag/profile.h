// KILN_PROFILE=1: time every step the JIT executor runs on the CPU (a fused kernel, a library
// op such as a GEMM, a horizontal kernel) and print, when the process exits, one table of
// where the time went: per step kind, calls, total and mean time, share of the executor's time.
#pragma once
#include <chrono>
#include <string>

namespace kiln::jit {

// Whether KILN_PROFILE is on (read once).
bool profile_enabled();
// Adds one timed call of the step `label` (microseconds).
void profile_add(const std::string& label, double us);
// The table so far (also printed to stderr at exit when profiling is on).
std::string profile_report();
// Forgets everything recorded so far.
void profile_reset();

// Times one step while in scope when profiling is on; the label is built only then.
class ProfileScope {
 public:
  template <class LabelFn>
  ProfileScope(bool on, LabelFn&& label) : on_(on) {
    if (on_) {
      label_ = label();
      t0_ = std::chrono::steady_clock::now();
    }
  }
  ~ProfileScope() {
    if (on_)
      profile_add(label_, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0_).count());
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  bool on_;
  std::string label_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace kiln::jit
