#include "runtime/cuda/cublaslt.h"

#include <cublasLt.h>

#include <map>
#include <mutex>
#include <tuple>

#include "runtime/core/error.h"
#include "runtime/cuda/cublas.h"
#include "runtime/cuda/cuda_runtime.h"
#include "runtime/cuda/driver.h"

namespace kiln::cu {
namespace {

struct Lt {
  decltype(&::cublasLtCreate) create = nullptr;
  decltype(&::cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&::cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&::cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&::cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&::cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&::cublasLtMatmul) matmul = nullptr;
  bool ok = false;
  std::string reason;
};

const Lt& lib() {
  static const Lt l = [] {
    Lt l;
    RuntimeLibrary lib({"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so",
                        "/usr/local/cuda/lib64/libcublasLt.so.13", "/usr/local/cuda/lib64/libcublasLt.so.12"},
                       "libcublasLt.so.13 / .12");
    lib.symbol("cublasLtCreate", l.create);
    lib.symbol("cublasLtMatmulDescCreate", l.desc_create);
    lib.symbol("cublasLtMatmulDescSetAttribute", l.desc_set);
    lib.symbol("cublasLtMatrixLayoutCreate", l.layout_create);
    lib.symbol("cublasLtMatmulPreferenceCreate", l.pref_create);
    lib.symbol("cublasLtMatmulPreferenceSetAttribute", l.pref_set);
    lib.symbol("cublasLtMatmulPreferenceDestroy", l.pref_destroy);
    lib.symbol("cublasLtMatmulAlgoGetHeuristic", l.heuristic);
    lib.symbol("cublasLtMatmul", l.matmul);
    l.reason = lib.reason();
    l.ok = l.reason.empty();
    return l;
  }();
  return l;
}

void check(cublasStatus_t s, const char* what) { check_status(s, "cublasLt", what); }

// One GEMM shape and epilogue: its descriptors and the algorithm the heuristic chose (made
// once; the bias pointer is set per call).
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;
};
using Key = std::tuple<int, int64_t, int64_t, int64_t, int, int, int64_t, int64_t, bool, int>;

struct DeviceLt {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;  // blas_workspace(index)
  std::map<Key, Plan> plans;
};

}  // namespace

bool have_cublaslt() { return lib().ok; }
const std::string& cublaslt_unavailable_reason() { return lib().reason; }

bool gemm_bias(Node& out, const Node& a, const Node& b, const Node& bias, bool relu) {
  if (!lib().ok || out.dtype != DType::Float32 || a.dtype != DType::Float32 || b.dtype != DType::Float32 ||
      bias.dtype != DType::Float32 || a.shape.size() != 2 || b.shape.size() != 2 || out.shape.size() != 2)
    return false;
  const int64_t M = a.shape[0].as_int(), K = a.shape[1].as_int(), N = b.shape[1].as_int();
  if (out.shape[0].as_int() != M || out.shape[1].as_int() != N || (N > 1 && out.strides[1].as_int() != 1) ||
      (M > 1 && out.strides[0].as_int() != N) || out.offset.as_int() != 0)
    return false;  // (the kernel step's output is dense row-major)
  if (M == 0 || N == 0 || K == 0 || M > INT32_MAX || N > INT32_MAX || K > INT32_MAX) return false;
  // The bias: N consecutive elements (a [N] vector, or a view of one broadcast over the rows).
  const int64_t bs = bias.strides.empty() ? 1 : bias.strides.back().as_int();
  if (bias.shape.empty() || bias.shape.back().as_int() != N || (N > 1 && bs != 1)) return false;
  for (size_t d = 0; d + 1 < bias.shape.size(); ++d)
    if (bias.shape[d].as_int() != 1 && bias.strides[d].as_int() != 0) return false;
  cudaDataType_t type;
  cublasComputeType_t compute;
  cublasOperation_t opa, opb;
  int64_t lda = 0, ldb = 0;
  if (!cuda_type(out.dtype, type, compute) ||
      !as_column_major(M, K, a.strides[0].as_int(), a.strides[1].as_int(), opa, lda) ||
      !as_column_major(K, N, b.strides[0].as_int(), b.strides[1].as_int(), opb, ldb))
    return false;
  const int index = out.device.index;
  // The output first: a block freed by another thread has its last user queued before enter().
  auto storage = Storage::allocate(static_cast<size_t>(M * N) * 4, out.device, "matmul");
  static std::map<int, DeviceLt> devices;
  std::lock_guard<std::mutex> lock(blas_mutex());
  CUstream stream = enter(index);
  DeviceLt& dev = devices[index];
  if (!dev.handle) {
    check(lib().create(&dev.handle), "cublasLtCreate");
    dev.workspace = blas_workspace(index);
  }
  // Row-major out = a b is column-major out^T = b^T a^T: cuBLASLt's A is our b (m = N rows of
  // the column-major out), its B our a (n = M); the bias runs along those N rows.
  const Key key{
      index, M, N, K, static_cast<int>(opa), static_cast<int>(opb), lda, ldb, relu, static_cast<int>(compute)};
  auto found = dev.plans.find(key);
  if (found == dev.plans.end()) {
    Plan p;
    const Lt& l = lib();
    check(l.desc_create(&p.desc, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
    check(l.desc_set(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof opb), "TRANSA");
    check(l.desc_set(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opa, sizeof opa), "TRANSB");
    const cublasLtEpilogue_t epi = relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    check(l.desc_set(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), "EPILOGUE");
    const cudaDataType_t bias_type = CUDA_R_32F;
    check(l.desc_set(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type), "BIAS_DATA_TYPE");
    // Stored shapes: op N -> [rows of op, cols of op], op T -> the transpose.
    const bool tb = opb == CUBLAS_OP_T, ta = opa == CUBLAS_OP_T;
    check(l.layout_create(&p.a, type, tb ? K : N, tb ? N : K, ldb), "cublasLtMatrixLayoutCreate (A)");
    check(l.layout_create(&p.b, type, ta ? M : K, ta ? K : M, lda), "cublasLtMatrixLayoutCreate (B)");
    check(l.layout_create(&p.d, type, N, M, N), "cublasLtMatrixLayoutCreate (D)");
    cublasLtMatmulPreference_t pref = nullptr;
    check(l.pref_create(&pref), "cublasLtMatmulPreferenceCreate");
    const size_t ws = kBlasWorkspace;
    check(l.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), "MAX_WORKSPACE_BYTES");
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    const cublasStatus_t st = l.heuristic(dev.handle, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &count);
    l.pref_destroy(pref);
    p.ok = st == CUBLAS_STATUS_SUCCESS && count > 0;
    p.algo = result.algo;
    found = dev.plans.emplace(key, p).first;
  }
  Plan& p = found->second;
  if (!p.ok) return false;  // (no algorithm for this shape and epilogue: the caller runs them apart)
  const void* bias_ptr = static_cast<const char*>(bias.storage->data) + bias.offset.as_int() * 4;
  check(lib().desc_set(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr, sizeof bias_ptr), "BIAS_POINTER");
  const float one = 1, zero = 0;
  const char* pa = static_cast<const char*>(a.storage->data) + a.offset.as_int() * 4;
  const char* pb = static_cast<const char*>(b.storage->data) + b.offset.as_int() * 4;
  check(lib().matmul(dev.handle, p.desc, &one, pb, p.a, pa, p.b, &zero, storage->data, p.d, storage->data, p.d, &p.algo,
                     dev.workspace, kBlasWorkspace, reinterpret_cast<cudaStream_t>(stream)),
        "cublasLtMatmul");
  note_launch(index, relu ? "cublasLtMatmul (bias + ReLU epilogue)" : "cublasLtMatmul (bias epilogue)");
  out.set_storage(std::move(storage), false);
  return true;
}

}  // namespace kiln::cu
