#include "jit/cpu_asmjit/asmjit_backend.h"

#include "jit/backend/host_code.h"
#include "jit/cpu_asmjit/codegen_asmjit.h"
#include "runtime/core/error.h"

namespace kiln::jit {
namespace {

class AsmjitBackend final : public HostBackend {
 public:
  const char* name() const override { return "cpu_asmjit"; }
  Tier tier() const override { return Tier::Quick; }
  std::string cache_id() const override { return ""; }
  // Pointwise kernels only: no accumulators, and no split or column reduction (those keep
  // partial sums in scratch buffers that later iterations read back).
  bool supports(const Lowered& l) const override { return !l.split && !l.column && asmjit_supports(l.kernel); }
  std::shared_ptr<Code> compile(const Kernel& k, const std::string&, std::string*) override {
    return wrap(compile_asmjit(k));
  }
  std::shared_ptr<Code> load(const std::string&, const std::string& symbol, BlobStore&) override {
    throw Error("asmjit code is not stored, so " + symbol + " cannot be loaded");
  }
};

}  // namespace

std::unique_ptr<Backend> make_asmjit_backend() { return std::make_unique<AsmjitBackend>(); }

}  // namespace kiln::jit
