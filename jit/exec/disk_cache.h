// The disk cache: compiled kernel images and backend blobs kept across processes under
// $KILN_CACHE_DIR (default ~/.cache/kiln; "off" disables it). One file per entry, holding its
// full key and a checksum, written atomically; a corrupted, truncated or mismatched entry is
// rejected and rewritten; an unusable directory is reported once and the process goes on.
#pragma once
#include <cstdint>
#include <string>

#include "jit/backend/backend.h"

namespace kiln::jit {

// The cache directory ("" when disabled or unusable).
std::string cache_dir();
// The value of entry `name` stored under `key`; false when missing or rejected.
bool disk_read(const std::string& name, const std::string& key, std::string& value);
// Stores `value` as entry `name` under `key` (failures are reported once, then ignored).
void disk_write(const std::string& name, const std::string& key, const std::string& value);
// Entries rejected so far (corrupted, truncated, keyed differently, not a file).
uint64_t disk_rejections();
// 64-bit FNV-1a of `s` as 16 hex digits (entry names).
std::string hash_hex(const std::string& s);

// A BlobStore on the disk cache; keys live in `scope` (e.g. a backend's cache id).
class DiskBlobStore final : public BlobStore {
 public:
  explicit DiskBlobStore(std::string scope) : scope_(std::move(scope)) {}
  bool read(const std::string& key, std::string& value) override;
  void write(const std::string& key, const std::string& value) override;

 private:
  std::string entry(const std::string& key) const;
  std::string scope_;
};

}  // namespace kiln::jit
