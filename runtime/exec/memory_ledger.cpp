#include "runtime/exec/memory_ledger.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <unordered_map>

#include "runtime/core/error.h"
#include "runtime/exec/device_runtime.h"
#include "runtime/ir/node.h"

namespace kiln {
namespace {

struct Account {
  size_t live = 0, peak = 0, recorded = 0;
  std::vector<LedgerBlock> at_peak;
  int64_t allocated = -1, reserved = -1;  // the allocator's counters at the recorded peak
};

struct Block {
  LedgerBlock block;
  Device device;  // where it was counted
};

struct Ledger {
  std::mutex mu;
  std::unordered_map<const Storage*, Block> blocks;
  std::map<std::pair<int, int>, Account> devices;  // (type, index)
  uint64_t next_id = 1;
};

Ledger& ledger() {
  static Ledger* l = new Ledger;  // never destroyed: storages may die during static teardown
  return *l;
}

std::atomic<bool> g_forced{false};

std::pair<int, int> key(Device d) { return {static_cast<int>(d.type), d.index}; }
Device device_of(std::pair<int, int> k) { return Device{static_cast<DeviceType>(k.first), k.second}; }

// The allocator's counters of `d` (its caching allocator, or the host's buffer pool).
MemoryStats allocator_of(Device d) {
  MemoryStats none;
  none.allocated_bytes = none.reserved_bytes = -1;
  if (d.type == DeviceType::CPU) return host_memory_stats();
  try {
    DeviceRuntime* rt = find_device_runtime(d.type);
    return rt ? rt->memory_stats(d.index) : none;
  } catch (const std::exception&) {  // (a runtime without counters)
    return none;
  }
}

// Records the live blocks of `d` as its peak's, with the allocator's counters then.
void capture(const Ledger& l, Device d, Account& a) {
  a.recorded = a.live;
  a.at_peak.clear();
  for (const auto& [s, b] : l.blocks)
    if (b.device == d) a.at_peak.push_back(b.block);
  const MemoryStats m = allocator_of(d);
  a.allocated = m.allocated_bytes;
  a.reserved = m.reserved_bytes;
}

// The peak of `d` starts again from what is live now.
void restart_peak(const Ledger& l, Device d, Account& a) {
  a.peak = a.live;
  capture(l, d, a);
}

// capture() when the peak passes the last recorded one by 1 MiB or 0.5 % (a copy of the live list
// per recorded peak, not per allocation).
void record_peak(const Ledger& l, Device d, Account& a) {
  const size_t step = std::max<size_t>(size_t{1} << 20, a.recorded / 200);
  if (a.live >= a.recorded + step || a.at_peak.empty()) capture(l, d, a);
}

// Prints the report when the process exits.
struct AtExit {
  ~AtExit() { std::fputs(memory_ledger_report().c_str(), stderr); }
};

std::string mib(size_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f", static_cast<double>(b) / 1048576.0);
  return s;
}

// Largest first (the report's and the snapshot's order).
bool larger(const LedgerBlock& a, const LedgerBlock& b) { return a.bytes > b.bytes; }

// The `n` largest of `blocks`, one line: where a peak's bytes concentrate.
std::string largest_blocks(std::vector<LedgerBlock> blocks, size_t n) {
  n = std::min(n, blocks.size());
  std::partial_sort(blocks.begin(), blocks.begin() + static_cast<std::ptrdiff_t>(n), blocks.end(), larger);
  std::string out = n ? "  largest blocks (MiB):" : "";
  for (size_t i = 0; i < n; ++i) out += std::string(i ? "," : "") + " " + mib(blocks[i].bytes) + " " + blocks[i].made_by;
  return n ? out + "\n" : out;
}

}  // namespace

bool memory_ledger_on() {
  static const bool from_env = [] {
    const char* v = std::getenv("KILN_PROFILE");
    const bool yes = v && (std::strstr(v, "memory") != nullptr || std::strcmp(v, "all") == 0);  // "memory", "all" 
    if (yes) static AtExit at_exit;
    return yes;
  }();
  return from_env || g_forced.load(std::memory_order_relaxed);
}

void memory_ledger_enable() { g_forced.store(true); }

void memory_ledger_add(Storage& s) {
  Ledger& l = ledger();
  std::lock_guard<std::mutex> lock(l.mu);
  // A device runtime may hand out a block it allocated as another device's (a simulated device
  // over host memory): counted once, on the device it is for.
  auto [it, fresh] = l.blocks.try_emplace(&s);
  if (!fresh) l.devices[key(it->second.device)].live -= it->second.block.bytes;
  const char* made_by = s.made_by ? s.made_by : "other";
  it->second = {{s.nbytes, made_by, memory_role_name(s.role, made_by), l.next_id++}, s.device};
  s.in_ledger = true;
  Account& a = l.devices[key(s.device)];
  a.live += s.nbytes;
  if (a.live > a.peak) {
    a.peak = a.live;
    record_peak(l, s.device, a);
  }
}

void memory_ledger_remove(const Storage& s) {
  Ledger& l = ledger();
  std::lock_guard<std::mutex> lock(l.mu);
  auto it = l.blocks.find(&s);
  if (it == l.blocks.end()) return;
  l.devices[key(it->second.device)].live -= it->second.block.bytes;
  l.blocks.erase(it);
}

void memory_ledger_mark(Node& n, MemoryRole role) {
  if (!memory_ledger_on()) return;
  Node* at = n.placed && n.placed->local ? n.placed->local.get() : &n;
  if (role > at->role) at->role = role;
  Storage* s = at->storage.get();
  if (!s || !s->in_ledger) return;
  Ledger& l = ledger();
  std::lock_guard<std::mutex> lock(l.mu);
  if (at->role <= s->role) return;
  s->role = at->role;
  auto it = l.blocks.find(s);
  if (it == l.blocks.end()) return;
  LedgerBlock& b = it->second.block;
  b.role = memory_role_name(s->role, b.made_by);
  // (the peak's copy too: a block is often marked after the allocation that made the peak)
  for (LedgerBlock& p : l.devices[key(it->second.device)].at_peak)
    if (p.id == b.id) p.role = b.role;
}

void memory_ledger_inherit(const Node& from, Node& to) {
  if (from.role != MemoryRole::Other) memory_ledger_mark(to, from.role);
}

const char* memory_role_name(MemoryRole role, const char* made_by) {
  switch (role) {
    case MemoryRole::Parameter: return "parameters";
    case MemoryRole::OptimizerState: return "optimizer state";
    case MemoryRole::Gradient: return "gradients";
    case MemoryRole::Saved: return "saved for backward";
    case MemoryRole::Other: break;
  }
  if (made_by && (std::strstr(made_by, "workspace") || std::strstr(made_by, "partials"))) return "library workspaces";
  return "activations and temporaries";
}

std::vector<LedgerDevice> memory_ledger() {
  Ledger& l = ledger();
  std::lock_guard<std::mutex> lock(l.mu);
  std::vector<LedgerDevice> out;
  for (const auto& [k, a] : l.devices)
    out.push_back({device_of(k), a.live, a.peak, a.recorded, a.at_peak, a.allocated, a.reserved});
  return out;
}

void memory_ledger_reset_peak(Device device) {
  Ledger& l = ledger();
  std::lock_guard<std::mutex> lock(l.mu);
  auto it = l.devices.find(key(device));
  if (it != l.devices.end()) restart_peak(l, device, it->second);
}

void memory_ledger_reset_peaks() {
  Ledger& l = ledger();
  std::lock_guard<std::mutex> lock(l.mu);
  for (auto& [k, a] : l.devices) restart_peak(l, device_of(k), a);
}

namespace {

// The peak's blocks grouped by `field` (what made them, or what they hold), largest first: one
// line each of MiB, share of `total` and blocks, under a header naming the column.
std::string table(const std::vector<LedgerBlock>& blocks, const char* LedgerBlock::*field, const char* column,
                  size_t total) {
  std::map<std::string, std::pair<size_t, size_t>> by;  // key -> (bytes, blocks)
  for (const LedgerBlock& b : blocks) {
    auto& [bytes, n] = by[b.*field];
    bytes += b.bytes;
    ++n;
  }
  std::vector<std::pair<std::string, std::pair<size_t, size_t>>> rows(by.begin(), by.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  char line[256];
  std::snprintf(line, sizeof line, "%12s %7s %8s  %s\n", "MiB", "share", "blocks", column);
  std::string out = line;
  for (const auto& [what, v] : rows) {
    std::snprintf(line, sizeof line, "%12.1f %6.1f%% %8zu  %s\n", static_cast<double>(v.first) / 1048576.0,
                  total ? 100.0 * static_cast<double>(v.first) / static_cast<double>(total) : 0.0, v.second,
                  what.c_str());
    out += line;
  }
  return out;
}

// What the allocator held at the recorded peak beyond the tensors' blocks: its rounding, memory
// handed out outside tensors (CUDA-graph pools, library handles), and its cache.
std::string allocator_line(const LedgerDevice& d) {
  const int64_t allocated = d.allocated, reserved = d.reserved;
  if (allocated < 0) return "";
  const auto over = [](int64_t a, size_t b) { return a > static_cast<int64_t>(b) ? static_cast<size_t>(a) - b : 0; };
  return "  the allocator then: " + mib(static_cast<size_t>(allocated)) + " MiB handed out (" +
         mib(over(allocated, d.recorded_peak_bytes)) +
         " beyond these blocks: rounding, CUDA-graph pools, library memory), " + mib(static_cast<size_t>(reserved)) +
         " MiB reserved (" + mib(over(reserved, static_cast<size_t>(allocated))) +
         " cached or fragmented)\n";
}

}  // namespace

std::string memory_ledger_report() {
  std::string out;
  for (const LedgerDevice& d : memory_ledger()) {
    out += "[kiln:profile] memory on " + d.device.str() + ": peak " + mib(d.peak_bytes) + " MiB (live now " +
           mib(d.live_bytes) + " MiB); the blocks live at " + mib(d.recorded_peak_bytes) +
           " MiB, by what they hold and by the op that made them\n";
    out += table(d.at_peak, &LedgerBlock::role, "holds", d.recorded_peak_bytes);
    out += table(d.at_peak, &LedgerBlock::made_by, "made by", d.recorded_peak_bytes);
    out += largest_blocks(d.at_peak, 8);
    out += allocator_line(d);
  }
  return out;
}

void memory_ledger_snapshot(const std::string& path, Device device) {
  KILN_CHECK(memory_ledger_on(), "memory_snapshot: the memory ledger is off (run with KILN_PROFILE=memory)");
  LedgerDevice d{device};
  for (LedgerDevice& x : memory_ledger())
    if (x.device == device) d = std::move(x);
  std::sort(d.at_peak.begin(), d.at_peak.end(), larger);
  std::ofstream f(path);
  KILN_CHECK(f.good(), "memory_snapshot: cannot write ", path);
  f << "{\"device\": \"" << device.str() << "\", \"peak_bytes\": " << d.peak_bytes
    << ", \"recorded_peak_bytes\": " << d.recorded_peak_bytes << ", \"live_bytes\": " << d.live_bytes
    << ", \"blocks\": [";
  for (size_t i = 0; i < d.at_peak.size(); ++i)
    f << (i ? ", " : "") << "{\"bytes\": " << d.at_peak[i].bytes << ", \"made_by\": \"" << d.at_peak[i].made_by
      << "\", \"role\": \"" << d.at_peak[i].role << "\"}";
  f << "]}\n";
  KILN_CHECK(f.good(), "memory_snapshot: writing ", path, " failed");
}

}  // namespace kiln
