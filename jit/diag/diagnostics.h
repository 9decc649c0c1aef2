// KILN_LOG (categories: recompiles, guards, symbols, fusion, passes, codegen, jit) and KILN_DUMP=DIR.
#pragma once
#include <chrono>
#include <string>

namespace kiln::jit {

// Whether KILN_LOG lists `category` (or "all").
bool log_enabled(const char* category);
// Writes one line to stderr prefixed with "[kiln:category]".
void log_line(const char* category, const std::string& msg);
// Milliseconds since `t0` (the timings diagnostics report).
inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
// The KILN_DUMP directory, or empty when dumps are off.
const std::string& dump_dir();
// Writes `text` to DIR/name when dumps are on.
void dump_file(const std::string& name, const std::string& text);

}  // namespace kiln::jit
