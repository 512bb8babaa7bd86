// This machine's host name, as workers and the coordinator report it, and its identity.
#ifndef STAGEHAND_COMMON_HOST_H_
#define STAGEHAND_COMMON_HOST_H_

#include <string>

namespace stagehand {

std::string HostName();

// This machine's identity: its kernel's boot id (/proc/sys/kernel/random/boot_id), "" when unreadable.
// Launchers in network namespaces or containers of one kernel share it (and share its cores), where
// they share a host name too but that name says nothing: several machines may have the same one.
std::string MachineId();

}  // namespace stagehand

#endif  // STAGEHAND_COMMON_HOST_H_
