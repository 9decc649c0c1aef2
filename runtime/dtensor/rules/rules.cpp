// Which family's rule each op kind follows (null: no rule; it runs on replicated inputs).
#include "runtime/dtensor/rules/rule.h"

namespace kiln::dist::rules {

bool OpView::cut_elsewhere(size_t i, int64_t k, size_t m) const {
  const auto& p = in_placements[i];
  for (size_t e = 0; e < p.size(); ++e)
    if (e != m && p[e].is_shard() && p[e].dim == k) return true;
  return false;
}

Rule rule_for(OpKind op) {
  if (op >= OpKind::Neg && op <= OpKind::Where) return pointwise;  // unary, cast, binary, where
  if (op >= OpKind::Sum && op <= OpKind::Cumsum) return reduction;
  if ((op >= OpKind::View && op <= OpKind::AsStrided) || op == OpKind::Contiguous || op == OpKind::ToDevice)
    return view;
  switch (op) {
    case OpKind::Cat:
    case OpKind::Gather:
    case OpKind::Scatter:
    case OpKind::ScatterAdd:
    case OpKind::IndexSelect:
    case OpKind::IndexAdd: return indexing;
    case OpKind::Matmul:
    case OpKind::Im2Col: return matmul;
    case OpKind::Attention:
    case OpKind::AttentionBackward: return attention;
    case OpKind::ViewScatter: return view_scatter;
    default: return nullptr;  // sources, collectives
  }
}

}  // namespace kiln::dist::rules
