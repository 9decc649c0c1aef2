#include "runtime/core/error.h"

namespace kiln {

// The key function: Error's vtable and typeinfo are emitted here, exported once.
Error::~Error() = default;

}  // namespace kiln
