// The engine config's keys and how a ModelConfig is read from them.
#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "ftbert/config.h"
#include "ftbert/model.h"

namespace ftbert {

namespace {

using T = ConfigType;

// Keys whose value goes straight to a field. The others (set == nullptr) depend on each other and
// are read after the walk, in config_from_values.
#define FTBERT_SET(expr) [](ModelConfig& c, const ConfigValue& v) { expr; }

// In ftbert_config.json's order (weights_tools/layout.py writes the file's other keys around them).
const std::vector<ConfigKey> kKeys = {
    {"", "architecture", T::kString, false, false, nullptr},
    {"", "vocab_size", T::kInt, true, true, FTBERT_SET(c.vocab_size = static_cast<int>(v.integer))},
    {"", "hidden_size", T::kInt, true, true, FTBERT_SET(c.hidden_size = static_cast<int>(v.integer))},
    {"", "num_hidden_layers", T::kInt, true, true,
     FTBERT_SET(c.num_layers = static_cast<int>(v.integer))},
    {"", "num_attention_heads", T::kInt, true, true,
     FTBERT_SET(c.num_heads = static_cast<int>(v.integer))},
    {"", "intermediate_size", T::kInt, true, true,
     FTBERT_SET(c.intermediate_size = static_cast<int>(v.integer))},
    {"", "max_position_embeddings", T::kInt, true, true,
     FTBERT_SET(c.max_position_embeddings = static_cast<int>(v.integer))},
    {"", "type_vocab_size", T::kInt, true, true,
     FTBERT_SET(c.type_vocab_size = static_cast<int>(v.integer))},
    // Conversions without it have no projection: hidden_size.
    {"", "embedding_size", T::kInt, false, true,
     FTBERT_SET(c.embedding_size = static_cast<int>(v.integer))},
    {"", "layer_norm_eps", T::kNumber, true, true,
     FTBERT_SET(c.layer_norm_eps = static_cast<float>(v.number))},
    {"", "hidden_act", T::kString, true, true, FTBERT_SET(c.activation = activation_from_hf(v.text))},
    // Conversions from before the RoBERTa family count positions from 0 ("absolute").
    {"", "position_ids", T::kString, false, true, nullptr},
    // Read where positions are "padding_offset".
    {"", "pad_token_id", T::kInt, false, true, nullptr},
    // Conversions from before MPNet have no relative bias.
    {"", "relative_attention_num_buckets", T::kInt, false, true,
     FTBERT_SET(c.relative_attention_buckets = static_cast<int>(v.integer))},
    // A layer with rotary positions (ModernBERT's, the rotary_bert architecture's): thetas,
    // sliding windows, a gated MLP. Null, or conversions without the key: BERT's layer.
    {"", "layer", T::kObject, false, true, FTBERT_SET((void)v; c.gated_mlp = true)},
    {"layer", "rotary_theta", T::kNumber, true, true,
     FTBERT_SET(c.rotary_theta = static_cast<float>(v.number))},
    {"layer", "local_rotary_theta", T::kNumber, true, true,
     FTBERT_SET(c.local_rotary_theta = static_cast<float>(v.number))},
    {"layer", "local_window", T::kInt, true, true,
     FTBERT_SET(c.local_window = static_cast<int>(v.integer))},
    {"layer", "global_every", T::kInt, true, true,
     FTBERT_SET(c.global_every = static_cast<int>(v.integer))},
    // Conversions from before the key: true (ModernBERT's layers are gated).
    {"layer", "gated_mlp", T::kBool, false, true, FTBERT_SET(c.gated_mlp = v.flag)},
    // Conversions from before the key: 1 (no rope scaling).
    {"layer", "rotary_scale", T::kNumber, false, true,
     FTBERT_SET(c.rotary_scale = static_cast<float>(v.number))},
    // Conversions from before the keys: 0 and 0 (no dynamic rope scaling).
    {"layer", "rotary_dynamic_factor", T::kNumber, false, true,
     FTBERT_SET(c.rotary_dynamic_factor = static_cast<float>(v.number))},
    {"layer", "rotary_original_positions", T::kInt, false, true,
     FTBERT_SET(c.rotary_original_positions = static_cast<int>(v.integer))},
    // DeBERTa's disentangled attention (the deberta architecture). Null, or conversions without
    // the key: none.
    {"", "disentangled", T::kObject, false, true, FTBERT_SET((void)v; c.disentangled.on = true)},
    {"disentangled", "position_buckets", T::kInt, true, true,
     FTBERT_SET(c.disentangled.position_buckets = static_cast<int>(v.integer))},
    {"disentangled", "max_relative_positions", T::kInt, true, true,
     FTBERT_SET(c.disentangled.max_relative_positions = static_cast<int>(v.integer))},
    {"disentangled", "c2p", T::kBool, true, true, FTBERT_SET(c.disentangled.c2p = v.flag)},
    {"disentangled", "p2c", T::kBool, true, true, FTBERT_SET(c.disentangled.p2c = v.flag)},
    {"disentangled", "position_table", T::kBool, true, true,
     FTBERT_SET(c.disentangled.position_table = v.flag)},
    {"disentangled", "norm", T::kBool, true, true, FTBERT_SET(c.disentangled.norm = v.flag)},
    {"", "has_pooler", T::kBool, true, true, FTBERT_SET(c.has_pooler = v.flag)},
    // Null, or conversions from before heads: none.
    {"", "head", T::kObject, false, true, nullptr},
    {"head", "kind", T::kString, true, true, nullptr},
    {"head", "num_labels", T::kInt, true, true,
     FTBERT_SET(c.head.num_labels = static_cast<int>(v.integer))},
    {"head", "input", T::kString, true, true, nullptr},
    // The head's own dense's activation; null where it has none.
    {"head", "activation", T::kString, false, true, nullptr},
    // Heads written before "norm" have none.
    {"head", "norm", T::kBool, false, true, FTBERT_SET(c.head.norm = v.flag)},
};

#undef FTBERT_SET

std::string quoted_list(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "'" : ", '") + n + "'";
  return out;
}

}  // namespace

const std::vector<ConfigKey>& engine_config_keys() { return kKeys; }

ModelConfig config_from_values(const ConfigLookup& lookup) {
  ModelConfig c;
  std::map<std::string, ConfigValue> seen;  // "object.name" or "name": every present value
  for (const ConfigKey& k : kKeys) {
    const std::string object = k.object;
    // An object's keys are read only where the object is there.
    if (!object.empty() && !seen.count(object)) continue;
    ConfigValue v = lookup(k);
    const std::string path = object.empty() ? k.name : object + "." + k.name;
    if (!v.present) {
      FTBERT_CHECK_INPUT(!k.required, "config: missing key '" << k.name << "'"
                                          << (object.empty() ? "" : " in '" + object + "'"));
      continue;
    }
    // The engine holds every size in an int.
    FTBERT_CHECK_INPUT(k.type != ConfigType::kInt || (v.integer >= std::numeric_limits<int>::min() &&
                                                      v.integer <= std::numeric_limits<int>::max()),
                       "config: " << path << " " << v.integer << " does not fit in a 32-bit int");
    if (k.set != nullptr) k.set(c, v);
    seen.emplace(path, std::move(v));
  }
  auto text = [&](const std::string& path) { return seen.at(path).text; };

  if (seen.count("architecture")) {
    c.architecture = text("architecture");
    const std::vector<std::string> known = model_architectures();
    if (std::find(known.begin(), known.end(), c.architecture) == known.end()) {
      throw InputError("config: architecture '" + c.architecture + "' is not one this build runs (" +
                       quoted_list(known) + ")");
    }
  }
  if (!seen.count("embedding_size")) c.embedding_size = c.hidden_size;
  const std::string positions = seen.count("position_ids") ? text("position_ids") : "absolute";
  FTBERT_CHECK_INPUT(positions == "absolute" || positions == "padding_offset",
                     "config: position_ids '" << positions
                                              << "' is not 'absolute' or 'padding_offset'");
  if (positions == "padding_offset") {
    FTBERT_CHECK_INPUT(seen.count("pad_token_id"), "config: missing key 'pad_token_id'");
    c.position_pad_id = static_cast<int>(seen.at("pad_token_id").integer);
  }
  if (seen.count("head")) {
    HeadConfig& h = c.head;
    const std::string kind = text("head.kind");
    FTBERT_CHECK_INPUT(kind == "sequence_classification" || kind == "token_classification",
                       "config: head.kind '" << kind << "' is not 'sequence_classification' or "
                                                "'token_classification'");
    h.kind = kind == "token_classification" ? HeadKind::kToken : HeadKind::kSequence;
    h.reads_pooler = text("head.input") == "pooler";
    h.reads_mean = text("head.input") == "mean";
    h.reads_late_mean = text("head.input") == "late_mean";
    // A token head with an activation has a dense of its own.
    const bool activation = seen.count("head.activation") > 0;
    h.token_dense = h.kind == HeadKind::kToken && activation;
    if (h.has_dense()) {
      FTBERT_CHECK_INPUT(activation, "config: missing key 'activation' in 'head'");
      h.dense_activation = head_activation_from_name(text("head.activation"));
    }
  }
  return c;
}

}  // namespace ftbert
