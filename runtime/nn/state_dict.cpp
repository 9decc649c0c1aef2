// The state-dict file format (see nn.h): versioned, length-prefixed, hashed.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "runtime/nn/nn.h"

namespace kiln::nn {
namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'S', 'D', '0', '1'};
constexpr uint32_t kVersion = 1;

uint64_t fnv1a(const char* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<uint8_t>(p[i]);
    h *= 1099511628211ull;
  }
  return h;
}

// The whole file at `path`; a missing, unreadable or non-regular file is a kiln::Error naming
// the path and the reason (never a stream exception, never a blocking open of a FIFO).
std::string read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  KILN_CHECK(fd >= 0, "load_state_dict_file: cannot open '", path, "': ", std::strerror(errno));
  struct stat st {};
  std::string buf;
  std::string error;
  if (::fstat(fd, &st) != 0) {
    error = std::strerror(errno);
  } else if (S_ISDIR(st.st_mode)) {
    error = "is a directory, expected a state dict file";
  } else if (!S_ISREG(st.st_mode)) {
    error = "is not a regular file";
  } else {
    char chunk[1 << 16];
    for (;;) {
      ssize_t n = ::read(fd, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) error = std::strerror(errno);
      if (n <= 0) break;
      buf.append(chunk, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  KILN_CHECK(error.empty(), "load_state_dict_file: cannot read '", path, "': ", error);
  return buf;
}

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

struct Reader {
  const std::string& buf;
  size_t pos = 0;
  const std::string& path;
  template <class T>
  T get(const char* what) {
    KILN_CHECK(pos + sizeof(T) <= buf.size(), "load_state_dict_file: '", path, "' is truncated (reading ", what,
               " at byte ", pos, ")");
    T v;
    std::memcpy(&v, buf.data() + pos, sizeof v);
    pos += sizeof v;
    return v;
  }
  std::string bytes(uint64_t n, const char* what) {
    KILN_CHECK(n <= buf.size() && pos + n <= buf.size(), "load_state_dict_file: '", path, "' is truncated (reading ",
               what, " of ", n, " bytes at byte ", pos, ")");
    std::string s = buf.substr(pos, n);
    pos += n;
    return s;
  }
};

}  // namespace

void save_state_dict(const std::map<std::string, Tensor>& sd, const std::string& path) {
  std::string out(kMagic, sizeof kMagic);
  put<uint32_t>(out, kVersion);
  put<uint32_t>(out, static_cast<uint32_t>(sd.size()));
  for (const auto& [name, t] : sd) {
    put<uint32_t>(out, static_cast<uint32_t>(name.size()));
    out += name;
    put<uint8_t>(out, static_cast<uint8_t>(t.dtype()));
    put<uint32_t>(out, static_cast<uint32_t>(t.dim()));
    for (int64_t s : t.sizes()) put<int64_t>(out, s);
    Tensor c = contiguous(t).eval();
    uint64_t nbytes = static_cast<uint64_t>(c.numel()) * itemsize(c.dtype());
    put<uint64_t>(out, nbytes);
    const char* p = static_cast<const char*>(c.node()->storage->data) + c.node()->offset.as_int() * itemsize(c.dtype());
    out.append(p, nbytes);
  }
  put<uint64_t>(out, fnv1a(out.data(), out.size()));
  // Write atomically: a crash never leaves a half-written file under `path`.
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    KILN_CHECK(f.good(), "save_state_dict: cannot open '", tmp, "' for writing");
    f.write(out.data(), static_cast<std::streamsize>(out.size()));
    KILN_CHECK(f.good(), "save_state_dict: failed writing '", tmp, "'");
  }
  KILN_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "save_state_dict: cannot rename '", tmp, "' to '", path, "'");
}

std::map<std::string, Tensor> load_state_dict_file(const std::string& path) {
  std::string buf = read_file(path);
  KILN_CHECK(buf.size() >= sizeof kMagic + 16 && std::memcmp(buf.data(), kMagic, sizeof kMagic) == 0,
             "load_state_dict_file: '", path, "' is not a kiln state dict (bad magic or too short)");
  uint64_t stored;
  std::memcpy(&stored, buf.data() + buf.size() - 8, 8);
  Reader r{buf, sizeof kMagic, path};
  uint32_t version = r.get<uint32_t>("version");
  KILN_CHECK(version == kVersion, "load_state_dict_file: '", path, "' has format version ", version,
             ", this kiln reads version ", kVersion);
  KILN_CHECK(fnv1a(buf.data(), buf.size() - 8) == stored, "load_state_dict_file: '", path,
             "' is corrupted or truncated (checksum mismatch)");
  std::string body = buf.substr(0, buf.size() - 8);
  Reader b{body, r.pos, path};
  uint32_t count = b.get<uint32_t>("count");
  std::map<std::string, Tensor> sd;
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t nlen = b.get<uint32_t>("name length");
    std::string name = b.bytes(nlen, "name");
    uint8_t dt = b.get<uint8_t>("dtype");
    KILN_CHECK(dt <= static_cast<uint8_t>(DType::Float64), "load_state_dict_file: bad dtype code ", int(dt), " for '",
               name, "'");
    uint32_t ndim = b.get<uint32_t>("ndim");
    KILN_CHECK(ndim <= 64, "load_state_dict_file: implausible rank ", ndim, " for '", name, "'");
    std::vector<int64_t> sizes;
    uint64_t numel = 1;
    for (uint32_t d = 0; d < ndim; ++d) {
      int64_t s = b.get<int64_t>("size");
      KILN_CHECK(s >= 0, "load_state_dict_file: negative size for '", name, "'");
      sizes.push_back(s);
      numel *= static_cast<uint64_t>(s);
    }
    DType dtype = static_cast<DType>(dt);
    uint64_t nbytes = b.get<uint64_t>("byte count");
    KILN_CHECK(nbytes == numel * itemsize(dtype), "load_state_dict_file: '", name, "' declares ", nbytes, " bytes for ",
               numel, " elements of ", dtype_name(dtype));
    std::string data = b.bytes(nbytes, "tensor data");
    auto storage = Storage::allocate(nbytes, cpu());
    std::memcpy(storage->data, data.data(), nbytes);
    auto* raw = new std::shared_ptr<Storage>(storage);
    sd[name] = from_blob(storage->data, sizes, dtype, [raw](void*) { delete raw; });
  }
  KILN_CHECK(b.pos == body.size(), "load_state_dict_file: '", path, "' has ", body.size() - b.pos, " trailing bytes");
  return sd;
}

}  // namespace kiln::nn
