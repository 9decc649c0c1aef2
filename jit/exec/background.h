// Background compiles: jobs run one at a time, in order, on a one-thread TBB arena that never
// borrows a caller's thread. Exit-safe: no job runs while static destructors do.
#pragma once
#include <functional>

namespace kiln::jit {

// Queues `job` (it must catch its own exceptions); dropped once the process is exiting.
void run_in_background(std::function<void()> job);
// Blocks until every queued job has finished.
void wait_background_compiles();
// Tests: while held, queued jobs do not start (wait_background_compiles would block).
void hold_background_compiles(bool hold);

}  // namespace kiln::jit
