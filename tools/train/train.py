#!/usr/bin/env python3
"""Train the bundled tiny DeepSeek-V4 model (main model + one-layer MTP) in one command.

Usage (GPU, the shipped run):
  python3 tools/train/train.py --out OUTDIR
Smoke test (CPU, a few steps):
  python3 tools/train/train.py --out /tmp/smoke --device cpu --batch 2 --seq 256 --max-steps 3 \
      --eval-windows 2 --no-generate

Inputs: .train-data/{train,val}.u16 (tools/train/train_tokenizer.py), the tokenizer in
models/deepseek-v4-tiny/. Outputs in OUTDIR:
  model.safetensors   transformers save_pretrained names (bf16; fp32 hc_*, attn_sink, ape,
                      gate.bias; int64 tid2eid) + the MTP module as upstream `mtp.0.*` tensors
  config.json         transformers DeepseekV4Config (+ num_nextn_predict_layers 1)
  loss.csv            step, tokens, lr, loss, main_loss, mtp_loss, indexer_kl, seconds
  eval.json           validation loss/perplexity (main head), MTP top-1 accuracy and loss,
                      unigram baseline on the same tokens, training time, samples
  ckpt.pt             resumable checkpoint (model, MTP, optimiser, step, schedule, RNG)

Design stance:
- The main model is transformers' DeepseekV4ForCausalLM, unchanged; the MTP module
  (model_def.MTPModule) reads the main streams before hc_head and the main layers' mask and
  rope through forward hooks. Loss = CE(main, t+1) + mtp_weight * CE(MTP, t+2)
  + indexer_weight * KL(indexer || attention), the last one being the Lightning-Indexer
  distillation of DeepSeek-V3.2 (the indexer's top-k has no gradient): the target is the
  head-averaged softmax of the attention logits over all visible compressed entries.
- Top-k routers are balanced without an auxiliary loss, as in DeepSeek-V3: after each step
  every expert's correction bias moves by bias_rate towards the mean load.
- The step budget is set by time: after the warm-up steps are timed, total steps =
  min(max_steps, time_budget / step time); the cosine schedule then uses that number, which is
  stored in the checkpoint and in eval.json. Everything else is seeded.
- bf16 autocast on the GPU with fp32 master weights; AdamW; cosine decay to 10 %.
"""

import argparse
import csv
import json
import math
import os
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)

import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as mv4  # noqa: E402

import model_def  # noqa: E402

PROMPTS = [
    "In the beginning God created",
    "The kernel uses a spinlock to",
    "To install a package on Debian,",
    "A Python list is",
    "Perl is a language",
    "And the LORD said unto Moses,",
]


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--data", default=os.path.join(ROOT, ".train-data"))
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "models", model_def.MODEL_NAME))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--indexer-weight", type=float, default=0.1)
    ap.add_argument("--bias-rate", type=float, default=1e-3)
    ap.add_argument("--max-steps", type=int, default=20000)
    ap.add_argument("--time-budget", type=float, default=300.0, help="seconds of training steps")
    ap.add_argument("--time-steps", type=int, default=12, help="steps timed before fixing the schedule")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--ckpt-every", type=int, default=500)
    ap.add_argument("--eval-windows", type=int, default=0, help="0 = the whole validation split")
    ap.add_argument("--experts", default="auto", help="auto | grouped_mm | batched_mm | eager")
    ap.add_argument("--ckpt", help="checkpoint file (default OUTDIR/ckpt.pt)")
    ap.add_argument("--no-generate", action="store_true")
    ap.add_argument("--gen-tokens", type=int, default=48)
    return ap.parse_args()


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def load_tokens(path):
    return torch.from_numpy(np.fromfile(path, dtype="<u2").astype(np.int64))


def batch_at(tokens, gen, batch, seq, device):
    """batch windows of seq+2 tokens at seeded random offsets."""
    starts = torch.randint(0, tokens.numel() - seq - 2, (batch,), generator=gen)
    idx = starts[:, None] + torch.arange(seq + 2)[None, :]
    return tokens[idx].to(device, non_blocking=True)


# ---------------------------------------------------------------------------------------------
# Indexer distillation and router balancing (hooks)
# ---------------------------------------------------------------------------------------------


class IndexerKL:
    """KL(attention over compressed entries || indexer scores) for every CSA layer.

    Hooks record, per CSA layer: q after the per-head norm (before rope), all compressed
    entries, the indexer's raw scores, and the layer's rope/positions; loss() combines them."""

    def __init__(self, model):
        self.rec = {}
        self.handles = []
        for i, layer in enumerate(model.model.layers):
            att = layer.self_attn
            if not isinstance(att.compressor, mv4.DeepseekV4CSACompressor):
                continue
            self.handles += [
                att.q_b_norm.register_forward_hook(self._h(i, "q")),
                att.compressor.register_forward_hook(self._h(i, "entries")),
                att.compressor.indexer.scorer.register_forward_hook(self._h(i, "scores")),
                att.register_forward_pre_hook(self._kw(i), with_kwargs=True),
            ]
            self.m = att.compressor.compress_rate
            self.scale = att.scaling

    def _h(self, i, key):
        def hook(mod, args, out):
            self.rec.setdefault(i, {})[key] = out[0] if key == "entries" else out
        return hook

    def _kw(self, i):
        def hook(mod, args, kwargs):
            self.rec.setdefault(i, {})["cos_sin"] = kwargs["position_embeddings"]["compress"]
            self.rec[i]["pos"] = kwargs["position_ids"]
        return hook

    def loss(self):
        total, n = 0.0, 0
        for i, r in self.rec.items():
            if "scores" not in r:
                continue
            cos, sin = r["cos_sin"]
            q = mv4.apply_rotary_pos_emb(r["q"].detach(), cos, sin).float()  # [B, H, S, d]
            ent = r["entries"].detach().float()  # [B, 1, T, d]
            logits = torch.matmul(q, ent.transpose(-1, -2)) * self.scale  # [B, H, S, T]
            T = logits.shape[-1]
            thr = ((r["pos"] + 1) // self.m).expand(q.shape[0], -1)  # [B, S]
            fut = torch.arange(T, device=q.device).view(1, 1, -1) >= thr.unsqueeze(-1)  # [B, S, T]
            logits = logits.masked_fill(fut.unsqueeze(1), float("-inf"))
            valid = ~fut.all(-1)  # rows with at least one visible entry
            target = torch.softmax(logits, -1).nan_to_num(0.0).mean(1)  # [B, S, T]
            idx = r["scores"].float().masked_fill(fut, float("-inf"))
            logq = torch.log_softmax(idx, -1)
            kl = (target * (torch.log(target.clamp_min(1e-12)) - logq.masked_fill(fut, 0.0))).sum(-1)
            total = total + kl[valid].mean()
            n += 1
        self.rec = {}
        return total / max(n, 1)


class RouterLoad:
    """Per-step expert load of every top-k router, for the bias update."""

    def __init__(self, routers):
        self.routers = routers
        self.load = {id(r): torch.zeros(r.num_experts, device=r.e_score_correction_bias.device) for r in routers}
        self.handles = [r.register_forward_hook(self._hook) for r in routers]

    def _hook(self, mod, args, out):
        idx = out[2].detach().reshape(-1)
        self.load[id(mod)] += torch.bincount(idx, minlength=mod.num_experts).float()

    @torch.no_grad()
    def update(self, rate):
        """Move each bias towards balance; returns the largest max/mean load ratio (a tensor)."""
        imb = torch.zeros((), device=self.routers[0].e_score_correction_bias.device)
        for r in self.routers:
            ld = self.load[id(r)]
            r.e_score_correction_bias += rate * torch.sign(ld.mean() - ld)
            imb = torch.maximum(imb, ld.max() / ld.mean().clamp_min(1.0))
            ld.zero_()
        return imb


# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------


def build(args, device):
    cfg = model_def.make_config()
    torch.manual_seed(args.seed)
    model = transformers.DeepseekV4ForCausalLM(cfg)
    mtp = model_def.MTPModule(cfg)
    gen = torch.Generator().manual_seed(args.seed + 1)
    model_def.init_tid2eid(model, cfg, gen)
    model_def.init_mtp(mtp, cfg, gen)
    model.to(device).train()
    mtp.to(device).train()
    return cfg, model, mtp


def set_experts(model, mtp, choice, device, args):
    """Pick the fastest experts kernel that runs forward+backward here."""
    choices = [choice] if choice != "auto" else (["grouped_mm", "batched_mm", "eager"] if device.type == "cuda" else ["eager"])
    for c in choices:
        try:
            model.set_experts_implementation(c)
            mtp.block.mlp.experts.config._experts_implementation = c  # the MTP block's own config
            x = torch.randint(3, 100, (2, 66), device=device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                out = model(input_ids=x[:, :64], use_cache=False).logits
            out.float().mean().backward()
            model.zero_grad(set_to_none=True)
            print(f"experts implementation: {c}", flush=True)
            return c
        except Exception as e:  # noqa: BLE001
            print(f"experts implementation {c} failed: {type(e).__name__}: {e}", flush=True)
    raise SystemExit("no experts implementation runs")


def forward_losses(model, mtp, cap, ikl, w, args):
    x, y1, y2 = w[:, :-2], w[:, 1:-1], w[:, 2:]
    out = model(input_ids=x, use_cache=False)
    logits = out.logits
    main = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y1.reshape(-1))
    mlog = mtp(cap.streams, y1, model.model.embed_tokens, model.lm_head, cap.layer_kwargs)
    mtp_loss = F.cross_entropy(mlog.float().reshape(-1, mlog.shape[-1]), y2.reshape(-1))
    kl = ikl.loss() if ikl is not None else torch.zeros((), device=x.device)
    return main, mtp_loss, kl, mlog


def lr_at(step, total, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    p = min(1.0, (step - args.warmup) / max(1, total - args.warmup))
    return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))


# ---------------------------------------------------------------------------------------------
# Evaluation and export
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate(model, mtp, cap, val, train, args, device, vocab, autocast=True):
    model.eval()
    mtp.eval()
    seq = args.seq
    n_win = (val.numel() - 2) // seq
    if args.eval_windows:
        n_win = min(n_win, args.eval_windows)
    nll, nll_mtp, hit_mtp, hit_main, n = 0.0, 0.0, 0, 0, 0
    counts = torch.bincount(train, minlength=vocab).double() + 1.0  # add-one unigram over train
    logp_uni = (counts / counts.sum()).log()
    uni = 0.0
    bs = max(1, min(args.batch, 16))
    for b0 in range(0, n_win, bs):
        starts = torch.arange(b0, min(n_win, b0 + bs)) * seq
        w = val[starts[:, None] + torch.arange(seq + 2)[None, :]].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast and device.type == "cuda"):
            x, y1, y2 = w[:, :-2], w[:, 1:-1], w[:, 2:]
            lg = model(input_ids=x, use_cache=False).logits.float()
            ml = mtp(cap.streams, y1, model.model.embed_tokens, model.lm_head, cap.layer_kwargs).float()
        nll += F.cross_entropy(lg.reshape(-1, vocab), y1.reshape(-1), reduction="sum").item()
        nll_mtp += F.cross_entropy(ml.reshape(-1, vocab), y2.reshape(-1), reduction="sum").item()
        hit_mtp += (ml.argmax(-1) == y2).sum().item()
        hit_main += (lg.argmax(-1) == y1).sum().item()
        uni += -logp_uni[y1.reshape(-1).cpu()].sum().item()
        n += y1.numel()
    model.train()
    mtp.train()
    return {
        "val_tokens": n,
        "val_windows": n_win,
        "val_seq": seq,
        "main_loss": nll / n,
        "main_ppl": math.exp(nll / n),
        "main_top1_acc": hit_main / n,
        "mtp_loss": nll_mtp / n,
        "mtp_ppl": math.exp(nll_mtp / n),
        "mtp_top1_acc": hit_mtp / n,
        "unigram_loss": uni / n,
        "unigram_ppl": math.exp(uni / n),
    }


def export(model, mtp, cfg, out_dir):
    """model.safetensors (transformers save_pretrained names + upstream mtp.0.*) and config.json."""
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        with open(os.path.join(tmp, "config.json")) as f:
            hf_cfg = json.load(f)
        tensors = load_file(os.path.join(tmp, "model.safetensors"))
    out = {k: model_def.stored_dtype(k, t) for k, t in tensors.items()}
    for k, t in model_def.mtp_upstream_tensors(mtp).items():
        assert k not in out
        out[k] = model_def.stored_dtype(k, t)
    save_file({k: out[k].contiguous() for k in sorted(out)}, os.path.join(out_dir, "model.safetensors"),
              metadata={"format": "pt"})
    hf_cfg["dtype"] = "bfloat16"
    hf_cfg.pop("transformers_version", None)
    hf_cfg["num_nextn_predict_layers"] = 1
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_cfg, f, indent=2)
        f.write("\n")


def eval_exported(args, cfg, cap, mtp, val, train, device):
    """Reload the shipped file (bf16 weights) with stock transformers + the MTP loader and evaluate
    in float32 without autocast: the numbers the README reports."""
    m = transformers.DeepseekV4ForCausalLM.from_pretrained(args.out, dtype=torch.float32).to(device)
    m.set_experts_implementation("eager" if device.type == "cpu" else mtp.block.mlp.experts.config._experts_implementation)
    mtp2 = model_def.MTPModule(cfg)
    mtp2.block.mlp.experts.config._experts_implementation = mtp.block.mlp.experts.config._experts_implementation
    model_def.mtp_load_upstream(mtp2, {k: v.float() for k, v in load_file(os.path.join(args.out, "model.safetensors")).items()
                                       if k.startswith("mtp.")})
    mtp2.to(device)
    cap2 = model_def.Capture(m)
    a = argparse.Namespace(**vars(args))
    with torch.autocast(device.type, enabled=False):
        ev = evaluate(m, mtp2, cap2, val, train, a, device, cfg.vocab_size, autocast=False)
    cap2.remove()
    return ev


@torch.no_grad()
def samples(out_dir, tok_dir, device, n_new):
    """Greedy continuations with stock transformers on the exported bf16 checkpoint."""
    tok = transformers.AutoTokenizer.from_pretrained(tok_dir)
    m = transformers.DeepseekV4ForCausalLM.from_pretrained(out_dir, dtype=torch.float32).to(device).eval()
    res = []
    for p in PROMPTS:
        ids = tok(p, return_tensors="pt").input_ids.to(device)
        g = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_new, do_sample=False)
        res.append({"prompt": p, "output": tok.decode(g[0, ids.shape[1]:], skip_special_tokens=False)})
        print(f"--- {p!r} -> {res[-1]['output']!r}", flush=True)
    return res


# ---------------------------------------------------------------------------------------------
# Main loop
# ---------------------------------------------------------------------------------------------


def main():
    args = parse_args()
    transformers.logging.set_verbosity_error()
    os.makedirs(args.out, exist_ok=True)
    device = torch.device(args.device)
    t_start = time.time()
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    train = load_tokens(os.path.join(args.data, "train.u16"))
    val = load_tokens(os.path.join(args.data, "val.u16"))
    cfg, model, mtp = build(args, device)
    n_main = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in mtp.parameters())
    print(f"params: main {n_main}, mtp {n_mtp}, total {n_main + n_mtp}; train tokens {train.numel()}, "
          f"val tokens {val.numel()}", flush=True)
    experts_impl = set_experts(model, mtp, args.experts, device, args)

    cap = model_def.Capture(model)
    ikl = IndexerKL(model) if args.indexer_weight > 0 else None
    routers = [l.mlp.gate for l in model.model.layers if isinstance(l.mlp.gate, mv4.DeepseekV4TopKRouter)]
    routers.append(mtp.block.mlp.gate)
    load = RouterLoad(routers)

    params = [p for p in list(model.parameters()) + list(mtp.parameters()) if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")
    gen = torch.Generator().manual_seed(args.seed + 2)
    step, total, train_secs = 0, None, 0.0
    ckpt_path = args.ckpt or os.path.join(args.out, "ckpt.pt")
    csv_path = os.path.join(args.out, "loss.csv")
    if os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path, map_location=device, weights_only=False)
        model.load_state_dict(ck["model"])
        mtp.load_state_dict(ck["mtp"])
        opt.load_state_dict(ck["opt"])
        gen.set_state(ck["gen"])
        step, total, train_secs = ck["step"], ck["total"], ck["train_secs"]
        print(f"resumed from {ckpt_path} at step {step}/{total}", flush=True)
        if os.path.exists(csv_path):  # drop rows logged after the checkpoint (they are redone)
            with open(csv_path) as f:
                rows = list(csv.reader(f))
            with open(csv_path, "w", newline="") as f:
                csv.writer(f).writerows([r for i, r in enumerate(rows) if i == 0 or int(r[0]) <= step])
    else:
        with open(csv_path, "w", newline="") as f:
            csv.writer(f).writerow(["step", "tokens", "lr", "loss", "main_loss", "mtp_loss", "indexer_kl",
                                    "max_load_ratio", "seconds"])

    def save_ckpt():
        torch.save({"model": model.state_dict(), "mtp": mtp.state_dict(), "opt": opt.state_dict(),
                    "gen": gen.get_state(), "step": step, "total": total, "train_secs": train_secs,
                    "args": vars(args)}, ckpt_path + ".tmp")
        os.replace(ckpt_path + ".tmp", ckpt_path)

    print(f"setup {time.time() - t_start:.1f}s", flush=True)
    acc = {"loss": 0.0, "main": 0.0, "mtp": 0.0, "kl": 0.0, "n": 0}
    timing_t0 = None
    while step < (total if total is not None else args.max_steps):
        if total is None and step == 2:
            if device.type == "cuda":
                torch.cuda.synchronize()
            timing_t0 = time.time()
        if total is None and step == 2 + args.time_steps:
            if device.type == "cuda":
                torch.cuda.synchronize()
            dt = (time.time() - timing_t0) / args.time_steps
            total = max(step + 1, min(args.max_steps, int(args.time_budget / dt)))
            print(f"step time {dt * 1000:.0f} ms -> {total} steps", flush=True)
        cur_total = total if total is not None else args.max_steps
        lr = lr_at(step, cur_total, args)
        for g in opt.param_groups:
            g["lr"] = lr
        t0 = time.time()
        w = batch_at(train, gen, args.batch, args.seq, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            main_l, mtp_l, kl, _ = forward_losses(model, mtp, cap, ikl, w, args)
            loss = main_l + args.mtp_weight * mtp_l + args.indexer_weight * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
        opt.step()
        imb = load.update(args.bias_rate)
        step += 1
        for k, v in (("loss", loss), ("main", main_l), ("mtp", mtp_l), ("kl", kl)):
            acc[k] += v.detach().float()  # summed on the device; read at log time
        acc["n"] += 1
        train_secs += time.time() - t0
        if step % args.log_every == 0 or step == total:
            n = acc["n"]
            row = [step, step * args.batch * args.seq, f"{lr:.6g}", f"{float(acc['loss']) / n:.5f}",
                   f"{float(acc['main']) / n:.5f}", f"{float(acc['mtp']) / n:.5f}", f"{float(acc['kl']) / n:.5f}",
                   f"{float(imb):.3f}", f"{train_secs:.1f}"]
            with open(csv_path, "a", newline="") as f:
                csv.writer(f).writerow(row)
            if step % (args.log_every * 10) == 0 or step == total or step <= args.log_every:
                print("step {} tok {} lr {} loss {} main {} mtp {} ikl {} load {} t {}".format(*row), flush=True)
            acc = {"loss": 0.0, "main": 0.0, "mtp": 0.0, "kl": 0.0, "n": 0}
        if step % args.ckpt_every == 0:
            save_ckpt()
    if total is None:  # stopped by max_steps before the timing window closed
        total = step
    save_ckpt()

    for h in (ikl.handles if ikl else []):
        h.remove()
    ev = evaluate(model, mtp, cap, val, train, args, device, cfg.vocab_size)
    print(json.dumps(ev, indent=1), flush=True)
    export(model, mtp, cfg, args.out)
    ev_exp = eval_exported(args, cfg, cap, mtp, val, train, device)
    print("exported bf16 weights, float32 compute:", json.dumps(ev_exp), flush=True)
    res = {"eval": ev, "eval_exported_bf16_weights_fp32": ev_exp, "steps": step, "total_steps": total, "train_seconds": train_secs,
           "tokens_seen": step * args.batch * args.seq, "params_main": n_main, "params_mtp": n_mtp,
           "experts_implementation": experts_impl, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "transformers": transformers.__version__, "args": vars(args)}
    if not args.no_generate:
        res["samples"] = samples(args.out, args.tokenizer, device, args.gen_tokens)
    res["wall_seconds"] = time.time() - t_start
    with open(os.path.join(args.out, "eval.json"), "w") as f:
        json.dump(res, f, indent=2)
        f.write("\n")
    print(f"done in {res['wall_seconds']:.0f}s", flush=True)


if __name__ == "__main__":
    main()
