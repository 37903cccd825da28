// The architecture units (one file each in this folder) and the table create_model reads.
// Adding an architecture: a file here with its Model subclass and a create_<name> function, a row
// in kArchitectures, and the family rows that name it (weights_tools/families.py).
#pragma once

#include <memory>

#include "ftbert/model.h"

namespace ftbert {

using CreateModel = std::unique_ptr<Model> (*)(const ModelConfig& config,
                                               const HostWeights& weights, Backend* backend,
                                               DType compute);

std::unique_ptr<Model> create_bert(const ModelConfig& config, const HostWeights& weights,
                                   Backend* backend, DType compute);

std::unique_ptr<Model> create_mpnet(const ModelConfig& config, const HostWeights& weights,
                                    Backend* backend, DType compute);

std::unique_ptr<Model> create_rotary_bert(const ModelConfig& config, const HostWeights& weights,
                                          Backend* backend, DType compute);

std::unique_ptr<Model> create_eurobert(const ModelConfig& config, const HostWeights& weights,
                                       Backend* backend, DType compute);

std::unique_ptr<Model> create_deberta(const ModelConfig& config, const HostWeights& weights,
                                      Backend* backend, DType compute);

std::unique_ptr<Model> create_modernbert(const ModelConfig& config, const HostWeights& weights,
                                         Backend* backend, DType compute);

struct ArchitectureUnit {
  const char* name;  // ModelConfig::architecture, the engine config's "architecture"
  CreateModel create;
};

inline constexpr ArchitectureUnit kArchitectures[] = {
    {"bert", create_bert},
    {"mpnet", create_mpnet},
    {"rotary_bert", create_rotary_bert},
    {"modernbert", create_modernbert},
    {"eurobert", create_eurobert},
    {"deberta", create_deberta},
};

}  // namespace ftbert
