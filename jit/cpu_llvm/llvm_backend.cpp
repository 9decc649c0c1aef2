#include "jit/cpu_llvm/llvm_backend.h"

#include <mutex>

#include "jit/backend/host_code.h"
#include "jit/cpu_llvm/codegen_llvm.h"
#include "jit/diag/diagnostics.h"

namespace kiln::jit {
namespace {

class LlvmBackend final : public HostBackend {
 public:
  const char* name() const override { return "cpu_llvm"; }
  Tier tier() const override { return Tier::Optimizing; }
  std::string cache_id() const override { return llvm_target_id(); }
  bool supports(const Lowered&) const override { return true; }

  std::shared_ptr<Code> compile(const Kernel& k, const std::string& symbol, std::string* image) override {
    std::string opt_ir;
    std::string object = compile_to_object(k, symbol, dump_dir().empty() ? nullptr : &opt_ir);
    auto code = wrap(load_object(object, symbol));
    if (image) *image = std::move(object);
    return code;
  }

  // Before the first load: the JIT's data layout comes from the blob store, so a warm process
  // need not create a TargetMachine only to learn it.
  std::shared_ptr<Code> load(const std::string& image, const std::string& symbol, BlobStore& store) override {
    std::call_once(layout_once_, [&] {
      std::string layout;
      if (!store.read("datalayout", layout)) {
        layout = host_data_layout();
        store.write("datalayout", layout);
      }
      set_jit_data_layout(layout);
    });
    return wrap(load_object(image, symbol));
  }

  void dump(const Kernel& k, const std::string& symbol) const override {
    dump_file(symbol + ".ll", emit_llvm_ir(k, symbol));
  }

 private:
  std::once_flag layout_once_;
};

}  // namespace

std::unique_ptr<Backend> make_llvm_backend() { return std::make_unique<LlvmBackend>(); }

}  // namespace kiln::jit
