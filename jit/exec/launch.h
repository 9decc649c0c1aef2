// Running a plan: binding each kernel to this run's storage, launching it, combining a split
// reduction's partials, and the step runners of the fusions the plan chose.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "jit/exec/plan.h"

namespace kiln::jit {

// Runs `plan` on `seg` (its nodes at the plan's positions in `sc.ext`): every needed node ends
// materialized. With `release_inputs`, external inputs that only the segment held (per the
// signature just taken) give their storage back after their last reader, as intermediates do;
// a prepared segment, whose nodes persist across runs, passes false.
void execute(const Plan& plan, const Segment& seg, RunScratch& sc, bool release_inputs);

// The combine kernels a split kernel's partials need on `device`, compiled now (while the plan
// is made, not at its first run).
void prepare_combines(const CompiledKernel& ck, const Group& g, DeviceType device);

// The compiled kernel for a group, or null after logging (once per key) why there is none (its
// nodes then run on the interpreter).
std::shared_ptr<CompiledKernel> kernel_or_null(const Group& g, const std::string& key, DeviceType device);

}  // namespace kiln::jit
