// Python binding of the selection decode kernels: tensor checks, allocation, stream.
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include "sel_decode.h"

namespace {

selgate::Dtype dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kHalf: return selgate::Dtype::kHalf;
    case at::kBFloat16: return selgate::Dtype::kBFloat16;
    case at::kFloat: return selgate::Dtype::kFloat;
    default: TORCH_CHECK(false, "sel_decode: q must be fp16, bf16 or fp32, got ", t.scalar_type());
  }
}

// `rows_only`: k and v need unit inner stride, 16-byte aligned rows at any other strides.
void check_operand(const char* name, const at::Tensor& t, const at::Tensor& q, int64_t rank, bool rows_only = false) {
  TORCH_CHECK(t.is_cuda() && t.device() == q.device(), "sel_decode: ", name, " must be on ", q.device(), ", got ", t.device());
  TORCH_CHECK(t.dim() == rank, "sel_decode: ", name, " must be ", rank, "-D, got ", t.sizes());
  if (!rows_only) {
    TORCH_CHECK(t.is_contiguous(), "sel_decode: ", name, " must be contiguous");
    return;
  }
  const int64_t item = t.element_size();
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && t.stride(2) == 1 && t.stride(0) * item % 16 == 0 &&
              t.stride(1) * item % 16 == 0, "sel_decode: ", name, " must have unit inner stride and 16-byte aligned "
              "rows, got strides ", t.strides(), " (", item, "-byte elements) at address ", t.data_ptr());
}

selgate::Tune tune_of(const std::vector<int64_t>& tune) {
  TORCH_CHECK(tune.size() <= 8, "sel_decode: tune is [stages, split, warps, pdl, slab, schedule, prefetch, occupancy], "
              "got ", tune.size(), " values");
  selgate::Tune t;
  int* fields[] = {&t.stages, &t.split, &t.warps, &t.pdl, &t.slab, &t.schedule, &t.prefetch, &t.occupancy};
  for (size_t i = 0; i < tune.size(); ++i) *fields[i] = static_cast<int>(tune[i]);
  return t;
}

// q [B,1,G,h,Dk], k [B*G,S_kv,Dk], v [B*G,S_kv,Dv] (read at their row and key strides), ranges
// [B,1,G,n,2] and positions [B,1] int32/int64.
// `tune`: optional [stages, split, warps, pdl, slab, schedule, prefetch, occupancy] overrides of the tensor-core
// kernel (0 = automatic).
// Returns {o [B,1,G,h,Dv], lse fp32 [B,1,G,h]}.
std::vector<at::Tensor> fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& ranges,
                            const c10::optional<at::Tensor>& positions, double scale, bool use_mma,
                            const std::vector<int64_t>& tune, bool clip, const c10::optional<at::Tensor>& counter,
                            int64_t kv_bytes) {
  check_operand("q", q, q, 5);
  check_operand("k", k, q, 3, true);
  check_operand("v", v, q, 3, true);
  check_operand("ranges", ranges, q, 5);
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), "sel_decode: q, k, v dtypes differ");
  TORCH_CHECK(ranges.scalar_type() == at::kLong || ranges.scalar_type() == at::kInt, "sel_decode: ranges must be int32 or int64");
  const int64_t B = q.size(0), G = q.size(2), h = q.size(3), Dk = q.size(4), S_kv = k.size(1), Dv = v.size(2);
  TORCH_CHECK(q.size(1) == 1, "sel_decode: decode only (S == 1), got S = ", q.size(1));
  TORCH_CHECK(k.size(0) == B * G && k.size(2) == Dk, "sel_decode: k ", k.sizes(), " is not [B*G, S_kv, Dk] for q ",
              q.sizes());
  TORCH_CHECK(v.size(0) == B * G && v.size(1) == S_kv, "sel_decode: v ", v.sizes(), " does not match k ", k.sizes());
  TORCH_CHECK(ranges.size(0) == B && ranges.size(1) == 1 && ranges.size(2) == G && ranges.size(4) == 2,
              "sel_decode: ranges ", ranges.sizes(), " must be [B, 1, G, n, 2]");
  const void* pos_ptr = nullptr;
  bool pos_i64 = false;
  if (positions.has_value()) {
    check_operand("positions", *positions, q, 2);
    pos_i64 = positions->scalar_type() == at::kLong;
    TORCH_CHECK((pos_i64 || positions->scalar_type() == at::kInt) && positions->size(0) == B && positions->size(1) == 1,
                "sel_decode: positions must be int32 or int64 [B, 1], got ", positions->scalar_type(), " ",
                positions->sizes());
    pos_ptr = positions->data_ptr();
  }
  if (counter.has_value()) {
    check_operand("counter", *counter, q, 1);
    TORCH_CHECK(counter->scalar_type() == at::kLong && counter->size(0) == 2, "sel_decode: counter must be int64 [2], got ",
                counter->scalar_type(), " ", counter->sizes());
  }
  const c10::cuda::CUDAGuard guard(q.device());
  auto o = at::empty({B, 1, G, h, Dv}, v.options());
  auto lse = at::empty({B, 1, G, h}, q.options().dtype(at::kFloat));
  selgate::DecodeArgs args{dtype_of(q), use_mma, q.data_ptr(), k.data_ptr(), v.data_ptr(), ranges.data_ptr(),
                           pos_ptr, ranges.scalar_type() == at::kLong, pos_i64, o.data_ptr(), lse.data_ptr<float>(),
                           B, G, h, S_kv,
                           static_cast<int>(Dk), static_cast<int>(Dv), static_cast<int>(ranges.size(3)),
                           static_cast<float>(scale), tune_of(tune)};
  args.k_row = k.stride(0), args.k_key = k.stride(1), args.v_row = v.stride(0), args.v_key = v.stride(1);
  args.clip = clip;
  args.counter = counter.has_value() ? counter->data_ptr<int64_t>() : nullptr;
  args.kv_bytes = kv_bytes;
  char err[512];
  TORCH_CHECK(selgate::sel_decode_launch(args, c10::cuda::getCurrentCUDAStream(), err, sizeof(err)), err);
  return {o, lse};
}

// The launch fwd would make for these shapes: {kernel (0 simt, 1 mma), stages, split, warps,
// threads, smem bytes, blocks per SM, pdl, blocks, slab, schedule, prefetch}. Needs a current CUDA
// device.
std::vector<int64_t> plan(int64_t dtype, int64_t B, int64_t G, int64_t h, int64_t S_kv, int64_t Dk, int64_t Dv,
                          int64_t n, bool use_mma, const std::vector<int64_t>& tune) {
  selgate::DecodeArgs args{static_cast<selgate::Dtype>(dtype), use_mma, nullptr, nullptr, nullptr, nullptr, nullptr,
                           false, false, nullptr, nullptr, B, G, h, S_kv, static_cast<int>(Dk), static_cast<int>(Dv),
                           static_cast<int>(n), 1.f, tune_of(tune)};
  selgate::DecodePlan pl{};
  char err[512];
  TORCH_CHECK(selgate::sel_decode_plan(args, pl, err, sizeof(err)), err);
  return {pl.kernel, pl.stages, pl.split, pl.warps, pl.threads, pl.smem_bytes, pl.blocks_per_sm, pl.pdl, pl.blocks,
          pl.slab, pl.schedule, pl.prefetch};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("fwd", &fwd, "NSA selection attention decode forward: returns (o, lse)", pybind11::arg("q"),
        pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("ranges"), pybind11::arg("positions"),
        pybind11::arg("scale"), pybind11::arg("use_mma"), pybind11::arg("tune") = std::vector<int64_t>{},
        pybind11::arg("clip") = false, pybind11::arg("counter") = pybind11::none(), pybind11::arg("kv_bytes") = 0);
  m.def("plan", &plan, "the launch fwd would make (benchmarks report it)");
}
