// The CUDA Driver API and NVRTC, loaded at run time (dlopen): kiln links neither, so one build
// runs on machines with and without a GPU. <cuda.h> and <nvrtc.h> are included for their types
// only; every call goes through the one function table below.
#pragma once
#include <cuda.h>
#include <nvrtc.h>

#include <dlfcn.h>

#include <initializer_list>
#include <string>

namespace kiln::cu {

// The driver's and NVRTC's entry points (versioned `_v2` names where the driver has them).
struct Api {
  // Driver (libcuda.so.1).
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuDriverGetVersion) driver_get_version = nullptr;
  decltype(&::cuGetErrorName) get_error_name = nullptr;
  decltype(&::cuGetErrorString) get_error_string = nullptr;
  decltype(&::cuDeviceGetCount) device_get_count = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetName) device_get_name = nullptr;
  decltype(&::cuDeviceGetAttribute) device_get_attribute = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) primary_ctx_retain = nullptr;
  decltype(&::cuCtxSetCurrent) ctx_set_current = nullptr;
  decltype(&::cuModuleLoadData) module_load_data = nullptr;
  decltype(&::cuModuleGetFunction) module_get_function = nullptr;
  decltype(&::cuModuleUnload) module_unload = nullptr;
  decltype(&::cuLaunchKernel) launch_kernel = nullptr;
  decltype(&::cuFuncSetAttribute) func_set_attribute = nullptr;
  decltype(&::cuStreamCreate) stream_create = nullptr;
  decltype(&::cuStreamSynchronize) stream_synchronize = nullptr;
  decltype(&::cuMemAlloc_v2) mem_alloc = nullptr;
  decltype(&::cuMemFree_v2) mem_free = nullptr;
  decltype(&::cuMemcpyHtoD_v2) memcpy_htod = nullptr;
  decltype(&::cuMemcpyDtoH_v2) memcpy_dtoh = nullptr;
  decltype(&::cuMemsetD8_v2) memset_d8 = nullptr;
  decltype(&::cuMemcpyHtoDAsync_v2) memcpy_htod_async = nullptr;
  decltype(&::cuMemcpyDtoHAsync_v2) memcpy_dtoh_async = nullptr;
  decltype(&::cuMemcpyDtoDAsync_v2) memcpy_dtod_async = nullptr;
  decltype(&::cuMemsetD8Async) memset_d8_async = nullptr;
  decltype(&::cuMemGetInfo_v2) mem_get_info = nullptr;
  decltype(&::cuDeviceTotalMem_v2) device_total_mem = nullptr;
  decltype(&::cuStreamQuery) stream_query = nullptr;
  decltype(&::cuStreamDestroy_v2) stream_destroy = nullptr;
  // Stream capture and CUDA graphs (compiled entries replay as graphs).
  decltype(&::cuStreamBeginCapture_v2) stream_begin_capture = nullptr;
  decltype(&::cuStreamEndCapture) stream_end_capture = nullptr;
  decltype(&::cuGraphInstantiateWithFlags) graph_instantiate = nullptr;
  decltype(&::cuGraphLaunch) graph_launch = nullptr;
  decltype(&::cuGraphExecDestroy) graph_exec_destroy = nullptr;
  decltype(&::cuGraphDestroy) graph_destroy = nullptr;
  decltype(&::cuGraphGetNodes) graph_get_nodes = nullptr;
  decltype(&::cuGraphExecUpdate_v2) graph_exec_update = nullptr;
  // Events (KILN_PROFILE's device times).
  decltype(&::cuEventCreate) event_create = nullptr;
  decltype(&::cuEventRecord) event_record = nullptr;
  decltype(&::cuEventSynchronize) event_synchronize = nullptr;
  decltype(&::cuEventElapsedTime_v2) event_elapsed_time = nullptr;
  decltype(&::cuEventDestroy_v2) event_destroy = nullptr;
  // Cross-stream ordering (collectives on a communication stream, runtime/dist/nccl).
  decltype(&::cuEventQuery) event_query = nullptr;
  decltype(&::cuStreamWaitEvent) stream_wait_event = nullptr;
  decltype(&::cuStreamIsCapturing) stream_is_capturing = nullptr;
  // NVRTC (libnvrtc.so.13 / .12), loaded with or without a driver; null when not found
  // (compiling is then impossible, loading stored cubins still works).
  decltype(&::nvrtcVersion) nvrtc_version = nullptr;
  decltype(&::nvrtcGetErrorString) nvrtc_get_error_string = nullptr;
  decltype(&::nvrtcCreateProgram) nvrtc_create_program = nullptr;
  decltype(&::nvrtcDestroyProgram) nvrtc_destroy_program = nullptr;
  decltype(&::nvrtcCompileProgram) nvrtc_compile_program = nullptr;
  decltype(&::nvrtcGetProgramLogSize) nvrtc_get_program_log_size = nullptr;
  decltype(&::nvrtcGetProgramLog) nvrtc_get_program_log = nullptr;
  decltype(&::nvrtcGetCUBINSize) nvrtc_get_cubin_size = nullptr;
  decltype(&::nvrtcGetCUBIN) nvrtc_get_cubin = nullptr;
  decltype(&::nvrtcGetPTXSize) nvrtc_get_ptx_size = nullptr;
  decltype(&::nvrtcGetPTX) nvrtc_get_ptx = nullptr;
  decltype(&::nvrtcGetNumSupportedArchs) nvrtc_get_num_supported_archs = nullptr;
  decltype(&::nvrtcGetSupportedArchs) nvrtc_get_supported_archs = nullptr;
};

// A CUDA library loaded at run time (cuBLAS, cuBLASLt): the first of `names` that dlopen finds;
// symbol() binds entry points, the first missing one (or the library) saying why it is unusable.
class RuntimeLibrary {
 public:
  RuntimeLibrary(std::initializer_list<const char*> names, const std::string& what) : what_(what) {
    for (const char* n : names)
      if ((handle_ = dlopen(n, RTLD_NOW | RTLD_LOCAL))) break;
    if (!handle_) reason_ = what + " not found";
  }
  // Binds entry point `name` into `out` (left null when missing).
  template <class F>
  void symbol(const char* name, F& out) {
    out = handle_ ? reinterpret_cast<F>(dlsym(handle_, name)) : nullptr;
    if (!out && reason_.empty()) reason_ = what_ + " lacks " + name;
  }
  // Whether the library and every symbol bound so far were found, and why not.
  bool ok() const { return reason_.empty(); }
  const std::string& reason() const { return reason_; }

 private:
  void* handle_ = nullptr;
  std::string what_, reason_;
};

// Whether the driver loads, cuInit succeeds and at least one device exists (computed once;
// never throws). False on machines without a driver.
bool available();
// Why available() is false ("" when it is true).
const std::string& unavailable_reason();
// The table (throws kiln::Error when !available()).
const Api& api();
// The table as loaded, without the check (NVRTC's entries are set whenever have_nvrtc()).
const Api& table();
// Whether NVRTC was found (with or without a driver).
bool have_nvrtc();
// Where NVRTC was loaded from ("" when not found).
const std::string& nvrtc_path();

// Number of devices (0 without a driver).
int device_count();
// The driver's handle of device `ordinal` (throws kiln::Error for an ordinal out of range).
CUdevice device(int ordinal);
// Device `ordinal`'s name ("NVIDIA H100 80GB HBM3").
std::string device_name(int ordinal);
// Compute capability of device `ordinal` as major * 10 + minor (90 for sm_90).
int compute_capability(int ordinal);
// Shared memory a block may opt into on device `ordinal` (bytes).
int max_shared_per_block(int ordinal);
// The driver's CUDA version (13000 for 13.0) and NVRTC's (major * 1000 + minor * 10; 0 without NVRTC).
int driver_version();
int nvrtc_version();

// Throws kiln::Error "cuda: <what>: <CUDA_ERROR_NAME> (<description>)" unless r == CUDA_SUCCESS.
void check(CUresult r, const char* what);
// The same for NVRTC results.
void check_nvrtc(nvrtcResult r, const char* what);

// Makes device `ordinal`'s primary context current on the calling thread (retained once per
// process and kept).
void make_current(int ordinal = 0);

}  // namespace kiln::cu
