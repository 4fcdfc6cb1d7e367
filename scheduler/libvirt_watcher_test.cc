// Domain XML -> VM policy: what the libvirt watcher accepts and what it refuses.
#include "scheduler/libvirt_watcher.h"

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>

namespace raccel::scheduler {
namespace {

std::string domain(const std::string& metadata, const std::string& channel =
                                                     "<channel type='unix'><source mode='bind' path='/run/raccel/vm/web.sock'/>"
                                                     "<target type='virtio' name='org.raccel.vaccel.0'/></channel>") {
  return "<domain type='test'><name>web</name><memory>1048576</memory>"
         "<metadata>" + metadata + "</metadata>"
         "<os><type>hvm</type></os><devices>" + channel + "</devices></domain>";
}

std::string vaccel(const std::string& body) {
  return "<raccel:vaccel xmlns:raccel='https://raccel.dev/xmlns/vaccel/1'>" + body + "</raccel:vaccel>";
}

TEST(DomainXml, MetadataBecomesThePolicy) {
  auto vm = vmFromDomainXml(domain(vaccel("<raccel:tflops>8</raccel:tflops><raccel:priority>2</raccel:priority>"
                                          "<raccel:kinds>gpu,cpu</raccel:kinds><raccel:memory_quota>512MiB</raccel:memory_quota>"
                                          "<raccel:host_cpu>2</raccel:host_cpu><raccel:host_memory>4GiB</raccel:host_memory>")),
                            "libvirt test:///default");
  ASSERT_TRUE(vm) << vm.error().message;
  ASSERT_TRUE(vm->has_value());
  const VmPolicy& p = **vm;
  EXPECT_EQ(p.name, "web");
  EXPECT_EQ(p.socket, "/run/raccel/vm/web.sock");
  EXPECT_EQ(p.attach, VmPolicy::Attach::connect);  // QEMU binds, the scheduler connects
  EXPECT_EQ(p.tflops, 8);
  EXPECT_EQ(p.priority, 2);
  EXPECT_EQ(p.kinds, maskOf(CardKind::gpu) | maskOf(CardKind::cpu));
  EXPECT_EQ(p.memoryQuota, 512ull << 20);
  EXPECT_EQ(p.hostCpuMilli, 2000u);
  EXPECT_EQ(p.hostMemoryMib, 4096u);
  EXPECT_EQ(p.source, "libvirt test:///default");
}

TEST(DomainXml, DefaultsAndConnectMode) {
  auto vm = vmFromDomainXml(domain(vaccel(""), "<channel type='unix'><source mode='connect' path='/tmp/x.sock'/>"
                                               "<target type='virtio' name='org.raccel.vaccel.0'/></channel>"),
                            "s");
  ASSERT_TRUE(vm) << vm.error().message;
  ASSERT_TRUE(vm->has_value());
  EXPECT_EQ((*vm)->attach, VmPolicy::Attach::listen);  // QEMU connects, the scheduler listens
  EXPECT_EQ((*vm)->tflops, VmPolicy{}.tflops);
  EXPECT_EQ((*vm)->kinds, kAllKinds);
}

TEST(DomainXml, ADomainWithoutRaccelMetadataIsNotOurs) {
  auto vm = vmFromDomainXml(domain("<other:x xmlns:other='urn:other'/>"), "s");
  ASSERT_TRUE(vm) << vm.error().message;
  EXPECT_FALSE(vm->has_value());
  // The element's name alone is not enough: the namespace must be raccel's.
  vm = vmFromDomainXml(domain("<vaccel xmlns='urn:someone-else'><tflops>4</tflops></vaccel>"), "s");
  ASSERT_TRUE(vm);
  EXPECT_FALSE(vm->has_value());
}

void expectRefused(const std::string& xml, const std::string& mentions) {
  auto vm = vmFromDomainXml(xml, "s");
  ASSERT_FALSE(vm) << "accepted: " << xml;
  EXPECT_NE(vm.error().message.find(mentions), std::string::npos) << vm.error().message;
  EXPECT_NE(vm.error().message.find("domain 'web'"), std::string::npos) << vm.error().message;
}

TEST(DomainXml, InvalidMetadataIsRefusedWithWhy) {
  expectRefused(domain(vaccel("<raccel:tflops>lots</raccel:tflops>")), "tflops");
  expectRefused(domain(vaccel("<raccel:tflops>-2</raccel:tflops>")), "<tflops>: -2 must be a finite number from 0 to");
  expectRefused(domain(vaccel("<raccel:kinds>gpu,tpu</raccel:kinds>")), "tpu");
  expectRefused(domain(vaccel("<raccel:speed>9</raccel:speed>")), "unknown vm setting 'speed'");
  expectRefused(domain(vaccel("<raccel:tflops>1</raccel:tflops><raccel:tflops>2</raccel:tflops>")), "appears twice");
  expectRefused(domain(vaccel("<raccel:priority></raccel:priority>")), "<priority> is empty");
  expectRefused(domain(vaccel("<raccel:socket>/x</raccel:socket>")), "not a policy setting");
  expectRefused(domain(vaccel("<raccel:memory_quota>a lot</raccel:memory_quota>")), "memory_quota");
  expectRefused(domain(vaccel("") + vaccel("")), "more than one");
  expectRefused(domain(vaccel("text")), "unexpected text");
}

TEST(DomainXml, TheChannelMustBeThere) {
  expectRefused(domain(vaccel(""), ""), "org.raccel.vaccel.0");
  expectRefused(domain(vaccel(""), "<channel type='unix'><source mode='bind' path='/x'/>"
                                   "<target type='virtio' name='org.qemu.guest_agent.0'/></channel>"),
                "org.raccel.vaccel.0");
  expectRefused(domain(vaccel(""), "<channel type='unix'><source mode='bind'/>"
                                   "<target type='virtio' name='org.raccel.vaccel.0'/></channel>"),
                "no path");
}

TEST(DomainXml, TheShippedTemplateDeclaresWhatItsCommentsSay) {
  std::ifstream in(std::string(RACCEL_SOURCE_DIR) + "/vm-images/raccel-domain.xml");
  ASSERT_TRUE(in) << "vm-images/raccel-domain.xml is missing";
  std::stringstream text;
  text << in.rdbuf();
  std::string xml = std::regex_replace(text.str(), std::regex("@NAME@"), "guest1");
  xml = std::regex_replace(xml, std::regex("@IMAGE@"), "/srv/raccel/vm");
  xml = std::regex_replace(xml, std::regex("@SOCKET@"), "/run/raccel/vm/guest1.sock");
  auto vm = vmFromDomainXml(xml, "libvirt qemu:///system");
  ASSERT_TRUE(vm) << vm.error().message;
  ASSERT_TRUE(vm->has_value());
  EXPECT_EQ((*vm)->name, "guest1");
  EXPECT_EQ((*vm)->socket, "/run/raccel/vm/guest1.sock");
  EXPECT_EQ((*vm)->attach, VmPolicy::Attach::connect);
  EXPECT_EQ((*vm)->tflops, 8);
  EXPECT_EQ((*vm)->priority, 1);
  EXPECT_EQ((*vm)->kinds, maskOf(CardKind::gpu) | maskOf(CardKind::cpu));
  EXPECT_EQ((*vm)->memoryQuota, 2ull << 30);
}

TEST(DomainXml, BrokenXmlIsAnError) {
  auto vm = vmFromDomainXml("<domain><name>x</name", "s");
  ASSERT_FALSE(vm);
  EXPECT_NE(vm.error().message.find("does not parse"), std::string::npos);
}

}  // namespace
}  // namespace raccel::scheduler
