// An int4 or int8 model's decoder layers, all of them in ONE call: the same kernel calls, in the
// same order, as a transformers decoder layer on specdec's row operations makes them.
//
// Why (measured on the 1.5B, AMD EPYC, 2 cores, every kernel held to its AVX2 code;
// docs/notes/runtime-search.md section 10): with the row operations in the kernel, a one-token step
// of the int4 1.5B still spent 6.8 of its 37.4 ms outside every kernel call, in the some 30
// Python calls and small torch operations a layer makes around them (modules, views, splits,
// the caches' bookkeeping), and a step of the 0.5B draft 5.9 of 20.9 ms. Here they are a few
// ATen calls a layer, without Python.
//
// Exactness: nothing is computed differently. Each layer is norm, the fused q/k/v product,
// the rotary mix of q and k, the new keys and values written into each sequence's buffer
// after its held positions, attention of each sequence's rows over its own prefix, the o
// product, the residual sum, norm, the fused gate/up product, the SiLU-gated product, the
// down product and the residual sum: the functions of int4_linear.cpp and row_ops.cpp on the
// same inputs, and the residual sums as the same float additions. So the hidden states are
// transformers' forward's on that model bit for bit (tests/backends/test_layer_stack.py), and
// a block still equals its steps.
//
// A pass makes its buffers once (the hidden state, summed into in place; the rotated
// queries; attention's output) and each layer splits the q/k/v rows by head straight into
// them and into the caches. The views, copies, concatenations and additions it made as ATen
// calls before, some 20 a layer, were a measurable part of the 0.5B draft's step (bench/
// results/2026-12-04-draft-step-overhead-epyc-avx512).
//
// The int8 runtime's products are fbgemm's (backends/quant/int8.py: a prepacked torch object
// with no C++ API that torch exports to extensions), so they are called back in Python, holding
// the GIL for the pass; everything around them runs here as for int4.

// pybind and tensor conversions only (torch/extension.h, the whole C++ API, parses 12 s longer)
#include <torch/python.h>
#include <ATen/ops/empty.h>

#include <optional>
#include <vector>

torch::Tensor int4_linear(torch::Tensor x, torch::Tensor packed, c10::optional<torch::Tensor> bias,
                          int64_t path);
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps);
torch::Tensor silu_mul(torch::Tensor gate_up);
void rope_(torch::Tensor x, torch::Tensor cos, torch::Tensor sin);
torch::Tensor causal_attention(torch::Tensor query, torch::Tensor keys, torch::Tensor values,
                               double scaling, std::vector<int64_t> parents);
void attention_into(const float* qd, int64_t rows, int64_t heads, int64_t d, const float* kd,
                    int64_t k_stride, const float* vd, int64_t v_stride, int64_t kv_heads,
                    int64_t positions, double scaling, const std::vector<int64_t>& parents,
                    float* o);
void split_heads_into(const float* qkv, int64_t rows, int64_t heads, int64_t kv_heads,
                      int64_t d, const float* cos, const float* sin, float* query, float* keys,
                      int64_t k_stride, float* values, int64_t v_stride, int64_t first);
int64_t int4_best_path();

namespace {

// One product: an int4 one (its packed weight, its bias, none: an empty tensor, and its code
// path), or any other as a Python callable of [rows, in] -> [rows, out] (the int8 runtime's).
struct Product {
  torch::Tensor packed;
  torch::Tensor bias;
  int64_t path;
  pybind11::object call;  // None for an int4 product

  torch::Tensor operator()(const torch::Tensor& x) const {
    if (!call.is_none()) {
      pybind11::gil_scoped_acquire gil;  // held already: the pass keeps it (see forward)
      return call(x).cast<torch::Tensor>();
    }
    return int4_linear(x, packed,
                       bias.numel() ? c10::optional<torch::Tensor>(bias) : c10::nullopt, path);
  }
};

struct Layer {
  torch::Tensor input_norm;
  double input_eps;
  Product qkv, o;
  torch::Tensor post_norm;
  double post_eps;
  Product gate_up, down;
};

constexpr int kTensors = 10;  // a layer's: input norm, qkv, its bias, o, its bias, post
                              // norm, gate_up, its bias, down, its bias
constexpr int kPaths = 4;     // qkv, o, gate_up, down

class LayerStack {
 public:
  // calls: one per product (kPaths a layer), None where the product is int4
  LayerStack(std::vector<torch::Tensor> tensors, std::vector<double> eps,
             std::vector<int64_t> paths, std::vector<pybind11::object> calls, int64_t heads,
             int64_t kv_heads, int64_t head_dim, double scaling)
      : heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim), scaling_(scaling) {
    const size_t count = tensors.size() / kTensors;
    TORCH_CHECK(count > 0 && tensors.size() == count * kTensors && eps.size() == 2 * count &&
                    paths.size() == kPaths * count && calls.size() == paths.size(),
                "a layer stack: 10 tensors, 2 epsilons, 4 paths and 4 calls a layer");
    for (const pybind11::object& call : calls) python_products_ |= !call.is_none();
    TORCH_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && head_dim > 0 &&
                    head_dim % 2 == 0 && head_dim <= 512,
                "head counts do not match, or a head size that is odd or over 512");
    for (size_t l = 0; l < count; ++l) {
      const torch::Tensor* t = tensors.data() + l * kTensors;
      const int64_t* p = paths.data() + l * kPaths;
      const pybind11::object* c = calls.data() + l * kPaths;
      layers_.push_back(Layer{t[0], eps[2 * l], Product{t[1], t[2], p[0], c[0]},
                              Product{t[3], t[4], p[1], c[1]}, t[5], eps[2 * l + 1],
                              Product{t[6], t[7], p[2], c[2]}, Product{t[8], t[9], p[3], c[3]}});
    }
  }

  // hidden  # [rows, hidden] float32, the rows of every sequence of the pass in order;
  // cos, sin  # [rows, head_dim]; starts  # [segments + 1]: sequence s has rows starts[s] ..
  // starts[s + 1] - 1 and held[s] positions in its buffers keys[s * layers + l],
  // values[...]  # [1, kv_heads, capacity, head_dim], with room for its new rows (written
  // here; the caller then counts them held). parents: empty (every row causal), or, for a
  // pass of one sequence, a draft tree's: one per tree row (the tree row it hangs under, -1:
  // the prefix), the tree's rows held from earlier passes first (the last parents.size() -
  // rows positions held), then the pass's rows, each attending to the prefix and its own
  // path (row_ops.cpp attention_into).
  // ->  the last layer's output  # [rows, hidden]
  torch::Tensor forward(torch::Tensor hidden, torch::Tensor cos, torch::Tensor sin,
                        std::vector<int64_t> starts, std::vector<int64_t> held,
                        std::vector<torch::Tensor> keys, std::vector<torch::Tensor> values,
                        std::vector<int64_t> parents) const {
    // Python threads run on while an int4 pass does (ATen needs no GIL); a pass that calls
    // products back in Python keeps it rather than taking it again 4 times a layer.
    std::optional<pybind11::gil_scoped_release> released;
    if (!python_products_) released.emplace();
    const int64_t rows = hidden.size(0), layers = static_cast<int64_t>(layers_.size());
    const int64_t segments = static_cast<int64_t>(held.size());
    TORCH_CHECK(hidden.dim() == 2 && hidden.scalar_type() == torch::kFloat32,
                "hidden: [rows, hidden] float32");
    TORCH_CHECK(static_cast<int64_t>(starts.size()) == segments + 1 && starts[0] == 0 &&
                    starts[segments] == rows,
                "starts: one per sequence and the row count");
    TORCH_CHECK(parents.empty() || (segments == 1 && static_cast<int64_t>(parents.size()) >= rows),
                "parents: none, or one sequence's: one per held tree row and per row");
    TORCH_CHECK(static_cast<int64_t>(keys.size()) == segments * layers &&
                    values.size() == keys.size(),
                "a key and a value buffer per sequence and layer");
    for (int64_t s = 0; s < segments; ++s) {
      TORCH_CHECK(starts[s + 1] > starts[s], "every sequence has rows");
      for (int64_t l = 0; l < layers; ++l) {
        for (const torch::Tensor& buffer : {keys[s * layers + l], values[s * layers + l]}) {
          TORCH_CHECK(buffer.dim() == 4 && buffer.size(0) == 1 && buffer.size(1) == kv_heads_ &&
                          buffer.size(3) == head_dim_ && buffer.is_contiguous() &&
                          buffer.scalar_type() == torch::kFloat &&
                          buffer.size(2) >= held[s] + starts[s + 1] - starts[s],
                      "a cache buffer (contiguous float32) without room for its sequence's new "
                      "rows");
        }
      }
    }
    const int64_t q_size = heads_ * head_dim_;
    TORCH_CHECK(cos.dim() == 2 && cos.is_contiguous() && sin.is_contiguous() &&
                    cos.scalar_type() == torch::kFloat && sin.scalar_type() == torch::kFloat &&
                    cos.size(0) == rows && cos.size(1) == head_dim_ && sin.sizes() == cos.sizes(),
                "cos, sin: [rows, head_dim] float32, contiguous");
    // The pass's buffers, made once for all layers: the hidden state (added to in place),
    // the rotated queries and the attention's output.
    torch::Tensor x = hidden.clone(at::MemoryFormat::Contiguous);
    const torch::Tensor query = at::empty({rows, q_size}, hidden.options());
    const torch::Tensor attended = at::empty({rows, q_size}, hidden.options());
    float *xd = x.data_ptr<float>(), *qd = query.data_ptr<float>();
    float* ad = attended.data_ptr<float>();
    const float *cd = cos.data_ptr<float>(), *sd = sin.data_ptr<float>();
    const int64_t numel = x.numel(), d = head_dim_;
    const auto add_into_x = [&](const torch::Tensor& y) {  // x = x + y, in place
      const torch::Tensor c = y.contiguous();
      TORCH_CHECK(c.numel() == numel && c.scalar_type() == torch::kFloat, "a product's rows");
      const float* yd = c.data_ptr<float>();
      for (int64_t i = 0; i < numel; ++i) xd[i] = xd[i] + yd[i];
    };
    for (int64_t l = 0; l < layers; ++l) {
      const Layer& layer = layers_[l];
      const torch::Tensor qkv =
          layer.qkv(rms_norm(x, layer.input_norm, layer.input_eps)).contiguous();
      TORCH_CHECK(qkv.size(0) == rows && qkv.size(1) == q_size + 2 * kv_heads_ * d,
                  "the q/k/v product's width");
      const float* qkvd = qkv.data_ptr<float>();
      for (int64_t s = 0; s < segments; ++s) {
        const int64_t first = starts[s], n = starts[s + 1] - starts[s];
        const torch::Tensor &k_buffer = keys[s * layers + l], &v_buffer = values[s * layers + l];
        float *kd = k_buffer.data_ptr<float>(), *vd = v_buffer.data_ptr<float>();
        const int64_t k_stride = k_buffer.stride(1), v_stride = v_buffer.stride(1);
        split_heads_into(qkvd + first * qkv.size(1), n, heads_, kv_heads_, d, cd + first * d,
                         sd + first * d, qd + first * q_size, kd, k_stride, vd, v_stride,
                         held[s]);
        attention_into(qd + first * q_size, n, heads_, d, kd, k_stride, vd, v_stride, kv_heads_,
                       held[s] + n, scaling_, parents, ad + first * q_size);
      }
      add_into_x(layer.o(attended));
      const torch::Tensor gate_up = layer.gate_up(rms_norm(x, layer.post_norm, layer.post_eps));
      add_into_x(layer.down(silu_mul(gate_up)));
    }
    return x;
  }

  int64_t size() const { return static_cast<int64_t>(layers_.size()); }

 private:
  std::vector<Layer> layers_;
  bool python_products_ = false;
  int64_t heads_, kv_heads_, head_dim_;
  double scaling_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int4_linear", &int4_linear, "x @ W^T + b with W packed by specdec.backends.quant.int4");
  m.def("best_path", &int4_best_path, "0 scalar, 1 AVX2, 2 AVX-512 VNNI, 3 AMX-INT8");
  m.def("rms_norm", &rms_norm, "RMS norm of each row");
  m.def("silu_mul", &silu_mul, "silu(gate) * up of each row of [gate, up]");
  m.def("rope_", &rope_, "rotary embedding of each row's heads, in place");
  m.def("causal_attention", &causal_attention, "causal (or draft tree) attention of each query row",
        pybind11::arg("query"), pybind11::arg("keys"), pybind11::arg("values"),
        pybind11::arg("scaling"), pybind11::arg("parents") = std::vector<int64_t>());
  pybind11::class_<LayerStack>(m, "LayerStack")
      .def(pybind11::init<std::vector<torch::Tensor>, std::vector<double>, std::vector<int64_t>,
                          std::vector<pybind11::object>, int64_t, int64_t, int64_t, double>())
      .def("forward", &LayerStack::forward)
      .def("__len__", &LayerStack::size);
}
