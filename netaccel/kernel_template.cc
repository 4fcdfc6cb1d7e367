#include "netaccel/kernel_template.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/log.h"
#include "hal/tensor.h"
#include "netaccel/spawn.h"

namespace raccel::netaccel {
namespace {

namespace fs = std::filesystem;

uint64_t fnv1a(uint64_t h, std::string_view s) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// A builder whose pid was written is alive while that pid is, up to half an hour (a
// build takes seconds to minutes; past that the pid may be another process's now); a
// folder with no pid yet is being claimed unless it is older than a few seconds (its
// claimer died between the two steps).
bool builderAlive(const std::string& building) {
  std::error_code ec;
  const auto age = [&](const std::string& path) {
    auto written = fs::last_write_time(path, ec);
    return ec ? std::chrono::hours(24) : fs::file_time_type::clock::now() - written;
  };
  std::ifstream in(building + "/pid");
  long pid = 0;
  if (in >> pid && pid > 0)
    return (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM) && age(building + "/pid") < std::chrono::minutes(30);
  return age(building) < std::chrono::seconds(10);
}

// A folder only this user can change: its own, written by nobody else. The template is
// code every tenant's sandbox runs, so it is used only where its folder and the folders
// above it within sandbox_dir are such (a sandbox_dir in /tmp made first by another user
// would otherwise let that user plant it).
bool ownedByUs(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::geteuid() && (st.st_mode & 022) == 0;
}

}  // namespace

std::string KernelTemplate::nameFor(const std::string& backend, unsigned device, const std::string& model,
                                    const std::string& driverVersion) {
  uint64_t h = fnv1a(0xcbf29ce484222325ull, model);
  h = fnv1a(fnv1a(h, "\n"), driverVersion);
  h = fnv1a(fnv1a(h, "\n"), hal::tensorKernelSource());
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return backend + std::to_string(device) + "-" + hex;
}

bool KernelTemplate::rootIsOurs() const {
  return ownedByUs(fs::path(root_).parent_path().string()) && ownedByUs(root_);
}

bool KernelTemplate::ready() const {
  if (!rootIsOurs()) return false;
  publish();
  return ownedByUs(path());
}

// A builder marks its cache complete last: whoever sees that first moves the cache into
// place (one rename wins) and removes the rest of the builder's folder.
void KernelTemplate::publish() const {
  const std::string building = path() + ".building";
  struct stat st {};
  if (!ownedByUs(building) || ::lstat((building + "/complete").c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return;
  if (::rename((building + "/pocl-cache").c_str(), path().c_str()) != 0) return;
  std::error_code ec;
  fs::remove_all(building, ec);
}

bool KernelTemplate::claim() {
  const std::string building = path() + ".building";
  if (::mkdir(root_.c_str(), 0700) != 0 && errno != EEXIST) return false;
  if (!rootIsOurs()) {
    RLOG_WARN("netaccel") << "not building a kernel template in " << root_
                          << ": it, or the folder above it, is not this user's alone";
    return false;
  }
  std::error_code ec;
  if (::mkdir(building.c_str(), 0700) == 0) return true;
  if (errno != EEXIST || builderAlive(building)) return false;
  // A dead builder's folder: taken by renaming it (one netaccel wins), its cache kept.
  const std::string taken = building + "-" + std::to_string(::getpid());
  if (::rename(building.c_str(), taken.c_str()) != 0) return false;
  if (::mkdir(building.c_str(), 0700) != 0) return fs::remove_all(taken, ec), false;
  ::rename((taken + "/pocl-cache").c_str(), (building + "/pocl-cache").c_str());
  fs::remove_all(taken, ec);
  return true;
}

void KernelTemplate::build(std::vector<std::string> command) {
  if (builder_ > 0) {
    int status = 0;
    if (::waitpid(builder_, &status, WNOHANG) == 0) return;  // still at work
    builder_ = 0;
    gaveUp_ = !ready();  // a builder that failed is not started again by this netaccel
    if (gaveUp_) RLOG_WARN("netaccel") << "kernel template " << name_ << " was not built: see " << path() << ".log";
    else RLOG_INFO("netaccel") << "kernel template " << name_ << " is ready";
  }
  if (gaveUp_ || ready() || !claim()) return;
  const std::string building = path() + ".building", log = path() + ".log";
  command.push_back("--workdir=" + building);
  auto pid = spawnProgram(std::move(command), [&](posix_spawn_file_actions_t* a) {
    posix_spawn_file_actions_addopen(a, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(a, 1, 2);
  });
  if (!pid) {
    RLOG_WARN("netaccel") << "cannot start the kernel template's builder: " << pid.error().message;
    std::error_code ec;
    fs::remove_all(building, ec);
    return;
  }
  std::ofstream(building + "/pid") << *pid << "\n";
  builder_ = *pid;
  RLOG_INFO("netaccel") << "building kernel template " << name_ << " (builder " << *pid << ")";
}

void KernelTemplate::markUsed() const { ::utimensat(AT_FDCWD, path().c_str(), nullptr, AT_SYMLINK_NOFOLLOW); }

void KernelTemplate::prune(std::chrono::seconds unused) const {
  if (!rootIsOurs()) return;
  const time_t before = ::time(nullptr) - static_cast<time_t>(unused.count());
  std::error_code ec;
  for (auto it = fs::directory_iterator(root_, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string entry = it->path().string(), n = it->path().filename().string();
    struct stat st {};
    if (n == name_ || n.rfind(name_ + ".", 0) == 0 || ::lstat(entry.c_str(), &st) != 0 || st.st_mtime >= before) continue;
    if (n.ends_with(".building") && builderAlive(entry)) continue;
    const std::string gone = entry + ".pruned-" + std::to_string(::getpid());
    if (::rename(entry.c_str(), gone.c_str()) != 0) continue;  // (another netaccel's now)
    std::error_code rm;
    fs::remove_all(gone, rm);
    RLOG_INFO("netaccel") << "removed " << entry << " from the kernel templates: unused for "
                          << (::time(nullptr) - st.st_mtime) / 86400 << " days";
  }
}

bool copyKernelTemplate(const std::string& from, const std::string& cache) {
  std::error_code ec;
  fs::copy(from, cache, fs::copy_options::recursive, ec);
  if (!ec) return true;
  std::fprintf(stderr, "raccel-sandbox: cannot copy the kernel template %s: %s\n", from.c_str(), ec.message().c_str());
  fs::remove_all(cache, ec);
  return false;
}

}  // namespace raccel::netaccel
