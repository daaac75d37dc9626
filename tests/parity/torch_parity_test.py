#!/usr/bin/env python3
"""PyTorch parity of pipetrain's transformer layers (docs/numerics.md, "PyTorch parity").

Trains a LLaMA-style model (embedding without a position table, llama_block with RoPE, grouped-query
attention and SwiGLU, rms_norm, a bias-free head), the same with the head tied to the embedding
(tie_embeddings: one parameter, as torch shares one tensor) and a GPT model (embedding,
transformer_block, layer_norm, linear) for 20 steps with `pipetrain reference`, once with SGD (momentum, weight decay)
and once with AdamW, and the same models written here in plain PyTorch (float64, the exact math
the layers document), from the same initial weights and on the same batches. Asserts that every
step's loss and every final weight tensor agree to 1e-5 relative (losses: |a - b| / |b|; weights:
||a - b|| / ||b|| per tensor).

Why per tensor and not per element: AdamW divides every gradient element by its own running RMS,
so float32 rounding in a small, cancelling gradient element (attention: each softmax-gradient row
sums to 0; a momentum that changes sign) reaches the weights as strongly as a large one. A few such
elements of a tensor then differ by up to ~1e-4 of the tensor's largest weight -- between two
pipetrain runs at different instruction-set levels (x86-64-v3 and -v4, both correct to float
rounding) as much as between pipetrain and PyTorch -- while the tensor as a whole agrees to ~1e-6.
One parameter is left out: the key third of a transformer_block's attn.qkv.bias has an exactly zero
gradient (adding q . b_k to a row of scores does not change its softmax), so its float gradient is
rounding noise that AdamW turns into updates; it does not affect the loss.

The initial weights come from pipetrain itself: one step of SGD with lr 1e-30 (`--save`) changes
no weight by as much as one float ulp, except those initialised to exactly 0 (biases), which move
by about 1e-30 -- nothing at this tolerance. The batches come from pipetrain.data, which reproduces
the CLI's batch order (docs/python.md). Checkpoints are read with numpy (safetensors layout).

Environment: PIPETRAIN_BINARY (the pipetrain CLI) and PYTHONPATH with the built Python package;
CTest sets both. Exits 77 (CTest: skipped) with a message when PyTorch is not installed.
"""

import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("SKIPPED: PyTorch is not installed (Debian package python3-torch, listed in "
          "scripts/setup.sh); the PyTorch parity test needs it")
    sys.exit(77)

from pipetrain import data as ptdata

PIPETRAIN = os.environ.get("PIPETRAIN_BINARY", "pipetrain")
STEPS = 20
BATCH = 16
MICROBATCHES = 2
SEED = 3
TOLERANCE = 1e-5

LLAMA = """
name: "llama_parity"
input_features: 1
layers { embedding { vocab_size: 0 dim: 32 context: 16 positions: NONE } }
layers { llama_block { heads: 4 kv_heads: 2 hidden: 64 } }
layers { llama_block { heads: 4 kv_heads: 1 multiple_of: 32 rope_theta: 500 norm_eps: 1e-6 } }
layers { llama_block { heads: 2 } }
layers { rms_norm {} }
layers { linear { out_features: 0 no_bias: true } }
loss { softmax_cross_entropy {} }
"""

# LLAMA with a tied input/output embedding: the head's weight is the embedding's token table, one
# parameter (torch: one leaf tensor used twice, whose gradient autograd sums).
LLAMA_TIED = LLAMA + "tie_embeddings: true\n"

GPT = """
name: "gpt_parity"
input_features: 1
layers { embedding { vocab_size: 0 dim: 32 context: 16 } }
layers { transformer_block { heads: 4 } }
layers { transformer_block { heads: 2 mlp_ratio: 2 } }
layers { layer_norm {} }
layers { linear { out_features: 0 } }
loss { softmax_cross_entropy {} }
"""

# The layers of each model as the torch code below runs them: (kind, options). Mirrors the specs
# above with their defaults resolved (docs/training.md, "Models").
LLAMA_LAYERS = [
    ("embedding", {}),
    ("llama_block", {"heads": 4, "kv_heads": 2, "theta": 10000.0, "eps": 1e-5}),
    ("llama_block", {"heads": 4, "kv_heads": 1, "theta": 500.0, "eps": float(np.float32(1e-6))}),
    ("llama_block", {"heads": 2, "kv_heads": 2, "theta": 10000.0, "eps": 1e-5}),
    ("rms_norm", {"eps": 1e-5}),
    ("linear", {}),
]
LLAMA_TIED_LAYERS = LLAMA_LAYERS[:-1] + [("linear", {"tied": True})]
GPT_LAYERS = [
    ("embedding", {}),
    ("transformer_block", {"heads": 4}),
    ("transformer_block", {"heads": 2}),
    ("layer_norm", {"eps": 1e-5}),
    ("linear", {}),
]

# pipetrain parses decimal numbers once to float32; torch gets those very values.
def f32(x):
    return float(np.float32(x))


OPTIMIZERS = {
    "sgd": ("sgd:lr=0.5,momentum=0.9,weight_decay=0.01",
            lambda p: torch.optim.SGD(p, lr=f32(0.5), momentum=f32(0.9), weight_decay=f32(0.01))),
    "adamw": ("adamw:lr=0.001,weight_decay=0.1",
              lambda p: torch.optim.AdamW(p, lr=f32(0.001), betas=(f32(0.9), f32(0.999)),
                                          eps=f32(1e-8), weight_decay=f32(0.1))),
}
# The tied model with SGD at lr 0.5 diverges (loss 4.3 -> 7.8 in 4 steps: the table takes both
# layers' gradients), and a diverging run amplifies float rounding past any tolerance; lr 0.1.
TIED_OPTIMIZERS = dict(OPTIMIZERS)
TIED_OPTIMIZERS["sgd"] = (
    "sgd:lr=0.1,momentum=0.9,weight_decay=0.01",
    lambda p: torch.optim.SGD(p, lr=f32(0.1), momentum=f32(0.9), weight_decay=f32(0.01)))


def read_safetensors(path):
    """{name: float32 array} of a safetensors file (8-byte header length, JSON header, data)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise ValueError("%s: tensor %s has dtype %s, expected F32" % (path, name, info["dtype"]))
        begin, end = info["data_offsets"]
        tensors[name] = np.frombuffer(raw[8 + n + begin:8 + n + end],
                                      dtype="<f4").reshape(info["shape"])
    return tensors


def read_weights(directory):
    """Every "layers.L.NAME" tensor of a pipetrain checkpoint directory."""
    weights = {}
    for path in sorted(glob.glob(os.path.join(directory, "layer-*.safetensors"))):
        for name, value in read_safetensors(path).items():
            if name.startswith("layers."):
                weights[name] = value
    if not weights:
        raise AssertionError("no layer files in %s" % directory)
    return weights


def run_reference(model_path, optimizer, steps, save_dir):
    """`pipetrain reference` on the bundled text; returns the per-step losses (--json)."""
    cmd = [PIPETRAIN, "reference", "--model", model_path, "--data", "text", "--steps", str(steps),
           "--batch", str(BATCH), "--microbatches", str(MICROBATCHES), "--seed", str(SEED),
           "--threads", "1", "--optimizer", optimizer, "--eval-samples", "1", "--json",
           "--save", save_dir]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        raise AssertionError("%s failed (%d):\n%s%s" % (" ".join(cmd), run.returncode, run.stdout,
                                                         run.stderr))
    losses = [json.loads(line)["loss"] for line in run.stdout.splitlines()
              if line.startswith('{"step"')]
    if len(losses) != steps:
        raise AssertionError("expected %d loss lines, got:\n%s" % (steps, run.stdout))
    return losses


# ----- The models in plain PyTorch ---------------------------------------------------------------

def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, theta):
    """Rotary embeddings, "rotate half" pairs (i, i + hd/2); x [B, T, heads, hd]."""
    t, hd = x.shape[1], x.shape[3]
    inv_freq = theta ** (-torch.arange(0, hd // 2, dtype=torch.float64) * 2.0 / hd)
    angle = torch.arange(t, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos = torch.cat([angle.cos(), angle.cos()], dim=-1)[None, :, None, :]
    sin = torch.cat([angle.sin(), angle.sin()], dim=-1)[None, :, None, :]
    rotated = torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], dim=-1)
    return x * cos + rotated * sin


def causal_attention(q, k, v):
    """q [B, T, H, hd], k and v [B, T, K, hd] (query head h reads kv head h // (H/K))."""
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    q, k, v = (a.transpose(1, 2) for a in (q, k, v))  # [B, H, T, hd]
    t, hd = q.shape[2], q.shape[3]
    scores = q @ k.transpose(-1, -2) / hd ** 0.5
    mask = torch.ones(t, t, dtype=torch.bool).triu(1)
    p = scores.masked_fill(mask, float("-inf")).softmax(-1)
    return (p @ v).transpose(1, 2).reshape(q.shape[0], t, -1)


def llama_block(x, p, o):
    b, t, d = x.shape
    hd = d // o["heads"]
    a = rms_norm(x, p["attn_norm.weight"], o["eps"])
    q = rope((a @ p["attn.q.weight"].T).view(b, t, o["heads"], hd), o["theta"])
    k = rope((a @ p["attn.k.weight"].T).view(b, t, o["kv_heads"], hd), o["theta"])
    v = (a @ p["attn.v.weight"].T).view(b, t, o["kv_heads"], hd)
    h = x + causal_attention(q, k, v) @ p["attn.o.weight"].T
    m = rms_norm(h, p["mlp_norm.weight"], o["eps"])
    mlp = F.silu(m @ p["mlp.gate.weight"].T) * (m @ p["mlp.up.weight"].T)
    return h + mlp @ p["mlp.down.weight"].T


def transformer_block(x, p, o):
    b, t, d = x.shape
    hd = d // o["heads"]
    a = F.layer_norm(x, (d,), p["ln1.weight"], p["ln1.bias"], 1e-5)
    qkv = a @ p["attn.qkv.weight"].T + p["attn.qkv.bias"]
    q, k, v = (qkv[..., i * d:(i + 1) * d].reshape(b, t, o["heads"], hd) for i in range(3))
    h = x + causal_attention(q, k, v) @ p["attn.proj.weight"].T + p["attn.proj.bias"]
    m = F.layer_norm(h, (d,), p["ln2.weight"], p["ln2.bias"], 1e-5)
    f = F.gelu(m @ p["mlp.fc.weight"].T + p["mlp.fc.bias"], approximate="tanh")
    return h + f @ p["mlp.proj.weight"].T + p["mlp.proj.bias"]


def forward(layers, params, tokens):
    """Logits [B * T, vocab] of token ids [B, T]."""
    x = None
    for index, (kind, o) in enumerate(layers):
        p = params[index]
        if kind == "embedding":
            x = p["token.weight"][tokens]
            if "position.weight" in p:
                x = x + p["position.weight"][None, :tokens.shape[1]]
        elif kind == "llama_block":
            x = llama_block(x, p, o)
        elif kind == "transformer_block":
            x = transformer_block(x, p, o)
        elif kind == "rms_norm":
            x = rms_norm(x, p["weight"], o["eps"])
        elif kind == "layer_norm":
            x = F.layer_norm(x, (x.shape[-1],), p["weight"], p["bias"], o["eps"])
        elif kind == "linear":
            weight = params[0]["token.weight"] if o.get("tied") else p["weight"]
            x = x @ weight.T + (p["bias"] if "bias" in p else 0)
        else:
            raise ValueError(kind)
    return x.reshape(-1, x.shape[-1])


def train_torch(layers, initial, make_optimizer, dataset):
    """Trains from `initial` ({"layers.L.NAME": array}); returns (losses, final weights)."""
    params = [dict() for _ in layers]
    for name, value in initial.items():
        _, index, pname = name.split(".", 2)
        params[int(index)][pname] = torch.tensor(value, dtype=torch.float64, requires_grad=True)
    optimizer = make_optimizer([t for p in params for t in p.values()])
    losses = []
    context = dataset.tokens_per_sample
    for inputs, targets in ptdata.batches(dataset, BATCH, seed=SEED, steps=STEPS):
        tokens = torch.from_numpy(inputs.astype(np.int64).reshape(BATCH, context))
        labels = torch.from_numpy(targets.astype(np.int64).reshape(-1))
        optimizer.zero_grad()
        loss = F.cross_entropy(forward(layers, params, tokens), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    final = {"layers.%d.%s" % (i, n): t.detach().numpy() for i, p in enumerate(params)
             for n, t in p.items()}
    return losses, final


class TorchParityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(1)
        cls.dir = tempfile.mkdtemp(prefix="pipetrain_parity_")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def check(self, label, spec, layers, optimizers=OPTIMIZERS):
        model = os.path.join(self.dir, label + ".textproto")
        with open(model, "w") as f:
            f.write(spec)
        init_dir = os.path.join(self.dir, label + "-init")
        run_reference(model, "sgd:lr=1e-30", 1, init_dir)
        initial = read_weights(init_dir)
        dataset = ptdata.load("text", context=16)
        for name, (text, make_optimizer) in optimizers.items():
            with self.subTest(model=label, optimizer=name):
                save_dir = os.path.join(self.dir, "%s-%s" % (label, name))
                want_losses = run_reference(model, text, STEPS, save_dir)
                got_losses, got_weights = train_torch(layers, initial, make_optimizer, dataset)
                for step, (want, got) in enumerate(zip(want_losses, got_losses), start=1):
                    self.assertLessEqual(abs(want - got) / abs(got), TOLERANCE,
                                         "step %d: pipetrain %r, torch %r" % (step, want, got))
                want_weights = read_weights(save_dir)
                self.assertEqual(sorted(want_weights), sorted(got_weights))
                worst = 0.0
                for tensor, want in want_weights.items():
                    got = got_weights[tensor]
                    self.assertEqual(want.shape, got.shape, tensor)
                    if tensor.endswith("attn.qkv.bias"):  # drop the key third (docstring).
                        third = want.shape[0] // 3
                        want = np.concatenate([want[:third], want[2 * third:]])
                        got = np.concatenate([got[:third], got[2 * third:]])
                    error = np.linalg.norm(want - got) / max(np.linalg.norm(got), 1e-30)
                    worst = max(worst, error)
                    self.assertLessEqual(error, TOLERANCE,
                                         "%s: ||difference|| / ||w|| = %g (max |difference| %g, "
                                         "max |w| %g)" % (tensor, error, np.abs(want - got).max(),
                                                          np.abs(got).max()))
                # Training moved the weights well beyond the tolerance (the test has teeth).
                moved = max(np.abs(want_weights[t] - initial[t]).max() /
                            max(np.abs(initial[t]).max(), 1e-30) for t in initial)
                self.assertGreater(moved, 100 * TOLERANCE)
                print("%s %s: max loss error %.2e, max weight error %.2e, first/last loss %.4f "
                      "%.4f" % (label, name, max(abs(w - g) / abs(g) for w, g in
                                                   zip(want_losses, got_losses)),
                                worst, want_losses[0], want_losses[-1]))

    def test_llama(self):
        self.check("llama", LLAMA, LLAMA_LAYERS)

    def test_llama_tied(self):
        self.check("llama_tied", LLAMA_TIED, LLAMA_TIED_LAYERS, TIED_OPTIMIZERS)

    def test_gpt(self):
        self.check("gpt", GPT, GPT_LAYERS)


if __name__ == "__main__":
    unittest.main(verbosity=2)
