// MachineId: the kernel's boot id, the same on every call (and in every network namespace of it).
#include "common/host.h"

#include "gtest/gtest.h"

namespace stagehand {
namespace {

TEST(MachineId, IsTheBootId_StableAcrossCalls) {
  const std::string id = MachineId();
  ASSERT_EQ(id.size(), 36u) << "'" << id << "'";  // a UUID, without its newline
  EXPECT_EQ(id[8], '-');
  EXPECT_EQ(MachineId(), id);
}

}  // namespace
}  // namespace stagehand
