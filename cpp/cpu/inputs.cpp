// Input staging on the CPU: the reference for the CUDA kernel (the rules: staged_inputs.h).
#include "cpu/cpu_backend.h"
#include "ftbert/staged_inputs.h"

namespace ftbert {

void CpuBackend::stage_inputs(const void* ids, int ids_bytes, const void* mask, int mask_bytes,
                              const void* types, int types_bytes, int64_t n, int32_t* ids_out,
                              int32_t* mask_out, int32_t* types_out, int vocab, int type_vocab,
                              BadInputValue* bad) {
  for (int64_t i = 0; i < n; ++i) {
    int64_t value = 0;
    const int32_t field = stage_position(ids, ids_bytes, mask, mask_bytes, types, types_bytes, i,
                                         ids_out, mask_out, types_out, vocab, type_vocab, &value);
    if (field == BadInputValue::kNone || bad == nullptr) continue;
    int32_t free_claim = 0;
    if (__atomic_compare_exchange_n(&bad->claim, &free_claim, 1, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
      bad->value = value;
      __atomic_store_n(&bad->field, field, __ATOMIC_RELEASE);
    }
  }
}

}  // namespace ftbert
