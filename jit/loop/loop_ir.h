// Loop IR: what a fused group lowers to before any backend (LLVM now, CUDA C++ next).
// A kernel is a body run for each p in [begin, end) of a parallel index; sizes and strides
// are runtime parameters, so one compiled kernel serves every size of the same structure.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/ir/node.h"

namespace kiln::jit {

// An SSA expression in a kernel's arena (index into Kernel::exprs).
using ExprId = int32_t;

struct Expr {
  enum class Kind : uint8_t {
    IConst,  // int64 constant `i`
    FConst,  // floating constant `f` of `dtype`
    Param,  // int64 runtime parameter params[i]
    FParam,  // double runtime parameter fparams[i]
    Var,  // loop variable number i (0 = the parallel index p)
    IAdd,
    ISub,
    IMul,
    IDiv,
    IMod,
    IMin,  // int64 index arithmetic on a, b (div/mod: a >= 0, b > 0)
    Load,  // element of buffer i at int64 index a
    Unary,  // op(a) (kiln OpKind), result `dtype`
    Binary,  // op(a, b), result `dtype` (bool for comparisons)
    Where,  // a ? b : c
    Cast,  // a converted to `dtype`
    Acc,  // current value of accumulator i
    AccIndex,  // index held by arg-accumulator i
  };
  Kind kind;
  DType dtype = DType::Int64;
  OpKind op = OpKind::Leaf;
  ExprId a = -1, b = -1, c = -1;
  int64_t i = 0;
  double f = 0;
};

// A statement. Loop bodies nest.
struct Stmt {
  enum class Kind : uint8_t {
    Loop,  // for var in [lo, hi): body   (innermost loops are vectorization candidates)
    Store,  // buffer[index] = value
    AccInit,  // accumulator acc = identity of `op` (Sum/Prod/Amax/Amin/ArgMax/ArgMin)
    AccUpdate,  // acc = op(acc, value) (arg-accumulators also track `index`)
    AccStore,  // buffer[index] = acc value (or its arg index)
  };
  Kind kind;
  int var = 0;  // Loop
  ExprId lo = -1, hi = -1;
  std::vector<Stmt> body;
  int buffer = 0;  // Store / AccStore
  ExprId index = -1, value = -1;
  int acc = 0;  // Acc*
};

// A kernel buffer: element dtype and whether the kernel writes it.
struct BufferSpec {
  DType dtype;
  bool output;
};

// Accumulator: reduction op and accumulation dtype (double for floats, int64 for ints).
struct AccSpec {
  OpKind op;
  DType dtype;
  DType out_dtype;
};

struct Kernel {
  std::string name;
  std::vector<Expr> exprs;
  std::unordered_map<int64_t, ExprId> iconsts;  // iconst(v)'s expression, so equal indices are equal ids
  std::vector<BufferSpec> buffers;
  std::vector<AccSpec> accs;
  int num_params = 0;
  int num_fparams = 0;
  int num_vars = 1;  // var 0 is the parallel index
  ExprId parallel_extent = -1;  // total range of the parallel index (in params)
  std::vector<Stmt> body;  // executed for each parallel index
  // Few parallel indices, each a long reduction (the combine of split partials): a device
  // backend may give each index a whole block of threads.
  bool long_indices = false;
  // Neighbouring parallel indices read neighbouring elements (split column reductions): a
  // device backend runs one thread per index.
  bool columns = false;
  // > 0: every loop runs at most this many iterations (row reductions over short rows), so a
  // backend may keep values that several loops compute in fast memory.
  int64_t row_cache = 0;
  // A horizontal kernel (compose.h): body[j] is member j, run for the parallel indices in
  // [member_ends[j - 1], member_ends[j]) (from 0 for j = 0); a device backend may pick the
  // member by a search over these rather than test every member. Empty: not horizontal.
  std::vector<ExprId> member_ends;
  // Adds an expression, returning its id (identical expressions are shared).
  ExprId add(const Expr& e);
  // Shorthands.
  ExprId iconst(int64_t v);
  ExprId param(int k);
  ExprId var(int k);
  ExprId iop(Expr::Kind k, ExprId a, ExprId b);
  // Human-readable listing (KILN_DUMP, KILN_LOG=codegen).
  std::string str() const;
};

// Per expression of `k`: whether it is, or reads through its operands, an expression for which
// `leaf(id)` holds (one pass over the arena, shared subexpressions visited once).
std::vector<char> reaches(const Kernel& k, const std::function<bool(ExprId)>& leaf);

}  // namespace kiln::jit
