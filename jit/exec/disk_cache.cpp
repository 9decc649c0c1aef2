#include "jit/exec/disk_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "jit/diag/diagnostics.h"
#include "runtime/exec/device_runtime.h"

namespace kiln::jit {
namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'O', 'B', 'J', '1'};
std::atomic<uint64_t> g_rejections{0};

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

// Says once per process that compiled kernels are not kept on disk, and why (every later
// failure is only logged under KILN_LOG=codegen).
void warn_unwritable(const std::string& what) {
  static std::atomic<bool> said{false};
  if (!said.exchange(true))
    std::fprintf(stderr,
                 "[kiln] warning: kernel disk cache %s; compiled kernels are not kept across runs (set "
                 "KILN_CACHE_DIR to a writable directory, or to off)\n",
                 what.c_str());
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
    g_rejections.fetch_add(1, std::memory_order_relaxed);
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
    if (n <= 0)
      error = n < 0 ? std::strerror(errno) : "no progress";
    else
      done += static_cast<size_t>(n);
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

}  // namespace

std::string cache_dir() {
  static const std::string dir = [] {
    const char* v = std::getenv("KILN_CACHE_DIR");
    std::string d;
    if (v && std::string(v) == "off") return d;
    if (v && *v)
      d = v;
    else if (const char* home = std::getenv("HOME"))
      d = std::string(home) + "/.cache/kiln";
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

bool disk_read(const std::string& name, const std::string& key, std::string& value) {
  const std::string dir = cache_dir();
  return !dir.empty() && read_entry(dir + "/" + name, key, value);
}

void disk_write(const std::string& name, const std::string& key, const std::string& value) {
  const std::string dir = cache_dir();
  if (!dir.empty()) write_entry(dir + "/" + name, key, value);
}

uint64_t disk_rejections() { return g_rejections.load(std::memory_order_relaxed); }

std::string hash_hex(const std::string& s) { return hex(fnv1a(s)); }

std::string DiskBlobStore::entry(const std::string& key) const {
  return "blob-" + hash_hex(scope_ + "|" + key) + ".bin";
}
bool DiskBlobStore::read(const std::string& key, std::string& value) {
  return disk_read(entry(key), scope_ + "|" + key, value);
}
void DiskBlobStore::write(const std::string& key, const std::string& value) {
  disk_write(entry(key), scope_ + "|" + key, value);
}

namespace {
// The device runtimes' library kernels (runtime/cuda/device_ops) kept in the disk cache.
class DiskImageStore final : public KernelImageStore {
 public:
  bool read(const std::string& key, std::string& image) override {
    return disk_read("lib-" + hash_hex(key) + ".bin", key, image);
  }
  void write(const std::string& key, const std::string& image) override {
    disk_write("lib-" + hash_hex(key) + ".bin", key, image);
  }
};
const bool g_image_store = [] {
  static DiskImageStore store;
  set_kernel_image_store(&store);
  return true;
}();
}  // namespace

}  // namespace kiln::jit
