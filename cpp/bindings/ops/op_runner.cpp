// Op-level entry points for tests and kernel benchmarks: each backend op on numpy arrays.
// Inputs arrive as float32 (ids and masks int32), are rounded to the requested dtype on upload, and
// outputs come back as float32, so one test can hold every backend to the same reference.
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings/bindings.h"
#include "ftbert/attention.h"
#include "ftbert/backend.h"
#include "ftbert/check.h"
#include "ftbert/host_convert.h"
#include "ftbert/sequences.h"
#include "ftbert/weights.h"

namespace ftbert::bindings {

namespace {

using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;
using I32Array = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

Activation activation_from_name(const std::string& name) {
  if (name == "gelu") return Activation::kGeluErf;
  if (name == "gelu_tanh") return Activation::kGeluTanh;
  if (name == "relu") return Activation::kRelu;
  if (name == "tanh") return Activation::kTanh;
  if (name == "identity") return Activation::kIdentity;
  if (name == "silu") return Activation::kSilu;
  throw InputError("unknown activation '" + name +
                   "': expected gelu, gelu_tanh, relu, tanh, identity or silu");
}

AttentionKind kind_from_name(const std::string& name) {
  if (name == "unfused") return AttentionKind::kUnfused;
  if (name == "flash") return AttentionKind::kFlash;
  throw InputError("unknown attention kind '" + name + "': expected 'unfused' or 'flash'");
}

std::vector<py::ssize_t> shape_of(const py::array& a) {
  return std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim());
}

class OpRunner {
 public:
  explicit OpRunner(const std::string& device) : backend_(create_backend(device)) {}
  Backend& backend() { return *backend_; }

  // A device copy of a float32 array in dtype `dt`.
  DeviceBuffer upload(const F32Array& a, DType dt) {
    const size_t n = static_cast<size_t>(a.size());
    std::vector<unsigned char> host(n * dtype_size(dt));
    convert_host(a.data(), DType::kFloat32, host.data(), dt, n);
    DeviceBuffer buf(backend_.get(), host.size());
    backend_->copy_to_device(buf.data(), host.data(), host.size());
    return buf;
  }
  DeviceBuffer upload_ints(const I32Array& a) {
    DeviceBuffer buf(backend_.get(), a.size() * sizeof(int32_t));
    backend_->copy_to_device(buf.data(), a.data(), a.size() * sizeof(int32_t));
    return buf;
  }
  DeviceBuffer empty(size_t n, DType dt) { return DeviceBuffer(backend_.get(), n * dtype_size(dt)); }

  // A layout over a [B, S] mask: padded (mask uploaded), or packed by the backend's own
  // pack_sequences from it. The buffers live as long as this value.
  struct Layout {
    DeviceBuffer mask, cu_seqlens, token_index;
    SequenceLayout layout;
    int64_t tokens = 0;
  };
  // An optional relative position bias [heads, 2·span − 1] in float32 (AttentionOptions).
  struct Options {
    std::optional<DeviceBuffer> bias;
    AttentionOptions options;
  };
  Options attention_options(const std::optional<F32Array>& relative_bias, int heads, int seq,
                            int window = 0) {
    Options o;
    FTBERT_CHECK_INPUT(window >= 0, "window must be >= 0 (0: every key)");
    o.options.window = window;
    if (!relative_bias) return o;
    const F32Array& t = *relative_bias;
    FTBERT_CHECK_INPUT(t.ndim() == 2 && t.shape(0) == heads && t.shape(1) % 2 == 1 &&
                           (t.shape(1) + 1) / 2 >= seq,
                       "relative_bias must be [heads, 2·span − 1] with span >= the sequence length");
    o.bias = upload(t, DType::kFloat32);
    o.options.relative_bias = o.bias->as<float>();
    o.options.relative_span = static_cast<int>((t.shape(1) + 1) / 2);
    return o;
  }

  Layout layout(const I32Array& mask, bool packed) {
    FTBERT_CHECK_INPUT(mask.ndim() == 2, "mask must be 2-D [batch, seq]");
    Layout l;
    const int B = mask.shape(0), S = mask.shape(1);
    l.mask = upload_ints(mask);
    l.layout = SequenceLayout::padded(B, S, l.mask.as<int32_t>());
    l.tokens = static_cast<int64_t>(B) * S;
    if (!packed) return l;
    l.tokens = 0;
    for (py::ssize_t i = 0; i < mask.size(); ++i) l.tokens += mask.data()[i] != 0;
    l.cu_seqlens = DeviceBuffer(backend_.get(), (B + 1) * sizeof(int32_t));
    l.token_index = DeviceBuffer(backend_.get(), static_cast<size_t>(B) * S * sizeof(int32_t));
    backend_->pack_sequences(l.mask.as<int32_t>(), B, S, l.cu_seqlens.as<int32_t>(),
                             l.token_index.as<int32_t>(), static_cast<int64_t>(B) * S);
    l.layout.cu_seqlens = l.cu_seqlens.as<int32_t>();
    l.layout.token_index = l.token_index.as<int32_t>();
    l.layout.rows = static_cast<int>(l.tokens);
    return l;
  }

  // Packed over `mask` when one is given, else padded [B, S] with no mask (ops that read none).
  Layout layout_for(const std::optional<I32Array>& mask, int batch, int seq) {
    if (mask) {
      FTBERT_CHECK_INPUT(mask->ndim() == 2 && mask->shape(0) == batch && mask->shape(1) == seq,
                         "mask must be [" << batch << ", " << seq << "]");
      return layout(*mask, true);
    }
    Layout l;
    l.layout = SequenceLayout::padded(batch, seq, nullptr);
    l.tokens = static_cast<int64_t>(batch) * seq;
    return l;
  }

  // float32 numpy array of `shape` from a device buffer in dtype `dt`.
  py::array_t<float> download(const DeviceBuffer& buf, DType dt, std::vector<py::ssize_t> shape) {
    py::array_t<float> out(shape);
    const size_t n = static_cast<size_t>(out.size());
    std::vector<unsigned char> host(n * dtype_size(dt));
    backend_->copy_to_host(host.data(), buf.data(), host.size());
    backend_->synchronize();
    convert_host(host.data(), dt, out.mutable_data(), DType::kFloat32, n);
    return out;
  }

 private:
  std::unique_ptr<Backend> backend_;
};

void require_ndim(const py::array& a, int ndim, const char* what) {
  FTBERT_CHECK_INPUT(a.ndim() == ndim, what << " must be " << ndim << "-D, got " << a.ndim() << "-D");
}

// An op's non-finite flag when a test asks for it (report_nonfinite): a device int32 zeroed
// before the op and read after it; none otherwise (the op's nullptr).
class NonfiniteFlag {
 public:
  NonfiniteFlag(OpRunner& r, bool wanted) : r_(r) {
    if (!wanted) return;
    const int32_t zero = 0;
    flag_ = DeviceBuffer(&r.backend(), sizeof(zero));
    r.backend().copy_to_device(flag_.data(), &zero, sizeof(zero));
  }
  int32_t* device() const { return flag_.as<int32_t>(); }
  // out, or (out, flagged) when the flag was asked for.
  py::object result(py::array_t<float> out) const {
    if (flag_.bytes() == 0) return out;
    int32_t flagged = 0;
    r_.backend().copy_to_host(&flagged, flag_.data(), sizeof(flagged));
    r_.backend().synchronize();
    return py::make_tuple(out, flagged != 0);
  }

 private:
  OpRunner& r_;
  DeviceBuffer flag_;
};

// A weight GEMM's operands on the device: a [m, k] and bias [n] uploaded, W [k, n] through
// upload_weight (the backend's layout), c [m, n] allocated. `op` names the caller in errors.
struct WeightGemmOperands {
  int m = 0, n = 0, k = 0;
  DeviceBuffer a, w, c, bias;  // bias empty without one
};
WeightGemmOperands weight_gemm_operands(OpRunner& r, const char* op, DType dt, const F32Array& a,
                                        const F32Array& w, const std::optional<F32Array>& bias) {
  require_ndim(a, 2, "a");
  require_ndim(w, 2, "w");
  WeightGemmOperands o;
  o.m = a.shape(0), o.k = a.shape(1), o.n = w.shape(1);
  FTBERT_CHECK_INPUT(w.shape(0) == o.k, op << ": inner dimensions differ (" << o.k << " vs " << w.shape(0) << ")");
  if (bias) {
    FTBERT_CHECK_INPUT(bias->ndim() == 1 && bias->shape(0) == o.n, op << ": bias must be [" << o.n << "]");
  }
  const std::string why = r.backend().quantization_unsupported_reason(r.backend().quantization(), dt);
  FTBERT_CHECK_INPUT(why.empty(), op << ": " << why);
  std::vector<unsigned char> host(static_cast<size_t>(w.size()) * dtype_size(dt));
  convert_host(w.data(), DType::kFloat32, host.data(), dt, w.size());
  o.w = DeviceBuffer(&r.backend(), r.backend().weight_bytes(dt, o.k, o.n));
  r.backend().upload_weight(dt, host.data(), o.k, o.n, o.w.data());
  o.a = r.upload(a, dt);
  o.c = r.empty(static_cast<size_t>(o.m) * o.n, dt);
  if (bias) o.bias = r.upload(*bias, dt);
  return o;
}

// The rows of x [B, S, W] where mask [B, S] is set, in order: [T, W] (a packed batch).
F32Array pack_rows(const F32Array& x, const I32Array& mask) {
  require_ndim(x, 3, "x");
  FTBERT_CHECK_INPUT(mask.ndim() == 2 && mask.shape(0) == x.shape(0) && mask.shape(1) == x.shape(1),
                     "mask must be [B, S] for x [B, S, W]");
  const py::ssize_t W = x.shape(2);
  std::vector<py::ssize_t> rows;
  for (py::ssize_t i = 0; i < mask.size(); ++i)
    if (mask.data()[i] != 0) rows.push_back(i);
  F32Array out(std::vector<py::ssize_t>{static_cast<py::ssize_t>(rows.size()), W});
  for (size_t r = 0; r < rows.size(); ++r)
    std::copy(x.data() + rows[r] * W, x.data() + (rows[r] + 1) * W, out.mutable_data() + r * W);
  return out;
}

}  // namespace

void register_op_runner(py::module_& m) {
  py::class_<OpRunner>(m, "OpRunner")
      .def(py::init<const std::string&>(), py::arg("device"))
      .def_property_readonly("backend", [](OpRunner& r) { return r.backend().name(); })
      .def("supports_attention",
           [](OpRunner& r, const std::string& kind, const std::string& dtype, int head_dim) {
             return r.backend().supports_attention(kind_from_name(kind), dtype_from_string(dtype),
                                                   head_dim);
           })
      .def("gemm",
           [](OpRunner& r, const std::string& dtype, const F32Array& a, const F32Array& b,
              bool trans_a, bool trans_b, float alpha) {
             const DType dt = dtype_from_string(dtype);
             require_ndim(a, 2, "a");
             require_ndim(b, 2, "b");
             const int m = trans_a ? a.shape(1) : a.shape(0), k = trans_a ? a.shape(0) : a.shape(1);
             const int kb = trans_b ? b.shape(1) : b.shape(0), n = trans_b ? b.shape(0) : b.shape(1);
             FTBERT_CHECK_INPUT(k == kb, "gemm: inner dimensions differ (" << k << " vs " << kb << ")");
             auto da = r.upload(a, dt), db = r.upload(b, dt);
             auto dc = r.empty(static_cast<size_t>(m) * n, dt);
             r.backend().gemm(dt, trans_a, trans_b, m, n, k, da.data(), a.shape(1), db.data(),
                              b.shape(1), dc.data(), n, alpha, 0.0f);
             return r.download(dc, dt, {m, n});
           },
           py::arg("dtype"), py::arg("a"), py::arg("b"), py::arg("trans_a") = false,
           py::arg("trans_b") = false, py::arg("alpha") = 1.0f)
      // How weight_gemm keeps the weights it uploads from now on (Backend::set_quantization).
      .def_property(
          "quantization",
          [](OpRunner& r) { return std::string(quantization_name(r.backend().quantization())); },
          [](OpRunner& r, const std::string& q) { r.backend().set_quantization(quantization_from_string(q)); })
      // Whether the backend's kernels keep each row's arithmetic independent of the row count
      // (Backend::set_batch_invariant), for the op tests and the GEMM class check.
      .def_property(
          "batch_invariant", [](OpRunner& r) { return r.backend().batch_invariant(); },
          [](OpRunner& r, bool on) { r.backend().set_batch_invariant(on); })
      // c = act(a · w + bias) through the backend's weight path: w [k, n] uploaded with
      // upload_weight (the backend's packed layout), multiplied by weight_gemm `repeat` times (for
      // kernel timing).
      .def("weight_gemm",
           [](OpRunner& r, const std::string& dtype, const F32Array& a, const F32Array& w, int repeat,
              const std::optional<F32Array>& bias, const std::string& act) {
             const DType dt = dtype_from_string(dtype);
             FTBERT_CHECK_INPUT(repeat >= 1, "weight_gemm: repeat must be at least 1");
             const Activation activation = activation_from_name(act);
             WeightGemmOperands o = weight_gemm_operands(r, "weight_gemm", dt, a, w, bias);
             {
               py::gil_scoped_release release;
               for (int i = 0; i < repeat; ++i)
                 r.backend().weight_gemm(dt, o.m, o.n, o.k, o.a.data(), o.k, o.w.data(),
                                         o.c.data(), o.n, bias ? o.bias.data() : nullptr,
                                         activation);
             }
             return r.download(o.c, dt, {o.m, o.n});
           },
           py::arg("dtype"), py::arg("a"), py::arg("w"), py::arg("repeat") = 1,
           py::arg("bias") = std::nullopt, py::arg("act") = "identity")
      // The weight GEMM's kernel choice (gemm_choice.h; backends with one kernel per shape have
      // none: both modes accepted, "fixed" reported, no candidates): the mode, a shape's
      // candidates, the pick "auto" made for it, and one run of a named candidate; `act` names
      // the epilogue ("identity": none; otherwise act(a · w + bias), a bias given).
      .def("set_gemm_choice",
           [](OpRunner& r, const std::string& mode) {
             check_gemm_choice_mode(mode);
             if (GemmChoiceControl* c = r.backend().gemm_choice_control()) c->set_mode(mode);
           },
           py::arg("mode"))
      .def_property_readonly("gemm_choice",
                             [](OpRunner& r) {
                               GemmChoiceControl* c = r.backend().gemm_choice_control();
                               return c != nullptr ? c->mode() : std::string("fixed");
                             })
      .def("wait_for_tuning", [](OpRunner& r) { r.backend().wait_for_tuning(); },
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("tuning_counters",
                             [](OpRunner& r) { return r.backend().tuning_counters(); })
      .def("weight_gemm_candidates",
           [](OpRunner& r, const std::string& dtype, int m, int n, int k, const std::string& act) {
             GemmChoiceControl* c = r.backend().gemm_choice_control();
             return c != nullptr ? c->candidates(dtype_from_string(dtype), m, n, k,
                                                 activation_from_name(act))
                                 : std::vector<std::string>{};
           },
           py::arg("dtype"), py::arg("m"), py::arg("n"), py::arg("k"), py::arg("act") = "identity")
      .def("weight_gemm_pick",
           [](OpRunner& r, const std::string& dtype, int m, int n, int k, const std::string& act) {
             GemmChoiceControl* c = r.backend().gemm_choice_control();
             return c != nullptr ? c->pick(dtype_from_string(dtype), m, n, k, activation_from_name(act))
                                 : std::string();
           },
           py::arg("dtype"), py::arg("m"), py::arg("n"), py::arg("k"), py::arg("act") = "identity")
      .def("weight_gemm_candidate",
           [](OpRunner& r, const std::string& name, const std::string& dtype, const F32Array& a,
              const F32Array& w, const std::optional<F32Array>& bias, const std::string& act) {
             const DType dt = dtype_from_string(dtype);
             const Activation activation = activation_from_name(act);
             FTBERT_CHECK_INPUT(bias.has_value() == (activation != Activation::kIdentity),
                                "weight_gemm_candidate: act '" << act << "' "
                                << (bias ? "with a bias" : "without a bias")
                                << ": a bias comes with an activation other than identity");
             WeightGemmOperands o = weight_gemm_operands(r, "weight_gemm_candidate", dt, a, w, bias);
             bool ran = false;
             if (GemmChoiceControl* c = r.backend().gemm_choice_control()) {
               py::gil_scoped_release release;
               ran = c->run_candidate(name, dt, o.m, o.n, o.k, o.a.data(), o.w.data(), o.c.data(),
                                      bias ? o.bias.data() : nullptr, activation);
             }
             FTBERT_CHECK_INPUT(ran, "weight_gemm_candidate: '" << name << "' cannot run a "
                                << dtype << " [" << o.m << ", " << o.k << "] x [" << o.k << ", "
                                << o.n << "] GEMM" << (bias ? " with bias + " + act : "") << " here");
             return r.download(o.c, dt, {o.m, o.n});
           },
           py::arg("name"), py::arg("dtype"), py::arg("a"), py::arg("w"),
           py::arg("bias") = std::nullopt, py::arg("act") = "identity")
      // out = LN(a · w + bias + residual) · gamma + beta through the backend's weight path, with
      // the workspace the backend asks for (`workspace` false: none, the unsplit path);
      // report_nonfinite: (out, flagged) as add_bias_residual_layernorm; product: the GEMM's
      // output in a buffer of its own, so that only the LayerNorm writes out.
      .def("dense_residual_layernorm",
           [](OpRunner& r, const std::string& dtype, const F32Array& a, const F32Array& w,
              const F32Array& bias, const F32Array& residual, const F32Array& gamma,
              const F32Array& beta, float eps, bool workspace, bool report_nonfinite,
              bool product, bool codes) -> py::object {
             const DType dt = dtype_from_string(dtype);
             require_ndim(a, 2, "a");
             require_ndim(w, 2, "w");
             require_ndim(residual, 2, "residual");
             const int m = a.shape(0), k = a.shape(1), n = w.shape(1);
             FTBERT_CHECK_INPUT(w.shape(0) == k, "dense_residual_layernorm: inner dimensions differ (" << k << " vs " << w.shape(0) << ")");
             FTBERT_CHECK_INPUT(residual.shape(0) == m && residual.shape(1) == n, "dense_residual_layernorm: residual must be [" << m << ", " << n << "]");
             for (const F32Array* v : {&bias, &gamma, &beta}) {
               FTBERT_CHECK_INPUT(v->ndim() == 1 && v->shape(0) == n, "dense_residual_layernorm: bias, gamma and beta must be [" << n << "]");
             }
             WeightGemmOperands o =
                 weight_gemm_operands(r, "dense_residual_layernorm", dt, a, w, bias);
             auto dr = r.upload(residual, dt), dg = r.upload(gamma, dt), dbe = r.upload(beta, dt);
             const size_t ws_bytes =
                 workspace ? r.backend().dense_residual_layernorm_workspace_bytes(m, n) : 0;
             DeviceBuffer ws = ws_bytes > 0 ? DeviceBuffer(&r.backend(), ws_bytes) : DeviceBuffer();
             DeviceBuffer prod = product ? DeviceBuffer(&r.backend(),
                                                        static_cast<size_t>(m) * n * dtype_size(dt))
                                         : DeviceBuffer();
             // codes: out's rows as the next weight GEMM reads them (Backend::gemm_input_codes_bytes),
             // returned as (out, codes [m, n] uint8, scales [m] float32).
             const size_t codes_bytes = codes ? r.backend().gemm_input_codes_bytes(m, n) : 0;
             FTBERT_CHECK_INPUT(!codes || codes_bytes > 0,
                                "dense_residual_layernorm: this backend and quantization write no "
                                "quantized rows of width " << n);
             DeviceBuffer dcodes = codes_bytes > 0 ? DeviceBuffer(&r.backend(), codes_bytes)
                                                   : DeviceBuffer();
             const NonfiniteFlag flag(r, report_nonfinite);
             r.backend().dense_residual_layernorm(dt, m, n, k, o.a.data(), o.w.data(),
                                                  o.bias.data(), dr.data(), dg.data(), dbe.data(),
                                                  o.c.data(), eps, ws.data(), ws.bytes(),
                                                  flag.device(), prod.data(), dcodes.data());
             py::object out = flag.result(r.download(o.c, dt, {m, n}));
             if (!codes) return out;
             py::array_t<uint8_t> q({static_cast<py::ssize_t>(m), static_cast<py::ssize_t>(n)});
             py::array_t<float> scales(static_cast<py::ssize_t>(m));
             const size_t q_bytes = static_cast<size_t>(m) * n;
             r.backend().copy_to_host(q.mutable_data(), dcodes.data(), q_bytes);
             r.backend().copy_to_host(scales.mutable_data(),
                                      static_cast<const char*>(dcodes.data()) + codes_bytes -
                                          static_cast<size_t>(m) * sizeof(float),
                                      static_cast<size_t>(m) * sizeof(float));
             r.backend().synchronize();
             return py::make_tuple(out, q, scales);
           },
           py::arg("dtype"), py::arg("a"), py::arg("w"), py::arg("bias"), py::arg("residual"),
           py::arg("gamma"), py::arg("beta"), py::arg("eps") = 1e-12f, py::arg("workspace") = true,
           py::arg("report_nonfinite") = false, py::arg("product") = false,
           py::arg("codes") = false)
      .def("batched_gemm",
           [](OpRunner& r, const std::string& dtype, const F32Array& a, const F32Array& b,
              bool trans_a, bool trans_b, float alpha) {
             const DType dt = dtype_from_string(dtype);
             require_ndim(a, 3, "a");
             require_ndim(b, 3, "b");
             FTBERT_CHECK_INPUT(a.shape(0) == b.shape(0), "batched_gemm: batch sizes differ");
             const int batch = a.shape(0);
             const int m = trans_a ? a.shape(2) : a.shape(1), k = trans_a ? a.shape(1) : a.shape(2);
             const int kb = trans_b ? b.shape(2) : b.shape(1), n = trans_b ? b.shape(1) : b.shape(2);
             FTBERT_CHECK_INPUT(k == kb, "batched_gemm: inner dimensions differ");
             auto da = r.upload(a, dt), db = r.upload(b, dt);
             auto dc = r.empty(static_cast<size_t>(batch) * m * n, dt);
             r.backend().batched_gemm(dt, trans_a, trans_b, m, n, k, da.data(), a.shape(2),
                                      a.shape(1) * a.shape(2), db.data(), b.shape(2),
                                      b.shape(1) * b.shape(2), dc.data(), n,
                                      static_cast<int64_t>(m) * n, batch, alpha, 0.0f);
             return r.download(dc, dt, {batch, m, n});
           },
           py::arg("dtype"), py::arg("a"), py::arg("b"), py::arg("trans_a") = false,
           py::arg("trans_b") = false, py::arg("alpha") = 1.0f)
      .def("embed_layernorm",
           [](OpRunner& r, const std::string& dtype, const I32Array& ids, const I32Array& types,
              const F32Array& word, const std::optional<F32Array>& position,
              const F32Array& token_type, const F32Array& gamma, const F32Array& beta, float eps,
              int position_pad_id, const std::optional<I32Array>& mask) {
             const DType dt = dtype_from_string(dtype);
             require_ndim(ids, 2, "ids");
             const int B = ids.shape(0), S = ids.shape(1), H = word.shape(1);
             // No position table: none added (rotary models).
             FTBERT_CHECK_INPUT(!position || position->shape(0) >= S + (position_pad_id < 0 ? 0 : position_pad_id + 1),
                                "embed_layernorm: too few positions");
             auto di = r.upload_ints(ids), dtt = r.upload_ints(types);
             std::optional<DeviceBuffer> dp;
             if (position) dp = r.upload(*position, dt);
             auto dw = r.upload(word, dt), dty = r.upload(token_type, dt);
             auto dg = r.upload(gamma, dt), db = r.upload(beta, dt);
             // Packed (a mask given): one row per attended token, [T, H].
             auto l = r.layout_for(mask, B, S);
             auto out = r.empty(static_cast<size_t>(l.layout.rows) * H, dt);
             r.backend().embed_layernorm(dt, di.as<int32_t>(), dtt.as<int32_t>(), dw.data(),
                                         dp ? dp->data() : nullptr, dty.data(), dg.data(), db.data(), out.data(),
                                         l.layout, H, word.shape(0), token_type.shape(0), eps,
                                         position_pad_id);
             if (mask) return r.download(out, dt, {l.layout.rows, H});
             return r.download(out, dt, {B, S, H});
           },
           py::arg("dtype"), py::arg("ids"), py::arg("types"), py::arg("word"), py::arg("position"),
           py::arg("token_type"), py::arg("gamma"), py::arg("beta"), py::arg("eps"),
           py::arg("position_pad_id") = -1, py::arg("mask") = py::none())
      // -> (embedded, RMSNorm output), [B, S, H] each; packed (a mask given), [rows, H] with rows
      // = T, or `rows` (T <= rows <= B·S) for a bucketed recording's layout, whose rows past T
      // come out as zeros. ids_packed: the op reads the attended tokens' ids one per row, as
      // packed callers give them, instead of at their padded positions.
      .def("embed_rmsnorm",
           [](OpRunner& r, const std::string& dtype, const I32Array& ids, const F32Array& word,
              const F32Array& gamma, float eps, const std::optional<I32Array>& mask,
              std::optional<int> rows, bool ids_packed) {
             const DType dt = dtype_from_string(dtype);
             require_ndim(ids, 2, "ids");
             require_ndim(word, 2, "word");
             const int B = ids.shape(0), S = ids.shape(1), H = word.shape(1);
             FTBERT_CHECK_INPUT(gamma.ndim() == 1 && gamma.shape(0) == H,
                                "embed_rmsnorm: gamma must be [" << H << "]");
             FTBERT_CHECK_INPUT(mask || (!rows && !ids_packed),
                                "embed_rmsnorm: rows and ids_packed need a mask (packed rows)");
             auto l = r.layout_for(mask, B, S);
             if (rows) {
               FTBERT_CHECK_INPUT(*rows >= l.tokens && *rows <= static_cast<int64_t>(B) * S,
                                  "embed_rmsnorm: rows must be between T and B*S");
               l.layout.rows = *rows;
               l.layout.bounded = true;
             }
             DeviceBuffer di;
             if (ids_packed) {
               std::vector<int32_t> packed;
               for (py::ssize_t i = 0; i < ids.size(); ++i)
                 if (mask->data()[i] != 0) packed.push_back(ids.data()[i]);
               const size_t bytes = packed.size() * sizeof(int32_t);
               di = DeviceBuffer(&r.backend(), std::max<size_t>(bytes, sizeof(int32_t)));
               r.backend().copy_to_device(di.data(), packed.data(), bytes);
               l.layout.ids_packed = true;
             } else {
               di = r.upload_ints(ids);
             }
             auto dw = r.upload(word, dt), dg = r.upload(gamma, dt);
             const int R = l.layout.rows;
             auto embedded = r.empty(static_cast<size_t>(R) * H, dt);
             auto out = r.empty(static_cast<size_t>(R) * H, dt);
             r.backend().embed_rmsnorm(dt, di.as<int32_t>(), dw.data(), dg.data(), embedded.data(),
                                       out.data(), l.layout, H, word.shape(0), eps);
             std::vector<py::ssize_t> shape{R, H};
             if (!mask) shape = {B, S, H};
             return py::make_tuple(r.download(embedded, dt, shape), r.download(out, dt, shape));
           },
           py::arg("dtype"), py::arg("ids"), py::arg("word"), py::arg("gamma"), py::arg("eps"),
           py::arg("mask") = py::none(), py::arg("rows") = py::none(),
           py::arg("ids_packed") = false)
      .def("add_qkv_bias_transpose",
           [](OpRunner& r, const std::string& dtype, const F32Array& qkv, const F32Array& bias,
              int heads, const std::optional<I32Array>& mask) {
             const DType dt = dtype_from_string(dtype);
             require_ndim(qkv, 3, "qkv");
             const int B = qkv.shape(0), S = qkv.shape(1), H = qkv.shape(2) / 3, d = H / heads;
             FTBERT_CHECK_INPUT(qkv.shape(2) == 3 * H && H == heads * d, "qkv: bad last dimension");
             // Packed (a mask given): the op reads qkv's attended rows only, packed.
             auto l = r.layout_for(mask, B, S);
             auto dq = r.upload(mask ? pack_rows(qkv, *mask) : qkv, dt), dbias = r.upload(bias, dt);
             const size_t n = static_cast<size_t>(B) * S * H;
             auto q = r.empty(n, dt), k = r.empty(n, dt), v = r.empty(n, dt);
             r.backend().add_qkv_bias_transpose(dt, dq.data(), dbias.data(), q.data(), k.data(),
                                                v.data(), l.layout, heads, d);
             return py::make_tuple(r.download(q, dt, {B, heads, S, d}),
                                   r.download(k, dt, {B, heads, S, d}),
                                   r.download(v, dt, {B, heads, S, d}));
           },
           py::arg("dtype"), py::arg("qkv"), py::arg("bias"), py::arg("heads"),
           py::arg("mask") = py::none())
      .def("masked_softmax",
           [](OpRunner& r, const std::string& dtype, const F32Array& scores, const I32Array& mask,
              float scale, bool packed, const std::optional<F32Array>& relative_bias, int window) {
             const DType dt = dtype_from_string(dtype);
             require_ndim(scores, 4, "scores");
             const int B = scores.shape(0), h = scores.shape(1), S = scores.shape(2);
             FTBERT_CHECK_INPUT(scores.shape(3) == S && mask.ndim() == 2 && mask.shape(0) == B &&
                                    mask.shape(1) == S,
                                "masked_softmax: scores must be [B, h, S, S] and mask [B, S]");
             auto ds = r.upload(scores, dt);
             // Packed: keys s < the sequence's length (mask's count) attend.
             auto l = r.layout(mask, packed);
             const auto o = r.attention_options(relative_bias, h, S, window);
             r.backend().masked_softmax(dt, ds.data(), l.layout, h, scale, o.options);
             return r.download(ds, dt, shape_of(scores));
           },
           py::arg("dtype"), py::arg("scores"), py::arg("mask"), py::arg("scale"),
           py::arg("packed") = false, py::arg("relative_bias") = py::none(), py::arg("window") = 0)
      // disentangled_scores on scores [B, h, S, S] with c2p and/or p2c [B·h, S, width] and the
      // column of every distance, column [2P − 1] (P >= S) at index δ + P − 1; the tables' column
      // 0 is column[−(S − 1)], as DisentangledTerms says.
      .def("disentangled_scores",
           [](OpRunner& r, const std::string& dtype, const F32Array& scores, const I32Array& column,
              const std::optional<F32Array>& c2p, const std::optional<F32Array>& p2c) {
             const DType dt = dtype_from_string(dtype);
             require_ndim(scores, 4, "scores");
             require_ndim(column, 1, "column");
             const int B = scores.shape(0), h = scores.shape(1), S = scores.shape(2);
             FTBERT_CHECK_INPUT(scores.shape(3) == S, "disentangled_scores: scores must be [B, h, S, S]");
             FTBERT_CHECK_INPUT(c2p || p2c, "disentangled_scores: needs c2p, p2c or both");
             const F32Array& any = c2p ? *c2p : *p2c;
             require_ndim(any, 3, "c2p / p2c");
             const int width = any.shape(2);
             for (const auto* t : {&c2p, &p2c}) {
               FTBERT_CHECK_INPUT(!*t || ((*t)->ndim() == 3 && (*t)->shape(0) == B * h &&
                                          (*t)->shape(1) == S && (*t)->shape(2) == width),
                                  "disentangled_scores: c2p and p2c must be [B·h, S, width] alike");
             }
             const py::ssize_t P = (column.shape(0) + 1) / 2;
             FTBERT_CHECK_INPUT(S >= 1 && column.shape(0) % 2 == 1 && P >= S,
                                "disentangled_scores: column must be [2P − 1] with P >= S >= 1");
             const int32_t* zero = column.data() + (P - 1);  // δ = 0
             const int first = zero[-(S - 1)];
             // The op reads no bounds: every column a distance |δ| < S names must be in the tables.
             for (int delta = -(S - 1); delta < S; ++delta) {
               FTBERT_CHECK_INPUT(zero[delta] >= first && zero[delta] - first < width,
                                  "disentangled_scores: column[" << delta << "] = " << zero[delta]
                                      << " is outside the tables' columns " << first << " .. "
                                      << first + width - 1);
             }
             auto ds = r.upload(scores, dt);
             auto dcol = r.upload_ints(column);
             std::optional<DeviceBuffer> dc2p, dp2c;
             if (c2p) dc2p = r.upload(*c2p, dt);
             if (p2c) dp2c = r.upload(*p2c, dt);
             DisentangledTerms t;
             t.c2p = dc2p ? dc2p->data() : nullptr;
             t.p2c = dp2c ? dp2c->data() : nullptr;
             t.rows = S;
             t.width = width;
             t.first = first;
             t.column = dcol.as<int32_t>() + (P - 1);
             r.backend().disentangled_scores(dt, ds.data(), B, h, S, t);
             return r.download(ds, dt, shape_of(scores));
           },
           py::arg("dtype"), py::arg("scores"), py::arg("column"), py::arg("c2p") = py::none(),
           py::arg("p2c") = py::none())
      .def("transpose_heads",
           [](OpRunner& r, const std::string& dtype, const F32Array& x,
              const std::optional<I32Array>& mask) {
             const DType dt = dtype_from_string(dtype);
             require_ndim(x, 4, "x");
             const int B = x.shape(0), h = x.shape(1), S = x.shape(2), d = x.shape(3);
             // Packed (a mask given): sequence b's first len_b positions become its rows, [T, H].
             auto l = r.layout_for(mask, B, S);
             auto dx = r.upload(x, dt);
             auto out = r.empty(static_cast<size_t>(l.layout.rows) * h * d, dt);
             r.backend().transpose_heads(dt, dx.data(), out.data(), l.layout, h, d);
             if (mask) return r.download(out, dt, {l.layout.rows, h * d});
             return r.download(out, dt, {B, S, h * d});
           },
           py::arg("dtype"), py::arg("x"), py::arg("mask") = py::none())
      .def("add_bias_residual_layernorm",
           [](OpRunner& r, const std::string& dtype, const F32Array& x, const F32Array& residual,
              const F32Array& bias, const F32Array& gamma, const F32Array& beta, float eps,
              bool report_nonfinite) -> py::object {
             const DType dt = dtype_from_string(dtype);
             require_ndim(x, 2, "x");
             const int M = x.shape(0), H = x.shape(1);
             auto dx = r.upload(x, dt), dr = r.upload(residual, dt), db = r.upload(bias, dt);
             auto dg = r.upload(gamma, dt), dbe = r.upload(beta, dt);
             const NonfiniteFlag flag(r, report_nonfinite);  // (out, flagged) when asked
             r.backend().add_bias_residual_layernorm(dt, dx.data(), dr.data(), db.data(), dg.data(),
                                                     dbe.data(), M, H, eps, flag.device());
             return flag.result(r.download(dx, dt, {M, H}));
           },
           py::arg("dtype"), py::arg("x"), py::arg("residual"), py::arg("bias"), py::arg("gamma"),
           py::arg("beta"), py::arg("eps"), py::arg("report_nonfinite") = false)
      .def("add_bias_activation",
           [](OpRunner& r, const std::string& dtype, const F32Array& x, const F32Array& bias,
              const std::string& act) {
             const DType dt = dtype_from_string(dtype);
             require_ndim(x, 2, "x");
             const int M = x.shape(0), N = x.shape(1);
             auto dx = r.upload(x, dt), db = r.upload(bias, dt);
             r.backend().add_bias_activation(dt, dx.data(), db.data(), M, N, activation_from_name(act));
             return r.download(dx, dt, {M, N});
           })
      .def("first_token_dense",
           [](OpRunner& r, const std::string& dtype, const F32Array& hidden, const F32Array& weight,
              const F32Array& bias, const std::string& act, const std::optional<I32Array>& mask) {
             const DType dt = dtype_from_string(dtype);
             require_ndim(hidden, 3, "hidden");
             require_ndim(weight, 2, "weight");
             const int B = hidden.shape(0), S = hidden.shape(1), H = hidden.shape(2);
             const int N = weight.shape(1);
             FTBERT_CHECK_INPUT(weight.shape(0) == H && bias.size() == N,
                                "first_token_dense: weight must be [H, N] and bias [N]");
             // Packed (a mask given): hidden's attended rows only; a sequence's first token is
             // its first attended one.
             auto l = r.layout_for(mask, B, S);
             auto dh = r.upload(mask ? pack_rows(hidden, *mask) : hidden, dt);
             auto dw = r.upload(weight, dt), db = r.upload(bias, dt);
             auto out = r.empty(static_cast<size_t>(B) * N, dt);
             auto scratch = r.empty(static_cast<size_t>(B) * H, dt);
             r.backend().first_token_dense(dt, dh.data(), l.layout, dw.data(), db.data(),
                                           out.data(), scratch.data(), H, N,
                                           activation_from_name(act));
             return r.download(out, dt, {B, N});
           },
           py::arg("dtype"), py::arg("hidden"), py::arg("weight"), py::arg("bias"), py::arg("act"),
           py::arg("mask") = py::none())
      // The fused attention over qkv [B, S, 3H] (packed: its attended rows only, [T, H] out), run
      // `repeat` times on the same operands (for kernel timing).
      .def("flash_attention",
           [](OpRunner& r, const std::string& dtype, const F32Array& qkv, const F32Array& bias,
              const I32Array& mask, int heads, float scale, bool packed,
              const std::optional<F32Array>& relative_bias, int window, int repeat) {
             FTBERT_CHECK_INPUT(repeat >= 1, "flash_attention: repeat must be at least 1");
             const DType dt = dtype_from_string(dtype);
             require_ndim(qkv, 3, "qkv");
             const int B = qkv.shape(0), S = qkv.shape(1), H = qkv.shape(2) / 3;
             // Packed: qkv's attended rows only in, [T, H] out.
             auto l = r.layout(mask, packed);
             auto dq = r.upload(packed ? pack_rows(qkv, mask) : qkv, dt), db = r.upload(bias, dt);
             auto out = r.empty(static_cast<size_t>(l.layout.rows) * H, dt);
             const auto o = r.attention_options(relative_bias, heads, S, window);
             {
               py::gil_scoped_release release;
               for (int i = 0; i < repeat; ++i)
                 r.backend().flash_attention(dt, dq.data(), db.data(), out.data(), l.layout, heads,
                                             H / heads, scale, o.options);
             }
             if (packed) return r.download(out, dt, {l.layout.rows, H});
             return r.download(out, dt, {B, S, H});
           },
           py::arg("dtype"), py::arg("qkv"), py::arg("bias"), py::arg("mask"), py::arg("heads"),
           py::arg("scale"), py::arg("packed") = false, py::arg("relative_bias") = py::none(),
           py::arg("window") = 0, py::arg("repeat") = 1)
      // rotary_embedding over qkv [B, S, 3H] (packed: its attended rows only, [T, 3H] out) with a
      // [P, d] table of cos | sin; with `dynamic` [P − original, d/2] frequencies (packed only).
      .def("rotary_embedding",
           [](OpRunner& r, const std::string& dtype, const F32Array& qkv, const F32Array& rotary,
              int heads, const std::optional<I32Array>& mask, const std::optional<F32Array>& bias,
              const std::optional<F32Array>& dynamic, int original) {
             const DType dt = dtype_from_string(dtype);
             require_ndim(qkv, 3, "qkv");
             require_ndim(rotary, 2, "rotary");
             const int B = qkv.shape(0), S = qkv.shape(1), H3 = qkv.shape(2);
             FTBERT_CHECK_INPUT(H3 % (3 * heads) == 0, "qkv: last dimension is not 3 x heads x d");
             const int d = H3 / 3 / heads;
             FTBERT_CHECK_INPUT(d % 2 == 0 && rotary.shape(1) == d && rotary.shape(0) >= S,
                                "rotary must be [P >= S, d] with d even");
             auto l = r.layout_for(mask, B, S);
             auto dq = r.upload(mask ? pack_rows(qkv, *mask) : qkv, dt);
             auto dr = r.upload(rotary, DType::kFloat32);
             std::optional<DeviceBuffer> db;
             if (bias) {
               FTBERT_CHECK_INPUT(bias->ndim() == 1 && bias->shape(0) == H3, "bias must be [3H]");
               db = r.upload(*bias, dt);
             }
             std::optional<DeviceBuffer> dd;
             RotaryDynamic dyn;
             if (dynamic) {
               FTBERT_CHECK_INPUT(dynamic->ndim() == 2 && dynamic->shape(1) == d / 2 &&
                                      original >= 1 && original + dynamic->shape(0) >= S,
                                  "dynamic must be [P - original, d/2] with original >= 1 and P >= S");
               dd = r.upload(*dynamic, DType::kFloat32);
               dyn.inv_freq = dd->as<float>();
               dyn.original = original;
             }
             r.backend().rotary_embedding(dt, dq.data(), dr.as<float>(), l.layout, heads, d,
                                          db ? db->data() : nullptr, dyn);
             if (mask) return r.download(dq, dt, {l.layout.rows, H3});
             return r.download(dq, dt, {B, S, H3});
           },
           py::arg("dtype"), py::arg("qkv"), py::arg("rotary"), py::arg("heads"),
           py::arg("mask") = py::none(), py::arg("bias") = py::none(),
           py::arg("dynamic") = py::none(), py::arg("original") = 0)
      .def("gated_activation",
           [](OpRunner& r, const std::string& dtype, const F32Array& x, const std::string& act) {
             const DType dt = dtype_from_string(dtype);
             require_ndim(x, 2, "x");
             FTBERT_CHECK_INPUT(x.shape(1) % 2 == 0, "gated_activation: x must be [M, 2n]");
             const int M = x.shape(0), n = x.shape(1) / 2;
             auto dx = r.upload(x, dt);
             auto out = r.empty(static_cast<size_t>(M) * n, dt);
             r.backend().gated_activation(dt, dx.data(), out.data(), M, n, activation_from_name(act));
             return r.download(out, dt, {M, n});
           })
      // -> (residual after the addition, LayerNorm output) or, with report_nonfinite, the two
      // and the flag.
      .def("residual_add_layernorm",
           [](OpRunner& r, const std::string& dtype, const F32Array& residual,
              const std::optional<F32Array>& x, const std::optional<F32Array>& bias,
              const F32Array& gamma, const F32Array& beta, float eps, bool report_nonfinite) {
             const DType dt = dtype_from_string(dtype);
             require_ndim(residual, 2, "residual");
             const int M = residual.shape(0), H = residual.shape(1);
             FTBERT_CHECK_INPUT(!x || (x->ndim() == 2 && x->shape(0) == M && x->shape(1) == H),
                                "residual_add_layernorm: x must be [M, H] like residual");
             auto dr = r.upload(residual, dt), dg = r.upload(gamma, dt), dbe = r.upload(beta, dt);
             std::optional<DeviceBuffer> dx, db;
             if (x) dx = r.upload(*x, dt);
             if (bias) db = r.upload(*bias, dt);
             auto out = r.empty(static_cast<size_t>(M) * H, dt);
             const NonfiniteFlag flag(r, report_nonfinite);
             r.backend().residual_add_layernorm(dt, dr.data(), dx ? dx->data() : nullptr,
                                                db ? db->data() : nullptr, dg.data(), dbe.data(),
                                                out.data(), M, H, eps, flag.device());
             py::object normed = flag.result(r.download(out, dt, {M, H}));
             return py::make_tuple(r.download(dr, dt, {M, H}), normed);
           },
           py::arg("dtype"), py::arg("residual"), py::arg("x"), py::arg("bias"), py::arg("gamma"),
           py::arg("beta"), py::arg("eps"), py::arg("report_nonfinite") = false)
      // residual_add_layernorm's twin with RMSNorm: -> (residual after the addition, RMSNorm
      // output) or, with report_nonfinite, the two and the flag.
      .def("residual_add_rmsnorm",
           [](OpRunner& r, const std::string& dtype, const F32Array& residual,
              const std::optional<F32Array>& x, const std::optional<F32Array>& bias,
              const F32Array& gamma, float eps, bool report_nonfinite) {
             const DType dt = dtype_from_string(dtype);
             require_ndim(residual, 2, "residual");
             const int M = residual.shape(0), H = residual.shape(1);
             FTBERT_CHECK_INPUT(!x || (x->ndim() == 2 && x->shape(0) == M && x->shape(1) == H),
                                "residual_add_rmsnorm: x must be [M, H] like residual");
             FTBERT_CHECK_INPUT(!bias || (bias->ndim() == 1 && bias->shape(0) == H),
                                "residual_add_rmsnorm: bias must be [" << H << "]");
             FTBERT_CHECK_INPUT(gamma.ndim() == 1 && gamma.shape(0) == H,
                                "residual_add_rmsnorm: gamma must be [" << H << "]");
             auto dr = r.upload(residual, dt), dg = r.upload(gamma, dt);
             std::optional<DeviceBuffer> dx, db;
             if (x) dx = r.upload(*x, dt);
             if (bias) db = r.upload(*bias, dt);
             auto out = r.empty(static_cast<size_t>(M) * H, dt);
             const NonfiniteFlag flag(r, report_nonfinite);
             r.backend().residual_add_rmsnorm(dt, dr.data(), dx ? dx->data() : nullptr,
                                              db ? db->data() : nullptr, dg.data(), out.data(), M,
                                              H, eps, flag.device());
             py::object normed = flag.result(r.download(out, dt, {M, H}));
             return py::make_tuple(r.download(dr, dt, {M, H}), normed);
           },
           py::arg("dtype"), py::arg("residual"), py::arg("x"), py::arg("bias"), py::arg("gamma"),
           py::arg("eps"), py::arg("report_nonfinite") = false)
      // Input staging: three 1-D arrays of int32, int64 or uint8/bool values -> their int32
      // staging and the recorded bad value: (ids, mask, types, None or (field, value)), field 1
      // input_ids, 2 token_type_ids, 3 attention_mask.
      .def("stage_inputs",
           [](OpRunner& r, const py::array& ids, const py::array& mask, const py::array& types,
              int vocab, int type_vocab) {
             const py::ssize_t n = ids.size();
             std::vector<DeviceBuffer> in;
             std::vector<int> widths;
             for (const py::array* a : {&ids, &mask, &types}) {
               require_ndim(*a, 1, "each input");
               FTBERT_CHECK_INPUT(a->size() == n, "the inputs must have the same length");
               FTBERT_CHECK_INPUT((a->flags() & py::array::c_style) != 0, "inputs must be contiguous");
               const char kind = a->dtype().kind();
               const auto item = static_cast<int>(a->itemsize());
               FTBERT_CHECK_INPUT((kind == 'i' && (item == 4 || item == 8)) ||
                                      ((kind == 'u' || kind == 'b') && item == 1),
                                  "inputs must be int32, int64, uint8 or bool");
               DeviceBuffer buf(&r.backend(), std::max<size_t>(1, n * item));
               r.backend().copy_to_device(buf.data(), a->data(), n * item);
               in.push_back(std::move(buf));
               widths.push_back(item);
             }
             DeviceBuffer out(&r.backend(), std::max<size_t>(1, 3 * n * sizeof(int32_t)));
             int32_t* o = out.as<int32_t>();
             int32_t* words = r.backend().allocate_host_flag(sizeof(BadInputValue) / sizeof(int32_t));
             auto* bad = reinterpret_cast<BadInputValue*>(words);
             py::array_t<int32_t> host(std::vector<py::ssize_t>{3, n});
             try {
               r.backend().stage_inputs(
                   in[0].data(), widths[0], in[1].data(), widths[1], in[2].data(), widths[2], n,
                   o, o + n, o + 2 * n, vocab, type_vocab,
                   reinterpret_cast<BadInputValue*>(r.backend().host_flag_device_address(words)));
               r.backend().copy_to_host(host.mutable_data(), o, 3 * n * sizeof(int32_t));
               r.backend().synchronize();
             } catch (...) {
               r.backend().free_host_flag(words);
               throw;
             }
             py::object recorded = py::none();
             if (bad->field != BadInputValue::kNone) recorded = py::make_tuple(bad->field, bad->value);
             r.backend().free_host_flag(words);
             return py::make_tuple(host[py::int_(0)], host[py::int_(1)], host[py::int_(2)], recorded);
           },
           py::arg("input_ids"), py::arg("attention_mask"), py::arg("token_type_ids"),
           py::arg("vocab"), py::arg("type_vocab"))
      // The sequence-layout ops on their own: packing (cu_seqlens, token_index), the scatter
      // back to [B, S, W], and the clearing of rows past T in a bucket of `rows` rows.
      .def("pack_sequences",
           [](OpRunner& r, const I32Array& mask) {
             auto l = r.layout(mask, true);
             const int B = mask.shape(0), S = mask.shape(1);
             py::array_t<int32_t> cu(B + 1), index(static_cast<py::ssize_t>(B) * S);
             r.backend().copy_to_host(cu.mutable_data(), l.cu_seqlens.data(), (B + 1) * sizeof(int32_t));
             r.backend().copy_to_host(index.mutable_data(), l.token_index.data(),
                                      static_cast<size_t>(B) * S * sizeof(int32_t));
             r.backend().synchronize();
             return py::make_tuple(cu, index);
           })
      // pack_sequences' first_unattended: whether some row's position 0 is padding.
      .def("pack_sequences_first_unattended",
           [](OpRunner& r, const I32Array& mask) {
             FTBERT_CHECK_INPUT(mask.ndim() == 2, "mask must be 2-D [batch, seq]");
             const int B = mask.shape(0), S = mask.shape(1);
             DeviceBuffer m = r.upload_ints(mask);
             DeviceBuffer cu(&r.backend(), (B + 1) * sizeof(int32_t));
             DeviceBuffer index(&r.backend(), static_cast<size_t>(B) * S * sizeof(int32_t));
             DeviceBuffer flag(&r.backend(), sizeof(int32_t));
             const int32_t stale = 7;  // neither answer: the op must write one
             r.backend().copy_to_device(flag.data(), &stale, sizeof(stale));
             r.backend().pack_sequences(m.as<int32_t>(), B, S, cu.as<int32_t>(),
                                        index.as<int32_t>(), static_cast<int64_t>(B) * S,
                                        flag.as<int32_t>());
             int32_t out = 0;
             r.backend().copy_to_host(&out, flag.data(), sizeof(out));
             r.backend().synchronize();
             return out;
           })
      .def("unpack_rows",
           [](OpRunner& r, const std::string& dtype, const F32Array& packed, const I32Array& mask) {
             const DType dt = dtype_from_string(dtype);
             require_ndim(packed, 2, "packed");
             auto l = r.layout(mask, true);
             FTBERT_CHECK_INPUT(packed.shape(0) == l.tokens, "packed must have one row per attended token");
             const int B = mask.shape(0), S = mask.shape(1), W = packed.shape(1);
             auto in = r.upload(packed, dt);
             auto out = r.empty(static_cast<size_t>(B) * S * W, dt);
             r.backend().unpack_rows(in.data(), l.layout, out.data(), W * dtype_size(dt));
             return r.download(out, dt, {B, S, W});
           })
      .def("clear_rows_past_tokens",
           [](OpRunner& r, const std::string& dtype, const F32Array& x, const I32Array& mask) {
             const DType dt = dtype_from_string(dtype);
             require_ndim(x, 2, "x");
             auto l = r.layout(mask, true);
             FTBERT_CHECK_INPUT(x.shape(0) >= l.tokens && x.shape(0) <= mask.size(),
                                "x must have between T and B*S rows");
             l.layout.rows = x.shape(0);
             l.layout.bounded = true;
             auto dx = r.upload(x, dt);
             r.backend().clear_rows_past_tokens(dx.data(), l.layout, x.shape(1) * dtype_size(dt));
             return r.download(dx, dt, shape_of(x));
           });

  // DeBERTa's relative-embedding row for distance δ = i − j (disentangled_column), to hold the
  // engine's buckets to transformers' at every distance.
  m.def(
      "disentangled_column",
      [](int position_buckets, int max_relative_positions, int distance) {
        // What the deberta unit takes (below it the log buckets divide by log(1) or less).
        FTBERT_CHECK_INPUT(max_relative_positions >= 1 &&
                               (position_buckets <= 0 ||
                                (position_buckets >= 2 &&
                                 max_relative_positions > position_buckets / 2 + 1)),
                           "disentangled_column: position_buckets " << position_buckets
                               << " and max_relative_positions " << max_relative_positions
                               << " are not a table the engine runs");
        DisentangledConfig d;
        d.on = true;
        d.position_buckets = position_buckets;
        d.max_relative_positions = max_relative_positions;
        return disentangled_column(d, distance);
      },
      py::arg("position_buckets"), py::arg("max_relative_positions"), py::arg("distance"));

  // Raw-pointer attention for kernel benchmarks on device tensors; enqueued on `stream`.
  m.def("attention_workspace_bytes",
        [](const std::string& kind, const std::string& dtype, int batch, int seq, int heads,
           int head_dim) {
          return attention_workspace_bytes(kind_from_name(kind), dtype_from_string(dtype), batch,
                                           seq, heads, head_dim);
        });
  m.def(
      "attention_ptr",
      [](OpRunner& r, const std::string& kind, const std::string& dtype, uintptr_t qkv,
         uintptr_t bias, uintptr_t mask, uintptr_t out, uintptr_t workspace, int batch, int seq,
         int heads, int head_dim, uintptr_t stream) {
        py::gil_scoped_release release;
        r.backend().set_stream(stream);
        run_attention(r.backend(), kind_from_name(kind), dtype_from_string(dtype),
                      reinterpret_cast<const void*>(qkv), reinterpret_cast<const void*>(bias),
                      reinterpret_cast<void*>(out), reinterpret_cast<void*>(workspace),
                      SequenceLayout::padded(batch, seq, reinterpret_cast<const int32_t*>(mask)),
                      heads, head_dim);
      },
      py::arg("runner"), py::arg("kind"), py::arg("dtype"), py::arg("qkv"), py::arg("bias"),
      py::arg("mask"), py::arg("out"), py::arg("workspace"), py::arg("batch"), py::arg("seq"),
      py::arg("heads"), py::arg("head_dim"), py::arg("stream") = 0);
}

}  // namespace ftbert::bindings
