#include "jit/cuda/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

#include "runtime/cuda/cuda_runtime.h"
#include "runtime/cuda/driver.h"
#include "runtime/cuda/nvrtc.h"
#include "jit/cuda/emit_cuda.h"
#include "jit/diag/diagnostics.h"
#include "runtime/core/error.h"

namespace kiln::jit {
namespace {

// An image (what compile() stores and load() reads): a one-line header with the argument
// counts the launch packs and the kind of binary, then the binary (a CUBIN, or PTX text that
// the driver compiles when NVRTC did not know the GPU's architecture).
const char kMagic[] = "kiln-cuda-image 2";

struct CudaCode : Code {
  CUmodule module = nullptr;
  CUfunction fn = nullptr;
  int buffers = 0, iparams = 0, fparams = 0, lanes = 1, shared = 0;
  int device = 0;  // the device whose context holds the module
  std::string symbol;
  ~CudaCode() override {
    if (!module || !cu::available()) return;
    cu::issue_launches(device);  // launches of this kernel still queued are issued first
    // Ignored result: at process exit the driver may be shut down already.
    cu::api().module_unload(module);
  }
};

struct Header {
  int buffers = 0, iparams = 0, fparams = 0;
  int lanes = 1;  // threads per parallel index (32: a warp per index)
  int shared = 0;  // dynamic shared memory per block (bytes)
  bool ptx = false;
};

std::string make_image(const Header& h, const std::string& binary) {
  return std::string(kMagic) + " " + std::to_string(h.buffers) + " " + std::to_string(h.iparams) + " " +
         std::to_string(h.fparams) + " " + std::to_string(h.lanes) + " " + std::to_string(h.shared) + " " +
         (h.ptx ? "ptx" : "cubin") + "\n" + binary;
}

// Splits an image into its header and binary (throws kiln::Error for anything else).
std::string parse_image(const std::string& image, Header& h) {
  size_t nl = image.find('\n');
  KILN_CHECK(nl != std::string::npos && image.compare(0, sizeof(kMagic) - 1, kMagic) == 0,
             "cuda: not a kiln CUDA image");
  char kind[8] = {0};
  if (std::sscanf(image.c_str() + sizeof(kMagic) - 1, " %d %d %d %d %d %7s", &h.buffers, &h.iparams, &h.fparams,
                  &h.lanes, &h.shared, kind) != 6 ||
      (h.lanes != 1 && h.lanes != 32 && h.lanes != kCudaWideBlock) || h.shared < 0 || h.shared > (227 << 10))
    throw Error("cuda: bad kiln CUDA image header");
  h.ptx = std::strcmp(kind, "ptx") == 0;
  return image.substr(nl + 1);
}

}  // namespace

Target cuda_target(int cc) {
  Target t;
  t.name = "cuda-sm" + std::to_string(cc);
  t.parallel = Target::Parallel::DeviceGrid;
  // Rows of a long last dim (a constant of 128 or more) in tiles of 512, a warp's lanes over
  // each: what a row shares (its index, a log-sum-exp, a broadcast row) computed once a tile,
  // not once an element (the cross-entropy gradient over [8192, 50304] spent ~110 instructions
  // an element on two 64-bit divisions, a log and the index math: 2.79 -> 0.65 ms). Others,
  // and domains of fewer than 1024 tiles (one row of 768: a single warp for the AdamW update
  // of every such parameter, 1.2 ms; [768, 3072] in tiles of 4096: 768 warps, 0.25 TB/s), an
  // element a thread.
  t.tile = 512;
  t.tile_min_inner = 128;
  t.tile_min_parallel = 1024;
  t.column_tile = 1;  // one column per thread (neighbouring threads read neighbouring columns)
  t.small_inner = 8;
  t.vector_bytes = 16;
  t.split_reductions = true;  // per-chunk partials, combined on the host (as on the CPU)
  t.split_chunks = 16384;  // a warp per chunk: enough loads in flight to fill the GPU
  t.split_chunk_work = 1024;
  t.row_cache = 1024;  // rows of up to 1024 elements: values several stages use kept in shared memory
  t.column_split_rows = 256;  // dw/db of a layer: chunks of rows x neighbouring columns, combined per column
  t.max_merged_reductions = 8;
  t.merge_row_stages = true;  // W3 backward: one row kernel (+ one column kernel), not nine
  t.half_kernels = true;  // float16/bfloat16: loaded to float32, rounded back after each op, as the CPU
  t.split_flat = true;  // [N, 3] rows: the warp's lanes over consecutive elements
  // Reductions over leading dims as ordinary reductions (a warp per kept element, lanes over
  // the reduced rows): the CPU's column mode accumulates in scratch memory serially per column.
  t.column_reductions = false;
  // Memory traffic, not arithmetic, bounds these kernels: a schedule that recomputes
  // transcendentals in each stage of a row kernel is taken when it moves fewer bytes
  // (layer_norm -> gelu -> softmax forward: one kernel instead of three).
  t.store_expensive = false;
  t.unsupported_op = [](OpKind op, DType d) { return !cuda_supports(op, d); };
  return t;
}

namespace {

class CudaBackend final : public Backend {
 public:
  // Reads the device's properties only: the context and stream are made at the first compile,
  // load or launch (a process that never runs CUDA code never creates a context).
  CudaBackend() {
    cc_ = cu::compute_capability(cu::jit_device());
    int sms = 0;
    CUdevice d = 0;
    cu::check(cu::api().device_get(&d, 0), "cuDeviceGet");
    cu::check(cu::api().device_get_attribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d),
              "cuDeviceGetAttribute");
    max_blocks_ = std::max(1, sms) * 32;
    target_ = cuda_target(cc_);
    param_bytes_ = param_bytes(cc_);
    target_.max_arg_bytes = static_cast<int64_t>(param_bytes_);
  }

  const char* name() const override { return "cuda"; }
  DeviceType device() const override { return DeviceType::CUDA; }
  Tier tier() const override { return Tier::Optimizing; }
  const Target& target() const override { return target_; }

  std::string cache_id() const override {
    // The binary depends on the architecture, the compiler and its options; the driver version
    // is kept too (a PTX fallback is compiled by the driver).
    return "cuda-img8;sm_" + std::to_string(cc_) + ";nvrtc" + std::to_string(cu::nvrtc_version()) + ";driver" +
           std::to_string(cu::driver_version()) + ";params" + std::to_string(param_bytes_) + ";" + cu::nvrtc_options_key();
  }

  bool supports(const Lowered&) const override { return cu::have_nvrtc(); }

  std::shared_ptr<Code> compile(const Kernel& k, const std::string& symbol, std::string* image) override {
    int lanes = 1, shared = 0;
    const std::string src = emit_cuda(k, symbol, &lanes, &shared, param_bytes_);
    dump_file(symbol + ".cu", src);
    Header h{static_cast<int>(k.buffers.size()), k.num_params, k.num_fparams, lanes, shared, false};
    const std::string binary = cu::nvrtc_compile(src, symbol, cc_, &h.ptx);
    auto code = load_binary(binary, symbol, h);
    if (image) *image = make_image(h, binary);
    return code;
  }

  std::shared_ptr<Code> load(const std::string& image, const std::string& symbol, BlobStore&) override {
    Header h;
    std::string binary = parse_image(image, h);
    return load_binary(binary, symbol, h);
  }

  // Buffers hold device addresses; the three arrays are host arrays, packed into the kernel's
  // by-value argument block. Queues the kernel on device 0's stream (its launch thread issues
  // it) and returns.
  void launch(const Code& code, const Launch& l) const override {
    const auto& c = static_cast<const CudaCode&>(code);
    if (l.extent <= 0) return;
    const size_t nb = std::max(c.buffers, 1), ni = std::max(c.iparams, 1), nf = std::max(c.fparams, 1);
    // The Args struct: buffers, then iparams, then fparams (8 bytes each; unused slots unread).
    thread_local std::vector<uint64_t> slots(kCudaParamBytes / 8);
    if (slots.size() < nb + ni + nf) slots.resize(nb + ni + nf);
    uint64_t* args = slots.data();
    if (c.buffers) std::memcpy(args, l.buffers, static_cast<size_t>(c.buffers) * 8);
    if (c.iparams) std::memcpy(args + nb, l.iparams, static_cast<size_t>(c.iparams) * 8);
    if (c.fparams) std::memcpy(args + nb + ni, l.fparams, static_cast<size_t>(c.fparams) * 8);
    const long long threads = std::max(kCudaBlock, c.lanes);
    const long long blocks = std::min<long long>((l.extent * c.lanes + threads - 1) / threads, max_blocks_);
    cu::launch_kernel(c.device, c.fn, static_cast<unsigned>(blocks), static_cast<unsigned>(threads),
                      static_cast<unsigned>(c.shared), 0, l.extent, args, static_cast<int>(nb + ni + nf), c.symbol);
    cu::note_launch(c.device, c.symbol);
  }

  void dump(const Kernel& k, const std::string& symbol) const override {
    dump_file(symbol + ".cu", emit_cuda(k, symbol, nullptr, nullptr, param_bytes_));
  }

 private:
  // The parameter bytes a launch may pass on this device (emit_cuda's limit): 32764 where the
  // driver and NVRTC are CUDA 12.1+ and the device sm_70+, else 4096.
  static size_t param_bytes(int cc) {
    return cc >= 70 && cu::driver_version() >= 12010 && cu::nvrtc_version() >= 12010 ? kCudaLargeParamBytes
                                                                                      : kCudaParamBytes;
  }

  std::shared_ptr<Code> load_binary(const std::string& binary, const std::string& symbol, const Header& h) const {
    const cu::Api& a = cu::api();
    const int device = cu::jit_device();
    cu::lock_jit_device();
    cu::enter(device);
    auto code = std::make_shared<CudaCode>();
    code->device = device;
    code->backend = this;
    code->symbol = symbol;
    code->buffers = h.buffers;
    code->iparams = h.iparams;
    code->fparams = h.fparams;
    code->lanes = h.lanes;
    std::string data = binary;
    if (h.ptx && (data.empty() || data.back() != '\0')) data.push_back('\0');
    cu::check(a.module_load_data(&code->module, data.data()),
              h.ptx ? "cuModuleLoadData (PTX)" : "cuModuleLoadData (CUBIN)");
    cu::check(a.module_get_function(&code->fn, code->module, symbol.c_str()), "cuModuleGetFunction");
    code->shared = h.shared;
    if (h.shared > (48 << 10))  // beyond the default limit: opted in per function
      cu::check(a.func_set_attribute(code->fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, h.shared),
                ("cuFuncSetAttribute (" + symbol + ")").c_str());
    return code;
  }

  int cc_ = 0;
  long long max_blocks_ = 1;
  size_t param_bytes_ = kCudaParamBytes;
  Target target_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend() {
  if (!cu::available()) return nullptr;
  return std::make_unique<CudaBackend>();
}

}  // namespace kiln::jit
