#!/usr/bin/env python3
"""The deep benchmark MLP (examples/deep_mlp.textproto) trained in PyTorch: the peer pipetrain is
measured against (bench/peer_bench.sh, docs/performance.md "PyTorch peer").

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
state after one warm-up step, measured between barriers — and `final_loss <float>`, the last
step's loss, which both modes share up to rounding (same seed, weights and batches). Exits 3 with a message on
stderr if torch is missing. Usage:
  bench/torch_peer.py --mode single|1f1b [--pin] [--batch 256] [--microbatches 8] [--steps 25]
"""
import argparse
import os
import sys
import time

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
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


def layers():
    """The model as a flat list of modules, in pipetrain's layer order."""
    out = []
    width = INPUT_FEATURES
    for _ in range(HIDDEN_LAYERS):
        out += [nn.Linear(width, HIDDEN), nn.ReLU()]
        width = HIDDEN
    out.append(nn.Linear(width, CLASSES))
    return out


def split_point(mods):
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


def make_batches(batch, count, seed):
    """`count` fixed batches (inputs N(0,1), labels uniform), generated before timing."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, INPUT_FEATURES, generator=g),
             torch.randint(0, CLASSES, (batch,), generator=g)) for _ in range(count)]


def one_thread():
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set in this process


def run_single(args):
    one_thread()
    torch.manual_seed(args.seed)
    model = nn.Sequential(*layers())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    batches = make_batches(args.batch, 4, args.seed)
    m = args.microbatches

    def step(i):
        x, y = batches[i % len(batches)]
        opt.zero_grad(set_to_none=False)
        loss = 0.0
        for xs, ys in zip(x.chunk(m), y.chunk(m)):
            mb_loss = loss_fn(model(xs), ys) / args.batch
            mb_loss.backward()
            loss += mb_loss.item()
        opt.step()
        return loss

    step(0)  # warm-up: allocations, first-touch
    start = time.perf_counter()
    for i in range(1, args.steps):
        loss = step(i)
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
    mods = layers()
    cut = split_point(mods)
    stage = nn.Sequential(*(mods[:cut] if rank == 0 else mods[cut:]))
    opt = torch.optim.SGD(stage.parameters(), lr=LR)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    batches = make_batches(args.batch, 4, args.seed)
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
                out = loss_fn(stage(act), ys[k]) / args.batch
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
        act = None if first else torch.empty(rows, HIDDEN)
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
                grad = torch.empty(rows, HIDDEN)
                wait(dist.isend(out.detach(), dst=peer), dist.irecv(grad, src=peer))
                backward(k, grad)
            else:
                g = backward(k, None)
                # send backward k, receive forward k+1 (send_bwd_recv_fwd)
                reqs = [dist.isend(g, dst=peer)]
                if fk + 1 < m:
                    act = torch.empty(rows, HIDDEN)
                    reqs.append(dist.irecv(act, src=peer))
                wait(*reqs)
        for k in range(m - warmup, m):  # cool-down backwards (rank 0 only at S=2)
            grad = torch.empty(rows, HIDDEN)
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
