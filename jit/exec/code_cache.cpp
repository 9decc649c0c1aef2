#include "jit/exec/code_cache.h"

#include <tbb/task_arena.h>

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <future>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "jit/cpu_asmjit/codegen_asmjit.h"
#include "jit/diag/diagnostics.h"
#include "jit/exec/executor.h"
#include "runtime/core/error.h"

namespace kiln::jit {
namespace {

constexpr const char* kKilnVersion = "kiln-0.1.0";
// Bump when the LLVM emitter changes what it generates for the same loop IR.
constexpr const char* kCodegenVersion = "codegen-7";  // 7: i1-vector lane reads through bytes (LLVM 16 x86)
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

// Says once per process that compiled kernels are not kept on disk, and why (every later
// failure is only logged under KILN_LOG=codegen).
void warn_unwritable(const std::string& what) {
  static std::atomic<bool> said{false};
  if (!said.exchange(true))
    std::fprintf(stderr, "[kiln] warning: kernel disk cache %s; compiled kernels are not kept across runs (set "
                 "KILN_CACHE_DIR to a writable directory, or to off)\n", what.c_str());
  else if (log_enabled("codegen"))
    log_line("codegen", "kernel disk cache " + what);
}

// The bytes of the regular file at `path`. Opened without blocking (a FIFO there must not hang
// the process); anything else at the path (a directory, a FIFO, a device) is removed so that
// the entry can be written again, and an unreadable file is left to be replaced by the write.
enum class ReadResult { Missing, Read, Unreadable };
ReadResult read_file(const std::string& path, std::string& buf, std::string& why) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return ReadResult::Missing;
    why = std::string("cannot open: ") + std::strerror(errno);
  } else {
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      why = std::string("cannot stat: ") + std::strerror(errno);
    } else if (!S_ISREG(st.st_mode)) {
      why = S_ISDIR(st.st_mode) ? "a directory, not a file" : "not a regular file";
    } else {
      buf.resize(static_cast<size_t>(st.st_size));
      size_t got = 0;
      while (got < buf.size()) {
        ssize_t n = ::read(fd, buf.data() + got, buf.size() - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += static_cast<size_t>(n);
      }
      buf.resize(got);  // a short read shows up as a bad length or checksum
      ::close(fd);
      return ReadResult::Read;
    }
    ::close(fd);
  }
  std::error_code ec;
  struct stat lst {};
  if (::lstat(path.c_str(), &lst) == 0 && !S_ISREG(lst.st_mode)) std::filesystem::remove_all(path, ec);
  return ReadResult::Unreadable;
}

// Disk entry: magic | u64 key length | key | u64 object length | object | u64 hash of all before.
bool read_entry(const std::string& path, const std::string& full_key, std::string& object) {
  std::string buf, why;
  auto fail = [&](const std::string& reason) {
    if (log_enabled("codegen")) log_line("codegen", "disk cache entry " + path + " rejected: " + reason);
    std::lock_guard<std::mutex> lock(g_mu);
    g_stats.disk_rebuilds++;
    return false;
  };
  ReadResult r = read_file(path, buf, why);
  if (r == ReadResult::Missing) return false;
  if (r == ReadResult::Unreadable) return fail(why);
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
  // Atomic: write a unique temporary file, then rename over the entry. On any failure (a
  // read-only directory, a full disk) the temporary file is removed and the process goes on.
  std::string tmp = path + ".tmp." + std::to_string(reinterpret_cast<uintptr_t>(&out)) + "." +
                    std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    warn_unwritable("cannot create files in " + std::filesystem::path(path).parent_path().string() + " (" +
                    std::strerror(errno) + ")");
    return;
  }
  std::string error;
  for (size_t done = 0; done < out.size() && error.empty();) {
    ssize_t n = ::write(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) error = n < 0 ? std::strerror(errno) : "no progress";
    else done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0 && error.empty()) error = std::strerror(errno);
  std::error_code ec;
  if (error.empty()) {
    std::filesystem::rename(tmp, path, ec);
    if (ec) error = "cannot rename over " + path + ": " + ec.message();
  }
  if (!error.empty()) {
    std::filesystem::remove(tmp, ec);
    warn_unwritable("cannot write " + tmp + " (" + error + ")");
  }
}

// Before the first load: the JIT's data layout comes from a file beside the kernels (keyed
// like them), so a warm process need not create a TargetMachine only to learn it.
void prepare_jit() {
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string dir = cache_dir();
    if (dir.empty()) return;
    const std::string key = target_id() + "|datalayout";
    const std::string path = dir + "/jit-" + hex(fnv1a(key)) + ".layout";
    std::string layout;
    if (!read_entry(path, key, layout)) {
      layout = host_data_layout();
      write_entry(path, key, layout);
    }
    set_jit_data_layout(layout);
  });
}

// LLVM: compiles `ck`'s kernel, loads it and writes the disk entry (any thread).
KernelFn build_llvm(const CompiledKernel& ck, const std::string& key, const std::string& full_key,
                    const std::string& path) {
  std::string opt_ir;
  bool dumping = !dump_dir().empty();
  if (dumping) {  // before compiling: a kernel that crashes LLVM is still on disk
    dump_file(ck.symbol + ".loop.txt", "// key: " + key + "\n" + ck.lowered->kernel.str());
    dump_file(ck.symbol + ".ll", emit_llvm_ir(ck.lowered->kernel, ck.symbol));
  }
  auto t0 = std::chrono::steady_clock::now();
  std::string object = compile_to_object(ck.lowered->kernel, ck.symbol, dumping ? &opt_ir : nullptr);
  prepare_jit();
  KernelFn fn = load_object(object, ck.symbol);
  double ms = ms_since(t0);
  if (log_enabled("codegen"))
    log_line("codegen", "compiled " + ck.symbol + " in " + std::to_string(ms) + " ms (" +
                            std::to_string(ck.lowered->kernel.exprs.size()) + " exprs)");
  if (!path.empty()) write_entry(path, full_key, object);
  std::lock_guard<std::mutex> lock(g_mu);
  g_stats.compiles++;
  g_stats.compile_ms += ms;
  return fn;
}

// ---- background LLVM compiles (tiered mode) ----
// Jobs wait in `queue`; one drain task at a time on a one-thread arena runs them in order.
//
// Exit: a running compile uses LLVM's function-local statics (constructed on first use, by any
// thread, and destroyed by exit in reverse order of construction) and kiln's. No static
// destructor may run while a compile runs, so shutdown_background() (drop the queued jobs,
// wait for the running compile, refuse new ones) must run before the first of them. The only
// point that precedes every static destructor is the destruction of the exiting thread's
// thread_local objects ([basic.start.term]: they are destroyed before any static object), so
// the main thread holds a thread_local ExitGuard (armed when the library is loaded) that calls
// it. An std::atexit handler, registered when the first job is queued and again after compiles
// 1, 2, 4, 8..., covers exit() called from another thread as far as exit handler order allows
// (statics constructed after its last registration are destroyed before it runs).
struct Job {
  std::shared_ptr<CompiledKernel> ck;
  std::string key, full_key, path;
};
// Leaked on purpose: the drain task and exit handlers touch it in any order.
struct Background {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Job> queue;  // not yet started
  bool draining = false;  // a drain task is enqueued or running
  int running = 0;        // a job is compiling (0 or 1)
  bool held = false;
  bool exiting = false;   // shut down: nothing is queued or started any more
};
std::atomic<Background*> g_bg{nullptr};
Background& bg() {
  static const bool made = [] {
    g_bg.store(new Background());
    // A child of fork() has only the forking thread: no compile runs there, and the state
    // (its mutex included) may be mid-update. The child starts from a fresh state, shut down
    // (its kernels keep their asmjit code; its exit waits for nothing).
    pthread_atfork(nullptr, nullptr, [] {
      auto* fresh = new Background();
      fresh->exiting = true;
      g_bg.store(fresh);
    });
    return true;
  }();
  (void)made;
  return *g_bg.load();
}
tbb::task_arena& bg_arena() {
  static tbb::task_arena* a = new tbb::task_arena(1, 0);  // one thread, never the callers'
  return *a;
}

// Drops the queued jobs, waits for the running compile and refuses any later one.
void shutdown_background() {
  Background& b = bg();
  std::deque<Job> dropped;
  {
    std::unique_lock<std::mutex> lock(b.mu);
    b.exiting = true;
    dropped.swap(b.queue);
    b.cv.notify_all();
    b.cv.wait(lock, [&] { return b.running == 0; });
  }
  // `dropped` is destroyed here, on the exiting thread, before static destructors run.
}
void at_exit() { shutdown_background(); }

// The main thread's guard: its destructor runs when main returns or the main thread calls
// exit(), before any static destructor (or when the main thread calls pthread_exit: later
// background compiles are then not started and kernels keep their asmjit code).
struct ExitGuard {
  bool armed = false;
  ~ExitGuard() {
    if (armed) shutdown_background();
  }
};
thread_local ExitGuard t_exit_guard;
const bool g_exit_guard_armed = [] {
  if (::gettid() == ::getpid()) t_exit_guard.armed = true;  // loaded on the main thread
  return true;
}();

// Runs queued jobs until the queue is empty (one drain task at a time).
void drain() {
  Background& b = bg();
  for (;;) {
    std::optional<Job> job;
    {
      std::unique_lock<std::mutex> lock(b.mu);
      b.cv.wait(lock, [&] { return !b.held || b.exiting || b.queue.empty(); });
      if (b.exiting || b.queue.empty()) {
        b.draining = false;
        b.cv.notify_all();
        return;
      }
      job.emplace(std::move(b.queue.front()));
      b.queue.pop_front();
      b.running++;
    }
    CompiledKernel& ck = *job->ck;
    try {
      KernelFn fn = build_llvm(ck, job->key, job->full_key, job->path);
      ck.fn.store(fn, std::memory_order_release);
      std::lock_guard<std::mutex> lock(g_mu);
      g_stats.background_swaps++;
    } catch (const std::exception& e) {
      log_line("codegen", "background LLVM compile of " + ck.symbol + " failed (" + e.what() +
                              "); it keeps running its asmjit code");
    }
    job.reset();  // before `running` drops: nothing of the job outlives shutdown_background()
    // The fallback handler again after compiles 1, 2, 4, 8...: statics constructed so far are
    // destroyed after it (one drain task runs at a time, ordered by `b.mu`).
    static uint64_t compiled = 0;
    ++compiled;
    if ((compiled & (compiled - 1)) == 0) std::atexit(at_exit);
    std::lock_guard<std::mutex> lock(b.mu);
    b.running--;
    b.cv.notify_all();
  }
}

void queue_llvm(std::shared_ptr<CompiledKernel> ck, std::string key, std::string full_key, std::string path) {
  Background& b = bg();
  static std::once_flag first;
  std::call_once(first, [] { std::atexit(at_exit); });
  std::lock_guard<std::mutex> lock(b.mu);
  if (b.exiting) return;  // shut down: the kernel keeps its asmjit code
  b.queue.push_back(Job{std::move(ck), std::move(key), std::move(full_key), std::move(path)});
  if (!b.draining) {
    b.draining = true;
    bg_arena().enqueue(drain);
  }
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
  const JitMode mode = jit_mode();
  const bool fast = (mode == JitMode::Asmjit || mode == JitMode::Tiered) && !ck->lowered->split && !ck->lowered->column &&
                    asmjit_supports(ck->lowered->kernel);
  // Disk first (asmjit mode skips it for kernels the asmjit tier takes: that mode tests it).
  std::string object;
  auto t0 = std::chrono::steady_clock::now();
  if (!(fast && mode == JitMode::Asmjit) && !path.empty() && read_entry(path, full_key, object)) {
    prepare_jit();
    ck->fn = load_object(object, ck->symbol);
    std::lock_guard<std::mutex> lock(g_mu);
    g_stats.disk_hits++;
    g_stats.load_ms += ms_since(t0);
    return ck;
  }
  if (fast) {
    try {
      t0 = std::chrono::steady_clock::now();
      ck->asmjit_fn = compile_asmjit(ck->lowered->kernel);
      double us = ms_since(t0) * 1000;
      ck->fn = ck->asmjit_fn;
      if (log_enabled("codegen")) log_line("codegen", "asmjit compiled " + ck->symbol + " in " + std::to_string(us) + " us (" + std::to_string(ck->lowered->kernel.exprs.size()) + " exprs)");
      {
        std::lock_guard<std::mutex> lock(g_mu);
        g_stats.asmjit_compiles++;
        g_stats.asmjit_compile_us += us;
      }
      if (mode == JitMode::Tiered) queue_llvm(ck, key, full_key, path);
      return ck;
    } catch (const std::exception& e) {
      // Once per key (the memory cache builds each key once); LLVM takes the kernel.
      if (log_enabled("codegen")) log_line("codegen", "asmjit cannot compile " + ck->symbol + " (" + e.what() + "); using LLVM");
      std::lock_guard<std::mutex> lock(g_mu);
      g_stats.asmjit_fallbacks++;
    }
  }
  ck->fn = build_llvm(*ck, key, full_key, path);
  return ck;
}

std::atomic<uint64_t> g_asmjit_runs{0}, g_llvm_runs{0};

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
      if (ec || !std::filesystem::is_directory(d, ec)) {
        warn_unwritable("directory " + d + " is unusable (" + (ec ? ec.message() : std::string("not a directory")) +
                        ")");
        d.clear();
      } else if (::access(d.c_str(), W_OK) != 0) {
        warn_unwritable("directory " + d + " is not writable (" + std::strerror(errno) + "); entries are only read");
      }
    }
    return d;
  }();
  return dir;
}

CacheStats cache_stats() {
  std::lock_guard<std::mutex> lock(g_mu);
  CacheStats s = g_stats;
  s.asmjit_runs = g_asmjit_runs.load(std::memory_order_relaxed);
  s.llvm_runs = g_llvm_runs.load(std::memory_order_relaxed);
  return s;
}
void reset_cache_stats() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_stats = CacheStats{};
  g_asmjit_runs = 0;
  g_llvm_runs = 0;
}

KernelFn launch_fn(const CompiledKernel& ck) {
  KernelFn fn = ck.fn.load(std::memory_order_acquire);
  (fn == ck.asmjit_fn ? g_asmjit_runs : g_llvm_runs).fetch_add(1, std::memory_order_relaxed);
  return fn;
}

void wait_background_compiles() {
  Background& b = bg();
  std::unique_lock<std::mutex> lock(b.mu);
  b.cv.wait(lock, [&] { return (b.queue.empty() || b.exiting) && b.running == 0; });
}

void hold_background_compiles(bool hold) {
  Background& b = bg();
  std::lock_guard<std::mutex> lock(b.mu);
  b.held = hold;
  b.cv.notify_all();
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
