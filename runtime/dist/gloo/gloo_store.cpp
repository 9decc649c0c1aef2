// The rendezvous stores: Gloo's FileStore (a directory every rank sees) and RedisStore (a
// Redis server), behind kiln's Store; and the adapter that hands a kiln Store back to Gloo.
#include "runtime/dist/gloo/gloo_parts.h"

#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/redis_store.h>

#include <thread>

#include "runtime/core/error.h"

namespace kiln::dist::gloo_impl {
namespace {

// FileStore with its key check public (a probe that never waits).
class ProbingFileStore : public gloo::rendezvous::FileStore {
 public:
  using FileStore::FileStore;
  bool has(const std::vector<std::string>& keys) { return check(keys); }
};

template <class S>
class GlooStore final : public Store {
 public:
  GlooStore(std::unique_ptr<S> s, std::string where) : s_(std::move(s)), where_(std::move(where)) {}
  void set(const std::string& key, const std::string& value) override {
    s_->set(key, std::vector<char>(value.begin(), value.end()));
  }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    KILN_CHECK(wait({key}, timeout), "dist: store ", where_, " has no key \"", key, "\" after ", timeout.count(), " ms");
    std::vector<char> v = s_->get(key);
    return std::string(v.begin(), v.end());
  }
  bool wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    // Polls the keys itself: Gloo's own waits treat a zero timeout as none and throw on expiry.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
      if (s_->has(keys)) return true;
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
    }
  }
  std::string where() const override { return where_; }

 private:
  std::unique_ptr<S> s_;
  std::string where_;
};

class ProbingRedisStore : public gloo::rendezvous::RedisStore {
 public:
  using RedisStore::RedisStore;
  bool has(const std::vector<std::string>& keys) { return check(keys); }
};

}  // namespace

std::shared_ptr<Store> make_store(const std::string& url) {
  try {
    if (url.rfind("file://", 0) == 0) {
      const std::string path = url.substr(7);
      KILN_CHECK(!path.empty(), "dist: file:// store needs a directory path, got \"", url, "\"");
      return std::make_shared<GlooStore<ProbingFileStore>>(std::make_unique<ProbingFileStore>(path), url);
    }
    if (url.rfind("redis://", 0) == 0) {
      const std::string hp = url.substr(8);
      const auto colon = hp.rfind(':');
      const std::string host = colon == std::string::npos ? hp : hp.substr(0, colon);
      const int port = colon == std::string::npos ? 6379 : std::stoi(hp.substr(colon + 1));
      return std::make_shared<GlooStore<ProbingRedisStore>>(std::make_unique<ProbingRedisStore>(host, port), url);
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(detail::cat("dist: cannot open the rendezvous store ", url, ": ", e.what()));
  }
  throw Error(detail::cat("dist: unknown store \"", url, "\" (expected file:///dir or redis://host:port)"));
}

// Gloo's view of a kiln Store (under a prefix), for connectFullMesh.
StoreAdapter::StoreAdapter(std::shared_ptr<dist::Store> s, std::string prefix, std::chrono::milliseconds timeout)
    : s_(std::move(s)), prefix_(std::move(prefix)), timeout_(timeout) {}
void StoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  s_->set(prefix_ + key, std::string(data.begin(), data.end()));
}
std::vector<char> StoreAdapter::get(const std::string& key) {
  std::string v = s_->get(prefix_ + key, timeout_);
  return {v.begin(), v.end()};
}
void StoreAdapter::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }
void StoreAdapter::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  std::vector<std::string> full;
  for (const auto& k : keys) full.push_back(prefix_ + k);
  KILN_CHECK(s_->wait(full, timeout), "dist: store ", s_->where(), ": keys did not appear within ", timeout.count(),
             " ms");
}

}  // namespace kiln::dist::gloo_impl
