// Device: where a tensor's data lives. Every node carries one.
#pragma once
#include <cstdint>
#include <string>

namespace kiln {

enum class DeviceType : uint8_t { CPU, CUDA };

// A device: type and index (index is 0 for the CPU).
struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  // "cpu" or "cuda:0".
  std::string str() const {
    return type == DeviceType::CPU ? "cpu" : "cuda:" + std::to_string(index);
  }
};

// The host CPU.
inline Device cpu() { return Device{}; }

}  // namespace kiln
