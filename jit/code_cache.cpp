#include "jit/code_cache.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <unordered_map>

#include "jit/diagnostics.h"
#include "runtime/error.h"

namespace kiln::jit {
namespace {

constexpr const char* kKilnVersion = "kiln-0.1.0";
// Bump when the LLVM emitter changes what it generates for the same loop IR.
constexpr const char* kCodegenVersion = "codegen-4";
constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'O', 'B', 'J', '1'};

uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}
std::string hex(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

std::mutex g_mu;
std::unordered_map<std::string, std::shared_future<std::shared_ptr<CompiledKernel>>> g_cache;
CacheStats g_stats;

const std::string& target_id() {
  static const std::string id = std::string(kKilnVersion) + ";" + llvm_target_id();
  return id;
}

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// Disk entry: magic | u64 key length | key | u64 object length | object | u64 hash of all before.
bool read_entry(const std::string& path, const std::string& full_key, std::string& object) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::string buf((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto fail = [&](const char* why) {
    if (log_enabled("codegen")) log_line("codegen", std::string("disk cache entry ") + path + " rejected: " + why);
    std::lock_guard<std::mutex> lock(g_mu);
    g_stats.disk_rebuilds++;
    return false;
  };
  if (buf.size() < 32 || std::memcmp(buf.data(), kMagic, 8) != 0) return fail("bad header");
  uint64_t stored;
  std::memcpy(&stored, buf.data() + buf.size() - 8, 8);
  if (fnv1a(buf.substr(0, buf.size() - 8)) != stored) return fail("checksum mismatch (truncated or corrupted)");
  size_t pos = 8;
  uint64_t klen;
  std::memcpy(&klen, buf.data() + pos, 8);
  pos += 8;
  if (pos + klen + 8 > buf.size() - 8) return fail("bad key length");
  if (buf.compare(pos, klen, full_key) != 0) return fail("key mismatch");
  pos += klen;
  uint64_t olen;
  std::memcpy(&olen, buf.data() + pos, 8);
  pos += 8;
  if (pos + olen != buf.size() - 8) return fail("bad object length");
  object = buf.substr(pos, olen);
  return true;
}

void write_entry(const std::string& path, const std::string& full_key, const std::string& object) {
  std::string out(kMagic, 8);
  uint64_t n = full_key.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  out += full_key;
  n = object.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  out += object;
  uint64_t h = fnv1a(out);
  out.append(reinterpret_cast<const char*>(&h), 8);
  // Atomic: write a unique temporary file, then rename over the entry.
  std::string tmp = path + ".tmp." + std::to_string(reinterpret_cast<uintptr_t>(&out)) + "." +
                    std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return;  // cache directory not writable: keep going without disk caching
    f.write(out.data(), static_cast<std::streamsize>(out.size()));
    if (!f) return;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

std::shared_ptr<CompiledKernel> build(const std::string& key, const Group& g) {
  auto ck = std::make_shared<CompiledKernel>();
  ck->lowered = lower(g);
  // The disk key also covers the generated loop IR and the emitter version, so a kiln build
  // that lowers or emits differently never loads another build's objects.
  std::string full_key = target_id() + "|" + kCodegenVersion + "|" + hex(fnv1a(ck->lowered->kernel.str())) + "|" + key;
  ck->symbol = "kiln_" + hex(fnv1a(full_key));
  ck->lowered->kernel.name = ck->symbol;
  std::string dir = cache_dir();
  std::string path = dir.empty() ? "" : dir + "/" + ck->symbol + ".kobj";
  std::string object;
  auto t0 = std::chrono::steady_clock::now();
  if (!path.empty() && read_entry(path, full_key, object)) {
    ck->fn = load_object(object, ck->symbol);
    std::lock_guard<std::mutex> lock(g_mu);
    g_stats.disk_hits++;
    g_stats.load_ms += ms_since(t0);
    return ck;
  }
  std::string opt_ir;
  bool dumping = !dump_dir().empty();
  object = compile_to_object(ck->lowered->kernel, ck->symbol, dumping ? &opt_ir : nullptr);
  ck->fn = load_object(object, ck->symbol);
  double ms = ms_since(t0);
  if (dumping) {
    dump_file(ck->symbol + ".loop.txt", "// key: " + key + "\n" + ck->lowered->kernel.str());
    dump_file(ck->symbol + ".ll", emit_llvm_ir(ck->lowered->kernel, ck->symbol));
    dump_file(ck->symbol + ".opt.ll", opt_ir);
  }
  if (log_enabled("codegen"))
    log_line("codegen", "compiled " + ck->symbol + " in " + std::to_string(ms) + " ms (" +
                            std::to_string(ck->lowered->kernel.exprs.size()) + " exprs)");
  if (!path.empty()) write_entry(path, full_key, object);
  std::lock_guard<std::mutex> lock(g_mu);
  g_stats.compiles++;
  g_stats.compile_ms += ms;
  return ck;
}

}  // namespace

std::string cache_dir() {
  static const std::string dir = [] {
    const char* v = std::getenv("KILN_CACHE_DIR");
    std::string d;
    if (v && std::string(v) == "off") return d;
    if (v && *v) d = v;
    else if (const char* home = std::getenv("HOME")) d = std::string(home) + "/.cache/kiln";
    if (!d.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(d, ec);
      if (ec) d.clear();
    }
    return d;
  }();
  return dir;
}

CacheStats cache_stats() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_stats;
}
void reset_cache_stats() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_stats = CacheStats{};
}
void clear_memory_cache() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_cache.clear();
}

std::shared_ptr<CompiledKernel> get_kernel(const std::string& key, const Group& g) {
  std::promise<std::shared_ptr<CompiledKernel>> promise;
  std::shared_future<std::shared_ptr<CompiledKernel>> fut;
  bool mine = false;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_cache.find(key);
    if (it != g_cache.end()) {
      g_stats.hits++;
      fut = it->second;
    } else {
      fut = promise.get_future().share();
      g_cache.emplace(key, fut);
      mine = true;
    }
  }
  if (mine) {
    try {
      promise.set_value(build(key, g));
    } catch (...) {
      promise.set_exception(std::current_exception());
    }
  }
  return fut.get();
}

}  // namespace kiln::jit
