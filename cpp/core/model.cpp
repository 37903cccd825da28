// What every architecture unit shares: the config and dtype checks, and the choice of the unit
// (cpp/core/models/models.h).
#include "ftbert/model.h"

#include <string>

#include "core/models/models.h"
#include "ftbert/attention.h"
#include "ftbert/check.h"

namespace ftbert {

Model::Model(const ModelConfig& config, const Backend& backend, DType compute)
    : config_(config), dtype_(compute) {
  config_.validate();
  const std::string unsupported = backend.dtype_unsupported_reason(compute);
  FTBERT_CHECK(unsupported.empty(), unsupported);
}

size_t Model::attention_scratch_bytes(AttentionKind kind, int batch, int seq,
                                      int64_t /*rows*/) const {
  return attention_workspace_bytes(kind, dtype_, batch, seq, config_.num_heads,
                                   config_.head_dim());
}

std::vector<std::string> model_architectures() {
  std::vector<std::string> names;
  for (const ArchitectureUnit& unit : kArchitectures) names.emplace_back(unit.name);
  return names;
}

std::unique_ptr<Model> create_model(const ModelConfig& config, const HostWeights& weights,
                                    Backend* backend, DType compute) {
  // Only the deberta unit reads it: any other would run without the terms, and without positions.
  FTBERT_CHECK_INPUT(!config.disentangled.on || config.architecture == "deberta",
                     "config: architecture '" << config.architecture << "' has no disentangled "
                     "attention, but the config has a \"disentangled\" object (DeBERTa's runs as "
                     "'deberta')");
  for (const ArchitectureUnit& unit : kArchitectures) {
    if (config.architecture == unit.name) return unit.create(config, weights, backend, compute);
  }
  std::string known;
  for (const std::string& name : model_architectures()) known += (known.empty() ? "" : ", ") + name;
  FTBERT_FAIL("config: architecture '" << config.architecture << "' is not one this build runs ("
                                        << known << ")");
}

}  // namespace ftbert
