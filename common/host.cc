// Host name (see host.h).
#include "common/host.h"

#include <unistd.h>

namespace stagehand {

std::string HostName() {
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

}  // namespace stagehand
