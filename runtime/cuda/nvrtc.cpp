#include "runtime/cuda/nvrtc.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/cuda/driver.h"

namespace kiln::cu {
namespace {

// NVRTC options (part of cache_id): IEEE division and square root, no FMA contraction and no
// flush-to-zero, so float results follow the same rounding as the CPU tiers.
std::vector<std::string> base_options() {
  std::vector<std::string> o = {"--std=c++17", "--fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true"};
  // Kernels are self-contained (no runtime API, textures or device launches): NVRTC 12.4+ then
  // skips declaring those, which shortens every compile.
  if (nvrtc_version() >= 12040) o.push_back("-minimal");
  // KILN_NVRTC_OPTIONS: extra options, space-separated (e.g. -Ofc=max to trade kernel speed
  // for compile time); they are part of the disk-cache key like the rest.
  if (const char* extra = std::getenv("KILN_NVRTC_OPTIONS")) {
    std::string word;
    for (const char* c = extra;; ++c) {
      if (*c && *c != ' ') {
        word += *c;
        continue;
      }
      if (!word.empty()) o.push_back(word);
      word.clear();
      if (!*c) break;
    }
  }
  return o;
}

const std::vector<int>& nvrtc_archs() {
  static const std::vector<int> archs = [] {
    std::vector<int> v;
    int n = 0;
    check_nvrtc(table().nvrtc_get_num_supported_archs(&n), "nvrtcGetNumSupportedArchs");
    v.resize(static_cast<size_t>(n));
    if (n) check_nvrtc(table().nvrtc_get_supported_archs(v.data()), "nvrtcGetSupportedArchs");
    return v;
  }();
  return archs;
}

}  // namespace

std::string nvrtc_options_key() {
  std::string s;
  for (const std::string& o : base_options()) s += o + " ";
  return s;
}

// CUBIN for sm_<cc> when NVRTC knows the architecture; else PTX for the newest virtual
// architecture it knows below it, which the driver compiles at load.
std::string nvrtc_compile(const std::string& src, const std::string& symbol, int cc, bool* ptx_out,
                          bool arch_specific) {
  KILN_CHECK(have_nvrtc(), "cuda: NVRTC (libnvrtc.so.13 / .12) not found: cannot compile ", symbol);
  const auto t0 = std::chrono::steady_clock::now();
  const Api& a = table();
  const std::vector<int>& archs = nvrtc_archs();
  int arch = cc;
  const bool ptx = std::find(archs.begin(), archs.end(), cc) == archs.end();
  KILN_CHECK(!ptx || !arch_specific, "nvrtc: ", symbol, " needs sm_", cc, "a, which this NVRTC does not know");
  if (ptx) {
    arch = 0;
    for (int x : archs)
      if (x <= cc) arch = std::max(arch, x);
    KILN_CHECK(arch > 0, "nvrtc: no supported architecture at or below sm_", cc);
  }
  if (ptx_out) *ptx_out = ptx;
  std::vector<std::string> opts = base_options();
  const std::string arch_name = std::to_string(arch) + (arch_specific ? "a" : "");
  opts.push_back(std::string("--gpu-architecture=") + (ptx ? "compute_" : "sm_") + arch_name);
  std::vector<const char*> argv;
  for (const std::string& o : opts) argv.push_back(o.c_str());
  nvrtcProgram prog = nullptr;
  check_nvrtc(a.nvrtc_create_program(&prog, src.c_str(), (symbol + ".cu").c_str(), 0, nullptr, nullptr),
              "nvrtcCreateProgram");
  struct Destroy {
    nvrtcProgram& p;
    ~Destroy() { table().nvrtc_destroy_program(&p); }
  } destroy{prog};
  const nvrtcResult r = a.nvrtc_compile_program(prog, static_cast<int>(argv.size()), argv.data());
  if (r != NVRTC_SUCCESS) {
    size_t n = 0;
    std::string log;
    if (a.nvrtc_get_program_log_size(prog, &n) == NVRTC_SUCCESS && n > 1) {
      log.resize(n);
      a.nvrtc_get_program_log(prog, log.data());
      log.resize(n - 1);
    }
    throw Error("nvrtc: compiling " + symbol + " failed (" + a.nvrtc_get_error_string(r) + "):\n" + log);
  }
  std::string out;
  size_t n = 0;
  if (ptx) {
    check_nvrtc(a.nvrtc_get_ptx_size(prog, &n), "nvrtcGetPTXSize");
    out.resize(n);
    check_nvrtc(a.nvrtc_get_ptx(prog, out.data()), "nvrtcGetPTX");  // NUL-terminated (n counts it)
  } else {
    check_nvrtc(a.nvrtc_get_cubin_size(prog, &n), "nvrtcGetCUBINSize");
    out.resize(n);
    check_nvrtc(a.nvrtc_get_cubin(prog, out.data()), "nvrtcGetCUBIN");
  }
  if (const char* l = std::getenv("KILN_LOG"); l && (std::strstr(l, "codegen") || std::strstr(l, "all")))
    std::fprintf(stderr, "[kiln:codegen] %s: nvrtc %s%s, %zu bytes, %.1f ms\n", symbol.c_str(),
                 ptx ? "compute_" : "sm_", arch_name.c_str(), out.size(),
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  return out;
}

}  // namespace kiln::cu
