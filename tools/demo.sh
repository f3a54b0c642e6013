#!/usr/bin/env bash
# The README's main job: a few prompts through the engine on the bundled model
# (models/deepseek-v4-tiny, a DeepSeek-V4-architecture model trained on Debian's
# documentation and the King James Bible), then the text it wrote.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/deepinfer}
prompts=(
    "And the LORD said unto Moses,"
    "The Linux kernel"
    "In Python, a list is"
)
"$bin" info
n=${#prompts[@]}
for i in "${!prompts[@]}"; do
    p=${prompts[$i]}
    printf '[%d/%d] generating...\r' "$((i + 1))" "$n" >&2
    out=$("$bin" generate --prompt "$p" --max-tokens 48 --temperature 0 2>/dev/null)
    printf '\n--- %s\n%s%s\n' "$p" "$p" "$out"
done
