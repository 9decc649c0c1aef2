// The one file that names the collective libraries (as jit/exec/builtin_backends.cpp names the
// code generators): Gloo for CPU tensors and the stores, NCCL for CUDA tensors. A library this
// build lacks is a stub that says so.
#include "runtime/core/error.h"
#include "runtime/dist/backend.h"
#if KILN_GLOO
#include "runtime/dist/gloo/gloo_parts.h"
#endif
#if KILN_CUDA
#include "runtime/dist/nccl/nccl_backend.h"
#endif

namespace kiln::dist {

bool backend_available(const std::string& library, std::string* why) {
  std::string reason;
  if (library == "gloo") {
#if !KILN_GLOO
    reason = "kiln was built without Gloo (install libgloo-dev and rebuild)";
#endif
  } else if (library == "nccl") {
#if KILN_CUDA
    reason = nccl_impl::unavailable_reason();
#else
    reason = "kiln was built without CUDA";
#endif
  } else {
    reason = "unknown backend \"" + library + "\"";
  }
  if (why) *why = reason;
  return reason.empty();
}

std::shared_ptr<Store> make_store(const std::string& url) {
#if KILN_GLOO
  return gloo_impl::make_store(url);
#else
  throw Error("dist: kiln was built without Gloo, whose stores the ranks meet through (install libgloo-dev)");
#endif
}

std::unique_ptr<Backend> make_backend(const std::string& library, const GroupSpec& spec) {
  std::string why;
  KILN_CHECK(backend_available(library, &why), "dist: backend ", library, " is unavailable: ", why);
#if KILN_GLOO
  if (library == "gloo") return gloo_impl::make_backend(spec);
#endif
#if KILN_CUDA
  if (library == "nccl") return nccl_impl::make_backend(spec);
#endif
  throw Error("dist: unknown backend \"" + library + "\"");
}

}  // namespace kiln::dist
