#include "runtime/cuda/cublas.h"

#include <cublas_api.h>

#include <mutex>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/cuda/cuda_runtime.h"
#include "runtime/cuda/device_ops.h"
#include "runtime/cuda/driver.h"
#include "runtime/exec/device_runtime.h"

namespace kiln::cu {
namespace {

struct Cublas {
  decltype(&::cublasCreate_v2) create = nullptr;
  decltype(&::cublasSetStream_v2) set_stream = nullptr;
  decltype(&::cublasSetMathMode) set_math_mode = nullptr;
  decltype(&::cublasSetWorkspace_v2) set_workspace = nullptr;
  decltype(&::cublasGetStatusName) status_name = nullptr;
  // (named by its type: C++ builds of cublas_api.h overload this name)
  cublasStatus_t (*gemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*, const void*,
                         cudaDataType, int, long long, const void*, cudaDataType, int, long long, const void*, void*,
                         cudaDataType, int, long long, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  cublasStatus_t (*gemm_batched)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                 const void* const[], cudaDataType, int, const void* const[], cudaDataType, int,
                                 const void*, void* const[], cudaDataType, int, int, cublasComputeType_t,
                                 cublasGemmAlgo_t) = nullptr;
  bool ok = false;
  std::string reason;
};

const Cublas& lib() {
  static const Cublas c = [] {
    Cublas c;
    RuntimeLibrary l({"libcublas.so.13", "libcublas.so.12", "libcublas.so", "/usr/local/cuda/lib64/libcublas.so.13",
                      "/usr/local/cuda/lib64/libcublas.so.12"},
                     "libcublas.so.13 / .12");
    l.symbol("cublasCreate_v2", c.create);
    l.symbol("cublasSetStream_v2", c.set_stream);
    l.symbol("cublasSetMathMode", c.set_math_mode);
    l.symbol("cublasSetWorkspace_v2", c.set_workspace);
    l.symbol("cublasGetStatusName", c.status_name);
    l.symbol("cublasGemmStridedBatchedEx", c.gemm);
    l.symbol("cublasGemmBatchedEx", c.gemm_batched);
    c.reason = l.reason();
    c.ok = c.reason.empty();
    return c;
  }();
  return c;
}

void check(cublasStatus_t s, const char* what) { check_status(s, "cublas", what); }

// One handle per device (handles are not shared across devices), bound to the stream work goes
// to now (the device's, or a graph's being recorded) with kiln's workspace. Callers hold
// blas_mutex() while they use the handle.
cublasHandle_t bound_handle(int index, CUstream stream) {
  struct Bound {
    cublasHandle_t handle = nullptr;
    CUstream stream = nullptr;
  };
  static std::vector<Bound> handles;
  if (handles.size() <= static_cast<size_t>(index)) handles.resize(static_cast<size_t>(index) + 1);
  Bound& b = handles[index];
  if (!b.handle) check(lib().create(&b.handle), "cublasCreate");
  if (b.stream != stream) {
    check(lib().set_stream(b.handle, reinterpret_cast<cudaStream_t>(stream)), "cublasSetStream");
    // (setting the stream resets the workspace to cuBLAS's own, allocated per stream)
    check(lib().set_workspace(b.handle, blas_workspace(index), kBlasWorkspace), "cublasSetWorkspace");
    b.stream = stream;
  }
  return b.handle;
}

// The one stride between consecutive matrices of the batch dims [0, nb) (0 for a single or
// broadcast matrix); false when the batch dims do not collapse to one stride.
bool batch_stride(const Node& n, size_t nb, int64_t& stride) {
  stride = 0;
  int64_t expect = -1;
  for (size_t d = nb; d-- > 0;) {
    const int64_t size = n.shape[d].as_int(), st = n.strides[d].as_int();
    if (size == 1) continue;
    if (expect < 0)
      stride = st;
    else if (st != expect)
      return false;
    expect = st * size;
  }
  return true;
}

}  // namespace

bool as_column_major(int64_t rows, int64_t cols, int64_t srow, int64_t scol, cublasOperation_t& op, int64_t& ld) {
  if ((cols == 1 || scol == 1) && (rows == 1 || srow >= std::max<int64_t>(cols, 1))) {
    op = CUBLAS_OP_N;
    ld = rows == 1 ? std::max<int64_t>(cols, 1) : srow;
    return true;
  }
  if ((rows == 1 || srow == 1) && (cols == 1 || scol >= std::max<int64_t>(rows, 1))) {
    op = CUBLAS_OP_T;
    ld = cols == 1 ? std::max<int64_t>(rows, 1) : scol;
    return true;
  }
  return false;
}

bool cuda_type(DType d, cudaDataType_t& t, cublasComputeType_t& c) {
  switch (d) {
    case DType::Float32:
      t = CUDA_R_32F;
      c = float32_matmul_allows_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
      return true;
    case DType::Float64:
      t = CUDA_R_64F;
      c = CUBLAS_COMPUTE_64F;
      return true;
    case DType::Float16:
      t = CUDA_R_16F;
      c = CUBLAS_COMPUTE_32F;
      return true;
    case DType::BFloat16:
      t = CUDA_R_16BF;
      c = CUBLAS_COMPUTE_32F;
      return true;
    default: return false;
  }
}

void check_status(cublasStatus_t s, const char* library, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  const char* name = lib().status_name ? lib().status_name(s) : nullptr;
  throw Error(std::string(library) + ": " + what + ": " +
              (name ? name : "status " + std::to_string(static_cast<int>(s))));
}

std::mutex& blas_mutex() {
  static std::mutex mu;
  return mu;
}

void* blas_workspace(int index) {
  static std::mutex mu;
  static std::vector<CUdeviceptr> blocks;
  std::lock_guard<std::mutex> lock(mu);
  if (blocks.size() <= static_cast<size_t>(index)) blocks.resize(static_cast<size_t>(index) + 1, 0);
  if (!blocks[index]) {
    enter(index);
    cu::check(api().mem_alloc(&blocks[index], kBlasWorkspace), "cuMemAlloc (cuBLAS workspace)");
  }
  return reinterpret_cast<void*>(blocks[index]);
}

bool have_cublas() { return lib().ok; }
const std::string& cublas_unavailable_reason() { return lib().reason; }

bool gemm(Node& n) {
  cudaDataType_t type;
  cublasComputeType_t compute;
  if (!have_cublas() || !cuda_type(n.dtype, type, compute)) return false;
  // Operands whose matrices have no unit stride are copied densely first. Operands whose batch
  // dims do not collapse to one stride (heads split out of a projection: [B, H] with strides
  // T·3C and D) take cuBLAS's pointer-array batch, the addresses computed on the device.
  NodePtr dense_a, dense_b;
  const size_t r = n.shape.size(), nb = r - 2;
  auto matrices_usable = [&](const Node& x) {
    cublasOperation_t op;
    int64_t ld = 0;
    const int64_t rows = x.shape[r - 2].as_int(), cols = x.shape[r - 1].as_int();
    return as_column_major(rows, cols, x.strides[r - 2].as_int(), x.strides[r - 1].as_int(), op, ld);
  };
  auto one_stride = [&](const Node& x) {
    int64_t st = 0;
    return batch_stride(x, nb, st);
  };
  if (!matrices_usable(*n.inputs[0]) && !(dense_a = dense_copy(*n.inputs[0]))) return false;
  if (!matrices_usable(*n.inputs[1]) && !(dense_b = dense_copy(*n.inputs[1]))) return false;
  const Node& a = dense_a ? *dense_a : *n.inputs[0];
  const Node& b = dense_b ? *dense_b : *n.inputs[1];
  const bool pointers = !one_stride(a) || !one_stride(b);
  const int64_t M = n.shape[r - 2].as_int(), N = n.shape[r - 1].as_int(), K = a.shape[r - 1].as_int();
  int64_t batch = 1;
  for (size_t d = 0; d < nb; ++d) batch *= n.shape[d].as_int();
  cublasOperation_t opa, opb;
  int64_t lda = 0, ldb = 0, sa = 0, sb = 0;
  if (!as_column_major(M, K, a.strides[r - 2].as_int(), a.strides[r - 1].as_int(), opa, lda) ||
      !as_column_major(K, N, b.strides[r - 2].as_int(), b.strides[r - 1].as_int(), opb, ldb))
    return false;
  if (!pointers && (!batch_stride(a, nb, sa) || !batch_stride(b, nb, sb))) return false;
  const size_t esize = itemsize(n.dtype);
  auto out = Storage::allocate(static_cast<size_t>(batch * M * N) * esize, n.device, op_name(n.op));
  if (batch * M * N > 0) {
    std::lock_guard<std::mutex> lock(blas_mutex());
    CUstream s = enter(n.device.index);
    if (K == 0) {
      check(api().memset_d8_async(reinterpret_cast<CUdeviceptr>(out->data), 0, out->nbytes, s), "cuMemsetD8Async");
    } else {
      const auto* pa = static_cast<const char*>(a.storage->data) + a.offset.as_int() * static_cast<int64_t>(esize);
      const auto* pb = static_cast<const char*>(b.storage->data) + b.offset.as_int() * static_cast<int64_t>(esize);
      // Row-major C = A B is column-major C^T = B^T A^T: cuBLAS's "A" is our B.
      const double one64 = 1, zero64 = 0;
      const float one32 = 1, zero32 = 0;
      const bool f64 = n.dtype == DType::Float64;
      const void* alpha = f64 ? static_cast<const void*>(&one64) : &one32;
      const void* beta = f64 ? static_cast<const void*>(&zero64) : &zero32;
      KILN_CHECK(N <= INT32_MAX && M <= INT32_MAX && K <= INT32_MAX && lda <= INT32_MAX && ldb <= INT32_MAX &&
                     batch <= INT32_MAX,
                 "matmul on ", n.device.str(), ": sizes beyond cuBLAS's 32-bit limits (M=", M, ", N=", N, ", K=", K,
                 ")");
      cublasHandle_t h = bound_handle(n.device.index, s);
      if (pointers) {
        std::vector<int64_t> sizes(nb);
        std::vector<std::vector<int64_t>> st(3, std::vector<int64_t>(nb));
        for (size_t d = 0; d < nb; ++d) {
          sizes[d] = n.shape[d].as_int();
          st[1][d] = a.strides[d].as_int();
          st[2][d] = b.strides[d].as_int();
        }
        for (size_t d = nb, run = static_cast<size_t>(M * N); d-- > 0;) {
          st[0][d] = static_cast<int64_t>(run);
          run *= static_cast<size_t>(sizes[d]);
        }
        auto ptrs = gemm_batch_pointers(n.device, sizes, st, {out->data, pa, pb}, esize);
        if (!ptrs) return false;
        auto** arr = static_cast<void**>(ptrs->data);
        const int nbatch = static_cast<int>(batch);
        check(lib().gemm_batched(h, opb, opa, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), alpha,
                                 arr + 2 * nbatch, type, static_cast<int>(ldb), arr + nbatch, type,
                                 static_cast<int>(lda), beta, arr, type, static_cast<int>(N), nbatch, compute,
                                 CUBLAS_GEMM_DEFAULT),
              "cublasGemmBatchedEx");
        note_launch(n.device.index, "cublasGemmBatchedEx");
      } else {
        check(lib().gemm(h, opb, opa, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), alpha, pb, type,
                         static_cast<int>(ldb), sb, pa, type, static_cast<int>(lda), sa, beta, out->data, type,
                         static_cast<int>(N), M * N, static_cast<int>(batch), compute, CUBLAS_GEMM_DEFAULT),
              "cublasGemmStridedBatchedEx");
        note_launch(n.device.index, "cublasGemmStridedBatchedEx");
      }
    }
  }
  n.set_storage(std::move(out), false);
  return true;
}

}  // namespace kiln::cu
