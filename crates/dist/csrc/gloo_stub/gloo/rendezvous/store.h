// flowtune declaration stub of gloo's rendezvous/store.h: the abstract store that torch 2.11's
// ProcessGroupGloo::GlooStore overrides (set, get and both waits; no GLOO_STORE_HAS_STORE_V2).
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace gloo {
namespace rendezvous {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(
      const std::vector<std::string>& keys,
      const std::chrono::milliseconds& timeout) = 0;
};

} // namespace rendezvous
} // namespace gloo
