"""`pipetrain export --format hf` loaded into a plain PyTorch GPT-2 gives pipetrain's logits.

The export of a trained examples/gpt_char.textproto is read with numpy only (the safetensors
format by hand: no `safetensors` or `transformers` package), run through the GPT-2 forward pass
written below from transformers' GPT2LMHeadModel semantics (Conv1D weights [in, out], pre-LN
blocks, gelu_new, causal attention scaled by 1/sqrt(head dim), untied lm_head), and compared with
the checkpoint's own outputs (checkpoint_logits, the same Stage::Forward as training): within
1e-5. Then `pipetrain import` turns the export back into the checkpoint, byte for byte.
The same for examples/llama_char.textproto and a LLaMA forward pass written like transformers'
modeling_llama (RMSNorm, rotate_half RoPE, repeat_kv, SwiGLU).

Environment (tests/common/model/CMakeLists.txt): PIPETRAIN_BINARY, PIPETRAIN_CHECKPOINT_LOGITS,
PIPETRAIN_SOURCE_DIR.
"""

import json
import math
import os
import struct
import subprocess

import numpy as np
import torch
import torch.nn.functional as F

PIPETRAIN = os.environ["PIPETRAIN_BINARY"]
LOGITS = os.environ["PIPETRAIN_CHECKPOINT_LOGITS"]
SOURCE = os.environ["PIPETRAIN_SOURCE_DIR"]


def run(*args):
    p = subprocess.run(list(args), capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, f"{args}: {p.stdout}{p.stderr}"
    return p.stdout


def read_safetensors(path):
    """{name: float32 array} from a safetensors file, parsed with struct + json + numpy."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    buffer = data[8 + n :]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        assert entry["dtype"] == "F32", (name, entry["dtype"])
        begin, end = entry["data_offsets"]
        tensors[name] = np.frombuffer(buffer[begin:end], dtype="<f4").reshape(entry["shape"])
    return tensors


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def gpt2_logits(w, config, ids):
    """GPT2LMHeadModel's forward pass (eval mode) on ids [batch, T], in float64."""
    d, heads, eps = config["n_embd"], config["n_head"], config["layer_norm_epsilon"]
    hd = d // heads
    b, t = ids.shape
    h = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][:t]
    causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
    for i in range(config["n_layer"]):
        p = f"transformer.h.{i}."
        a = F.layer_norm(h, (d,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        qkv = a @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]  # Conv1D: x W + b
        q, k, v = (x.view(b, t, heads, hd).transpose(1, 2) for x in qkv.split(d, dim=-1))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        scores = scores.masked_fill(~causal, float("-inf"))
        o = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, t, d)
        h = h + o @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        m = F.layer_norm(h, (d,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        m = gelu_new(m @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
        h = h + m @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    h = F.layer_norm(h, (d,), w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], eps)
    return h @ w["lm_head.weight"].T  # nn.Linear, no bias


def test_export_matches_a_pytorch_gpt2_and_imports_back_byte_for_byte(tmp_path):
    ckpt, hf, back = tmp_path / "ckpt", tmp_path / "hf", tmp_path / "back"
    model = os.path.join(SOURCE, "examples", "gpt_char.textproto")
    run(PIPETRAIN, "reference", "--model", model, "--data", "text", "--steps", "4",
        "--batch", "4", "--microbatches", "2", "--seed", "3", "--save", str(ckpt))
    out = run(PIPETRAIN, "export", "--format", "hf", "--resume", str(ckpt), str(hf))
    assert "as gpt2" in out, out

    config = json.loads((hf / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["activation_function"] == "gelu_new"
    assert config["tie_word_embeddings"] is False
    vocab = json.loads((hf / "vocab.json").read_text())
    assert len(vocab) == config["vocab_size"]
    weights = {k: torch.from_numpy(v.astype(np.float64))
               for k, v in read_safetensors(hf / "model.safetensors").items()}

    # Two samples: a sentence of the training text through vocab.json, and random ids.
    t = config["n_positions"]
    text = "This program is free software: you can redistribute it"[:t]
    first = [vocab[chr(b)] for b in text.encode("latin-1")]
    rng = np.random.default_rng(7)
    ids = np.stack([np.array(first), rng.integers(0, config["vocab_size"], size=t)])

    theirs = gpt2_logits(weights, config, torch.from_numpy(ids)).reshape(-1, config["vocab_size"])
    stdin = " ".join(str(int(i)) for i in ids.reshape(-1))
    p = subprocess.run([LOGITS, str(ckpt)], input=stdin, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    ours = np.array([[float(x) for x in line.split()] for line in p.stdout.splitlines()])
    assert ours.shape == tuple(theirs.shape)
    difference = np.max(np.abs(ours - theirs.numpy()))
    assert difference <= 1e-5, difference
    assert np.max(np.abs(ours)) > 0.1  # not trivially equal

    run(PIPETRAIN, "import", "--format", "hf", str(hf), "--save", str(back))
    names = sorted(os.listdir(ckpt))
    assert sorted(os.listdir(back)) == names
    for name in names:
        assert (back / name).read_bytes() == (ckpt / name).read_bytes(), name


# ---- LLaMA ----


def rms_norm(x, weight, eps):
    """LlamaRMSNorm: x / sqrt(mean(x^2) + eps) * weight."""
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def rotate_half(x):
    """modeling_llama's rotate_half: feature i is paired with feature i + head_dim/2."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate_interleaved(x):
    """Meta's original pairing, for contrast: feature 2i with feature 2i+1."""
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def rotary_cos_sin(head_dim, t, theta, interleaved=False):
    """LlamaRotaryEmbedding (default rope type): cos and sin [t, head_dim] (in double)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    freqs = torch.outer(torch.arange(t, dtype=torch.float64), inv_freq)
    if interleaved:
        emb = freqs.repeat_interleave(2, dim=-1)
    else:
        emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def repeat_kv(x, groups):
    """modeling_llama's repeat_kv: [b, kv, t, hd] -> [b, kv * groups, t, hd], kv head j first
    serving query heads j*groups .. j*groups+groups-1."""
    b, kv, t, hd = x.shape
    return x[:, :, None, :, :].expand(b, kv, groups, t, hd).reshape(b, kv * groups, t, hd)


def llama_logits(w, config, ids, interleaved=False):
    """LlamaForCausalLM's forward pass (eval mode, no cache) on ids [batch, T], in float64;
    with `interleaved`, RoPE in Meta's pairing instead of modeling_llama's."""
    d, heads = config["hidden_size"], config["num_attention_heads"]
    kv, eps = config["num_key_value_heads"], config["rms_norm_eps"]
    hd = d // heads
    b, t = ids.shape
    cos, sin = rotary_cos_sin(hd, t, config["rope_theta"], interleaved)
    rotate = rotate_interleaved if interleaved else rotate_half
    causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
    h = w["model.embed_tokens.weight"][ids]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        q = (a @ w[p + "self_attn.q_proj.weight"].T).view(b, t, heads, hd).transpose(1, 2)
        k = (a @ w[p + "self_attn.k_proj.weight"].T).view(b, t, kv, hd).transpose(1, 2)
        v = (a @ w[p + "self_attn.v_proj.weight"].T).view(b, t, kv, hd).transpose(1, 2)
        q = q * cos + rotate(q) * sin  # apply_rotary_pos_emb
        k = k * cos + rotate(k) * sin
        k, v = repeat_kv(k, heads // kv), repeat_kv(v, heads // kv)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        scores = scores.masked_fill(~causal, float("-inf"))
        o = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, t, d)
        h = h + o @ w[p + "self_attn.o_proj.weight"].T
        m = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        gate = F.silu(m @ w[p + "mlp.gate_proj.weight"].T)
        h = h + (gate * (m @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    h = rms_norm(h, w["model.norm.weight"], eps)
    return h @ w["lm_head.weight"].T


def checkpoint_logits(ckpt, ids):
    stdin = " ".join(str(int(i)) for i in ids.reshape(-1))
    p = subprocess.run([LOGITS, str(ckpt)], input=stdin, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    return np.array([[float(x) for x in line.split()] for line in p.stdout.splitlines()])


def test_llama_export_matches_a_pytorch_llama_and_imports_back_byte_for_byte(tmp_path):
    """pipetrain's RoPE pairs feature i with i + head_dim/2, as modeling_llama's rotate_half
    does: q_proj and k_proj are exported unpermuted and the logits agree."""
    ckpt, hf, back = tmp_path / "ckpt", tmp_path / "hf", tmp_path / "back"
    model = os.path.join(SOURCE, "examples", "llama_char.textproto")
    run(PIPETRAIN, "reference", "--model", model, "--data", "text", "--steps", "4",
        "--batch", "4", "--microbatches", "2", "--seed", "3", "--save", str(ckpt))
    out = run(PIPETRAIN, "export", "--format", "hf", "--resume", str(ckpt), str(hf))
    assert "as llama" in out, out

    config = json.loads((hf / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["hidden_act"] == "silu"
    assert config["num_key_value_heads"] < config["num_attention_heads"]  # grouped-query
    assert config["tie_word_embeddings"] is False
    vocab = json.loads((hf / "vocab.json").read_text())
    weights = {k: torch.from_numpy(v.astype(np.float64))
               for k, v in read_safetensors(hf / "model.safetensors").items()}

    t = config["max_position_embeddings"]
    text = "This program is free software: you can redistribute it"[:t]
    first = [vocab[chr(b)] for b in text.encode("latin-1")]
    rng = np.random.default_rng(11)
    ids = np.stack([np.array(first), rng.integers(0, config["vocab_size"], size=t)])

    theirs = llama_logits(weights, config, torch.from_numpy(ids)).reshape(-1, config["vocab_size"])
    ours = checkpoint_logits(ckpt, ids)
    assert ours.shape == tuple(theirs.shape)
    difference = np.max(np.abs(ours - theirs.numpy()))
    assert difference <= 1e-5, difference
    assert np.max(np.abs(ours)) > 0.1  # not trivially equal

    # Meta's interleaved pairing (features 2i, 2i+1) is another model: the comparison tells.
    other = llama_logits(weights, config, torch.from_numpy(ids), interleaved=True)
    assert np.max(np.abs(ours - other.reshape(-1, config["vocab_size"]).numpy())) > 1e-3

    run(PIPETRAIN, "import", "--format", "hf", str(hf), "--save", str(back))
    names = sorted(os.listdir(ckpt))
    assert sorted(os.listdir(back)) == names
    for name in names:
        assert (back / name).read_bytes() == (ckpt / name).read_bytes(), name
