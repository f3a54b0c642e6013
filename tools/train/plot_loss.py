#!/usr/bin/env python3
"""Plot a loss.csv of tools/train/train.py: python3 tools/train/plot_loss.py LOSS_CSV EVAL_JSON OUT_PNG"""

import csv
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    csv_path, eval_path, out = sys.argv[1:4]
    rows = list(csv.DictReader(open(csv_path)))
    ev = json.load(open(eval_path))
    tok = [int(r["tokens"]) / 1e6 for r in rows]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax.plot(tok, [float(r["main_loss"]) for r in rows], label="main head (next token), train")
    ax.plot(tok, [float(r["mtp_loss"]) for r in rows], label="MTP (token t+2), train")
    e = ev["eval_exported_bf16_weights_fp32"]
    ax.axhline(e["main_loss"], color="C0", ls="--", lw=1, label=f"main, validation: {e['main_loss']:.3f} (ppl {e['main_ppl']:.1f})")
    ax.axhline(e["unigram_loss"], color="gray", ls=":", lw=1, label=f"unigram baseline, validation: {e['unigram_loss']:.3f} (ppl {e['unigram_ppl']:.0f})")
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_ylim(2.5, 9.5)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"deepseek-v4-tiny: {ev['steps']} steps, {ev['train_seconds']:.0f} s on one {ev['device']}", fontsize=9)
    ax2.plot(tok, [float(r["lr"]) * 1e3 for r in rows], color="C2", label="learning rate x 1e3")
    ax2.plot(tok, [float(r["indexer_kl"]) * 10 for r in rows], color="C3", label="indexer KL x 10")
    ax2.plot(tok, [float(r["max_load_ratio"]) for r in rows], color="C4", lw=0.8, label="max/mean expert load (top-k layers)")
    ax2.set_xlabel("training tokens (millions)")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
