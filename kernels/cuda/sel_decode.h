// Host interface of the selection decode kernels (sel_decode.cu), shared with the binding.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace selgate {

enum class Dtype : int { kHalf = 0, kBFloat16 = 1, kFloat = 2 };

// One decode call. Tensors are contiguous: q [B,1,G,h,Dk], k [B,G,S_kv,Dk],
// v [B,G,S_kv,Dv], ranges int32/int64 [B,1,G,n,2], positions int32/int64 [B,1] or null,
// o [B,1,G,h,Dv] (dtype of v), lse fp32 [B,1,G,h].
struct DecodeArgs {
  Dtype dtype;
  bool use_mma;  // tensor-core kernel (fp16/bf16 only); otherwise the SIMT kernel
  const void* q;
  const void* k;
  const void* v;
  const void* ranges;
  const void* positions;
  bool ranges_i64, positions_i64;
  void* o;
  float* lse;
  int64_t B, G, h, S_kv;
  int Dk, Dv, n;
  float scale;
};

// Launches on `stream`; throws c10::Error on an unsupported configuration or launch error.
void sel_decode_launch(const DecodeArgs& args, cudaStream_t stream);

}  // namespace selgate
