#!/usr/bin/env bash
# Stage-2 settings chosen on val only (seed 0, the same 100 updates as the stage-2 runs); each run goes
# to runs/multi30k/sweep/<name>/<arm>-seed0 and is summarised by
#   python examples/translation/recipe.py sweep-report --sweep runs/multi30k/sweep
# Usage: bash examples/translation/val_sweep.sh [name ...]   (default: all variants below)
set -euo pipefail
cd "$(dirname "$0")/../.."
declare -A VARIANTS=(
  [bertscore-t0.1]="--arm bertscore --set temperature=0.1"
  [bertscore-t0.02]="--arm bertscore --set temperature=0.02"
  [bertscore-gumbel]="--arm bertscore --set gumbel=soft"
  [bertscore-soft]="--arm bertscore --set max_mode=soft"
  [bertscore-mean]="--arm bertscore --set bridge_mode=mean"
  [mrt-w10]="--arm mrt --weight 10"
  [mrt-w10-a0.3]="--arm mrt --weight 10 --set alpha=0.3"
)
names=("$@")
[ ${#names[@]} -eq 0 ] && names=(bertscore-t0.1 bertscore-t0.02 bertscore-gumbel bertscore-soft bertscore-mean mrt-w10 mrt-w10-a0.3)
for name in "${names[@]}"; do
  # shellcheck disable=SC2086
  python examples/translation/recipe.py stage2 --config configs/translation/stage2.yaml --seed 0 \
    --out "runs/multi30k/sweep/$name" --set "eval_sets=[val]" --set blind=false ${VARIANTS[$name]}
done
