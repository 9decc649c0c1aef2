// DistributedDataParallel: the reducer (buckets, readiness, launch order, unused parameters)
// over kiln's public autograd hooks and collectives.
#include "runtime/parallel/data_parallel.h"

#include <algorithm>
#include <map>

#include "runtime/autograd/autograd.h"

namespace kiln::nn {

struct DistributedDataParallel::Reducer {
  dist::ProcessGroup group;
  bool find_unused = false;
  const bool* sync = nullptr;
  std::vector<Tensor> params;
  std::vector<std::string> names;
  std::vector<std::vector<size_t>> buckets;  // parameter indices, launch order
  std::vector<size_t> bucket_of;
  std::vector<int64_t> hooks;
  // The backward in progress.
  bool active = false;
  std::vector<bool> ready;
  std::vector<size_t> pending;  // per bucket: gradients still to come
  size_t next = 0;  // the next bucket to launch
  std::vector<Tensor> flats;  // per bucket: the gradients, flat, then their average
  std::vector<dist::Work> works;

  void on_grad(size_t i) {
    if (!*sync) return;
    if (!active) begin();
    if (ready[i]) return;
    ready[i] = true;
    --pending[bucket_of[i]];
    while (next < buckets.size() && pending[next] == 0) launch(next++);
  }

  void begin() {
    active = true;
    ready.assign(params.size(), false);
    pending.clear();
    for (const auto& b : buckets) pending.push_back(b.size());
    next = 0;
    flats.assign(buckets.size(), Tensor());
    works.assign(buckets.size(), dist::Work());
    queue_backward_callback([this] { finish(); });
  }

  // The bucket's gradients (zeros for those this backward did not produce) as one flat tensor,
  // averaged over the group without waiting.
  void launch(size_t b) {
    std::vector<Tensor> parts;
    for (size_t i : buckets[b]) {
      Tensor g = params[i].grad();
      parts.push_back(g.defined() ? g.reshape({-1}) : zeros({params[i].numel()}, params[i].dtype(), params[i].device()));
    }
    flats[b] = parts.size() == 1 ? parts[0] : cat(parts, 0);
    works[b] = dist::all_reduce(flats[b], dist::ReduceOp::Avg, group, /*async_op=*/true);
  }

  // End of the backward: launch what is left, wait, and hand every parameter its average.
  void finish() {
    active = false;
    std::vector<size_t> unused;
    for (size_t i = 0; i < params.size(); ++i)
      if (!ready[i]) unused.push_back(i);
    while (next < buckets.size()) launch(next++);  // every rank launches every bucket, in order
    // Which parameters some rank used (an extra all-reduce each step, as in PyTorch).
    std::vector<bool> used_anywhere(params.size(), true);
    if (find_unused) {
      std::vector<int32_t> local(params.size());
      for (size_t i = 0; i < params.size(); ++i) local[i] = ready[i] ? 1 : 0;
      Tensor used = from_vector(local, std::nullopt, params.empty() ? cpu() : params[0].device());
      dist::all_reduce(used, dist::ReduceOp::Max, group);
      const std::vector<int32_t> any = used.to_vector<int32_t>();
      for (size_t i = 0; i < params.size(); ++i) used_anywhere[i] = any[i] != 0;
    }
    for (auto& w : works) w.wait();
    for (size_t b = 0; b < buckets.size(); ++b) {
      int64_t off = 0;
      for (size_t i : buckets[b]) {
        const int64_t n = params[i].numel();
        if (used_anywhere[i]) params[i].set_grad(works[b].result().narrow(0, off, n).view(params[i].sizes()));
        off += n;
      }
    }
    flats.clear();
    works.clear();
    if (!find_unused && !unused.empty()) {
      std::string list;
      for (size_t k = 0; k < unused.size() && k < 8; ++k) list += (k ? ", " : "") + names[unused[k]];
      if (unused.size() > 8) list += ", ...";
      throw Error(detail::cat("DistributedDataParallel: ", unused.size(), " parameter(s) got no gradient in this ",
                              "backward (", list, "); pass find_unused_parameters = true if the model skips them"));
    }
  }
};

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<Module> module, DistributedDataParallelOptions options)
    : module_(std::move(module)), options_(std::move(options)) {
  KILN_CHECK(module_, "DistributedDataParallel: no module");
  KILN_CHECK(options_.bucket_cap_mb > 0, "DistributedDataParallel: bucket_cap_mb must be positive, got ",
             options_.bucket_cap_mb);
  register_module("module", module_);
  KILN_CHECK(options_.process_group.is_member(), "DistributedDataParallel: this rank is not in the process group");
  verify_replicas();
  broadcast_state();
  reducer_ = std::make_shared<Reducer>();
  Reducer& r = *reducer_;
  r.group = options_.process_group;
  r.find_unused = options_.find_unused_parameters;
  r.sync = &sync_;
  for (auto& [name, p] : module_->named_parameters())
    if (p.requires_grad()) {
      r.params.push_back(p);
      r.names.push_back(name);
    }
  // Buckets in reverse parameter order (the order the backward produces gradients), one dtype
  // and device each, closed at bucket_cap_mb.
  const double cap = options_.bucket_cap_mb * 1024 * 1024;
  std::map<std::pair<int, std::string>, size_t> open;  // (dtype, device) -> bucket being filled
  std::vector<double> bytes;
  r.bucket_of.assign(r.params.size(), 0);
  for (size_t k = r.params.size(); k-- > 0;) {
    const Tensor& p = r.params[k];
    const auto key = std::make_pair(static_cast<int>(p.dtype()), p.device().str());
    auto it = open.find(key);
    if (it == open.end() || bytes[it->second] >= cap) {
      r.buckets.emplace_back();
      bytes.push_back(0);
      it = open.insert_or_assign(key, r.buckets.size() - 1).first;
    }
    r.buckets[it->second].push_back(k);
    bytes[it->second] += static_cast<double>(p.numel()) * static_cast<double>(itemsize(p.dtype()));
    r.bucket_of[k] = it->second;
  }
  for (size_t i = 0; i < r.params.size(); ++i)
    r.hooks.push_back(register_post_accumulate_grad_hook(r.params[i], [rp = reducer_.get(), i](const Tensor&) {
      rp->on_grad(i);
    }));
}

DistributedDataParallel::~DistributedDataParallel() {
  for (size_t i = 0; i < reducer_->params.size(); ++i)
    remove_post_accumulate_grad_hook(reducer_->params[i], reducer_->hooks[i]);
}

namespace {

// One parameter's metadata as words: dtype, rank (number of dims), then each size.
void describe(const Tensor& p, std::vector<int64_t>& out) {
  out.push_back(static_cast<int64_t>(p.dtype()));
  out.push_back(p.dim());
  for (int64_t d = 0; d < p.dim(); ++d) out.push_back(p.size(d));
}

// A rank's description of one parameter: the `n` words of its row from the parameter on (dtype,
// ndim, sizes). Bounded by the row whatever another rank sent: a row too short, an ndim past its
// end or an unknown dtype is said as such, never read past.
std::string shape_text(const int64_t* w, size_t n) {
  if (n < 2) return "(no parameter there)";
  const bool known = w[0] >= 0 && w[0] <= static_cast<int64_t>(DType::Float64);  // (the last DType)
  std::string s = known ? std::string(dtype_name(static_cast<DType>(w[0]))) : detail::cat("dtype #", w[0]);
  if (w[1] < 0 || static_cast<size_t>(w[1]) > n - 2) return s + detail::cat(" (", w[1], " dims, past its description)");
  s += " [";
  for (int64_t d = 0; d < w[1]; ++d) s += detail::cat(d ? ", " : "", w[2 + d]);
  return s + "]";
}

}  // namespace

// As PyTorch's _verify_param_shape_across_processes: every rank's parameters must agree in
// number, dtype and shape before rank 0's values are broadcast (a [16, 8] weight on one rank and
// [8, 16] on another hold the same bytes, and averaging them would train silently wrong).
// Two all-gathers: each rank's word count, then the words padded to the longest.
void DistributedDataParallel::verify_replicas() {
  NoGradGuard no_grad;
  std::vector<std::string> names;
  std::vector<int64_t> words;
  Device dev = cpu();
  auto named = module_->named_parameters();
  for (auto& [name, p] : named) {
    names.push_back(name);
    describe(p, words);
    dev = p.device();
  }
  const dist::ProcessGroup& pg = options_.process_group;
  const int n = pg.size();
  const Tensor lens = dist::functional::all_gather(
      from_vector(std::vector<int64_t>{static_cast<int64_t>(names.size()), static_cast<int64_t>(words.size())}).to(dev), 0, pg);
  const std::vector<int64_t> len = lens.cpu().to_vector<int64_t>();
  int64_t longest = 0;
  for (int r = 0; r < n; ++r) longest = std::max(longest, len[static_cast<size_t>(2 * r + 1)]);
  std::vector<int64_t> mine = words;
  mine.resize(static_cast<size_t>(longest), 0);
  std::vector<int64_t> all;
  if (longest > 0) all = dist::functional::all_gather(from_vector(mine).to(dev), 0, pg).cpu().to_vector<int64_t>();
  const int me = pg.rank();
  auto fail = [](const std::string& what) {
    throw Error(detail::cat("DistributedDataParallel: the replicas differ across ranks: ", what,
                            "; every rank must construct the same model (PyTorch's DDP checks the same)"));
  };
  for (int r = 0; r < n; ++r)
    if (len[static_cast<size_t>(2 * r)] != static_cast<int64_t>(names.size()))
      fail(detail::cat("rank ", pg.ranks()[static_cast<size_t>(me)], " has ", names.size(), " parameters, rank ",
                       pg.ranks()[static_cast<size_t>(r)], " has ", len[static_cast<size_t>(2 * r)]));
  // The first parameter whose words differ on some rank, with each rank's dtype and shape.
  size_t at = 0;
  // Rank r's words from `at` on: its row in `all`, as long as that rank's own description.
  auto row = [&](int r) { return all.data() + static_cast<size_t>(r) * static_cast<size_t>(longest) + at; };
  auto left = [&](int r) {
    const size_t own = static_cast<size_t>(std::clamp<int64_t>(len[static_cast<size_t>(2 * r + 1)], 0, longest));
    return own > at ? own - at : size_t{0};
  };
  for (size_t k = 0; k < names.size(); ++k) {
    const size_t width = 2 + static_cast<size_t>(words[at + 1]);
    bool same = true;
    for (int r = 0; r < n && same; ++r)
      same = left(r) >= width && std::equal(words.begin() + static_cast<std::ptrdiff_t>(at),
                                            words.begin() + static_cast<std::ptrdiff_t>(at + width), row(r));
    if (!same) {
      std::string each;
      for (int r = 0; r < n; ++r)
        each += detail::cat(r ? ", " : "", "rank ", pg.ranks()[static_cast<size_t>(r)], ": ", shape_text(row(r), left(r)));
      fail(detail::cat("parameter ", k, " (\"", names[k], "\" on rank ", pg.ranks()[static_cast<size_t>(me)], ") is ",
                       each));
    }
    at += width;
  }
}

void DistributedDataParallel::broadcast_state() {
  NoGradGuard no_grad;
  for (auto& [name, p] : module_->named_parameters())
    p.set_data(dist::functional::broadcast(p.detach(), 0, options_.process_group));
  for (auto& [name, b] : module_->named_buffers()) b.assign_(dist::functional::broadcast(b, 0, options_.process_group));
}

Tensor DistributedDataParallel::forward(const Tensor& x) {
  if (options_.broadcast_buffers && !module_->named_buffers().empty()) {
    NoGradGuard no_grad;
    for (auto& [name, b] : module_->named_buffers())
      b.assign_(dist::functional::broadcast(b, 0, options_.process_group));
  }
  return module_->forward(x);
}

std::vector<std::vector<size_t>> DistributedDataParallel::bucket_indices() const { return reducer_->buckets; }

}  // namespace kiln::nn
