#include "jit/compile/call_site.h"

#include <cxxabi.h>
#include <execinfo.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace kiln::jit {
namespace {

// "kiln::mean(kiln::Tensor const&, ...)" -> "mean"; "" for frames that are not public ops.
std::string public_name(const char* frame) {
  const char* open = std::strchr(frame, '(');
  const char* plus = open ? std::strchr(open, '+') : nullptr;
  if (!open || !plus || plus == open + 1) return "";
  std::string mangled(open + 1, plus);
  int status = 0;
  char* d = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
  if (status != 0 || !d) return "";
  std::string name(d);
  std::free(d);
  name = name.substr(0, name.find('('));
  if (name.rfind("kiln::", 0) != 0) return "";
  name = name.substr(6);
  static const char* internal[] = {"jit::",    "detail::",     "guards::",    "SymInt",    "SymFacts",
                                   "sym_",     "ShapeOracle",  "floordiv",    "mod",       "concrete",
                                   "numel",    "same_shape",   "make_shape",  "testing::", "(anonymous",
                                   "Compiled", "Tensor::node", "materialize", "eval"};
  for (const char* p : internal)
    if (name.rfind(p, 0) == 0) return "";
  if (name.rfind("Tensor::", 0) == 0) name = "Tensor." + name.substr(8);
  return name;
}

}  // namespace

std::string kiln_call_site() {
  void* frames[64];
  int n = backtrace(frames, 64);
  char** syms = backtrace_symbols(frames, n);
  if (!syms) return "";
  std::vector<std::string> names;  // innermost first
  for (int i = 0; i < n; ++i) {
    std::string s = public_name(syms[i]);
    if (!s.empty() && (names.empty() || names.back() != s)) names.push_back(s);
  }
  std::free(syms);
  // Outermost (what the caller called) first, then the innermost (what relied on the size).
  if (names.size() > 3) names.erase(names.begin() + 1, names.end() - 2);
  std::string out;
  for (size_t k = names.size(); k-- > 0;) out += (out.empty() ? "" : " > ") + names[k] + "()";
  return out;
}

}  // namespace kiln::jit
