#include "netaccel/spawn.h"

#include <fcntl.h>

#include <cstring>

extern char** environ;

namespace raccel::netaccel {

Result<pid_t> spawnProgram(std::vector<std::string> args, const std::function<void(posix_spawn_file_actions_t*)>& wire) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  wire(&actions);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, args[0].c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return fail(Code::unavailable, "cannot start " + args[0] + ": " + std::strerror(rc));
  return pid;
}

}  // namespace raccel::netaccel
