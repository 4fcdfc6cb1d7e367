// Starting the netaccel's helper processes (a tenant's sandbox, a kernel template's
// builder) with posix_spawn.
#pragma once

#include <spawn.h>
#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "common/error.h"

namespace raccel::netaccel {

// Starts args[0] with `args`, in this process's environment, its standard input
// /dev/null and whatever other descriptors `wire` sets up; its pid.
Result<pid_t> spawnProgram(std::vector<std::string> args, const std::function<void(posix_spawn_file_actions_t*)>& wire);

}  // namespace raccel::netaccel
