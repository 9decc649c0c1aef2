// The memory ledger (KILN_PROFILE=memory): every block kiln allocates for tensor data and
// workspaces (Storage::allocate, host and device), the op that made it, and what was live at
// each device's peak. Off unless KILN_PROFILE names `memory`; then printed at exit, and
// written by kiln::cuda::memory_snapshot / kiln::host_memory_snapshot.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/device.h"

namespace kiln {

struct Storage;
struct Node;
enum class MemoryRole : uint8_t;

// Whether the ledger records (KILN_PROFILE lists `memory`, or memory_ledger_enable()).
bool memory_ledger_on();
// Turns the ledger on in this process (tests; allocations made before stay unrecorded).
void memory_ledger_enable();

// Records `s` (s.nbytes on s.device, made by s.made_by) and removes it when it is destroyed.
void memory_ledger_add(Storage& s);
void memory_ledger_remove(const Storage& s);
// Marks what `n`'s storage holds (now, or once it is computed: Node::set_storage passes the
// node's role on), for the report's roles; a no-op while the ledger is off. A DTensor's node
// marks its shard.
void memory_ledger_mark(Node& n, MemoryRole role);
// Gives `to` the role of `from`, the node a tensor held before an in-place write or a rebind
// made it hold `to` (a parameter initialized in place stays a parameter).
void memory_ledger_inherit(const Node& from, Node& to);

// One device's figures: bytes live now and at the peak (as requested, before the allocator's
// rounding), and the blocks live when the peak was last recorded (within 1 MiB or 0.5 % of it).
struct LedgerBlock {
  size_t bytes = 0;
  const char* made_by = "";
  const char* role = "";  // memory_role_name
  uint64_t id = 0;  // (the ledger's: which block, while the role may still change)
};
// The report's name of what a block holds: its MemoryRole, "library workspaces" for scratch a
// kernel or library call made (made_by names a workspace or partials), else "activations and
// temporaries" (values a backward keeps through a custom rule, and values in flight).
const char* memory_role_name(MemoryRole role, const char* made_by);
struct LedgerDevice {
  Device device;
  size_t live_bytes = 0, peak_bytes = 0, recorded_peak_bytes = 0;
  std::vector<LedgerBlock> at_peak;
  int64_t allocated = -1, reserved = -1;  // the allocator's counters at the recorded peak (-1: none)
};
std::vector<LedgerDevice> memory_ledger();
// Resets the peaks of every device (of `device`) to what is live now.
void memory_ledger_reset_peaks();
void memory_ledger_reset_peak(Device device);

// The report KILN_PROFILE=memory prints: per device, the peak and what made the blocks live at
// it, by bytes.
std::string memory_ledger_report();
// Writes `device`'s blocks at its peak as JSON (see kiln::cuda::memory_snapshot).
void memory_ledger_snapshot(const std::string& path, Device device);

}  // namespace kiln
