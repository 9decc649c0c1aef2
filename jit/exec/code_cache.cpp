#include "jit/exec/code_cache.h"

#include <chrono>
#include <future>
#include <mutex>
#include <unordered_map>

#include "jit/diag/diagnostics.h"
#include "jit/exec/tiering.h"

namespace kiln::jit {
namespace {

constexpr const char* kKilnVersion = "kiln-0.1.0";
// Bump when a backend changes what it generates for the same loop IR.
constexpr const char* kCodegenVersion = "codegen-17";  // 17: CUDA hoists loop invariants (finished accumulators too) out of every loop, one rounding a 16-bit store, 32-bit index division, one rounding a 16-bit store

std::mutex g_mu;
std::unordered_map<std::string, std::shared_future<std::shared_ptr<CompiledKernel>>> g_cache;
CacheStats g_stats;
uint64_t g_rejections_at_reset = 0;
std::atomic<uint64_t> g_quick_runs{0}, g_optimized_runs{0};

template <class F>
void count(F&& f) {
  std::lock_guard<std::mutex> lock(g_mu);
  f(g_stats);
}

std::string kernel_entry(const CompiledKernel& ck) { return ck.symbol + ".kobj"; }

// A stored image of the optimizing backend, loaded; null when there is none.
std::shared_ptr<Code> load_stored(Backend& b, const CompiledKernel& ck) {
  if (b.cache_id().empty()) return nullptr;
  auto t0 = std::chrono::steady_clock::now();
  std::string image;
  if (!disk_read(kernel_entry(ck), ck.full_key, image)) return nullptr;
  const double read_ms = ms_since(t0);
  DiskBlobStore store(b.cache_id());
  auto code = b.load(image, ck.symbol, store);
  const double ms = ms_since(t0);
  if (log_enabled("codegen"))
    log_line("codegen", std::string(b.name()) + " loaded " + ck.symbol + " from disk in " + std::to_string(ms) +
                            " ms (reading " + std::to_string(read_ms) + " ms, " + std::to_string(image.size()) +
                            " bytes)");
  count([&](CacheStats& s) {
    s.disk_hits++;
    s.load_ms += ms;
  });
  return code;
}

// Compiles with the optimizing backend (any thread) and stores its image.
std::shared_ptr<Code> compile_optimized(Backend& b, const CompiledKernel& ck) {
  b.dump(ck.lowered->kernel, ck.symbol);  // before compiling: a kernel that crashes the compiler is still on disk
  auto t0 = std::chrono::steady_clock::now();
  const bool store = !b.cache_id().empty() && !cache_dir().empty();
  std::string image;
  auto code = b.compile(ck.lowered->kernel, ck.symbol, store ? &image : nullptr);
  const double ms = ms_since(t0);
  if (log_enabled("codegen"))
    log_line("codegen", std::string(b.name()) + " compiled " + ck.symbol + " in " + std::to_string(ms) + " ms (" +
                            std::to_string(ck.lowered->kernel.exprs.size()) + " exprs)");
  if (store && !image.empty()) disk_write(kernel_entry(ck), ck.full_key, image);
  count([&](CacheStats& s) {
    s.compiles++;
    s.compile_ms += ms;
  });
  return code;
}

// Quick-tier code, or null when that tier cannot compile the kernel (logged once per key).
std::shared_ptr<Code> compile_quick(Backend& b, const CompiledKernel& ck) {
  try {
    auto t0 = std::chrono::steady_clock::now();
    auto code = b.compile(ck.lowered->kernel, ck.symbol, nullptr);
    const double us = ms_since(t0) * 1000;
    if (log_enabled("codegen"))
      log_line("codegen", std::string(b.name()) + " compiled " + ck.symbol + " in " + std::to_string(us) + " us (" +
                              std::to_string(ck.lowered->kernel.exprs.size()) + " exprs)");
    count([&](CacheStats& s) {
      s.quick_compiles++;
      s.quick_compile_us += us;
    });
    return code;
  } catch (const std::exception& e) {
    if (log_enabled("codegen"))
      log_line("codegen", std::string(b.name()) + " cannot compile " + ck.symbol + " (" + e.what() +
                              "); using the optimizing tier");
    count([](CacheStats& s) { s.quick_fallbacks++; });
    return nullptr;
  }
}

// Replaces `ck`'s quick code with optimizing code compiled in the background.
void upgrade_in_background(Backend& b, std::shared_ptr<CompiledKernel> ck) {
  run_in_background([&b, ck = std::move(ck)] {
    try {
      ck->optimized = compile_optimized(b, *ck);
      ck->code.store(ck->optimized.get(), std::memory_order_release);
      count([](CacheStats& s) { s.background_swaps++; });
    } catch (const std::exception& e) {
      log_line("codegen", std::string("background compile of ") + ck->symbol + " by " + b.name() + " failed (" +
                              e.what() + "); it keeps running its quick-tier code");
    }
  });
}

// Serves a miss of `ck` (its loop IR lowered, its disk key set) by the tiering policy: a stored
// optimizing image, else quick-tier code (upgraded in the background), else optimizing code.
std::shared_ptr<CompiledKernel> serve(std::shared_ptr<CompiledKernel> ck, const Tiering& t, const std::string& key) {
  ck->symbol = "kiln_" + hash_hex(ck->full_key);
  ck->lowered->kernel.name = ck->symbol;
  if (!dump_dir().empty()) dump_file(ck->symbol + ".loop.txt", "// key: " + key + "\n" + ck->lowered->kernel.str());
  const bool quick = t.quick && t.quick->supports(*ck->lowered);
  if (t.disk_first || !quick) {
    if (auto code = load_stored(*t.optimizing, *ck)) {
      ck->optimized = code;
      ck->code = code.get();
      return ck;
    }
  }
  if (quick) {
    if (auto code = compile_quick(*t.quick, *ck)) {
      ck->quick = code;
      ck->code = code.get();
      if (t.upgrade) upgrade_in_background(*t.optimizing, ck);
      return ck;
    }
  }
  ck->optimized = compile_optimized(*t.optimizing, *ck);
  ck->code = ck->optimized.get();
  return ck;
}

// A miss: lower for the device's target, then the tiering policy.
std::shared_ptr<CompiledKernel> build(const std::string& key, const Group& g, DeviceType device) {
  const Tiering t = tiering_for(device);
  auto ck = std::make_shared<CompiledKernel>();
  ck->lowered = lower(g, t.optimizing->target());
  // The disk key also covers the generated loop IR and the emitter version, so a kiln build
  // that lowers or emits differently never loads another build's objects.
  ck->full_key = std::string(kKilnVersion) + ";" + t.optimizing->cache_id() + "|" + kCodegenVersion + "|" +
                 hash_hex(ck->lowered->kernel.str()) + "|" + key;
  return serve(std::move(ck), t, key);
}

}  // namespace

CacheStats cache_stats() {
  std::lock_guard<std::mutex> lock(g_mu);
  CacheStats s = g_stats;
  s.disk_rebuilds = disk_rejections() - g_rejections_at_reset;
  s.quick_runs = g_quick_runs.load(std::memory_order_relaxed);
  s.optimized_runs = g_optimized_runs.load(std::memory_order_relaxed);
  return s;
}

void reset_cache_stats() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_stats = CacheStats{};
  g_rejections_at_reset = disk_rejections();
  g_quick_runs = 0;
  g_optimized_runs = 0;
}

void clear_memory_cache() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_cache.clear();
}

const Code& launch_code(const CompiledKernel& ck) {
  const Code* code = ck.code.load(std::memory_order_acquire);
  (code == ck.quick.get() ? g_quick_runs : g_optimized_runs).fetch_add(1, std::memory_order_relaxed);
  return *code;
}

namespace {
// The cache entry `full`, built by `make` on a miss (once, however many threads ask).
template <class Make>
std::shared_ptr<CompiledKernel> cached(const std::string& full, const Make& make) {
  std::promise<std::shared_ptr<CompiledKernel>> promise;
  std::shared_future<std::shared_ptr<CompiledKernel>> fut;
  bool mine = false;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_cache.find(full);
    if (it != g_cache.end()) {
      g_stats.hits++;
      fut = it->second;
    } else {
      fut = promise.get_future().share();
      g_cache.emplace(full, fut);
      mine = true;
    }
  }
  if (mine) {
    try {
      promise.set_value(make());
    } catch (...) {
      promise.set_exception(std::current_exception());
    }
  }
  return fut.get();
}
}  // namespace

std::shared_ptr<CompiledKernel> get_kernel(const std::string& key, const Group& g, DeviceType device) {
  return cached(target_for(device).name + "|" + key, [&] { return build(key, g, device); });
}

std::shared_ptr<CompiledKernel> get_built_kernel(const Kernel& k, DeviceType device) {
  const std::string ir = k.str();
  return cached("built|" + target_for(device).name + "|" + ir, [&] {
    const Tiering t = tiering_for(device);
    auto ck = std::make_shared<CompiledKernel>();
    ck->lowered = std::make_shared<Lowered>();
    ck->lowered->kernel = k;
    ck->full_key = std::string(kKilnVersion) + ";" + t.optimizing->cache_id() + "|" + kCodegenVersion + "|built|" + ir;
    return serve(std::move(ck), t, "built");
  });
}

}  // namespace kiln::jit
