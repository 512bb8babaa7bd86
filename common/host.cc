// Host name and machine identity (see host.h).
#include "common/host.h"

#include <unistd.h>

#include <fstream>

namespace stagehand {

std::string HostName() {
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

std::string MachineId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (!std::getline(in, id)) return "";
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ' || id.back() == '\r')) id.pop_back();
  return id;
}

}  // namespace stagehand
