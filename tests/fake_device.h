// A stand-in CUDA device over host memory, so the device plumbing (cross-device copies, the
// per-device segment split and executors, device arguments, mixing errors) runs on machines
// without a GPU. KILN_TEST_DEVICE=fake-cuda installs it (test_seed.h's test_device()). Nodes run
// on the reference kernels; no generated GPU code is involved.
#pragma once
#include <cstring>

#include "runtime/exec/device_runtime.h"
#include "runtime/exec/executor.h"

namespace kiln::testing {

class FakeCudaRuntime final : public DeviceRuntime {
 public:
  bool available() const override { return true; }
  std::string unavailable_reason() const override { return ""; }
  int device_count() const override { return 1; }
  std::shared_ptr<Storage> allocate(size_t nbytes, int index) override {
    auto s = Storage::allocate(nbytes, cpu());
    s->device = Device{DeviceType::CUDA, index};
    return s;
  }
  void copy(void* dst, Device, const void* src, Device, size_t nbytes) override { std::memcpy(dst, src, nbytes); }
  void run_node(Node& n) override {
    NodePtr h = new_node();  // the same node on the host, over the same memory
    h->op = n.op;
    h->attrs = n.attrs;
    h->dtype = n.dtype;
    h->shape = n.shape;
    h->strides = n.strides;
    h->offset = n.offset;
    for (const NodePtr& in : n.inputs) {
      NodePtr i = new_node();
      i->dtype = in->dtype;
      i->shape = in->shape;
      i->strides = in->strides;
      i->offset = in->offset;
      i->set_storage(in->storage);
      h->inputs.push_back(std::move(i));
    }
    interpret_node(*h);
    h->storage->device = n.device;
    n.set_storage(h->storage, false);
  }
  void synchronize(int) override {}
  MemoryStats memory_stats(int) override { return {}; }
  void reset_peak_memory_stats(int) override {}
  void empty_cache() override {}
};

// Registers the fake as the CUDA runtime (once; for the rest of the process).
inline void install_fake_cuda() {
  static FakeCudaRuntime rt;
  register_device_runtime(DeviceType::CUDA, &rt);
}

}  // namespace kiln::testing
