#!/usr/bin/env python3
"""The models of bench/peer_bench.sh trained in PyTorch: the peer pipetrain is measured against
(docs/performance.md, "PyTorch peer"). --model picks one:

  mlp    the deep benchmark MLP (examples/deep_mlp.textproto).
  gpt    a nanoGPT-style GPT (bench/gpt_peer.textproto): token + learned position embedding,
         4 pre-LN blocks (d=256, 8 heads, context 128, MLP 4d, exact GELU; causal attention as
         nanoGPT writes it for PyTorch < 2.0: q k^T, masked_fill, softmax, @ v), final LayerNorm,
         a bias-free head.
  llama  a LLaMA-style model (bench/llama_peer.textproto): token embedding, 4 blocks of RMSNorm,
         rotary embeddings, grouped-query attention (8 query heads, 4 key/value heads) and a
         SwiGLU MLP (hidden 768), no biases, final RMSNorm, a bias-free head.

For gpt and llama a sample is CONTEXT random token ids below --vocab with random next-token
targets, the loss the mean cross-entropy over every token of the batch; every matrix is drawn
from N(0, 0.02), biases 0 and norm weights 1 (pipetrain's init scale).

Two modes, both one compute thread per process, SGD, softmax cross-entropy averaged over the
whole batch, the batch split into M micro-batches whose gradients accumulate:

  single   a plain single-process loop: for each micro-batch forward, loss, backward; then step.
  1f1b     a hand-rolled 1F1B pipeline over torch.distributed (gloo) with 2 ranks on 127.0.0.1,
           in the style of picotron/nanotron: rank 0 holds the first half of the layers, rank 1
           the rest and the loss; activations and gradients go by isend/irecv, paired the way
           picotron pairs them (send forward + receive backward, and the reverse) so that the
           blocking pairs cannot deadlock.

--pin (1f1b only) runs each rank on a CPU of its own, as `pipetrain local` runs its workers
(docs/performance.md, "One core per worker"): the row that shows what pinning alone is worth to
PyTorch.

Prints `samples_per_s <float>` — B * (steps - 1) / (wall time of steps 2..steps), i.e. the steady
state after one warm-up step, measured between barriers; single mode also `cpu_samples_per_s`, the
same over the process's CPU time — and `final_loss <float>`, the last
step's loss, which both modes share up to rounding (same seed, weights and batches). Exits 3 with a message on
stderr if torch is missing. Usage:
  bench/torch_peer.py --mode single|1f1b [--model mlp|gpt|llama] [--vocab 76] [--pin]
                      [--batch 256] [--microbatches 8] [--steps 25]
"""
import argparse
import math
import os
import sys
import time

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn.functional as F
    from torch import nn
except ImportError:
    sys.stderr.write("torch_peer: PyTorch is not installed (Debian: apt-get install python3-torch)\n")
    sys.exit(3)

# examples/deep_mlp.textproto: 256 inputs, 16 x (Linear 512 + ReLU), Linear 16, softmax CE.
INPUT_FEATURES = 256
HIDDEN = 512
HIDDEN_LAYERS = 16
CLASSES = 16
LR = 0.01
# bench/gpt_peer.textproto and bench/llama_peer.textproto (the shapes).
DIM = 256
HEADS = 8
KV_HEADS = 4
CONTEXT = 128
BLOCKS = 4
LLAMA_HIDDEN = 768  # LLaMA's rule: 256 * ceil(floor(8 * 256 / 3) / 256)
ROPE_THETA = 10000.0


def mlp_layers():
    """The deep MLP as a flat list of modules, in pipetrain's layer order."""
    out = []
    width = INPUT_FEATURES
    for _ in range(HIDDEN_LAYERS):
        out += [nn.Linear(width, HIDDEN), nn.ReLU()]
        width = HIDDEN
    out.append(nn.Linear(width, CLASSES))
    return out


def mlp_split_point(mods):
    """Index splitting `mods` into two halves of (nearly) equal forward FLOPs, after a ReLU."""
    flops = [m.in_features * m.out_features if isinstance(m, nn.Linear) else 0 for m in mods]
    total, acc, best, best_gap = sum(flops), 0, 0, None
    for i, f in enumerate(flops):
        acc += f
        if isinstance(mods[i], nn.ReLU):
            gap = abs(total - 2 * acc)
            if best_gap is None or gap < best_gap:
                best, best_gap = i + 1, gap
    return best


class GptEmbedding(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.wte = nn.Embedding(vocab, DIM)
        self.wpe = nn.Embedding(CONTEXT, DIM)

    def forward(self, idx):
        return self.wte(idx) + self.wpe(torch.arange(idx.size(1)))


class GptBlock(nn.Module):
    """nanoGPT's Block (model.py) with its PyTorch < 2.0 attention path."""

    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.c_attn, self.c_proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.c_fc, self.mlp_proj = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)
        self.gelu = nn.GELU()
        self.register_buffer("bias", torch.tril(torch.ones(CONTEXT, CONTEXT)).view(
            1, 1, CONTEXT, CONTEXT))

    def attn(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(c, dim=2)
        q = q.view(b, t, HEADS, c // HEADS).transpose(1, 2)
        k = k.view(b, t, HEADS, c // HEADS).transpose(1, 2)
        v = v.view(b, t, HEADS, c // HEADS).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(self.gelu(self.c_fc(self.ln_2(x))))


class RmsNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables():
    hd = DIM // HEADS
    inv = 1.0 / (ROPE_THETA ** (torch.arange(0, hd, 2).float() / hd))
    freqs = torch.outer(torch.arange(CONTEXT).float(), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaBlock(nn.Module):
    """Hugging Face's LlamaDecoderLayer (4.3x, PyTorch < 2.0 attention path), no biases."""

    def __init__(self):
        super().__init__()
        hd = DIM // HEADS
        self.attn_norm, self.mlp_norm = RmsNorm(DIM), RmsNorm(DIM)
        self.q = nn.Linear(DIM, DIM, bias=False)
        self.k = nn.Linear(DIM, KV_HEADS * hd, bias=False)
        self.v = nn.Linear(DIM, KV_HEADS * hd, bias=False)
        self.o = nn.Linear(DIM, DIM, bias=False)
        self.gate = nn.Linear(DIM, LLAMA_HIDDEN, bias=False)
        self.up = nn.Linear(DIM, LLAMA_HIDDEN, bias=False)
        self.down = nn.Linear(LLAMA_HIDDEN, DIM, bias=False)
        cos, sin = rope_tables()
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)
        self.register_buffer("mask", torch.full((CONTEXT, CONTEXT), float("-inf")).triu(1))

    def attn(self, x):
        b, t, _ = x.size()
        hd = DIM // HEADS
        q = self.q(x).view(b, t, HEADS, hd).transpose(1, 2)
        k = self.k(x).view(b, t, KV_HEADS, hd).transpose(1, 2)
        v = self.v(x).view(b, t, KV_HEADS, hd).transpose(1, 2)
        cos, sin = self.cos[:t], self.sin[:t]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)  # repeat_kv
        v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
        att = (q @ k.transpose(2, 3)) / math.sqrt(hd) + self.mask[:t, :t]
        att = F.softmax(att, dim=-1, dtype=torch.float32)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, DIM)
        return self.o(y)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def transformer_layers(kind, vocab):
    """The model as a flat list of modules in pipetrain's layer order, initialised at pipetrain's
    scale."""
    if kind == "gpt":
        mods = [GptEmbedding(vocab)] + [GptBlock() for _ in range(BLOCKS)] + [nn.LayerNorm(DIM)]
    else:
        mods = [nn.Embedding(vocab, DIM)] + [LlamaBlock() for _ in range(BLOCKS)] + [RmsNorm(DIM)]
    mods.append(nn.Linear(DIM, vocab, bias=False))
    for mod in mods:
        for name, prm in mod.named_parameters():
            with torch.no_grad():
                if prm.dim() == 2:
                    prm.normal_(0.0, 0.02)
                elif "bias" in name:
                    prm.zero_()
    return mods


class Workload:
    """What a mode trains: the layers, where 1F1B cuts them, the batches and the activation shape
    that crosses the cut."""

    def __init__(self, args):
        self.kind = args.model
        self.mods = mlp_layers() if self.kind == "mlp" else transformer_layers(self.kind, args.vocab)
        # mlp: equal FLOPs; transformers: the first half of the blocks with the embedding.
        self.cut = mlp_split_point(self.mods) if self.kind == "mlp" else 1 + BLOCKS // 2
        self.args = args

    def batches(self, count):
        """`count` fixed batches, generated before timing: mlp inputs N(0,1) and labels uniform;
        transformers random token ids and next-token targets."""
        g = torch.Generator().manual_seed(self.args.seed)
        b = self.args.batch
        if self.kind == "mlp":
            return [(torch.randn(b, INPUT_FEATURES, generator=g),
                     torch.randint(0, CLASSES, (b,), generator=g)) for _ in range(count)]
        out = []
        for _ in range(count):
            ids = torch.randint(0, self.args.vocab, (b, CONTEXT + 1), generator=g)
            out.append((ids[:, :-1].contiguous(), ids[:, 1:].contiguous()))
        return out

    def act_shape(self, rows):
        return (rows, HIDDEN) if self.kind == "mlp" else (rows, CONTEXT, DIM)

    def loss(self, out, y):
        """The micro-batch's share of the batch-mean loss."""
        if self.kind == "mlp":
            return F.cross_entropy(out, y, reduction="sum") / self.args.batch
        return F.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1),
                               reduction="sum") / (self.args.batch * CONTEXT)


def one_thread():
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set in this process


def run_single(args):
    one_thread()
    torch.manual_seed(args.seed)
    work = Workload(args)
    model = nn.Sequential(*work.mods)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    batches = work.batches(4)
    m = args.microbatches

    def step(i):
        x, y = batches[i % len(batches)]
        opt.zero_grad(set_to_none=False)
        loss = 0.0
        for xs, ys in zip(x.chunk(m), y.chunk(m)):
            mb_loss = work.loss(model(xs), ys)
            mb_loss.backward()
            loss += mb_loss.item()
        opt.step()
        return loss

    step(0)  # warm-up: allocations, first-touch
    start, cpu_start = time.perf_counter(), time.process_time()
    for i in range(1, args.steps):
        loss = step(i)
    cpu = time.process_time() - cpu_start
    # CPU seconds of this one-thread process: on a loaded machine less inflated than wall time.
    print(f"cpu_samples_per_s {args.batch * (args.steps - 1) / cpu:.1f}")
    return time.perf_counter() - start, loss


def run_1f1b_rank(rank, args, port, results):
    """One rank of the 2-stage 1F1B pipeline: rank 0 stores its seconds in results[0], rank 1
    the last step's loss in results[1]."""
    if args.pin:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})
    one_thread()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(args.seed)
    work = Workload(args)
    mods, cut = work.mods, work.cut
    stage = nn.Sequential(*(mods[:cut] if rank == 0 else mods[cut:]))
    opt = torch.optim.SGD(stage.parameters(), lr=LR)
    batches = work.batches(4)
    m = args.microbatches
    rows = args.batch // m
    first, last = rank == 0, rank == 1
    peer = 1 - rank

    def wait(*reqs):
        for r in reqs:
            r.wait()

    def step(i):
        x, y = batches[i % len(batches)]
        xs, ys = x.chunk(m), y.chunk(m)
        opt.zero_grad(set_to_none=False)
        inputs, outputs = [None] * m, [None] * m
        losses = [0.0] * m

        def forward(k, act):
            if first:
                out = stage(xs[k])
            else:
                act.requires_grad_(True)
                out = work.loss(stage(act), ys[k])
            inputs[k], outputs[k] = act, out
            return out

        def backward(k, grad):
            if last:
                losses[k] = outputs[k].item()
                outputs[k].backward()
            else:
                outputs[k].backward(grad)
            g = None if first else inputs[k].grad
            inputs[k] = outputs[k] = None
            return g

        warmup = min(m, 1 - rank)  # S - rank - 1 forwards before the steady state
        act = None if first else torch.empty(work.act_shape(rows))
        if not first:
            dist.irecv(act, src=peer).wait()
        for k in range(warmup):
            out = forward(k, act)
            dist.isend(out.detach(), dst=peer).wait()
        for k in range(m - warmup):
            fk = k + warmup
            out = forward(fk, act)
            if first:
                # send forward fk, receive backward k (picotron's send_fwd_recv_bwd)
                grad = torch.empty(work.act_shape(rows))
                wait(dist.isend(out.detach(), dst=peer), dist.irecv(grad, src=peer))
                backward(k, grad)
            else:
                g = backward(k, None)
                # send backward k, receive forward k+1 (send_bwd_recv_fwd)
                reqs = [dist.isend(g, dst=peer)]
                if fk + 1 < m:
                    act = torch.empty(work.act_shape(rows))
                    reqs.append(dist.irecv(act, src=peer))
                wait(*reqs)
        for k in range(m - warmup, m):  # cool-down backwards (rank 0 only at S=2)
            grad = torch.empty(work.act_shape(rows))
            dist.irecv(grad, src=peer).wait()
            backward(k, grad)
        opt.step()
        return sum(losses)

    step(0)
    dist.barrier()
    start = time.perf_counter()
    for i in range(1, args.steps):
        loss = step(i)
    dist.barrier()
    seconds = time.perf_counter() - start
    if rank == 0:
        results[0] = seconds
    else:
        results[1] = loss
    dist.destroy_process_group()


def run_1f1b(args):
    import socket
    with socket.socket() as s:  # a free loopback port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Array("d", 2)
    procs = [ctx.Process(target=run_1f1b_rank, args=(r, args, port, results)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
        if p.is_alive():
            p.kill()
            raise SystemExit("torch_peer: a rank did not finish within 600 s")
        if p.exitcode != 0:
            raise SystemExit(f"torch_peer: rank exited with {p.exitcode}")
    return results[0], results[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["single", "1f1b"], required=True)
    ap.add_argument("--model", choices=["mlp", "gpt", "llama"], default="mlp")
    ap.add_argument("--vocab", type=int, default=76,
                    help="gpt, llama: vocabulary size (76: the bytes of data/gpl-3.txt)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pin", action="store_true",
                    help="1f1b: run rank r on the r-th CPU this process may use")
    args = ap.parse_args()
    if args.pin and (args.mode != "1f1b" or len(os.sched_getaffinity(0)) < 2):
        ap.error("--pin needs --mode 1f1b and at least 2 CPUs")
    if args.batch % args.microbatches != 0 or args.steps < 2:
        ap.error("--batch must be a multiple of --microbatches and --steps >= 2")
    seconds, loss = run_single(args) if args.mode == "single" else run_1f1b(args)
    print(f"samples_per_s {args.batch * (args.steps - 1) / seconds:.1f}")
    # The same for both modes up to rounding: a check that the pipeline trains the same model.
    print(f"final_loss {loss:.6f}")


if __name__ == "__main__":
    main()
