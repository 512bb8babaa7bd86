// A rank's checkpoint writes and reads (see checkpoint.h). LibTorch translation unit; c10::Error
// becomes a Status at the public functions.
#include "worker/checkpoint.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/checkpoint.h"
#include "common/fd.h"
#include "common/logging.h"
#include "common/safetensors.h"
#include "models/export_layout.h"
#include "google/protobuf/text_format.h"

namespace stagehand {
namespace {

// Rank 0, before it writes a manifest or an index naming rank `rank`'s file at `path`: the file is
// there with `bytes` bytes (-1: any size). A rank on another host that wrote into a directory of the
// same name on its own disk is the one way it is not.
absl::Status ShardVisible(const std::string& path, int rank, int64_t bytes) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && (bytes < 0 || st.st_size == bytes)) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("rank ", rank, " wrote ", path, " but rank 0 ",
                   stat(path.c_str(), &st) == 0 ? absl::StrCat("sees ", st.st_size, " bytes of ", bytes)
                                                : absl::StrCat("cannot see it (", ErrnoText(errno), ")"),
                   ": ranks on several hosts write into one directory, which every host must see at the same path (a "
                   "shared file system): give node 0 a --run_dir (and --export_dir) there"));
}

std::string DtypeName(torch::Dtype d) {
  switch (d) {
    case torch::kFloat32:
      return "F32";
    case torch::kBFloat16:
      return "BF16";
    case torch::kFloat16:
      return "F16";
    case torch::kFloat64:
      return "F64";
    case torch::kInt64:
      return "I64";
    case torch::kInt32:
      return "I32";
    case torch::kUInt8:
      return "U8";
    default:
      return "";
  }
}

torch::Dtype DtypeOf(const std::string& d) {
  if (d == "BF16") return torch::kBFloat16;
  if (d == "F16") return torch::kFloat16;
  if (d == "F64") return torch::kFloat64;
  if (d == "I64") return torch::kInt64;
  if (d == "I32") return torch::kInt32;
  if (d == "U8") return torch::kUInt8;
  return torch::kFloat32;
}

absl::Status MakeDir(const std::string& d) {
  if (mkdir(d.c_str(), 0755) == 0 || errno == EEXIST) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("creating ", d, ": ", ErrnoText(errno)));
}

std::string ShardKey(const CheckpointWriterOptions& o, int64_t step, int rank) {
  return absl::StrCat(o.job_id, "/checkpoint/", o.incarnation, "/", step, "/", rank);
}

// The tensors a rank writes, by name: its parameters, their AdamW state, its CPU generator.
std::vector<std::pair<std::string, torch::Tensor>> StateOf(const Executor& executor) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  const auto named = executor.NamedParameters();
  const FusedAdamW* opt = executor.optimizer();
  for (size_t i = 0; i < named.size(); ++i) {
    out.emplace_back("model/" + named[i].first, named[i].second.detach());
    if (opt == nullptr) continue;
    const FusedAdamW::ParamState s = opt->State(i);
    if (!s.step.defined()) continue;  // no step taken yet
    out.emplace_back("optim/exp_avg/" + named[i].first, s.exp_avg);
    out.emplace_back("optim/exp_avg_sq/" + named[i].first, s.exp_avg_sq);
    out.emplace_back("optim/step/" + named[i].first, s.step.reshape({1}));
  }
  out.emplace_back("rng/cpu", at::detail::getDefaultCPUGenerator().get_state());
  return out;
}

}  // namespace

struct CheckpointWriter::Snapshot {
  int64_t step = 0;
  std::vector<std::string> names;
  std::vector<torch::Tensor> tensors;           // host copies (host_ on GPUs)
  std::shared_ptr<at::cuda::CUDAEvent> copied;  // GPUs: the copies are done once it is
};

CheckpointWriter::CheckpointWriter(CheckpointWriterOptions options) : o_(std::move(options)) {}

CheckpointWriter::~CheckpointWriter() {
  cancel_ = true;
  Join();
}

void CheckpointWriter::Join() {
  if (thread_.joinable()) thread_.join();
}

absl::Status CheckpointWriter::Finish() {
  Join();
  absl::Status s = last_;
  last_ = absl::OkStatus();
  return s;
}

absl::Status CheckpointWriter::Save(int64_t steps_done, const Executor& executor) {
  absl::Status previous = Finish();  // the buffers are free again
  if (!previous.ok()) return previous;
  try {
    auto snapshot = std::make_shared<Snapshot>();
    snapshot->step = steps_done;
    auto state = StateOf(executor);
    const bool cuda = !state.empty() && state.front().second.is_cuda();
    if (host_.size() != state.size()) host_.clear();
    for (size_t i = 0; i < state.size(); ++i) {
      const torch::Tensor& t = state[i].second;
      if (host_.size() <= i) {
        host_.push_back(torch::empty(t.sizes(), t.options().device(torch::kCPU).pinned_memory(t.is_cuda())));
      }
      torch::NoGradGuard no_grad;
      host_[i].copy_(t, /*non_blocking=*/t.is_cuda());
      snapshot->names.push_back(state[i].first);
      snapshot->tensors.push_back(host_[i]);
    }
    if (cuda) {
      snapshot->copied = std::make_shared<at::cuda::CUDAEvent>();
      snapshot->copied->record(at::cuda::getCurrentCUDAStream());
    }
    thread_ = std::thread([this, snapshot] {
      try {
        last_ = Write(*snapshot);
      } catch (const c10::Error& e) {
        last_ = absl::InternalError(absl::StrCat("writing checkpoint: ", e.what_without_backtrace()));
      }
      if (!last_.ok()) LOG(ERROR) << "checkpoint of step " << snapshot->step << ": " << last_.message();
    });
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("copying the checkpoint to host memory: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

absl::Status CheckpointWriter::Write(const Snapshot& s) {
  const JobSpec& job = *o_.job;
  if (absl::Status st = MakeDir(CheckpointsDir(job.run_dir())); !st.ok()) return st;
  const std::string dir = CheckpointDir(job.run_dir(), s.step);
  if (absl::Status st = MakeDir(dir); !st.ok()) return st;
  if (s.copied) s.copied->synchronize();
  std::vector<SafetensorsEntry> entries;
  for (size_t i = 0; i < s.names.size(); ++i) {
    const torch::Tensor& t = s.tensors[i];
    entries.push_back({s.names[i], DtypeName(t.scalar_type()), t.sizes().vec()});
  }
  const std::string prefix = SafetensorsPrefix(
      entries, {{"format", "stagehand-checkpoint-1"}, {"step", absl::StrCat(s.step)}, {"rank", absl::StrCat(o_.rank)}});
  absl::StatusOr<DurableFile> file = DurableFile::Create(dir + "/" + ShardName(o_.rank));
  if (!file.ok()) return file.status();
  if (absl::Status st = file->Append(prefix.data(), prefix.size()); !st.ok()) return st;
  for (const torch::Tensor& t : s.tensors) {
    if (absl::Status st = file->Append(t.data_ptr(), t.numel() * t.element_size()); !st.ok()) return st;
  }
  absl::StatusOr<DurableFile::Committed> done = file->Commit();
  if (!done.ok()) return done.status();
  CheckpointShard shard;
  shard.set_file(ShardName(o_.rank));
  shard.set_bytes(done->bytes);
  shard.set_sha256(done->sha256);
  shard.set_rank(o_.rank);
  shard.set_first_layer(o_.first_layer);
  shard.set_last_layer(o_.last_layer);
  std::string text;
  google::protobuf::TextFormat::PrintToString(shard, &text);
  if (o_.rank != 0) return o_.kv->Set(ShardKey(o_, s.step, o_.rank), text);
  std::vector<std::string> shards{text};
  if (absl::Status st = CollectShards(s.step, shards); !st.ok()) return st;
  CheckpointManifest m;
  for (const std::string& t : shards) {
    if (!google::protobuf::TextFormat::ParseFromString(t, m.add_shards())) {
      return absl::InternalError("a rank's checkpoint shard record does not parse");
    }
  }
  // The other ranks' shards are where this rank sees them (several hosts: one file system), or the
  // manifest would name what resume cannot read.
  for (const CheckpointShard& shard : m.shards()) {
    if (absl::Status st = ShardVisible(dir + "/" + shard.file(), shard.rank(), shard.bytes()); !st.ok()) return st;
  }
  m.set_format(1);
  m.set_step(s.step);
  m.set_model(job.model());
  *m.mutable_model_spec() = job.model_spec();
  for (int n : o_.layers_per_stage) m.add_layers_per_stage(n);
  m.set_seed(job.seed());
  m.set_data(job.data());
  m.set_job_id(o_.job_id);
  m.set_incarnation(o_.incarnation);
  if (absl::Status st = WriteManifest(dir, m); !st.ok()) return st;
  LOG(INFO) << "checkpoint of step " << s.step << " complete: " << dir;
  return PruneCheckpoints(job.run_dir(), job.has_keep_checkpoints() ? job.keep_checkpoints() : 2);
}

// Rank 0: every other rank's shard record, in rank order, as each rank finishes its write. Polls
// the key-value store in short waits so that the destructor (the run is stopping) ends it at once.
absl::Status CheckpointWriter::CollectShards(int64_t step, std::vector<std::string>& shards) {
  const absl::Time deadline = absl::Now() + absl::Minutes(30);
  for (int r = 1; r < o_.world_size; ++r) {
    for (;;) {
      if (cancel_) return absl::CancelledError("the run stopped before every rank wrote its checkpoint shard");
      absl::StatusOr<std::string> v = o_.kv->Get(ShardKey(o_, step, r), absl::Seconds(1));
      if (v.ok()) {
        shards.push_back(*v);
        break;
      }
      if (!absl::IsDeadlineExceeded(v.status()) || absl::Now() > deadline) {
        return absl::Status(v.status().code(), absl::StrCat("waiting for rank ", r, "'s checkpoint shard of step ",
                                                            step, ": ", v.status().message()));
      }
    }
  }
  return absl::OkStatus();
}

namespace {

std::string Shape(const torch::Tensor& t) {
  std::string out = "[";
  for (int64_t i = 0; i < t.dim(); ++i) absl::StrAppend(&out, i ? ", " : "", t.size(i));
  return out + "]";
}

struct Located {
  std::string path;
  size_t shard;
  const SafetensorsEntry* entry;
};

absl::StatusOr<int64_t> Restore(const std::string& dir, const Executor& executor, int rank, bool with_optimizer) {
  absl::StatusOr<CheckpointManifest> m = ReadManifest(dir);
  if (!m.ok()) return m.status();
  std::vector<SafetensorsHeader> headers(m->shards_size());
  std::map<std::string, Located> where;
  for (int i = 0; i < m->shards_size(); ++i) {
    const std::string path = dir + "/" + m->shards(i).file();
    absl::StatusOr<SafetensorsHeader> h = ReadSafetensorsHeader(path);
    if (!h.ok()) return h.status();
    headers[i] = *std::move(h);
  }
  for (int i = 0; i < m->shards_size(); ++i) {
    for (const SafetensorsEntry& e : headers[i].tensors) {
      const std::string key = e.name == "rng/cpu" ? absl::StrCat("rng/cpu/", m->shards(i).rank()) : e.name;
      where[key] = {dir + "/" + m->shards(i).file(), static_cast<size_t>(i), &e};
    }
  }
  std::vector<bool> verified(m->shards_size(), false);
  auto load = [&](const std::string& name, const torch::Tensor& like) -> absl::StatusOr<torch::Tensor> {
    auto it = where.find(name);
    if (it == where.end()) return torch::Tensor();
    const Located& l = it->second;
    if (!verified[l.shard]) {
      if (absl::Status s = VerifyShard(dir, m->shards(l.shard)); !s.ok()) return s;
      verified[l.shard] = true;
    }
    torch::Tensor t = torch::empty(l.entry->shape, torch::TensorOptions().dtype(DtypeOf(l.entry->dtype)));
    if (like.defined() && (t.sizes() != like.sizes())) {
      return absl::FailedPreconditionError(absl::StrCat("checkpoint ", dir, " holds ", name, " as ", Shape(t),
                                                        " but this model's is ", Shape(like),
                                                        "; resume with the model's sizes it was written with"));
    }
    if (absl::Status s = ReadSafetensorsData(l.path, headers[l.shard], *l.entry, t.data_ptr()); !s.ok()) return s;
    return t;
  };
  const auto named = executor.NamedParameters();
  FusedAdamW* opt = with_optimizer ? executor.optimizer() : nullptr;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < named.size(); ++i) {
    const auto& [name, p] = named[i];
    absl::StatusOr<torch::Tensor> value = load("model/" + name, p);
    if (!value.ok()) return value.status();
    if (!value->defined()) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint ", dir, " has no parameter ", name, "; resume a checkpoint of the same model"));
    }
    p.copy_(*value);  // in place: moves the version counter, so derived copies refresh
    if (opt == nullptr) continue;
    absl::StatusOr<torch::Tensor> a = load("optim/exp_avg/" + name, p), b = load("optim/exp_avg_sq/" + name, p),
                                  step = load("optim/step/" + name, torch::Tensor());
    if (!a.ok()) return a.status();
    if (!b.ok()) return b.status();
    if (!step.ok()) return step.status();
    if (a->defined() && b->defined() && step->defined()) opt->SetState(i, {*a, *b, *step});
  }
  absl::StatusOr<torch::Tensor> rng = load(absl::StrCat("rng/cpu/", rank), torch::Tensor());
  if (!rng.ok()) return rng.status();
  if (rng->defined()) {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    gen.set_state(*rng);
  }
  return m->step();
}

}  // namespace

absl::StatusOr<int64_t> RestoreCheckpoint(const std::string& dir, const Executor& executor, int rank,
                                          bool with_optimizer) {
  try {
    return Restore(dir, executor, rank, with_optimizer);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("loading checkpoint ", dir, ": ", e.what_without_backtrace()));
  }
}

namespace {

// Removes a directory of plain files (the temporary export) and the directory itself.
void RemoveFlatDirectory(const std::string& dir) {
  if (DIR* d = opendir(dir.c_str())) {
    while (struct dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") unlink((dir + "/" + name).c_str());
    }
    closedir(d);
  }
  rmdir(dir.c_str());
}

absl::Status SyncDirectory(const std::string& dir) {
  UniqueFd fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0 || fsync(fd.get()) != 0) {
    return absl::InternalError(absl::StrCat("syncing ", dir, ": ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

std::string ParentOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

std::string ExportKey(const CheckpointWriterOptions& o, int rank) {
  return absl::StrCat(o.job_id, "/export/", o.incarnation, "/", rank);
}

// This rank's shard: "<file>\n<bytes of tensor data>\n<name>\n<name>..." for rank 0's index.
absl::StatusOr<std::string> WriteExportShard(const CheckpointWriterOptions& o, const std::string& tmp,
                                             const Executor& executor) {
  const ModelSpec& spec = o.job->model_spec();
  std::vector<SafetensorsEntry> entries;
  std::vector<torch::Tensor> tensors;
  int64_t bytes = 0;
  for (const auto& [name, p] : executor.NamedParameters()) {
    torch::Tensor t = p.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    entries.push_back({ExportName(spec, name), "F32", t.sizes().vec()});
    bytes += t.numel() * t.element_size();
    tensors.push_back(std::move(t));
  }
  const std::string file = ExportShardName(o.rank, o.world_size);
  const std::string prefix = SafetensorsPrefix(entries, {{"format", "pt"}});  // what HF's loader looks for
  absl::StatusOr<DurableFile> out = DurableFile::Create(tmp + "/" + file);
  if (!out.ok()) return out.status();
  if (absl::Status st = out->Append(prefix.data(), prefix.size()); !st.ok()) return st;
  for (const torch::Tensor& t : tensors) {
    if (absl::Status st = out->Append(t.data_ptr(), t.numel() * t.element_size()); !st.ok()) return st;
  }
  if (absl::StatusOr<DurableFile::Committed> done = out->Commit(); !done.ok()) return done.status();
  std::string record = absl::StrCat(file, "\n", bytes);
  for (const SafetensorsEntry& e : entries) absl::StrAppend(&record, "\n", e.name);
  return record;
}

// Rank 0: the other ranks' records, in rank order; polls in short waits up to 30 minutes.
absl::Status CollectExportRecords(const CheckpointWriterOptions& o, std::vector<std::string>& records) {
  const absl::Time deadline = absl::Now() + absl::Minutes(30);
  for (int r = 1; r < o.world_size; ++r) {
    for (;;) {
      absl::StatusOr<std::string> v = o.kv->Get(ExportKey(o, r), absl::Seconds(1));
      if (v.ok()) {
        records.push_back(*v);
        break;
      }
      if (!absl::IsDeadlineExceeded(v.status()) || absl::Now() > deadline) {
        return absl::Status(v.status().code(),
                            absl::StrCat("waiting for rank ", r, "'s export shard: ", v.status().message()));
      }
    }
  }
  return absl::OkStatus();
}

// Rank 0, once every shard is on disk: the index, config.json, then the rename.
absl::Status FinishExport(const CheckpointWriterOptions& o, const std::string& tmp,
                          const std::vector<std::string>& records) {
  const JobSpec& job = *o.job;
  if (o.world_size > 1) {
    int64_t total = 0;
    std::string map;
    for (size_t r = 0; r < records.size(); ++r) {
      std::vector<std::string> lines = absl::StrSplit(records[r], '\n');
      int64_t bytes = 0;
      if (lines.size() < 2 || !absl::SimpleAtoi(lines[1], &bytes)) {
        return absl::InternalError("a rank's export shard record does not parse");
      }
      if (absl::Status s = ShardVisible(tmp + "/" + lines[0], static_cast<int>(r), -1); !s.ok()) return s;
      total += bytes;
      for (size_t i = 2; i < lines.size(); ++i) {
        absl::StrAppend(&map, map.empty() ? "" : ",\n", "    \"", lines[i], "\": \"", lines[0], "\"");
      }
    }
    const std::string index =
        absl::StrCat("{\n  \"metadata\": {\"total_size\": ", total, "},\n  \"weight_map\": {\n", map, "\n  }\n}\n");
    if (absl::Status s = WriteFileDurably(tmp + "/" + kExportIndex, index); !s.ok()) return s;
  }
  if (absl::Status s = WriteFileDurably(tmp + "/" + kExportConfig, ExportConfigJson(job.model(), job.model_spec()));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = SyncDirectory(tmp); !s.ok()) return s;
  if (rename(tmp.c_str(), job.export_dir().c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("renaming ", tmp, " to ", job.export_dir(), ": ", ErrnoText(errno),
                     " (did something else create it meanwhile?); the weights are not exported"));
  }
  return SyncDirectory(ParentOf(job.export_dir()));
}

absl::Status Export(const CheckpointWriterOptions& o, const Executor& executor) {
  const JobSpec& job = *o.job;
  const std::string tmp = absl::StrCat(job.export_dir(), ".partial-", o.job_id, "-", o.incarnation);
  if (absl::Status st = MakeDir(tmp); !st.ok()) return st;
  absl::StatusOr<std::string> mine = WriteExportShard(o, tmp, executor);
  if (!mine.ok()) return mine.status();
  if (o.rank != 0) return o.kv->Set(ExportKey(o, o.rank), *mine);
  std::vector<std::string> records{*mine};
  absl::Status s = o.world_size > 1 ? CollectExportRecords(o, records) : absl::OkStatus();
  if (s.ok()) s = FinishExport(o, tmp, records);
  if (!s.ok()) {
    RemoveFlatDirectory(tmp);
    return s;
  }
  LOG(INFO) << "exported the model's weights to " << job.export_dir();
  return absl::OkStatus();
}

absl::Status Import(const std::string& dir, const ModelSpec& spec,
                    const std::vector<std::pair<std::string, torch::Tensor>>& params) {
  absl::StatusOr<ExportDirectory> e = ReadExportDirectory(dir);
  if (!e.ok()) return e.status();
  torch::NoGradGuard no_grad;
  for (const auto& [name, p] : params) {
    const std::string exported = ExportName(spec, name);
    if (!e->where.count(exported)) {
      return absl::FailedPreconditionError(absl::StrCat(dir, " has no tensor ", exported, " (this stage's ", name,
                                                        "); pass an export of this model to --init_from"));
    }
    const SafetensorsEntry& entry = e->Entry(exported);
    const std::string path = dir + "/" + e->files[e->where.at(exported).first];
    torch::Tensor t = torch::empty(entry.shape, torch::TensorOptions().dtype(DtypeOf(entry.dtype)));
    if (t.sizes() != p.sizes()) {
      return absl::FailedPreconditionError(absl::StrCat(path, " holds ", exported, " as ", Shape(t),
                                                        " but this model's is ", Shape(p),
                                                        "; pass the model's sizes it was exported with"));
    }
    if (entry.end - entry.begin != t.numel() * t.element_size()) {
      return absl::FailedPreconditionError(absl::StrCat(path, " holds ", exported, " as ", entry.dtype,
                                                        ", which --init_from does not read; pass F32, BF16 or F16"));
    }
    const SafetensorsHeader& header = e->headers[e->where.at(exported).first];
    if (absl::Status s = ReadSafetensorsData(path, header, entry, t.data_ptr()); !s.ok()) return s;
    p.copy_(t);  // in place, converting dtype and device: derived copies refresh
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteExport(const CheckpointWriterOptions& options, const Executor& executor) {
  try {
    return Export(options, executor);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("exporting the weights: ", e.what_without_backtrace()));
  }
}

absl::Status ImportWeights(const std::string& dir, const ModelSpec& spec,
                           const std::vector<std::pair<std::string, torch::Tensor>>& params) {
  try {
    return Import(dir, spec, params);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("loading the weights of ", dir, ": ", e.what_without_backtrace()));
  }
}

}  // namespace stagehand
