#include "jit/cpu_llvm/inline_vmath.h"

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/IntrinsicsX86.h>

#include "kernels/cpu/vmath.h"
#include "kernels/cpu/vmath16_tables.h"

namespace kiln::jit {

using namespace llvm;
namespace tables = vmath::tables;

namespace {

constexpr const char* kExp = "kiln_vm16_expf";
constexpr const char* kErf = "kiln_vm16_erff";
// _MM_FROUND_CUR_DIRECTION: the rounding operand of AVX-512 intrinsics without embedded rounding.
constexpr int kCurDirection = 4;

// Builds one function body: the IR of the C++ intrinsics used in kernels/cpu/vmath_*.cpp.
struct Body {
  Module& mod;
  IRBuilder<> b;
  Type* f32 = b.getFloatTy();
  VectorType* v16f = FixedVectorType::get(f32, 16);
  VectorType* v16i = FixedVectorType::get(b.getInt32Ty(), 16);
  Body(Module& m, Function* f) : mod(m), b(BasicBlock::Create(m.getContext(), "entry", f)) {}

  Value* splat(float v) { return ConstantVector::getSplat(ElementCount::getFixed(16), ConstantFP::get(f32, v)); }
  Value* table(const float* t) {
    std::vector<Constant*> c;
    for (int i = 0; i < 16; ++i) c.push_back(ConstantFP::get(f32, t[i]));
    return ConstantVector::get(c);
  }
  Value* x86(Intrinsic::ID id, ArrayRef<Value*> args) {
    return b.CreateCall(Intrinsic::getDeclaration(&mod, id), args);
  }
  Value* fma(Value* a, Value* m, Value* c) { return b.CreateIntrinsic(Intrinsic::fma, {v16f}, {a, m, c}); }
  Value* nfma(Value* a, Value* m, Value* c) { return fma(b.CreateFNeg(a), m, c); }  // _mm512_fnmadd_ps
  Value* pick(Value* idx, const float* t) { return x86(Intrinsic::x86_avx512_permvar_sf_512, {table(t), idx}); }
  Value* all_lanes() { return b.getInt16(0xffff); }
};

// The always-inline definition of `name` (<16 x float> -> <16 x float>), null if already defined.
Function* define(Module& mod, const char* name) {
  if (Function* old = mod.getFunction(name); old && !old->isDeclaration()) return nullptr;
  auto* v16f = FixedVectorType::get(Type::getFloatTy(mod.getContext()), 16);
  FunctionCallee fc = mod.getOrInsertFunction(name, FunctionType::get(v16f, {v16f}, false));
  auto* f = cast<Function>(fc.getCallee());
  f->addFnAttr(Attribute::AlwaysInline);
  f->addFnAttr(Attribute::NoUnwind);
  return f;
}

// kernels/cpu/vmath_exp.cpp, exp16.
void define_exp(Module& mod) {
  Function* f = define(mod, kExp);
  if (!f) return;
  Body B(mod, f);
  auto& b = B.b;
  Value* x = f->getArg(0);
  Value* lowered = B.x86(Intrinsic::x86_avx512_min_ps_512, {B.splat(tables::kHigh), x, b.getInt32(kCurDirection)});
  Value* xc = B.x86(Intrinsic::x86_avx512_max_ps_512, {B.splat(tables::kLow), lowered, b.getInt32(kCurDirection)});
  Value* n = B.x86(Intrinsic::x86_avx512_mask_rndscale_ps_512,
                   {b.CreateFMul(xc, B.splat(tables::kLog2e)), b.getInt32(0x8 /* nearest, no exceptions */),
                    B.splat(0.0f), B.all_lanes(), b.getInt32(kCurDirection)});
  Value* r = B.nfma(n, B.splat(tables::kLn2Hi), xc);
  r = B.nfma(n, B.splat(tables::kLn2Lo), r);
  Value* q = B.splat(tables::kQ[4]);
  for (int k = 3; k >= 0; --k) q = B.fma(q, r, B.splat(tables::kQ[k]));
  Value* p = b.CreateFAdd(B.fma(b.CreateFMul(r, r), q, r), B.splat(1.0f));
  b.CreateRet(
      B.x86(Intrinsic::x86_avx512_mask_scalef_ps_512, {p, n, B.splat(0.0f), B.all_lanes(), b.getInt32(kCurDirection)}));
}

// kernels/cpu/vmath_erf.cpp, erf16.
void define_erf(Module& mod) {
  Function* f = define(mod, kErf);
  if (!f) return;
  Body B(mod, f);
  auto& b = B.b;
  using tables::kCoef;
  Value* x = f->getArg(0);
  Value* ax = b.CreateUnaryIntrinsic(Intrinsic::fabs, x);
  Value* idx = B.x86(
      Intrinsic::x86_avx512_mask_cvttps2dq_512,
      {b.CreateFMul(ax, B.splat(4.0f)), Constant::getNullValue(B.v16i), B.all_lanes(), b.getInt32(kCurDirection)});
  Value* s = b.CreateFSub(ax, B.pick(idx, tables::kCentre));
  Value* q = B.pick(idx, kCoef[tables::C6]);
  for (int k = tables::C5; k >= tables::C2; --k) q = B.fma(q, s, B.pick(idx, kCoef[k]));
  Value* lo = B.fma(b.CreateFMul(s, s), q, B.pick(idx, kCoef[tables::C0Lo]));
  lo = B.fma(s, B.pick(idx, kCoef[tables::C1Lo]), lo);
  Value* r = B.fma(s, B.pick(idx, kCoef[tables::C1Hi]), b.CreateFAdd(B.pick(idx, kCoef[tables::C0Hi]), lo));
  r = b.CreateSelect(b.CreateFCmpOGE(ax, B.splat(tables::kErfOne)), B.splat(1.0f), r);
  // x's sign bit on r (r >= 0 or NaN): the ternary-logic select of the C++ function.
  Value* sign = ConstantVector::getSplat(ElementCount::getFixed(16), b.getInt32(0x80000000u));
  Value *xi = b.CreateBitCast(x, B.v16i), *ri = b.CreateBitCast(r, B.v16i);
  Value* out = b.CreateOr(b.CreateAnd(ri, b.CreateNot(sign)), b.CreateAnd(xi, sign));
  b.CreateRet(b.CreateBitCast(out, B.v16f));
}

}  // namespace

void define_inline_vector_math(Module& mod) {
  if (vmath::uses_own16(vmath::Fn::Exp)) define_exp(mod);
  if (vmath::uses_own16(vmath::Fn::Erf)) define_erf(mod);
}

void drop_inline_vector_math(Module& mod) {
  // Kernels export nothing but their entry: the definitions, inlined wherever called, must not
  // clash with the process's symbols of the same name.
  for (const char* name : {kExp, kErf})
    if (Function* f = mod.getFunction(name); f && !f->isDeclaration()) {
      if (f->use_empty())
        f->eraseFromParent();
      else
        f->setLinkage(GlobalValue::InternalLinkage);
    }
}

}  // namespace kiln::jit
