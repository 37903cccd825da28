// Binding of ftbert::Encoder: config dict -> ModelConfig, numpy weights -> HostWeights, numpy or
// raw device pointers in and out of forward.
#include <pybind11/stl.h>

#include <string>

#include "bindings/bindings.h"
#include "ftbert/check.h"
#include "ftbert/encoder.h"
#include "ftbert/model.h"
#include "ftbert/sequences.h"

namespace ftbert::bindings {

namespace {

// The value of `key` in the config dict as the engine's key table types it.
ConfigValue config_value(const py::dict& d, const ConfigKey& key) {
  ConfigValue v;
  py::dict where = d;
  if (*key.object) {
    if (!d.contains(key.object) || d[key.object].is_none()) return v;
    where = d[key.object].cast<py::dict>();
  }
  if (!where.contains(key.name) || where[key.name].is_none()) return v;
  const py::handle h = where[key.name];
  v.present = true;
  // bool is an int to Python: a hyper-parameter of true is refused rather than read as 1.
  const bool is_bool = py::isinstance<py::bool_>(h);
  bool ok = false;
  switch (key.type) {
    case ConfigType::kInt:
      if ((ok = py::isinstance<py::int_>(h) && !is_bool)) v.integer = h.cast<int64_t>();
      break;
    case ConfigType::kNumber:
      if ((ok = (py::isinstance<py::float_>(h) || py::isinstance<py::int_>(h)) && !is_bool)) {
        v.number = h.cast<double>();
      }
      break;
    case ConfigType::kString:
      if ((ok = py::isinstance<py::str>(h))) v.text = h.cast<std::string>();
      break;
    case ConfigType::kBool: ok = is_bool; if (ok) v.flag = h.cast<bool>(); break;
    case ConfigType::kObject: ok = py::isinstance<py::dict>(h); break;
  }
  static const char* const kWhat[] = {"an integer", "a number", "a string", "true or false",
                                      "an object"};
  FTBERT_CHECK_INPUT(ok, "config: " << (*key.object ? std::string(key.object) + "." : "") << key.name
                                    << " must be " << kWhat[static_cast<int>(key.type)] << ", got "
                                    << py::repr(h).cast<std::string>());
  return v;
}

ModelConfig config_from_dict(const py::dict& d) {
  return config_from_values([&](const ConfigKey& key) { return config_value(d, key); });
}

// weights: {name: (array, stored dtype name)}; bfloat16 arrives as uint16 bits.
HostWeights weights_from_dict(const py::dict& d, std::vector<py::array>& keep_alive) {
  HostWeights w;
  for (const auto& item : d) {
    const auto name = item.first.cast<std::string>();
    const auto pair = item.second.cast<py::tuple>();
    auto arr = py::array::ensure(pair[0], py::array::c_style);
    FTBERT_CHECK_INPUT(arr, "weights: tensor '" << name << "' is not an array");
    const DType dt = dtype_from_string(pair[1].cast<std::string>());
    FTBERT_CHECK_INPUT(static_cast<size_t>(arr.itemsize()) == dtype_size(dt),
                       "weights: tensor '" << name << "' has item size " << arr.itemsize()
                                           << ", expected " << dtype_size(dt) << " for "
                                           << dtype_name(dt));
    HostTensor t;
    t.data = arr.data();
    t.dtype = dt;
    for (py::ssize_t i = 0; i < arr.ndim(); ++i) t.shape.push_back(arr.shape(i));
    w[name] = t;
    keep_alive.push_back(std::move(arr));
  }
  return w;
}

using IdArray = py::array_t<int32_t, py::array::c_style>;

// Packed inputs' offsets into `a` (batch, cu_seqlens); `tokens` >= 0: the inputs' length, which
// the last offset must equal. The array must outlive the forward.
void set_offsets(ForwardArgs& a, const IdArray& cu_seqlens, py::ssize_t tokens) {
  FTBERT_CHECK_INPUT(cu_seqlens.ndim() == 1 && cu_seqlens.shape(0) >= 2,
                     "cu_seqlens must be 1-D with at least 2 entries [B + 1]");
  const int32_t last = cu_seqlens.data()[cu_seqlens.shape(0) - 1];
  FTBERT_CHECK_INPUT(tokens < 0 || last == tokens,
                     "cu_seqlens ends at " << last << " but input_ids has " << tokens << " tokens");
  a.cu_seqlens = cu_seqlens.data();
  a.batch = static_cast<int>(cu_seqlens.shape(0) - 1);
}

// Runs `a` (its inputs set, device memory) into the device outputs given, enqueued on `stream`.
// Returns (nonfinite, earlier_nonfinite).
py::tuple forward_on_device(Encoder& e, ForwardArgs& a, uintptr_t hidden, uintptr_t pooled,
                            uintptr_t logits, uintptr_t stream, bool wait_for_finite_check) {
  a.inputs_on_device = true;
  a.last_hidden_state = reinterpret_cast<void*>(hidden);
  a.pooler_output = reinterpret_cast<void*>(pooled);
  a.logits = reinterpret_cast<void*>(logits);
  a.outputs_on_device = true;
  a.stream = stream;
  a.wait_for_finite_check = wait_for_finite_check;
  ForwardResult r;
  {
    py::gil_scoped_release release;
    r = e.forward(a);
  }
  return py::make_tuple(r.nonfinite, r.earlier_nonfinite);
}

// Runs `a` (inputs set) into host arrays it allocates: last_hidden_state [B, S, H] ([T, H] with
// packed outputs), pooler_output [B, H] where the model has a pooler, logits [B, N] / per token
// where it has a head. Returns (hidden, pooled, logits, nonfinite, earlier_nonfinite).
py::tuple forward_to_host(Encoder& e, ForwardArgs& a) {
  const int H = e.config().hidden_size;
  const auto np_dtype = e.dtype() == DType::kFloat32   ? py::dtype("float32")
                        : e.dtype() == DType::kFloat16 ? py::dtype("float16")
                                                       : py::dtype("uint16");
  // Packed inputs: T is their last offset.
  const py::ssize_t tokens = a.cu_seqlens != nullptr ? a.cu_seqlens[a.batch] : a.tokens;
  const bool packed = a.cu_seqlens != nullptr || a.packed_outputs;
  const auto per_token = [&](py::ssize_t width) {
    return packed ? std::vector<py::ssize_t>{tokens, width}
                  : std::vector<py::ssize_t>{a.batch, a.seq, width};
  };
  py::array hidden(np_dtype, per_token(H));
  py::object pooled = py::none(), logits = py::none();
  a.last_hidden_state = hidden.mutable_data();
  if (e.config().has_pooler) {
    py::array p(np_dtype, std::vector<py::ssize_t>{a.batch, H});
    a.pooler_output = p.mutable_data();
    pooled = p;
  }
  const HeadConfig& head = e.config().head;
  if (head.kind != HeadKind::kNone) {
    const py::ssize_t N = head.num_labels;
    py::array l(np_dtype, head.kind == HeadKind::kToken ? per_token(N)
                                                        : std::vector<py::ssize_t>{a.batch, N});
    a.logits = l.mutable_data();
    logits = l;
  }
  ForwardResult r;
  {
    py::gil_scoped_release release;
    r = e.forward(a);
  }
  return py::make_tuple(hidden, pooled, logits, r.nonfinite, r.earlier_nonfinite);
}

}  // namespace

void register_encoder(py::module_& m) {
  m.def(
      "expected_tensors",
      [](const py::dict& config) {
        py::list out;
        for (const ExpectedTensor& t : expected_tensors(config_from_dict(config))) {
          out.append(py::make_tuple(t.name, py::tuple(py::cast(t.shape)), t.table, t.gemm_weight));
        }
        return out;
      },
      "The tensors an engine config implies, in file order: (name, shape, is a lookup table, is a "
      "weight GEMM's matrix).");
  m.def(
      "engine_config_keys",
      [] {
        static const char* const kTypes[] = {"int", "number", "string", "bool", "object"};
        py::list keys;
        for (const ConfigKey& k : engine_config_keys()) {
          keys.append(py::make_tuple(k.object, k.name, kTypes[static_cast<int>(k.type)], k.required,
                                     k.in_file));
        }
        return keys;
      },
      "The engine config's keys in file order: (object (\"\" at the top level), name, type, "
      "required, written in ftbert_config.json).");
  m.def("architectures", &model_architectures,
        "The architecture units this build runs, by the names the engine config's "
        "\"architecture\" takes.");
  m.def("relative_position_bucket", &relative_position_bucket, py::arg("distance"),
        "MPNet's bucket of the key-minus-query distance (ftbert/config.h).");
  m.def(
      "recorded_packed_shape",
      [](int batch, int seq, int64_t tokens, int max_seq) {
        const PackedShape s = recorded_packed_shape(batch, seq, tokens, max_seq);
        return py::make_tuple(s.batch, s.seq, s.rows);
      },
      py::arg("batch"), py::arg("seq"), py::arg("tokens"), py::arg("max_seq"),
      "(batch, seq, rows) a recording of packed inputs is made for (ftbert/sequences.h).");

  py::class_<Encoder>(m, "Encoder")
      .def(py::init([](const py::dict& config, const py::dict& weights, const std::string& device,
                       const std::string& dtype, const std::string& quantization) {
             std::vector<py::array> keep_alive;
             const ModelConfig c = config_from_dict(config);
             const HostWeights w = weights_from_dict(weights, keep_alive);
             const DType dt = dtype_from_string(dtype);
             const Quantization q = quantization_from_string(quantization);
             py::gil_scoped_release release;
             return std::make_unique<Encoder>(c, w, device, dt, q);
           }),
           py::arg("config"), py::arg("weights"), py::arg("device"), py::arg("dtype"),
           py::arg("quantization") = "none")
      .def_property_readonly("quantization",
                             [](const Encoder& e) { return std::string(quantization_name(e.quantization())); })
      .def_property_readonly("backend", [](const Encoder& e) { return e.backend().name(); })
      .def_property_readonly("device_name",
                             [](const Encoder& e) { return e.backend().device_name(); })
      .def_property_readonly("dtype", [](const Encoder& e) { return std::string(dtype_name(e.dtype())); })
      .def_property_readonly("weight_bytes", &Encoder::weight_bytes)
      .def_property_readonly("terms_in_attention", &Encoder::terms_in_attention)
      .def_property_readonly("workspace_bytes",
                             py::cpp_function(&Encoder::workspace_bytes,
                                              py::call_guard<py::gil_scoped_release>()))
      .def("reserve_workspace", &Encoder::reserve_workspace, py::arg("batch"), py::arg("seq"),
           py::arg("rows"), py::call_guard<py::gil_scoped_release>())
      .def_property(
          "attention",
          [](const Encoder& e) { return std::string(attention_mode_name(e.attention_mode())); },
          [](Encoder& e, const std::string& mode) {
            e.set_attention(attention_mode_from_string(mode));
          })
      .def("attention_for", [](const Encoder& e, int batch, int seq) {
        return std::string(attention_kind_name(e.attention_for(batch, seq)));
      })
      .def_property(
          "padding_free",
          [](const Encoder& e) -> py::object {
            switch (e.padding_free()) {
              case Encoder::PaddingFree::kOn: return py::bool_(true);
              case Encoder::PaddingFree::kOff: return py::bool_(false);
              case Encoder::PaddingFree::kAuto: break;
            }
            return py::str("auto");
          },
          [](Encoder& e, const py::object& mode) {
            if (py::isinstance<py::bool_>(mode)) {
              e.set_padding_free(mode.cast<bool>() ? Encoder::PaddingFree::kOn
                                                   : Encoder::PaddingFree::kOff);
            } else if (py::isinstance<py::str>(mode) && mode.cast<std::string>() == "auto") {
              e.set_padding_free(Encoder::PaddingFree::kAuto);
            } else {
              throw InputError("padding_free must be 'auto', True or False, got " +
                               py::repr(mode).cast<std::string>());
            }
          })
      .def("padding_free_for", &Encoder::padding_free_for, py::arg("batch"), py::arg("seq"),
           py::arg("tokens"), py::arg("first_token_differs") = false)
      // These wait for the forwards running in the sessions they touch: without the GIL.
      .def("set_allow_tf32", &Encoder::set_allow_tf32, py::call_guard<py::gil_scoped_release>())
      .def_property("batch_invariant", &Encoder::batch_invariant, &Encoder::set_batch_invariant)
      .def_property("graphs", &Encoder::graphs,
                    py::cpp_function(&Encoder::set_graphs, py::call_guard<py::gil_scoped_release>()))
      .def_property("concurrency", &Encoder::concurrency,
                    py::cpp_function(&Encoder::set_concurrency,
                                     py::call_guard<py::gil_scoped_release>()))
      .def_property_readonly("recorded_shapes",
                             py::cpp_function(&Encoder::recorded_shapes,
                                              py::call_guard<py::gil_scoped_release>()))
      .def_property_readonly("graph_counts", &Encoder::graph_counts)
      // The measured GEMM choice (Backend::wait_for_tuning, tuning_counters); the wait without
      // the GIL, which the tuner's thread never needs.
      .def("wait_for_tuning", [](Encoder& e) { e.backend().wait_for_tuning(); },
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("tuning_counters",
                             [](const Encoder& e) { return e.backend().tuning_counters(); })
      // Host arrays in, host arrays out (float32, or the 16-bit bits as uint16 for the caller to
      // view), then the ForwardResult's two flags.
      // packed_outputs: last_hidden_state [T, H] and token logits [T, N], the attended tokens in
      // order. padded: ForwardArgs::padded (a bool only: a truthy object is no request).
      .def("forward_host",
           [](Encoder& e, const IdArray& ids, const IdArray& mask, const IdArray& types,
              bool packed_outputs, bool padded) {
             FTBERT_CHECK_INPUT(ids.ndim() == 2, "input_ids must be 2-D [batch, seq]");
             FTBERT_CHECK_INPUT(mask.ndim() == 2 && mask.shape(0) == ids.shape(0) &&
                                    mask.shape(1) == ids.shape(1),
                                "attention_mask must have the shape of input_ids");
             FTBERT_CHECK_INPUT(types.ndim() == 2 && types.shape(0) == ids.shape(0) &&
                                    types.shape(1) == ids.shape(1),
                                "token_type_ids must have the shape of input_ids");
             ForwardArgs a;
             a.input_ids = ids.data();
             a.attention_mask = mask.data();
             a.token_type_ids = types.data();
             a.batch = static_cast<int>(ids.shape(0));
             a.seq = static_cast<int>(ids.shape(1));
             a.padded = padded;
             if (packed_outputs) {
               a.packed_outputs = true;
               a.tokens = 0;
               for (py::ssize_t i = 0; i < mask.size(); ++i) a.tokens += mask.data()[i] != 0;
             }
             return forward_to_host(e, a);
           },
           py::arg("input_ids"), py::arg("attention_mask"), py::arg("token_type_ids"),
           py::arg("packed_outputs") = false, py::arg("padded").noconvert() = false)
      // Packed host inputs (Encoder.forward_packed): input_ids and token_type_ids [T], cu_seqlens
      // [B + 1]; packed outputs as forward_host's packed_outputs gives them.
      .def("forward_packed_host",
           [](Encoder& e, const IdArray& ids, const IdArray& types, const IdArray& cu_seqlens) {
             FTBERT_CHECK_INPUT(ids.ndim() == 1, "input_ids must be 1-D [tokens]");
             FTBERT_CHECK_INPUT(types.ndim() == 1 && types.shape(0) == ids.shape(0),
                                "token_type_ids must have the shape of input_ids");
             ForwardArgs a;
             a.input_ids = ids.data();
             a.token_type_ids = types.data();
             set_offsets(a, cu_seqlens, ids.shape(0));
             return forward_to_host(e, a);
           },
           py::arg("input_ids"), py::arg("token_type_ids"), py::arg("cu_seqlens"))
      // Device memory in and out (e.g. torch CUDA tensors), enqueued on `stream`; returns the
      // ForwardResult's two flags.
      .def(
          "forward_device",
          [](Encoder& e, uintptr_t ids, uintptr_t mask, uintptr_t types, int batch, int seq,
             uintptr_t hidden, uintptr_t pooled, uintptr_t logits, uintptr_t stream,
             bool wait_for_finite_check, int64_t tokens, bool packed_outputs, int ids_bytes,
             int mask_bytes, int types_bytes, bool padded) {
            ForwardArgs a;
            a.ids_bytes = ids_bytes;
            a.mask_bytes = mask_bytes;
            a.types_bytes = types_bytes;
            a.input_ids = reinterpret_cast<const int32_t*>(ids);
            a.attention_mask = reinterpret_cast<const int32_t*>(mask);
            a.token_type_ids = reinterpret_cast<const int32_t*>(types);
            a.batch = batch;
            a.seq = seq;
            a.tokens = tokens;
            a.packed_outputs = packed_outputs;
            a.padded = padded;
            return forward_on_device(e, a, hidden, pooled, logits, stream, wait_for_finite_check);
          },
          py::arg("input_ids"), py::arg("attention_mask"), py::arg("token_type_ids"),
          py::arg("batch"), py::arg("seq"), py::arg("last_hidden_state"), py::arg("pooler_output"),
          py::arg("logits"), py::arg("stream"), py::arg("wait_for_finite_check") = false,
          py::arg("tokens") = -1, py::arg("packed_outputs") = false, py::arg("ids_bytes") = 4,
          py::arg("mask_bytes") = 4, py::arg("types_bytes") = 4,
          py::arg("padded").noconvert() = false)
      // Packed device inputs (Encoder.forward_packed): input_ids and token_type_ids [T] (types 0:
      // none), cu_seqlens [B + 1] on the host; packed outputs.
      .def(
          "forward_packed_device",
          [](Encoder& e, uintptr_t ids, uintptr_t types, const IdArray& cu_seqlens, uintptr_t hidden,
             uintptr_t pooled, uintptr_t logits, uintptr_t stream, bool wait_for_finite_check,
             int ids_bytes, int types_bytes) {
            ForwardArgs a;
            a.ids_bytes = ids_bytes;
            a.types_bytes = types_bytes;
            a.input_ids = reinterpret_cast<const int32_t*>(ids);
            a.token_type_ids = reinterpret_cast<const int32_t*>(types);
            set_offsets(a, cu_seqlens, -1);
            return forward_on_device(e, a, hidden, pooled, logits, stream, wait_for_finite_check);
          },
          py::arg("input_ids"), py::arg("token_type_ids"), py::arg("cu_seqlens"),
          py::arg("last_hidden_state"), py::arg("pooler_output"), py::arg("logits"),
          py::arg("stream"), py::arg("wait_for_finite_check") = false, py::arg("ids_bytes") = 4,
          py::arg("types_bytes") = 4)
      // The first bad value device inputs held (Encoder::take_bad_input), cleared as it is taken:
      // None, or (argument name, value).
      .def("take_bad_input",
           [](Encoder& e) -> py::object {
             const BadInputValue b = e.take_bad_input();
             switch (b.field) {
               case BadInputValue::kInputIds: return py::make_tuple("input_ids", b.value);
               case BadInputValue::kTokenTypeIds: return py::make_tuple("token_type_ids", b.value);
               case BadInputValue::kAttentionMask: return py::make_tuple("attention_mask", b.value);
               default: return py::none();
             }
           })
      .def("synchronize", &Encoder::synchronize, py::call_guard<py::gil_scoped_release>());
}

}  // namespace ftbert::bindings
