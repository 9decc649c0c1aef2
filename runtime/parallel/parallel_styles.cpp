// The tensor-parallel styles and parallelize_module (tensor_parallel.h): each style lays a
// layer's parameters out and adds forward hooks bringing its input and output to the style's
// placements.
#include "runtime/parallel/placements.h"
#include "runtime/parallel/tensor_parallel.h"

namespace kiln::dist {
namespace {

std::vector<std::string> parts(const std::string& name) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t dot = name.find('.', start);
    out.push_back(name.substr(start, dot - start));
    if (dot == std::string::npos) return out;
    start = dot + 1;
  }
}

bool matches(const std::vector<std::string>& pattern, const std::vector<std::string>& name) {
  if (pattern.size() != name.size()) return false;
  for (size_t i = 0; i < pattern.size(); ++i)
    if (pattern[i] != "*" && pattern[i] != name[i]) return false;
  return true;
}

void collect(const std::string& name, nn::Module& m, std::vector<std::pair<std::string, nn::Module*>>& out) {
  out.push_back({name, &m});
  for (const auto& [child, sub] : m.children()) collect(name.empty() ? child : name + "." + child, *sub, out);
}

// `x` brought to `p` along mesh dim `m` (other dims as they are; a plain tensor is the whole
// value, replicated).
Tensor laid_out(const Tensor& x, const DeviceMesh& mesh, size_t m, const Placement& p) {
  DTensor d = is_dtensor(x) ? DTensor(x)
                            : distribute_tensor(x, mesh, std::vector<Placement>(static_cast<size_t>(mesh.ndim()),
                                                                                Replicate()));
  return d.redistribute(mesh, parallel_detail::with_dim(d, mesh, m, p));
}

// `param` cut as `p` along mesh dim `m`, keeping its other mesh dims.
void place(Tensor& param, const DeviceMesh& mesh, size_t m, const Placement& p) {
  distribute_parameter(param, mesh, parallel_detail::with_dim(param, mesh, m, p));
}

const char* style_name(ParallelStyle::Kind k) {
  switch (k) {
    case ParallelStyle::Kind::Colwise: return "ColwiseParallel";
    case ParallelStyle::Kind::Rowwise: return "RowwiseParallel";
    case ParallelStyle::Kind::Sequence: return "SequenceParallel";
  }
  return "?";
}

void apply(const std::string& name, nn::Module& m, const DeviceMesh& mesh, size_t md, const ParallelStyle& s) {
  auto* lin = dynamic_cast<nn::Linear*>(&m);
  auto* emb = dynamic_cast<nn::Embedding*>(&m);
  const bool col = s.kind == ParallelStyle::Kind::Colwise;
  switch (s.kind) {
    case ParallelStyle::Kind::Colwise:
    case ParallelStyle::Kind::Rowwise:
      KILN_CHECK(lin || emb, "parallelize_module: ", style_name(s.kind), " applies to Linear and Embedding; '", name,
                 "' is neither");
      if (lin) {
        place(lin->weight, mesh, md, col ? Shard(0) : Shard(1));
        if (lin->bias.defined()) place(lin->bias, mesh, md, col ? Shard(0) : Replicate());
      } else {
        place(emb->weight, mesh, md, col ? Shard(1) : Shard(0));
      }
      break;
    case ParallelStyle::Kind::Sequence:
      for (auto& [pname, p] : m.named_parameters(false)) place(p, mesh, md, Replicate());
      break;
  }
  // An embedding's input is indices: replicated whatever the style says of activations.
  const Placement in = emb ? Replicate() : s.input_layout;
  m.register_forward_pre_hook([mesh, md, in](nn::Module&, const Tensor& x) { return laid_out(x, mesh, md, in); });
  m.register_forward_hook([mesh, md, s](nn::Module&, const Tensor&, const Tensor& y) {
    Tensor out = laid_out(y, mesh, md, s.output_layout);
    return s.use_local_output ? DTensor(out).to_local() : out;
  });
}

}  // namespace

ParallelStyle ColwiseParallel(Placement input_layout, Placement output_layout, bool use_local_output) {
  return {ParallelStyle::Kind::Colwise, input_layout, output_layout, use_local_output};
}
ParallelStyle RowwiseParallel(Placement input_layout, Placement output_layout, bool use_local_output) {
  return {ParallelStyle::Kind::Rowwise, input_layout, output_layout, use_local_output};
}
ParallelStyle SequenceParallel(int64_t sequence_dim, bool use_local_output) {
  return {ParallelStyle::Kind::Sequence, Shard(sequence_dim), Shard(sequence_dim), use_local_output};
}

void parallelize_module(nn::Module& module, const DeviceMesh& mesh,
                        const std::vector<std::pair<std::string, ParallelStyle>>& plan, int64_t mesh_dim) {
  const size_t md = parallel_detail::mesh_dim_index(mesh_dim, mesh, "parallelize_module");
  std::vector<std::pair<std::string, nn::Module*>> all;
  collect("", module, all);
  for (const auto& [pattern, style] : plan) {
    const std::vector<std::string> want = parts(pattern);
    int found = 0;
    for (auto& [name, m] : all)
      if (matches(want, parts(name))) {
        apply(name, *m, mesh, md, style);
        ++found;
      }
    KILN_CHECK(found > 0, "parallelize_module: no submodule is named '", pattern, "'");
  }
}

}  // namespace kiln::dist
