#include "jit/compile/graph_replay.h"

#include <algorithm>
#include <climits>
#include <chrono>

#include "jit/diag/diagnostics.h"
#include "jit/diag/profile.h"
#include "runtime/core/error.h"

namespace kiln::jit {

struct GraphReplay::Graph {
  std::unique_ptr<DeviceGraph> graph;
  struct In {
    const void* data = nullptr;  // the address baked in (when not copied)
    std::vector<int64_t> strides;
    std::shared_ptr<Storage> buffer;  // the graph's copy of a moving input
    size_t bytes = 0;  // ... bytes copied into it before each replay
  };
  std::vector<In> ins;
  enum class Src { Owned, Input, WriteBack, Constant };
  struct Out {
    Src src = Src::Owned;
    size_t index = 0;  // into `owned` (Owned, Constant) or the inputs (Input, WriteBack)
  };
  std::vector<Out> outs;
  std::vector<std::shared_ptr<Storage>> owned;  // outputs' storage: graph memory, or constants
  std::vector<bool> handed;  // per owned: graph memory a replay rewrites, handed out as it is
  std::vector<bool> copied;  // per owned: graph memory handed out as a copy (kCopyOutBytes)
  int64_t used = 0;  // the run of this instance that used it last
  int64_t stamp = 0;  // ... and its place among the uses of all graphs of the function
};

namespace {

// Bytes from the first element to one past the last one `n`'s layout reaches (offset 0).
size_t span_bytes(const Node& n) {
  int64_t last = 0;
  for (size_t d = 0; d < n.shape.size(); ++d) {
    const int64_t size = n.shape[d].as_int();
    if (size == 0) return 0;
    last += (size - 1) * n.strides[d].as_int();
  }
  return static_cast<size_t>(last + 1) * itemsize(n.dtype);
}

// Dense row-major from the storage's start: a write-back copies it as one block.
bool dense(const Node& n) { return n.offset.as_int() == 0 && is_contiguous_layout(n.shape, n.strides); }

}  // namespace

Tensor leaf_over(const Node& layout, std::shared_ptr<Storage> storage) {
  NodePtr leaf = new_leaf(layout.dtype, layout.device, layout.shape, layout.strides, layout.offset);
  leaf->set_storage(std::move(storage));
  return Tensor::from_node(std::move(leaf));
}

GraphReplay::GraphReplay(GraphPolicy policy, Device device, std::vector<Node*> inputs, std::vector<Node*> outputs)
    : policy_(std::move(policy)),
      device_(device),
      inputs_(std::move(inputs)),
      outputs_(std::move(outputs)),
      last_address_(inputs_.size(), nullptr),
      writes_(outputs_.size(), false),
      write_to_(outputs_.size(), 0),
      written_(inputs_.size(), false),
      moving_(inputs_.size(), false) {
  for (const auto& [o, j] : policy_.write_back) writes_[o] = true, write_to_[o] = j, written_[j] = true;
}

GraphReplay::~GraphReplay() {
  for (const auto& g : graphs_) {
    policy_.counters->pool_bytes -= static_cast<int64_t>(g->graph->pool_bytes());
    policy_.counters->kept--;
  }
}

std::unique_ptr<DeviceGraph> GraphReplay::drop(const Graph* g) {
  policy_.counters->pool_bytes -= static_cast<int64_t>(g->graph->pool_bytes());
  policy_.counters->kept--;
  auto it = std::find_if(graphs_.begin(), graphs_.end(), [&](const auto& p) { return p.get() == g; });
  std::unique_ptr<DeviceGraph> dg = std::move((*it)->graph);
  graphs_.erase(it);
  return dg;
}

int64_t GraphReplay::oldest_free() const {
  int64_t oldest = INT64_MAX;
  for (const auto& g : graphs_)
    if (outputs_free(*g)) oldest = std::min(oldest, g->stamp);
  return oldest;
}

std::unique_ptr<DeviceGraph> GraphReplay::take_oldest_free() {
  const int64_t oldest = oldest_free();
  for (const auto& g : graphs_)
    if (g->stamp == oldest && outputs_free(*g)) return drop(g.get());
  return nullptr;
}

std::optional<Device> GraphReplay::device_of(const std::vector<Node*>& nodes, const std::vector<Node*>& inputs) {
  if (nodes.empty()) return std::nullopt;
  const Device d = nodes[0]->device;
  if (d.type != DeviceType::CUDA) return std::nullopt;
  for (const Node* n : nodes)
    if (n->device != d) return std::nullopt;
  for (const Node* n : inputs)
    if (n->device != d) return std::nullopt;
  return d;
}

bool GraphReplay::write_back_safe(const std::vector<Node*>& ins) const {
  // The input's storage must be its node's alone, and the node held only by its tensor (a
  // pending consumer or a second tensor over it would see the write).
  for (const auto& [o, j] : policy_.write_back) {
    const Node* n = ins[j];
    if (!n->storage || n->storage.use_count() != 1 || n->weak_from_this().use_count() > 1) return false;
  }
  return true;
}

bool GraphReplay::outputs_free(const Graph& g) {
  for (size_t k = 0; k < g.owned.size(); ++k)
    if (g.handed[k] && g.owned[k].use_count() != 1) return false;  // (held by someone besides the graph)
  return true;
}

void GraphReplay::note_ungraphed() {
  if (calls_ > 1) policy_.counters->ungraphed++;  // (the first run compiles: never graphed)
}

bool GraphReplay::replay(const std::vector<Node*>& ins, std::vector<Tensor>& out) {
  ++calls_;
  for (size_t i = 0; i < ins.size(); ++i) {
    const void* a = ins[i]->storage ? ins[i]->storage->data : nullptr;
    if (calls_ > 1 && a != last_address_[i]) moving_[i] = true;
    last_address_[i] = a;
  }
  for (auto& gp : graphs_) {
    Graph& g = *gp;
    bool fits = true;
    for (size_t i = 0; fits && i < ins.size(); ++i) {
      const Graph::In& in = g.ins[i];
      fits = (in.buffer || (ins[i]->storage ? ins[i]->storage->data : nullptr) == in.data) &&
             ins[i]->strides.size() == in.strides.size();
      for (size_t d = 0; fits && d < in.strides.size(); ++d) fits = ins[i]->strides[d].as_int() == in.strides[d];
    }
    if (!fits || !outputs_free(g)) continue;
    if (!write_back_safe(ins)) return false;
    launch(g, ins);
    policy_.counters->replays++;
    make_outputs(g, ins, out);
    return true;
  }
  return false;
}

void GraphReplay::launch(Graph& g, const std::vector<Node*>& ins) {
  DeviceStepTimer timer(profile_enabled(), device_);
  for (size_t i = 0; i < ins.size(); ++i)
    if (g.ins[i].buffer && g.ins[i].bytes)
      device_runtime(device_).copy(g.ins[i].buffer->data, device_, ins[i]->storage->data, device_, g.ins[i].bytes);
  timer.step([&] { return "copies into a CUDA graph of " + policy_.name; });
  g.graph->launch();
  timer.step([&] { return "CUDA graph replay of " + policy_.name + " (" + std::to_string(g.graph->size()) + " ops)"; });
  g.used = calls_;
  g.stamp = ++policy_.counters->clock;
}

bool GraphReplay::wants_record(const std::vector<Node*>& ins) {
  // The first run compiles the kernels (and may load them): record from the second on.
  if (broken_ || calls_ < 2 || !write_back_safe(ins)) return false;
  if (graphs_.size() < kPerInstance) return true;
  // Full: replace the least recently used graph whose outputs nobody holds, or one whose
  // outputs have been held for kStale runs (its memory stays with them; the new graph gets its own).
  Graph* lru = nullptr;
  for (auto& g : graphs_) {
    const bool free = calls_ - g->used > kStale || outputs_free(*g);
    if (free && (!lru || g->used < lru->used)) lru = g.get();
  }
  if (!lru) return false;
  spare_ = drop(lru);
  return true;
}

bool GraphReplay::record(const std::vector<Node*>& ins, const std::function<void()>& run,
                         const std::function<void(size_t, const std::shared_ptr<Storage>&)>& bind_input,
                         std::vector<Tensor>& out, std::unique_ptr<DeviceGraph> reuse) {
  if (!reuse) reuse = std::move(spare_);
  spare_.reset();
  auto g = std::make_unique<Graph>();
  g->ins.resize(ins.size());
  std::vector<bool> writes = writes_;  // (a write-back the layouts do not allow is dropped for this graph)
  DeviceRuntime& rt = device_runtime(device_);
  std::string why;
  const auto t0 = std::chrono::steady_clock::now();
  double work_ms = 0;
  std::unique_ptr<DeviceGraph> dg = rt.capture(
      device_.index,
      [&] {
        const auto w0 = std::chrono::steady_clock::now();
        for (size_t i = 0; i < ins.size(); ++i) {
          Graph::In& in = g->ins[i];
          in.strides = concrete(ins[i]->strides);
          in.data = ins[i]->storage ? ins[i]->storage->data : nullptr;
          if (!moving_[i] || written_[i]) continue;
          // An input at a new address each call: read from a buffer of the graph, filled per replay.
          in.bytes = span_bytes(*ins[i]);
          in.buffer = Storage::allocate(std::max<size_t>(in.bytes, 1), device_, "CUDA graph input");
          bind_input(i, in.buffer);
        }
        // State the program rewrites is computed over its own storage where the kernel computing
        // it allows (launch.cpp); the rest goes back into it after the run.
        for (size_t o = 0; o < outputs_.size(); ++o)
          if (writes[o]) outputs_[o]->write_over = inputs_[write_to_[o]];
        struct Clear {
          GraphReplay& r;
          ~Clear() {
            for (Node* o : r.outputs_) o->write_over = nullptr;
          }
        } clear{*this};
        run();
        for (size_t o = 0; o < outputs_.size(); ++o) {
          if (!writes[o]) continue;
          const Node& src = *outputs_[o];
          const Node& dst = *inputs_[write_to_[o]];
          if (src.storage && src.storage == dst.storage) continue;  // written in place
          bool can = src.storage && dst.storage && src.dtype == dst.dtype && dense(src) && dense(dst) &&
                     src.shape.size() == dst.shape.size() && src.storage != dst.storage;
          for (size_t d = 0; can && d < src.shape.size(); ++d) can = src.shape[d].as_int() == dst.shape[d].as_int();
          if (!can) {
            writes[o] = false;
            continue;
          }
          const size_t bytes = static_cast<size_t>(numel(src.shape).as_int()) * itemsize(src.dtype);
          if (bytes) rt.copy(dst.storage->data, device_, src.storage->data, device_, bytes);
        }
        work_ms = ms_since(w0);
      },
      why, std::move(reuse));
  const double total_ms = ms_since(t0);
  if (!dg) {
    broken_ = true;
    if (log_enabled("graphs")) log_line("graphs", "compile(" + policy_.name + "): runs without a CUDA graph: " + why);
    return false;
  }
  // Where each output's memory comes from on a replay.
  for (size_t o = 0; o < outputs_.size(); ++o) {
    Graph::Out r;
    const std::shared_ptr<Storage>& s = outputs_[o]->storage;
    size_t j = 0;
    while (j < inputs_.size() && inputs_[j]->storage != s) ++j;
    if (writes[o]) {
      r.src = Graph::Src::WriteBack;
      r.index = write_to_[o];
    } else if (j < inputs_.size()) {
      r.src = Graph::Src::Input;
      r.index = j;
    } else {
      r.src = s && dg->owns(s->data) ? Graph::Src::Owned : Graph::Src::Constant;
      auto it = std::find(g->owned.begin(), g->owned.end(), s);
      r.index = static_cast<size_t>(it - g->owned.begin());
      if (it == g->owned.end()) {
        const bool small = r.src == Graph::Src::Owned && s->nbytes <= kCopyOutBytes;
        g->owned.push_back(s);
        g->handed.push_back(r.src == Graph::Src::Owned && !small);
        g->copied.push_back(small);
      }
    }
    g->outs.push_back(r);
  }
  // An input whose storage a write-back target shares would change under the caller: checked
  // by write_back_safe; an output aliasing a written input would read the new value.
  for (size_t o = 0; o < outputs_.size(); ++o)
    if (g->outs[o].src == Graph::Src::Input && written_[g->outs[o].index]) {
      broken_ = true;
      if (log_enabled("graphs"))
        log_line("graphs",
                 "compile(" + policy_.name + "): runs without a CUDA graph: an output aliases state it updates");
      return false;
    }
  g->graph = std::move(dg);
  launch(*g, ins);
  policy_.counters->recorded++;
  if (g->graph->updated()) policy_.counters->updated++;
  policy_.counters->kept++;
  policy_.counters->pool_bytes += static_cast<int64_t>(g->graph->pool_bytes());
  if (log_enabled("graphs")) {
    size_t copied = 0;
    for (const auto& in : g->ins) copied += in.buffer != nullptr;
    log_line("graphs", "compile(" + policy_.name + "): recorded a CUDA graph of " + std::to_string(g->graph->size()) +
                           " operations (" + std::to_string(g->graph->pool_bytes() >> 10) + " KiB of graph memory, " +
                           std::to_string(copied) + " of " + std::to_string(ins.size()) +
                           " inputs copied in per replay, " + std::to_string(policy_.write_back.size()) +
                           " tensors updated in place; graph " + std::to_string(graphs_.size() + 1) +
                           " of this size) in " + std::to_string(total_ms) + " ms (running the work " +
                           std::to_string(work_ms) + " ms, the rest capture and " +
                           (g->graph->updated() ? "updating a dropped graph in place)" : "instantiation)"));
  }
  make_outputs(*g, ins, out);
  graphs_.push_back(std::move(g));
  return true;
}

void GraphReplay::make_outputs(const Graph& g, const std::vector<Node*>& ins, std::vector<Tensor>& out) const {
  out.clear();
  out.reserve(outputs_.size());
  std::vector<std::shared_ptr<Storage>> copies(g.owned.size());  // (outputs sharing memory share the copy)
  auto owned = [&](size_t k) -> const std::shared_ptr<Storage>& {
    if (!g.copied[k]) return g.owned[k];
    if (!copies[k]) {
      const Storage& s = *g.owned[k];
      copies[k] = Storage::allocate(std::max<size_t>(s.nbytes, 1), device_, "CUDA graph output copy");
      if (s.nbytes) device_runtime(device_).copy(copies[k]->data, device_, s.data, device_, s.nbytes);
    }
    return copies[k];
  };
  for (size_t o = 0; o < outputs_.size(); ++o) {
    const Graph::Out& r = g.outs[o];
    switch (r.src) {
      case Graph::Src::Owned:
      case Graph::Src::Constant: out.push_back(leaf_over(*outputs_[o], owned(r.index))); break;
      case Graph::Src::Input: out.push_back(leaf_over(*outputs_[o], ins[r.index]->storage)); break;
      case Graph::Src::WriteBack: out.push_back(leaf_over(*ins[r.index], ins[r.index]->storage)); break;
    }
  }
}

}  // namespace kiln::jit
