#include "jit/compile/break_steps.h"

#include <cstring>
#include <iomanip>
#include <sstream>

namespace kiln::jit {
namespace {

// Calls f(offset, index) for each element of a strided block, in logical order.
template <class F>
void for_each_element(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides, int64_t offset, F&& f) {
  int64_t total = 1;
  for (int64_t s : sizes) total *= s;
  std::vector<int64_t> idx(sizes.size(), 0);
  for (int64_t e = 0; e < total; ++e) {
    int64_t off = offset;
    for (size_t d = 0; d < sizes.size(); ++d) off += idx[d] * strides[d];
    f(off, idx);
    for (size_t d = sizes.size(); d-- > 0;) {
      if (++idx[d] < sizes[d]) break;
      idx[d] = 0;
    }
  }
}

template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

void element_str(std::ostream& os, DType t, const uint8_t* p) {
  switch (t) {
    case DType::Float32: os << std::setprecision(9) << load<float>(p); break;
    case DType::Float64: os << std::setprecision(17) << load<double>(p); break;
    case DType::Int64: os << load<int64_t>(p); break;
    case DType::Int32: os << load<int32_t>(p); break;
    case DType::Bool: os << (*p ? "true" : "false"); break;
    default: {
      os << "0x" << std::hex;
      for (size_t i = itemsize(t); i-- > 0;) os << static_cast<int>(p[i]);
      os << std::dec;
    }
  }
}

}  // namespace

std::vector<uint8_t> value_bytes(const std::vector<Tensor>& outs, size_t n) {
  std::vector<uint8_t> bytes;
  for (size_t i = 0; i < n; ++i) {
    const Node& v = *outs[i].node();
    size_t isz = itemsize(v.dtype);
    const auto* base = static_cast<const uint8_t*>(v.storage->data);
    for_each_element(concrete(v.shape), concrete(v.strides), v.offset.as_int(), [&](int64_t off, const auto&) {
      const uint8_t* p = base + off * static_cast<int64_t>(isz);
      bytes.insert(bytes.end(), p, p + isz);
    });
  }
  return bytes;
}

std::shared_ptr<Storage> storage_like(const Node& like, const Node& src, const std::map<std::string, int64_t>& env) {
  std::vector<int64_t> sizes = concrete(src.shape), from = concrete(src.strides), to;
  for (const auto& st : like.strides) to.push_back(st.evaluate(env));
  int64_t off = like.offset.evaluate(env);
  if (off == src.offset.as_int() && to == from) return src.storage;
  size_t isz = itemsize(src.dtype);
  int64_t last = off;
  for (size_t d = 0; d < sizes.size(); ++d) last += sizes[d] > 0 ? (sizes[d] - 1) * to[d] : 0;
  auto s = Storage::allocate(static_cast<size_t>(last + 1) * isz, src.device, "graph break copy");
  const auto* in = static_cast<const char*>(src.storage->data);
  auto* out = static_cast<char*>(s->data);
  for_each_element(sizes, from, src.offset.as_int(), [&](int64_t a, const std::vector<int64_t>& idx) {
    int64_t b = off;
    for (size_t d = 0; d < idx.size(); ++d) b += idx[d] * to[d];
    std::memcpy(out + b * static_cast<int64_t>(isz), in + a * static_cast<int64_t>(isz), isz);
  });
  return s;
}

void BreakStep::add(std::unique_ptr<Branch> b) {
  b->older = head.load(std::memory_order_acquire);
  head.store(b.get(), std::memory_order_release);
  owned.push_back(std::move(b));
}

Branch* BreakStep::find(const std::vector<uint8_t>& bytes, std::vector<int64_t>& syms,
                        const std::vector<std::string>& names, size_t first_captured, std::string* why) const {
  Branch* same_values = nullptr;
  std::string guard_why;
  int count = 0;
  for (Branch* b = head.load(std::memory_order_acquire); b; b = b->older, ++count) {
    if (b->bytes != bytes) continue;
    if (b->guards.check(syms, names, first_captured, why && !same_values ? &guard_why : nullptr)) return b;
    if (!same_values) same_values = b;
  }
  if (why) {
    Branch* newest = head.load(std::memory_order_acquire);
    if (same_values)
      *why = "(" + what + ") after value " + values_str(bytes) + ": " + guard_why;
    else if (newest)
      *why = "(" + what + "): expected " + values_str(newest->bytes) +
             (count > 1 ? " (or " + std::to_string(count - 1) + (count > 2 ? " other values)" : " other value)") : "") +
             ", got " + values_str(bytes);
  }
  return nullptr;
}

std::string BreakStep::values_str(const std::vector<uint8_t>& bytes) const {
  std::ostringstream os;
  int64_t total = 0;
  for (int64_t n : numels) total += n;
  if (total != 1) os << "[";
  size_t at = 0;
  int64_t shown = 0;
  for (size_t v = 0; v < dtypes.size(); ++v)
    for (int64_t e = 0; e < numels[v]; ++e, ++shown) {
      size_t isz = itemsize(dtypes[v]);
      if (shown < 8 && at + isz <= bytes.size()) {
        if (shown) os << ", ";
        element_str(os, dtypes[v], bytes.data() + at);
      } else if (shown == 8) {
        os << ", ...";
      }
      at += isz;
    }
  if (total != 1) os << "]";
  return os.str();
}

}  // namespace kiln::jit
