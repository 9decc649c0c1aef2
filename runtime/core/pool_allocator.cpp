#include "runtime/core/pool_allocator.h"

namespace kiln::detail {
namespace {

constexpr size_t kPoolGranule = 64;  // bytes per size class step
constexpr int kPoolClasses = 16;  // classes: 64, 128, ..., 1024 bytes
constexpr uint32_t kMaxPooledBlocks = 256;  // blocks a thread keeps per class at most

// One thread's free blocks, per size class.
struct BlockLists {
  void* head[kPoolClasses];
  uint32_t count[kPoolClasses];
  bool registered;  // the thread-exit hook that frees the lists is installed
  bool dead;  // the thread is exiting: blocks go straight back to the heap
};
thread_local BlockLists t_block_lists __attribute__((tls_model("initial-exec"))) = {};

thread_local bool t_exited __attribute__((tls_model("initial-exec"))) = false;

// Frees the thread's pooled blocks when it exits; later frees on it go to the heap.
struct Reaper {
  ~Reaper() {
    BlockLists& l = t_block_lists;
    t_exited = true;
    l.dead = true;
    for (int c = 0; c < kPoolClasses; ++c) {
      while (void* b = l.head[c]) {
        l.head[c] = *static_cast<void**>(b);
        ::operator delete(b);
      }
      l.count[c] = 0;
    }
  }
};
thread_local Reaper t_reaper;

// Installs the calling thread's exit hook that frees its lists.
void register_block_lists() {
  BlockLists& l = t_block_lists;
  l.registered = true;
  if (t_exited) {  // first use while the thread exits: never pool
    l.dead = true;
    return;
  }
  (void)&t_reaper;  // constructs it: its destructor frees the lists
}

}  // namespace

void* pool_block(size_t bytes) {
  const size_t c = (bytes - 1) / kPoolGranule;
  if (c >= kPoolClasses) return ::operator new(bytes);
  BlockLists& l = t_block_lists;
  if (void* b = l.head[c]) {
    l.head[c] = *static_cast<void**>(b);
    --l.count[c];
    return b;
  }
  if (!l.registered) register_block_lists();
  return ::operator new((c + 1) * kPoolGranule);
}

void pool_unblock(void* p, size_t bytes) noexcept {
  const size_t c = (bytes - 1) / kPoolGranule;
  BlockLists& l = t_block_lists;
  if (c < kPoolClasses && !l.registered) register_block_lists();  // may mark the lists dead
  if (c >= kPoolClasses || l.dead || l.count[c] >= kMaxPooledBlocks) {
    ::operator delete(p);
    return;
  }
  *static_cast<void**>(p) = l.head[c];
  l.head[c] = p;
  ++l.count[c];
}

}  // namespace kiln::detail
