// DeviceMesh: the world's ranks as an n-d array, one process group per mesh dimension.
#include <algorithm>

#include "runtime/core/error.h"
#include "runtime/dist/group.h"

namespace kiln::dist {

DeviceMesh::DeviceMesh(std::string device_type, std::vector<int64_t> shape, std::vector<std::string> dim_names)
    : device_type_(std::move(device_type)), shape_(std::move(shape)), names_(std::move(dim_names)) {
  KILN_CHECK(device_type_ == "cpu" || device_type_ == "cuda", "DeviceMesh: device type must be \"cpu\" or \"cuda\", got \"",
             device_type_, "\"");
  KILN_CHECK(!shape_.empty(), "DeviceMesh: the mesh needs at least one dim");
  KILN_CHECK(names_.empty() || names_.size() == shape_.size(), "DeviceMesh: ", names_.size(), " dim names for ",
             shape_.size(), " dims");
  for (size_t i = 0; i < names_.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      KILN_CHECK(names_[i] != names_[j], "DeviceMesh: dim name \"", names_[i], "\" repeats");
  for (int64_t s : shape_) KILN_CHECK(s > 0, "DeviceMesh: dims must be positive, got ", s);
  ProcessGroup w = world();
  KILN_CHECK(size() == w.size(), "DeviceMesh: the mesh holds ", size(), " ranks, the world has ", w.size());
  mesh_.resize(static_cast<size_t>(size()));
  for (int r = 0; r < w.size(); ++r) mesh_[static_cast<size_t>(r)] = r;
  // Row-major coordinates of this rank.
  int64_t rest = w.rank();
  coord_.assign(shape_.size(), 0);
  for (size_t d = shape_.size(); d-- > 0;) {
    coord_[d] = rest % shape_[d];
    rest /= shape_[d];
  }
  // Per dim: every line of ranks along it is a group; every rank makes them all, in order.
  std::vector<int64_t> stride(shape_.size(), 1);
  for (size_t d = shape_.size() - 1; d-- > 0;) stride[d] = stride[d + 1] * shape_[d + 1];
  for (size_t d = 0; d < shape_.size(); ++d) {
    ProcessGroup mine;
    for (int64_t start = 0; start < size(); ++start) {
      if ((start / stride[d]) % shape_[d] != 0) continue;  // not the first rank of a line along d
      std::vector<int> line;
      for (int64_t k = 0; k < shape_[d]; ++k) line.push_back(static_cast<int>(start + k * stride[d]));
      ProcessGroup g = new_group(line, w);
      if (g.is_member()) mine = g;
    }
    groups_.push_back(mine);
  }
}

int64_t DeviceMesh::size() const {
  int64_t n = 1;
  for (int64_t s : shape_) n *= s;
  return n;
}

int64_t DeviceMesh::dim_index(const std::string& name) const {
  auto it = std::find(names_.begin(), names_.end(), name);
  KILN_CHECK(it != names_.end(), "DeviceMesh: no dim named \"", name, "\"");
  return it - names_.begin();
}

ProcessGroup DeviceMesh::get_group(int64_t dim) const {
  KILN_CHECK(dim >= 0 && dim < ndim(), "DeviceMesh: dim ", dim, " is out of range for a ", ndim(), "-d mesh");
  return groups_[static_cast<size_t>(dim)];
}
ProcessGroup DeviceMesh::get_group(const std::string& name) const { return get_group(dim_index(name)); }
int DeviceMesh::get_local_rank(int64_t dim) const { return get_group(dim).rank(); }
int DeviceMesh::get_local_rank(const std::string& name) const { return get_local_rank(dim_index(name)); }
Device DeviceMesh::device() const { return device_type_ == "cuda" ? Device(cuda(local_rank())) : cpu(); }

DeviceMesh init_device_mesh(const std::string& device_type, std::vector<int64_t> shape,
                            std::vector<std::string> dim_names) {
  return DeviceMesh(device_type, std::move(shape), std::move(dim_names));
}

}  // namespace kiln::dist
