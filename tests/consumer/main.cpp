#include <kiln.h>

#include <iostream>

int main() {
  kiln::Tensor x = kiln::arange(4).to(kiln::kFloat32);
  float s = ((x * 2 + 1).relu()).sum().item<float>();  // 1 + 3 + 5 + 7
  std::cout << "consumer sum = " << s << "\n";
  return s == 16.0f ? 0 : 1;
}
