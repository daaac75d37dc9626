// GPT-2 (transformers' GPT2LMHeadModel) as an HfArchitecture (common/model/hf_checkpoint.h).
//
// A pipetrain model is a GPT-2 when its layers are exactly
//   embedding (token + learned position)      -> transformer.wte, transformer.wpe
//   transformer_block x n_layer (one n_head)  -> transformer.h.<i>.{ln_1, attn.c_attn, attn.c_proj,
//                                                ln_2, mlp.c_fc, mlp.c_proj}
//   layer_norm (eps 1e-5, the blocks')        -> transformer.ln_f
//   linear without bias, vocab_size outputs   -> lm_head (not tied to wte)
// with a softmax cross-entropy loss. The numerics agree: pre-LN blocks, LayerNorm eps 1e-5,
// causal attention scaled by 1/sqrt(head dim), GELU's tanh approximation ("gelu_new"), biases on
// every block projection. GPT-2's Conv1D stores [in, out], so c_attn, c_proj, c_fc and
// mlp.c_proj are pipetrain's [out, in] weights transposed; lm_head is an nn.Linear ([out, in]).
#ifndef PIPETRAIN_COMMON_MODEL_HF_GPT2_H_
#define PIPETRAIN_COMMON_MODEL_HF_GPT2_H_

#include "common/model/hf_checkpoint.h"

namespace pipetrain::model {

const HfArchitecture& Gpt2Architecture();

}  // namespace pipetrain::model

#endif  // PIPETRAIN_COMMON_MODEL_HF_GPT2_H_
