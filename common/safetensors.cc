// safetensors without LibTorch (see safetensors.h). The JSON header is parsed with protobuf's JSON
// parser into a google.protobuf.Struct (numbers are doubles: exact up to 2^53 bytes).
#include "common/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/fd.h"
#include "common/input_file.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace stagehand {
namespace {

constexpr int64_t kMaxHeader = int64_t{100} << 20;  // the format's own limit is 100 MB

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out.push_back(c);
    }
  }
  return out + "\"";
}

absl::Status Bad(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("not a safetensors file: ", what));
}

absl::StatusOr<int64_t> WholeNumber(const google::protobuf::Value& v, const std::string& what) {
  if (v.kind_case() != google::protobuf::Value::kNumberValue || v.number_value() < 0 ||
      v.number_value() > 9007199254740992.0 || std::floor(v.number_value()) != v.number_value()) {
    return Bad(absl::StrCat(what, " is not a whole number"));
  }
  return static_cast<int64_t>(v.number_value());
}

absl::StatusOr<SafetensorsEntry> ParseEntry(const std::string& name, const google::protobuf::Value& v) {
  if (v.kind_case() != google::protobuf::Value::kStructValue) return Bad(absl::StrCat(name, " is not an object"));
  const auto& f = v.struct_value().fields();
  SafetensorsEntry e;
  e.name = name;
  auto dtype = f.find("dtype"), shape = f.find("shape"), offsets = f.find("data_offsets");
  if (dtype == f.end() || shape == f.end() || offsets == f.end()) {
    return Bad(absl::StrCat(name, " lacks dtype, shape or data_offsets"));
  }
  e.dtype = dtype->second.string_value();
  if (SafetensorsDtypeBytes(e.dtype) == 0) return Bad(absl::StrCat(name, ": unknown dtype \"", e.dtype, "\""));
  for (const auto& d : shape->second.list_value().values()) {
    absl::StatusOr<int64_t> n = WholeNumber(d, name + "'s shape");
    if (!n.ok()) return n.status();
    e.shape.push_back(*n);
  }
  const auto& o = offsets->second.list_value().values();
  if (o.size() != 2) return Bad(absl::StrCat(name, ": data_offsets is not [begin, end]"));
  absl::StatusOr<int64_t> b = WholeNumber(o[0], name + "'s offset"), end = WholeNumber(o[1], name + "'s offset");
  if (!b.ok()) return b.status();
  if (!end.ok()) return end.status();
  e.begin = *b;
  e.end = *end;
  int64_t elements = 1;
  for (int64_t d : e.shape) elements = d == 0 ? 0 : (elements > (int64_t{1} << 50) / d ? -1 : elements * d);
  if (elements < 0 || e.end < e.begin || e.end - e.begin != elements * SafetensorsDtypeBytes(e.dtype)) {
    return Bad(absl::StrCat(name, ": its byte range does not hold its shape"));
  }
  return e;
}

}  // namespace

const SafetensorsEntry* SafetensorsHeader::Find(const std::string& name) const {
  for (const SafetensorsEntry& e : tensors) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

int64_t SafetensorsDtypeBytes(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "U8" || d == "I8" || d == "BOOL") return 1;
  return 0;
}

std::string SafetensorsPrefix(std::vector<SafetensorsEntry>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::string json = "{";
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      absl::StrAppend(&json, first ? "" : ",", JsonString(k), ":", JsonString(v));
      first = false;
    }
    json += "}";
  }
  int64_t at = 0;
  for (SafetensorsEntry& e : tensors) {
    int64_t n = SafetensorsDtypeBytes(e.dtype);
    for (int64_t d : e.shape) n *= d;
    e.begin = at;
    e.end = at + n;
    at = e.end;
    if (json.size() > 1) json += ",";
    absl::StrAppend(&json, JsonString(e.name), ":{\"dtype\":", JsonString(e.dtype), ",\"shape\":[");
    for (size_t i = 0; i < e.shape.size(); ++i) absl::StrAppend(&json, i ? "," : "", e.shape[i]);
    absl::StrAppend(&json, "],\"data_offsets\":[", e.begin, ",", e.end, "]}");
  }
  json += "}";
  while ((8 + json.size()) % 8 != 0) json += " ";
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsPrefix(const std::string& prefix, int64_t file_size) {
  if (prefix.size() < 8) return Bad("shorter than its 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(prefix[i]);
  if (n > static_cast<uint64_t>(kMaxHeader) || 8 + n > prefix.size() || static_cast<int64_t>(8 + n) > file_size) {
    return Bad(absl::StrCat("header length ", n, " does not fit the file"));
  }
  google::protobuf::Struct root;
  google::protobuf::util::JsonParseOptions options;
  if (!google::protobuf::util::JsonStringToMessage(prefix.substr(8, n), &root, options).ok()) {
    return Bad("its header is not a JSON object");
  }
  SafetensorsHeader h;
  h.data_start = static_cast<int64_t>(8 + n);
  for (const auto& [name, value] : root.fields()) {
    if (name == "__metadata__") {
      for (const auto& [k, v] : value.struct_value().fields()) h.metadata[k] = v.string_value();
      continue;
    }
    absl::StatusOr<SafetensorsEntry> e = ParseEntry(name, value);
    if (!e.ok()) return e.status();
    h.tensors.push_back(*std::move(e));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const auto& a, const auto& b) { return a.begin < b.begin; });
  int64_t at = 0;
  for (const SafetensorsEntry& e : h.tensors) {
    if (e.begin != at) return Bad(absl::StrCat(e.name, ": tensors do not lie back to back"));
    at = e.end;
  }
  if (h.data_start + at != file_size) {
    return Bad(absl::StrCat("the header covers ", h.data_start + at, " bytes but the file has ", file_size));
  }
  return h;
}

absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path) {
  // A regular file only (common/input_file.h): a FIFO in a shard's place must not hang the reader.
  absl::StatusOr<RegularFile> file = OpenRegularFile(path, path);
  if (absl::IsNotFound(file.status())) return absl::NotFoundError(std::string(file.status().message()));
  if (!file.ok()) return absl::DataLossError(std::string(file.status().message()));
  const UniqueFd fd = std::move(file->fd);
  const struct stat st = file->st;
  std::string len(8, '\0');
  if (pread(fd.get(), len.data(), 8, 0) != 8)
    return absl::DataLossError(absl::StrCat(path, ": not a safetensors file: too short"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(len[i]);
  if (n > static_cast<uint64_t>(kMaxHeader) || static_cast<int64_t>(8 + n) > st.st_size) {
    return absl::DataLossError(absl::StrCat(path, ": not a safetensors file: header length ", n, " does not fit"));
  }
  std::string prefix(8 + n, '\0');
  if (pread(fd.get(), prefix.data(), prefix.size(), 0) != static_cast<ssize_t>(prefix.size())) {
    return absl::DataLossError(absl::StrCat(path, ": cannot read its header: ", ErrnoText(errno)));
  }
  absl::StatusOr<SafetensorsHeader> h = ParseSafetensorsPrefix(prefix, st.st_size);
  if (!h.ok()) return absl::DataLossError(absl::StrCat(path, ": ", h.status().message()));
  return h;
}

absl::Status ReadSafetensorsData(const std::string& path, const SafetensorsHeader& header, const SafetensorsEntry& e,
                                 void* out) {
  absl::StatusOr<RegularFile> file = OpenRegularFile(path, path);
  if (absl::IsNotFound(file.status())) return absl::NotFoundError(std::string(file.status().message()));
  if (!file.ok()) return absl::DataLossError(std::string(file.status().message()));
  const UniqueFd fd = std::move(file->fd);
  char* dst = static_cast<char*>(out);
  int64_t off = header.data_start + e.begin, left = e.end - e.begin;
  while (left > 0) {
    ssize_t got = pread(fd.get(), dst, std::min<int64_t>(left, int64_t{1} << 30), off);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      return absl::DataLossError(
          absl::StrCat(path, ": reading ", e.name, ": ", got < 0 ? ErrnoText(errno) : "unexpected end"));
    dst += got;
    off += got;
    left -= got;
  }
  return absl::OkStatus();
}

}  // namespace stagehand
