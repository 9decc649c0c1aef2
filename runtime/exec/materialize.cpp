// Materialization: collect the pending subgraph of the requested nodes and run it.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>

#include "runtime/core/error.h"
#include "runtime/exec/executor.h"
#include "runtime/tensor/trace.h"

namespace kiln {
namespace {
// Node ids come from one counter, which also counts the nodes recorded (minus the count at the
// last reset_stats()).
std::atomic<uint64_t> g_next_id{1}, g_recorded_base{0};
std::atomic<uint64_t> g_executed{0}, g_materializations{0};
// Pending nodes: the total of every thread's flushed tally. A thread adds its changes to its
// own tally and moves it to the total once it reaches kPendingBatch either way, or when the
// thread ends: recording a node costs no atomic update of a shared counter.
std::atomic<int64_t> g_pending{0};
constexpr int64_t kPendingBatch = 64;
thread_local int64_t t_pending __attribute__((tls_model("initial-exec"))) = 0;
thread_local bool t_pending_direct __attribute__((tls_model("initial-exec"))) = false;
thread_local bool t_pending_registered __attribute__((tls_model("initial-exec"))) = false;
struct PendingFlush {  // one per thread that counted: hands its tally over when it ends
  ~PendingFlush() {
    g_pending.fetch_add(t_pending, std::memory_order_relaxed);
    t_pending = 0;
    t_pending_direct = true;  // nodes freed by later thread-exit destructors count directly
  }
};
std::atomic<uint64_t> g_pending_limit{10000};
std::mutex g_exec_mu;
std::shared_ptr<Executor> g_executor;
// Every executor ever installed stays alive, so a run that read g_current may finish on it
// while another thread installs a different one.
std::vector<std::shared_ptr<Executor>> g_installed;
std::atomic<Executor*> g_current{nullptr};
}  // namespace

namespace detail {
uint64_t node_made() {
  pending_add(1);
  return g_next_id.fetch_add(1, std::memory_order_relaxed);
}
void count_executed(uint64_t n) { g_executed.fetch_add(n, std::memory_order_relaxed); }
void pending_add(int64_t d) {
  if (t_pending_direct) [[unlikely]] {
    g_pending.fetch_add(d, std::memory_order_relaxed);
    return;
  }
  if (!t_pending_registered) [[unlikely]] {
    t_pending_registered = true;
    static thread_local PendingFlush flush;
    (void)flush;
  }
  t_pending += d;
  if (t_pending >= kPendingBatch || t_pending <= -kPendingBatch) {
    g_pending.fetch_add(t_pending, std::memory_order_relaxed);
    t_pending = 0;
  }
}
int64_t pending_now() { return g_pending.load(std::memory_order_relaxed) + t_pending; }
}  // namespace detail

Stats stats() {
  Stats s;
  s.nodes_recorded = g_next_id.load() - 1 - g_recorded_base.load();
  s.nodes_executed = g_executed.load();
  s.materializations = g_materializations.load();
  int64_t p = detail::pending_now();
  s.pending = p > 0 ? static_cast<uint64_t>(p) : 0;
  return s;
}

void reset_stats() {
  g_recorded_base = g_next_id.load() - 1;
  g_executed = 0;
  g_materializations = 0;
}

void set_pending_limit(uint64_t n) { g_pending_limit = n; }
uint64_t pending_limit() { return g_pending_limit.load(); }

void set_executor(std::shared_ptr<Executor> ex) {
  std::lock_guard<std::mutex> lock(g_exec_mu);
  g_executor = std::move(ex);
  if (g_executor && std::find(g_installed.begin(), g_installed.end(), g_executor) == g_installed.end())
    g_installed.push_back(g_executor);
  g_current.store(g_executor.get(), std::memory_order_release);
}

Executor& current_executor() {
  if (Executor* e = g_current.load(std::memory_order_acquire)) return *e;
  std::lock_guard<std::mutex> lock(g_exec_mu);
  if (!g_executor) {
    g_executor = interpreter();
    g_installed.push_back(g_executor);
    g_current.store(g_executor.get(), std::memory_order_release);
  }
  return *g_executor;
}

namespace {
std::atomic<Executor*> g_device_executor{nullptr};  // CUDA segments (null: the interpreter)

Executor& executor_for(DeviceType type) {
  if (type == DeviceType::CPU) return current_executor();
  if (Executor* e = g_device_executor.load(std::memory_order_acquire)) return *e;
  return *interpreter();
}
}  // namespace

void set_device_executor(DeviceType type, std::shared_ptr<Executor> ex) {
  KILN_CHECK(type != DeviceType::CPU, "set_device_executor: use set_executor for the CPU");
  std::lock_guard<std::mutex> lock(g_exec_mu);
  if (ex && std::find(g_installed.begin(), g_installed.end(), ex) == g_installed.end()) g_installed.push_back(ex);
  g_device_executor.store(ex.get(), std::memory_order_release);
}

std::vector<DevicePart> split_by_device(Segment& seg) {
  const size_t N = seg.nodes.size();
  std::vector<DevicePart> parts;
  if (N == 0) return parts;
  // Phase of a node: the most cross-device edges on a path to it from the segment's start.
  std::vector<int> phase(N, 0), part_of(N, -1);
  for (size_t i = 0; i < N; ++i) seg.nodes[i]->pos = static_cast<int32_t>(i);
  auto in_seg = [&](const Node* in) {
    return !in->materialized() && in->pos >= 0 && static_cast<size_t>(in->pos) < N && seg.nodes[in->pos] == in;
  };
  for (size_t i = 0; i < N; ++i) {
    Node* n = seg.nodes[i];
    for (auto& in : n->inputs)
      if (in_seg(in.get())) phase[i] = std::max(phase[i], phase[in->pos] + (in->device != n->device ? 1 : 0));
    size_t p = 0;
    while (p < parts.size() && !(parts[p].device == n->device && parts[p].phase == phase[i])) ++p;
    if (p == parts.size()) parts.push_back(DevicePart{n->device, phase[i], {}});
    part_of[i] = static_cast<int>(p);
  }
  // A node read by another part must outlive its own part.
  std::vector<bool> needed = seg.needed;
  for (size_t i = 0; i < N; ++i)
    for (auto& in : seg.nodes[i]->inputs)
      if (in_seg(in.get()) && part_of[in->pos] != part_of[i]) needed[in->pos] = true;
  for (size_t i = 0; i < N; ++i) {
    Segment& s = parts[part_of[i]].seg;
    s.nodes.push_back(seg.nodes[i]);
    s.needed.push_back(needed[i]);
  }
  std::stable_sort(parts.begin(), parts.end(),
                   [](const DevicePart& a, const DevicePart& b) { return a.phase < b.phase; });
  return parts;
}

void run_segment(Segment& seg) {
  const size_t N = seg.nodes.size();
  bool one_device = true;
  for (size_t i = 1; i < N && one_device; ++i) one_device = seg.nodes[i]->device == seg.nodes[0]->device;
  if (N == 0 || one_device) {
    if (N) executor_for(seg.nodes[0]->device.type).run(seg);
    return;
  }
  std::vector<DevicePart> parts = split_by_device(seg);
  struct KeepAlive {  // what the parts' executors unlinked, released with the whole segment
    Segment& seg;
    std::vector<DevicePart>& parts;
    ~KeepAlive() {
      for (DevicePart& p : parts)
        seg.keep_alive.insert(seg.keep_alive.end(), p.seg.keep_alive.begin(), p.seg.keep_alive.end());
    }
  } keep{seg, parts};
  for (DevicePart& p : parts) executor_for(p.device.type).run(p.seg);
  for (size_t i = 0; i < N; ++i) seg.nodes[i]->pos = static_cast<int32_t>(i);  // the caller's positions
}

namespace {
// Threads share tensors, so two materialize() calls may reach the same pending nodes. Each
// call claims the pending nodes it collects (Node::claim = its thread's token) and only the
// owner reads or changes a pending node; other threads test ready() alone. A call that meets
// a node another thread owns gives back its claims, waits until that node is released, and
// collects again holding g_retry_mu, now waiting in place for claims it meets. Calls that hold
// all their claims never wait, and only one call at a time waits while holding claims, so no
// two calls wait on each other. (Nested calls, made inside an executor's run, cannot give
// back their outer call's claims and wait in place as well.) A node released without being
// stored is computed again by its next owner: same inputs, same result.
std::atomic<uint32_t> g_epoch{0};
std::atomic<uint32_t> g_next_token{1};
thread_local uint32_t t_token __attribute__((tls_model("initial-exec"))) = 0;
std::atomic<int> g_waiters{0};
std::mutex g_wait_mu;
std::condition_variable g_wait_cv;
std::mutex g_retry_mu;

uint32_t thread_token() {
  if (t_token == 0) t_token = g_next_token.fetch_add(1, std::memory_order_relaxed);
  return t_token;
}

uint32_t next_epoch() {
  uint32_t epoch = g_epoch.fetch_add(1, std::memory_order_relaxed) + 1;
  if (epoch == 0) epoch = g_epoch.fetch_add(1, std::memory_order_relaxed) + 1;
  return epoch;
}

// Wakes calls waiting for a claim to go (a wakeup missed by a racing waiter costs it at most
// one wait_for period).
void notify_waiters() {
  if (g_waiters.load(std::memory_order_seq_cst) == 0) return;
  std::lock_guard<std::mutex> lock(g_wait_mu);
  g_wait_cv.notify_all();
}

// Blocks until `n` is ready or no thread owns it.
void wait_released(const NodePtr& n) {
  g_waiters.fetch_add(1, std::memory_order_seq_cst);
  {
    std::unique_lock<std::mutex> lock(g_wait_mu);
    while (!n->ready() && n->claim.load(std::memory_order_acquire) != 0)
      g_wait_cv.wait_for(lock, std::chrono::microseconds(500));
  }
  g_waiters.fetch_sub(1, std::memory_order_relaxed);
}

// Reusable buffers of one materialize() call; nested calls on a thread get their own.
struct Scratch {
  std::vector<Node*> order;
  std::vector<std::pair<Node*, size_t>> stack;
  std::vector<Node*> claimed;  // nodes this call claimed (all in `order` once collected)
  std::vector<uint8_t> mine;  // per segment position: claimed by this call
  std::vector<int32_t> internal;  // per segment position: edges from inside the segment
  std::vector<long> uses;  // per segment position: the node's shared_ptr use count
  Segment seg;
};
thread_local std::vector<std::unique_ptr<Scratch>> t_scratch;
thread_local size_t t_depth = 0;

// Gives back every claim this call holds (no node was freed since they were taken).
void give_back(Scratch& sc) {
  if (sc.claimed.empty()) return;
  for (Node* n : sc.claimed) n->claim.store(0, std::memory_order_release);
  sc.claimed.clear();
  notify_waiters();
}

enum class Enter { Skip, Visit, Busy };

// Decides about node `n` met by the collection of this call (`tok`, `epoch`): nothing to do
// (computed, or visited already), visit it (claimed now or by an outer call on this thread),
// or busy (another thread owns it).
Enter enter(Node* n, uint32_t tok, uint32_t epoch, Scratch& sc) {
  if (n->ready()) return Enter::Skip;
  uint32_t c = n->claim.load(std::memory_order_acquire);
  if (c == tok) {
    if (n->mark == epoch || n->materialized()) return Enter::Skip;
    n->mark = epoch;
    return Enter::Visit;
  }
  if (c != 0 || !n->claim.compare_exchange_strong(c, tok, std::memory_order_acquire)) return Enter::Busy;
  if (n->materialized()) {  // computed by a run that failed, or outside materialize()
    n->claim.store(0, std::memory_order_release);
    notify_waiters();
    return Enter::Skip;
  }
  sc.claimed.push_back(n);
  n->mark = epoch;
  return Enter::Visit;
}

// Collects the pending ancestors of the roots into sc.order (topological order, positions in
// Node::pos), claiming them. On meeting a node another thread owns: with `wait`, waits for it;
// without, gives back every claim and returns that node.
NodePtr collect(Scratch& sc, const NodePtr* roots, size_t nroots, uint32_t tok, bool wait) {
  uint32_t epoch = next_epoch();
  auto& order = sc.order;
  auto& stack = sc.stack;
  order.clear();
  stack.clear();
  for (size_t r = 0; r < nroots; ++r) {
    if (!roots[r]) continue;
    Enter e;
    while ((e = enter(roots[r].get(), tok, epoch, sc)) == Enter::Busy) {
      if (!wait) {
        give_back(sc);
        return roots[r];
      }
      wait_released(roots[r]);
    }
    if (e == Enter::Skip) continue;
    stack.push_back({roots[r].get(), 0});
    // Iterative post-order DFS over the pending nodes.
    while (!stack.empty()) {
      auto& [n, i] = stack.back();
      if (i < n->inputs.size()) {
        const NodePtr& in = n->inputs[i];  // stays valid: n is this thread's
        e = enter(in.get(), tok, epoch, sc);
        if (e == Enter::Busy) {
          if (!wait) {
            NodePtr busy = in;
            give_back(sc);
            return busy;
          }
          wait_released(in);
          continue;
        }
        ++i;
        if (e == Enter::Visit) stack.push_back({in.get(), 0});
      } else {
        n->pos = static_cast<int32_t>(order.size());
        order.push_back(n);
        stack.pop_back();
      }
    }
  }
  return nullptr;
}

void materialize_roots(const NodePtr* roots, size_t nroots) {
  if (t_scratch.size() <= t_depth) t_scratch.push_back(std::make_unique<Scratch>());
  Scratch& sc = *t_scratch[t_depth];
  struct Depth {
    Depth() { ++t_depth; }
    ~Depth() { --t_depth; }
  } depth;
  uint32_t tok = thread_token();
  bool nested = t_depth > 1;
  sc.claimed.clear();
  if (NodePtr busy = collect(sc, roots, nroots, tok, nested)) {
    std::lock_guard<std::mutex> retry(g_retry_mu);
    wait_released(busy);
    collect(sc, roots, nroots, tok, true);
  }
  std::vector<Node*>& order = sc.order;
  if (order.empty()) return;
  std::vector<NodePtr> observed;  // declared before `claims`: alive while claims are given back
  struct Claims {  // gives back the claims when the segment is not run to the end
    Scratch& sc;
    ~Claims() { give_back(sc); }
  } claims{sc};
  if (auto* o = detail::trace_observer()) {
    // The observer may compute roots itself and cut nodes loose: keep them alive.
    for (Node* n : order) observed.push_back(n->shared_from_this());
    if (o->on_materialize(order, roots, nroots)) return;
  }
  // A node is needed after the run if something outside the segment holds it: a tensor
  // handle or a node not in this segment (use_count beyond the segment's own edges). Every
  // node of the order is a root or an input of another, so the use counts are read off those
  // references (a plain load, where weak_from_this() would cost two atomic updates a node).
  sc.internal.assign(order.size(), 0);
  sc.uses.assign(order.size(), 0);
  for (Node* n : order)
    for (auto& in : n->inputs)
      if (!in->materialized()) {
        sc.internal[in->pos]++;
        sc.uses[in->pos] = in.use_count();
      }
  Segment& seg = sc.seg;
  seg.nodes.assign(order.begin(), order.end());
  seg.needed.assign(order.size(), false);
  for (size_t r = 0; r < nroots; ++r)
    if (roots[r] && !roots[r]->materialized()) seg.needed[roots[r]->pos] = true;
  // (The shared constants of scalar operands are also held by their thread's cache: only ops
  // read them, so they are not needed for it.)
  for (size_t i = 0; i < order.size(); ++i)
    if (!seg.needed[i] && !order[i]->shared_constant) seg.needed[i] = sc.uses[i] > sc.internal[i];
  // The roots' owners keep every node alive through edges; what an executor unlinks it adds
  // to keep_alive, released below after the segment's nodes are cut loose.
  seg.keep_alive.clear();
  struct Release {  // drops the segment's references even when the executor throws
    Scratch& sc;
    ~Release() {
      give_back(sc);  // (a throwing run) before keep_alive may free claimed nodes
      sc.seg.keep_alive.clear();
      sc.seg.nodes.clear();
    }
  } release{sc};
  g_materializations.fetch_add(1, std::memory_order_relaxed);
  run_segment(seg);
  detail::count_executed(order.size());
  // In topological order, so cutting a node loose frees only nodes already passed. A node is
  // ready before its claim goes; an outer call's claims (nested calls) stay.
  bool all_mine = sc.claimed.size() == order.size();
  if (!all_mine) {
    sc.mine.assign(order.size(), 0);
    for (Node* n : sc.claimed) sc.mine[n->pos] = 1;
  }
  for (size_t i = 0; i < order.size(); ++i) {
    Node* n = order[i];
    if (n->materialized()) {
      n->inputs.clear();
      n->set_ready();
    }
    if (all_mine || sc.mine[i]) n->claim.store(0, std::memory_order_release);
  }
  sc.claimed.clear();
  notify_waiters();
}
}  // namespace

// A DTensor's node is materialized by materializing its shard.
void materialize(const std::vector<NodePtr>& roots) {
  bool placed = false;
  for (const NodePtr& r : roots) placed = placed || (r && r->placed);
  if (!placed) return materialize_roots(roots.data(), roots.size());
  std::vector<NodePtr> shards = roots;
  for (NodePtr& r : shards)
    if (r && r->placed) r = r->placed->local;
  materialize_roots(shards.data(), shards.size());
}
void materialize(const NodePtr& root) {
  if (root->placed) [[unlikely]]
    return materialize_roots(&root->placed->local, 1);
  materialize_roots(&root, 1);
}

}  // namespace kiln
