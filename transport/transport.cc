// Helpers shared by every transport: the size of each element type, and the default collectives and
// sub-communicators of transport.h, built on Send/Recv for the transports that have nothing better.
#include "transport/transport.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace stagehand {

int64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
    case DType::kBFloat16:
      return 2;
    case DType::kInt64:
      return 8;
  }
  return 0;  // Unreachable for valid enum values; keeps -Wreturn-type quiet.
}

namespace {

template <typename T>
void AddInto(void* into, const void* from, int64_t count) {
  T* a = static_cast<T*>(into);
  const T* b = static_cast<const T*>(from);
  for (int64_t i = 0; i < count; ++i) a[i] += b[i];
}

absl::Status CheckSummable(int64_t count, DType dtype, const char* what) {
  if (dtype == DType::kBFloat16) {
    return absl::UnimplementedError(absl::StrCat(what, " of bfloat16 over Send/Recv is not supported; use float32"));
  }
  if (count < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": negative count ", count));
  return absl::OkStatus();
}

void Accumulate(void* into, const void* from, int64_t count, DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      AddInto<float>(into, from, count);
      break;
    case DType::kFloat64:
      AddInto<double>(into, from, count);
      break;
    case DType::kInt64:
      AddInto<int64_t>(into, from, count);
      break;
    case DType::kBFloat16:
      break;  // refused by CheckSummable
  }
}

// Sums every rank's `data` at rank 0 in rank order and sends the sum back: the same bits everywhere.
absl::Status AllReduceThroughRoot(Transport& t, void* data, int64_t count, DType dtype) {
  if (absl::Status s = CheckSummable(count, dtype, "AllReduceSum"); !s.ok()) return s;
  const int64_t bytes = count * DTypeSize(dtype);
  if (t.rank() != 0) {
    if (absl::Status s = t.Send(data, bytes, 0); !s.ok()) return s;
    return t.Recv(data, bytes, 0);
  }
  std::vector<uint64_t> incoming((bytes + 7) / 8);  // aligned for every dtype
  for (int r = 1; r < t.world_size(); ++r) {
    if (absl::Status s = t.Recv(incoming.data(), bytes, r); !s.ok()) return s;
    Accumulate(data, incoming.data(), count, dtype);
  }
  for (int r = 1; r < t.world_size(); ++r) {
    if (absl::Status s = t.Send(data, bytes, r); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// A view of some ranks of a parent transport: ranks are indices into `members`, bytes go over the
// parent's Send/Recv to members[peer].
class SubgroupTransport final : public Transport {
 public:
  SubgroupTransport(Transport* parent, std::vector<int> members, int rank)
      : parent_(parent), members_(std::move(members)), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return static_cast<int>(members_.size()); }
  std::string name() const override { return parent_->name(); }
  absl::Status AllReduceSum(void* data, int64_t count, DType dtype) override {
    return AllReduceThroughRoot(*this, data, count, dtype);
  }
  absl::Status Send(const void* data, int64_t bytes, int peer) override {
    if (absl::Status s = CheckPeer(peer); !s.ok()) return s;
    return parent_->Send(data, bytes, members_[peer]);
  }
  absl::Status Recv(void* data, int64_t bytes, int peer) override {
    if (absl::Status s = CheckPeer(peer); !s.ok()) return s;
    return parent_->Recv(data, bytes, members_[peer]);
  }
  absl::Status Group(const std::vector<P2POp>& ops) override {
    std::vector<P2POp> mapped = ops;
    for (P2POp& op : mapped) {
      if (absl::Status s = CheckPeer(op.peer); !s.ok()) return s;
      op.peer = members_[op.peer];
    }
    return parent_->Group(mapped);
  }
  void Abort() override { parent_->Abort(); }

 private:
  absl::Status CheckPeer(int peer) const {
    if (peer >= 0 && peer < world_size() && peer != rank_) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("peer ", peer, " is not another rank of a group of ", world_size()));
  }

  Transport* const parent_;
  const std::vector<int> members_;
  const int rank_;
};

}  // namespace

// Rank 0 receives every rank's blocks, sums them in rank order and sends each rank its block.
absl::Status Transport::ReduceScatterSum(const void* send, void* recv, int64_t count, DType dtype) {
  if (absl::Status s = CheckSummable(count, dtype, "ReduceScatterSum"); !s.ok()) return s;
  const int world = world_size();
  const int64_t block = count * DTypeSize(dtype);
  if (rank() != 0) {
    if (absl::Status s = Send(send, block * world, 0); !s.ok()) return s;
    return Recv(recv, block, 0);
  }
  std::vector<uint64_t> sum((block * world + 7) / 8), incoming(sum.size());
  std::memcpy(sum.data(), send, block * world);
  for (int r = 1; r < world; ++r) {
    if (absl::Status s = Recv(incoming.data(), block * world, r); !s.ok()) return s;
    Accumulate(sum.data(), incoming.data(), count * world, dtype);
  }
  const char* bytes = reinterpret_cast<const char*>(sum.data());
  for (int r = 1; r < world; ++r) {
    if (absl::Status s = Send(bytes + r * block, block, r); !s.ok()) return s;
  }
  std::memmove(recv, bytes, block);
  return absl::OkStatus();
}

// Rank 0 collects every rank's block in rank order and sends the whole to each.
absl::Status Transport::AllGather(const void* send, void* recv, int64_t count, DType dtype) {
  if (count < 0) return absl::InvalidArgumentError(absl::StrCat("AllGather: negative count ", count));
  const int world = world_size();
  const int64_t block = count * DTypeSize(dtype);
  char* out = static_cast<char*>(recv);
  if (rank() != 0) {
    if (absl::Status s = Send(send, block, 0); !s.ok()) return s;
    return Recv(recv, block * world, 0);
  }
  std::memmove(out, send, block);
  for (int r = 1; r < world; ++r) {
    if (absl::Status s = Recv(out + r * block, block, r); !s.ok()) return s;
  }
  for (int r = 1; r < world; ++r) {
    if (absl::Status s = Send(out, block * world, r); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Transport>> Transport::Split(int color, const std::vector<int>& members) {
  int index = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] < 0 || members[i] >= world_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Split: member ", members[i], " is not a rank of world size ", world_size()));
    }
    if (members[i] == rank()) index = static_cast<int>(i);
  }
  if (index < 0 || color < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Split: rank ", rank(), " is not among the group's members",
                                                   color < 0 ? " (or the color is negative)" : ""));
  }
  return std::unique_ptr<Transport>(new SubgroupTransport(this, members, index));
}

}  // namespace stagehand
