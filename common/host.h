// This machine's host name, as workers and the coordinator report it.
#ifndef STAGEHAND_COMMON_HOST_H_
#define STAGEHAND_COMMON_HOST_H_

#include <string>

namespace stagehand {

std::string HostName();

}  // namespace stagehand

#endif  // STAGEHAND_COMMON_HOST_H_
