// kiln: a C++20 tensor library whose eager API compiles itself. Include this one header.
#pragma once
#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/autograd.h"
#include "runtime/executor.h"
#include "runtime/ops.h"
#include "runtime/symint.h"
#include "runtime/tensor.h"
#include "runtime/nn.h"
#include "runtime/optim.h"
#include "jit/compile.h"
