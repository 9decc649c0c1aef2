// KILN_PROFILE=1: time every step the JIT executor runs (a fused kernel, a library op such as a
// GEMM, a copy, a horizontal kernel, a CUDA graph replay) and print, when the process exits,
// one table per place of where the time went: per step kind, calls, total and mean time, share.
// On the CPU a step's wall time; on a device its own clock (events queued around the step).
#pragma once
#include <chrono>
#include <memory>
#include <string>

#include "runtime/core/device.h"

namespace kiln::jit {

// Whether KILN_PROFILE is on (read once).
bool profile_enabled();
// Adds one timed call of the step `label` (microseconds) on the CPU.
void profile_add(const std::string& label, double us);
// Adds one call of `label` timed on `where` ("CPU", or a device such as "cuda:0").
void profile_add(const std::string& where, const std::string& label, double us);
// The tables so far (also printed to stderr at exit when profiling is on); device times still
// pending are waited for first.
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

// Times consecutive steps on a device's own clock: a mark is queued on its stream when the
// timer starts and after each step; the time between two marks is the step's. Marks are turned
// into times in batches (waiting for the device then), not after every step.
class DeviceStepTimer {
 public:
  // Times when `on` (profiling, and `device` is not the host) and the device can time now.
  DeviceStepTimer(bool on, Device device);
  // Ends a step: the device time since the last mark goes to `label` (built only when timing).
  template <class LabelFn>
  void step(LabelFn&& label) {
    if (last_) end_step(label());
  }

 private:
  void end_step(std::string label);
  Device device_;
  std::shared_ptr<void> last_;
};

}  // namespace kiln::jit
