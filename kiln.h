// kiln: a C++20 tensor library whose eager API compiles itself. Include this one header.
#pragma once
#include "runtime/core/dtype.h"
#include "runtime/core/error.h"
#include "runtime/autograd/autograd.h"
#include "runtime/exec/executor.h"
#include "runtime/ops/ops.h"
#include "runtime/ops/autocast.h"
#include "runtime/ir/symint.h"
#include "runtime/tensor/tensor.h"
#include "runtime/nn/nn.h"
#include "runtime/optim/optim.h"
#include "jit/compile/compile.h"
#include "jit/compile/patterns.h"
