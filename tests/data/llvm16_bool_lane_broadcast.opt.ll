; Optimized LLVM IR of kernel kiln_76be04cf169ee4c9 (KILN_TEST_SEED=15 KILN_JIT_FAMILY=348: isnan of a
; 3-wide row stored as bool bytes beside a layer_norm), as KILN_DUMP wrote it in a process where
; LLVM 16's x86 backend crashed on it: the SLP vectorizer packed two isnan compares into
; <2 x i1> %24, the bool bytes read its lanes (extractelement, zext to i8) and the loop vectorizer
; broadcast them. llc-16 -O3 -mcpu=znver4 stops with "Cannot select: v32i8 = X86ISD::VBROADCAST
; (v8i1 X86ISD::KSHIFTR ...)"; -mcpu=skylake-avx512 segfaults; -mattr=-avx512f compiles.
; Used by tests/test_jit.cpp (JitCodegen.MaskLaneReadsCompileForAvx512).
;
; ModuleID = 'kiln_76be04cf169ee4c9'
source_filename = "kiln_76be04cf169ee4c9"
target datalayout = "e-m:e-p270:32:32-p271:32:32-p272:64:64-i64:64-f80:128-n8:16:32:64-S128"
target triple = "x86_64-pc-linux-gnu"

; Function Attrs: mustprogress nocallback nofree nosync nounwind speculatable willreturn memory(none)
declare float @llvm.sqrt.f32(float) #0

; Function Attrs: nofree nosync nounwind
define void @kiln_76be04cf169ee4c9(i64 %0, i64 %1, ptr nocapture readonly %2, ptr nocapture readonly %3, ptr nocapture readonly %4) local_unnamed_addr #1 {
entry:
  %5 = load ptr, ptr %2, align 8
  %6 = getelementptr inbounds ptr, ptr %2, i64 1
  %7 = load ptr, ptr %6, align 8
  %8 = getelementptr inbounds ptr, ptr %2, i64 2
  %9 = load ptr, ptr %8, align 8
  %10 = getelementptr inbounds ptr, ptr %2, i64 3
  %11 = load ptr, ptr %10, align 8
  %.val = load double, ptr %4, align 8
  tail call void @llvm.experimental.noalias.scope.decl(metadata !0)
  tail call void @llvm.experimental.noalias.scope.decl(metadata !3)
  tail call void @llvm.experimental.noalias.scope.decl(metadata !5)
  tail call void @llvm.experimental.noalias.scope.decl(metadata !7)
  %12 = getelementptr inbounds i64, ptr %3, i64 1
  %13 = load i64, ptr %12, align 4, !noalias !9
  %14 = icmp slt i64 %0, %1
  br i1 %14, label %loop.preheader.i, label %kiln_76be04cf169ee4c9_body.exit

loop.preheader.i:                                 ; preds = %entry
  %15 = getelementptr inbounds i64, ptr %3, i64 3
  %16 = load i64, ptr %15, align 4, !noalias !9
  %17 = getelementptr inbounds i64, ptr %3, i64 2
  %18 = load i64, ptr %17, align 4, !noalias !9
  %19 = icmp sgt i64 %13, 0
  %20 = sitofp i64 %18 to float
  %21 = fptrunc double %.val to float
  %22 = sitofp i64 %16 to float
  br i1 %19, label %loop.us.preheader.i, label %kiln_76be04cf169ee4c9_body.exit

loop.us.preheader.i:                              ; preds = %loop.preheader.i
  %.phi.trans.insert15.phi.trans.insert.i = getelementptr inbounds float, ptr %5, i64 2
  %.pre16.pre.i = load float, ptr %.phi.trans.insert15.phi.trans.insert.i, align 4, !alias.scope !0, !noalias !10
  %23 = load <2 x float>, ptr %5, align 4, !alias.scope !0, !noalias !10
  %24 = fcmp uno <2 x float> %23, zeroinitializer
  %25 = uitofp <2 x i1> %24 to <2 x float>
  %26 = fadd <2 x float> %23, %25
  %27 = extractelement <2 x float> %26, i64 0
  %28 = fpext float %27 to double
  %29 = extractelement <2 x float> %26, i64 1
  %30 = fpext float %29 to double
  %31 = fcmp uno float %.pre16.pre.i, 0.000000e+00
  %32 = uitofp i1 %31 to float
  %33 = fadd float %.pre16.pre.i, %32
  %34 = fpext float %33 to double
  %35 = extractelement <2 x i1> %24, i64 0
  %36 = zext i1 %35 to i8
  %37 = extractelement <2 x i1> %24, i64 1
  %38 = zext i1 %37 to i8
  %39 = zext i1 %31 to i8
  %min.iters.check91 = icmp ult i64 %13, 32
  %n.vec94 = and i64 %13, -32
  %broadcast.splatinsert103 = insertelement <8 x double> poison, double %28, i64 0
  %broadcast.splat104 = shufflevector <8 x double> %broadcast.splatinsert103, <8 x double> poison, <8 x i32> zeroinitializer
  %broadcast.splatinsert105 = insertelement <8 x double> poison, double %28, i64 0
  %broadcast.splat106 = shufflevector <8 x double> %broadcast.splatinsert105, <8 x double> poison, <8 x i32> zeroinitializer
  %broadcast.splatinsert107 = insertelement <8 x double> poison, double %28, i64 0
  %broadcast.splat108 = shufflevector <8 x double> %broadcast.splatinsert107, <8 x double> poison, <8 x i32> zeroinitializer
  %broadcast.splatinsert109 = insertelement <8 x double> poison, double %28, i64 0
  %broadcast.splat110 = shufflevector <8 x double> %broadcast.splatinsert109, <8 x double> poison, <8 x i32> zeroinitializer
  %broadcast.splatinsert111 = insertelement <8 x double> poison, double %30, i64 0
  %broadcast.splat112 = shufflevector <8 x double> %broadcast.splatinsert111, <8 x double> poison, <8 x i32> zeroinitializer
  %broadcast.splatinsert113 = insertelement <8 x double> poison, double %30, i64 0
  %broadcast.splat114 = shufflevector <8 x double> %broadcast.splatinsert113, <8 x double> poison, <8 x i32> zeroinitializer
  %broadcast.splatinsert115 = insertelement <8 x double> poison, double %30, i64 0
  %broadcast.splat116 = shufflevector <8 x double> %broadcast.splatinsert115, <8 x double> poison, <8 x i32> zeroinitializer
  %broadcast.splatinsert117 = insertelement <8 x double> poison, double %30, i64 0
  %broadcast.splat118 = shufflevector <8 x double> %broadcast.splatinsert117, <8 x double> poison, <8 x i32> zeroinitializer
  %broadcast.splatinsert119 = insertelement <8 x double> poison, double %34, i64 0
  %broadcast.splat120 = shufflevector <8 x double> %broadcast.splatinsert119, <8 x double> poison, <8 x i32> zeroinitializer
  %broadcast.splatinsert121 = insertelement <8 x double> poison, double %34, i64 0
  %broadcast.splat122 = shufflevector <8 x double> %broadcast.splatinsert121, <8 x double> poison, <8 x i32> zeroinitializer
  %broadcast.splatinsert123 = insertelement <8 x double> poison, double %34, i64 0
  %broadcast.splat124 = shufflevector <8 x double> %broadcast.splatinsert123, <8 x double> poison, <8 x i32> zeroinitializer
  %broadcast.splatinsert125 = insertelement <8 x double> poison, double %34, i64 0
  %broadcast.splat126 = shufflevector <8 x double> %broadcast.splatinsert125, <8 x double> poison, <8 x i32> zeroinitializer
  %cmp.n96 = icmp eq i64 %13, %n.vec94
  %min.iters.check51 = icmp ult i64 %13, 32
  %n.vec54 = and i64 %13, -32
  %cmp.n56 = icmp eq i64 %13, %n.vec54
  %min.iters.check = icmp ult i64 %13, 8
  %min.iters.check5 = icmp ult i64 %13, 16
  %n.vec = and i64 %13, -16
  %broadcast.splatinsert = insertelement <16 x i8> poison, i8 %36, i64 0
  %broadcast.splat = shufflevector <16 x i8> %broadcast.splatinsert, <16 x i8> poison, <16 x i32> zeroinitializer
  %broadcast.splatinsert6 = insertelement <16 x i8> poison, i8 %38, i64 0
  %broadcast.splat7 = shufflevector <16 x i8> %broadcast.splatinsert6, <16 x i8> poison, <16 x i32> zeroinitializer
  %broadcast.splatinsert8 = insertelement <16 x i8> poison, i8 %39, i64 0
  %broadcast.splat11 = shufflevector <2 x float> %26, <2 x float> poison, <16 x i32> zeroinitializer
  %broadcast.splat13 = shufflevector <2 x float> %26, <2 x float> poison, <16 x i32> <i32 1, i32 1, i32 1, i32 1, i32 1, i32 1, i32 1, i32 1, i32 1, i32 1, i32 1, i32 1, i32 1, i32 1, i32 1, i32 1>
  %broadcast.splatinsert14 = insertelement <16 x float> poison, float %33, i64 0
  %40 = shufflevector <16 x i8> %broadcast.splat, <16 x i8> %broadcast.splat7, <32 x i32> <i32 0, i32 1, i32 2, i32 3, i32 4, i32 5, i32 6, i32 7, i32 8, i32 9, i32 10, i32 11, i32 12, i32 13, i32 14, i32 15, i32 16, i32 17, i32 18, i32 19, i32 20, i32 21, i32 22, i32 23, i32 24, i32 25, i32 26, i32 27, i32 28, i32 29, i32 30, i32 31>
  %41 = shufflevector <16 x i8> %broadcast.splatinsert8, <16 x i8> poison, <32 x i32> <i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef>
  %interleaved.vec = shufflevector <32 x i8> %40, <32 x i8> %41, <48 x i32> <i32 0, i32 16, i32 32, i32 1, i32 17, i32 33, i32 2, i32 18, i32 34, i32 3, i32 19, i32 35, i32 4, i32 20, i32 36, i32 5, i32 21, i32 37, i32 6, i32 22, i32 38, i32 7, i32 23, i32 39, i32 8, i32 24, i32 40, i32 9, i32 25, i32 41, i32 10, i32 26, i32 42, i32 11, i32 27, i32 43, i32 12, i32 28, i32 44, i32 13, i32 29, i32 45, i32 14, i32 30, i32 46, i32 15, i32 31, i32 47>
  %42 = shufflevector <16 x float> %broadcast.splat11, <16 x float> %broadcast.splat13, <32 x i32> <i32 0, i32 1, i32 2, i32 3, i32 4, i32 5, i32 6, i32 7, i32 8, i32 9, i32 10, i32 11, i32 12, i32 13, i32 14, i32 15, i32 16, i32 17, i32 18, i32 19, i32 20, i32 21, i32 22, i32 23, i32 24, i32 25, i32 26, i32 27, i32 28, i32 29, i32 30, i32 31>
  %43 = shufflevector <16 x float> %broadcast.splatinsert14, <16 x float> poison, <32 x i32> <i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef>
  %interleaved.vec16 = shufflevector <32 x float> %42, <32 x float> %43, <48 x i32> <i32 0, i32 16, i32 32, i32 1, i32 17, i32 33, i32 2, i32 18, i32 34, i32 3, i32 19, i32 35, i32 4, i32 20, i32 36, i32 5, i32 21, i32 37, i32 6, i32 22, i32 38, i32 7, i32 23, i32 39, i32 8, i32 24, i32 40, i32 9, i32 25, i32 41, i32 10, i32 26, i32 42, i32 11, i32 27, i32 43, i32 12, i32 28, i32 44, i32 13, i32 29, i32 45, i32 14, i32 30, i32 46, i32 15, i32 31, i32 47>
  %cmp.n = icmp eq i64 %13, %n.vec
  %n.vec.remaining = and i64 %13, 8
  %min.epilog.iters.check.not.not = icmp eq i64 %n.vec.remaining, 0
  %n.vec25 = and i64 %13, -8
  %broadcast.splatinsert28 = insertelement <8 x i8> poison, i8 %36, i64 0
  %broadcast.splat29 = shufflevector <8 x i8> %broadcast.splatinsert28, <8 x i8> poison, <8 x i32> zeroinitializer
  %broadcast.splatinsert30 = insertelement <8 x i8> poison, i8 %38, i64 0
  %broadcast.splat31 = shufflevector <8 x i8> %broadcast.splatinsert30, <8 x i8> poison, <8 x i32> zeroinitializer
  %broadcast.splatinsert32 = insertelement <8 x i8> poison, i8 %39, i64 0
  %broadcast.splat36 = shufflevector <2 x float> %26, <2 x float> poison, <8 x i32> zeroinitializer
  %broadcast.splat38 = shufflevector <2 x float> %26, <2 x float> poison, <8 x i32> <i32 1, i32 1, i32 1, i32 1, i32 1, i32 1, i32 1, i32 1>
  %broadcast.splatinsert39 = insertelement <8 x float> poison, float %33, i64 0
  %44 = shufflevector <8 x i8> %broadcast.splat29, <8 x i8> %broadcast.splat31, <16 x i32> <i32 0, i32 1, i32 2, i32 3, i32 4, i32 5, i32 6, i32 7, i32 8, i32 9, i32 10, i32 11, i32 12, i32 13, i32 14, i32 15>
  %45 = shufflevector <8 x i8> %broadcast.splatinsert32, <8 x i8> poison, <16 x i32> <i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef>
  %interleaved.vec34 = shufflevector <16 x i8> %44, <16 x i8> %45, <24 x i32> <i32 0, i32 8, i32 16, i32 1, i32 9, i32 17, i32 2, i32 10, i32 18, i32 3, i32 11, i32 19, i32 4, i32 12, i32 20, i32 5, i32 13, i32 21, i32 6, i32 14, i32 22, i32 7, i32 15, i32 23>
  %46 = shufflevector <8 x float> %broadcast.splat36, <8 x float> %broadcast.splat38, <16 x i32> <i32 0, i32 1, i32 2, i32 3, i32 4, i32 5, i32 6, i32 7, i32 8, i32 9, i32 10, i32 11, i32 12, i32 13, i32 14, i32 15>
  %47 = shufflevector <8 x float> %broadcast.splatinsert39, <8 x float> poison, <16 x i32> <i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef>
  %interleaved.vec41 = shufflevector <16 x float> %46, <16 x float> %47, <24 x i32> <i32 0, i32 8, i32 16, i32 1, i32 9, i32 17, i32 2, i32 10, i32 18, i32 3, i32 11, i32 19, i32 4, i32 12, i32 20, i32 5, i32 13, i32 21, i32 6, i32 14, i32 22, i32 7, i32 15, i32 23>
  %cmp.n26 = icmp eq i64 %13, %n.vec25
  br label %loop.us.i

loop.us.i:                                        ; preds = %exit15.loopexit.us.i, %loop.us.preheader.i
  %48 = phi i64 [ %142, %exit15.loopexit.us.i ], [ %0, %loop.us.preheader.i ]
  br i1 %min.iters.check91, label %loop1.us.i.preheader, label %vector.body97

vector.body97:                                    ; preds = %loop.us.i, %vector.body97
  %index98 = phi i64 [ %index.next127, %vector.body97 ], [ 0, %loop.us.i ]
  %vec.phi99 = phi <8 x double> [ %57, %vector.body97 ], [ <double 0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00>, %loop.us.i ]
  %vec.phi100 = phi <8 x double> [ %58, %vector.body97 ], [ <double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00>, %loop.us.i ]
  %vec.phi101 = phi <8 x double> [ %59, %vector.body97 ], [ <double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00>, %loop.us.i ]
  %vec.phi102 = phi <8 x double> [ %60, %vector.body97 ], [ <double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00>, %loop.us.i ]
  %49 = fadd reassoc <8 x double> %vec.phi99, %broadcast.splat104
  %50 = fadd reassoc <8 x double> %vec.phi100, %broadcast.splat106
  %51 = fadd reassoc <8 x double> %vec.phi101, %broadcast.splat108
  %52 = fadd reassoc <8 x double> %vec.phi102, %broadcast.splat110
  %53 = fadd reassoc <8 x double> %49, %broadcast.splat112
  %54 = fadd reassoc <8 x double> %50, %broadcast.splat114
  %55 = fadd reassoc <8 x double> %51, %broadcast.splat116
  %56 = fadd reassoc <8 x double> %52, %broadcast.splat118
  %57 = fadd reassoc <8 x double> %53, %broadcast.splat120
  %58 = fadd reassoc <8 x double> %54, %broadcast.splat122
  %59 = fadd reassoc <8 x double> %55, %broadcast.splat124
  %60 = fadd reassoc <8 x double> %56, %broadcast.splat126
  %index.next127 = add nuw i64 %index98, 32
  %61 = icmp eq i64 %index.next127, %n.vec94
  br i1 %61, label %middle.block89, label %vector.body97, !llvm.loop !11

middle.block89:                                   ; preds = %vector.body97
  %bin.rdx128 = fadd reassoc <8 x double> %58, %57
  %bin.rdx129 = fadd reassoc <8 x double> %59, %bin.rdx128
  %bin.rdx130 = fadd reassoc <8 x double> %60, %bin.rdx129
  %62 = tail call reassoc double @llvm.vector.reduce.fadd.v8f64(double -0.000000e+00, <8 x double> %bin.rdx130)
  br i1 %cmp.n96, label %exit3.us.i, label %loop1.us.i.preheader

loop1.us.i.preheader:                             ; preds = %loop.us.i, %middle.block89
  %.0.us.i.ph = phi double [ 0.000000e+00, %loop.us.i ], [ %62, %middle.block89 ]
  %.ph133 = phi i64 [ 0, %loop.us.i ], [ %n.vec94, %middle.block89 ]
  br label %loop1.us.i

loop1.us.i:                                       ; preds = %loop1.us.i.preheader, %loop1.us.i
  %.0.us.i = phi double [ %66, %loop1.us.i ], [ %.0.us.i.ph, %loop1.us.i.preheader ]
  %63 = phi i64 [ %67, %loop1.us.i ], [ %.ph133, %loop1.us.i.preheader ]
  %64 = fadd reassoc double %.0.us.i, %28
  %65 = fadd reassoc double %64, %30
  %66 = fadd reassoc double %65, %34
  %67 = add nuw nsw i64 %63, 1
  %exitcond.not.i = icmp eq i64 %67, %13
  br i1 %exitcond.not.i, label %exit3.us.i, label %loop1.us.i, !llvm.loop !14

exit3.us.i:                                       ; preds = %loop1.us.i, %middle.block89
  %.lcssa = phi double [ %62, %middle.block89 ], [ %66, %loop1.us.i ]
  %68 = fptrunc double %.lcssa to float
  %69 = fdiv float %68, %20
  %70 = insertelement <2 x float> poison, float %69, i64 0
  %71 = shufflevector <2 x float> %70, <2 x float> poison, <2 x i32> zeroinitializer
  %72 = fsub <2 x float> %26, %71
  %73 = fmul <2 x float> %72, %72
  %74 = extractelement <2 x float> %73, i64 0
  %75 = fpext float %74 to double
  %76 = fmul <2 x float> %72, %72
  %77 = extractelement <2 x float> %76, i64 1
  %78 = fpext float %77 to double
  %79 = fsub float %33, %69
  %80 = fmul float %79, %79
  %81 = fpext float %80 to double
  br i1 %min.iters.check51, label %loop7.us.i.preheader, label %vector.ph52

vector.ph52:                                      ; preds = %exit3.us.i
  %broadcast.splatinsert62 = insertelement <8 x double> poison, double %75, i64 0
  %broadcast.splat63 = shufflevector <8 x double> %broadcast.splatinsert62, <8 x double> poison, <8 x i32> zeroinitializer
  %broadcast.splatinsert64 = insertelement <8 x double> poison, double %75, i64 0
  %broadcast.splat65 = shufflevector <8 x double> %broadcast.splatinsert64, <8 x double> poison, <8 x i32> zeroinitializer
  %broadcast.splatinsert66 = insertelement <8 x double> poison, double %75, i64 0
  %broadcast.splat67 = shufflevector <8 x double> %broadcast.splatinsert66, <8 x double> poison, <8 x i32> zeroinitializer
  %broadcast.splatinsert68 = insertelement <8 x double> poison, double %75, i64 0
  %broadcast.splat69 = shufflevector <8 x double> %broadcast.splatinsert68, <8 x double> poison, <8 x i32> zeroinitializer
  %broadcast.splatinsert70 = insertelement <8 x double> poison, double %78, i64 0
  %broadcast.splat71 = shufflevector <8 x double> %broadcast.splatinsert70, <8 x double> poison, <8 x i32> zeroinitializer
  %broadcast.splatinsert72 = insertelement <8 x double> poison, double %78, i64 0
  %broadcast.splat73 = shufflevector <8 x double> %broadcast.splatinsert72, <8 x double> poison, <8 x i32> zeroinitializer
  %broadcast.splatinsert74 = insertelement <8 x double> poison, double %78, i64 0
  %broadcast.splat75 = shufflevector <8 x double> %broadcast.splatinsert74, <8 x double> poison, <8 x i32> zeroinitializer
  %broadcast.splatinsert76 = insertelement <8 x double> poison, double %78, i64 0
  %broadcast.splat77 = shufflevector <8 x double> %broadcast.splatinsert76, <8 x double> poison, <8 x i32> zeroinitializer
  %broadcast.splatinsert78 = insertelement <8 x double> poison, double %81, i64 0
  %broadcast.splat79 = shufflevector <8 x double> %broadcast.splatinsert78, <8 x double> poison, <8 x i32> zeroinitializer
  %broadcast.splatinsert80 = insertelement <8 x double> poison, double %81, i64 0
  %broadcast.splat81 = shufflevector <8 x double> %broadcast.splatinsert80, <8 x double> poison, <8 x i32> zeroinitializer
  %broadcast.splatinsert82 = insertelement <8 x double> poison, double %81, i64 0
  %broadcast.splat83 = shufflevector <8 x double> %broadcast.splatinsert82, <8 x double> poison, <8 x i32> zeroinitializer
  %broadcast.splatinsert84 = insertelement <8 x double> poison, double %81, i64 0
  %broadcast.splat85 = shufflevector <8 x double> %broadcast.splatinsert84, <8 x double> poison, <8 x i32> zeroinitializer
  br label %vector.body57

vector.body57:                                    ; preds = %vector.body57, %vector.ph52
  %index58 = phi i64 [ 0, %vector.ph52 ], [ %index.next86, %vector.body57 ]
  %vec.phi = phi <8 x double> [ <double 0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00>, %vector.ph52 ], [ %90, %vector.body57 ]
  %vec.phi59 = phi <8 x double> [ <double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00>, %vector.ph52 ], [ %91, %vector.body57 ]
  %vec.phi60 = phi <8 x double> [ <double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00>, %vector.ph52 ], [ %92, %vector.body57 ]
  %vec.phi61 = phi <8 x double> [ <double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00, double -0.000000e+00>, %vector.ph52 ], [ %93, %vector.body57 ]
  %82 = fadd reassoc <8 x double> %vec.phi, %broadcast.splat63
  %83 = fadd reassoc <8 x double> %vec.phi59, %broadcast.splat65
  %84 = fadd reassoc <8 x double> %vec.phi60, %broadcast.splat67
  %85 = fadd reassoc <8 x double> %vec.phi61, %broadcast.splat69
  %86 = fadd reassoc <8 x double> %82, %broadcast.splat71
  %87 = fadd reassoc <8 x double> %83, %broadcast.splat73
  %88 = fadd reassoc <8 x double> %84, %broadcast.splat75
  %89 = fadd reassoc <8 x double> %85, %broadcast.splat77
  %90 = fadd reassoc <8 x double> %86, %broadcast.splat79
  %91 = fadd reassoc <8 x double> %87, %broadcast.splat81
  %92 = fadd reassoc <8 x double> %88, %broadcast.splat83
  %93 = fadd reassoc <8 x double> %89, %broadcast.splat85
  %index.next86 = add nuw i64 %index58, 32
  %94 = icmp eq i64 %index.next86, %n.vec54
  br i1 %94, label %middle.block50, label %vector.body57, !llvm.loop !15

middle.block50:                                   ; preds = %vector.body57
  %bin.rdx = fadd reassoc <8 x double> %91, %90
  %bin.rdx87 = fadd reassoc <8 x double> %92, %bin.rdx
  %bin.rdx88 = fadd reassoc <8 x double> %93, %bin.rdx87
  %95 = tail call reassoc double @llvm.vector.reduce.fadd.v8f64(double -0.000000e+00, <8 x double> %bin.rdx88)
  br i1 %cmp.n56, label %iter.check, label %loop7.us.i.preheader

loop7.us.i.preheader:                             ; preds = %exit3.us.i, %middle.block50
  %.023.us.i.ph = phi double [ 0.000000e+00, %exit3.us.i ], [ %95, %middle.block50 ]
  %.ph132 = phi i64 [ 0, %exit3.us.i ], [ %n.vec54, %middle.block50 ]
  br label %loop7.us.i

loop7.us.i:                                       ; preds = %loop7.us.i.preheader, %loop7.us.i
  %.023.us.i = phi double [ %99, %loop7.us.i ], [ %.023.us.i.ph, %loop7.us.i.preheader ]
  %96 = phi i64 [ %100, %loop7.us.i ], [ %.ph132, %loop7.us.i.preheader ]
  %97 = fadd reassoc double %.023.us.i, %75
  %98 = fadd reassoc double %97, %78
  %99 = fadd reassoc double %98, %81
  %100 = add nuw nsw i64 %96, 1
  %exitcond10.not.i = icmp eq i64 %100, %13
  br i1 %exitcond10.not.i, label %iter.check, label %loop7.us.i, !llvm.loop !16

iter.check:                                       ; preds = %loop7.us.i, %middle.block50
  %.lcssa4 = phi double [ %95, %middle.block50 ], [ %99, %loop7.us.i ]
  %101 = mul nsw i64 %48, %13
  %102 = fptrunc double %.lcssa4 to float
  %103 = fdiv float %102, %22
  %104 = fadd float %103, %21
  %105 = tail call float @llvm.sqrt.f32(float %104)
  %106 = fdiv float 1.000000e+00, %105
  %107 = insertelement <2 x float> poison, float %106, i64 0
  %108 = shufflevector <2 x float> %107, <2 x float> poison, <2 x i32> zeroinitializer
  %109 = fmul <2 x float> %72, %108
  %110 = fmul float %79, %106
  br i1 %min.iters.check, label %loop13.us.i.preheader, label %vector.main.loop.iter.check

vector.main.loop.iter.check:                      ; preds = %iter.check
  br i1 %min.iters.check5, label %vec.epilog.ph, label %vector.ph

vector.ph:                                        ; preds = %vector.main.loop.iter.check
  %111 = fmul <2 x float> %72, %107
  %broadcast.splat18 = shufflevector <2 x float> %111, <2 x float> poison, <16 x i32> zeroinitializer
  %broadcast.splat20 = shufflevector <2 x float> %109, <2 x float> poison, <16 x i32> <i32 1, i32 1, i32 1, i32 1, i32 1, i32 1, i32 1, i32 1, i32 1, i32 1, i32 1, i32 1, i32 1, i32 1, i32 1, i32 1>
  %broadcast.splatinsert21 = insertelement <16 x float> poison, float %110, i64 0
  %112 = shufflevector <16 x float> %broadcast.splat18, <16 x float> %broadcast.splat20, <32 x i32> <i32 0, i32 1, i32 2, i32 3, i32 4, i32 5, i32 6, i32 7, i32 8, i32 9, i32 10, i32 11, i32 12, i32 13, i32 14, i32 15, i32 16, i32 17, i32 18, i32 19, i32 20, i32 21, i32 22, i32 23, i32 24, i32 25, i32 26, i32 27, i32 28, i32 29, i32 30, i32 31>
  %113 = shufflevector <16 x float> %broadcast.splatinsert21, <16 x float> poison, <32 x i32> <i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef>
  %interleaved.vec23 = shufflevector <32 x float> %112, <32 x float> %113, <48 x i32> <i32 0, i32 16, i32 32, i32 1, i32 17, i32 33, i32 2, i32 18, i32 34, i32 3, i32 19, i32 35, i32 4, i32 20, i32 36, i32 5, i32 21, i32 37, i32 6, i32 22, i32 38, i32 7, i32 23, i32 39, i32 8, i32 24, i32 40, i32 9, i32 25, i32 41, i32 10, i32 26, i32 42, i32 11, i32 27, i32 43, i32 12, i32 28, i32 44, i32 13, i32 29, i32 45, i32 14, i32 30, i32 46, i32 15, i32 31, i32 47>
  br label %vector.body

vector.body:                                      ; preds = %vector.body, %vector.ph
  %index = phi i64 [ 0, %vector.ph ], [ %index.next, %vector.body ]
  %114 = add nsw i64 %index, %101
  %115 = mul nsw i64 %114, 3
  %116 = getelementptr i8, ptr %7, i64 %115
  store <48 x i8> %interleaved.vec, ptr %116, align 1, !alias.scope !3, !noalias !17
  %117 = getelementptr float, ptr %9, i64 %115
  store <48 x float> %interleaved.vec16, ptr %117, align 4, !alias.scope !5, !noalias !18
  %118 = getelementptr float, ptr %11, i64 %115
  store <48 x float> %interleaved.vec23, ptr %118, align 4, !alias.scope !7, !noalias !19
  %index.next = add nuw i64 %index, 16
  %119 = icmp eq i64 %index.next, %n.vec
  br i1 %119, label %middle.block, label %vector.body, !llvm.loop !20

middle.block:                                     ; preds = %vector.body
  br i1 %cmp.n, label %exit15.loopexit.us.i, label %vec.epilog.iter.check

vec.epilog.iter.check:                            ; preds = %middle.block
  br i1 %min.epilog.iters.check.not.not, label %loop13.us.i.preheader, label %vec.epilog.ph

vec.epilog.ph:                                    ; preds = %vector.main.loop.iter.check, %vec.epilog.iter.check
  %vec.epilog.resume.val = phi i64 [ %n.vec, %vec.epilog.iter.check ], [ 0, %vector.main.loop.iter.check ]
  %120 = fmul <2 x float> %72, %107
  %broadcast.splat43 = shufflevector <2 x float> %120, <2 x float> poison, <8 x i32> zeroinitializer
  %broadcast.splat45 = shufflevector <2 x float> %109, <2 x float> poison, <8 x i32> <i32 1, i32 1, i32 1, i32 1, i32 1, i32 1, i32 1, i32 1>
  %broadcast.splatinsert46 = insertelement <8 x float> poison, float %110, i64 0
  %121 = shufflevector <8 x float> %broadcast.splat43, <8 x float> %broadcast.splat45, <16 x i32> <i32 0, i32 1, i32 2, i32 3, i32 4, i32 5, i32 6, i32 7, i32 8, i32 9, i32 10, i32 11, i32 12, i32 13, i32 14, i32 15>
  %122 = shufflevector <8 x float> %broadcast.splatinsert46, <8 x float> poison, <16 x i32> <i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef>
  %interleaved.vec48 = shufflevector <16 x float> %121, <16 x float> %122, <24 x i32> <i32 0, i32 8, i32 16, i32 1, i32 9, i32 17, i32 2, i32 10, i32 18, i32 3, i32 11, i32 19, i32 4, i32 12, i32 20, i32 5, i32 13, i32 21, i32 6, i32 14, i32 22, i32 7, i32 15, i32 23>
  br label %vec.epilog.vector.body

vec.epilog.vector.body:                           ; preds = %vec.epilog.vector.body, %vec.epilog.ph
  %index27 = phi i64 [ %vec.epilog.resume.val, %vec.epilog.ph ], [ %index.next49, %vec.epilog.vector.body ]
  %123 = add nsw i64 %index27, %101
  %124 = mul nsw i64 %123, 3
  %125 = getelementptr i8, ptr %7, i64 %124
  store <24 x i8> %interleaved.vec34, ptr %125, align 1, !alias.scope !3, !noalias !17
  %126 = getelementptr float, ptr %9, i64 %124
  store <24 x float> %interleaved.vec41, ptr %126, align 4, !alias.scope !5, !noalias !18
  %127 = getelementptr float, ptr %11, i64 %124
  store <24 x float> %interleaved.vec48, ptr %127, align 4, !alias.scope !7, !noalias !19
  %index.next49 = add nuw i64 %index27, 8
  %128 = icmp eq i64 %index.next49, %n.vec25
  br i1 %128, label %vec.epilog.middle.block, label %vec.epilog.vector.body, !llvm.loop !21

vec.epilog.middle.block:                          ; preds = %vec.epilog.vector.body
  br i1 %cmp.n26, label %exit15.loopexit.us.i, label %loop13.us.i.preheader

loop13.us.i.preheader:                            ; preds = %iter.check, %vec.epilog.iter.check, %vec.epilog.middle.block
  %.ph = phi i64 [ 0, %iter.check ], [ %n.vec, %vec.epilog.iter.check ], [ %n.vec25, %vec.epilog.middle.block ]
  br label %loop13.us.i

loop13.us.i:                                      ; preds = %loop13.us.i.preheader, %loop13.us.i
  %129 = phi i64 [ %141, %loop13.us.i ], [ %.ph, %loop13.us.i.preheader ]
  %130 = add nsw i64 %129, %101
  %131 = mul nsw i64 %130, 3
  %132 = getelementptr inbounds i8, ptr %7, i64 %131
  store i8 %36, ptr %132, align 1, !alias.scope !3, !noalias !17
  %133 = getelementptr inbounds float, ptr %9, i64 %131
  %134 = getelementptr inbounds float, ptr %11, i64 %131
  %135 = add nsw i64 %131, 1
  %136 = getelementptr inbounds i8, ptr %7, i64 %135
  store i8 %38, ptr %136, align 1, !alias.scope !3, !noalias !17
  store <2 x float> %26, ptr %133, align 4, !alias.scope !5, !noalias !18
  store <2 x float> %109, ptr %134, align 4, !alias.scope !7, !noalias !19
  %137 = add nsw i64 %131, 2
  %138 = getelementptr inbounds i8, ptr %7, i64 %137
  store i8 %39, ptr %138, align 1, !alias.scope !3, !noalias !17
  %139 = getelementptr inbounds float, ptr %9, i64 %137
  store float %33, ptr %139, align 4, !alias.scope !5, !noalias !18
  %140 = getelementptr inbounds float, ptr %11, i64 %137
  store float %110, ptr %140, align 4, !alias.scope !7, !noalias !19
  %141 = add nuw nsw i64 %129, 1
  %exitcond12.not.i = icmp eq i64 %141, %13
  br i1 %exitcond12.not.i, label %exit15.loopexit.us.i, label %loop13.us.i, !llvm.loop !22

exit15.loopexit.us.i:                             ; preds = %loop13.us.i, %vec.epilog.middle.block, %middle.block
  %142 = add nuw nsw i64 %48, 1
  %exitcond13.not.i = icmp eq i64 %142, %1
  br i1 %exitcond13.not.i, label %kiln_76be04cf169ee4c9_body.exit, label %loop.us.i

kiln_76be04cf169ee4c9_body.exit:                  ; preds = %exit15.loopexit.us.i, %entry, %loop.preheader.i
  ret void
}

; Function Attrs: nocallback nofree nosync nounwind willreturn memory(inaccessiblemem: readwrite)
declare void @llvm.experimental.noalias.scope.decl(metadata) #2

; Function Attrs: nocallback nofree nosync nounwind willreturn memory(none)
declare double @llvm.vector.reduce.fadd.v8f64(double, <8 x double>) #3

attributes #0 = { mustprogress nocallback nofree nosync nounwind speculatable willreturn memory(none) }
attributes #1 = { nofree nosync nounwind }
attributes #2 = { nocallback nofree nosync nounwind willreturn memory(inaccessiblemem: readwrite) }
attributes #3 = { nocallback nofree nosync nounwind willreturn memory(none) }

!0 = !{!1}
!1 = distinct !{!1, !2, !"kiln_76be04cf169ee4c9_body: argument 0"}
!2 = distinct !{!2, !"kiln_76be04cf169ee4c9_body"}
!3 = !{!4}
!4 = distinct !{!4, !2, !"kiln_76be04cf169ee4c9_body: argument 1"}
!5 = !{!6}
!6 = distinct !{!6, !2, !"kiln_76be04cf169ee4c9_body: argument 2"}
!7 = !{!8}
!8 = distinct !{!8, !2, !"kiln_76be04cf169ee4c9_body: argument 3"}
!9 = !{!1, !4, !6, !8}
!10 = !{!4, !6, !8}
!11 = distinct !{!11, !12, !13}
!12 = !{!"llvm.loop.isvectorized", i32 1}
!13 = !{!"llvm.loop.unroll.runtime.disable"}
!14 = distinct !{!14, !13, !12}
!15 = distinct !{!15, !12, !13}
!16 = distinct !{!16, !13, !12}
!17 = !{!1, !6, !8}
!18 = !{!1, !4, !8}
!19 = !{!1, !4, !6}
!20 = distinct !{!20, !12, !13}
!21 = distinct !{!21, !12, !13}
!22 = distinct !{!22, !13, !12}
