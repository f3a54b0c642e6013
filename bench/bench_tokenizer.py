#!/usr/bin/env python3
"""bench_tokenizer.py -- HF `tokenizers` side of bench_tokenizer.sh.

    bench_tokenizer.py TOKENIZER.json CORPUS.txt

Encodes the corpus lines with encode_batch (no special tokens), one untimed warm-up and the
best of three timed passes, under whatever RAYON_NUM_THREADS the caller set. Prints the
same key=value lines as bench_tokenizer.c.
"""
import os, resource, sys, time

def main():
    from tokenizers import Tokenizer
    t0 = time.perf_counter()
    tok = Tokenizer.from_file(sys.argv[1])
    load_s = time.perf_counter() - t0
    data = open(sys.argv[2], "rb").read()
    lines = data.decode("utf-8", errors="replace").splitlines(keepends=True)
    best, n_ids = 1e30, 0
    for r in range(4):
        t0 = time.perf_counter()
        enc = tok.encode_batch(lines, add_special_tokens=False)
        dt = time.perf_counter() - t0
        n_ids = sum(len(e.ids) for e in enc)
        if r > 0:
            best = min(best, dt)
    mb = len(data) / 1e6
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"load_s={load_s:.4f}\nmb={mb:.2f}\nlines={len(lines)}\nids={n_ids}\nmbps={mb / best:.2f}\n"
          f"threads={os.environ.get('RAYON_NUM_THREADS', 'all')}\npeak_rss_mb={rss:.1f}")

if __name__ == "__main__":
    main()
