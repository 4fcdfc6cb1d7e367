// A card's kernel template: raccel's own tensor kernels as the device's compiler caches
// them, built once per machine by a sandbox process that never runs a tenant's code
// (raccel-sandbox --precompile), and copied into every new sandbox's compiler cache.
//
// PoCL compiles a kernel for each work-group size it is launched with, at its first
// launch: a new tenant's first training step compiled ~28 of them (2.85 s for the
// reference CNN). Each sandbox has a cache of its own (a cache shared between tenants
// would let one plant the code another runs), so every tenant paid that again.
//
// Where: <sandbox_dir>/kernel-template/<backend><device>-<hash of the model, the driver's
// version and the kernels' source>, so that a new kernel source, another device or a
// driver upgrade builds anew. While a
// builder works, <name>.building is its folder, with its pid in <name>.building/pid. It
// is confined as a tenant's sandbox is (it writes its folder only) and marks its cache
// complete there when done; whoever looks next (ready()) renames that cache to <name>
// (atomic: a template exists whole or not at all), and each sandbox started after that
// copies it (--kernel-template) before it opens its card.
// A builder outlives the netaccel that started it (a short-lived netaccel would never see
// it finish); one that died is replaced by the next netaccel, which keeps what it had
// compiled. Each sandbox gets a copy, never a link: a tenant can change its own cache
// only.
// Each use touches the template's folder; what no netaccel has used for a week (another
// kernel source's, device's or driver's template, its log, a dead builder's folder) is
// removed by the next netaccel that opens a card there (prune()).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace raccel::netaccel {

// Copies a template into `cache` (a new sandbox's compiler cache, from the sandbox
// itself before it opens its card or runs anything of its tenant's: the netaccel's worker
// does not wait for the copy); false if that failed (it then compiles as before).
bool copyKernelTemplate(const std::string& from, const std::string& cache);

class KernelTemplate {
 public:
  // `root`: <sandbox_dir>/kernel-template; `name` as above.
  KernelTemplate(std::string root, std::string name) : root_(std::move(root)), name_(std::move(name)) {}
  // The folder of a card's template: its device, model, driver version and the kernels
  // it would hold (a driver upgrade builds anew rather than trust the old one's code).
  static std::string nameFor(const std::string& backend, unsigned device, const std::string& model,
                             const std::string& driverVersion);

  std::string path() const { return root_ + "/" + name_; }
  // Whether the template is there to copy; a build marked complete is moved into place
  // first.
  bool ready() const;
  // Starts `command` (raccel-sandbox --precompile ... --workdir=<building folder>,
  // appended here) unless the template is ready or a live builder has it; the builder's
  // output goes to <name>.log. Reaps a builder of ours that ended; after one that failed
  // this netaccel starts none again (the next netaccel tries once more).
  void build(std::vector<std::string> command);
  // The template is about to be copied into a sandbox: its folder's time says so.
  void markUsed() const;
  // Removes from the template folder every entry but this card's own whose time is older
  // than `unused`: each is renamed first, then removed, so a template is there whole or
  // not at all, and one being copied meanwhile fails its copy (that sandbox compiles as
  // before). A live builder's folder stays. Nothing is done where rootIsOurs() is false.
  static constexpr std::chrono::hours kUnusedFor{24 * 7};
  void prune(std::chrono::seconds unused = kUnusedFor) const;

 private:
  bool rootIsOurs() const;  // sandbox_dir and kernel-template/: this user's, no one else's to write
  bool claim();             // the building folder is ours now (new, or a dead builder's)
  void publish() const;     // a completed build's cache becomes the template
  std::string root_, name_;
  pid_t builder_ = 0;
  bool gaveUp_ = false;
};

}  // namespace raccel::netaccel
