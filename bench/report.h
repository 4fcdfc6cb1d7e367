// How raccel-bench writes its figures: JSON values, and text a JSON string may hold.
#pragma once

#include <sys/types.h>

#include <string>

namespace raccel::bench {

// Text inside a JSON string: quotes and control characters become spaces.
std::string jsonSafe(std::string text);

// A figure as a JSON value in `fmt`: null when not measured (NaN, or below zero unless
// `signedOk`: a difference, such as an overhead, may be below zero).
std::string jsonNumber(double v, const char* fmt, bool signedOk = false);

// A process's CPU time so far (user + system, /proc/PID/stat), in milliseconds; 0 when
// it cannot be read.
double processCpuMs(pid_t pid);

// Waits until the children of `parent` (a netaccel: its sandboxes) have used under 2 ms
// of CPU in each of two 100 ms windows in a row (a new warm sandbox building its
// kernels, which would share the CPUs with what is measured next), for at most `maxMs`.
// Returns how long it waited.
double awaitIdleChildren(pid_t parent, double maxMs);

}  // namespace raccel::bench
