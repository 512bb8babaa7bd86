// Exported weights' layout and checks (see export_layout.h). No LibTorch.
#include "models/export_layout.h"

#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/input_file.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "models/decoder_layers.h"

namespace stagehand {
namespace {

absl::Status Invalid(std::string m) { return absl::InvalidArgumentError(std::move(m)); }

std::string Shape(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); }

// GPT: "layers.<k>.<rest>" -> gpt_peer.py's GPTStage names.
std::string GptExportName(const ModelSpec& spec, const std::string& internal) {
  absl::string_view rest = internal;
  if (!absl::ConsumePrefix(&rest, "layers.")) return internal;
  const size_t dot = rest.find('.');
  int layer = 0;
  if (dot == absl::string_view::npos || !absl::SimpleAtoi(rest.substr(0, dot), &layer)) return internal;
  const absl::string_view param = rest.substr(dot + 1);
  switch (DecoderLayerKindOf(layer, spec.layers())) {
    case DecoderLayerKind::kEmbedding:
      return absl::StrCat("tok.", param);
    case DecoderLayerKind::kHead:
      return param == "lm_head.weight" ? "head.weight" : std::string(param);
    default:
      return absl::StrCat("blocks.", (layer - 1) / 2, ".", param);
  }
}

std::string Number(double v) { return absl::StrFormat("%.15g", v); }

std::string Quoted(const std::string& s) { return absl::StrCat("\"", s, "\""); }

// A regular file only (common/input_file.h): a FIFO or a device is refused, never waited on.
absl::StatusOr<std::string> ReadWhole(const std::string& path) {
  absl::StatusOr<std::string> text = ReadRegularFile(path, path, int64_t{16} << 20);
  if (absl::IsNotFound(text.status())) return absl::NotFoundError(path);
  if (!text.ok()) return Invalid(std::string(text.status().message()));
  return text;
}

absl::StatusOr<google::protobuf::Struct> ParseJson(const std::string& path, const std::string& text) {
  google::protobuf::Struct root;
  if (!google::protobuf::util::JsonStringToMessage(text, &root).ok()) {
    return Invalid(absl::StrCat(path, " is not a JSON object; export the model again"));
  }
  return root;
}

}  // namespace

const SafetensorsEntry& ExportDirectory::Entry(const std::string& name) const {
  const auto& [file, k] = where.at(name);
  return headers[file].tensors[k];
}

std::string ExportShardName(int rank, int ranks) {
  if (ranks <= 1) return kExportSingleFile;
  return absl::StrFormat("model-%05d-of-%05d.safetensors", rank + 1, ranks);
}

std::string ExportName(const ModelSpec& spec, const std::string& internal) {
  return spec.family() == "gpt" ? GptExportName(spec, internal) : internal;
}

absl::StatusOr<std::vector<ExportTensor>> ExportedTensors(const ModelSpec& s) {
  std::vector<ExportTensor> out;
  const int64_t v = s.vocab(), h = s.hidden();
  if (s.family() == "llama") {
    const int64_t d = h / s.heads(), f = s.ffn_hidden();
    out.push_back({"model.embed_tokens.weight", {v, h}});
    for (int64_t b = 0; b < s.layers(); ++b) {
      const std::string p = absl::StrCat("model.layers.", b, ".");
      out.push_back({p + "input_layernorm.weight", {h}});
      out.push_back({p + "self_attn.q_proj.weight", {s.heads() * d, h}});
      out.push_back({p + "self_attn.k_proj.weight", {s.kv_heads() * d, h}});
      out.push_back({p + "self_attn.v_proj.weight", {s.kv_heads() * d, h}});
      out.push_back({p + "self_attn.o_proj.weight", {h, s.heads() * d}});
      out.push_back({p + "post_attention_layernorm.weight", {h}});
      out.push_back({p + "mlp.gate_proj.weight", {f, h}});
      out.push_back({p + "mlp.up_proj.weight", {f, h}});
      out.push_back({p + "mlp.down_proj.weight", {h, f}});
    }
    out.push_back({"model.norm.weight", {h}});
    out.push_back({"lm_head.weight", {v, h}});
    return out;
  }
  if (s.family() == "gpt") {
    out.push_back({"tok.weight", {v, h}});
    for (int64_t b = 0; b < s.layers(); ++b) {
      const std::string p = absl::StrCat("blocks.", b, ".");
      for (const char* ln : {"ln1", "ln2"}) {
        out.push_back({absl::StrCat(p, ln, ".weight"), {h}});
        out.push_back({absl::StrCat(p, ln, ".bias"), {h}});
      }
      out.push_back({p + "qkv.weight", {3 * h, h}});
      out.push_back({p + "qkv.bias", {3 * h}});
      out.push_back({p + "proj.weight", {h, h}});
      out.push_back({p + "proj.bias", {h}});
      out.push_back({p + "fc1.weight", {4 * h, h}});
      out.push_back({p + "fc1.bias", {4 * h}});
      out.push_back({p + "fc2.weight", {h, 4 * h}});
      out.push_back({p + "fc2.bias", {h}});
    }
    out.push_back({"ln_f.weight", {h}});
    out.push_back({"ln_f.bias", {h}});
    out.push_back({"head.weight", {v, h}});
    return out;
  }
  return absl::NotFoundError(absl::StrCat("no export layout for the family ", s.family()));
}

std::string ExportConfigJson(const std::string& model, const ModelSpec& s) {
  std::vector<std::pair<std::string, std::string>> f;
  if (s.family() == "llama") {
    f = {
        {"architectures", "[\"LlamaForCausalLM\"]"},
        {"model_type", Quoted("llama")},
        {"vocab_size", absl::StrCat(s.vocab())},
        {"hidden_size", absl::StrCat(s.hidden())},
        {"intermediate_size", absl::StrCat(s.ffn_hidden())},
        {"num_attention_heads", absl::StrCat(s.heads())},
        {"num_key_value_heads", absl::StrCat(s.kv_heads())},
        {"num_hidden_layers", absl::StrCat(s.layers())},
        {"head_dim", absl::StrCat(s.hidden() / s.heads())},
        {"hidden_act", Quoted("silu")},
        {"rms_norm_eps", Number(s.norm_eps())},
        {"rope_theta", Number(s.rope_theta())},
        {"rope_parameters", absl::StrCat("{\"rope_type\": \"default\", \"rope_theta\": ", Number(s.rope_theta()), "}")},
        {"max_position_embeddings", absl::StrCat(s.seq())},
        {"attention_bias", "false"},
        {"attention_dropout", "0.0"},
        {"mlp_bias", "false"},
        {"tie_word_embeddings", "false"},
        {"torch_dtype", Quoted("float32")}};
  } else {
    f = {{"architectures", absl::StrCat("[\"", s.family() == "gpt" ? "StagehandGPT" : s.family(), "\"]")},
         {"model_type", Quoted(s.family() == "gpt" ? "stagehand-gpt" : s.family())},
         {"vocab_size", absl::StrCat(s.vocab())},
         {"hidden_size", absl::StrCat(s.hidden())},
         {"num_attention_heads", absl::StrCat(s.heads())},
         {"num_hidden_layers", absl::StrCat(s.layers())},
         {"max_position_embeddings", absl::StrCat(s.seq())},
         {"layer_norm_eps", "1e-05"},
         {"tie_word_embeddings", "false"},
         {"torch_dtype", Quoted("float32")}};
  }
  f.push_back({"stagehand_model", Quoted(model)});
  f.push_back({"stagehand_family", Quoted(s.family())});
  std::string out = "{\n";
  for (size_t i = 0; i < f.size(); ++i) {
    absl::StrAppend(&out, "  ", Quoted(f[i].first), ": ", f[i].second, i + 1 < f.size() ? ",\n" : "\n");
  }
  return out + "}\n";
}

absl::StatusOr<ExportDirectory> ReadExportDirectory(const std::string& dir) {
  ExportDirectory e;
  e.dir = dir;
  const std::string config = dir + "/" + kExportConfig;
  absl::StatusOr<std::string> text = ReadWhole(config);
  if (!text.ok()) {
    if (!absl::IsNotFound(text.status())) return text.status();  // "<path>: not a regular file but a FIFO; ..."
    return Invalid(absl::StrCat(config,
                                " is missing: pass a directory written by --export_dir (or Hugging Face's "
                                "save_pretrained)"));
  }
  e.config_json = *text;
  if (absl::StatusOr<google::protobuf::Struct> c = ParseJson(config, *text); !c.ok()) return c.status();
  std::map<std::string, std::string> index;  // tensor -> file, from the index
  const std::string index_path = dir + "/" + kExportIndex;
  absl::StatusOr<std::string> index_text = ReadWhole(index_path);
  if (!index_text.ok() && !absl::IsNotFound(index_text.status())) return index_text.status();
  if (index_text.ok()) {
    absl::StatusOr<google::protobuf::Struct> root = ParseJson(index_path, *index_text);
    if (!root.ok()) return root.status();
    auto map = root->fields().find("weight_map");
    if (map == root->fields().end() || !map->second.has_struct_value()) {
      return Invalid(absl::StrCat(index_path, " has no weight_map; export the model again"));
    }
    std::set<std::string> files;
    for (const auto& [name, file] : map->second.struct_value().fields()) {
      if (file.string_value().empty() || file.string_value().find('/') != std::string::npos) {
        return Invalid(absl::StrCat(index_path, " maps ", name, " to a file name it cannot be: ", file.string_value()));
      }
      index[name] = file.string_value();
      files.insert(file.string_value());
    }
    e.files.assign(files.begin(), files.end());
  } else {
    e.files.push_back(kExportSingleFile);
  }
  e.headers.resize(e.files.size());
  for (size_t i = 0; i < e.files.size(); ++i) {
    const std::string path = dir + "/" + e.files[i];
    absl::StatusOr<SafetensorsHeader> h = ReadSafetensorsHeader(path);
    if (!h.ok()) return Invalid(absl::StrCat(h.status().message(), "; refusing the export ", dir));
    e.headers[i] = *std::move(h);
  }
  for (size_t i = 0; i < e.files.size(); ++i) {
    for (size_t k = 0; k < e.headers[i].tensors.size(); ++k) {
      const SafetensorsEntry& t = e.headers[i].tensors[k];
      if (!index.empty()) {
        auto it = index.find(t.name);
        if (it == index.end() || it->second != e.files[i]) {
          return Invalid(absl::StrCat(dir, "/", e.files[i], " holds ", t.name, ", which ", kExportIndex,
                                      it == index.end() ? " does not list" : " puts in " + it->second,
                                      "; export the model again"));
        }
      }
      if (!e.where.emplace(t.name, std::make_pair(static_cast<int>(i), static_cast<int>(k))).second) {
        return Invalid(absl::StrCat(dir, "/", e.files[i], " holds ", t.name, " a second time; export the model again"));
      }
    }
  }
  for (const auto& [name, file] : index) {
    if (!e.where.count(name)) {
      return Invalid(
          absl::StrCat(index_path, " puts ", name, " in ", file, ", which lacks it; export the model again"));
    }
  }
  return e;
}

namespace {

struct ConfigField {
  const char* key;
  const char* flag;
  double want;
};

absl::Status CheckConfig(const ExportDirectory& e, const ModelSpec& s) {
  const std::string path = e.dir + "/" + kExportConfig;
  absl::StatusOr<google::protobuf::Struct> c = ParseJson(path, e.config_json);
  if (!c.ok()) return c.status();
  const auto& fields = c->fields();
  auto str = [&](const char* key) {
    auto it = fields.find(key);
    return it == fields.end() ? std::string() : it->second.string_value();
  };
  const std::string type = str("model_type");
  const std::string want_type = s.family() == "llama" ? "llama" : s.family() == "gpt" ? "stagehand-gpt" : s.family();
  if (type != want_type) {
    return Invalid(absl::StrCat(path, " is of model_type \"", type, "\" but this job's model is ", want_type,
                                " (family ", s.family(), "); pass the --model it was exported from (",
                                str("stagehand_model").empty() ? type : str("stagehand_model"), ")"));
  }
  std::vector<ConfigField> want = {{"vocab_size", "vocab", double(s.vocab())},
                                   {"hidden_size", "hidden", double(s.hidden())},
                                   {"num_attention_heads", "heads", double(s.heads())},
                                   {"num_hidden_layers", "layers", double(s.layers())}};
  if (s.family() == "llama") {
    want.push_back({"num_key_value_heads", "kv_heads", double(s.kv_heads())});
    want.push_back({"intermediate_size", "ffn_hidden", double(s.ffn_hidden())});
    want.push_back({"rms_norm_eps", "", s.norm_eps()});
    want.push_back({"rope_theta", "", s.rope_theta()});
  }
  for (const ConfigField& f : want) {
    auto it = fields.find(f.key);
    if (it == fields.end() || it->second.kind_case() != google::protobuf::Value::kNumberValue) {
      if (std::string(f.key) == "rope_theta") continue;  // newer configs keep it under rope_parameters only
      return Invalid(absl::StrCat(path, " has no ", f.key, "; export the model again"));
    }
    const double got = it->second.number_value();
    if (std::abs(got - f.want) > 1e-9 * std::max(1.0, std::abs(f.want))) {
      const std::string fix =
          *f.flag ? absl::StrCat("pass --", f.flag, "=", Number(got))
                  : absl::StrCat("set model_spec { ", f.key == std::string("rms_norm_eps") ? "norm_eps" : f.key, ": ",
                                 Number(got), " } in the job file");
      return Invalid(absl::StrCat(path, " has ", f.key, " ", Number(got), " but this job's model has ", Number(f.want),
                                  "; ", fix, " (or pass another export)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckExportMatches(const ExportDirectory& e, const ModelSpec& spec) {
  if (absl::Status s = CheckConfig(e, spec); !s.ok()) return s;
  absl::StatusOr<std::vector<ExportTensor>> expected = ExportedTensors(spec);
  if (absl::IsNotFound(expected.status())) return absl::OkStatus();
  if (!expected.ok()) return expected.status();
  std::set<std::string> known;
  for (const ExportTensor& t : *expected) {
    known.insert(t.name);
    auto it = e.where.find(t.name);
    if (it == e.where.end()) {
      return Invalid(absl::StrCat(e.dir, " has no tensor ", t.name, " (", Shape(t.shape), ") in ",
                                  absl::StrJoin(e.files, ", "), "; pass an export of this model"));
    }
    const SafetensorsEntry& got = e.Entry(t.name);
    const std::string file = absl::StrCat(e.dir, "/", e.files[it->second.first]);
    if (got.shape != t.shape) {
      return Invalid(absl::StrCat(file, " holds ", t.name, " as ", Shape(got.shape), " but this model's is ",
                                  Shape(t.shape), "; pass the model's sizes it was exported with"));
    }
    if (got.dtype != "F32" && got.dtype != "BF16" && got.dtype != "F16") {
      return Invalid(
          absl::StrCat(file, " holds ", t.name, " as ", got.dtype, "; pass an export of F32, BF16 or F16 tensors"));
    }
  }
  for (const auto& [name, at] : e.where) {
    if (!known.count(name)) {
      return Invalid(absl::StrCat(e.dir, "/", e.files[at.first], " holds ", name,
                                  ", which this model has not; pass an export of this model"));
    }
  }
  return absl::OkStatus();
}

}  // namespace stagehand
