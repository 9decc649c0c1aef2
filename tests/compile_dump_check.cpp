// KILN_DUMP=DIR with kiln::compile: a compiled function whose output needs grad writes its joint
// graph and forward/backward partition (Graphviz), and every kernel compiled for it writes its
// loop IR and LLVM IR. Run by ctest with KILN_DUMP set to a fresh directory (argv[1]).
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>

#include "kiln.h"

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  if (argc != 2) {
    std::cerr << "usage: compile_dump_check DIR (with KILN_DUMP=DIR)\n";
    return 2;
  }
  fs::path dir = argv[1];
  using namespace kiln;
  Tensor w = randn({16, 8}).requires_grad_();
  auto f = compile([&](const Tensor& x) { return x.matmul(w).tanh().exp(); }, CompileOptions{"dumped"});
  Tensor y = f(randn({4, 16}));
  y.sum().backward();
  int dots = 0, loops = 0, lls = 0;
  bool highlighted = false;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (name.rfind("dumped_0_", 0) == 0 && e.path().extension() == ".dot") {
      ++dots;
      std::ifstream in(e.path());
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      highlighted |= text.find("fillcolor=orange") != std::string::npos;  // saved values
    }
    if (name.size() > 9 && name.substr(name.size() - 9) == ".loop.txt") ++loops;
    if (e.path().extension() == ".ll") ++lls;
  }
  std::cout << dots << " graphs, " << loops << " loop IR files, " << lls << " LLVM IR files\n";
  if (dots != 3 || !highlighted || loops == 0 || lls == 0) {
    std::cerr << "expected dumped_0_{joint,forward,backward}.dot with saved values highlighted, loop IR and LLVM IR\n";
    return 1;
  }
  return 0;
}
