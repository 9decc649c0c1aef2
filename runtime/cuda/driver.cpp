#include "runtime/cuda/driver.h"

#include <dlfcn.h>

#include <map>
#include <mutex>
#include <vector>

#include "runtime/core/error.h"

namespace kiln::cu {
namespace {

struct Loaded {
  Api api;
  bool ok = false;  // driver loaded, cuInit succeeded, >= 1 device
  bool nvrtc = false;
  std::string reason;  // why !ok
  std::string nvrtc_path;
  int devices = 0;
};

template <class F>
bool sym(void* lib, const char* name, F& out) {
  out = reinterpret_cast<F>(dlsym(lib, name));
  return out != nullptr;
}

void load_nvrtc(Loaded& l) {
  // NVRTC's soname carries its major version since CUDA 12; the toolkit's lib64 when the
  // loader's path does not list it.
  const char* names[] = {"libnvrtc.so.13",
                         "libnvrtc.so.12",
                         "libnvrtc.so",
                         "/usr/local/cuda/lib64/libnvrtc.so.13",
                         "/usr/local/cuda/lib64/libnvrtc.so.12",
                         "/usr/local/cuda/lib64/libnvrtc.so"};
  void* lib = nullptr;
  for (const char* n : names)
    if ((lib = dlopen(n, RTLD_NOW | RTLD_LOCAL))) {
      l.nvrtc_path = n;
      break;
    }
  if (!lib) return;
  Api& a = l.api;
  bool ok = sym(lib, "nvrtcVersion", a.nvrtc_version) && sym(lib, "nvrtcGetErrorString", a.nvrtc_get_error_string) &&
            sym(lib, "nvrtcCreateProgram", a.nvrtc_create_program) &&
            sym(lib, "nvrtcDestroyProgram", a.nvrtc_destroy_program) &&
            sym(lib, "nvrtcCompileProgram", a.nvrtc_compile_program) &&
            sym(lib, "nvrtcGetProgramLogSize", a.nvrtc_get_program_log_size) &&
            sym(lib, "nvrtcGetProgramLog", a.nvrtc_get_program_log) &&
            sym(lib, "nvrtcGetCUBINSize", a.nvrtc_get_cubin_size) && sym(lib, "nvrtcGetCUBIN", a.nvrtc_get_cubin) &&
            sym(lib, "nvrtcGetPTXSize", a.nvrtc_get_ptx_size) && sym(lib, "nvrtcGetPTX", a.nvrtc_get_ptx) &&
            sym(lib, "nvrtcGetNumSupportedArchs", a.nvrtc_get_num_supported_archs) &&
            sym(lib, "nvrtcGetSupportedArchs", a.nvrtc_get_supported_archs);
  if (!ok) {
    l.nvrtc_path.clear();
    a.nvrtc_version = nullptr;
    return;
  }
  l.nvrtc = true;
}

Loaded load() {
  Loaded l;
  load_nvrtc(l);  // independent of the driver: kernels can be compiled on a machine without a GPU
  // A libcuda already in the process (PyTorch, CuPy) is the one to use; else load it.
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (!lib) lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    l.reason = std::string("the CUDA driver (libcuda.so.1) is not installed: ") + (e ? e : "dlopen failed");
    return l;
  }
  Api& a = l.api;
  struct Need {
    const char* name;
    void** slot;
  };
  const Need need[] = {
      {"cuInit", reinterpret_cast<void**>(&a.init)},
      {"cuDriverGetVersion", reinterpret_cast<void**>(&a.driver_get_version)},
      {"cuGetErrorName", reinterpret_cast<void**>(&a.get_error_name)},
      {"cuGetErrorString", reinterpret_cast<void**>(&a.get_error_string)},
      {"cuDeviceGetCount", reinterpret_cast<void**>(&a.device_get_count)},
      {"cuDeviceGet", reinterpret_cast<void**>(&a.device_get)},
      {"cuDeviceGetName", reinterpret_cast<void**>(&a.device_get_name)},
      {"cuDeviceGetAttribute", reinterpret_cast<void**>(&a.device_get_attribute)},
      {"cuDevicePrimaryCtxRetain", reinterpret_cast<void**>(&a.primary_ctx_retain)},
      {"cuCtxSetCurrent", reinterpret_cast<void**>(&a.ctx_set_current)},
      {"cuModuleLoadData", reinterpret_cast<void**>(&a.module_load_data)},
      {"cuModuleGetFunction", reinterpret_cast<void**>(&a.module_get_function)},
      {"cuModuleUnload", reinterpret_cast<void**>(&a.module_unload)},
      {"cuLaunchKernel", reinterpret_cast<void**>(&a.launch_kernel)},
      {"cuFuncSetAttribute", reinterpret_cast<void**>(&a.func_set_attribute)},
      {"cuStreamCreate", reinterpret_cast<void**>(&a.stream_create)},
      {"cuStreamSynchronize", reinterpret_cast<void**>(&a.stream_synchronize)},
      {"cuMemAlloc_v2", reinterpret_cast<void**>(&a.mem_alloc)},
      {"cuMemFree_v2", reinterpret_cast<void**>(&a.mem_free)},
      {"cuMemcpyHtoD_v2", reinterpret_cast<void**>(&a.memcpy_htod)},
      {"cuMemcpyDtoH_v2", reinterpret_cast<void**>(&a.memcpy_dtoh)},
      {"cuMemsetD8_v2", reinterpret_cast<void**>(&a.memset_d8)},
      {"cuMemcpyHtoDAsync_v2", reinterpret_cast<void**>(&a.memcpy_htod_async)},
      {"cuMemcpyDtoHAsync_v2", reinterpret_cast<void**>(&a.memcpy_dtoh_async)},
      {"cuMemcpyDtoDAsync_v2", reinterpret_cast<void**>(&a.memcpy_dtod_async)},
      {"cuMemsetD8Async", reinterpret_cast<void**>(&a.memset_d8_async)},
      {"cuMemGetInfo_v2", reinterpret_cast<void**>(&a.mem_get_info)},
      {"cuDeviceTotalMem_v2", reinterpret_cast<void**>(&a.device_total_mem)},
      {"cuStreamQuery", reinterpret_cast<void**>(&a.stream_query)},
      {"cuStreamDestroy_v2", reinterpret_cast<void**>(&a.stream_destroy)},
      {"cuStreamBeginCapture_v2", reinterpret_cast<void**>(&a.stream_begin_capture)},
      {"cuStreamEndCapture", reinterpret_cast<void**>(&a.stream_end_capture)},
      {"cuGraphInstantiateWithFlags", reinterpret_cast<void**>(&a.graph_instantiate)},
      {"cuGraphLaunch", reinterpret_cast<void**>(&a.graph_launch)},
      {"cuEventCreate", reinterpret_cast<void**>(&a.event_create)},
      {"cuEventRecord", reinterpret_cast<void**>(&a.event_record)},
      {"cuEventSynchronize", reinterpret_cast<void**>(&a.event_synchronize)},
      {"cuEventElapsedTime", reinterpret_cast<void**>(&a.event_elapsed_time)},  // (same signature as _v2)
      {"cuEventDestroy_v2", reinterpret_cast<void**>(&a.event_destroy)},
      {"cuEventQuery", reinterpret_cast<void**>(&a.event_query)},
      {"cuStreamWaitEvent", reinterpret_cast<void**>(&a.stream_wait_event)},
      {"cuStreamIsCapturing", reinterpret_cast<void**>(&a.stream_is_capturing)},
      {"cuGraphExecDestroy", reinterpret_cast<void**>(&a.graph_exec_destroy)},
      {"cuGraphDestroy", reinterpret_cast<void**>(&a.graph_destroy)},
      {"cuGraphGetNodes", reinterpret_cast<void**>(&a.graph_get_nodes)},
      {"cuGraphExecUpdate_v2", reinterpret_cast<void**>(&a.graph_exec_update)},
  };
  for (const Need& n : need)
    if (!(*n.slot = dlsym(lib, n.name))) {
      l.reason = std::string("the CUDA driver lacks ") + n.name;
      return l;
    }
  CUresult r = a.init(0);
  if (r != CUDA_SUCCESS) {
    const char* name = nullptr;
    a.get_error_name(r, &name);
    l.reason = std::string("cuInit failed: ") + (name ? name : "unknown error");
    return l;
  }
  int n = 0;
  if (a.device_get_count(&n) != CUDA_SUCCESS || n < 1) {
    l.reason = "the CUDA driver reports no device";
    return l;
  }
  l.devices = n;
  l.ok = true;
  return l;
}

const Loaded& loaded() {
  static const Loaded l = load();
  return l;
}

}  // namespace

bool available() { return loaded().ok; }
const std::string& unavailable_reason() { return loaded().reason; }

const Api& api() {
  const Loaded& l = loaded();
  if (!l.ok) throw Error("cuda: not available: " + l.reason);
  return l.api;
}

const Api& table() { return loaded().api; }

bool have_nvrtc() { return loaded().nvrtc; }
const std::string& nvrtc_path() { return loaded().nvrtc_path; }

int device_count() { return loaded().ok ? loaded().devices : 0; }

void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* name = nullptr;
  const char* desc = nullptr;
  const Loaded& l = loaded();
  if (l.api.get_error_name) l.api.get_error_name(r, &name);
  if (l.api.get_error_string) l.api.get_error_string(r, &desc);
  throw Error(std::string("cuda: ") + what + ": " +
              (name ? name : ("error " + std::to_string(static_cast<int>(r))).c_str()) + " (" +
              (desc ? desc : "no description") + ")");
}

void check_nvrtc(nvrtcResult r, const char* what) {
  if (r == NVRTC_SUCCESS) return;
  const char* s = loaded().api.nvrtc_get_error_string ? loaded().api.nvrtc_get_error_string(r) : nullptr;
  throw Error(std::string("nvrtc: ") + what + ": " +
              (s ? s : ("error " + std::to_string(static_cast<int>(r))).c_str()));
}

CUdevice device(int ordinal) {
  KILN_CHECK(ordinal >= 0 && ordinal < device_count(), "cuda: no device ", ordinal, " (", device_count(), " devices)");
  CUdevice d = 0;
  check(api().device_get(&d, ordinal), "cuDeviceGet");
  return d;
}

std::string device_name(int ordinal) {
  char buf[256] = {0};
  check(api().device_get_name(buf, sizeof(buf) - 1, device(ordinal)), "cuDeviceGetName");
  return buf;
}

namespace {
// Attribute `attr` of device `ordinal`. Attributes do not change: each is asked of the driver once
// (scaled_dot_product_attention asks for the capability on every call).
int attribute(int ordinal, CUdevice_attribute attr) {
  static std::mutex m;
  static std::map<std::pair<int, int>, int> known;
  std::lock_guard<std::mutex> lock(m);
  const auto key = std::make_pair(ordinal, static_cast<int>(attr));
  if (auto it = known.find(key); it != known.end()) return it->second;
  int v = 0;
  check(api().device_get_attribute(&v, attr, device(ordinal)), "cuDeviceGetAttribute");
  return known[key] = v;
}
}  // namespace

int compute_capability(int ordinal) {
  return attribute(ordinal, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) * 10 +
         attribute(ordinal, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
}

int max_shared_per_block(int ordinal) {
  return attribute(ordinal, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
}

int driver_version() {
  if (!available()) return 0;
  int v = 0;
  check(api().driver_get_version(&v), "cuDriverGetVersion");
  return v;
}

int nvrtc_version() {
  if (!have_nvrtc()) return 0;
  int major = 0, minor = 0;
  check_nvrtc(table().nvrtc_version(&major, &minor), "nvrtcVersion");
  return major * 1000 + minor * 10;
}

void make_current(int ordinal) {
  static std::mutex mu;
  static std::vector<CUcontext> contexts;
  CUcontext ctx = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (contexts.empty()) contexts.resize(static_cast<size_t>(device_count()), nullptr);
    KILN_CHECK(ordinal >= 0 && ordinal < static_cast<int>(contexts.size()), "cuda: no device ", ordinal);
    if (!contexts[ordinal])
      check(api().primary_ctx_retain(&contexts[ordinal], device(ordinal)), "cuDevicePrimaryCtxRetain");
    ctx = contexts[ordinal];
  }
  check(api().ctx_set_current(ctx), "cuCtxSetCurrent");
}

}  // namespace kiln::cu
