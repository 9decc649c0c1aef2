// The exact structure of a segment, the key of its plan.
#include "jit/exec/segment_signature.h"

#include "jit/patterns/pattern_matcher.h"
#include "runtime/ops/attention_policy.h"

namespace kiln::jit {

void signature(const Segment& seg, RunScratch& sc) {
  std::vector<int64_t>& s = sc.sig;
  std::vector<Node*>& externals = sc.externals;
  s.clear();
  externals.clear();
  sc.extern_ids.clear();
  sc.extern_held.clear();
  const size_t N = seg.nodes.size();
  s.push_back(static_cast<int64_t>(patterns_generation()));  // (registered rewrites change plans)
  s.push_back(detail::sdpa_backend_key());  // (the attention rewrite follows kiln::sdpa_kernel)
  if (N && seg.nodes[0]->device.type != DeviceType::CPU)  // a device's plans are its own
    s.push_back(-1000 - static_cast<int64_t>(seg.nodes[0]->device.type) * 64 - seg.nodes[0]->device.index);
  for (size_t i = 0; i < N; ++i) seg.nodes[i]->pos = static_cast<int32_t>(i);
  for (size_t i = 0; i < N; ++i) {
    const Node* n = seg.nodes[i];
    s.push_back(static_cast<int64_t>(n->op) << 8 | static_cast<int64_t>(n->dtype) << 1 | (seg.needed[i] ? 1 : 0));
    s.push_back(static_cast<int64_t>(n->shape.size()));
    for (const auto& d : n->shape) s.push_back(d.as_int());
    s.push_back(static_cast<int64_t>(n->attrs.ints.size()));
    for (int64_t v : n->attrs.ints) s.push_back(v);
    if (n->op == OpKind::View || n->op == OpKind::AsStrided)
      for (const auto& d : n->strides) s.push_back(d.as_int());
    s.push_back(static_cast<int64_t>(n->inputs.size()));
    for (const auto& inp : n->inputs) {
      Node* in = inp.get();
      int32_t p = in->pos;
      if (!in->materialized() && p >= 0 && static_cast<size_t>(p) < N && seg.nodes[p] == in) {
        s.push_back(p);
        continue;
      }
      int id = 0;
      if (externals.size() < 32) {
        for (size_t k = 0; k < externals.size() && !id; ++k)
          if (externals[k] == in) id = static_cast<int>(k) + 1;
      } else {
        if (sc.extern_ids.empty())
          for (size_t k = 0; k < externals.size(); ++k) sc.extern_ids.emplace(externals[k], static_cast<int>(k) + 1);
        auto it = sc.extern_ids.find(in);
        if (it != sc.extern_ids.end()) id = it->second;
      }
      if (id) {
        s.push_back(-id);
        sc.extern_held[static_cast<size_t>(id - 1)]--;
        continue;
      }
      externals.push_back(in);
      sc.extern_held.push_back(inp.use_count() - 1);  // (a plain load off the edge: the nodes are claimed)
      if (!sc.extern_ids.empty()) sc.extern_ids.emplace(in, static_cast<int>(externals.size()));
      s.push_back(-static_cast<int64_t>(externals.size()));
      s.push_back(static_cast<int64_t>(in->dtype) << 8 | static_cast<int64_t>(in->shape.size()) << 1 |
                  (is_contiguous_layout(in->shape, in->strides) ? 1 : 0));
      for (size_t d = 0; d < in->shape.size(); ++d) {
        int64_t sz = in->shape[d].as_int(), st = in->strides[d].as_int();
        s.push_back(sz);
        // The stride itself (a size-1 dim's does not matter): kernels take small ones as
        // constants (jit/loop/lower.cpp), so a class (0, 1, general) is not enough.
        s.push_back(sz == 1 ? 0 : st);
      }
    }
  }
}

uint64_t hash_sig(const std::vector<int64_t>& s) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t v : s) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
  return h;
}

}  // namespace kiln::jit
