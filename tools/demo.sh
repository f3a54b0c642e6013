#!/usr/bin/env bash
# The README's main job: runs the engine on the default model and prints what it generated.
#
# Until the bundled trained model lands (models/), the default is the tiny random
# DeepSeek-V3-shaped golden checkpoint in tests/data/v3_grouped: the output is token ids of
# a random model, but every stage (loading, MLA, MoE routing, decoding) runs for real.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/deepinfer}
model=${DI_DEMO_MODEL:-tests/data/v3_grouped}
echo "== deepinfer info --model $model" >&2
"$bin" info --model "$model"
prompt=$(python3 -c "import json;print(' '.join(map(str,json.load(open('$model/ref.json'))['prompt_ids'])))")
echo "== deepinfer generate --model $model --ids \"$prompt\" --max-tokens 16 --temperature 0" >&2
"$bin" generate --model "$model" --ids "$prompt" --max-tokens 16 --temperature 0
