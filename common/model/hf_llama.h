// LLaMA (transformers' LlamaForCausalLM) as an HfArchitecture (common/model/hf_checkpoint.h).
//
// A pipetrain model is a LLaMA when its layers are exactly
//   embedding without a position table (positions: NONE)  -> model.embed_tokens
//   llama_block x num_hidden_layers (one configuration)   -> model.layers.<i>.{input_layernorm,
//       self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}
//   rms_norm (the blocks' eps)                            -> model.norm
//   linear without bias, vocab_size outputs               -> lm_head (not tied to embed_tokens)
// with a softmax cross-entropy loss. The numerics agree: pre-RMSNorm blocks with one
// rms_norm_eps, rotary position embeddings in the "rotate half" pairing (feature i of a head with
// feature i + head_dim/2, common/math/rope.h) -- the pairing of transformers' modeling_llama, so
// q_proj and k_proj are stored as they are, with no permutation of rows (the permutation
// transformers' convert_llama_weights_to_hf.py applies is from Meta's interleaved pairing, which
// pipetrain does not use) -- grouped-query attention with query head h reading key/value head
// h / (heads / kv_heads) (repeat_kv), SwiGLU with SiLU, no biases. Every weight is an nn.Linear
// [out, in], as pipetrain's: nothing is transposed.
#ifndef PIPETRAIN_COMMON_MODEL_HF_LLAMA_H_
#define PIPETRAIN_COMMON_MODEL_HF_LLAMA_H_

#include "common/model/hf_checkpoint.h"

namespace pipetrain::model {

const HfArchitecture& LlamaArchitecture();

}  // namespace pipetrain::model

#endif  // PIPETRAIN_COMMON_MODEL_HF_LLAMA_H_
