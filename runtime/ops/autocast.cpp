// kiln::autocast: the thread's state per device type and how ops apply it.
#include "runtime/ops/autocast.h"

#include <algorithm>
#include <atomic>
#include <string>

#include "runtime/core/error.h"
#include "runtime/ops/autocast_policy.h"
#include "runtime/tensor/record.h"

namespace kiln {
namespace {

constexpr int kDeviceTypes = 2;  // CPU, CUDA

struct State {
  bool enabled[kDeviceTypes] = {false, false};
  DType dtype[kDeviceTypes] = {DType::BFloat16, DType::Float16};  // PyTorch's defaults
  bool excluded = false;  // inside an op that applied autocast already, or in backward
  int active = 0;  // device types enabled (the fast path reads only this)
};
thread_local State t_state;
// Guards enabling autocast alive in the process: while none is, ops skip the thread's state.
std::atomic<int> g_enabled_guards{0};

int slot(DeviceType t) { return static_cast<int>(t); }

bool castable(DType t) { return t == DType::Float32 || t == DType::Float16 || t == DType::BFloat16; }

}  // namespace

autocast::autocast(DeviceType device_type, DType dtype, bool enabled)
    : type_(device_type),
      was_enabled_(t_state.enabled[slot(device_type)]),
      was_dtype_(t_state.dtype[slot(device_type)]) {
  KILN_CHECK(dtype == DType::BFloat16 || dtype == DType::Float16, "autocast: dtype must be bfloat16 or float16, got ",
             dtype_name(dtype));
  State& s = t_state;
  s.enabled[slot(type_)] = enabled;
  s.dtype[slot(type_)] = dtype;
  s.active = s.enabled[0] + s.enabled[1];
  if (enabled) g_enabled_guards.fetch_add(1, std::memory_order_relaxed);
}

autocast::autocast(DeviceType device_type)
    : autocast(device_type, device_type == DeviceType::CUDA ? DType::Float16 : DType::BFloat16) {}

autocast::~autocast() {
  State& s = t_state;
  if (s.enabled[slot(type_)]) g_enabled_guards.fetch_sub(1, std::memory_order_relaxed);
  s.enabled[slot(type_)] = was_enabled_;
  s.dtype[slot(type_)] = was_dtype_;
  s.active = s.enabled[0] + s.enabled[1];
}

bool is_autocast_enabled(DeviceType device_type) { return t_state.enabled[slot(device_type)]; }
DType get_autocast_dtype(DeviceType device_type) { return t_state.dtype[slot(device_type)]; }

namespace detail {

AutocastOp::AutocastOp(AutocastPolicy policy, std::initializer_list<const Tensor*> inputs) {
  KILN_CHECK(inputs.size() <= kMaxInputs, "autocast: an op with more than ", kMaxInputs, " tensor inputs");
  std::copy(inputs.begin(), inputs.end(), in_.begin());
  if (g_enabled_guards.load(std::memory_order_relaxed) == 0) return;  // (no autocast anywhere)
  State& s = t_state;
  if (!s.active || s.excluded) return;
  cast_ = std::make_unique<std::array<Tensor, kMaxInputs>>();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor* t = in_[i];
    if (!t || !t->defined() || !castable(t->dtype())) continue;
    const DeviceType type = t->device().type;
    if (!s.enabled[slot(type)]) continue;
    DType want = t->dtype();
    switch (policy) {
      case AutocastPolicy::Body: break;
      case AutocastPolicy::Lower: want = s.dtype[slot(type)]; break;
      case AutocastPolicy::Float32OnCuda:
        if (type != DeviceType::CUDA) break;
        [[fallthrough]];
      case AutocastPolicy::Float32: want = DType::Float32; break;
    }
    if (want != t->dtype()) (*cast_)[i] = cast(*t, want);
  }
  s.excluded = excluded_ = true;
}

AutocastOp::~AutocastOp() {
  if (excluded_) t_state.excluded = false;
}

namespace {
// Sets the thread's per-device state to `key`'s (autocast_key's layout), keeping the count of
// enabled guards in step.
void set_state(uint32_t key) {
  State& s = t_state;
  for (int d = 0; d < kDeviceTypes; ++d) {
    const uint32_t b = key >> (8 * d) & 0xff;
    const bool on = b & 1;
    if (on != s.enabled[d]) g_enabled_guards.fetch_add(on ? 1 : -1, std::memory_order_relaxed);
    s.enabled[d] = on;
    if (on) s.dtype[d] = static_cast<DType>(b >> 1);
  }
  s.active = s.enabled[0] + s.enabled[1];
}
uint32_t state_key(const State& s) {
  uint32_t key = 0;
  for (int d = 0; d < kDeviceTypes; ++d)
    if (s.enabled[d]) key |= (1u | static_cast<uint32_t>(s.dtype[d]) << 1) << (8 * d);
  return key;
}
}  // namespace

AutocastAs::AutocastAs(uint32_t key) : was_key_(state_key(t_state)), was_excluded_(t_state.excluded) {
  for (int d = 0; d < kDeviceTypes; ++d) was_dtype_[d] = static_cast<uint8_t>(t_state.dtype[d]);
  set_state(key);
  t_state.excluded = false;
}
AutocastAs::~AutocastAs() {
  set_state(was_key_);
  for (int d = 0; d < kDeviceTypes; ++d) t_state.dtype[d] = static_cast<DType>(was_dtype_[d]);
  t_state.excluded = was_excluded_;
}

AutocastOff::AutocastOff() : was_excluded_(t_state.excluded) { t_state.excluded = true; }
AutocastOff::~AutocastOff() { t_state.excluded = was_excluded_; }

uint32_t autocast_key() {
  if (g_enabled_guards.load(std::memory_order_relaxed) == 0) return 0;
  const State& s = t_state;
  if (!s.active || s.excluded) return 0;
  return state_key(s);
}

std::string autocast_key_str(uint32_t key) {
  if (!key) return "off";
  std::string out;
  for (int d = 0; d < kDeviceTypes; ++d) {
    const uint32_t b = key >> (8 * d) & 0xff;
    if (!(b & 1)) continue;
    out += std::string(out.empty() ? "" : ", ") + (d == 0 ? "cpu " : "cuda ") + dtype_name(static_cast<DType>(b >> 1));
  }
  return out;
}

}  // namespace detail
}  // namespace kiln
