#include "scheduler/libvirt_watcher.h"

#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>
#include <libxml/parser.h>
#include <libxml/xpath.h>
#include <libxml/xpathInternals.h>

#include <atomic>
#include <deque>
#include <future>
#include <mutex>
#include <thread>

#include "common/log.h"
#include "scheduler/scheduler.h"

namespace raccel::scheduler {
namespace {

// A parsed document with an XPath context that knows raccel's namespace as "r".
class XmlDoc {
 public:
  explicit XmlDoc(const std::string& text) {
    doc_ = xmlReadMemory(text.data(), static_cast<int>(text.size()), "domain.xml", nullptr,
                         XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
    if (!doc_) return;
    ctx_ = xmlXPathNewContext(doc_);
    xmlXPathRegisterNs(ctx_, BAD_CAST "r", BAD_CAST kVaccelXmlns);
  }
  ~XmlDoc() {
    if (ctx_) xmlXPathFreeContext(ctx_);
    if (doc_) xmlFreeDoc(doc_);
  }
  bool ok() const { return ctx_ != nullptr; }
  // Nodes matching `xpath` under `at` (the document when null).
  std::vector<xmlNodePtr> nodes(const char* xpath, xmlNodePtr at = nullptr) {
    ctx_->node = at ? at : xmlDocGetRootElement(doc_);
    std::vector<xmlNodePtr> out;
    xmlXPathObjectPtr r = xmlXPathEvalExpression(BAD_CAST xpath, ctx_);
    if (r && r->nodesetval)
      for (int i = 0; i < r->nodesetval->nodeNr; ++i) out.push_back(r->nodesetval->nodeTab[i]);
    if (r) xmlXPathFreeObject(r);
    return out;
  }
  static std::string text(xmlNodePtr node) {
    xmlChar* c = xmlNodeGetContent(node);
    std::string s = c ? reinterpret_cast<const char*>(c) : "";
    xmlFree(c);
    size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
    return b == std::string::npos ? "" : s.substr(b, e - b + 1);
  }
  static std::string attribute(xmlNodePtr node, const char* name) {
    xmlChar* c = xmlGetProp(node, BAD_CAST name);
    std::string s = c ? reinterpret_cast<const char*>(c) : "";
    xmlFree(c);
    return s;
  }

 private:
  xmlDocPtr doc_ = nullptr;
  xmlXPathContextPtr ctx_ = nullptr;
};

std::string lastLibvirtError() {
  const char* m = virGetLastErrorMessage();
  return m ? m : "unknown libvirt error";
}

}  // namespace

Result<std::optional<VmPolicy>> vmFromDomainXml(const std::string& xml, const std::string& source) {
  XmlDoc doc(xml);
  if (!doc.ok()) return fail(Code::invalidArgument, "the domain XML does not parse");
  auto names = doc.nodes("/domain/name");
  if (names.empty() || XmlDoc::text(names[0]).empty()) return fail(Code::invalidArgument, "the domain XML has no name");
  std::string name = XmlDoc::text(names[0]);
  auto vaccels = doc.nodes("/domain/metadata/r:vaccel");
  if (vaccels.empty()) return std::optional<VmPolicy>{};
  auto bad = [&](const std::string& why) {
    return fail(Code::invalidArgument, "domain '" + name + "': raccel metadata (" + kVaccelXmlns + "): " + why);
  };
  if (vaccels.size() > 1) return bad("more than one <vaccel> element");

  ConfigSection section("vm", 0);
  section.nameKeysAs(ConfigSection::KeyForm::element);
  section.set("name", name);
  for (xmlNodePtr child = vaccels[0]->children; child; child = child->next) {
    if (child->type == XML_TEXT_NODE && XmlDoc::text(child).empty()) continue;
    if (child->type == XML_COMMENT_NODE) continue;
    if (child->type != XML_ELEMENT_NODE) return bad("unexpected text in <vaccel>");
    std::string key = reinterpret_cast<const char*>(child->name);
    if (key == "name" || key == "socket" || key == "attach")
      return bad("<" + key + "> is not a policy setting (the name and socket come from the domain)");
    if (section.has(key)) return bad("<" + key + "> appears twice");
    std::string value = XmlDoc::text(child);
    if (value.empty()) return bad("<" + key + "> is empty");
    section.set(key, value);
  }

  // The channel the guest's raccel-guestd opens.
  auto channels = doc.nodes(
      "/domain/devices/channel[@type='unix'][target[@type='virtio' and @name='org.raccel.vaccel.0']]");
  if (channels.empty())
    return bad(std::string("no <channel type='unix'> with <target type='virtio' name='") + kPortName +
               "'/>: the guest could not reach the scheduler");
  auto sources = doc.nodes("source", channels[0]);
  std::string path = sources.empty() ? "" : XmlDoc::attribute(sources[0], "path");
  if (path.empty()) return bad("the raccel channel's <source> has no path");
  std::string mode = sources.empty() ? "" : XmlDoc::attribute(sources[0], "mode");
  section.set("socket", path);
  // mode='bind' (libvirt's default): QEMU binds, so the scheduler connects.
  section.set("attach", mode == "connect" ? "listen" : "connect");

  auto vm = parseVmSection(section, ',');
  if (!vm) return bad(vm.error().message);
  vm->source = source;
  return std::optional<VmPolicy>(std::move(*vm));
}

// What the libvirt thread saw, waiting for the loop thread.
struct LibvirtWatcher::Shared {
  struct Event {
    bool started = false;  // else stopped
    std::string domain;
    std::string xml;       // for a start
  };
  std::string uri;
  std::mutex mutex;
  std::deque<Event> events;
  uv_async_t* wake = nullptr;  // null once the watcher stops
  std::atomic<bool> stop{false};
  std::thread thread;

  void post(Event e) {
    std::lock_guard lock(mutex);
    events.push_back(std::move(e));
    if (wake) uv_async_send(wake);
  }
  void postStarted(virDomainPtr dom) {
    const char* name = virDomainGetName(dom);
    char* xml = virDomainGetXMLDesc(dom, 0);
    if (!xml) {
      RLOG_WARN("libvirt") << "domain '" << (name ? name : "?") << "': cannot read its XML: " << lastLibvirtError();
      return;
    }
    post(Event{true, name ? name : "", xml});
    free(xml);
  }
  static int onLifecycle(virConnectPtr, virDomainPtr dom, int event, int detail, void* opaque) {
    auto* self = static_cast<Shared*>(opaque);
    if (event == VIR_DOMAIN_EVENT_STARTED) self->postStarted(dom);
    if (event == VIR_DOMAIN_EVENT_STOPPED || event == VIR_DOMAIN_EVENT_UNDEFINED || event == VIR_DOMAIN_EVENT_CRASHED)
      self->post(Event{false, virDomainGetName(dom), ""});
    return 0;
  }

  // The libvirt thread: open, subscribe, scan what runs now, then run libvirt's loop.
  void run(std::promise<Status> opened) {
    static std::once_flag once;
    std::call_once(once, [] {
      virSetErrorFunc(nullptr, [](void*, virErrorPtr) {});  // errors are reported by us, once
      virEventRegisterDefaultImpl();
    });
    virConnectPtr conn = virConnectOpenReadOnly(uri.c_str());
    if (!conn) {
      opened.set_value(fail(Code::unavailable, "libvirt " + uri + ": " + lastLibvirtError()));
      return;
    }
    int callback = virConnectDomainEventRegisterAny(conn, nullptr, VIR_DOMAIN_EVENT_ID_LIFECYCLE,
                                                    VIR_DOMAIN_EVENT_CALLBACK(onLifecycle), this, nullptr);
    if (callback < 0) {
      opened.set_value(fail(Code::unavailable, "libvirt " + uri + ": cannot follow domain events: " + lastLibvirtError()));
      virConnectClose(conn);
      return;
    }
    virDomainPtr* domains = nullptr;
    int n = virConnectListAllDomains(conn, &domains, VIR_CONNECT_LIST_DOMAINS_ACTIVE);
    for (int i = 0; i < n; ++i) {
      postStarted(domains[i]);
      virDomainFree(domains[i]);
    }
    free(domains);
    // A periodic timer so the loop sees `stop` within a quarter second.
    int timer = virEventAddTimeout(250, [](int, void*) {}, nullptr, nullptr);
    opened.set_value(Status{});
    while (!stop.load()) virEventRunDefaultImpl();
    virConnectDomainEventDeregisterAny(conn, callback);
    if (timer >= 0) virEventRemoveTimeout(timer);
    virConnectClose(conn);
  }
};

LibvirtWatcher::LibvirtWatcher(uv_loop_t* loop, Scheduler& scheduler, std::string uri)
    : loop_(loop), scheduler_(scheduler), uri_(std::move(uri)) {}

LibvirtWatcher::~LibvirtWatcher() { stop(); }

Status LibvirtWatcher::start() {
  shared_ = std::make_shared<Shared>();
  shared_->uri = uri_;
  wake_ = new uv_async_t;
  uv_async_init(loop_, wake_, [](uv_async_t* a) { static_cast<LibvirtWatcher*>(a->data)->drain(); });
  wake_->data = this;
  shared_->wake = wake_;
  std::promise<Status> opened;
  auto result = opened.get_future();
  shared_->thread = std::thread([s = shared_, p = std::move(opened)]() mutable { s->run(std::move(p)); });
  Status status = result.get();
  if (!status) {
    stop();
    return status;
  }
  RLOG_INFO("libvirt") << "following the domains of " << uri_;
  drain();
  return {};
}

void LibvirtWatcher::stop() {
  if (!shared_) return;
  shared_->stop = true;
  if (shared_->thread.joinable()) shared_->thread.join();
  {
    std::lock_guard lock(shared_->mutex);
    shared_->wake = nullptr;
  }
  if (wake_) uv_close(reinterpret_cast<uv_handle_t*>(wake_), [](uv_handle_t* h) { delete reinterpret_cast<uv_async_t*>(h); });
  wake_ = nullptr;
  shared_.reset();
}

void LibvirtWatcher::drain() {
  if (!shared_) return;
  std::deque<Shared::Event> events;
  {
    std::lock_guard lock(shared_->mutex);
    events.swap(shared_->events);
  }
  std::string source = "libvirt " + uri_;
  for (auto& e : events) {
    if (!e.started) {
      scheduler_.removeVm(e.domain, "domain stopped");
      continue;
    }
    auto vm = vmFromDomainXml(e.xml, source);
    if (!vm) {
      scheduler_.rejectVm(e.domain, source, vm.error().message);
      continue;
    }
    if (!*vm) {
      RLOG_DEBUG("libvirt") << "domain '" << e.domain << "' started without raccel metadata; not ours";
      continue;
    }
    if (auto added = scheduler_.addVm(**vm); !added) scheduler_.rejectVm(e.domain, source, added.error().message);
  }
}

}  // namespace raccel::scheduler
