// Backend creation. The CUDA backend is a separate shared library (libftbert_cuda.so) beside this
// one, opened only when a CUDA device is asked for: a build with CUDA then still imports and runs
// the CPU backend on a machine with no GPU, driver or cuBLAS.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "cpu/cpu_backend.h"
#include "ftbert/backend.h"
#include "ftbert/check.h"

namespace ftbert {

std::string Backend::attention_unsupported_reason(AttentionKind kind, DType dt,
                                                  int head_dim) const {
  if (supports_attention(kind, dt, head_dim)) return "";
  return std::string(attention_kind_name(kind)) + " attention is not available on the " + name() +
         " backend";
}

void Backend::flash_attention(DType dt, const void*, const void*, void*, const SequenceLayout&,
                              int, int head_dim, float, const AttentionOptions&) {
  FTBERT_FAIL("flash attention cannot run here: "
              << attention_unsupported_reason(AttentionKind::kFlash, dt, head_dim));
}

Quantization quantization_from_string(const std::string& name) {
  if (name == "none") return Quantization::kNone;
  if (name == "int8") return Quantization::kInt8;
  if (name == "fp8") return Quantization::kFp8;
  throw InputError("unknown quantization '" + name + "': expected 'none', 'int8' or 'fp8'");
}

const char* quantization_name(Quantization q) {
  switch (q) {
    case Quantization::kInt8: return "int8";
    case Quantization::kFp8: return "fp8";
    default: return "none";
  }
}

void check_gemm_choice_mode(const std::string& mode) {
  FTBERT_CHECK_INPUT(mode == "auto" || mode == "fixed",
                     "gemm choice must be 'auto' or 'fixed', got '" << mode << "'");
}

void Backend::pack_sequences(const int32_t* mask, int batch, int seq, int32_t* cu_seqlens,
                             int32_t* token_index, int64_t capacity, int32_t* first_unattended) {
  pack_sequences_host(mask, batch, seq, cu_seqlens, token_index, capacity);
  if (first_unattended != nullptr) {
    *first_unattended = 0;
    for (int64_t b = 0; b < batch; ++b) *first_unattended |= mask[b * seq] == 0;
  }
}

int32_t* Device::allocate_host_flag(size_t words) { return new int32_t[words](); }

void Device::free_host_flag(int32_t* flag) noexcept { delete[] flag; }

void Device::replay(const RecordedOps&, const std::vector<Redirect>&) {
  FTBERT_FAIL("the " << name() << " backend records no ops, so it has nothing to replay");
}

namespace {

// The folder holding this library: the CUDA backend is installed beside it.
std::string this_library_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&this_library_dir), &info) == 0 || !info.dli_fname) return ".";
  std::string path = info.dli_fname;
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

using CreateCudaBackend = Backend* (*)(int device_index);

CreateCudaBackend load_cuda_factory() {
  static CreateCudaBackend factory = nullptr;
  static std::string load_error;
  static bool tried = false;
  if (!tried) {
    tried = true;
    const std::string path = this_library_dir() + "/libftbert_cuda.so";
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* err = dlerror();
      load_error = std::string(err ? err : "unknown dlopen error");
      if (load_error.find("libftbert_cuda.so: cannot open shared object file") != std::string::npos)
        load_error = "this build of ftbert has no CUDA backend (it was built without nvcc/cuBLAS; "
                     "rebuild on a machine with the CUDA toolkit and cuBLAS)";
      else
        load_error = "the CUDA backend library could not be loaded: " + load_error;
    } else {
      factory = reinterpret_cast<CreateCudaBackend>(dlsym(lib, "ftbert_create_cuda_backend"));
      if (!factory) load_error = "libftbert_cuda.so has no ftbert_create_cuda_backend symbol";
    }
  }
  FTBERT_CHECK(factory != nullptr, "device 'cuda' is not available: " << load_error);
  return factory;
}

}  // namespace

bool cuda_backend_built() {
  const std::string path = this_library_dir() + "/libftbert_cuda.so";
  return access(path.c_str(), F_OK) == 0;
}

std::unique_ptr<Backend> create_backend(const std::string& device) {
  if (device == "cpu") return std::make_unique<CpuBackend>();
  if (device == "cuda" || device.rfind("cuda:", 0) == 0) {
    int index = 0;
    if (device.size() > 5) {
      const std::string digits = device.substr(5);
      FTBERT_CHECK(!digits.empty() && digits.find_first_not_of("0123456789") == std::string::npos,
                   "bad device '" << device << "': expected 'cuda' or 'cuda:N'");
      index = std::atoi(digits.c_str());
    }
    return std::unique_ptr<Backend>(load_cuda_factory()(index));
  }
  FTBERT_FAIL("unknown device '" << device << "': expected 'cpu', 'cuda' or 'cuda:N'");
}

}  // namespace ftbert
