// The scheduler's libvirt watcher: follows a libvirt connection's domains and turns
// each domain that declares a virtual accelerator in its <metadata> into a VM of the
// scheduler (docs/ARCHITECTURE.md, "VMs: virtio and libvirt"; vm-images/README.md).
//
//   <metadata>
//     <raccel:vaccel xmlns:raccel="https://raccel.dev/xmlns/vaccel/1">
//       <raccel:tflops>8</raccel:tflops>              most its programs hold together
//       <raccel:priority>1</raccel:priority>          highest priority they may ask for
//       <raccel:kinds>gpu,cpu</raccel:kinds>          card kinds they may use
//       <raccel:memory_quota>2GiB</raccel:memory_quota>
//     </raccel:vaccel>
//   </metadata>
//   <devices>
//     <channel type='unix'>
//       <source mode='bind' path='/run/raccel/vm/NAME.sock'/>
//       <target type='virtio' name='org.raccel.vaccel.0'/>
//     </channel>
//
// Domain started (or running when the watcher starts): the scheduler attaches the
// VM's socket with that policy (mode='bind': QEMU binds, the scheduler connects;
// mode='connect': the scheduler listens). Domain stopped or undefined: the VM is
// detached, its sessions end and their blocks return to the pool. Invalid metadata:
// the VM is rejected with a message that names the element, and gets no blocks.
//
// libvirt's event loop runs on a thread of the watcher's own; it only reads domain XML
// and posts what it saw to the scheduler's loop (uv_async), which owns all state.
#pragma once

#include <uv.h>

#include <memory>
#include <optional>
#include <string>

#include "common/error.h"
#include "scheduler/config.h"

namespace raccel::scheduler {

class Scheduler;

inline constexpr const char* kVaccelXmlns = "https://raccel.dev/xmlns/vaccel/1";
inline constexpr const char* kPortName = "org.raccel.vaccel.0";

// The VM a domain's XML declares: nullopt when it has no raccel metadata (not ours);
// an error naming what is wrong when the metadata or the channel is invalid.
Result<std::optional<VmPolicy>> vmFromDomainXml(const std::string& xml, const std::string& source);

class LibvirtWatcher {
 public:
  LibvirtWatcher(uv_loop_t* loop, Scheduler& scheduler, std::string uri);
  ~LibvirtWatcher();
  // Connects to the URI (an error names it), applies the domains running now, and
  // follows lifecycle events from then on.
  Status start();
  void stop();

 private:
  struct Shared;
  void drain();  // on the loop thread: apply what the libvirt thread posted

  uv_loop_t* loop_;
  Scheduler& scheduler_;
  std::string uri_;
  std::shared_ptr<Shared> shared_;
  uv_async_t* wake_ = nullptr;
};

}  // namespace raccel::scheduler
