// Gloo behind kiln's process-group interface: stores and the CPU backend.
#pragma once
#include <gloo/rendezvous/store.h>

#include "runtime/dist/backend.h"

namespace kiln::dist::gloo_impl {

std::shared_ptr<Store> make_store(const std::string& url);
std::unique_ptr<Backend> make_backend(const GroupSpec& spec);

// A kiln Store seen by Gloo (keys under `prefix`).
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(std::shared_ptr<dist::Store> s, std::string prefix, std::chrono::milliseconds timeout);
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  std::shared_ptr<dist::Store> s_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

}  // namespace kiln::dist::gloo_impl
