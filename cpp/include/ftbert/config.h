// The model hyper-parameters the engine needs, read from the converted checkpoint's config.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ftbert/check.h"

namespace ftbert {

// kIdentity: the bias alone (a projection with no activation, ELECTRA's embeddings). kSilu:
// x·sigmoid(x), the gate of SwiGLU MLPs (NomicBERT, EuroBERT).
enum class Activation : int {
  kGeluErf = 0,
  kGeluTanh = 1,
  kRelu = 2,
  kTanh = 3,
  kIdentity = 4,
  kSilu = 5,
};

// Maps a HuggingFace `hidden_act` string to the activation; anything else is rejected by name.
// A classification head's dense activation ("tanh", "gelu" (erf), "relu").
inline Activation head_activation_from_name(const std::string& name) {
  if (name == "tanh") return Activation::kTanh;
  if (name == "gelu") return Activation::kGeluErf;
  if (name == "relu") return Activation::kRelu;
  FTBERT_FAIL("unsupported head activation '" << name << "' (supported: tanh, gelu, relu)");
}

inline Activation activation_from_hf(const std::string& name) {
  if (name == "gelu") return Activation::kGeluErf;
  if (name == "gelu_new" || name == "gelu_pytorch_tanh") return Activation::kGeluTanh;
  if (name == "relu") return Activation::kRelu;
  if (name == "silu" || name == "swish") return Activation::kSilu;
  FTBERT_FAIL("unsupported hidden_act '"
              << name << "' (supported: gelu, gelu_new, gelu_pytorch_tanh, relu, silu, swish)");
}

// A task head above the encoder.
enum class HeadKind : int {
  kNone = 0,
  kSequence = 1,  // logits [B, N] from token 0: the pooler's output, or a dense of its own + act
  kToken = 2,     // logits [B, S, N] from every token
};

struct HeadConfig {
  HeadKind kind = HeadKind::kNone;
  int num_labels = 0;         // N
  bool reads_pooler = false;  // sequence head on the pooler output (BERT); else its own dense
  bool reads_mean = false;    // that own dense on the mean of the tokens, not the first token
  // that own dense and its activation on every token, then their mean (EuroBERT's "late" pooling)
  bool reads_late_mean = false;
  Activation dense_activation = Activation::kTanh;  // of that own dense
  bool token_dense = false;  // a token head with a dense + activation of its own (ModernBERT)
  bool norm = false;         // a bias-free LayerNorm after the own dense's activation (ModernBERT)

  // The logits' rows for a batch: one per sequence or one per token.
  int64_t rows(int batch, int seq) const {
    return kind == HeadKind::kToken ? static_cast<int64_t>(batch) * seq : batch;
  }
  // Whether the head's first GEMM reads every token's final hidden state (so they must stay in
  // the model's own buffer: Activations::output).
  bool gemm_reads_every_token() const { return kind == HeadKind::kToken || reads_late_mean; }
  bool has_dense() const {
    return (kind == HeadKind::kSequence && !reads_pooler) || (kind == HeadKind::kToken && token_dense);
  }
};

// MPNet's relative positions (transformers' MPNetEncoder.relative_position_bucket, called with its
// defaults whatever the config's table size): the distance j − i of key j from query i falls in one
// of kRelativeBuckets buckets, half per sign; exact below kRelativeBuckets / 4, logarithmic up to
// kRelativeMaxDistance, the last bucket beyond.
constexpr int kRelativeBuckets = 32;
constexpr int kRelativeMaxDistance = 128;
int relative_position_bucket(int distance);

// DeBERTa-v2/v3's disentangled attention (transformers' DisentangledSelfAttention): relative
// position embeddings [2·span, H] (LayerNorm'd when `norm`), projected by each layer's query and
// key projections, give every score a content→position term (c2p: q_i · relative key) and a
// position→content term (p2c: k_j · relative query) for the distance i − j, bucketed
// logarithmically past position_buckets / 2 (make_log_bucket_position) when position_buckets > 0.
struct DisentangledConfig {
  bool on = false;
  int position_buckets = 0;        // > 0: log buckets; span = position_buckets
  int max_relative_positions = 0;  // the buckets' reach (without buckets: the span)
  bool c2p = true;
  bool p2c = true;
  bool position_table = false;     // position_biased_input: the absolute table is added too
  bool norm = true;                // norm_rel_ebd "layer_norm"

  int span() const { return position_buckets > 0 ? position_buckets : max_relative_positions; }
};

// The row of the relative embeddings DeBERTa reads for distance δ = i − j: the bucket of δ
// (transformers' make_log_bucket_position, in float32 as torch computes it) plus the span,
// clamped to [0, 2·span − 1].
int disentangled_column(const DisentangledConfig& d, int distance);

struct ModelConfig {
  // The architecture unit that runs the model (cpp/core/models/), as the family table names it.
  std::string architecture = "bert";
  int vocab_size = 0;
  int hidden_size = 0;          // H
  int embedding_size = 0;       // E: the embeddings' width; != H adds a projection E -> H (ELECTRA)
  int num_layers = 0;           // L
  int num_heads = 0;            // heads; head_dim = H / heads
  int intermediate_size = 0;    // I (FFN inner size)
  int max_position_embeddings = 0;
  int type_vocab_size = 0;
  float layer_norm_eps = 1e-12f;
  Activation activation = Activation::kGeluErf;
  bool has_pooler = true;
  // Position ids: -1 counts 0..S-1 (BERT); a pad id >= 0 counts the RoBERTa family's way, from
  // pad + 1 over the non-pad tokens (Backend::embed_layernorm).
  int position_pad_id = -1;
  // Rows of a relative position bias table [rows, heads] shared by all layers (MPNet), 0 for
  // none; the attention looks up kRelativeBuckets of them (relative_position_bucket).
  int relative_attention_buckets = 0;
  // Pre-LayerNorm encoders with rotary positions, gated MLPs and sliding-window layers
  // (ModernBERT; the engine config's "layer" object): layer i attends globally when
  // i % global_every == 0, else over |j − i| <= local_window, with the rotary theta of its kind.
  float rotary_theta = 0.0f;        // > 0: rotary positions, no position table
  float local_rotary_theta = 0.0f;  // the sliding-window layers' theta
  float rotary_scale = 1.0f;        // inv_freq / rotary_scale (linear, fixed-NTK rope scaling)
  // Dynamic NTK rope scaling (RotaryDynamic): a sequence of extent n > rotary_original_positions
  // turns with theta · (factor · n / original − (factor − 1))^(d / (d − 2)). 0: none.
  float rotary_dynamic_factor = 0.0f;
  int rotary_original_positions = 0;
  int local_window = 0;             // 0: every layer global
  int global_every = 1;
  bool gated_mlp = false;           // FFN-in gives [input | gate] (2I wide): act(input) · gate
  DisentangledConfig disentangled;
  HeadConfig head;

  int head_dim() const { return hidden_size / num_heads; }
  // The FFN-in GEMM's width.
  int ffn_in_width() const { return gated_mlp ? 2 * intermediate_size : intermediate_size; }
  bool global_layer(int layer) const { return local_window == 0 || layer % global_every == 0; }
  // A sequence's rotary angles depend on its own length: every forward runs packed.
  bool rotary_dynamic() const { return rotary_dynamic_factor > 0; }
  bool has_projection() const { return embedding_size != hidden_size; }
  // Rotary positions replace the absolute position table; DeBERTa adds it only where asked.
  bool has_position_table() const {
    return rotary_theta == 0 && (!disentangled.on || disentangled.position_table);
  }
  // The longest sequence the position table serves.
  int max_seq() const {
    return position_pad_id < 0 ? max_position_embeddings
                               : max_position_embeddings - position_pad_id - 1;
  }

  void validate() const {
    FTBERT_CHECK(vocab_size > 0, "config: vocab_size must be positive, got " << vocab_size);
    FTBERT_CHECK(hidden_size > 0, "config: hidden_size must be positive, got " << hidden_size);
    FTBERT_CHECK(embedding_size > 0,
                 "config: embedding_size must be positive, got " << embedding_size);
    FTBERT_CHECK(num_layers > 0, "config: num_hidden_layers must be positive, got " << num_layers);
    FTBERT_CHECK(num_heads > 0 && hidden_size % num_heads == 0,
                 "config: hidden_size " << hidden_size << " is not divisible by num_attention_heads "
                                        << num_heads);
    FTBERT_CHECK(intermediate_size > 0,
                 "config: intermediate_size must be positive, got " << intermediate_size);
    FTBERT_CHECK(max_position_embeddings > 0, "config: max_position_embeddings must be positive");
    FTBERT_CHECK(type_vocab_size > 0, "config: type_vocab_size must be positive");
    FTBERT_CHECK(layer_norm_eps > 0, "config: layer_norm_eps must be positive");
    FTBERT_CHECK(max_seq() > 0, "config: max_position_embeddings " << max_position_embeddings
                                    << " leaves no position after the pad id " << position_pad_id);
    FTBERT_CHECK(rotary_scale > 0, "config: layer.rotary_scale must be positive, got " << rotary_scale);
    FTBERT_CHECK(rotary_theta >= 0 && local_rotary_theta >= 0 && local_window >= 0 && global_every > 0,
                 "config: attention: rotary thetas and local_window must be >= 0 and global_every > 0");
    FTBERT_CHECK(rotary_theta == 0 || head_dim() % 2 == 0,
                 "config: rotary positions need an even head dim, got " << head_dim());
    FTBERT_CHECK(rotary_dynamic_factor >= 0, "config: layer.rotary_dynamic_factor must be >= 0, got "
                                                 << rotary_dynamic_factor);
    FTBERT_CHECK(!rotary_dynamic() || (rotary_theta > 0 && head_dim() > 2 &&
                                       rotary_original_positions >= 1 &&
                                       rotary_original_positions <= max_seq()),
                 "config: dynamic rope scaling needs rotary positions, a head dim above 2 and "
                 "layer.rotary_original_positions in [1, "
                     << max_seq() << "], got " << rotary_original_positions);
    FTBERT_CHECK(relative_attention_buckets == 0 || relative_attention_buckets >= kRelativeBuckets,
                 "config: relative_attention_num_buckets " << relative_attention_buckets
                     << " is neither 0 (no relative bias) nor at least " << kRelativeBuckets
                     << " (the buckets the attention looks up)");
    FTBERT_CHECK(!disentangled.on || (disentangled.max_relative_positions >= 1 &&
                                      (disentangled.position_buckets <= 0 ||
                                       disentangled.position_buckets >= 2)),
                 "config: disentangled.max_relative_positions must be at least 1 and "
                 "position_buckets at least 2 (or <= 0: none), got "
                     << disentangled.max_relative_positions << " and "
                     << disentangled.position_buckets);
    if (head.kind != HeadKind::kNone) {
      FTBERT_CHECK(head.num_labels > 0,
                   "config: head.num_labels must be positive, got " << head.num_labels);
      FTBERT_CHECK(!head.reads_pooler || (head.kind == HeadKind::kSequence && has_pooler),
                   "config: only a sequence head of a model with a pooler reads the pooler");
      FTBERT_CHECK(!head.norm || head.has_dense(), "config: a head's norm follows its own dense");
      FTBERT_CHECK(!head.reads_mean || (head.kind == HeadKind::kSequence && !head.reads_pooler),
                   "config: only a sequence head with a dense of its own reads the tokens' mean");
      FTBERT_CHECK(!head.reads_late_mean || (head.kind == HeadKind::kSequence && !head.reads_pooler),
                   "config: only a sequence head with a dense of its own averages it over the tokens");
    }
  }
};

// The engine config's keys, each written once: config_from_values reads through this table, and
// weights_tools/layout.py takes its key lists from it (the bound module's engine_config_keys).
enum class ConfigType : int { kInt, kNumber, kString, kBool, kObject };

// One value as a reader found it: `present` false where the key is absent or null.
struct ConfigValue {
  bool present = false;
  int64_t integer = 0;  // kInt
  double number = 0;    // kNumber
  bool flag = false;    // kBool
  std::string text;     // kString
};

struct ConfigKey {
  const char* object;  // "" at the top level, else the object key holding it ("layer", "head")
  const char* name;
  ConfigType type;
  // Every config has it (within its object). Otherwise conversions older than the key lack it,
  // or it may be null, and its absence has the meaning config_from_values gives it.
  bool required;
  // Written in ftbert_config.json; false for what the loader adds (the architecture unit, named
  // by the family table).
  bool in_file;
  void (*set)(ModelConfig& c, const ConfigValue& v);  // called where the value is present
};

const std::vector<ConfigKey>& engine_config_keys();

// Reads `key` wherever the config lives (the binding: a Python dict), as key.type.
using ConfigLookup = std::function<ConfigValue(const ConfigKey& key)>;

// The config the keys describe, with the meaning of absent ones filled in; a missing required key
// or a value the engine does not run is an InputError naming it.
ModelConfig config_from_values(const ConfigLookup& lookup);

}  // namespace ftbert
