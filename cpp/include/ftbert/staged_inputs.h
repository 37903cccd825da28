// The value rules of a forward's inputs, once for both backends' stage_inputs (Backend): the CPU
// loop and the CUDA kernel stage each position with stage_position.
#pragma once

#include <cstdint>

#include "ftbert/backend.h"

#if defined(__CUDACC__)
#define FTBERT_HOST_DEVICE __host__ __device__
#else
#define FTBERT_HOST_DEVICE
#endif

namespace ftbert {

// Value i of an input whose values are `bytes` wide: 8 int64, 1 uint8 (and bool), else int32.
FTBERT_HOST_DEVICE inline int64_t input_value(const void* p, int bytes, int64_t i) {
  if (bytes == 8) return static_cast<const int64_t*>(p)[i];
  if (bytes == 1) return static_cast<const uint8_t*>(p)[i];
  return static_cast<const int32_t*>(p)[i];
}

// Writes position i's three int32 values (an out-of-range one as 0) and returns the field of the
// first bad one (BadInputValue::kNone when all are good), its value in *bad_value. A null mask
// reads as 1 (packed inputs: every position is a token), null types as 0.
FTBERT_HOST_DEVICE inline int32_t stage_position(const void* ids, int ids_bytes, const void* mask,
                                                 int mask_bytes, const void* types, int types_bytes,
                                                 int64_t i, int32_t* ids_out, int32_t* mask_out,
                                                 int32_t* types_out, int vocab, int type_vocab,
                                                 int64_t* bad_value) {
  const int64_t id = input_value(ids, ids_bytes, i);
  const int64_t m = mask != nullptr ? input_value(mask, mask_bytes, i) : 1;
  const int64_t t = types != nullptr ? input_value(types, types_bytes, i) : 0;
  const bool id_ok = id >= 0 && id < vocab, m_ok = m == 0 || m == 1, t_ok = t >= 0 && t < type_vocab;
  ids_out[i] = id_ok ? static_cast<int32_t>(id) : 0;
  mask_out[i] = m_ok ? static_cast<int32_t>(m) : 0;
  types_out[i] = t_ok ? static_cast<int32_t>(t) : 0;
  if (!id_ok) {
    *bad_value = id;
    return BadInputValue::kInputIds;
  }
  if (!t_ok) {
    *bad_value = t;
    return BadInputValue::kTokenTypeIds;
  }
  if (!m_ok) {
    *bad_value = m;
    return BadInputValue::kAttentionMask;
  }
  return BadInputValue::kNone;
}

}  // namespace ftbert
