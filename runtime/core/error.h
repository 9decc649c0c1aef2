// kiln::Error: the one exception type kiln throws for bad input and failed operations.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

#include "runtime/core/export.h"

namespace kiln {

// Thrown for every user-facing failure; the message says what was expected and what was given.
class KILN_API Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
  // Out of line (runtime/core/error.cpp): the vtable and typeinfo live in libkiln, once, so
  // `catch (const kiln::Error&)` matches across the shared-library boundary.
  ~Error() override;
};

namespace detail {
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace kiln

// Throws kiln::Error with the streamed arguments when `cond` is false.
#define KILN_CHECK(cond, ...)                                           \
  do {                                                                  \
    if (!(cond)) throw ::kiln::Error(::kiln::detail::cat(__VA_ARGS__)); \
  } while (0)
