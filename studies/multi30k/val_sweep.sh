#!/usr/bin/env bash
# Stage-2 settings chosen on val only (seed 0, the same length as the stage-2 runs of the config); each run
# goes to $OUT/<name>/<arm>-seed0 and is summarised by
#   python studies/multi30k/recipe.py sweep-report --sweep runs/multi30k/sweep
# Usage: bash studies/multi30k/val_sweep.sh [name ...]   (default: all variants below)
# The converged protocol sweeps the same way from its own config:
#   CONFIG=studies/multi30k/configs/stage2-converged.yaml OUT=runs/multi30k/converged/sweep \
#     bash studies/multi30k/val_sweep.sh bertscore-w1 mrt-w1
#   python studies/multi30k/recipe.py sweep-report --sweep runs/multi30k/converged/sweep \
#     --stage2 runs/multi30k/converged/stage2
set -euo pipefail
cd "$(dirname "$0")/../.."
CONFIG=${CONFIG:-studies/multi30k/configs/stage2.yaml}
OUT=${OUT:-runs/multi30k/sweep}
declare -A VARIANTS=(  # every variant names all its swept settings, so config changes do not move it
  [bertscore-w1]="--arm bertscore --weight 1 --set gumbel=null --set temperature=0.05"
  [bertscore-w5]="--arm bertscore --weight 5 --set gumbel=null --set temperature=0.05"
  [bertscore-w20]="--arm bertscore --weight 20 --set gumbel=null --set temperature=0.05"
  [bertscore-t0.1]="--arm bertscore --weight 5 --set gumbel=null --set temperature=0.1"
  [bertscore-t0.02]="--arm bertscore --weight 5 --set gumbel=null --set temperature=0.02"
  [bertscore-gumbel]="--arm bertscore --weight 5 --set gumbel=soft --set temperature=0.05"
  [bertscore-soft]="--arm bertscore --weight 5 --set gumbel=null --set temperature=0.05 --set max_mode=soft"
  [bertscore-mean]="--arm bertscore --weight 5 --set gumbel=null --set temperature=0.05 --set bridge_mode=mean"
  [bertscore-gumbel-t0.1]="--arm bertscore --weight 5 --set gumbel=soft --set temperature=0.1"
  [bertscore-gumbel-w10]="--arm bertscore --weight 10 --set gumbel=soft --set temperature=0.05"
  [mrt-w1]="--arm mrt --weight 1 --set alpha=1.0"
  [mrt-w10]="--arm mrt --weight 10 --set alpha=1.0"
  [mrt-w10-a0.3]="--arm mrt --weight 10 --set alpha=0.3"
  [mrt-w30-a0.3]="--arm mrt --weight 30 --set alpha=0.3"
)
names=("$@")
[ ${#names[@]} -eq 0 ] && names=("${!VARIANTS[@]}")
for name in "${names[@]}"; do
  # shellcheck disable=SC2086
  python studies/multi30k/recipe.py stage2 --config "$CONFIG" --seed 0 \
    --out "$OUT/$name" --set "eval_sets=[val]" --set blind=false ${VARIANTS[$name]}
done
